"""Simulator throughput: requests/s and tokens/s replaying the Mooncake conversation trace in sequential mode.

Usage: ``.venv/bin/python benchmarks/bench_sim.py [--limit N] [--strategies a,b] [--no-verify-states]
[--mode timed]``.
Prints one line per strategy: wall time, requests/s, input tokens/s, (input + output) tokens/s, and the
hit rate (so that a speed-up that changed the result is visible). Single process, one torch thread.
Not collected by pytest; no assertions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.sim.budget import pools_for_budget
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.traces import iter_trace, scan_trace

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "experiments" / "traces" / "mooncake_conversation_trace.jsonl"


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
        f"{summary.output_tokens:,} output tokens; {args.mode} mode; verify_states={not args.no_verify_states}"
    )
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
        tokens = summary.input_tokens + summary.output_tokens
        print(
            f"{strategy:18s} {wall:7.1f} s  {summary.num_requests / wall:7.1f} req/s  "
            f"{summary.input_tokens / wall / 1e6:6.2f} M input tok/s  {tokens / wall / 1e6:6.2f} M tok/s  "
            f"hit {100 * metrics.summary()['token_hit_rate']:.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
