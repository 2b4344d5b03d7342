"""Cost against scale: wall time and peak memory of a replay against trace length and tree size (issue 28).

Each point runs in a fresh process (its peak resident set is its own): the simulator's cache, as an engine
embeds it (sequential replay, extra_buffer with SGLang 0.5.23's rules, state checks off), over

- **trace length**: the first 2,000 and all 12,031 requests of the bundled Mooncake conversation trace,
  and 100,000 requests of the session generator fitted to that trace (:func:`mamba_radix.sim.sessions.session_chat`),
  at one pool size (``--kv-tokens`` / ``--slots``);
- **tree size**: the whole conversation trace at several KV pool sizes (``--tree-kv-tokens``): a larger pool
  keeps a larger tree, so the per-request cost shows how the tree's size weighs on it.

Printed per point: requests, the replay's wall seconds and microseconds per request, requests per second,
the tree at the end (nodes, cached KV tokens), the process's peak resident set (``VmHWM``) and its growth over
the replay, and the growth per cached token. Times are wall clock on a possibly shared machine: the load
average is printed with them.

    .venv/bin/python benchmarks/bench_scale.py                 # the full table (~5 min on 2 idle cores)
    .venv/bin/python benchmarks/bench_scale.py --quick         # 2,000 / 12,031 / 20,000 requests, one pool size
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def status_bytes(field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of this process in bytes, from ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def load_requests(workload: str, num_requests: int) -> list:
    """``conversation`` (the bundled trace's first ``num_requests``) or ``sessions`` (that many generated)."""
    if workload == "conversation":
        from mamba_radix.data import trace_path
        from mamba_radix.sim.traces import iter_trace

        return list(iter_trace(str(trace_path()), "block", 512, num_requests))
    if workload == "sessions":
        from mamba_radix.sim.sessions import session_chat

        return session_chat(seed=0, num_requests=num_requests)
    raise SystemExit(f"bench_scale: unknown workload {workload!r}")


def measure(workload: str, num_requests: int, kv_tokens: int, slots: int) -> dict[str, object]:
    """Replay ``num_requests`` of ``workload`` through a fresh cache; the readings (this process's)."""
    from mamba_radix.experiment import base_config
    from mamba_radix.policies.registry import POLICIES
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    requests = load_requests(workload, num_requests)
    config = POLICIES["sglang-0.5.23"].configure(base_config())
    pools = exact_pools(config, kv_tokens, slots, "kimi-k3")
    max_len = max(r.input_len + r.output_len for r in requests)
    engine = Engine(config, pools, max_len, EngineOptions(mode="sequential", verify_states=False))
    rss_built = status_bytes("VmRSS")
    start = time.perf_counter()
    engine.run(requests, total=len(requests))
    wall_s = time.perf_counter() - start
    cache = engine.cache
    return {
        "workload": workload,
        "requests": len(requests),
        "kv_tokens": kv_tokens,
        "slots": slots,
        "wall_s": wall_s,
        "nodes": int(cache.tree.num_nodes),
        "cached_tokens": int(cache.full_evictable_size() + cache.full_protected_size()),
        "rss_built": rss_built,
        "rss_after": status_bytes("VmRSS"),
        "rss_peak": status_bytes("VmHWM"),
    }


def run_point(workload: str, num_requests: int, kv_tokens: int, slots: int) -> dict[str, object]:
    """:func:`measure` in a fresh process."""
    child = [sys.executable, __file__, "--one", workload, str(num_requests), str(kv_tokens), str(slots)]
    out = subprocess.run(child, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def row(m: dict) -> str:
    growth = m["rss_after"] - m["rss_built"]
    per_token = growth / m["cached_tokens"] if m["cached_tokens"] else 0.0
    return (
        f"| {m['workload']} | {m['requests']:,} | {m['kv_tokens']:,} | {m['nodes']:,} | {m['cached_tokens']:,} "
        f"| {m['wall_s']:.1f} | {1e6 * m['wall_s'] / m['requests']:,.0f} | {m['requests'] / m['wall_s']:,.0f} "
        f"| {m['rss_peak'] / MIB:,.0f} | {growth / MIB:,.0f} | {per_token:.1f} |"
    )


HEADER = (
    "| workload | requests | KV pool tokens | nodes at end | cached tokens at end | replay s | µs per request "
    "| requests/s | peak RSS MiB | RSS growth MiB | growth bytes per cached token |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-tokens", type=int, default=8_000_000, help="KV pool of the length sweep")
    parser.add_argument("--slots", type=int, default=1024, help="state slots of every point")
    parser.add_argument(
        "--tree-kv-tokens",
        type=int,
        nargs="*",
        default=[2_000_000, 32_000_000],
        help="extra KV pool sizes of the tree-size sweep (whole conversation trace)",
    )
    parser.add_argument("--synthetic-requests", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="20,000 synthetic requests, no tree-size sweep")
    parser.add_argument("--json", metavar="FILE", help="also write every point as JSON lines to FILE")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # a child: WORKLOAD N KV SLOTS
    args = parser.parse_args()
    if args.one:
        workload, n, kv, slots = args.one
        print(json.dumps(measure(workload, int(n), int(kv), int(slots))))
        return
    synthetic = 20_000 if args.quick else args.synthetic_requests
    points = [
        ("conversation", 2000, args.kv_tokens),
        ("conversation", 12_031, args.kv_tokens),
        ("sessions", synthetic, args.kv_tokens),
    ]
    if not args.quick:
        points += [("conversation", 12_031, kv) for kv in args.tree_kv_tokens]
    print(
        f"Started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, load average "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}; {args.slots:,} state slots; sglang-0.5.23 rules, "
        "extra_buffer, sequential, state checks off; each point in a fresh process\n"
    )
    print(HEADER, flush=True)
    results = []
    for workload, n, kv in points:
        m = run_point(workload, n, kv, args.slots)
        results.append(m)
        print(row(m), flush=True)
    print(f"\nload average at the end {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(m) + "\n" for m in results))


if __name__ == "__main__":
    main()
