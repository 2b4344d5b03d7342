"""Reports that do not mislead: zoomed axes marked, no single-series legends, flag names on axes,
"no cap" set apart, the KV axis labelled with what it counts; and the comparison with reference results."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mamba_radix.sim import report  # noqa: E402
from mamba_radix.sim.sweep import RunSpec, run_sweep  # noqa: E402


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    specs = [
        RunSpec(run_id=f"{i:03d}", trace="synthetic:chat", synthetic={"generator": "chat", "seed": 1}, limit=8,
                options={"mode": "sequential"}, budget_gib=2.0, config={"mamba_max_states_per_path": cap})
        for i, cap in enumerate((-1, 1, 4))
    ]  # fmt: skip
    return run_sweep(specs, jobs=1)


def _texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_a_zoomed_y_axis_says_so() -> None:
    _, ax = plt.subplots()
    ax.plot([0, 1], [4.64, 4.82])
    ax.set_ylim(4.6, 4.9)
    report._mark_zoomed_y(ax, 100.0)
    assert any("y axis zoomed: starts at 4.6%, not 0" in t for t in _texts(ax))
    _, ax2 = plt.subplots()
    ax2.plot([0, 1], [0, 4.82])
    ax2.set_ylim(0, 5)
    report._mark_zoomed_y(ax2, 100.0)
    assert not _texts(ax2)
    plt.close("all")


def test_line_plot_single_series_no_legend_no_cap_last_and_labelled(
    records: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Any] = []
    real_savefig = plt.Figure.savefig

    def keep(fig: Any, *args: Any, **kw: Any) -> None:
        drawn.append(fig)
        real_savefig(fig, *args, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    spec = {"kind": "line", "file": "cap.png", "x": "mamba_max_states_per_path", "categorical": True,
            "series": ["strategy"], "references": False}  # fmt: skip
    assert report._line_plot(records, spec, tmp_path / "cap.png")
    ax = drawn[0].axes[0]
    assert ax.get_legend() is None  # one series: nothing to tell apart
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "no cap (-1)"]
    assert ax.get_xlabel() == "--mamba-max-states-per-path (categories, not to scale)"
    # a dashed rule sets "no cap" apart from the numbers
    assert any(line.get_linestyle() == "--" and list(line.get_xdata()) == [1.5, 1.5] for line in ax.lines)


def test_pressure_plot_labels_owed_kv_and_draws_the_pool(
    records: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Any] = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    spec = {"kind": "pressure", "file": "p.png", "series": ["mamba_max_states_per_path"]}
    assert report._pressure_plot(records, spec, tmp_path / "p.png")
    ax_kv = drawn[0].axes[0]
    assert "owed" in ax_kv.get_ylabel()
    assert "pool size" in _texts(ax_kv)
    assert ax_kv.get_legend().get_title().get_text() == "--mamba-max-states-per-path"


def test_reference_comparison(records: list[dict[str, Any]]) -> None:
    same = report.reference_comparison(records, copy.deepcopy(records), "ref.jsonl")
    assert same[0].startswith("3 of 3 runs identical to the reference (ref.jsonl")
    changed = copy.deepcopy(records)
    changed[1]["metrics"]["cached_tokens"] += 1
    changed[1]["metrics"]["token_hit_rate"] -= 0.01
    lines = report.reference_comparison(records, changed, "ref")
    assert lines[0].startswith("2 of 3 runs identical")
    assert any(line.startswith("| 001 |") and "+1.00 | differs |" in line for line in lines)
    other = copy.deepcopy(records)
    for r in other:
        r["params"]["limit"] = 10_000
    (line,) = report.reference_comparison(records, other, "ref")
    assert "not comparable" in line and "10000" in line


def test_write_report_includes_the_comparison_and_the_refresh_column(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = report.write_report(records, tmp_path, reference=records, reference_name="ref.jsonl")
    text = path.read_text()
    assert "## Compared with the reference" in text and "3 of 3 runs identical" in text
    all_runs = text[text.index("## All runs") :]
    assert "| run | group | strategy | evict | refresh | cap |" in all_runs


def test_write_reference_drops_time_series_and_compares_identical(
    records: list[dict[str, Any]], tmp_path: Path
) -> None:
    import json

    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))
    assert report.write_reference(results, tmp_path / "ref.jsonl") == 3
    ref = report.load_records(tmp_path / "ref.jsonl")
    assert [r["run_id"] for r in ref] == ["000", "001", "002"] and not any("timeseries" in r for r in ref)
    assert report.reference_comparison(records, ref, "ref")[0].startswith("3 of 3 runs identical")


def test_the_bundled_reference_matches_the_committed_reference_run() -> None:
    from mamba_radix.data import data_path

    repo = Path(__file__).resolve().parents[1]
    for name in ("sglang-knobs", "peers"):
        full = report.load_records(repo / "experiments" / "reference" / name / "results.jsonl")
        bundled = report.load_records(data_path("experiments", f"{name}.reference.jsonl"))
        for r in full:
            r.pop("timeseries", None)
        assert sorted(full, key=lambda r: r["run_id"]) == bundled, name


def test_match_reference_keeps_order_and_counts_a_wrong_counterpart_as_none() -> None:
    """The one matching rule both reports use (:mod:`mamba_radix.sim.reference`): each run in order,
    the last reference record of its key, none where ``counterpart`` refuses it."""
    from mamba_radix.sim.reference import match_reference

    runs = [{"k": 2, "v": 1, "pool": 8}, {"k": 1, "v": 5, "pool": 8}, {"k": 3, "v": 0, "pool": 8}]
    ref = [{"k": 1, "v": 4, "pool": 8}, {"k": 1, "v": 5, "pool": 8}, {"k": 2, "v": 1, "pool": 9}]
    got = match_reference(
        runs,
        ref,
        key=lambda r: r["k"],
        identical=lambda r, b: r["v"] == b["v"],
        counterpart=lambda r, b: r["pool"] == b["pool"],
    )
    assert [m.run["k"] for m in got] == [2, 1, 3]
    assert [m.reference for m in got] == [None, ref[1], None]
    assert [m.identical for m in got] == [False, True, False]
    plain = match_reference(runs, ref, key=lambda r: r["k"], identical=lambda r, b: r["v"] == b["v"])
    assert [m.reference for m in plain] == [ref[2], ref[1], None]
    assert [m.identical for m in plain] == [True, True, False]
