"""Where the oracle's lead comes from: knowing which entries die, knowing when they are used, and which pool binds.

Two tables, each policy run here (nothing is read from the reference):

1. **The issue's target points** (first 2,000 Mooncake conversation requests, 8M KV tokens, 1024 and 256
   slots, sequential, extra_buffer): SGLang 0.5.23, Sift, the death-only oracle (``oracle-death``: it
   knows which checkpoints and KV leaves are never used again, not when the others are; LRU among them)
   and the oracle; then Sift with one pool made ample: KV holding every token (only slots bind) and
   three slots per request (only KV binds). Which pool caps an online policy, and how much of the oracle's
   lead is predicting death.
2. **The main job's KV-binds points** (its bundled definition, every workload): the same four policies
   per point, and the share of the SGLang -> oracle gap the death-only oracle closes.

Usage::

    python experiments/headroom.py                # about 5 minutes on one core
    python experiments/headroom.py --limit 500    # a smoke run (the conversation trace cut to 500)
    python experiments/headroom.py --out headroom.md

Prints the markdown (and writes it with ``--out``); one progress line on stderr, counted in requests.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mamba_radix.data import definition_path, trace_path
from mamba_radix.experiment import Workload, base_config, load_policy_definition, load_requests, memory_points
from mamba_radix.policies.future import demand_hits
from mamba_radix.policies.registry import PolicyContext, run_policy
from mamba_radix.sim.budget import PoolSizes, exact_pools
from mamba_radix.sim.progress import Progress
from mamba_radix.sim.split import SplitOptions

MODEL = "kimi-k3"
POLICIES = ("sglang-0.5.23", "sift", "oracle-death", "oracle")
TARGET_KV_TOKENS = 8_000_000
TARGET_SLOTS = (1024, 256)


def gap_share(value: float, base: float, best: float) -> str:
    """``value``'s share of the ``base`` -> ``best`` gap, or ``-`` where there is no gap to close."""
    return f"{(value - base) / (best - base):.2f}" if best - base > 1e-9 else "-"


def table_head(title: str, columns: Sequence[str]) -> list[str]:
    """A report table's first lines: its ``###`` heading, a blank line, the header row and the separator
    (one ``---`` per column, so the two always agree)."""
    return [f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


class Runner:
    """Runs policies on one workload's requests, sharing the infinite-capacity pre-pass between runs."""

    def __init__(self, requests: Sequence[Any], progress: Progress) -> None:
        self.requests = requests
        self.progress = progress
        self.demands = {base_config(): demand_hits(base_config(), requests, MODEL)}
        self.runs = 0

    def run(self, policy: str, pools: PoolSizes, split: SplitOptions | None = None) -> dict[str, Any]:
        """:func:`run_policy`'s summary of ``policy`` on ``pools`` (``split``: the adaptive split)."""
        run_id = f"{policy}/{self.runs}"
        self.runs += 1
        ctx = PolicyContext(self.requests, pools, MODEL, demands=self.demands)
        on_finish = lambda n: self.progress.update(run_id, n)  # noqa: E731
        result = run_policy(policy, base_config(), ctx, on_finish=on_finish, split=split)
        self.progress.run_done(run_id, len(self.requests))
        return result

    def hit_rate(self, policy: str, pools: PoolSizes) -> float:
        return float(self.run(policy, pools)["token_hit_rate"])


def target_table(runner: Runner) -> list[str]:
    requests = runner.requests
    config = base_config()
    every_token = sum(r.input_len + r.output_len for r in requests) + 1
    ample_slots = 3 * len(requests) + 2 * config.slots_per_request
    lines = table_head(
        f"Target points: first {len(requests):,} conversation requests, {TARGET_KV_TOKENS:,} KV tokens",
        ["slots", *POLICIES, "death's share of the gap", "sift, only slots bind", "sift, only KV binds"],
    )
    for slots in TARGET_SLOTS:
        pools = exact_pools(config, TARGET_KV_TOKENS, slots, MODEL)
        got = {p: runner.hit_rate(p, pools) for p in POLICIES}
        slots_only = runner.hit_rate("sift", exact_pools(config, every_token, slots, MODEL))
        kv_only = runner.hit_rate("sift", exact_pools(config, TARGET_KV_TOKENS, ample_slots, MODEL))
        share = gap_share(got["oracle-death"], got["sglang-0.5.23"], got["oracle"])
        cells = " | ".join(f"{got[p]:.4f}" for p in POLICIES)
        lines.append(f"| {slots} | {cells} | {share} | {slots_only:.4f} | {kv_only:.4f} |")
    return lines


def kv_binds_table(workloads: Sequence[Workload], runners: dict[str, Runner]) -> list[str]:
    lines = table_head(
        "The main job's KV-binds points (slots ample)",
        ["workload", "KV tokens", *POLICIES, "death's share", "sift's share"],
    )
    for w in workloads:
        runner = runners[w.name]
        for pools in memory_points(w, runner.requests, MODEL)["KV binds"]:
            got = {p: runner.hit_rate(p, pools) for p in POLICIES}
            base, best = got["sglang-0.5.23"], got["oracle"]
            cells = " | ".join(f"{got[p]:.4f}" for p in POLICIES)
            lines.append(
                f"| {w.name} | {pools.kv_tokens:,} | {cells} | {gap_share(got['oracle-death'], base, best)} "
                f"| {gap_share(got['sift'], base, best)} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="cut the conversation trace to N requests")
    parser.add_argument("--out", help="also write the markdown to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    experiment = load_policy_definition(definition_path("default"))
    workloads = experiment.with_limit(args.limit).workloads
    conversation = Workload("conversation", (), (), trace=str(trace_path()), limit=args.limit or 2000)
    requests = {w.name: load_requests(w) for w in workloads}
    target_requests = load_requests(conversation)
    per_point = len(POLICIES)
    runs = [(len(target_requests), len(TARGET_SLOTS) * (per_point + 2))]
    runs += [(len(requests[w.name]), per_point * len(w.kv_fractions)) for w in workloads]
    total_requests = sum(n * k for n, k in runs)
    with Progress(total_requests, sum(k for _, k in runs), "headroom", quiet=args.quiet) as progress:
        target = Runner(target_requests, progress)
        runners = {w.name: Runner(requests[w.name], progress) for w in workloads}
        lines = ["## Headroom: what the oracle knows that an online policy does not", ""]
        lines += [*target_table(target), "", *kv_binds_table(workloads, runners)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
