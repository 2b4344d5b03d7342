"""A markdown report with tables and PNG plots, made from results records only (never by re-running).

:func:`write_report` takes the records of a sweep (see :func:`mamba_radix.sim.metrics.result_record`) and
an optional experiment definition, and writes ``report.md`` plus one PNG per plot into a directory.
Plots are described by the definition's ``plots`` list:

- ``{"kind": "line", "file", "title", "groups", "where"?, "x", "series", "y"?, "y_unit"?, "markers"?,
  "logx"?, "categorical"?, "references"?}``: ``y`` (a metric, default the token hit rate;
  ``"host_tier.NAME"`` a field of the host tier's metrics, the runs without the tier left out) against
  parameter ``x``, one line per combination of the ``series`` parameters, over the runs of ``groups``
  matching ``where`` (parameter -> value, or list of allowed values); ``y_unit`` ``"GiB"`` draws a byte
  count in GiB; ``markers`` true gives each series its own marker, smaller than the one before, so that
  coinciding series stay visible, and puts the legend beside the axes; for hit rates
  the infinite-capacity runs and the trace's ideal are drawn as horizontal references unless
  ``references`` is false;
- ``{"kind": "pressure", "file", "title", "groups", "where"?, "series"}``: KV-token and state-slot usage
  over simulated time (fractions of the pools) for the matching runs.

Without a definition a single table and no plots are written. Matplotlib runs with the Agg backend.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mamba_radix.errors import ConfigError
from mamba_radix.sim.reference import match_reference, select_runs

__all__ = [
    "Y_UNITS",
    "compact_table",
    "load_records",
    "order_comparisons",
    "plot_problems",
    "results_table",
    "write_report",
]

# columns: (header, function of a record -> str)
GIB = 1 << 30


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines results file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def _mtok(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def _label(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return str(value)


def _has_peer(records: Sequence[dict[str, Any]]) -> bool:
    """Whether any run was a peer preset (the tables then get a ``peer`` column)."""
    return any(r["params"].get("peer") for r in records)


def _with_peer(row: list[str], record: dict[str, Any], show: bool) -> list[str]:
    """``row`` with the run's peer (``-`` for none) inserted after run and group, when ``show``."""
    if not show:
        return row
    return [*row[:2], record["params"].get("peer") or "-", *row[2:]]


def results_table(records: Sequence[dict[str, Any]]) -> str:
    """One markdown row per run: parameters that vary, pools, hit rates, checkpoints, copies, TTFT (and the
    peer preset, when any run has one)."""
    show_peer = _has_peer(records)
    header = [
        "run", "group", "strategy", "evict", "refresh", "cap", "interval", "ratio", "GiB", "KV tokens", "slots",
        "max run", "hit %", "∞-cap hit %", "ideal %", "KV-only Mtok", "recomp. Mtok", "ckpt ins/skip/evict/cap",
        "copies GiB", "peak run (bound)", "TTFT p50/p90 s", "wall s",
    ]  # fmt: skip
    header = _with_peer(header, {"params": {"peer": "peer"}}, show_peer)
    infinite = _infinite_by_strategy(records)
    rows = []
    for r in records:
        p = r["params"]
        if "error" in r:
            row = [r["run_id"], p.get("group", ""), p.get("strategy", ""), "error: " + r["error"]]
            row = _with_peer(row, r, show_peer)
            rows.append(row + [""] * (len(header) - len(row)))
            continue
        m, pools, st = r["metrics"], r["pools"], r["cache_stats"]
        inf = infinite.get(p["strategy"])
        rows.append(
            _with_peer(
                [
                    r["run_id"],
                    p.get("group", ""),
                    p["strategy"],
                    p["mamba_eviction_order"],
                    p["mamba_lru_refresh"],
                    str(p["mamba_max_states_per_path"]),
                    str(p["mamba_track_interval"]),
                    "-" if p["infinite"] or p.get("kv_tokens") else _label(p["mamba_full_memory_ratio"]),
                    _num(float(pools["budget_gib"]), 2),
                    _num(pools["kv_tokens"]),
                    _num(pools["state_slots"]),
                    str(pools.get("max_running_requests_effective", pools["max_running_requests"])),
                    _pct(m["token_hit_rate"]),
                    _pct(inf) if inf is not None else "-",
                    _pct(m["ideal_hit_rate"]),
                    _mtok(m["kv_only_matched_tokens"]),
                    _mtok(m["recomputed_tokens"]),
                    f"{st.get('checkpoints_inserted', '-')}/{st.get('checkpoints_skipped', '-')}/"
                    f"{st.get('states_evicted', '-')}/{st.get('checkpoints_capped', '-')}",
                    _num(st["state_copy_bytes"] / GIB, 1),
                    f"{m['peak_running']} ({m['peak_running_bound_by'] or 'arrivals'})",
                    f"{_num(m['ttft_p50_s'], 2)}/{_num(m['ttft_p90_s'], 2)}",
                    _num(r["wall_s"], 1),
                ],
                r,
                show_peer,
            )
        )
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def host_tier_table(records: Sequence[dict[str, Any]]) -> str | None:
    """One markdown row per run with the host tier on: its host pools, write policy and link, the hit rate
    by tier (device, host, miss: they add up to 100% of input tokens) and the bytes moved each way, with the
    load-backs' time on the link (overlapped with the previous forward / added to prefill). None when no
    run has the tier (the report then has no such section). O(runs)."""
    tiered = [r for r in records if "error" not in r and r["metrics"].get("host_tier")]
    if not tiered:
        return None
    header = [
        "run", "host KV tokens", "host slots", "write policy", "link GB/s", "device hit %", "host hit %",
        "miss %", "load-backs", "host->device GiB", "device->host GiB", "load s (overlapped/exposed)",
    ]  # fmt: skip
    rows = []
    for r in tiered:
        h = r["metrics"]["host_tier"]
        rows.append(
            [
                r["run_id"],
                _num(h["host_kv_tokens"]),
                _num(h["host_state_slots"]),
                h["write_policy"],
                f"{h['link']} {h['link_gb_per_s']:g}",
                _pct(h["device_hit_rate"]),
                _pct(h["host_hit_rate"]),
                _pct(h["miss_rate"]),
                f"{h['load_backs']:,}",
                _num(h["bytes_host_to_device"] / GIB, 3),
                _num(h["bytes_device_to_host"] / GIB, 3),
                f"{h['load_s']:.3f} ({h['load_overlapped_s']:.3f}/{h['load_exposed_s']:.3f})",
            ]
        )
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def compact_table(records: Sequence[dict[str, Any]]) -> str:
    """The headline columns only (for a README): one row per successful run (with a ``peer`` column and
    the checkpoint admission when any run has a peer)."""
    show_peer = _has_peer(records)
    header = ["run", "group", "strategy", "evict", "refresh", "cap", "interval", "ratio", "GiB", "slots",
              "hit %", "KV-only Mtok", "ckpt evicted", "peak run", "TTFT p50 s"]  # fmt: skip
    if show_peer:
        header = _with_peer(header, {"params": {"peer": "peer"}}, True)
        header[5:5] = ["admission"]
        header[-3:-3] = ["ckpt inserted"]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in sorted(records, key=lambda r: str(r["run_id"])):
        if "error" in r:
            continue
        p, m, st = r["params"], r["metrics"], r["cache_stats"]
        row = [
            r["run_id"], p.get("group", ""), p["strategy"], p["mamba_eviction_order"], p["mamba_lru_refresh"],
            str(p["mamba_max_states_per_path"]), str(p["mamba_track_interval"]),
            "-" if p["infinite"] or p.get("kv_tokens") else _label(p["mamba_full_memory_ratio"]),
            _num(float(r["pools"]["budget_gib"]), 2), _num(r["pools"]["state_slots"]),
            _pct(m["token_hit_rate"]), _mtok(m["kv_only_matched_tokens"]), str(st.get("states_evicted", "-")),
            str(m["peak_running"]), _num(m["ttft_p50_s"], 2),
        ]  # fmt: skip
        if show_peer:
            row = _with_peer(row, r, True)
            row[5:5] = [p.get("mamba_checkpoint_admission", "all")]
            row[-3:-3] = [str(st.get("checkpoints_inserted", "-"))]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


# parameters that do not define a configuration (bookkeeping), ignored when comparing two runs' settings
_NON_CONFIG_PARAMS = {"group"}
# what has to match for two runs to count as giving the same result
_OUTCOME_METRICS = ("cached_tokens", "kv_matched_tokens", "prefill_tokens", "peak_running", "sim_time_s")
_OUTCOME_STATS = ("states_evicted", "tokens_evicted", "checkpoints_inserted", "checkpoints_capped")


def order_comparisons(records: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per pair of runs that differ only in ``mamba_eviction_order``: whether their outcomes
    (cached tokens, KV matched, checkpoints evicted, ...) are identical or how far the hit rates are
    apart. Computed from the records, so the report says plainly when two orders coincide. O(runs^2)."""
    ok = [r for r in records if "error" not in r]
    out = []
    for i, a in enumerate(ok):
        for b in ok[i + 1 :]:
            pa, pb = a["params"], b["params"]
            keys = (set(pa) | set(pb)) - _NON_CONFIG_PARAMS
            differing = {k for k in keys if pa.get(k) != pb.get(k)}
            if differing != {"mamba_eviction_order"}:
                continue
            same = all(a["metrics"][k] == b["metrics"][k] for k in _OUTCOME_METRICS) and all(
                a["cache_stats"].get(k) == b["cache_stats"].get(k) for k in _OUTCOME_STATS
            )
            where = (
                f"{pa['strategy']}, refresh {pa['mamba_lru_refresh']}, ratio "
                f"{_label(pa['mamba_full_memory_ratio'])}, {_num(pa['budget_gib'], 2)} GiB"
            )
            names = f"{pa['mamba_eviction_order']} (run {a['run_id']}) and {pb['mamba_eviction_order']} (run {b['run_id']})"
            if same:
                out.append(
                    f"- {names} coincide ({where}): identical cached tokens, KV matches and evictions "
                    f"({a['cache_stats'].get('states_evicted', '-')} checkpoints evicted each)."
                )
            else:
                diff = 100 * (b["metrics"]["token_hit_rate"] - a["metrics"]["token_hit_rate"])
                out.append(
                    f"- {names} differ ({where}): hit rate {_pct(a['metrics']['token_hit_rate'])}% vs "
                    f"{_pct(b['metrics']['token_hit_rate'])}% ({diff:+.2f} points), checkpoints evicted "
                    f"{a['cache_stats'].get('states_evicted', '-')} vs {b['cache_stats'].get('states_evicted', '-')}."
                )
    return out


def _infinite_by_strategy(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    return {
        r["params"]["strategy"]: r["metrics"]["token_hit_rate"]
        for r in records
        if "error" not in r and r["params"].get("infinite")
    }


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# a line plot's ``y_unit``: what one unit of the axis is, in the metric's own unit (bytes for GiB)
Y_UNITS: dict[str | None, float] = {None: 1.0, "GiB": float(GIB)}


def plot_problems(plots: Sequence[Any]) -> list[str]:
    """One line per plot option this module cannot draw (a ``y_unit`` not in :data:`Y_UNITS`, reference
    groups that are not the plot's), to refuse a definition before anything runs or is written. No side effects. O(plots)."""
    problems = [
        f"plot {i} ({plot.get('file')!r}): y_unit must be 'GiB' or left out, got {plot['y_unit']!r}"
        for i, plot in enumerate(plots)
        if isinstance(plot, dict) and plot.get("y_unit") not in Y_UNITS
    ]
    for i, plot in enumerate(plots):
        refs = plot.get("reference_groups") if isinstance(plot, dict) else None
        if refs is not None and not (
            isinstance(refs, list) and refs and set(refs) <= set(plot.get("groups") or [])
        ):
            problems.append(
                f"plot {i} ({plot.get('file')!r}): reference_groups must be a non-empty list of the plot's groups, "
                f"got {refs!r}"
            )
    return problems


def _value(r: dict[str, Any], key: str) -> Any:
    if "." in key:  # "host_tier.NAME": None when the run has no such section (a run without the tier)
        section, _, name = key.partition(".")
        return (r["metrics"].get(section) or {}).get(name)
    if key in r["metrics"]:
        return r["metrics"][key]
    return r["params"].get(key)


# how parameters are named on axes and legends: the flag that sets them (mamba_radix.flags), not the field
_PARAM_LABELS = {"strategy": "strategy (resolved)", "budget_gib": "--memory-budget-gb", "peer": "--peer"}
# values that are not on the parameter's scale: drawn last, labelled, set apart
_SPECIAL_VALUES = {
    "mamba_max_states_per_path": {-1: "no cap (-1)"},
    "chunked_prefill_size": {-1: "none (-1)"},
}


def param_label(key: str) -> str:
    """The name a plot gives parameter ``key``: its flag where one sets it, else the key."""
    if key in _PARAM_LABELS:
        return _PARAM_LABELS[key]
    from mamba_radix.flags import FLAGS

    return next((f.flag for f in FLAGS() if f.dest == key), key)


def _is_special(key: str, value: Any) -> bool:
    return value in _SPECIAL_VALUES.get(key, {})


def _category_label(key: str, value: Any) -> str:
    return _SPECIAL_VALUES.get(key, {}).get(value, _label(value))


def _mark_zoomed_y(ax: Any, scale: float) -> None:
    """A y axis that does not start at 0 says so on the plot (small differences look large otherwise)."""
    lo = ax.get_ylim()[0]
    if lo <= 0:
        return
    unit = "%" if scale == 100.0 else ""
    ax.annotate(
        f"y axis zoomed: starts at {lo:.3g}{unit}, not 0",
        (0.035, 0.01),
        xycoords="axes fraction",
        ha="left",
        va="bottom",
        fontsize=7,
        color="firebrick",
    )
    # the usual broken-axis mark on the left spine
    kw = {"transform": ax.transAxes, "color": "firebrick", "clip_on": False, "linewidth": 1}
    for y in (0.015, 0.035):
        ax.plot((-0.015, 0.015), (y - 0.01, y + 0.01), **kw)


def _line_plot(records: Sequence[dict[str, Any]], spec: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = select_runs(records, spec.get("groups"), spec.get("where"))
    x_key, y_key = spec["x"], spec.get("y", "token_hit_rate")
    series_keys = spec.get("series", [])
    lines: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    finite = [r for r in runs if not r["params"].get("infinite")]
    categories = sorted(
        {_value(r, x_key) for r in finite},
        key=lambda v: (v is None, _is_special(x_key, v), 0 if v is None else v),
    )
    for r in finite:
        y = _value(r, y_key)
        if y is None:  # a metric the run does not have (host_tier.* with the tier off): no point, not a zero
            continue
        name = tuple(r["params"].get(k) for k in series_keys)
        x = _value(r, x_key)
        x_pos = float(categories.index(x)) if spec.get("categorical") else float(x)
        lines[name].append((x_pos, float(y) / Y_UNITS[spec.get("y_unit")]))
    if not lines:
        return False
    fig, ax = plt.subplots(figsize=(10.0 if spec.get("markers") else 7.5, 4.5))
    if spec.get("categorical"):
        ax.set_xticks(range(len(categories)), [_category_label(x_key, c) for c in categories])
        special = [i for i, c in enumerate(categories) if _is_special(x_key, c)]
        if special and len(special) < len(categories):
            # "no cap" is not a number past the largest cap: a dashed rule sets it apart
            ax.axvline(special[0] - 0.5, color="gray", linestyle="--", linewidth=0.8)
    scale = 100.0 if y_key.endswith("rate") else 1.0
    ordered = sorted(lines.items(), key=lambda kv: [str(v) for v in kv[0]])
    single = len(ordered) == 1  # one series: no legend entry (the axis labels say what it is)
    for i, (name, pts) in enumerate(ordered):
        pts.sort()
        label = None if single else " / ".join(_label(v) for v in name)
        if spec.get("categorical"):
            # Categories are not a scale: markers only (a line would invent values between them), each
            # series nudged sideways so that coinciding points of different series stay visible.
            shift = (i - (len(ordered) - 1) / 2) * 0.08
            ax.plot([p[0] + shift for p in pts], [p[1] * scale for p in pts], marker="o", linestyle="none",
                    markersize=7, label=label)  # fmt: skip
        elif spec.get("markers"):
            # Series that often coincide (a host tier too large to fill): each its own marker, drawn smaller
            # than the one before, so that a series under another stays visible instead of vanishing.
            marker, size = _MARKERS[i % len(_MARKERS)], max(3.0, 11.0 - 1.3 * i)
            ax.plot(
                [p[0] for p in pts], [p[1] * scale for p in pts], marker=marker, markersize=size, label=label
            )
        else:
            ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], marker="o", label=label)
    if y_key == "token_hit_rate" and spec.get("references", True):
        ideal = [r["metrics"]["ideal_hit_rate"] for r in runs]
        if ideal:
            ax.axhline(
                max(ideal) * 100,
                color="black",
                linestyle="--",
                linewidth=1,
                label="ideal (any prefix, ∞ memory)",
            )
        for strategy, hit in sorted(_infinite_by_strategy(records).items()):
            ax.axhline(hit * 100, linestyle=":", linewidth=1, color="gray")
            ax.annotate(
                f"∞ memory, {strategy}",
                (1.0, hit * 100),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=7,
                color="gray",
            )
    if spec.get("logx"):
        ax.set_xscale("log", base=2)
        # tick the measured values themselves: powers of two say nothing about a 27.25 GiB budget
        xs = sorted({p[0] for pts in lines.values() for p in pts})
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
    ax.set_xlabel(
        spec.get("xlabel", param_label(x_key))
        + (" (categories, not to scale)" if spec.get("categorical") else "")
    )
    ax.set_ylabel(spec.get("ylabel", "token hit rate (%)" if y_key == "token_hit_rate" else y_key))
    ax.set_title(spec.get("title", ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    _mark_zoomed_y(ax, scale)
    if ax.get_legend_handles_labels()[1]:  # a single unnamed series needs no legend
        title = " / ".join(param_label(k) for k in series_keys) if series_keys and not single else None
        # many coinciding series: the legend goes beside the axes, where it cannot cover a point
        outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if spec.get("markers") else {}
        ax.legend(fontsize=7, title=title, title_fontsize=7, **outside)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _pressure_plot(records: Sequence[dict[str, Any]], spec: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in select_runs(records, spec.get("groups"), spec.get("where")) if r.get("timeseries")]
    if not runs:
        return False
    series = spec.get("series", ["strategy"])
    runs.sort(key=lambda r: [str(r["params"].get(k)) for k in series])  # legend in series order
    fig, (ax_kv, ax_slot) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in runs:
        ts = r["timeseries"]
        label = " / ".join(f"{_label(r['params'].get(k))}" for k in spec.get("series", ["strategy"]))
        t = ts["time_s"]
        kv = [u / c for u, c in zip(ts["kv_used_tokens"], ts["kv_capacity_tokens"], strict=True)]
        slots = [u / c for u, c in zip(ts["slots_used"], ts["slot_capacity"], strict=True)]
        (line,) = ax_kv.plot(t, [100 * v for v in kv], linewidth=1, label=label)
        ax_slot.plot(t, [100 * v for v in slots], linewidth=1, color=line.get_color(), label=label)
        reserved = [u / c for u, c in zip(ts["slots_reserved"], ts["slot_capacity"], strict=True)]
        ax_slot.plot(t, [100 * v for v in reserved], linewidth=0.8, linestyle="--", color=line.get_color())
    # kv_used_tokens counts the decode KV running requests are owed (reserved at admission, allocated
    # segment by segment), so it can pass the pool's size: the axis says so and the pool is drawn
    ax_kv.set_ylabel("KV tokens allocated + owed\nto running decodes (% of pool)")
    ax_slot.set_ylabel("state slots used (%)\n(dashed: held by running requests)")
    ax_slot.set_xlabel("simulated time (s)")
    for ax in (ax_kv, ax_slot):
        top = max(105.0, ax.get_ylim()[1])
        ax.set_ylim(0, top)
        ax.axhline(100, color="black", linewidth=0.8, linestyle="-", alpha=0.6)
        ax.annotate("pool size", (0.0, 100), xycoords=("axes fraction", "data"), ha="left", va="bottom",
                    fontsize=7, color="black")  # fmt: skip
        ax.grid(True, alpha=0.3)
    if len(runs) > 1:
        ax_kv.legend(fontsize=7, title=" / ".join(param_label(k) for k in series), title_fontsize=7)
    ax_kv.set_title(spec.get("title", ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(
    records: Sequence[dict[str, Any]],
    out_dir: str | Path,
    definition: dict[str, Any] | None = None,
    runtime_s: float | None = None,
    jobs: int | None = None,
    reference: Sequence[dict[str, Any]] | None = None,
    reference_name: str | None = None,
) -> Path:
    """Write ``report.md`` and the plots into ``out_dir``; return the report's path.

    ``reference``: the records of a reference run of the same definition (e.g. the committed one); the
    report then says, run by run, how its numbers compare (:func:`reference_comparison`).
    Side effects: creates ``out_dir`` and overwrites the files it writes. O(runs * samples + runs^2).
    Raises :class:`ConfigError` for a plot it cannot draw (:func:`plot_problems`), before writing anything.
    """
    problems = plot_problems((definition or {}).get("plots", []) or [])
    if problems:
        raise ConfigError("; ".join(problems))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = sorted(records, key=lambda r: str(r["run_id"]))  # results files are in completion order
    ok = [r for r in records if "error" not in r]
    title = (definition or {}).get("title", "mamba_radix simulation results")
    lines = [f"# {title}", ""]
    if definition and definition.get("description"):
        lines += [definition["description"], ""]
    if ok:
        first = ok[0]
        p = first["params"]
        by_trace: dict[str, dict[str, Any]] = {}  # one header line per workload (first run of each)
        for r in ok:
            by_trace.setdefault(r["params"]["trace"], r)
        for trace, r in by_trace.items():
            m = r["metrics"]
            lines += [
                f"- trace: `{trace}`, {m['requests']:,} requests ({m['input_tokens']:,} input tokens, "
                f"{m['output_tokens']:,} output tokens); limit {r['params']['limit'] or 'none'}; mode "
                f"{r['params']['mode']}, arrival time scale {r['params']['arrival_time_scale']}; ideal "
                f"(longest previously seen prefix, infinite memory, no checkpoint limit) "
                f"{100 * m['ideal_hit_rate']:.2f}% token hit rate",
            ]
        lines += [
            f"- model: {p['model']}; {first['pools']['bytes_per_kv_token']:,} B per KV token, "
            f"{first['pools']['bytes_per_state_slot']:,} B per state slot (per rank)",
            f"- engine cost model: {p['cost']}",
        ]
    if runtime_s is not None:
        lines.append(
            f"- {len(records)} runs ({len(records) - len(ok)} failed) in {runtime_s:.0f} s wall time"
            + (f" on {jobs} processes" if jobs else "")
        )
    lines.append("")
    for spec in (definition or {}).get("plots", []):
        path = out / spec["file"]
        if spec.get("kind") == "memory":  # hit rate against memory, the oracle's line, fidelity beside it
            from mamba_radix.experiment_report import memory_section

            lines += memory_section(ok, spec, out)
            continue
        drawn = (
            _pressure_plot(ok, spec, path) if spec.get("kind") == "pressure" else _line_plot(ok, spec, path)
        )
        if drawn:
            lines += [f"## {spec.get('title', spec['file'])}", "", f"![{spec['file']}]({spec['file']})", ""]
            if spec.get("caption"):
                lines += [spec["caption"], ""]
            if spec.get(
                "reference_groups"
            ):  # each group as a fraction of a reference (the tier-aware oracle)
                from mamba_radix.experiment_report import reference_fractions

                lines += reference_fractions(ok, spec)
            if spec.get("x") == "mamba_eviction_order":
                lines += [*order_comparisons(select_runs(ok, spec.get("groups"), spec.get("where"))), ""]
    if reference is not None or reference_name:
        lines += ["## Compared with the reference", ""]
        lines += reference_comparison(records, reference or [], reference_name or "the reference")
        lines.append("")
    lines += ["## Summary", "", compact_table(records), ""]
    tiers = host_tier_table(records)
    if tiers is not None:  # only runs with the host tier; a report without one is unchanged
        lines += [
            "## Host tier",
            "",
            "hit % by tier over input tokens: device = already on the device at admission, host = made a "
            "device hit by a load-back, miss = computed; bytes on the model (bytes per KV token and state "
            "slot); load s = load-backs' time on the link, overlapped with the previous forward / added to the "
            "prefill that waited (backups overlap compute and are counted in bytes only).",
            "",
            tiers,
            "",
        ]
    lines += [
        "## All runs",
        "",
        "hit % = cached tokens / input tokens (usable hits: KV up to a checkpoint, matching input[:-1]); "
        "∞-cap hit % = the same strategy with pools nothing fills; ideal % = longest previously seen prefix; "
        "KV-only = KV matched past the last checkpoint (recomputed anyway); recomp. = tokens an earlier "
        "request had computed but this one computed again (sum of ideal - hit); ckpt = checkpoints inserted / "
        "skipped for lack of a slot / evicted / dropped by the per-path cap; copies = state bytes copied on "
        "the real model (copy-on-write of hits, no_buffer chunk-end copies); peak run (bound) = most requests "
        "running at once and the pool that stopped the next admission at that moment (arrivals: none did).",
        "",
        results_table(records),
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# parameters that say nothing about a run's outcome, ignored when matching a run with its reference
_NOT_MATCHED = {"group", "verify_states", "check_invariants_every", "keep_per_request", "num_samples"}


def _match_key(params: dict[str, Any], keys: set[str]) -> str:
    return json.dumps({k: params.get(k) for k in sorted(keys)}, sort_keys=True, default=str)


def _same_outcome(run: dict[str, Any], ref: dict[str, Any]) -> bool:
    """Whether two records of the same parameters have the same outcome (every outcome metric and
    cache counter, to the last digit)."""
    return all(run["metrics"].get(k) == ref["metrics"].get(k) for k in _OUTCOME_METRICS) and all(
        run["cache_stats"].get(k) == ref["cache_stats"].get(k) for k in _OUTCOME_STATS
    )


def reference_comparison(
    records: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]], name: str
) -> list[str]:
    """Markdown lines comparing each run with the reference run of the same parameters: identical
    outcomes (cached tokens, KV matches, evictions, ...) or the hit-rate difference; runs without a
    reference and a different request count are said as such. O(runs + reference runs)."""
    ok = [r for r in records if "error" not in r]
    ref_ok = [r for r in reference if "error" not in r]
    if not ref_ok:
        return [f"No reference results ({name})."]
    limits = {r["params"].get("limit") for r in ok}
    ref_limits = {r["params"].get("limit") for r in ref_ok}
    if limits != ref_limits:
        return [
            f"The reference ({name}) replayed {', '.join(map(str, sorted(ref_limits, key=str)))} requests per "
            f"run, this run {', '.join(map(str, sorted(limits, key=str)))}: the numbers are not comparable, "
            "so none are compared (run without --limit to compare)."
        ]
    # match on the parameters both sides record (a newer version may record more)
    keys = (
        set().union(*(r["params"] for r in ok)) & set().union(*(r["params"] for r in ref_ok))
    ) - _NOT_MATCHED
    matches = match_reference(
        sorted(ok, key=lambda r: str(r["run_id"])),
        ref_ok,
        key=lambda r: _match_key(r["params"], keys),
        identical=_same_outcome,
    )
    rows, identical, missing = [], 0, 0
    for m in matches:
        r, ref = m.run, m.reference
        if ref is None:
            missing += 1
            rows.append(
                f"| {r['run_id']} | {r['params'].get('group', '')} | {_pct(r['metrics']['token_hit_rate'])} | - | - | no reference run |"
            )
            continue
        identical += m.identical
        diff = 100 * (r["metrics"]["token_hit_rate"] - ref["metrics"]["token_hit_rate"])
        rows.append(
            f"| {r['run_id']} | {r['params'].get('group', '')} | {_pct(r['metrics']['token_hit_rate'])} | "
            f"{_pct(ref['metrics']['token_hit_rate'])} | {diff:+.2f} | {'identical' if m.identical else 'differs'} |"
        )
    head = (
        f"{identical} of {len(ok)} runs identical to the reference ({name}: same cached tokens, KV matches, "
        f"prefill tokens, peak running, simulated time and evictions)"
        + (f"; {missing} without a reference run" if missing else "")
        + "."
    )
    return [
        head,
        "",
        "| run | group | hit % | reference hit % | difference (points) | outcome |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


# parameters a flag sweep can vary, in the order plots are made; the rest are bookkeeping
_SWEEP_AXES_SKIP = {"group", "trace", "limit", "cost", "model", "run_id", "verify_states", "check_invariants_every",
                    "keep_per_request", "num_samples", "decode_step_events", "mamba_radix_cache_strategy"}  # fmt: skip


def sweep_plots(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plot specs for a sweep without a definition: the hit rate against each parameter that varies
    (one series per combination of the other varying ones), plus KV and slot pressure over time when
    there are few runs. O(runs * params)."""
    ok = [r for r in records if "error" not in r]
    if len(ok) < 2:
        return []
    varying = []
    for key in ok[0]["params"]:
        if key in _SWEEP_AXES_SKIP:
            continue
        values = {json.dumps(r["params"].get(key), sort_keys=True, default=str) for r in ok}
        if len(values) > 1:
            varying.append(key)
    plots: list[dict[str, Any]] = []
    for key in varying:
        values = [r["params"].get(key) for r in ok]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        special = any(_is_special(key, v) for v in values)
        plots.append(
            {
                "kind": "line",
                "file": f"hit_vs_{key}.png",
                "x": key,
                "series": [k for k in varying if k != key],
                "categorical": not numeric or special,
                "title": f"Token hit rate against {param_label(key)}",
                "references": True,
            }
        )
    if len(ok) <= 8 and any(r.get("timeseries") for r in ok):
        plots.append({"kind": "pressure", "file": "pressure.png", "series": varying or ["strategy"],
                      "title": "KV-token and state-slot pressure over time"})  # fmt: skip
    return plots


def write_reference(results: str | Path, out: str | Path) -> int:
    """Write the reference file of a definition from a run's ``results.jsonl``: its records sorted by run,
    without their time series (what :func:`reference_comparison` needs). Returns the run count.
    Side effects: overwrites ``out``."""
    records = sorted(load_records(results), key=lambda r: str(r["run_id"]))
    with open(out, "w", encoding="utf-8") as f:
        for r in records:
            r.pop("timeseries", None)
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return len(records)


if __name__ == "__main__":  # python -m mamba_radix.sim.report RESULTS.jsonl REFERENCE.jsonl
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m mamba_radix.sim.report RESULTS.jsonl REFERENCE.jsonl")
    print(f"{write_reference(sys.argv[1], sys.argv[2])} runs written to {sys.argv[2]}")
