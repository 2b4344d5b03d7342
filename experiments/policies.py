"""The policy experiment: token hit rate against memory for every registered policy, the oracle and the
ideal, on the bundled workloads, in a regime where state slots bind and one where KV binds.

Run it (about 10 minutes on 2 cores)::

    python experiments/policies.py                      # writes experiments/results/policies-<UTC time>/
    python experiments/policies.py --out DIR --requests 400 --processes 2

Workloads: the first ``--requests`` requests of the Mooncake conversation trace (block format) and the
four synthetic generators (multi-turn chat, shared system prompts, agent loops, branching trees; seed 0,
the generators' default sizes). Every run is sequential replay (one request at a time: exact, order-only
comparisons) under extra_buffer with SGLang 0.5.23's rules except what a policy changes.

Memory: Kimi K3's per-rank bytes (27,648 B per KV token, 29,039,616 B per state slot), pools sized
exactly (:func:`mamba_radix.sim.budget.exact_pools`) so every policy at a point has the same bytes split
the same way. Two regimes per workload:

- **slots bind**: the KV pool holds every token of the trace (it never evicts), the state slots vary;
- **KV binds**: three slots per request of the trace (never short), the KV pool varies.

The x axis is the total bytes of the two pools (GiB, log scale). Lines: each policy; the **oracle** (bold);
**infinite**, the hit rate of the same config with pools that never evict (the cache's ceiling); and the
**ideal**, the longest previously seen prefix of every request (any cache's ceiling). Every panel shares
the y axis, from 0 to 1.

Outputs, in a new folder (never overwritten): ``results.jsonl`` (one row per run), ``report.md`` (every
policy as a fraction of the oracle per workload and regime, the points, the command), ``<workload>.png``,
``run_info.json``. Progress: one bar counted in requests across all runs (tqdm on a terminal, periodic
lines otherwise).

The CLI can call :func:`run_policy_experiment` directly.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import platform
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mamba_radix import CacheConfig
from mamba_radix.peers import apply_peer
from mamba_radix.policies.future import demand_hits
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.sim.budget import PoolSizes, exact_pools
from mamba_radix.sim.progress import Progress
from mamba_radix.sim.traces import TraceRequest

MODEL = "kimi-k3"
GIB = 1 << 30
DEFAULT_REQUESTS = 400
# state slots swept in the slots-bind regime (the 5 a running request holds come on top)
SLOT_POINTS: dict[str, tuple[int, ...]] = {
    "conversation": (16, 32, 64, 128),
    "chat": (8, 12, 16, 32),
    "system-prompt": (8, 12, 16, 32),
    "agent": (8, 12, 16, 32),
    "tree": (8, 12, 16, 32),
}
# KV pool sizes in the KV-bind regime, as fractions of all the tokens the trace holds
KV_FRACTIONS: tuple[float, ...] = (1 / 32, 1 / 16, 1 / 8, 1 / 4)
SYNTHETIC = {"chat": "chat", "system-prompt": "system-prompt", "agent": "agent", "tree": "tree"}


def base_config() -> CacheConfig:
    """The config every policy starts from: extra_buffer, SGLang 0.5.23's rules."""
    return apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), "sglang-0.5.23")


@functools.lru_cache(maxsize=8)
def load_workload(name: str, conversation_requests: int) -> tuple[TraceRequest, ...]:
    """The requests of workload ``name`` (memoised per process)."""
    if name == "conversation":
        from mamba_radix.data import trace_path
        from mamba_radix.sim.traces import iter_trace

        path = str(trace_path("mooncake_conversation_trace.jsonl"))
        return tuple(iter_trace(path, "block", 512, conversation_requests))
    from mamba_radix.sim.synthetic import GENERATORS

    return tuple(GENERATORS[SYNTHETIC[name]](seed=0))


def memory_points(name: str, requests: Sequence[TraceRequest]) -> dict[str, list[PoolSizes]]:
    """The pools of each regime's points (see the module docstring)."""
    config = base_config()
    total_tokens = sum(r.input_len + r.output_len for r in requests) + 1
    ample_slots = 3 * len(requests) + 2 * config.slots_per_request
    slots = [
        exact_pools(config, total_tokens, s + config.slots_per_request, MODEL) for s in SLOT_POINTS[name]
    ]
    kv = [exact_pools(config, max(1 << 12, int(total_tokens * f)), ample_slots, MODEL) for f in KV_FRACTIONS]
    return {"slots bind": slots, "KV binds": kv}


@dataclass(frozen=True)
class Task:
    """One run: a policy on a workload at one memory point."""

    run_id: str
    workload: str
    regime: str
    point: int
    policy: str
    pools: PoolSizes
    conversation_requests: int
    demands: tuple[int, ...] | None = None


_QUEUE: Any = None


def _init_worker(progress_queue: Any) -> None:
    import torch

    global _QUEUE
    _QUEUE = progress_queue
    torch.set_num_threads(1)


def _reporter(run_id: str) -> Callable[[int], None]:
    def report(finished: int) -> None:
        if _QUEUE is not None and finished % 20 == 0:
            _QUEUE.put((run_id, finished))

    return report


def _run_demands(args: tuple[str, int]) -> tuple[str, list[int], float]:
    name, n = args
    requests = load_workload(name, n)
    start = time.perf_counter()
    hits = demand_hits(base_config(), requests, MODEL)
    if _QUEUE is not None:
        _QUEUE.put((f"{name}/infinite", len(requests)))
    return name, hits, time.perf_counter() - start


def _run_task(task: Task) -> dict[str, Any]:
    requests = load_workload(task.workload, task.conversation_requests)
    config = base_config()
    demands = {config: list(task.demands)} if task.demands is not None else {}
    ctx = PolicyContext(requests, task.pools, MODEL, demands=demands)
    start, cpu = time.perf_counter(), time.process_time()
    result = run_policy(task.policy, config, ctx, on_finish=_reporter(task.run_id))
    pools = task.pools
    return {
        "run_id": task.run_id,
        "workload": task.workload,
        "regime": task.regime,
        "point": task.point,
        "policy": task.policy,
        "family": POLICIES[task.policy].family,
        "kv_tokens": pools.kv_tokens,
        "state_slots": pools.state_slots,
        "memory_gib": round(pools.budget_gib, 4),
        "requests": len(requests),
        "token_hit_rate": result["token_hit_rate"],
        "ideal_hit_rate": result["ideal_hit_rate"],
        "stats": result["stats"],
        "notes": result["notes"],
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
    }


def new_folder(out: str | Path | None) -> Path:
    """``out``, or ``experiments/results/policies-<UTC time>``; refuses an existing non-empty folder."""
    if out is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path(__file__).resolve().parent / "results" / f"policies-{stamp}"
    path = Path(out)
    if path.exists() and any(path.iterdir()):
        raise SystemExit(f"error: {path} exists and is not empty; pass a new --out folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_policy_experiment(
    out: str | Path | None = None,
    *,
    conversation_requests: int = DEFAULT_REQUESTS,
    workloads: Sequence[str] = tuple(SLOT_POINTS),
    policies: Sequence[str] = tuple(POLICIES),
    processes: int = 2,
    quiet: bool = False,
    command: str = "",
) -> Path:
    """Run the policy experiment into a new folder ``out`` (default ``experiments/results/policies-<UTC
    time>``) and return it. ``workloads`` from :data:`SLOT_POINTS`, ``policies`` from
    :data:`~mamba_radix.policies.registry.POLICIES`. Side effects: writes the folder; ``processes``
    worker processes. Raises ``SystemExit`` for an existing non-empty folder, ``ConfigError`` for an
    unknown policy."""
    unknown = [p for p in policies if p not in POLICIES] + [w for w in workloads if w not in SLOT_POINTS]
    if unknown:
        raise SystemExit(f"error: unknown policy or workload {unknown}; policies: {', '.join(POLICIES)}")
    folder = new_folder(out)
    started = time.time()
    sizes = {w: len(load_workload(w, conversation_requests)) for w in workloads}
    points = {w: memory_points(w, load_workload(w, conversation_requests)) for w in workloads}
    plan: list[tuple[str, str, int, PoolSizes]] = [
        (w, regime, i, pools)
        for w in workloads
        for regime, ps in points[w].items()
        for i, pools in enumerate(ps)
    ]
    total_runs = len(workloads) + len(plan) * len(policies)
    total_requests = sum(sizes.values()) + sum(sizes[w] for w, *_ in plan) * len(policies)
    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    progress_queue = ctx.Queue()
    rows: list[dict[str, Any]] = []
    infinite: dict[str, float] = {}
    with (
        Progress(total_requests, total_runs, "policies", quiet=quiet) as progress,
        ctx.Pool(processes, initializer=_init_worker, initargs=(progress_queue,)) as pool,
    ):

        def drain() -> None:
            while True:
                try:
                    run_id, finished = progress_queue.get_nowait()
                except queue.Empty:
                    return
                progress.update(run_id, finished)

        def wait(results: list[Any]) -> list[Any]:
            while not all(r.ready() for r in results):
                drain()
                time.sleep(0.2)
            drain()
            return [r.get() for r in results]

        demand_jobs = [pool.apply_async(_run_demands, ((w, conversation_requests),)) for w in workloads]
        demands: dict[str, list[int]] = {}
        for name, hits, _ in wait(demand_jobs):
            demands[name] = hits
            reqs = load_workload(name, conversation_requests)
            infinite[name] = sum(hits) / max(1, sum(r.input_len for r in reqs))
            progress.run_done(f"{name}/infinite", sizes[name])
        tasks = [
            Task(
                f"{w}/{regime}/{i}/{p}",
                w,
                regime,
                i,
                p,
                pools,
                conversation_requests,
                tuple(demands[w]) if p == "oracle" else None,
            )
            for w, regime, i, pools in plan
            for p in policies
        ]
        jobs = [pool.apply_async(_run_task, (t,)) for t in tasks]
        pending = list(zip(tasks, jobs, strict=True))
        with open(folder / "results.jsonl", "w") as fh:
            while pending:
                drain()
                still = []
                for task, job in pending:
                    if job.ready():
                        row = job.get()
                        row["infinite_hit_rate"] = infinite[task.workload]
                        rows.append(row)
                        fh.write(json.dumps(row) + "\n")
                        fh.flush()
                        progress.run_done(task.run_id, sizes[task.workload])
                    else:
                        still.append((task, job))
                pending = still
                time.sleep(0.2)
    info = {
        "command": command or "python experiments/policies.py",
        "conversation_requests": conversation_requests,
        "workloads": {w: sizes[w] for w in workloads},
        "policies": list(policies),
        "processes": processes,
        "wall_s": round(time.time() - started, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL,
        "infinite_hit_rate": infinite,
    }
    (folder / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    write_report(folder, rows, info)
    plot(folder, rows)
    return folder


# ------------------------------------------------------------------------------------------ report
def fractions(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], list[float]]:
    """Per (workload, regime, policy): hit rate / oracle hit rate at each point (points where the oracle
    hits nothing are skipped)."""
    oracle = {
        (r["workload"], r["regime"], r["point"]): r["token_hit_rate"] for r in rows if r["policy"] == "oracle"
    }
    out: dict[tuple[str, str, str], list[float]] = {}
    for r in sorted(rows, key=lambda r: r["point"]):
        ref = oracle.get((r["workload"], r["regime"], r["point"]))
        if ref:
            out.setdefault((r["workload"], r["regime"], r["policy"]), []).append(r["token_hit_rate"] / ref)
    return out


def write_report(folder: Path, rows: Sequence[dict[str, Any]], info: dict[str, Any]) -> None:
    """``report.md``: fractions of the oracle (mean over points, and the lowest), hit rates per point."""
    policies = [p for p in info["policies"] if any(r["policy"] == p for r in rows)]
    fr = fractions(rows)
    lines = [
        "# Policies against the offline oracle",
        "",
        f"Command: `{info['command']}` ({info['wall_s']} s wall, {info['processes']} processes). "
        f"Sequential replay, extra_buffer, SGLang 0.5.23 rules, Kimi K3 bytes; {info['workloads']} requests.",
        "",
        "Each cell: the policy's token hit rate as a fraction of the oracle's, mean over the regime's memory "
        "points (lowest point in brackets). The oracle is optimal only in the setting its docstring names "
        "(mamba_radix/policies/oracle.py); elsewhere a policy can exceed 1.00.",
        "",
        "| workload | regime | " + " | ".join(policies) + " |",
        "|---|---|" + "---|" * len(policies),
    ]
    for w in info["workloads"]:
        for regime in ("slots bind", "KV binds"):
            cells = []
            for p in policies:
                xs = fr.get((w, regime, p))
                cells.append(f"{sum(xs) / len(xs):.2f} ({min(xs):.2f})" if xs else "-")
            lines.append(f"| {w} | {regime} | " + " | ".join(cells) + " |")
    lines += ["", "## Hit rates per point", ""]
    for w in info["workloads"]:
        for regime in ("slots bind", "KV binds"):
            sub = [r for r in rows if r["workload"] == w and r["regime"] == regime]
            if not sub:
                continue
            lines += [
                f"### {w}, {regime} (infinite {info['infinite_hit_rate'][w]:.4f}, ideal "
                f"{sub[0]['ideal_hit_rate']:.4f})",
                "",
                "| KV tokens | slots | GiB | " + " | ".join(policies) + " |",
                "|---|---|---|" + "---|" * len(policies),
            ]
            for i in sorted({r["point"] for r in sub}):
                at = {r["policy"]: r for r in sub if r["point"] == i}
                first = next(iter(at.values()))
                cells = [f"{at[p]['token_hit_rate']:.4f}" if p in at else "-" for p in policies]
                lines.append(
                    f"| {first['kv_tokens']:,} | {first['state_slots']:,} | {first['memory_gib']:.2f} | "
                    + " | ".join(cells)
                    + " |"
                )
            lines.append("")
    notes = sorted(
        {
            (r["workload"], r["regime"], r["point"], r["notes"].get("marconi_alpha"))
            for r in rows
            if r["notes"]
        }
    )
    if notes:
        lines += ["## Marconi's alpha (grid search on the first 20% of each workload)", ""]
        lines += [f"- {w}, {g}, point {i}: alpha = {a}" for w, g, i, a in notes]
    (folder / "report.md").write_text("\n".join(lines) + "\n")


STYLE: dict[str, dict[str, Any]] = {
    "sglang-0.5.20": {"color": "tab:blue", "marker": "v", "linestyle": "--"},
    "sglang-0.5.23": {"color": "tab:blue", "marker": "o"},
    "sglang-cap3": {"color": "tab:cyan", "marker": "s"},
    "thinning": {"color": "tab:green", "marker": "^"},
    "vllm-sparse": {"color": "tab:purple", "marker": "D", "linestyle": ":"},
    "marconi": {"color": "tab:orange", "marker": "P"},
    "sift": {"color": "tab:red", "marker": "*", "linewidth": 2.5, "markersize": 10},
    "oracle": {"color": "black", "marker": "o", "linewidth": 3},
}


def _varied_gib(row: dict[str, Any], regime: str) -> float:
    """The bytes of the pool a regime varies: the state slots (slots bind) or the KV pool (KV binds)."""
    per_slot = 29_039_616 if row.get("bytes_per_state_slot") is None else row["bytes_per_state_slot"]
    per_token = 27_648 if row.get("bytes_per_kv_token") is None else row["bytes_per_kv_token"]
    if regime == "slots bind":
        return row["state_slots"] * per_slot / GIB
    return row["kv_tokens"] * per_token / GIB


def plot(folder: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One PNG per workload: two panels (slots bind, KV binds); x: the GiB of the pool the regime varies
    (log scale; the other pool is fixed, see the panel title), y: token hit rate from 0 to 1, shared.
    Policies that coincide are drawn with distinct markers and dash patterns so that none hides another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for w in sorted({r["workload"] for r in rows}):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
        for ax, regime in zip(axes, ("slots bind", "KV binds"), strict=True):
            sub = [r for r in rows if r["workload"] == w and r["regime"] == regime]
            if not sub:
                continue
            for p in POLICIES:
                pts = sorted((_varied_gib(r, regime), r["token_hit_rate"]) for r in sub if r["policy"] == p)
                if pts:
                    ax.plot(*zip(*pts, strict=True), label=p, **STYLE.get(p, {"marker": "o"}))
            xs = sorted({_varied_gib(r, regime) for r in sub})
            ax.axhline(
                sub[0]["infinite_hit_rate"], linestyle="--", color="gray", label="infinite (same config)"
            )
            ax.axhline(
                sub[0]["ideal_hit_rate"], linestyle=":", color="gray", label="ideal (longest seen prefix)"
            )
            ax.set_xscale("log")
            ax.set_xlim(xs[0] / 1.3, xs[-1] * 1.3)
            ax.set_ylim(0, 1)
            if regime == "slots bind":
                ax.set_xlabel("state-slot memory (GiB, Kimi K3: 29 MB per slot; log scale)")
                ax.set_title(
                    f"slots bind: KV pool fixed at every token of the trace ({sub[0]['kv_tokens']:,})",
                    fontsize=9,
                )
            else:
                ax.set_xlabel("KV memory (GiB, Kimi K3: 27 KB per token; log scale)")
                ax.set_title(
                    f"KV binds: state slots fixed at {sub[0]['state_slots']:,} (3 per request)", fontsize=9
                )
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("token hit rate (full scale 0-1)")
        axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.suptitle(f"{w}: token hit rate against memory, every policy, the oracle and the ideal")
        fig.tight_layout()
        fig.savefig(folder / f"{w}.png", dpi=110)
        plt.close(fig)


def replot(folder: str | Path) -> None:
    """Redraw the PNGs and the report of an existing results folder (from results.jsonl only)."""
    path = Path(folder)
    rows = [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines() if line]
    info = json.loads((path / "run_info.json").read_text())
    write_report(path, rows, info)
    plot(path, rows)


TARGET_POLICIES = ("sglang-0.5.20", "sglang-0.5.23", "sift", "oracle")


def run_conversation_target(
    out: str | Path | None = None,
    *,
    requests: int = 2000,
    kv_tokens: int = 8_000_000,
    slots: Sequence[int] = (1024, 256),
    policies: Sequence[str] = TARGET_POLICIES,
    quiet: bool = False,
) -> Path:
    """The issue's target check: the first ``requests`` conversation requests, sequential, extra_buffer,
    ``kv_tokens`` KV tokens and each slot count, under each policy; writes ``target.jsonl`` and
    ``target.md`` (hit rates and the gap to the oracle each policy closes against sglang-0.5.23) into a new
    folder. One process; about 2-4 minutes per run on one core."""
    folder = new_folder(out)
    reqs = load_workload("conversation", requests)
    config = base_config()
    demands: dict[CacheConfig, list[int]] = {}
    rows: list[dict[str, Any]] = []
    total = len(reqs) * (len(slots) * len(policies) + 1)
    with Progress(total, len(slots) * len(policies) + 1, "target", quiet=quiet) as progress:
        demands[config] = demand_hits(config, reqs, MODEL)
        progress.run_done("infinite", len(reqs))
        for s in slots:
            for p in policies:
                run_id = f"{s}/{p}"
                ctx = PolicyContext(reqs, exact_pools(config, kv_tokens, s, MODEL), MODEL, demands=demands)
                cpu = time.process_time()
                result = run_policy(p, config, ctx, on_finish=lambda n, r=run_id: progress.update(r, n))
                progress.run_done(run_id, len(reqs))
                rows.append(
                    {
                        "slots": s,
                        "kv_tokens": kv_tokens,
                        "policy": p,
                        "token_hit_rate": result["token_hit_rate"],
                        "cpu_s": round(time.process_time() - cpu, 1),
                        "checkpoints_declined": result["stats"]["checkpoints_declined"],
                    }
                )
    with open(folder / "target.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    lines = [
        f"# First {requests} conversation requests, {kv_tokens:,} KV tokens, sequential, extra_buffer",
        "",
        "| slots | " + " | ".join(policies) + " | gap closed vs sglang-0.5.23 |",
        "|---|" + "---|" * (len(policies) + 1),
    ]
    for s in slots:
        at = {r["policy"]: r["token_hit_rate"] for r in rows if r["slots"] == s}
        base, best = at.get("sglang-0.5.23"), at.get("oracle")
        closed = ""
        if base is not None and best is not None and best > base and "sift" in at:
            closed = f"sift {100 * (at['sift'] - base) / (best - base):.0f}%"
        lines.append(f"| {s} | " + " | ".join(f"{at[p]:.4f}" for p in policies) + f" | {closed} |")
    (folder / "target.md").write_text("\n".join(lines) + "\n")
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", help="a new folder for the results (default experiments/results/policies-<UTC>)"
    )
    parser.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, help="conversation requests (default 400)"
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated names")
    parser.add_argument("--workloads", default=",".join(SLOT_POINTS), help="comma-separated names")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--replot", metavar="DIR", help="only redraw the report and plots of a results folder"
    )
    args = parser.parse_args(argv)
    if args.replot:
        replot(args.replot)
        return 0
    command = "python experiments/policies.py " + " ".join(sys.argv[1:] if argv is None else argv)
    folder = run_policy_experiment(
        args.out,
        conversation_requests=args.requests,
        workloads=args.workloads.split(","),
        policies=args.policies.split(","),
        processes=args.processes,
        quiet=args.quiet,
        command=command.strip(),
    )
    print(folder / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
