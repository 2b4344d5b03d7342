"""How long Python's garbage collector stops an engine that holds a large radix tree, and what helps.

Every tree node is a handful of objects the collector tracks (the node, its children dict, its KV index
tensor, its key), so a full (generation 2) collection walks them all. This script builds a tree of
``--nodes`` nodes by public inserts (random branching keys of 16-128 fresh tokens, as in
``bench_vs_sglang.py``'s large-tree stage), then times:

1. one forced full collection, and the tracked objects;
2. the automatic full collections that ``--inserts`` further inserts trigger, with the default
   thresholds;
3. the same after ``gc.freeze()`` (the built tree moves to the permanent generation: collections skip it);
4. the same with generation-2 collections made rare (``gc.set_threshold(700, 10, 1000)``).

Prints one table. Not collected by pytest; nothing is asserted.

Usage::

    .venv/bin/python benchmarks/gc_pause.py                 # 100k nodes, about a minute
    .venv/bin/python benchmarks/gc_pause.py --nodes 20000   # quicker
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable, Sequence

import torch

from mamba_radix import CacheConfig, MambaRadixCache, RadixKey


class Builder:
    """Inserts random branching keys of fresh tokens into one cache through its public ``insert``."""

    def __init__(self, capacity_nodes: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.cache = MambaRadixCache.build(
            CacheConfig(mamba_radix_cache_strategy="extra_buffer"),
            num_tokens=capacity_nodes * 140 + 1_000_000,
            num_slots=capacity_nodes + 16,
            max_running_requests=2,
            max_context_len=8192,
            conv_shapes=((8,),),
            temporal_shape=(4,),
        )
        self.keys: list[list[int]] = []
        self.next_token = 1_000_000_000

    def insert_one(self) -> None:
        rng, keys = self.rng, self.keys
        head = []
        if keys and rng.random() < 0.95:
            parent = keys[rng.randrange(len(keys))]
            head = parent[: rng.randint(1, len(parent))]
        n = rng.randint(16, 128)
        key = head + list(range(self.next_token, self.next_token + n))
        self.next_token += n
        kv = self.cache.token_to_kv_pool_allocator.alloc(len(key))
        slot = int(self.cache.mamba_pool.alloc(1)[0])
        if self.cache.insert(RadixKey(tuple(key)), kv, slot).mamba_exists:
            self.cache.mamba_pool.free([slot])
        keys.append(key)

    def num_nodes(self) -> int:
        return self.cache.tree.num_nodes


def full_pauses(run: Callable[[], None]) -> list[float]:
    """The durations (s) of the generation-2 collections that happen while ``run`` runs."""
    pauses: list[float] = []
    started = [0.0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            pauses.append(time.perf_counter() - started[0])

    gc.callbacks.append(watch)
    try:
        run()
    finally:
        gc.callbacks.remove(watch)
    return pauses


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000, help="tree nodes to build (default 100,000)")
    parser.add_argument(
        "--inserts", type=int, default=20_000, help="inserts timed per setting (default 20,000)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    builder = Builder(args.nodes + 4 * args.inserts)
    t0 = time.perf_counter()
    while builder.num_nodes() < args.nodes:
        for _ in range(1000):
            builder.insert_one()
    built_s = time.perf_counter() - t0
    tracked = len(gc.get_objects())
    t0 = time.perf_counter()
    gc.collect()
    forced_ms = 1e3 * (time.perf_counter() - t0)

    def inserts() -> None:
        for _ in range(args.inserts):
            builder.insert_one()

    rows = []
    for label, setup in (
        ("default thresholds", lambda: None),
        ("after gc.freeze()", gc.freeze),
        ("gen-2 threshold 1000", lambda: gc.set_threshold(700, 10, 1000)),
    ):
        setup()
        t0 = time.perf_counter()
        pauses = full_pauses(inserts)
        wall = time.perf_counter() - t0
        rows.append((label, builder.num_nodes(), len(pauses), max(pauses, default=0.0), sum(pauses), wall))
    print(
        f"tree of {args.nodes:,} nodes built in {built_s:.1f} s; {tracked:,} objects tracked; one forced full "
        f"collection: {forced_ms:,.0f} ms"
    )
    print()
    print(f"| setting | nodes at the end | full collections in {args.inserts:,} inserts | longest (ms) | total (ms) "
          "| per insert, amortised (µs) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for label, nodes, n, longest, total, _wall in rows:
        print(f"| {label} | {nodes:,} | {n} | {1e3 * longest:,.0f} | {1e3 * total:,.0f} "
              f"| {1e6 * total / args.inserts:,.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
