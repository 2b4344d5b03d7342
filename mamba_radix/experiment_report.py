"""The policy experiment's report and plots (:mod:`mamba_radix.experiment` writes the rows).

:func:`write_all` writes ``report.md`` (every policy as a fraction of the oracle per workload and regime,
the gap each closes against SGLang 0.5.23, the hit rates at every point, any point where an online
policy beats the oracle, the comparison with the reference run) and, with the ``[experiments]`` extra,
the plots: ``<workload>.png`` (two panels: slots bind, KV binds) and ``overview.png`` (every workload).

Plots do not mislead: the x axis is the GiB of the pool the panel varies, on a log scale (the label says
so), ticks at the measured points; the other pool is fixed and its size is in the panel's title; both
panels of a figure share the y axis, from 0 to 1 (or from 0 to 0.5 when every line, the ideal
included, stays below 0.45, and then the label says so); every panel of ``overview.png`` is 0 to 1.

Also the memory-options comparison's section of a sweep report (a definition's ``"kind": "memory"``
plot, :func:`memory_section`, called by :func:`mamba_radix.sim.report.write_report`): token hit rate against
memory with the offline oracle's line (a group that runs ``"policy": "oracle"``), every option as a fraction
of the oracle on the same start-up pools, and the checkpoint formats' fidelity beside them, read from the
JSON lines that ``benchmarks/fidelity_quant.py --json`` writes (:func:`load_fidelity`).

Side effects: writes files into the folder. Cost: O(rows x policies) for the report; matplotlib only
inside the plotting functions (the core never imports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mamba_radix.sim.reference import match_reference, select_runs

__all__ = [
    "BASELINE",
    "fidelity_table",
    "fractions",
    "gap_closed",
    "load_fidelity",
    "loss_lines",
    "memory_plot",
    "memory_plot_problems",
    "memory_section",
    "oracle_exceeded",
    "oracle_fractions",
    "reference_comparison",
    "write_all",
]

REGIMES = ("slots bind", "KV binds")
BASELINE = "sglang-0.5.23"
GIB = 1 << 30
# a policy "beats the oracle" only past float noise
EXCEED_TOLERANCE = 1e-9
# gap-closed cells skip points where the oracle is this close to the baseline (nothing to close)
MIN_GAP = 1e-3

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
_EXTRA_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:gray")


def _key(r: dict[str, Any]) -> tuple[str, str, int]:
    return (r["workload"], r["regime"], r["point"])


def _policies(rows: Sequence[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    listed = [p for p in info.get("policies", []) if any(r["policy"] == p for r in rows)]
    return listed + sorted({r["policy"] for r in rows} - set(listed))


def _workloads(rows: Sequence[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    listed = [w for w in info.get("workloads", {}) if any(r["workload"] == w for r in rows)]
    return listed + sorted({r["workload"] for r in rows} - set(listed))


def fractions(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], list[float]]:
    """Per (workload, regime, policy): its hit rate / the oracle's at each point, in point order (points
    where the oracle hits nothing are skipped)."""
    oracle = {_key(r): r["token_hit_rate"] for r in rows if r["policy"] == "oracle"}
    out: dict[tuple[str, str, str], list[float]] = {}
    for r in sorted(rows, key=lambda r: r["point"]):
        ref = oracle.get(_key(r))
        if ref:
            out.setdefault((r["workload"], r["regime"], r["policy"]), []).append(r["token_hit_rate"] / ref)
    return out


def gap_closed(
    rows: Sequence[dict[str, Any]], baseline: str = BASELINE
) -> dict[tuple[str, str, str], tuple[list[float], int]]:
    """Per (workload, regime, policy): ((hit - baseline) / (oracle - baseline) at each point where the
    oracle leads the baseline by at least :data:`MIN_GAP`), and the number of points (all of them) where
    the policy is below the baseline."""
    at = {(*_key(r), r["policy"]): r["token_hit_rate"] for r in rows}
    out: dict[tuple[str, str, str], tuple[list[float], int]] = {}
    for r in sorted(rows, key=lambda r: r["point"]):
        base, best = at.get((*_key(r), baseline)), at.get((*_key(r), "oracle"))
        if base is None or best is None:
            continue
        closed, below = out.get((r["workload"], r["regime"], r["policy"]), ([], 0))
        if best - base >= MIN_GAP:
            closed.append((r["token_hit_rate"] - base) / (best - base))
        below += r["token_hit_rate"] < base - EXCEED_TOLERANCE
        out[(r["workload"], r["regime"], r["policy"])] = (closed, below)
    return out


def oracle_exceeded(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of online policies whose hit rate exceeds the oracle's at the same point (by more than
    :data:`EXCEED_TOLERANCE`), each with ``oracle`` (its hit rate) added."""
    oracle = {_key(r): r["token_hit_rate"] for r in rows if r["policy"] == "oracle"}
    return [
        dict(r, oracle=oracle[_key(r)])
        for r in rows
        if r["policy"] != "oracle"
        and _key(r) in oracle
        and r["token_hit_rate"] > oracle[_key(r)] + EXCEED_TOLERANCE
    ]


def reference_comparison(
    rows: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]] | None, name: str | None
) -> list[str]:
    """The report's lines comparing ``rows`` with the reference rows: how many runs have the same hit
    rate (to the last digit) at the same pools, and every run that differs. A run on another number of
    requests is said to be not comparable."""
    if name is None:
        return ["The definition names no reference results."]
    if reference is None:
        return [f"Reference {name}: no comparison."]
    sizes = {(r["workload"]): r["requests"] for r in rows}
    ref_sizes = {(r["workload"]): r["requests"] for r in reference}
    other = [w for w in sizes if w in ref_sizes and ref_sizes[w] != sizes[w]]
    lines: list[str] = []
    if other:
        lines.append(
            "Not comparable on "
            + ", ".join(f"{w} ({sizes[w]:,} requests here, {ref_sizes[w]:,} in the reference)" for w in other)
            + "."
        )
    matches = match_reference(
        (r for r in rows if r["workload"] not in other),
        reference,
        key=lambda r: (*_key(r), r["policy"]),
        identical=lambda r, b: b["token_hit_rate"] == r["token_hit_rate"],
        counterpart=lambda r, b: (b["kv_tokens"], b["state_slots"]) == (r["kv_tokens"], r["state_slots"]),
    )
    same = sum(m.identical for m in matches)
    missing = sum(m.reference is None for m in matches)
    differ: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for m in matches:
        if m.reference is not None and not m.identical:
            differ.append((m.run, m.reference))
    compared = same + len(differ)
    if compared:
        lines.append(
            f"{same} of {compared} runs identical to the reference ({name}: the same hit rate, to the last digit)."
        )
    if missing:
        lines.append(f"{missing} runs have no counterpart in the reference (another point, pool or policy).")
    if differ:
        lines += [
            "",
            "| workload | regime | point | policy | hit rate | reference | difference |",
            "|---|---|---|---|---|---|---|",
        ]
        differ.sort(key=lambda rb: -abs(rb[0]["token_hit_rate"] - rb[1]["token_hit_rate"]))
        for r, b in differ:
            d = r["token_hit_rate"] - b["token_hit_rate"]
            lines.append(
                f"| {r['workload']} | {r['regime']} | {r['point']} | {r['policy']} | {r['token_hit_rate']:.4f} | "
                f"{b['token_hit_rate']:.4f} | {d:+.4f} |"
            )
    return lines


def _points(x: float) -> str:
    """Two decimals, float noise around zero shown as 0.00 (not -0.00)."""
    return f"{round(x, 2) + 0.0:.2f}"


def _point_size(r: dict[str, Any]) -> str:
    """The pool a regime varies, at the row's point: ``256 slots`` or ``1.92M KV``."""
    if r["regime"] == "slots bind":
        return f"{r['state_slots']:,} slots"
    return f"{_short_count(r['kv_tokens'])} KV"


LOSS_CAUSES = ("declined", "evicted", "kv_order", "not_handed_over", "other")


def loss_lines(rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> list[str]:
    """The report's section on where each policy's loss against the oracle is (rows that carry ``loss``,
    from a definition with ``loss_breakdown``): per workload, regime, point and policy, the hit-rate
    points lost against the oracle and their split. Each split is the policy's loss against the infinite
    cache minus the oracle's, by cause and by the kind of the checkpoint that would have served the hit
    (kinds: the three largest), as points of the workload's input tokens; ``rest`` is what the split
    does not reach (hits above the infinite cache's). O(rows)."""
    probed = [r for r in rows if "loss" in r]
    oracle = {_key(r): r for r in probed if r["policy"] == "oracle"}
    if not probed or not oracle:
        return []
    lines = [
        "",
        "## Where the remaining loss is",
        "",
        "Each run was probed (mamba_radix/policies/loss_probe.py: bookkeeping in the policy hooks, no decision "
        "changed). For every request whose hit is below the infinite cache's, the missing tokens go to the fate "
        "of the checkpoint that served the infinite cache's hit: **declined** at admission; **evicted** from the "
        "state pool before it was needed (evicted-then-needed); **KV order** (the checkpoint was kept for it, "
        "but its KV leaf was evicted and took the state with it); **not handed over** (the run never made a "
        "checkpoint there: its branch points fell elsewhere); **other** (live, but the hit stopped short). Each "
        "cell is the policy's loss minus the oracle's, in points of token hit rate (100 x tokens / input "
        "tokens), so the causes and `rest` add up to the first column; a negative cell is a cause the oracle "
        "loses more to. **dead admitted**: the share of the policy's admitted checkpoints never hit before "
        "eviction or the end (a count: which useful checkpoint a dead one pushed out is not observable).",
        "",
        "| workload | regime | memory | policy | lost vs oracle | declined | evicted | KV order | not handed "
        "over | other | rest | by kind (largest) | dead admitted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(probed, key=lambda r: (r["workload"], REGIMES.index(r["regime"]), r["point"])):
        best = oracle.get(_key(r))
        if best is None or r["policy"] == "oracle" or r["policy"] not in policies:
            continue
        scale = 100.0 / max(1, r["input_tokens"])
        lost = 100.0 * (best["token_hit_rate"] - r["token_hit_rate"])
        mine, theirs = r["loss"], best["loss"]
        causes = [scale * (mine["by_cause"].get(c, 0) - theirs["by_cause"].get(c, 0)) for c in LOSS_CAUSES]
        kinds = {
            k: mine["by_kind"].get(k, 0) - theirs["by_kind"].get(k, 0)
            for k in {*mine["by_kind"], *theirs["by_kind"]}
        }
        top = sorted(kinds.items(), key=lambda kv: -abs(kv[1]))[:3]
        dead = mine["admitted_dead"] / max(1, mine["admitted"])
        lines.append(
            f"| {r['workload']} | {r['regime']} | {_point_size(r)} | {r['policy']} | {_points(lost)} | "
            + " | ".join(_points(c) for c in causes)
            + f" | {_points(lost - sum(causes))} | "
            + ", ".join(f"{k} {_points(scale * v)}" for k, v in top)
            + f" | {dead:.2f} of {mine['admitted']:,} |"
        )
    return lines


def _short_count(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k" if n >= 1e4 else f"{n:,}"


def _fixed_short(sub: Sequence[dict[str, Any]], regime: str) -> str:
    """The panel title: what varies and the fixed pool, in two short lines."""
    r = sub[0]
    if regime == "slots bind":
        return (
            f"slots bind: state slots vary\nKV fixed: {_short_count(r['kv_tokens'])} tokens, "
            f"{r['kv_gib']:.3g} GiB (every token: never evicts)"
        )
    per = r["state_slots"] // max(1, r["requests"])
    return (
        f"KV binds: KV pool varies\nstate slots fixed: {r['state_slots']:,}, {r['state_gib']:.3g} GiB "
        f"({per}+ per request: never short)"
    )


def _fixed_text(sub: Sequence[dict[str, Any]], regime: str, info: dict[str, Any]) -> str:
    r = sub[0]
    if regime == "slots bind":
        return f"KV fixed at {r['kv_tokens']:,} tokens ({r['kv_gib']:.1f} GiB: every token of the workload, never evicts)"
    requests = r["requests"]
    return f"state slots fixed at {r['state_slots']:,} ({r['state_gib']:.1f} GiB: {r['state_slots'] // max(1, requests)}+ per request, never short)"


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def write_report(
    folder: Path,
    rows: Sequence[dict[str, Any]],
    info: dict[str, Any],
    reference: tuple[Sequence[dict[str, Any]] | None, str | None] = (None, None),
    plots: Sequence[str] = (),
) -> Path:
    """Write ``folder/report.md`` (see the module docstring) and return its path."""
    policies = _policies(rows, info)
    workloads = _workloads(rows, info)
    fr, gaps = fractions(rows), gap_closed(rows)
    per_kv = rows[0]["bytes_per_kv_token"] if rows else 0
    per_slot = rows[0]["bytes_per_state_slot"] if rows else 0
    procs = info.get("processes", 1)
    lines = [
        f"# {info.get('title', 'Policies against the offline oracle')}",
        "",
        f"Command: `{info.get('command', '')}`: {info.get('wall_s', '?')} s wall on {procs} "
        f"process{'es' if procs != 1 else ''} ({info.get('runs', len(rows))} runs, {info.get('cpu_s', '?')} "
        f"CPU-s in the policy runs), mamba-radix {info.get('version', '?')}, {info.get('utc', '')}.",
        "",
        *(
            [
                "Re-run since: "
                + "; ".join(
                    f"{', '.join(x['policies'])} (`{x['command']}`, {x['wall_s']} s wall, {x['utc']})"
                    for x in info["reruns"]
                )
                + ". The other policies' rows are from the full run above.",
                "",
            ]
            if info.get("reruns")
            else []
        ),
        "Every run replays its workload sequentially (one request at a time, in order) through the real cache "
        f"and pools, extra_buffer with SGLang 0.5.23's rules except what the policy changes. Equal memory is "
        f"equal bytes: at each point every policy gets the same pools, sized exactly in {info.get('model', '?')} "
        f"per-rank bytes ({per_kv:,} B per KV token, {per_slot:,} B per state slot). Two regimes per workload: "
        "**slots bind** (the KV pool holds every token of the workload, the state slots vary) and **KV binds** "
        "(slots for every request, the KV pool varies). **infinite**: the same config with pools that never "
        "evict (the cache's ceiling); **ideal**: the longest previously seen prefix of every request (any "
        "cache's ceiling).",
        "",
        "Workloads: "
        + "; ".join(
            f"{w} ({v['source']}, {v['requests']:,} requests)"
            if isinstance(v, dict)
            else f"{w} ({v} requests)"
            for w, v in info.get("workloads", {}).items()
        )
        + ".",
        "",
        "## Each policy as a fraction of the oracle",
        "",
        "Each cell: the policy's token hit rate divided by the oracle's, mean over the regime's memory points "
        "(lowest point in brackets). The oracle (mamba_radix/policies/oracle.py) is optimal for sequential "
        "replay when KV does not bind (the slots-bind regime); where KV binds it is a strong reference only "
        "and an online policy can exceed 1.00.",
        "",
        "| workload | regime | points | " + " | ".join(policies) + " |",
        "|---|---|---|" + "---|" * len(policies),
    ]
    for w in workloads:
        for regime in REGIMES:
            points = {r["point"] for r in rows if r["workload"] == w and r["regime"] == regime}
            if not points:
                continue
            cells = []
            for p in policies:
                xs = fr.get((w, regime, p))
                cells.append(f"{_mean(xs):.2f} ({min(xs):.2f})" if xs else "-")
            lines.append(f"| {w} | {regime} | {len(points)} | " + " | ".join(cells) + " |")
    others = [p for p in policies if p not in (BASELINE, "oracle")]
    if BASELINE in policies and "oracle" in policies and others:
        lines += [
            "",
            f"## Gap to the oracle closed, against {BASELINE}",
            "",
            f"Each cell: (policy - {BASELINE}) / (oracle - {BASELINE}), mean over the points where the oracle leads "
            f"{BASELINE} by at least {MIN_GAP} (lowest in brackets; `-`: no such point); `below at N`: at N points "
            f"(of all) the policy's hit rate is below {BASELINE}'s.",
            "",
            "| workload | regime | " + " | ".join(others) + " |",
            "|---|---|" + "---|" * len(others),
        ]
        for w in workloads:
            for regime in REGIMES:
                if not any(r["workload"] == w and r["regime"] == regime for r in rows):
                    continue
                cells = []
                for p in others:
                    closed, below = gaps.get((w, regime, p), ([], 0))
                    cell = f"{_mean(closed):.2f} ({min(closed):.2f})" if closed else "-"
                    cells.append(cell + (f"; below at {below}" if below else ""))
                lines.append(f"| {w} | {regime} | " + " | ".join(cells) + " |")
    lines += ["", "## Hit rates at every point", ""]
    for w in workloads:
        for regime in REGIMES:
            sub = sorted(
                (r for r in rows if r["workload"] == w and r["regime"] == regime), key=lambda r: r["point"]
            )
            if not sub:
                continue
            varied = "state slots" if regime == "slots bind" else "KV tokens"
            lines += [
                f"### {w}, {regime}: {_fixed_text(sub, regime, info)}",
                "",
                f"infinite {sub[0]['infinite_hit_rate']:.4f}, ideal {sub[0]['ideal_hit_rate']:.4f}; "
                f"{sub[0]['requests']:,} requests.",
                "",
                f"| {varied} | {'state' if regime == 'slots bind' else 'KV'} GiB | total GiB | "
                + " | ".join(policies)
                + " |",
                "|---|---|---|" + "---|" * len(policies),
            ]
            for i in sorted({r["point"] for r in sub}):
                at = {r["policy"]: r for r in sub if r["point"] == i}
                first = next(iter(at.values()))
                count = first["state_slots"] if regime == "slots bind" else first["kv_tokens"]
                gib = first["state_gib"] if regime == "slots bind" else first["kv_gib"]
                cells = [f"{at[p]['token_hit_rate']:.4f}" if p in at else "-" for p in policies]
                lines.append(
                    f"| {count:,} | {gib:.2f} | {first['memory_gib']:.1f} | " + " | ".join(cells) + " |"
                )
            lines.append("")
    lines += loss_lines(rows, policies)
    if lines[-1] != "":
        lines.append("")
    exceeded = oracle_exceeded(rows)
    lines += ["## Where an online policy beats the oracle", ""]
    if not exceeded:
        lines.append(
            "Nowhere: at no point of any workload does an online policy exceed the oracle's hit rate."
        )
    else:
        lines.append(
            "The oracle is optimal for sequential replay where KV does not bind; these points say either that it "
            "is not optimal there or that a policy is wrong (slots bind: investigate), or (KV binds) that the "
            "oracle is only a strong reference where two pools are coupled."
        )
        lines += [
            "",
            "| workload | regime | point | policy | hit rate | oracle |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['workload']} | {r['regime']} | {r['point']} | {r['policy']} | {r['token_hit_rate']:.4f} | {r['oracle']:.4f} |"
            for r in exceeded
        ]
    alphas = sorted(
        {
            (r["workload"], r["regime"], r["point"], r["notes"].get("marconi_alpha"))
            for r in rows
            if r.get("notes", {}).get("marconi_alpha") is not None
        },
        key=lambda t: (workloads.index(t[0]) if t[0] in workloads else 99, REGIMES.index(t[1]), t[2]),
    )
    if alphas:
        lines += ["", "## Marconi's alpha (grid search on the first 20% of each workload)", ""]
        by: dict[tuple[str, str], list[str]] = {}
        for w, g, _i, a in alphas:
            by.setdefault((w, g), []).append(f"{a:g}")
        lines += [f"- {w}, {g}: {', '.join(v)} (by point)" for (w, g), v in by.items()]
    lines += ["", "## Compared with the reference", "", *reference_comparison(rows, *reference)]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- plots
def _varied(r: dict[str, Any], regime: str) -> float:
    return r["state_gib"] if regime == "slots bind" else r["kv_gib"]


def _count_label(r: dict[str, Any], regime: str) -> str:
    if regime == "slots bind":
        return f"{r['state_slots']:,} slots"
    tokens = r["kv_tokens"]
    return f"{tokens / 1e6:.3g}M tok" if tokens >= 1e6 else f"{tokens / 1e3:.3g}k tok"


def _style(p: str, i: int) -> dict[str, Any]:
    return STYLE.get(p, {"color": _EXTRA_COLORS[i % len(_EXTRA_COLORS)], "marker": "x"})


def _panel(
    ax: Any,
    sub: Sequence[dict[str, Any]],
    regime: str,
    policies: Sequence[str],
    info: dict[str, Any],
    small: bool,
) -> None:
    for i, p in enumerate(policies):
        pts = sorted((_varied(r, regime), r["token_hit_rate"]) for r in sub if r["policy"] == p)
        if pts:
            # the oracle's thick line underneath, so that policies that reach it stay visible on top
            ax.plot(*zip(*pts, strict=True), label=p, zorder=2 if p == "oracle" else 3 + i, **_style(p, i))
    ax.axhline(
        sub[0]["infinite_hit_rate"],
        linestyle="--",
        color="gray",
        label=f"infinite ({BASELINE} config, pools never evict)",
    )
    ax.axhline(
        sub[0]["ideal_hit_rate"],
        linestyle=":",
        color="gray",
        linewidth=2,
        label="ideal (longest seen prefix)",
    )
    ax.set_xscale("log")
    xs = sorted({_varied(r, regime): r for r in sub}.items())
    ax.set_xlim(xs[0][0] / 1.4, xs[-1][0] * 1.4)
    ax.minorticks_off()
    ax.set_xticks([x for x, _ in xs])
    ax.set_xticklabels([f"{x:.3g}\n{_count_label(r, regime)}" for x, r in xs], fontsize=7 if small else 8)
    what = "state-slot memory" if regime == "slots bind" else "KV memory"
    ax.set_xlabel(f"{what}, GiB (log scale)", fontsize=8 if small else 9)
    ax.set_title(_fixed_short(sub, regime), fontsize=7.5 if small else 9)
    ax.grid(alpha=0.3)


def plot_workload(folder: Path, rows: Sequence[dict[str, Any]], info: dict[str, Any], workload: str) -> str:
    """``<workload>.png``: the two regimes side by side, y shared (0 to 1, or 0 to 0.5 when every line
    is below 0.45: said on the axis). Returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = _policies(rows, info)
    sub_w = [r for r in rows if r["workload"] == workload]
    top = max(
        [r["token_hit_rate"] for r in sub_w]
        + [r["ideal_hit_rate"] for r in sub_w]
        + [r["infinite_hit_rate"] for r in sub_w]
    )
    y_top = 0.5 if top < 0.45 else 1.0
    fig, axes = plt.subplots(1, 2, figsize=(13, 6), sharey=True)
    for ax, regime in zip(axes, REGIMES, strict=True):
        sub = sorted((r for r in sub_w if r["regime"] == regime), key=lambda r: r["point"])
        if sub:
            _panel(ax, sub, regime, policies, info, small=False)
        else:
            ax.set_title(f"{regime}: no runs", fontsize=9)
    axes[0].set_ylim(0, y_top)
    axes[0].set_ylabel("token hit rate" + ("" if y_top == 1.0 else " (axis 0 to 0.5, both panels)"))
    handles, labels = axes[0].get_legend_handles_labels() if sub_w else ([], [])
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=5)
    n = sub_w[0]["requests"] if sub_w else 0
    fig.suptitle(
        f"{workload} ({n:,} requests, sequential, extra_buffer, {info.get('model', '')} bytes): "
        "token hit rate against memory, every policy, the oracle, infinite and ideal",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    name = f"{workload}.png"
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name


def plot_overview(folder: Path, rows: Sequence[dict[str, Any]], info: dict[str, Any]) -> str:
    """``overview.png``: one row per workload, the two regimes as columns, every panel's y from 0 to 1.
    Returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = _policies(rows, info)
    workloads = _workloads(rows, info)
    fig, axes = plt.subplots(
        len(workloads), 2, figsize=(13, 3.4 * len(workloads)), sharey=True, squeeze=False
    )
    for row_axes, w in zip(axes, workloads, strict=True):
        for ax, regime in zip(row_axes, REGIMES, strict=True):
            sub = sorted(
                (r for r in rows if r["workload"] == w and r["regime"] == regime), key=lambda r: r["point"]
            )
            if sub:
                _panel(ax, sub, regime, policies, info, small=True)
                ax.set_title(f"{w}, {ax.get_title()}", fontsize=7.5)
        row_axes[0].set_ylabel(f"{w}\ntoken hit rate (0-1)", fontsize=9)
    axes[0][0].set_ylim(0, 1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="upper center", ncol=min(6, max(1, len(labels))))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / len(workloads) / 3.4 * 1.0 - 0.02))
    name = "overview.png"
    fig.savefig(folder / name, dpi=90)
    plt.close(fig)
    return name


def write_all(
    folder: str | Path,
    rows: Sequence[dict[str, Any]],
    info: dict[str, Any],
    reference: tuple[Sequence[dict[str, Any]] | None, str | None] = (None, None),
) -> Path:
    """The plots (when matplotlib is installed) and ``report.md``, which links them. Returns the report's
    path."""
    path = Path(folder)
    plots: list[str] = []
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the core without the [experiments] extra: the report alone
        pass
    else:
        if rows:
            plots = [plot_workload(path, rows, info, w) for w in _workloads(rows, info)]
            plots.append(plot_overview(path, rows, info))
    return write_report(path, rows, info, reference, plots)


# ------------------------------------------------------------------- memory options (a sweep's records)
# A sweep definition's plot of ``"kind": "memory"`` (mamba_radix/data/experiments/memory_options.json):
# token hit rate against memory for the memory options, the offline oracle's line, and the checkpoint
# formats' fidelity beside them. Keys: ``file``, ``title``, ``groups`` (the options' groups), ``oracle_group``
# (a group that runs a research policy, drawn as the oracle), ``where`` (parameter -> value or list, as a
# line plot's), ``x`` (default ``budget_gib``), ``xlabel``, ``series`` (default group and checkpoint format)
# and ``fidelity`` (optional: the JSON lines of ``benchmarks/fidelity_quant.py --json``).
MEMORY_PLOT_KEYS = {
    "kind",
    "file",
    "title",
    "groups",
    "oracle_group",
    "where",
    "x",
    "xlabel",
    "series",
    "fidelity",
}
# the fields every fidelity row has (benchmarks/fidelity_quant.py's json_rows) and their types
FIDELITY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "format": str,
    "error_feedback": bool,
    "restores": int,
    "max_abs_dlogit_restore": (int, float),
    "mean_abs_dlogit_restore": (int, float),
    "max_abs_dlogit_after": (int, float),
    "mean_abs_logit": (int, float),
    "tokens": int,
    "tokens_agree": int,
    "requests": int,
    "exact_outputs": int,
    "command": str,
}
MEMORY_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# the parameter whose equal value makes an oracle run the same pools as an option's run (with the budget)
SAME_POOLS = "mamba_full_memory_ratio"


def load_fidelity(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a fidelity file (JSON lines, one per model, format and error feedback, as
    ``benchmarks/fidelity_quant.py --json FILE`` writes them), checked. Raises :class:`ConfigError` with
    one line naming the file and the first problem. Reads the file; O(rows)."""
    import json

    from mamba_radix.errors import ConfigError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"fidelity file {p} not found; make it with python benchmarks/fidelity_quant.py --json {p}"
        )
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"fidelity file {p} line {n}: invalid JSON ({exc.msg})") from None
        bad = [
            k
            for k, t in FIDELITY_FIELDS.items()
            if not isinstance(row, dict)
            or not isinstance(row.get(k), t)
            or isinstance(row.get(k), bool) != (t is bool)
        ]
        if bad:
            raise ConfigError(
                f"fidelity file {p} line {n}: missing or mistyped {', '.join(bad)}; re-make it with "
                "benchmarks/fidelity_quant.py --json"
            )
        rows.append(row)
    if not rows:
        raise ConfigError(
            f"fidelity file {p} has no rows; re-make it with benchmarks/fidelity_quant.py --json"
        )
    return rows


def memory_plot_problems(index: int, plot: dict[str, Any], groups: Sequence[Any]) -> list[str]:
    """One line per problem of a ``"kind": "memory"`` plot of a sweep definition (``groups``: the
    definition's groups), to refuse the definition before anything runs. Reads the fidelity file.
    O(groups + fidelity rows)."""
    from mamba_radix.errors import ConfigError

    where = f"plot {index} ({plot.get('file')!r})"
    problems = [
        f"{where}: unknown key {k!r}; known: {', '.join(sorted(MEMORY_PLOT_KEYS))}"
        for k in plot
        if k not in MEMORY_PLOT_KEYS
    ]
    by_name = {g.get("name"): g for g in groups if isinstance(g, dict)}
    listed = plot.get("groups")
    if not (isinstance(listed, list) and listed and all(isinstance(g, str) for g in listed)):
        problems.append(f"{where}: 'groups' must list the options' group names")
        listed = []
    problems += [f"{where}: no group named {g!r}" for g in listed if g not in by_name]
    oracle = plot.get("oracle_group")
    if not isinstance(oracle, str) or oracle not in by_name:
        problems.append(f"{where}: 'oracle_group' must name a group of the definition, got {oracle!r}")
    elif not by_name[oracle].get("policy"):
        problems.append(f'{where}: oracle_group {oracle!r} runs no policy; give the group "policy": "oracle"')
    if "where" in plot and not isinstance(plot["where"], dict):
        problems.append(f"{where}: 'where' maps parameters to a value or a list of values")
    fidelity = plot.get("fidelity")
    if fidelity is not None:
        try:
            load_fidelity(str(fidelity))
        except ConfigError as exc:
            problems.append(f"{where}: {exc}")
    return problems


def _runs(
    records: Sequence[dict[str, Any]], groups: Sequence[str], where: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The successful finite runs of ``groups`` (none for an empty list) that match ``where`` (value, or list
    of accepted values)."""
    if not groups:
        return []
    return [r for r in select_runs(records, groups, where) if not r["params"].get("infinite")]


def _prefix(names: Sequence[str]) -> str:
    """The ``"chat: "`` every name starts with (the workload), or ``""``."""
    heads = {n.split(": ", 1)[0] + ": " for n in names if ": " in n}
    return heads.pop() if len(heads) == 1 and all(": " in n for n in names) else ""


def _series_label(params: dict[str, Any], keys: Sequence[str], prefix: str) -> str:
    parts = []
    for k in keys:
        v = params.get(k)
        if k == "group":
            parts.append(str(v)[len(prefix) :])
        elif k == "checkpoint_format":
            parts.append(f"{v} checkpoints")
        else:
            parts.append(f"{k} {v}")
    return ", ".join(parts)


def _oracle_label(r: dict[str, Any]) -> str:
    p = r["params"]
    return (
        f"offline oracle (static split, ratio {p.get(SAME_POOLS)}, {p.get('checkpoint_format', 'model')} "
        "checkpoints)"
    )


def oracle_fractions(records: Sequence[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Markdown lines: every run of the plot's option groups (all ratios and formats, not only the plotted
    ones), its token hit rate at each x value (the budget), and in brackets its fraction of the oracle run
    on the same pools (same x and ``mamba_full_memory_ratio``: the static split an adaptive or unified run
    starts from; model checkpoints); the oracle's own rows last. O(runs)."""
    x_key = spec.get("x", "budget_gib")
    oracle_group = spec["oracle_group"]
    options = _runs(records, [g for g in spec["groups"] if g != oracle_group], None)
    oracles = _runs(records, [oracle_group], None)
    if not options or not oracles:
        return []
    best = {
        (r["params"].get(x_key), r["params"].get(SAME_POOLS)): r["metrics"]["token_hit_rate"] for r in oracles
    }
    xs = sorted({r["params"].get(x_key) for r in options + oracles})
    prefix = _prefix([*spec["groups"], oracle_group])
    rows: dict[tuple[str, Any, str], dict[Any, str]] = {}
    for r in options:
        p = r["params"]
        key = (str(p["group"])[len(prefix) :], p.get(SAME_POOLS), str(p.get("checkpoint_format", "model")))
        ref = best.get((p.get(x_key), p.get(SAME_POOLS)))
        hit = r["metrics"]["token_hit_rate"]
        rows.setdefault(key, {})[p.get(x_key)] = (
            f"{100 * hit:.2f} % ({hit / ref:.2f})" if ref else f"{100 * hit:.2f} %"
        )
    for r in oracles:
        p = r["params"]
        key = (str(p["group"])[len(prefix) :], p.get(SAME_POOLS), str(p.get("checkpoint_format", "model")))
        rows.setdefault(key, {})[p.get(x_key)] = f"{100 * r['metrics']['token_hit_rate']:.2f} %"
    x_name = "GiB" if x_key == "budget_gib" else x_key
    lines = [
        f"Token hit rate of every option{f' ({prefix[:-2]})' if prefix else ''}, and in brackets its fraction of "
        f"the offline oracle on the same start-up pools (same {x_name} and --mamba-full-memory-ratio: the static "
        "split an adaptive or unified run starts from, model checkpoints, the same timed engine). The oracle is "
        "Belady's MIN with oracle admission (mamba_radix.policies.oracle): a strong reference in timed mode, not "
        "a bound, and options that change the pools (quantized checkpoints, the adaptive split, the unified "
        "pool) can pass it.",
        "",
        "| option | ratio | checkpoints | " + " | ".join(f"{x:g} {x_name}" for x in xs) + " |",
        "|---|---:|---|" + "---:|" * len(xs),
    ]
    for (name, ratio, fmt), cells in rows.items():
        lines.append(f"| {name} | {ratio} | {fmt} | " + " | ".join(cells.get(x, "-") for x in xs) + " |")
    return lines


def _agreement(row: dict[str, Any]) -> float:
    return row["tokens_agree"] / max(row["tokens"], 1)


def fidelity_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines: each format's restore error and greedy agreement (the fidelity file's rows), with
    the command that measured them. O(rows)."""
    commands = sorted({r["command"] for r in rows})
    lines = [
        "Fidelity of each checkpoint format, measured on real model code (the reference engine: "
        "transformers' Kimi Linear and Qwen3-Next, tiny random-weight configs, fp32 on the CPU; not Kimi K3): "
        "every checkpoint handed to the tree stored in the format and restored on a hit, against uncached fp32 "
        f"forwards. Command: {', '.join(f'`{c}`' for c in commands)}.",
        "",
        "| model | format | error feedback | restores | max \\|Δlogit\\| at restore | mean \\|Δlogit\\| at restore "
        "| max \\|Δlogit\\| after | mean \\|logit\\| | greedy token agreement | exact outputs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['format']} | {'on' if r['error_feedback'] else 'off'} | {r['restores']} | "
            f"{r['max_abs_dlogit_restore']:.2e} | {r['mean_abs_dlogit_restore']:.2e} | {r['max_abs_dlogit_after']:.2e} "
            f"| {r['mean_abs_logit']:.3f} | {r['tokens_agree']}/{r['tokens']} ({100 * _agreement(r):.1f} %) | "
            f"{r['exact_outputs']}/{r['requests']} |"
        )
    return lines


def _fidelity_panels(ax_err: Any, ax_agree: Any, rows: Sequence[dict[str, Any]]) -> None:
    """The formats' restore error (log scale; 0 written as such, a log axis has no 0) and greedy token
    agreement (0 to 100 %), one bar per model under each format and error-feedback setting."""
    labels = list(dict.fromkeys(f"{r['format']}{', feedback' if r['error_feedback'] else ''}" for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    height = 0.8 / max(len(models), 1)
    positive = [r["max_abs_dlogit_restore"] for r in rows if r["max_abs_dlogit_restore"] > 0]
    floor = min(positive) / 10 if positive else 1e-6
    for j, m in enumerate(models):
        for i, lab in enumerate(labels):
            row = next(
                (
                    r
                    for r in rows
                    if r["model"] == m
                    and f"{r['format']}{', feedback' if r['error_feedback'] else ''}" == lab
                ),
                None,
            )
            if row is None:
                continue
            y = i + (j - (len(models) - 1) / 2) * height
            err = row["max_abs_dlogit_restore"]
            color = f"C{j}"
            if err > 0:
                ax_err.barh(y, err, height=height, color=color, label=m if i == 0 else None, left=0)
            else:
                ax_err.barh(y, 0, height=height, color=color, label=m if i == 0 else None)
                ax_err.annotate("0 (exact)", (floor, y), va="center", fontsize=7)
            ax_agree.barh(y, 100 * _agreement(row), height=height, color=color)
            ax_agree.annotate(
                f"{row['tokens_agree']}/{row['tokens']}", (2, y), va="center", fontsize=6.5, color="white"
            )
    for ax in (ax_err, ax_agree):
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    ax_err.set_xscale("log")
    ax_err.set_xlim(left=floor)
    scale = ", ".join(f"{m} {next(r['mean_abs_logit'] for r in rows if r['model'] == m):.3f}" for m in models)
    ax_err.set_xlabel(
        f"max |Δlogit| at restore vs uncached fp32\n(logit units, log scale; mean |logit|: {scale})",
        fontsize=7.5,
    )
    ax_err.set_title("restore error per checkpoint format", fontsize=9)
    ax_err.legend(fontsize=7, title="model (tiny, random weights)", title_fontsize=7, loc="upper right")
    ax_agree.set_xlim(0, 100)
    ax_agree.set_xlabel("greedy tokens equal to uncached fp32 (%)", fontsize=8)
    ax_agree.set_title("greedy token agreement", fontsize=9)


def memory_plot(records: Sequence[dict[str, Any]], spec: dict[str, Any], path: Path) -> bool:
    """Draw a ``"kind": "memory"`` plot into ``path``: token hit rate (0-100 %) against memory (log x,
    ticks at the measured values) for each option series, the offline oracle's line at each plotted
    ``mamba_full_memory_ratio`` (black, underneath, labelled "offline oracle (static split, ...)"), the
    ideal; with ``fidelity``, two panels beside it (restore error and greedy agreement per format).
    Returns False (nothing drawn) when no run matches. Side effects: writes the PNG. O(runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key = spec.get("x", "budget_gib")
    oracle_group = spec["oracle_group"]
    series_keys = spec.get("series", ["group", "checkpoint_format"])
    options = _runs(records, [g for g in spec["groups"] if g != oracle_group], spec.get("where"))
    oracles = _runs(records, [oracle_group], spec.get("where"))
    if not options and not oracles:
        return False
    fidelity = load_fidelity(spec["fidelity"]) if spec.get("fidelity") else None
    if fidelity:
        fig = plt.figure(figsize=(16.5, 6.4))
        grid = fig.add_gridspec(1, 3, width_ratios=(2.6, 1.2, 1.0), wspace=0.32)
        ax = fig.add_subplot(grid[0, 0])
        ax_err, ax_agree = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[0, 2])
    else:
        fig, ax = plt.subplots(figsize=(10.0, 6.4))
    prefix = _prefix([*spec["groups"], oracle_group])
    by_ratio: dict[Any, list[tuple[float, float]]] = {}
    for r in oracles:
        by_ratio.setdefault(r["params"].get(SAME_POOLS), []).append(
            (float(r["params"][x_key]), 100 * r["metrics"]["token_hit_rate"])
        )
    dashes = ("-", "--", "-.", ":")
    for i, (ratio, pts) in enumerate(sorted(by_ratio.items(), key=lambda kv: -float(kv[0] or 0))):
        sample = next(r for r in oracles if r["params"].get(SAME_POOLS) == ratio)
        ax.plot(*zip(*sorted(pts), strict=True), color="black", linewidth=3.2, alpha=0.55, linestyle=dashes[i % 4],
                zorder=1, label=_oracle_label(sample))  # fmt: skip
    lines: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    for r in options:
        name = tuple(r["params"].get(k) for k in series_keys)
        lines.setdefault(name, []).append((float(r["params"][x_key]), 100 * r["metrics"]["token_hit_rate"]))
    for i, (name, pts) in enumerate(sorted(lines.items(), key=lambda kv: [str(v) for v in kv[0]])):
        params = dict(zip(series_keys, name, strict=True))
        # series that coincide (int8 and fp8 take the same bytes): each its own marker, smaller than the one
        # drawn before it, so that the one underneath stays visible
        ax.plot(*zip(*sorted(pts), strict=True), marker=MEMORY_MARKERS[i % len(MEMORY_MARKERS)], markersize=max(3.5, 10 - 1.1 * i),
                linewidth=1.4, zorder=3 + i, label=_series_label(params, series_keys, prefix))  # fmt: skip
    ideal = [r["metrics"]["ideal_hit_rate"] for r in options + oracles]
    ax.axhline(
        100 * max(ideal),
        color="gray",
        linestyle=":",
        linewidth=1.5,
        label="ideal (any seen prefix, ∞ memory)",
    )
    xs = sorted({p[0] for pts in [*lines.values(), *by_ratio.values()] for p in pts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlim(xs[0] / 1.25, xs[-1] * 1.25)
    ax.set_ylim(0, 100)
    ax.set_xlabel(spec.get("xlabel", x_key) + " (log scale)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title("token hit rate against memory (timed, extra_buffer)", fontsize=9)
    fig.suptitle(spec.get("title", ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    if fidelity:
        _fidelity_panels(ax_err, ax_agree, fidelity)
    fig.subplots_adjust(left=0.05, right=0.985, bottom=0.15, top=0.89)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def memory_section(records: Sequence[dict[str, Any]], spec: dict[str, Any], folder: str | Path) -> list[str]:
    """A sweep report's section for a ``"kind": "memory"`` plot: draws it (:func:`memory_plot`) into
    ``folder`` and returns the report's lines (heading, image, the options as fractions of the oracle,
    the fidelity table); no lines when no run matches. Side effects: writes the PNG. O(runs)."""
    if not memory_plot(records, spec, Path(folder) / spec["file"]):
        return []
    lines = [f"## {spec.get('title', spec['file'])}", "", f"![{spec['file']}]({spec['file']})", ""]
    fractions_lines = oracle_fractions(records, spec)
    if fractions_lines:
        lines += [*fractions_lines, ""]
    if spec.get("fidelity"):
        lines += [*fidelity_table(load_fidelity(spec["fidelity"])), ""]
    return lines


def reference_fractions(records: Sequence[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Markdown lines for a line plot with ``"reference_groups"`` (the host tier's tier-aware oracle): each
    other group's token hit rate at each x value and, in brackets, its fraction of the best reference run at
    that x (the reference groups' own rows last). [] when the plot has no reference groups or no runs.
    O(runs)."""
    refs = list(spec.get("reference_groups") or [])
    if not refs:
        return []
    x_key = spec.get("x", "budget_gib")
    others = _runs(records, [g for g in spec["groups"] if g not in refs], spec.get("where"))
    oracles = _runs(records, refs, spec.get("where"))
    if not others or not oracles:
        return []
    best: dict[Any, float] = {}
    for r in oracles:
        x = r["params"].get(x_key)
        best[x] = max(best.get(x, 0.0), r["metrics"]["token_hit_rate"])
    xs = sorted({r["params"].get(x_key) for r in others + oracles})
    prefix = _prefix(spec["groups"])
    rows: dict[str, dict[Any, str]] = {}
    for r in others + oracles:
        p, hit = r["params"], r["metrics"]["token_hit_rate"]
        ref = best.get(p.get(x_key)) if r in others else None
        cell = f"{100 * hit:.2f} % ({hit / ref:.2f})" if ref else f"{100 * hit:.2f} %"
        rows.setdefault(str(p["group"])[len(prefix) :], {})[p.get(x_key)] = cell
    x_name = "GiB" if x_key == "budget_gib" else x_key
    lines = [
        "Token hit rate (device and host hits) of each group, and in brackets its fraction of the best reference "
        f"run at the same {x_name} ({', '.join(r[len(prefix) :] for r in refs)}).",
        "",
        "| group | " + " | ".join(f"{x:g} {x_name}" for x in xs) + " |",
        "|---|" + "---:|" * len(xs),
    ]
    lines += [
        f"| {name} | " + " | ".join(cells.get(x, "-") for x in xs) + " |" for name, cells in rows.items()
    ]
    return [*lines, ""]
