"""Tree benchmark: replay the Mooncake conversation trace through MambaRadixCache as match / insert / evict.

Each request of the trace (block format: every hash id is a 512-token block) is expanded to tokens
(block ``b`` -> ``b * 512 + j`` for ``j`` in ``[0, 512)``, the last block cut to ``input_length``), then:

1. ``match_prefix(input[:-1])`` (as SGLang's scheduler matches) and a lock on the matched node;
2. ``evict`` of just enough KV tokens for the uncached part;
3. for each checkpoint an extra_buffer engine would take (one per 8,192-token prefill chunk, at its last
   64-aligned position or at the branch point): ``evict`` of a checkpoint if no slot is free, then
   ``insert(input[:pos], KV, fresh slot, prev_prefix_len)`` with the lock moving to the new node, as
   ``cache_unfinished_req`` does; the KV past the last checkpoint is freed, as at finish.

It runs at several KV capacities (state slots scale with them) and prints requests/s, tokens/s and the
median time of each operation as a markdown table, plus the token hit rate. Timings are wall-clock,
measured in this run only; nothing is compared against stored numbers.

    .venv/bin/python benchmarks/bench_tree.py                       # default: 2,000 requests, 3 capacities
    .venv/bin/python benchmarks/bench_tree.py --num-requests 500 --capacities 262144
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from mamba_radix import CacheConfig, MambaRadixCache, RadixKey
from mamba_radix.strategies import prefill_track_len

BLOCK_SIZE = 512
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "traces"
    / "mooncake_conversation_trace.jsonl"
)


def load_requests(path: Path, num_requests: int) -> list[tuple[int, ...]]:
    """The first ``num_requests`` prompts as token tuples. Block tuples are shared between requests."""
    blocks: dict[int, tuple[int, ...]] = {}
    prompts = []
    with path.open() as f:
        for line, _ in zip(f, range(num_requests), strict=False):
            row = json.loads(line)
            tokens: list[int] = []
            for b in row["hash_ids"]:
                block = blocks.get(b)
                if block is None:
                    block = blocks[b] = tuple(range(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE))
                tokens.extend(block)
            prompts.append(tuple(tokens[: row["input_length"]]))
    return prompts


def checkpoint_positions(config: CacheConfig, hit: int, num_tokens: int, branching: int | None) -> list[int]:
    """Where an extra_buffer engine checkpoints a prefill of [hit, num_tokens): one per chunk."""
    chunk = config.chunked_prefill_size
    positions = []
    for start in range(hit, num_tokens, chunk):
        track = prefill_track_len(config, start, min(chunk, num_tokens - start), branching)
        if track is not None:
            positions.append(track)
    return positions


def replay(prompts: list[tuple[int, ...]], num_tokens: int, num_slots: int) -> dict[str, float]:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")  # chunks of 8192, grid 64
    cache = MambaRadixCache.build(config, num_tokens=num_tokens, num_slots=num_slots, max_context_len=1)
    allocator, mamba_pool = cache.token_to_kv_pool_allocator, cache.mamba_pool
    times: dict[str, list[int]] = {"match": [], "insert": [], "evict": []}
    hit_tokens = input_tokens = skipped = 0
    clock = time.perf_counter_ns

    def evict(short_tokens: int, short_states: int) -> None:
        t0 = clock()
        cache.evict(short_tokens, short_states)
        times["evict"].append(clock() - t0)

    start = clock()
    for tokens in prompts:
        if len(tokens) > num_tokens:
            skipped += 1  # longer than the whole pool: an engine would reject it
            continue
        t0 = clock()
        m = cache.match_prefix(RadixKey(tokens[:-1]))
        times["match"].append(clock() - t0)
        node = m.last_node
        cache.inc_lock_ref(node)
        hit = len(m.device_indices)
        short_tokens = len(tokens) - hit - allocator.available_size()
        if short_tokens > 0:
            evict(short_tokens, 0)
        fresh = allocator.alloc(len(tokens) - hit)
        if fresh is None:  # everything left is locked: cannot happen with one request at a time
            raise RuntimeError("KV pool exhausted with a single running request")
        kv = torch.cat([m.device_indices, fresh])
        protected = hit
        for position in checkpoint_positions(config, hit, len(tokens), m.mamba_branching_seqlen):
            if mamba_pool.available_size() == 0:
                evict(0, 1)
            slots = mamba_pool.alloc(1)
            if slots is None:
                continue  # no slot even after eviction: skip the checkpoint, as the cache does
            t0 = clock()
            result, done = cache._insert(RadixKey(tokens[:position]), kv[:position], int(slots[0]), protected)
            times["insert"].append(clock() - t0)
            if result.mamba_exists:
                mamba_pool.free(slots)
            kv[protected:position] = cache.tree.path_values(done.node)[protected:]  # the tree's copies
            cache.inc_lock_ref(done.node)  # the lock moves forward, as in cache_unfinished_req
            cache.dec_lock_ref(node)
            node, protected = done.node, position
        if protected < len(tokens):
            allocator.free(kv[protected:])  # no state past the last checkpoint: its KV goes
        cache.dec_lock_ref(node)
        hit_tokens += hit
        input_tokens += len(tokens)
    elapsed_s = (clock() - start) / 1e9
    cache.check_invariants([])
    done_requests = len(prompts) - skipped
    median_us = {op: statistics.median(t) / 1e3 if t else float("nan") for op, t in times.items()}
    return {
        "requests": done_requests,
        "requests_per_s": done_requests / elapsed_s,
        "tokens_per_s": input_tokens / elapsed_s,
        "match_us": median_us["match"],
        "insert_us": median_us["insert"],
        "evict_us": median_us["evict"],
        "evict_calls": len(times["evict"]),
        "hit_rate": hit_tokens / max(input_tokens, 1),
        "tokens_evicted": cache.stats.tokens_evicted,
        "states_evicted": cache.stats.states_evicted,
        "elapsed_s": elapsed_s,
        "nodes": cache.tree.num_nodes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE.resolve())
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument(
        "--capacities",
        default="262144,1048576,4194304",
        help="KV token capacities, comma-separated (state slots = capacity / --tokens-per-slot)",
    )
    parser.add_argument("--tokens-per-slot", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 by default: the index tensors here are small, and extra threads "
        "only add contention (25x slower per op on a loaded 2-core machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    prompts = load_requests(args.trace, args.num_requests)
    total = sum(len(p) for p in prompts)
    print(
        f"trace: {args.trace.name}, {len(prompts)} requests, {total:,} input tokens "
        f"(expanded in {time.perf_counter() - t0:.1f} s)\n"
    )
    print(
        "| KV capacity (tokens) | state slots | requests/s | tokens/s | match median (µs) | "
        "insert median (µs) | evict median (µs) | evict calls | token hit rate | nodes at end |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for capacity in (int(c) for c in args.capacities.split(",")):
        slots = max(4, capacity // args.tokens_per_slot)
        r = replay(prompts, capacity, slots)
        print(
            f"| {capacity:,} | {slots:,} | {r['requests_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
            f"{r['match_us']:.1f} | {r['insert_us']:.1f} | {r['evict_us']:.1f} | {r['evict_calls']:,} | "
            f"{r['hit_rate']:.3f} | {r['nodes']:,} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
