"""Alloc/free throughput of the pools against a plain Python free list, measured in the same run.

Workload ("churn"): keep a window of up to 1024 live allocations (at most half the pool); each step allocates one batch and, once the window
is full, frees the oldest batch. This exercises the hot paths an engine loop hits (decode: batches of a
few indices; prefill: thousands) with the free list partly fragmented. Every allocator, ours and the
baseline, runs the same steps; the table prints steps per second and ours / baseline.

The baseline is the simplest correct allocator: a Python list of free ids used as a stack, ``alloc``
slicing n ids off its end, ``free`` extending it, with no misuse checks. Ours checks every free (range,
double free, duplicates) through the allocation bitmap and returns torch tensors.

torch runs on 1 thread (``torch.set_num_threads(1)``, printed in the header): these calls are a few
microseconds each, and on a loaded machine extra intra-op threads only add wake-up cost (small index ops
were ~25x slower with 2 threads than with 1). The CPU pools' free list works through numpy and does not
depend on the setting; ``--backend torch`` measures the plain-torch free list that non-CPU devices use.

    .venv/bin/python benchmarks/bench_pools.py            # ~20 s on 1 core
    .venv/bin/python benchmarks/bench_pools.py --quick    # a few seconds, smaller step counts
    .venv/bin/python benchmarks/bench_pools.py --backend torch   # the device free list, run on CPU
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable

import torch

from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator


class PythonFreeList:
    """The baseline: ids 1..size in a Python list; no checks, no device tensors."""

    def __init__(self, size: int) -> None:
        self.free_ids = list(range(size, 0, -1))

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free_ids):
            return None
        out = self.free_ids[len(self.free_ids) - n :]
        del self.free_ids[len(self.free_ids) - n :]
        return out

    def free(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)


def churn(
    alloc: Callable[[int], object], free: Callable[[object], None], batch: int, window: int, steps: int
) -> float:
    """Seconds for ``steps`` alloc calls of ``batch`` ids with at most ``window`` batches alive."""
    live: collections.deque = collections.deque()
    start = time.perf_counter()
    for _ in range(steps):
        got = alloc(batch)
        if got is None:
            raise RuntimeError("benchmark pool too small for its window")
        live.append(got)
        if len(live) > window:
            free(live.popleft())
    while live:
        free(live.popleft())
    return time.perf_counter() - start


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per cell")
    parser.add_argument(
        "--backend",
        choices=["auto", "torch"],
        default="auto",
        help="free list implementation of our pools (auto: numpy views on CPU)",
    )
    args = parser.parse_args()
    backend = args.backend
    torch.set_num_threads(1)
    scale = 0.1 if args.quick else 1.0
    token_pool, state_pool, page_size = 1_000_000, 10_000, 16

    # (pool name, batch ids per step, steps, window of live batches, make ours, make baseline)
    cases: list[tuple[str, int, int, int, Callable[[], tuple], Callable[[], tuple]]] = []

    def token_case(batch: int, steps: int) -> None:
        window = max(1, min(1024, token_pool // (2 * batch)))

        def ours() -> tuple:
            a = TokenToKVPoolAllocator(token_pool, backend=backend)
            return a.alloc, a.free

        def base() -> tuple:
            b = PythonFreeList(token_pool)
            return b.alloc, b.free

        cases.append(("token 1M (need_sort)", batch, steps, window, ours, base))

    def paged_case(batch_tokens: int, steps: int) -> None:
        window = max(1, min(1024, token_pool // (2 * batch_tokens)))

        def ours() -> tuple:
            a = PagedTokenToKVPoolAllocator(token_pool, page_size, backend=backend)
            return a.alloc, a.free

        def base() -> tuple:
            b = PythonFreeList(token_pool)
            return b.alloc, b.free

        cases.append((f"paged 1M, page {page_size}", batch_tokens, steps, window, ours, base))

    def state_case(batch: int, steps: int) -> None:
        window = max(1, min(1024, state_pool // (2 * batch)))

        def ours() -> tuple:
            pool = MambaPool(state_pool, 1, [(3, 8)], (1, 4, 4), backend=backend)
            return pool.alloc, pool.free

        def base() -> tuple:
            b = PythonFreeList(state_pool)
            return b.alloc, b.free

        cases.append(("state 10k slots", batch, steps, window, ours, base))

    for batch, steps in [(1, 20_000), (64, 20_000), (4096, 2_000)]:
        token_case(batch, int(steps * scale))
    for batch, steps in [(16, 20_000), (4096, 2_000)]:
        paged_case(batch, int(steps * scale))
    for batch, steps in [(1, 20_000), (8, 20_000)]:
        state_case(batch, int(steps * scale))

    header = f"{'pool':<24} {'ids/step':>8} {'steps':>7} {'ours steps/s':>13} {'baseline steps/s':>17} {'ours/baseline':>14}"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread, free list backend {backend}, "
        f"best of {args.repeats}; churn: up to 1024 batches alive (at most half the pool)"
    )
    print(header)
    print("-" * len(header))
    for name, batch, steps, window, make_ours, make_base in cases:

        def run(
            make: Callable[[], tuple], batch: int = batch, window: int = window, steps: int = steps
        ) -> float:
            alloc, free = make()
            return churn(alloc, free, batch, window, steps)

        t_ours = best_of(args.repeats, lambda make=make_ours: run(make))
        t_base = best_of(args.repeats, lambda make=make_base: run(make))
        print(
            f"{name:<24} {batch:>8} {steps:>7} {steps / t_ours:>13,.0f} {steps / t_base:>17,.0f} "
            f"{t_base / t_ours:>13.2f}x"
        )


if __name__ == "__main__":
    main()
