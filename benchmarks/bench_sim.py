"""Simulator throughput: requests/s and tokens/s replaying the Mooncake conversation trace in sequential mode.

Usage: ``.venv/bin/python benchmarks/bench_sim.py [--limit N] [--strategies a,b] [--no-verify-states]
[--mode timed]``.
Prints a markdown table, one row per strategy: wall time, requests/s, input tokens/s, (input + output)
tokens/s, the hit rate (so that a speed-up that changed the result is visible) and the wall time as a
multiple of the I/O floor. Single process, one torch thread. Not collected by pytest; no assertions.

**Baseline, measured in the same run: the I/O floor.** :func:`io_floor` does, for the same requests, the
per-request work the engine does outside the cache, and nothing else: stream and parse the trace
(:func:`mamba_radix.sim.traces.iter_trace`), expand each input to an int64 array and a Python list, build
the match key tuple ``input[:-1]`` and the output ids, compute the prefix fingerprints of input + output
(:class:`mamba_radix.sim.stamps.PrefixFingerprints`) and the infinite-capacity ideal
(:func:`mamba_radix.sim.ideal.ideal_for`). No cache, no pools, no engine loop, no stamps written or
checked, no metrics. It is measured before and after the strategies (the machines are shared and noisy);
``x floor`` divides each strategy's wall time by the mean of the two, so ``x floor - 1`` is what the cache,
the pools and the engine's scheduling cost on top of just reading the trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from mamba_radix.config import CacheConfig
from mamba_radix.sim.budget import pools_for_budget
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.ideal import IdealHit, ideal_for
from mamba_radix.sim.traces import iter_trace, scan_trace
from mamba_radix.state_stamp import PrefixFingerprints

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "experiments" / "traces" / "mooncake_conversation_trace.jsonl"


def io_floor(trace: str, limit: int | None) -> tuple[float, int]:
    """BASELINE: seconds to stream, expand, fingerprint and compute the ideal of the requests, without
    the cache or the engine; and the ideal hit tokens (the engine's must be the same)."""
    start = time.perf_counter()
    ideal: IdealHit | None = None
    ideal_tokens = 0
    for req in iter_trace(trace, limit=limit):
        if ideal is None:
            ideal = ideal_for(req)
        ideal_tokens += ideal.observe(req)
        arr = req.input_array()
        ids = arr.tolist()
        key = tuple(ids[:-1])  # what the engine's RadixKey holds
        output_ids = req.output_ids
        fp = PrefixFingerprints(np.concatenate([arr, req.output_array()]))
        assert fp.length == len(ids) + len(output_ids) and len(key) == len(ids) - 1
    return time.perf_counter() - start, ideal_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--limit", type=int, default=2000, help="requests to replay (default 2000; 0 = all)")
    parser.add_argument("--strategies", default="no_buffer,extra_buffer,extra_buffer_lazy")
    parser.add_argument("--mamba-full-memory-ratio", type=float, default=0.5)
    parser.add_argument("--no-verify-states", action="store_true", help="skip the state-stamp checks")
    parser.add_argument("--mode", choices=["sequential", "timed"], default="sequential")
    parser.add_argument("--arrival-time-scale", type=float, default=2.0, help="timed mode only (default 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    limit = args.limit or None
    summary = scan_trace(args.trace, limit=limit)
    print(
        f"trace {Path(args.trace).name}: {summary.num_requests:,} requests, {summary.input_tokens:,} input + "
        f"{summary.output_tokens:,} output tokens; {args.mode} mode; verify_states={not args.no_verify_states}\n"
    )
    tokens = summary.input_tokens + summary.output_tokens

    def row(name: str, wall: float, hit: str, ratio: str) -> str:
        return (
            f"| {name} | {wall:.2f} | {summary.num_requests / wall:,.1f} | "
            f"{summary.input_tokens / wall / 1e6:.2f} | {tokens / wall / 1e6:.2f} | {hit} | {ratio} |"
        )

    floor_before, ideal_tokens = io_floor(args.trace, limit)
    results = []
    for strategy in args.strategies.split(","):
        config = CacheConfig(mamba_radix_cache_strategy=strategy)
        pools = pools_for_budget(config, mamba_full_memory_ratio=args.mamba_full_memory_ratio)
        options = EngineOptions(
            mode=args.mode,
            arrival_time_scale=args.arrival_time_scale,
            verify_states=not args.no_verify_states,
        )
        start = time.perf_counter()
        engine = Engine(config, pools, summary.max_seq_len, options)
        metrics = engine.run(iter_trace(args.trace, limit=limit), total=summary.num_requests)
        wall = time.perf_counter() - start
        results.append((strategy, wall, metrics, engine.rejected))
    floor_after, _ = io_floor(args.trace, limit)
    floor = (floor_before + floor_after) / 2

    print("| strategy | wall (s) | req/s | M input tok/s | M tok/s | hit | x I/O floor |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ideal_rate = f"ideal {100 * ideal_tokens / summary.input_tokens:.2f}%"
    print(row("I/O floor (no cache, baseline)", floor, ideal_rate, "1.00x"))
    for strategy, wall, metrics, rejected in results:
        print(
            row(strategy, wall, f"{100 * metrics.summary()['token_hit_rate']:.2f}%", f"{wall / floor:.2f}x")
        )
        if rejected == 0 and metrics.ideal_hit_tokens != ideal_tokens:  # same work?
            print(
                f"  note: {strategy}'s ideal is {metrics.ideal_hit_tokens:,} tokens, the floor's {ideal_tokens:,}"
            )
    print(
        "\nI/O floor: streaming + expanding the same requests, their prefix fingerprints and the ideal, "
        f"without the cache or the engine: {floor_before:.2f} s before the strategies, {floor_after:.2f} s "
        "after, mean used. "
        "x I/O floor = strategy wall time / floor wall time."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
