"""Sweeps on Ray: each run a Ray task, records streamed back as tasks finish.

:func:`run_on_ray` is the ``ray`` backend of :func:`mamba_radix.sim.sweep.run_sweep`. It connects to the
cluster at ``address`` (``--ray-address``), else at ``RAY_ADDRESS``, else starts a local instance on this
machine. Every node must have ``mamba_radix`` installed (``pip install "mamba-radix[ray]"``, same
version); a trace file must exist at the same path on every node, except the bundled traces, which each
node finds in its own installed package by name. A run gives the same record as in the local process pool
(the simulator is deterministic; only ``wall_s`` differs).

The backend only schedules: what one task does is the ``run`` it is given (the sweep passes
:func:`mamba_radix.sim.sweep.run_in_worker`, sent to the workers by reference), so this module imports
nothing from the sweep. Progress: a task's ``run`` puts ``(run_id, finished_requests)`` on a
``ray.util.queue.Queue`` (an actor), at most every :data:`mamba_radix.sim.sweep.PROGRESS_EVERY_S` seconds.

Side effects: may start (and then stops) a local Ray instance; connects to a cluster otherwise (and
disconnects at the end, leaving it running). Needs the ``[ray]`` extra: :class:`mamba_radix.errors.ConfigError` without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from mamba_radix.errors import ConfigError

__all__ = ["RAY_ADDRESS_ENV", "RunInWorker", "run_on_ray"]

RAY_ADDRESS_ENV = "RAY_ADDRESS"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'the ray backend needs Ray: pip install "mamba-radix[ray]" (or use the local backend)'
        ) from None
    return ray


# what one run does on a Ray worker: ``run(spec, put)`` returns the run's record; ``put`` (None: no
# progress) takes ``(run_id, finished_requests)``
RunInWorker = Callable[[Any, Callable[[tuple[str, int]], None] | None], dict[str, Any]]


def _task(run: RunInWorker, spec: Any, progress_queue: Any) -> dict[str, Any]:
    """One run inside a Ray worker: ``run`` with progress sent to the driver's queue."""
    return run(spec, None if progress_queue is None else progress_queue.put_nowait)


def run_on_ray(
    specs: Sequence[Any],
    run: RunInWorker,
    collect: Callable[[dict[str, Any]], None],
    on_progress: Callable[[str, int], None] | None = None,
    address: str | None = None,
    poll_s: float = 0.5,
) -> None:
    """Run ``run(spec, put)`` for every spec as a Ray task (one CPU each) and pass each record to
    ``collect`` as it finishes. ``run`` must be a module-level function (Ray sends it by reference).

    ``address``: a cluster (``ray://host:10001`` or ``host:6379``); None: ``RAY_ADDRESS``, else a local
    instance (stopped again at the end). O(runs) tasks; ``collect`` is called in completion order.
    """
    ray = _import_ray()
    from ray.util.queue import Empty, Queue

    address = address or os.environ.get(RAY_ADDRESS_ENV) or None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                ignore_reinit_error=True,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cannot connect to Ray at {address or 'a new local instance'}: {exc}"
            ) from None
    try:
        progress_queue = Queue() if on_progress is not None else None
        remote = ray.remote(num_cpus=1, max_retries=0)(_task)
        pending = {remote.remote(run, spec, progress_queue): spec for spec in specs}

        def drain() -> None:
            if progress_queue is None or on_progress is None:
                return
            while True:
                try:
                    run_id, finished = progress_queue.get_nowait()
                except Empty:
                    return
                on_progress(run_id, finished)

        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
            drain()
            for ref in done:
                spec = pending.pop(ref)
                try:
                    rec = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died (not a failed run: those return)
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    rec = {"run_id": spec.run_id, "params": spec.params(), "error": error}
                collect(rec)
        drain()
    finally:
        if started_here:  # a local instance stops; a cluster is only disconnected from
            ray.shutdown()
