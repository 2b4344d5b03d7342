"""One runner for many independent runs: in this process, in local worker processes, or as Ray tasks.

:class:`Runner` is what ``sweep`` (:func:`mamba_radix.sim.sweep.run_sweep`) and the policy comparison
(:func:`mamba_radix.experiment.run_policy_experiment`) run their tasks with. A task is any picklable value
with an id (its ``run_id``, or the ids given); the run function ``fn(task, progress)`` is a module-level
function (or a :func:`functools.partial` of one) that returns the task's result, picklable too, and calls
``progress(finished_requests)`` as it goes (``progress`` is None when nobody listens).

Backends, the same results whichever runs them (the runs are deterministic; only their timings differ):

- ``inline``: each task in this process, one after the other, in the given order (``local`` with
  ``jobs=1`` is inline);
- ``local``: ``jobs`` worker processes of this machine (a :class:`~concurrent.futures.ProcessPoolExecutor`).
  ``start_method`` is the caller's choice: ``"spawn"`` (the sweep: a worker imports the package afresh and
  streams its trace itself) or ``"fork"`` (the policy comparison: the workers inherit the workloads the
  parent loaded before the first task, so nothing large crosses a process boundary);
- ``ray``: each task a Ray task of one CPU on the cluster at ``ray_address``
  (:mod:`mamba_radix.sim.ray_backend`).

Every worker is set up by :func:`init_worker` (one torch thread: the parallelism is across processes; the
progress channel), also before inline tasks, so a run does the same thing wherever it runs. Progress has
one channel: a worker reports ``(id, finished)`` at most every :data:`PROGRESS_EVERY_S` seconds per task,
through a queue the runner drains while it waits (inline: straight to ``on_progress``). Results: in task
order from :meth:`Runner.run`, and each to ``on_result`` as it finishes (completion order). Failures:
with ``on_failure``, a task that raises (or, on Ray, whose worker dies) is ``on_failure(task,
"ExceptionType: message")`` and the other tasks go on; without it, the error reaches the caller, and the
workers are stopped at once (none is left behind).

Side effects: starts worker processes, or connects to Ray (see :mod:`mamba_radix.sim.ray_backend`).
"""

from __future__ import annotations

import queue as queue_mod
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context, parent_process
from types import TracebackType
from typing import Any, TypeVar

from mamba_radix.errors import ConfigError
from mamba_radix.sim.memory import release_memory

__all__ = ["BACKENDS", "PROGRESS_EVERY_S", "START_METHODS", "Runner", "init_worker"]

T = TypeVar("T")
R = TypeVar("R")

BACKENDS = ("inline", "local", "ray")
START_METHODS = ("spawn", "fork", "forkserver")
# a worker reports a task's finished requests at most this often (seconds): progress without chatter
PROGRESS_EVERY_S = 0.5

# what a run function is given to report its finished requests (None: nobody listens)
Report = Callable[[int], None] | None


# ------------------------------------------------------------------------------- inside the workers
# this worker's progress channel (a queue with put_nowait; None: no progress), set by init_worker
_CHANNEL: Any = None


def init_worker(channel: Any = None) -> None:
    """The set-up of every worker (and of this process before inline tasks): the progress channel
    ``channel`` (a queue the runner drains, or None), and one torch thread (the runs' tensors are tiny:
    threads would only contend between the workers). Side effects: a module global, torch's threads."""
    import torch

    global _CHANNEL
    _CHANNEL = channel
    torch.set_num_threads(1)


@dataclass(frozen=True)
class _Failed:
    """A task that raised, caught where it ran: ``error`` is ``"ExceptionType: message"``."""

    error: str


def _error_text(exc: BaseException, first_line: bool = False) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if first_line and text else text}"


def _throttled(run_id: str, put: Callable[[tuple[str, int]], None]) -> Callable[[int], None]:
    """A progress callback that forwards ``(run_id, finished)`` at most every PROGRESS_EVERY_S."""
    last = [0.0]

    def report(finished: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            put((run_id, finished))

    return report


def _call(
    fn: Callable[[Any, Report], Any],
    task: Any,
    run_id: str,
    capture: bool,
    put: Callable[[tuple[str, int]], None] | None = None,
) -> Any:
    """One task where it runs: ``fn(task, progress)``, progress to ``put`` (default: this worker's
    channel); with ``capture`` an exception is returned as a :class:`_Failed`. Afterwards a worker
    process gives the task's memory back (:func:`~mamba_radix.sim.memory.release_memory`)."""
    if put is None and _CHANNEL is not None:
        put = _CHANNEL.put_nowait
    progress = None if put is None else _throttled(run_id, put)
    try:
        if not capture:
            return fn(task, progress)
        try:
            return fn(task, progress)
        except Exception as exc:
            return _Failed(_error_text(exc))
    finally:
        # In a worker process, the finished run's tree is cyclic garbage: free it (and trim the heap)
        # now, not while the next run is at its peak (see sim.memory). Inline tasks share the caller's
        # heap (a test session's): a full collection there would cost more than it returns.
        if parent_process() is not None:
            release_memory()


def _in_ray_task(
    fn: Callable[[Any, Report], Any], task: Any, run_id: str, capture: bool, channel: Any
) -> Any:
    """One task as a Ray task (no per-process initialiser there): the worker set-up, then the task."""
    init_worker(channel)
    return _call(fn, task, run_id, capture)


# ------------------------------------------------------------------------------------ the local pool
class _LocalPool:
    """``jobs`` processes started by ``start_method``, each set up by :func:`init_worker`."""

    lost: tuple[type[BaseException], ...] = ()

    def __init__(self, jobs: int, start_method: str, progress: bool) -> None:
        ctx = get_context(start_method)
        self.queue = ctx.Queue() if progress else None
        self.pool = ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=init_worker, initargs=(self.queue,)
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.pool.submit(fn, *args)

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        done, _ = wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)
        return list(done)

    def result(self, handle: Future[Any]) -> Any:
        return handle.result()

    def close(self, abort: bool) -> None:
        """Wait for the workers to exit; ``abort``: cancel what has not started and stop them now."""
        if abort:  # the executor sees its workers die, fails what is left and ends
            terminate = getattr(self.pool, "terminate_workers", None)  # Python 3.14
            if terminate is not None:
                terminate()
            else:
                for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                    proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=abort)


# ------------------------------------------------------------------------------------------ runner
class Runner:
    """Runs tasks on one backend (see the module docstring); a context manager (the workers, or the
    connection to Ray, live from ``with`` to its end, across :meth:`run` calls).

    ``backend``: one of :data:`BACKENDS` (``local`` with ``jobs == 1`` runs inline). ``start_method``:
    how ``local`` starts its workers, one of :data:`START_METHODS` (``fork`` shares what this process
    loaded before the first task; ``spawn`` shares nothing and is safe wherever the parent has threads).
    ``ray_address``: the Ray cluster (None: ``RAY_ADDRESS``, else a local instance). ``on_progress(id,
    finished_requests)``: progress from inside the tasks. Raises :class:`ConfigError` for a bad backend,
    ``jobs`` or start method, and (on entry) when Ray cannot be reached.
    """

    def __init__(
        self,
        backend: str = "local",
        jobs: int = 2,
        *,
        start_method: str = "spawn",
        ray_address: str | None = None,
        on_progress: Callable[[str, int], None] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {jobs}")
        if start_method not in START_METHODS:
            raise ConfigError(f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
        self.backend = "inline" if backend == "local" and jobs == 1 else backend
        self.jobs = jobs
        self.start_method = start_method
        self.ray_address = ray_address
        self.on_progress = on_progress
        self._pool: Any = None
        self._open = False

    def __enter__(self) -> Runner:
        progress = self.on_progress is not None
        self._open = True
        if self.backend == "inline":
            init_worker()
        elif self.backend == "local":
            self._pool = _LocalPool(self.jobs, self.start_method, progress)
        else:
            from mamba_radix.sim.ray_backend import RayCluster

            self._pool = RayCluster(self.ray_address, progress)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pool, self._pool, self._open = self._pool, None, False
        if pool is not None:
            pool.close(abort=exc_type is not None)

    def run(
        self,
        tasks: Sequence[T],
        fn: Callable[[T, Report], R],
        *,
        ids: Sequence[str] | None = None,
        first: Callable[[T], Any] | None = None,
        on_result: Callable[[T, R], None] | None = None,
        on_failure: Callable[[T, str], R] | None = None,
    ) -> list[R]:
        """Run ``fn(task, progress)`` for every task; return the results in ``tasks`` order.

        ``ids``: the tasks' progress ids (default: each task's ``run_id``). ``first``: a sort key of
        the order in which parallel backends start the tasks (the longest first, so that no worker
        idles at the end); inline runs them in ``tasks`` order, so its results stream in that order.
        ``on_result(task, result)``: as each finishes. ``on_failure``: see the module docstring.
        Blocks until every task is done; O(tasks) besides the runs."""
        if not self._open:
            raise RuntimeError("Runner.run outside its `with` block")
        names = [t.run_id for t in tasks] if ids is None else list(ids)  # type: ignore[attr-defined]
        results: list[Any] = [None] * len(tasks)
        capture = on_failure is not None

        def finish(i: int, value: Any) -> None:
            if isinstance(value, _Failed):
                value = on_failure(tasks[i], value.error)  # type: ignore[misc]
            results[i] = value
            if on_result is not None:
                on_result(tasks[i], value)

        if self.backend == "inline":
            put = None if self.on_progress is None else (lambda m: self.on_progress(*m))  # type: ignore[misc]
            for i, task in enumerate(tasks):
                finish(i, _call(fn, task, names[i], capture, put))
            return results
        pool = self._pool
        order = sorted(range(len(tasks)), key=lambda i: first(tasks[i])) if first else range(len(tasks))
        pending: dict[Any, int] = {}
        for i in order:
            if self.backend == "local":
                handle = pool.submit(_call, fn, tasks[i], names[i], capture)
            else:  # the channel goes with each Ray task
                handle = pool.submit(_in_ray_task, fn, tasks[i], names[i], capture, pool.queue)
            pending[handle] = i
        while pending:
            done = pool.wait(list(pending), PROGRESS_EVERY_S)
            self._drain()
            for handle in done:
                i = pending.pop(handle)
                try:
                    value = pool.result(handle)
                except pool.lost as exc:  # the worker died (a task that raised returns a _Failed)
                    if not capture:
                        raise
                    value = _Failed(_error_text(exc, first_line=True))
                finish(i, value)
        self._drain()
        return results

    def _drain(self) -> None:
        channel = self._pool.queue
        if channel is None or self.on_progress is None:
            return
        while True:
            try:
                run_id, finished = channel.get_nowait()
            except queue_mod.Empty:  # Ray's queue raises a subclass
                return
            self.on_progress(run_id, finished)
