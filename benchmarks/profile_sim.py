"""Profile our simulator on the trace replay (cProfile): where its time goes, file:function with % of time.

Replays the first ``--limit`` Mooncake conversation requests through :class:`mamba_radix.sim.engine.Engine`
exactly as ``benchmarks/bench_vs_sglang.py`` does (sequential, extra_buffer with the ``sglang-0.5.20``
preset, 8M KV tokens / 1024 state slots, state verification off, one torch thread) under
:mod:`cProfile` (the standard library's deterministic profiler), and prints:

1. the top functions by **own time** (``tottime``: time in the function itself, callees excluded), as
   ``file:line(function)`` with the share of the profiled total, the calls and µs per call;
2. the top functions by **cumulative time** (callees included): which entry points are expensive;
3. own time summed **per file**: which module to look at first.

cProfile adds a fixed cost to every Python call, so code made of many small calls looks more expensive
than it is (about 1.5-2x on this code); the ranking is what to read, not the absolute times. The wall
time without the profiler is measured first and printed for scale. Not collected by pytest.

Usage::

    .venv/bin/python benchmarks/profile_sim.py                  # 2,000 requests, top 25
    .venv/bin/python benchmarks/profile_sim.py --limit 500 --top 40 --save sim.prof
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.data import trace_path
from mamba_radix.peers import apply_peer
from mamba_radix.sim.traces import TraceRequest, iter_block_trace

KV_TOKENS = 8_000_000
STATE_SLOTS = 1024
REPO = Path(__file__).resolve().parents[1]


def build_engine(traces: list[TraceRequest]) -> Any:
    """The simulator of the benchmark's trace stage (same config, pools and options)."""
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    config = apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), "sglang-0.5.20")
    pools = exact_pools(config, KV_TOKENS, STATE_SLOTS, "kimi-k3")
    max_len = max(t.input_len + t.output_len for t in traces)
    return Engine(
        config,
        pools,
        max_len,
        EngineOptions(mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=4),
    )


def profile_only(prof: cProfile.Profile, cache: Any, names: list[str]) -> None:
    """Wrap ``cache``'s methods ``names`` (instance attributes shadowing the class's; a dotted name is a
    method of an object the cache holds, e.g. ``lifecycle.cache_finished_req``) so that ``prof``
    runs only inside them; a call nested in another profiled one (a finish that evicts) stays inside the
    outer one's window. Side effect: sets the wrappers on ``cache``."""
    depth = [0]

    def wrap(method: Any) -> Any:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            if depth[0] == 1:
                prof.enable()
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    prof.disable()

        return profiled

    for name in names:
        *path, attr = name.split(".")
        owner = cache
        for step in path:  # "lifecycle.cache_finished_req": a method of an object the cache holds
            owner = getattr(owner, step, None)
        if not callable(getattr(owner, attr, None)):
            raise SystemExit(f"--only: the cache has no method {name!r}")
        setattr(owner, attr, wrap(getattr(owner, attr)))


def short_path(filename: str) -> str:
    """A repository-relative path for our files, the tail for others (site-packages, builtins)."""
    try:
        return str(Path(filename).resolve().relative_to(REPO))
    except ValueError:
        pass
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    return filename


def label(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":  # a builtin: pstats names it "{method 'x' of ...}"
        return name
    return f"{short_path(filename)}:{line}({name})"


def top_lines(stats: pstats.Stats, key: str, top: int) -> list[str]:
    """Markdown rows: the ``top`` functions by ``key`` (0: own time, 1: cumulative)."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    idx = 2 if key == "tottime" else 3
    rows = sorted(raw.items(), key=lambda kv: kv[1][idx], reverse=True)[:top]
    out = [
        f"| {'own' if key == 'tottime' else 'cumulative'} % | s | calls | µs per call | function |",
        "|---:|---:|---:|---:|---|",
    ]
    for func, (_cc, nc, tt, ct, _callers) in rows:
        t = tt if key == "tottime" else ct
        out.append(
            f"| {100 * t / total:.1f} | {t:.2f} | {nc:,} | {1e6 * t / max(nc, 1):.1f} | `{label(func)}` |"
        )
    return out


def per_file(stats: pstats.Stats, top: int) -> list[str]:
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    files: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), (_cc, _nc, tt, _ct, _callers) in raw.items():
        key = (
            "builtins and C methods (torch, numpy, list, tuple...)"
            if filename == "~"
            else short_path(filename)
        )
        files[key] += tt
    out = ["| own % | s | file |", "|---:|---:|---|"]
    for f, t in sorted(files.items(), key=lambda kv: kv[1], reverse=True)[:top]:
        out.append(f"| {100 * t / total:.1f} | {t:.2f} | `{f}` |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="cProfile of our simulator on the trace replay of bench_vs_sglang.py: top functions by "
        "own and cumulative time, and own time per file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--limit", type=int, default=2000, help="trace requests to replay")
    p.add_argument("--top", type=int, default=25, help="rows per table")
    p.add_argument("--trace", default=str(trace_path()), help="block-format trace file")
    p.add_argument("--save", metavar="FILE", help="also write the raw profile (pstats format) to FILE")
    p.add_argument("--no-baseline", action="store_true", help="skip the unprofiled run")
    p.add_argument(
        "--only",
        default="",
        help="profile only inside these cache methods, comma-separated (e.g. evict,"
        "lifecycle.cache_finished_req); "
        "empty: the whole replay",
    )
    args = p.parse_args(argv)
    if args.limit < 1 or args.top < 1:
        p.error("--limit and --top must be >= 1")
    torch.set_num_threads(1)
    traces = list(iter_block_trace(args.trace, limit=args.limit))

    plain_s = cpu_s = float("nan")
    if not args.no_baseline:
        engine = build_engine(traces)
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.run(traces, total=len(traces))
        plain_s, cpu_s = time.perf_counter() - t0, time.thread_time() - c0

    engine = build_engine(traces)
    prof = cProfile.Profile()
    only = [name for name in args.only.split(",") if name]
    t0 = time.perf_counter()
    if only:
        profile_only(prof, engine.cache, only)
        engine.run(traces, total=len(traces))
    else:
        prof.enable()
        engine.run(traces, total=len(traces))
        prof.disable()
    prof_s = time.perf_counter() - t0
    stats = pstats.Stats(prof, stream=io.StringIO())
    if args.save:
        stats.dump_stats(args.save)

    out = [
        f"### Profile of our simulator: first {len(traces):,} conversation requests (cProfile)",
        "",
        f"Command: `python benchmarks/profile_sim.py {' '.join(argv if argv is not None else sys.argv[1:])}`. "
        f"Without the profiler: {plain_s:.2f} s wall, {cpu_s:.2f} s CPU; under cProfile: {prof_s:.2f} s wall, "
        f"{stats.total_tt:.2f} s profiled.",  # type: ignore[attr-defined]
        "",
        "Own time (the function itself, callees excluded):",
        "",
        *top_lines(stats, "tottime", args.top),
        "",
        "Cumulative time (callees included):",
        "",
        *top_lines(stats, "cumtime", args.top),
        "",
        "Own time per file:",
        "",
        *per_file(stats, min(args.top, 15)),
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
