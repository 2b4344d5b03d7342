"""Our cache against SGLang's, each cache alone in its own process, as an engine runs it (issue 28).

The primary speed benchmark. Every system replays the same trace in a fresh interpreter of its own
(``benchmarks/_per_process_worker.py``), so no cache pays for another's heap: in one shared process each
side's calls are slowed by the other's objects (garbage-collector passes over them, CPU-cache footprint),
and a ratio that depends on the co-tenant is not the cost an engine pays. ``bench_vs_sglang.py`` (both
caches in one process, taking turns) stays as a secondary view, with its long-context, deep-session and
large-tree stages.

Systems, per SGLang release ``V`` (``--versions``, default 0.5.20 and 0.5.23, each loaded from its wheel):

- ``ours (V rules)``: the simulator (state verification off) with the ``sglang-V`` preset;
- ``SGLang V``: SGLang's own cache (0.5.20 ``MambaRadixCache``, 0.5.23 ``UnifiedRadixCache``) behind the
  replay module's scheduler driver, on counting pools; by default the lightest that keep SGLang's own checks
  (every count it reads, no liveness record of issued ids: ``--sg-pools checked`` puts that back).

The same first ``--limit`` Mooncake conversation requests (block size 512), sequential, extra_buffer, the
same pools (``--kv-tokens`` / ``--state-slots``, 8M / 1024 by default). ``--repeats`` rounds, interleaved in
time (ours 0.5.20, SGLang 0.5.20, ours 0.5.23, SGLang 0.5.23, then again), so that load on a shared machine
falls on every system alike; samples of all rounds are pooled. Every request's hit must be identical
between ours and the SGLang release whose rules it runs, in every round: a difference fails the run (exit 1)
after the report is printed, since the two caches then did different work.

Printed (markdown; ``--out FILE`` writes it too, ``--json FILE`` the numbers):

1. per operation (admission ``match_prefix``, ``cache_unfinished_req``, ``cache_finished_req``, ``evict``)
   and system: calls, median and p99 µs, the median time inside pool calls, the median without it, and the
   per-round medians;
2. ratios SGLang / ours (> 1: ours is faster) per release and against the faster SGLang core (the release
   with the lower median), with issue 28's targets (median and p99 at least 3x);
3. the whole replay: wall and CPU per system, in cache calls, in pools; ratio against the faster core;
4. memory: peak RSS of each process (read before the memory walk) and its RSS just before the cache was
   built, the tree's nodes and cached tokens at the end, the bytes the tree and the cache's bookkeeping hold
   per cached token and per node, and the pools' host bytes (``--no-memory`` skips the walk, first round
   only otherwise).

One line of progress per worker on stderr (``--quiet``: none). Exit status: 0 done (also when an SGLang
release cannot be loaded: it is reported and left out), 1 hits differ, 2 bad usage, 3 a worker failed or
ran past ``--worker-timeout-s``. Not collected by pytest (``property_tests/test_bench_per_process.py`` runs
it at a tiny size).

Usage::

    .venv/bin/python benchmarks/bench_per_process.py                      # 2,000 requests, 3 rounds
    .venv/bin/python benchmarks/bench_per_process.py --limit 200 --repeats 1 --versions 0.5.20
    .venv/bin/python benchmarks/bench_per_process.py --out benchmarks/runs/$(date -u +%Y-%m-%dT%H%MZ)-per-process.md \\
        --note "measured while other work ran"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_vs_sglang as bvs  # beside this file: the script's folder is first on sys.path

from mamba_radix.data import trace_path
from mamba_radix.testing.sglang import SGLangError, load_sglang

WORKER = Path(__file__).resolve().parent / "_per_process_worker.py"
EXIT_OK, EXIT_HITS_DIFFER, EXIT_USAGE, EXIT_WORKER_FAILED = 0, 1, 2, 3
WORKER_NO_SGLANG = 3  # the worker's exit status when SGLang cannot be loaded
MIB = 1024 * 1024


@dataclass
class System:
    """One system's rounds: ``kind`` ``ours`` or ``sglang``, ``version`` the SGLang release (ours: the
    preset replaying it), ``runs`` the workers' results in round order."""

    kind: str
    version: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"ours ({self.version} rules)" if self.kind == "ours" else f"SGLang {self.version}"

    def samples(self, op: str) -> tuple[list[int], list[int]]:
        """Every round's per-call ns of ``op`` and the ns inside pools of each call."""
        ns: list[int] = []
        pool: list[int] = []
        for run in self.runs:
            a, b = run["ops"][op]
            ns += a
            pool += b
        return ns, pool

    def stats(self, op: str) -> dict[str, float]:
        """Median and p99 µs of ``op``, the median µs inside pools and without them, calls per round."""
        ns, pool = self.samples(op)
        median, p99, n = bvs.median_p99_us(ns)
        return {
            "median_us": median,
            "p99_us": p99,
            "pool_median_us": bvs.median_p99_us(pool)[0],
            "median_without_pools_us": bvs.median_p99_us([a - b for a, b in zip(ns, pool, strict=True)])[0],
            "calls_per_round": n / max(1, len(self.runs)),
            "round_medians_us": [bvs.median_p99_us(run["ops"][op][0])[0] for run in self.runs],
        }

    def median_of(self, key: str) -> float:
        """The median over rounds of a per-run number (e.g. ``wall_ns``)."""
        return statistics.median(run[key] for run in self.runs) if self.runs else math.nan


# ------------------------------------------------------------------------------------------- workers
def run_worker(kind: str, version: str, args: argparse.Namespace, memory: bool) -> dict[str, Any]:
    """One fresh interpreter replaying the trace through one system; its JSON result. Raises
    :class:`WorkerFailed` with the worker's last stderr line when it exits non-zero or runs too long."""
    with tempfile.TemporaryDirectory(prefix="bench_per_process-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(WORKER),
            f"--system={kind}",
            f"--version={version}",
            f"--trace={args.trace}",
            f"--limit={args.limit}",
            f"--kv-tokens={args.kv_tokens}",
            f"--state-slots={args.state_slots}",
            f"--sg-pools={args.sg_pools}",
            f"--out={out}",
        ]
        if memory:
            cmd.append("--memory")
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.worker_timeout_s, check=False
            )
        except subprocess.TimeoutExpired as err:
            raise WorkerFailed(kind, version, f"ran past --worker-timeout-s {args.worker_timeout_s}") from err
        if proc.returncode != 0 or not out.is_file():
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise WorkerFailed(kind, version, why, proc.returncode)
        return json.loads(out.read_text())


class WorkerFailed(Exception):
    def __init__(self, kind: str, version: str, why: str, code: int | None = None) -> None:
        super().__init__(f"{kind} {version}: {why}")
        self.code = code


def loadable_versions(versions: list[str]) -> tuple[list[str], dict[str, str]]:
    """The releases whose wheel can be had and imported here (fetched once into the loader's cache, so the
    workers do not race for it), and why each other one is left out."""
    ok, skipped = [], {}
    for version in versions:
        try:
            load_sglang(version)
            ok.append(version)
        except SGLangError as err:
            skipped[version] = str(err)
    return ok, skipped


# ----------------------------------------------------------------------------------------------- checks
def hit_differences(systems: list[System]) -> list[str]:
    """One line per pair of runs whose per-request hits differ: every round of ours (V rules) against every
    round of SGLang V, and every round of a system against its first."""
    problems = []
    by_key = {(s.kind, s.version): s for s in systems}
    for s in systems:
        for r, run in enumerate(s.runs[1:], 2):
            if run["hits"] != s.runs[0]["hits"]:
                problems.append(f"{s.name}: round {r}'s hits differ from round 1's")
    for (kind, version), ours in by_key.items():
        sg = by_key.get(("sglang", version))
        if kind != "ours" or sg is None or not ours.runs or not sg.runs:
            continue
        a, b = ours.runs[0]["hits"], sg.runs[0]["hits"]
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        if diff:
            i = diff[0]
            problems.append(
                f"{ours.name} vs {sg.name}: {len(diff):,} of {len(a):,} requests differ; first request {i}: "
                f"{a[i]:,} vs {b[i]:,} tokens"
            )
    return problems


# ----------------------------------------------------------------------------------------------- report
def _us(x: float) -> str:
    return bvs._fmt(x)


def _mib(kib: float) -> str:
    return f"{kib / 1024:,.0f}"


def report(
    systems: list[System], args: argparse.Namespace, skipped: dict[str, str], problems: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """The markdown report and its numbers."""
    ours = {s.version: s for s in systems if s.kind == "ours"}
    sgl = {s.version: s for s in systems if s.kind == "sglang" and s.runs}
    first = systems[0].runs[0]
    lines = [
        "## Each cache in its own process: our cache vs SGLang's on the same requests",
        "",
        f"Command: `{shlex.join(['python', 'benchmarks/bench_per_process.py', *args.argv])}`",
        "",
        f"Started {args.started_utc}; {os.cpu_count()} CPUs, load average {args.load_start} at the start and "
        f"{args.load_end} at the end; Python {first['python']}, torch {first['torch']}, one torch thread per "
        f"process.{' Note: ' + args.note + '.' if args.note else ''}",
        "",
        f"First {first['requests']:,} Mooncake conversation requests ({first['input_tokens'] / 1e6:.1f}M input "
        f"tokens), sequential, extra_buffer, {args.kv_tokens:,} KV tokens / {args.state_slots:,} state slots. "
        f"{args.repeats} round(s), each system in a fresh process, in this order every round: "
        + ", ".join(s.name for s in systems)
        + ". SGLang's pools: "
        + (
            "counting pools without the liveness record (the lightest that keep SGLang's own checks)"
            if args.sg_pools == "light"
            else "counting pools with the liveness record of every issued id"
        )
        + ".",
        "",
    ]
    for version, why in skipped.items():
        lines += [f"- **SGLang {version} left out**: {why}", ""]
    if not sgl:
        lines += ["- **No SGLang release could be loaded: our numbers only, no ratios.**", ""]
    for version, sg in sgl.items():
        mine = ours.get(version)
        if mine is None or not mine.runs:
            continue
        same = sum(x == y for x, y in zip(mine.runs[0]["hits"], sg.runs[0]["hits"], strict=True))
        lines.append(
            f"Per-request hits, {mine.name} vs {sg.name}: {same:,} / {len(sg.runs[0]['hits']):,} identical"
            + (" in every round." if not problems else ".")
        )
    for line in problems:
        lines.append(f"- **HITS DIFFER**: {line}")
    if lines[-1]:
        lines.append("")

    # 1. per operation and system
    lines += [
        "### Per operation (all rounds pooled)",
        "",
        "| operation | system | calls per round | median µs | p99 µs | median in pools µs | "
        "median without pools µs | per-round medians µs |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    numbers: dict[str, Any] = {
        "ops": {},
        "replay": {},
        "memory": {},
        "skipped": skipped,
        "problems": problems,
    }
    for label, _ours_call, op in bvs.COMPARED:
        for s in systems:
            if not s.runs:
                continue
            st = s.stats(op)
            numbers["ops"].setdefault(op, {})[s.name] = st
            lines.append(
                f"| {label} | {s.name} | {st['calls_per_round']:,.0f} | {_us(st['median_us'])} | "
                f"{_us(st['p99_us'])} | {_us(st['pool_median_us'])} | {_us(st['median_without_pools_us'])} | "
                + ", ".join(_us(m) for m in st["round_medians_us"])
                + " |"
            )
    lines.append("")

    # 2. ratios
    if sgl:
        head = "| operation |"
        sep = "|---|"
        for version in sgl:
            head += f" SGLang {version} / ours, median | p99 |"
            sep += "---:|---:|"
        head += (
            " faster SGLang core | median ratio | p99 ratio | ratio without pools | "
            f"median >= {bvs.TARGET_OP_SPEEDUP:g}x | p99 >= {bvs.TARGET_OP_SPEEDUP:g}x |"
        )
        sep += "---|---:|---:|---:|---|---|"
        lines += [
            "### Ratios SGLang / ours (> 1: ours is faster; ours under the same release's rules)",
            "",
            head,
            sep,
        ]
        for label, _ours_call, op in bvs.COMPARED:
            row = f"| {label} |"
            best: tuple[float, str] | None = None
            for version, sg in sgl.items():
                mine = ours[version].stats(op)
                theirs = sg.stats(op)
                row += (
                    f" {bvs._fx(bvs.ratio(theirs['median_us'], mine['median_us']))} |"
                    f" {bvs._fx(bvs.ratio(theirs['p99_us'], mine['p99_us']))} |"
                )
                if not math.isnan(theirs["median_us"]) and (best is None or theirs["median_us"] < best[0]):
                    best = (theirs["median_us"], version)
            if best is None:
                row += " n/a | n/a | n/a | n/a | n/a | n/a |"
                lines.append(row)
                continue
            version = best[1]
            mine, theirs = ours[version].stats(op), sgl[version].stats(op)
            r_med = bvs.ratio(theirs["median_us"], mine["median_us"])
            r_p99 = bvs.ratio(theirs["p99_us"], mine["p99_us"])
            r_excl = bvs.ratio(theirs["median_without_pools_us"], mine["median_without_pools_us"])
            met_med = None if math.isnan(r_med) else r_med >= bvs.TARGET_OP_SPEEDUP
            met_p99 = None if math.isnan(r_p99) else r_p99 >= bvs.TARGET_OP_SPEEDUP
            row += (
                f" {version} | **{bvs._fx(r_med)}** | **{bvs._fx(r_p99)}** | {bvs._fx(r_excl)} | "
                f"{bvs._met(met_med)} | {bvs._met(met_p99)} |"
            )
            numbers["ops"][op]["vs_faster_core"] = {
                "core": version,
                "median_ratio": r_med,
                "p99_ratio": r_p99,
                "ratio_without_pools": r_excl,
            }
            lines.append(row)
        lines.append("")

    # 3. whole replay
    lines += [
        "### Whole replay (median over rounds)",
        "",
        "| system | wall s | per-round walls s | CPU s | in cache calls s | in pools s | rest s (driver / simulator) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for s in systems:
        if not s.runs:
            continue
        wall, cpu = s.median_of("wall_ns") / 1e9, s.median_of("cpu_ns") / 1e9
        cache, pool = s.median_of("cache_ns") / 1e9, s.median_of("pool_ns") / 1e9
        numbers["replay"][s.name] = {"wall_s": wall, "cpu_s": cpu, "cache_s": cache, "pool_s": pool}
        lines.append(
            f"| {s.name} | {wall:.2f} | "
            + ", ".join(f"{run['wall_ns'] / 1e9:.2f}" for run in s.runs)
            + f" | {cpu:.2f} | {cache:.2f} | {pool:.2f} | {wall - cache:.2f} |"
        )
    lines.append("")
    if sgl:
        version = min(sgl, key=lambda v: sgl[v].median_of("wall_ns"))
        mine, theirs = ours[version], sgl[version]
        r_wall = bvs.ratio(theirs.median_of("wall_ns"), mine.median_of("wall_ns"))
        r_cpu = bvs.ratio(theirs.median_of("cpu_ns"), mine.median_of("cpu_ns"))
        r_cache = bvs.ratio(theirs.median_of("cache_ns"), mine.median_of("cache_ns"))
        met = None if math.isnan(r_wall) else r_wall >= bvs.TARGET_WALL_SPEEDUP
        numbers["replay"]["vs_faster_core"] = {"core": version, "wall_ratio": r_wall, "cpu_ratio": r_cpu}
        lines += [
            f"- whole replay against the faster SGLang core ({version}), wall: **{bvs._fx(r_wall)}**, "
            f"CPU: {bvs._fx(r_cpu)} (target >= {bvs.TARGET_WALL_SPEEDUP:g}x: {bvs._met(met)}); time in cache "
            f"calls: {bvs._fx(r_cache)}",
            "- ours' wall is the simulator's whole run (it expands the trace blocks, computes ideal hits and "
            "metrics); SGLang's is its replay driver's (scheduler steps, decode token by token, a KV-match walk "
            "per request; requests expanded before each, untimed)",
            "",
        ]

    # 4. memory
    with_memory = [s for s in systems if s.runs and s.runs[0].get("memory")]
    lines += [
        "### Memory at the end of the replay (peak RSS: the largest over rounds; the rest from round 1)",
        "",
        "| system | peak RSS MiB | RSS before the cache MiB | growth MiB | nodes | cached tokens | "
        "tree + bookkeeping MiB | bytes per cached token | bytes per node | pools' host MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in systems:
        if not s.runs:
            continue
        peak = max(run["peak_rss_kib"] for run in s.runs)
        before = s.runs[0]["rss_before_cache_kib"]
        mem = s.runs[0].get("memory")
        row = f"| {s.name} | {_mib(peak)} | {_mib(before)} | {_mib(peak - before)} |"
        entry: dict[str, Any] = {"peak_rss_kib": peak, "rss_before_cache_kib": before}
        if mem:
            tokens, nodes = mem["cached_tokens"], mem["nodes"]
            per_token = mem["tree_bytes"] / tokens if tokens else math.nan
            per_node = mem["tree_bytes"] / nodes if nodes else math.nan
            row += (
                f" {nodes:,} | {tokens:,} | {mem['tree_bytes'] / MIB:,.1f} | {_us(per_token)} | "
                f"{per_node:,.0f} | {mem['pool_bytes'] / MIB:,.1f} |"
            )
            entry.update(mem, bytes_per_cached_token=per_token, bytes_per_node=per_node)
        else:
            row += " | | | | | |"
        numbers["memory"][s.name] = entry
        lines.append(row)
    lines.append("")
    if with_memory:
        lines += [
            "Bytes are host bytes of the Python objects reachable from the cache (keys, values, nodes, "
            "candidate sets, bookkeeping) not through its pools, and from the pools; tensors count their "
            "storage once. SGLang's pools here are our counting stand-ins, which hold no per-slot memory (its "
            "real allocators keep their free lists as device tensors sized to capacity); ours are the library's "
            "pools, host arrays included. Peak RSS is the worker's `ru_maxrss` read before the walk; "
            "'before the cache' is its RSS after imports and the compact trace were loaded.",
            "",
        ]
    return lines, numbers


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Our cache vs SGLang's real cache, each replaying the same trace alone in its own "
        "process: per-operation medians, p99s and ratios, whole-replay walls, peak RSS and bytes per cached "
        "token and node. Ratios only (nothing is asserted but identical hits).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--limit", type=int, default=2000, help="first N trace requests (0: the whole trace)")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the systems interleaved within each")
    p.add_argument("--versions", default=",".join(bvs.VERSIONS), help="SGLang releases to compare with")
    p.add_argument("--kv-tokens", type=int, default=bvs.KV_TOKENS, help="KV pool size, tokens")
    p.add_argument("--state-slots", type=int, default=bvs.STATE_SLOTS, help="state pool size, slots")
    p.add_argument("--trace", default=str(trace_path()), help="block-format (Mooncake) trace file")
    p.add_argument(
        "--sg-pools",
        choices=("light", "checked"),
        default="light",
        help="SGLang's counting pools: light (counts only) or checked (plus a liveness record of every id)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the walk for the caches' bytes")
    p.add_argument("--worker-timeout-s", type=float, default=1800.0, help="limit per worker process")
    p.add_argument("--note", default="", help="a remark for the report's header, e.g. the machine's state")
    p.add_argument("--out", metavar="FILE", help="also write the markdown report to FILE")
    p.add_argument("--json", metavar="FILE", help="write the numbers as JSON to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    args.versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    if args.limit < 0 or args.repeats < 1 or args.kv_tokens < 1 or args.state_slots < 1:
        p.error("--limit must be >= 0, and --repeats, --kv-tokens and --state-slots >= 1")
    if args.worker_timeout_s <= 0:
        p.error("--worker-timeout-s must be > 0")
    if not Path(args.trace).is_file():
        p.error(f"no trace file {args.trace}")
    return args


def _load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    args.started_utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.load_start = _load()
    versions, skipped = loadable_versions(args.versions)
    for version, why in skipped.items():
        print(f"warning: SGLang {version} left out: {why}", file=sys.stderr)
    if not versions:
        print("warning: no SGLang release could be loaded; measuring ours alone (no ratios)", file=sys.stderr)
    if versions:
        systems = [System(kind, v) for v in versions for kind in ("ours", "sglang")]
    else:  # ours alone, under the rules of the first release asked for that has a preset
        known = [v for v in args.versions if v in bvs.VERSIONS] or [bvs.VERSIONS[0]]
        systems = [System("ours", known[0])]
    total, n = len(systems) * args.repeats, 0
    started = time.perf_counter()
    for round_no in range(1, args.repeats + 1):
        for s in systems:
            n += 1
            try:
                run = run_worker(s.kind, s.version, args, memory=round_no == 1 and not args.no_memory)
            except WorkerFailed as err:
                print(f"error: worker {err}", file=sys.stderr)
                return EXIT_WORKER_FAILED
            s.runs.append(run)
            if not args.quiet:
                print(
                    f"[{n}/{total}] round {round_no}/{args.repeats} {s.name}: {run['requests']:,} requests, "
                    f"replay {run['wall_ns'] / 1e9:.1f} s, peak RSS {run['peak_rss_kib'] / 1024:,.0f} MiB, "
                    f"process {run['process_s']:.0f} s ({time.perf_counter() - started:.0f} s so far)",
                    file=sys.stderr,
                    flush=True,
                )
    args.load_end = _load()
    problems = hit_differences(systems)
    lines, numbers = report(systems, args, skipped, problems)
    lines.append(f"Benchmark wall: {time.perf_counter() - started:.0f} s.")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2, default=str) + "\n")
    for line in problems:
        print(f"error: hits differ: {line}", file=sys.stderr)
    return EXIT_HITS_DIFFER if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
