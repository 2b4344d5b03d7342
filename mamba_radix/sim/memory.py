"""Giving a finished run's memory back before the next one: :func:`release_memory`.

Why: a finished :class:`~mamba_radix.sim.engine.Engine` is cyclic garbage (the tree's parent links, the
cache and its policy pointing at each other), freed only at the collector's next full pass, and a
process replaying run after run (an experiment's worker, Marconi's warm-up grid, a demand pass before
the run) can reach that pass with several dead trees still held: measured on the conversation workload,
a worker's peak was 1.17 GiB where one run needs 0.63. What is freed then goes back to the C heap, which
glibc keeps (a worker idling on small runs held a big run's 0.9 GiB): ``malloc_trim`` returns it to the
system, so the processes' summed resident set follows what each is running now.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["LARGE_KV_TOKENS", "release_memory"]

# An engine over at least this many KV indices collects first (Engine.__init__): the tree a dead engine
# can hold is bounded by its pool, and below this (tests, small sweeps) a full collection per engine
# would cost more than the memory it returns.
LARGE_KV_TOKENS = 1 << 20

_TRIM: object = None  # libc's malloc_trim once looked up; False where there is none (not glibc)


def _malloc_trim():
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        name = ctypes.util.find_library("c")
        try:
            _TRIM = ctypes.CDLL(name).malloc_trim if name else False
        except (OSError, AttributeError):
            _TRIM = False
    return _TRIM


def release_memory() -> None:
    """Collect cyclic garbage (a full pass) and return the C heap's free pages to the system (glibc's
    ``malloc_trim``; nothing more elsewhere). Side effects: runs the collector. Cost: O(live objects),
    ~10-50 ms in a worker holding a loaded workload; call it between runs, not inside one."""
    gc.collect()
    trim = _malloc_trim()
    if trim:
        trim(0)  # type: ignore[operator]
