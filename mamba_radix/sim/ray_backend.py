"""Ray as a backend of the runner (:class:`mamba_radix.sim.runner.Runner`, ``backend="ray"``): each task a
Ray task, results collected as tasks finish.

:class:`RayCluster` connects to the cluster at ``address`` (``--ray-address``), else at ``RAY_ADDRESS``,
else starts a local instance on this machine. Every node must have ``mamba_radix`` installed (``pip install
"mamba-radix[ray]"``, same version); a trace file must exist at the same path on every node, except the
bundled traces, which each node finds in its own installed package by name. A run gives the same record
as in the local process pool (the simulator is deterministic; only ``wall_s`` differs).

This module only connects and schedules: what a task does is the module-level function the runner submits
(sent to the workers by reference), so it imports nothing of the runner's. Progress: the runner's tasks
put ``(run_id, finished_requests)`` on :attr:`RayCluster.queue`, a ``ray.util.queue.Queue`` (an actor).

Side effects: may start (and then stops) a local Ray instance; connects to a cluster otherwise (and
disconnects at the end, leaving it running). Needs the ``[ray]`` extra: :class:`mamba_radix.errors.ConfigError` without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mamba_radix.errors import ConfigError

__all__ = ["RAY_ADDRESS_ENV", "RayCluster"]

RAY_ADDRESS_ENV = "RAY_ADDRESS"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'the ray backend needs Ray: pip install "mamba-radix[ray]" (or use the local backend)'
        ) from None
    return ray


class RayCluster:
    """A connection to Ray while a runner uses it: :meth:`submit` makes a Ray task of one CPU (no retries),
    :meth:`wait` and :meth:`result` collect them; ``lost``: what :meth:`result` raises when the task's
    worker died. ``progress``: also make the progress :attr:`queue` (None otherwise).

    ``address``: a cluster (``ray://host:10001`` or ``host:6379``); None: ``RAY_ADDRESS``, else a local
    instance (stopped again by :meth:`close`). Raises :class:`ConfigError` when Ray cannot be reached.
    """

    def __init__(self, address: str | None, progress: bool) -> None:
        ray = self._ray = _import_ray()
        address = address or os.environ.get(RAY_ADDRESS_ENV) or None
        self._started_here = not ray.is_initialized()
        if self._started_here:
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
        self.lost: tuple[type[BaseException], ...] = (ray.exceptions.RayError,)
        self._remote: dict[Callable[..., Any], Any] = {}
        try:
            from ray.util.queue import Queue

            self.queue = Queue() if progress else None
        except BaseException:
            self.close(abort=True)
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as a Ray task; its object ref. ``fn`` must be a module-level function."""
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        return remote.remote(*args)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        """The tasks among ``handles`` that are done (at most one), after at most ``timeout`` seconds."""
        done, _ = self._ray.wait(handles, num_returns=1, timeout=timeout)
        return list(done)

    def result(self, handle: Any) -> Any:
        return self._ray.get(handle)

    def close(self, abort: bool = False) -> None:
        """A local instance stops (its tasks with it); a cluster is only disconnected from (its tasks are
        not cancelled, ``abort`` or not)."""
        del abort
        if self._started_here:
            self._ray.shutdown()
