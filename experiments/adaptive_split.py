"""Equal bytes, moving line: the adaptive KV/state split against fixed splits of the same budget.

A budget is the bytes of a (KV tokens, state slots) point of Kimi K3 (27,648 B per KV token, 29,039,616 B
per state slot: one slot costs 1,050 KV tokens). Every policy is run on the fixed split (as the main job
does) and with :mod:`mamba_radix.sim.split` moving the line from there (``SplitOptions()`` defaults: a
decision every 16 finished requests, a step of 1/8 of the state pool, toward the pool whose
checkpoint-holding victims are younger by more than 25%). Each run is simulated here; nothing is read from
a reference.

1. **Conversation** (first 2,000 Mooncake conversation requests, sequential, extra_buffer): three budgets
   (8M KV tokens + 256 slots, 8M + 1,024, 2M + 1,024). For each, SGLang 0.5.23 and Sift on fixed splits
   swept over the slot count (the rest of the budget is KV), the adaptive split started from the named
   split, and the oracle on the named split and with the adaptive split. "Best fixed" is the sweep's best, a
   choice made in hindsight.
2. **Synthetic workloads** (the main job's four, its first three KV points times its first three slot
   points as budgets): fixed against adaptive, per policy; how often the adaptive split loses.

Usage::

    python experiments/adaptive_split.py               # about 5 minutes on one core
    python experiments/adaptive_split.py --limit 500   # a smoke run
    python experiments/adaptive_split.py --out split.md --plot split.png

Prints the markdown (and writes it with ``--out``); ``--plot`` writes the conversation sweep as a PNG (needs
the ``experiments`` extra, matplotlib). One progress line on stderr, counted in requests.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from headroom import MODEL, Runner, gap_share, table_head

from mamba_radix.data import definition_path, trace_path
from mamba_radix.experiment import Workload, base_config, load_policy_definition, load_requests, memory_points
from mamba_radix.sim.budget import PoolSizes, exact_pools
from mamba_radix.sim.progress import Progress
from mamba_radix.sim.split import SplitOptions

POLICIES = ("sglang-0.5.23", "sift")
CONVERSATION_BUDGETS = ((8_000_000, 256), (8_000_000, 1024), (2_000_000, 1024))  # (KV tokens, slots)
SWEEP_SLOTS = (64, 128, 256, 512, 1024, 2048, 4096)
GRID = 3  # synthetic budgets: the first GRID KV points x the first GRID slot points of the main job


@dataclass(frozen=True)
class Budget:
    """The bytes of a named (KV tokens, slots) split, and the fixed splits of the same bytes."""

    kv_tokens: int
    slots: int
    pools: PoolSizes

    @property
    def bytes(self) -> int:
        return self.kv_tokens * self.pools.bytes_per_kv_token + self.slots * self.pools.bytes_per_state_slot

    def label(self) -> str:
        return f"{self.kv_tokens / 1e6:g}M KV + {self.slots:,} slots"

    def fixed(self, slots: int, min_kv_tokens: int) -> PoolSizes | None:
        """The split of these bytes with ``slots`` slots, ``None`` if it leaves too little KV."""
        kv = (self.bytes - slots * self.pools.bytes_per_state_slot) // self.pools.bytes_per_kv_token
        return exact_pools(base_config(), kv, slots, MODEL) if kv >= min_kv_tokens else None


def budget(kv_tokens: int, slots: int) -> Budget:
    return Budget(kv_tokens, slots, exact_pools(base_config(), kv_tokens, slots, MODEL))


def mean_slots(result: dict[str, Any], start: int) -> float:
    """The adaptive run's slot count averaged over its decisions (its start before the first)."""
    steps = result.get("split") or []
    return sum(s.state_slots for s in steps) / len(steps) if steps else float(start)


def conversation_table(runner: Runner, longest: int) -> tuple[list[str], list[dict[str, Any]]]:
    lines = table_head(
        f"Conversation, first {len(runner.requests):,} requests: fixed splits against the adaptive split",
        [
            "budget",
            "policy",
            "fixed (named split)",
            "best fixed (slots)",
            "adaptive",
            "adaptive's mean / last slots",
            "oracle (named split)",
            "oracle, adaptive",
            "adaptive's share of the fixed -> oracle gap",
        ],
    )
    curves: list[dict[str, Any]] = []
    for kv, slots in CONVERSATION_BUDGETS:
        b = budget(kv, slots)
        oracle = runner.hit_rate("oracle", b.pools)
        oracle_adaptive = float(runner.run("oracle", b.pools, SplitOptions())["token_hit_rate"])
        for policy in POLICIES:
            sweep = {}
            for s in sorted({*SWEEP_SLOTS, slots}):
                pools = b.fixed(s, longest + 1)
                if pools is not None:
                    sweep[s] = runner.hit_rate(policy, pools)
            adaptive = runner.run(policy, b.pools, SplitOptions())
            rate, steps = float(adaptive["token_hit_rate"]), adaptive.get("split") or []
            best = max(sweep, key=lambda s: (sweep[s], s == slots))  # a tie goes to the named split
            last = steps[-1].state_slots if steps else slots
            curves.append(
                {
                    "budget": b.label(),
                    "slots": slots,
                    "policy": policy,
                    "sweep": sweep,
                    "adaptive": rate,
                    "adaptive_slots": mean_slots(adaptive, slots),
                }
            )
            lines.append(
                f"| {b.label()} | {policy} | {sweep[slots]:.4f} | {sweep[best]:.4f} ({best:,}) | {rate:.4f} "
                f"| {mean_slots(adaptive, slots):,.0f} / {last:,} | {oracle:.4f} | {oracle_adaptive:.4f} "
                f"| {gap_share(rate, sweep[slots], oracle)} |"
            )
    return lines, curves


def synthetic_table(workloads: Sequence[Workload], runners: dict[str, Runner]) -> list[str]:
    lines = table_head(
        "Synthetic workloads: budgets of the main job's points (KV point + slot point), fixed against adaptive",
        ["workload", "policy", "budgets", "adaptive higher", "equal", "lower", "mean change", "worst change"],
    )
    for w in workloads:
        runner = runners[w.name]
        points = memory_points(w, runner.requests, MODEL)
        kvs = [p.kv_tokens for p in points["KV binds"]][:GRID]
        slots = [p.state_slots for p in points["slots bind"]][:GRID]
        for policy in POLICIES:
            changes = []
            for kv in kvs:
                for s in slots:
                    b = budget(kv, s)
                    fixed = runner.hit_rate(policy, b.pools)
                    adaptive = float(runner.run(policy, b.pools, SplitOptions())["token_hit_rate"])
                    changes.append(adaptive - fixed)
            higher = sum(c > 1e-9 for c in changes)
            lower = sum(c < -1e-9 for c in changes)
            lines.append(
                f"| {w.name} | {policy} | {len(changes)} | {higher} | {len(changes) - higher - lower} | {lower} "
                f"| {sum(changes) / len(changes):+.4f} | {min(changes):+.4f} |"
            )
    return lines


def plot(curves: list[dict[str, Any]], path: str) -> None:
    """One panel per budget, shared y from 0: hit rate of each policy on fixed splits against the slot
    count (log x), and the adaptive run as a marker at its mean slot count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = list(dict.fromkeys(c["budget"] for c in curves))
    fig, axes = plt.subplots(1, len(budgets), figsize=(5 * len(budgets), 4.6), sharey=True, squeeze=False)
    top = max(max(max(c["sweep"].values()), c["adaptive"]) for c in curves)
    for ax, label in zip(axes[0], budgets, strict=True):
        for c, color in zip(
            [c for c in curves if c["budget"] == label], ("tab:blue", "tab:red"), strict=False
        ):
            xs = sorted(c["sweep"])
            ax.plot(xs, [c["sweep"][x] for x in xs], "o-", color=color, label=f"{c['policy']}, fixed split")
            ax.plot(
                [c["adaptive_slots"]],
                [c["adaptive"]],
                "*",
                color=color,
                markersize=14,
                label=f"{c['policy']}, adaptive (at its mean slots)",
            )
        named = next(c["slots"] for c in curves if c["budget"] == label)
        ax.axvline(named, ls=":", color="gray", label="the named split (where the adaptive one starts)")
        ax.set_xscale("log")
        ax.set_title(f"budget: {label}")
        ax.set_xlabel("state slots of the split (rest of the budget is KV; log scale)")
        ax.set_ylim(0, top * 1.1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("token hit rate")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Conversation trace, equal bytes: fixed KV/state splits and the adaptive split")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="cut every workload to N requests")
    parser.add_argument("--out", help="also write the markdown to this file")
    parser.add_argument("--plot", help="write the conversation sweep as a PNG to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    workloads = load_policy_definition(definition_path("default")).with_limit(args.limit).workloads
    workloads = [w for w in workloads if w.trace is None]  # the synthetic ones; the trace is part 1
    conversation = Workload("conversation", (), (), trace=str(trace_path()), limit=args.limit or 2000)
    requests = {w.name: load_requests(w) for w in workloads}
    conv_requests = load_requests(conversation)
    conv_runs = len(CONVERSATION_BUDGETS) * (2 + len(POLICIES) * (len(SWEEP_SLOTS) + 2))
    runs = [(len(conv_requests), conv_runs)]
    runs += [(len(requests[w.name]), 2 * len(POLICIES) * GRID * GRID) for w in workloads]
    with Progress(
        sum(n * k for n, k in runs), sum(k for _, k in runs), "split", quiet=args.quiet
    ) as progress:
        longest = max(r.input_len + r.output_len for r in conv_requests)
        conv, curves = conversation_table(Runner(conv_requests, progress), longest)
        synthetic = synthetic_table(
            workloads, {w.name: Runner(requests[w.name], progress) for w in workloads}
        )
    lines = ["## Equal bytes: the adaptive KV/state split", "", *conv, "", *synthetic]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.plot:
        plot(curves, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
