"""Check the capacity planner's recommendation against the simulator on the same workload.

The planner (``mamba_radix.capacity.plan``) reads only the workload's lengths and recommends a
``--mamba-full-memory-ratio`` that fills the KV and state pools together. This script then replays the
workload through the simulator (the real cache and pools, timed mode) at the default ratio and at the
recommended ones, in the same per-rank budget, and prints predicted against measured:

- checkpoints per request: the planner's count given the hit lengths the run measured, against the
  checkpoints the cache was asked to store (inserted + already there + skipped + lazy boundaries skipped);
- peak running requests and the pool that bound admission (planner: ``min(max_running_requests, KV
  pool / mean peak KV)``; simulator: the resource that refused the next admission at the peak);
- token hit rate (measured only: the planner does not predict hits).

Arrivals are compressed (``--arrival-time-scale``) so that the queue fills and admission limits bind.
Example: ``python experiments/plan_vs_sim.py --limit 300`` (about a minute on one core).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from itertools import islice
from typing import Any

from mamba_radix.capacity import (
    RequestShape,
    SizingInputs,
    Workload,
    expected_workload_checkpoints,
    plan,
)
from mamba_radix.config import CacheConfig
from mamba_radix.defaults import deployment_for
from mamba_radix.sim import budget as sim_budget
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import TraceRequest, iter_trace

DEFAULT_TRACE = "experiments/traces/mooncake_conversation_trace.jsonl"
SIM_REASON = {"mamba state cache": "state_slots", "full KV tokens": "kv_tokens"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="trace file (block or token format)")
    ap.add_argument("--limit", type=int, default=300, help="replay the first N requests (default 300)")
    ap.add_argument(
        "--synthetic", choices=sorted(GENERATORS), help="use a seeded synthetic workload instead of --trace"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload")
    ap.add_argument("--model", default="kimi-k3", help="model preset or JSON file (default kimi-k3)")
    ap.add_argument("--memory-budget-gb", type=float, default=sim_budget.KIMI_K3_PER_RANK_BUDGET_GIB)
    ap.add_argument("--default-ratio", type=float, default=0.9, help="SGLang's default ratio (0.9)")
    ap.add_argument("--mamba-radix-cache-strategy", default="extra_buffer")
    ap.add_argument("--chunked-prefill-size", type=int, default=8192)
    ap.add_argument("--mamba-track-interval", type=int, default=256)
    ap.add_argument("--mamba-max-states-per-path", type=int, default=-1)
    ap.add_argument(
        "--arrival-time-scale",
        type=float,
        default=0.02,
        help="multiply arrival times (below 1: a burstier load, so admission limits bind)",
    )
    ap.add_argument(
        "--no-sequential", action="store_true", help="skip the sequential run (exact checkpoint check)"
    )
    return ap.parse_args(argv)


def load_requests(args: argparse.Namespace) -> list[TraceRequest]:
    if args.synthetic:
        return list(islice(GENERATORS[args.synthetic](seed=args.seed), args.limit))
    return list(iter_trace(args.trace, limit=args.limit))


def sizing_inputs(args: argparse.Namespace, config: CacheConfig, ratio: float) -> SizingInputs:
    """The deployment the simulator's budget module sizes (the model's defaults: Kimi K3 at TP8, bf16
    KV and states), for the planner: :func:`mamba_radix.sim.budget.sizing_inputs`, the one home."""
    return sim_budget.sizing_inputs(config, args.model, args.memory_budget_gb, ratio)


@dataclass
class Row:
    label: str
    ratio: float
    slots: int
    kv_tokens: int
    pred_running: int
    pred_bound: str
    peak_running: int
    bound: str | None
    pred_ckpt: float
    ckpt: float
    cold_ckpt: float
    hit_rate: float
    ttft_p50: float | None
    wall_s: float


def run_at(
    args: argparse.Namespace,
    config: CacheConfig,
    workload: Workload,
    reqs: list[TraceRequest],
    label: str,
    ratio: float,
    mode: str = "timed",
) -> Row:
    """Plan and simulate one ratio in the same budget."""
    p = plan(sizing_inputs(args, config, ratio), workload)
    r = p.resolution
    assert p.workload_kv_limit is not None and p.workload_binding is not None
    pools = sim_budget.pools_for_budget(config, args.memory_budget_gb, ratio, model=args.model)
    options = EngineOptions(
        mode=mode,  # type: ignore[arg-type]
        arrival_time_scale=args.arrival_time_scale,
        keep_per_request=True,
    )
    start = time.perf_counter()
    engine = Engine(config, pools, max(q.input_len + q.output_len for q in reqs), options)
    metrics = engine.run(reqs, total=len(reqs))
    wall = time.perf_counter() - start
    summary = metrics.summary()
    stats = engine.cache.stats
    taken = (
        stats.checkpoints_inserted
        + stats.checkpoints_existing
        + stats.checkpoints_skipped
        + engine.lazy_boundary_skips
    )
    # the planner's count for the requests the simulator admitted, with the hits it measured
    admitted = {row["index"]: row["hit"] for row in metrics.per_request}
    shapes = [RequestShape(q.input_len, q.output_len) for q in reqs if q.index in admitted]
    predicted = expected_workload_checkpoints(
        config, shapes, [admitted[q.index] for q in reqs if q.index in admitted]
    )
    return Row(
        label=label,
        ratio=ratio,
        slots=pools.state_slots,
        kv_tokens=pools.kv_tokens,
        pred_running=min(r.max_running_requests, p.workload_kv_limit),
        pred_bound=SIM_REASON.get(p.workload_binding, p.workload_binding),
        peak_running=metrics.peak_running,
        bound=metrics.peak_running_bound_by,
        pred_ckpt=predicted.mean_taken,
        ckpt=taken / max(1, metrics.requests),
        cold_ckpt=expected_workload_checkpoints(config, shapes).mean_taken,
        hit_rate=summary["token_hit_rate"],
        ttft_p50=summary["ttft_p50_s"],
        wall_s=wall,
    )


def print_table(rows: list[Row]) -> None:
    head = (
        "run",
        "ratio",
        "slots",
        "KV tokens",
        "running pred/sim",
        "bound pred/sim",
        "ckpt/req pred/sim (cold)",
        "hit rate",
        "TTFT p50 s",
    )
    lines = [head]
    for r in rows:
        lines.append(
            (
                r.label,
                f"{r.ratio:.3f}",
                f"{r.slots:,}",
                f"{r.kv_tokens:,}",
                f"{r.pred_running} / {r.peak_running}",
                f"{r.pred_bound} / {r.bound}",
                f"{r.pred_ckpt:.2f} / {r.ckpt:.2f} ({r.cold_ckpt:.2f})",
                f"{r.hit_rate:.3f}",
                "-" if r.ttft_p50 is None else f"{r.ttft_p50:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for n, line in enumerate(lines):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = CacheConfig(
        mamba_radix_cache_strategy=args.mamba_radix_cache_strategy,
        chunked_prefill_size=args.chunked_prefill_size,
        mamba_track_interval=args.mamba_track_interval,
        mamba_max_states_per_path=args.mamba_max_states_per_path,
    )
    reqs = load_requests(args)
    workload = Workload(
        tuple(RequestShape(q.input_len, q.output_len) for q in reqs), args.synthetic or args.trace
    )
    base = plan(sizing_inputs(args, config, args.default_ratio), workload)
    assert base.balance is not None
    bal = base.balance
    print(
        f"workload: {len(reqs)} requests from {workload.source}, mean input {workload.mean_input_len:,.0f}, "
        f"mean output {workload.mean_output_len:,.0f}; {args.model} TP{deployment_for(args.model).tp_size}, "
        f"{args.memory_budget_gb} GiB per rank, {config.strategy}, chunked prefill {config.chunked_prefill_size}"
    )
    print(
        f"planner: balanced at {bal.concurrency} running requests -> ratio {bal.ratio_admission:.3f} "
        f"(admission reservation), {bal.ratio_with_checkpoints:.3f} (plus kept checkpoints)"
    )
    runs: list[tuple[str, float]] = [
        ("default", args.default_ratio),
        ("recommended", bal.ratio_admission),
        ("recommended+ckpt", bal.ratio_with_checkpoints),
    ]
    rows: list[Any] = []
    for label, ratio in runs:
        rows.append(run_at(args, config, workload, reqs, label, ratio))
        print(f"  simulated {label} (ratio {ratio:.3f}) in {rows[-1].wall_s:.1f} s", file=sys.stderr)
    if not args.no_sequential:
        # one request at a time: every request's chunks start at its own cached prefix, as the planner
        # assumes, so the checkpoint counts must agree exactly (running requests: 1, nothing binds)
        rows.append(run_at(args, config, workload, reqs, "sequential", bal.ratio_admission, "sequential"))
        print(f"  simulated sequential in {rows[-1].wall_s:.1f} s", file=sys.stderr)
    print_table(rows)
    default = rows[0]
    for row in rows[1:3]:
        verdict = "more" if row.peak_running > default.peak_running else "NOT more"
        print(
            f"{row.label}: ran {row.peak_running} requests at once against {default.peak_running} at the "
            f"default ratio ({verdict})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
