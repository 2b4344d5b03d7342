"""The memory-options comparison's oracle line and fidelity panel (issue 26, item 4).

A sweep definition's group may name a research policy (``"policy": "oracle"``): its runs are the same timed
engine on the same pools with the policy in the cache, refused with one line where the group's options
cannot take one. The ``"kind": "memory"`` plot draws the options against memory with the oracle's line and
the checkpoint formats' measured fidelity beside them, and the report gives every option as a fraction of
the oracle on the same start-up pools.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mamba_radix.checkpoint_format import CHECKPOINT_FORMATS
from mamba_radix.data import definition_path
from mamba_radix.errors import ConfigError
from mamba_radix.policies.registry import PolicyContext, run_policy
from mamba_radix.sim.sweep import (
    DefinitionError,
    RunSpec,
    expand_definition,
    load_definition,
    policy_problem,
    run_one,
    spec_pools,
    synthetic_requests,
)

CHAT = {"generator": "chat", "seed": 0}
FIDELITY = definition_path("memory_options").parent / "memory_options.fidelity.jsonl"


def _definition(*groups: dict[str, Any], plots: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "trace": "mooncake_conversation_trace.jsonl",
        "base": {"mode": "timed", "mamba_radix_cache_strategy": "extra_buffer"},
        "groups": list(groups),
        "plots": plots or [],
    }


def _group(name: str, policy: str | None = "oracle", **fixed: Any) -> dict[str, Any]:
    group: dict[str, Any] = {"name": name, "synthetic": CHAT, "fixed": fixed, "vary": {"budget_gib": [2.0]}}
    if policy is not None:
        group["policy"] = policy
    return group


# ------------------------------------------------------------------------------------- policy runs
@pytest.fixture(scope="module")
def chat_runs() -> dict[str, dict[str, Any]]:
    """chat (120 requests) at 2 GiB, ratio 0.9: SGLang's rules and the oracle, the same timed engine."""
    specs = expand_definition(_definition(_group("lru", policy=None), _group("oracle")))
    return {s.group: run_one(s) for s in specs}


def test_a_policy_group_runs_the_policy_on_the_same_pools(chat_runs: dict[str, dict[str, Any]]) -> None:
    lru, oracle = chat_runs["lru"], chat_runs["oracle"]
    assert oracle["params"]["policy"] == "oracle"
    assert "policy" not in lru["params"]  # a run without one records what it did before
    assert oracle["pools"]["kv_tokens"] == lru["pools"]["kv_tokens"]
    assert oracle["pools"]["state_slots"] == lru["pools"]["state_slots"]
    # the oracle's decisions, not the config's: here they keep far more (state slots bind at 2 GiB)
    assert oracle["metrics"]["token_hit_rate"] > lru["metrics"]["token_hit_rate"] + 0.05
    # the same run as the registry's own replay in timed mode on those pools
    spec = RunSpec("x", "synthetic:chat:seed=0", synthetic=CHAT, budget_gib=2.0, options={"mode": "timed"},
                   config={"mamba_radix_cache_strategy": "extra_buffer"})  # fmt: skip
    requests = synthetic_requests(CHAT)
    pools = spec_pools(
        spec,
        spec.cache_config(),
        sum(r.input_len for r in requests),
        sum(r.output_len for r in requests),
        len(requests),
    )
    direct = run_policy(
        "oracle", spec.cache_config(), PolicyContext(requests, pools), mode="timed", verify_states=True
    )
    assert oracle["metrics"]["token_hit_rate"] == direct["token_hit_rate"]


def test_a_policy_group_is_not_merged_with_a_run_of_the_same_parameters() -> None:
    specs = expand_definition(_definition(_group("lru", policy=None), _group("oracle")))
    assert [(s.group, s.policy) for s in specs] == [("lru", None), ("oracle", "oracle")]


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (_group("g", policy="nope"), "group 'g': unknown policy 'nope'; known: sglang-0.5.20,"),
        (_group("g", policy=3), "group 'g': 'policy' must be a policy's name"),  # type: ignore[arg-type]
        (
            _group("g", enable_unified_memory=True),
            "group 'g': unified memory refuses research policy 'oracle': its give-way rule, not the policy,",
        ),
        (
            _group("g", host_memory_ratio=4.0),
            "group 'g': research policy 'oracle' cannot run with the host tier: its future uses ignore host hits",
        ),
        (
            _group("g", peer="sglang-0.5.20"),
            "group 'g': policy 'oracle' and peer 'sglang-0.5.20' both set the rules",
        ),
        (
            _group("g", mamba_eviction_order="root_first"),
            "group 'g': mamba_eviction_order conflicts with policy 'oracle' (it sets its own rules); drop one",
        ),
    ],
)
def test_a_policy_that_the_group_refuses_is_one_line_before_anything_runs(
    group: dict[str, Any], message: str
) -> None:
    definition = _definition(_group("fine", policy=None), group)
    before = copy.deepcopy(definition)
    with pytest.raises(DefinitionError) as err:
        expand_definition(definition)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(message), err.value.problems
    assert "\n" not in err.value.problems[0]
    assert definition == before  # nothing changed


def test_a_refused_spec_fails_validate_and_run_with_the_same_line() -> None:
    spec = RunSpec(
        "x", "synthetic:chat:seed=0", synthetic=CHAT, policy="oracle", config={"enable_unified_memory": True}
    )
    line = policy_problem(spec)
    assert line is not None and line.startswith("unified memory refuses research policy 'oracle'")
    for call in (spec.validate, lambda: run_one(spec)):
        with pytest.raises(ConfigError, match="unified memory refuses research policy"):
            call()
    assert (
        policy_problem(RunSpec("x", "t", policy="oracle", options={"split": {}})) is None
    )  # the split runs one


# ------------------------------------------------------------------------------ the bundled definition
def test_memory_options_adds_the_oracle_after_the_rows_it_had() -> None:
    path = definition_path("memory_options")
    definition = load_definition(path)
    specs = expand_definition(definition, path.parent, check_traces=True)
    oracle = [s for s in specs if s.policy == "oracle"]
    assert len(specs) == 204 and len(oracle) == 48
    assert {(s.budget_gib, s.mamba_full_memory_ratio) for s in oracle} == {
        (b, r) for b in (2.0, 4.0, 8.0) for r in (0.25, 0.9, 1.0, 3.0)
    }
    assert all(
        s.config.get("checkpoint_format", "model") == "model" and not s.options.get("split") for s in oracle
    )
    # the rows it had keep their run ids and parameters: the oracle groups come last
    without = copy.deepcopy(definition)
    without["groups"] = [g for g in without["groups"] if "policy" not in g]
    without["plots"] = []  # they name the oracle groups
    assert expand_definition(without, path.parent) == specs[: len(specs) - len(oracle)]
    for plot in definition["plots"]:
        assert plot["kind"] == "memory" and plot["oracle_group"].endswith("offline oracle (static split)")
        assert Path(plot["fidelity"]) == FIDELITY  # resolved to the bundled file


def test_the_fidelity_file_is_a_measured_run_of_every_format() -> None:
    from mamba_radix.experiment_report import load_fidelity

    rows = load_fidelity(FIDELITY)
    assert {(r["model"], r["format"]) for r in rows} == {
        (m, f) for m in ("kimi_linear", "qwen3_next") for f in CHECKPOINT_FORMATS
    }
    assert all(r["command"].startswith("python benchmarks/fidelity_quant.py --json") for r in rows)
    for r in rows:  # model-dtype checkpoints restore exactly (float noise); quantized ones do not
        assert (r["max_abs_dlogit_restore"] < 1e-5) == (r["format"] == "model")
        assert 0 < r["tokens_agree"] <= r["tokens"] and r["restores"] > 0


def test_a_bad_fidelity_file_is_one_line(tmp_path: Path) -> None:
    from mamba_radix.experiment_report import load_fidelity, memory_plot_problems

    bad = tmp_path / "f.jsonl"
    row = json.loads(FIDELITY.read_text().splitlines()[0])
    bad.write_text(json.dumps({**row, "tokens_agree": "all"}) + "\n")
    with pytest.raises(ConfigError, match=r"line 1: missing or mistyped tokens_agree; re-make it"):
        load_fidelity(bad)
    groups = [_group("opt", policy=None), _group("orc")]
    plot = {
        "kind": "memory",
        "file": "p.png",
        "groups": ["opt", "orc"],
        "oracle_group": "orc",
        "fidelity": str(bad),
    }
    assert memory_plot_problems(0, plot, groups) == [
        f"plot 0 ('p.png'): fidelity file {bad} line 1: missing or mistyped tokens_agree; re-make it with "
        "benchmarks/fidelity_quant.py --json"
    ]
    plot.update(fidelity=str(FIDELITY), oracle_group="opt", colour="red")
    assert memory_plot_problems(0, plot, groups) == [
        "plot 0 ('p.png'): unknown key 'colour'; known: fidelity, file, groups, kind, oracle_group, series, "
        "title, where, x, xlabel",
        "plot 0 ('p.png'): oracle_group 'opt' runs no policy; give the group \"policy\": \"oracle\"",
    ]


def test_a_copied_definition_finds_the_bundled_fidelity_file(tmp_path: Path) -> None:
    copied = tmp_path / "mine.json"
    copied.write_text(definition_path("memory_options").read_text())
    assert Path(load_definition(copied)["plots"][0]["fidelity"]) == FIDELITY
    (tmp_path / "memory_options.fidelity.jsonl").write_text(FIDELITY.read_text())
    assert Path(load_definition(copied)["plots"][0]["fidelity"]) == tmp_path / "memory_options.fidelity.jsonl"


# ------------------------------------------------------------------------------------------ the report
def test_the_report_gives_each_option_as_a_fraction_of_the_oracle_on_the_same_pools(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from mamba_radix.experiment_report import memory_section

    groups = [
        {"name": "chat: static", "synthetic": CHAT, "vary": {"budget_gib": [2.0, 4.0], "mamba_full_memory_ratio": [0.9, 3.0]}},
        {"name": "chat: oracle", "synthetic": CHAT, "policy": "oracle",
         "vary": {"budget_gib": [2.0, 4.0], "mamba_full_memory_ratio": [0.9]}},
    ]  # fmt: skip
    records = [run_one(s) for s in expand_definition(_definition(*groups))]
    spec = {"kind": "memory", "file": "m.png", "title": "chat", "groups": ["chat: static", "chat: oracle"],
            "oracle_group": "chat: oracle", "where": {"mamba_full_memory_ratio": [3.0, 0.9]},
            "xlabel": "KV + state memory per rank (GiB)", "fidelity": str(FIDELITY)}  # fmt: skip
    lines = memory_section(records, spec, tmp_path)
    assert (tmp_path / "m.png").stat().st_size > 10_000
    hit = {
        (r["params"]["group"], r["params"]["budget_gib"], r["params"]["mamba_full_memory_ratio"]): r[
            "metrics"
        ]["token_hit_rate"]
        for r in records
    }
    row = next(line for line in lines if line.startswith("| static | 0.9 | model |"))
    for budget, cell in zip((2.0, 4.0), row.split(" | ")[3:], strict=True):
        mine, oracle = hit[("chat: static", budget, 0.9)], hit[("chat: oracle", budget, 0.9)]
        assert cell.strip(" |") == f"{100 * mine:.2f} % ({mine / oracle:.2f})"
    # no oracle on the ratio-3 pools: a hit rate without a fraction (never one against other pools)
    row3 = next(line for line in lines if line.startswith("| static | 3.0 | model |"))
    assert "(" not in row3
    assert any(line.startswith("| oracle | 0.9 | model |") for line in lines)
    # the fidelity table: every measured row, with the command that made it
    table = [
        line for line in lines if line.startswith("| kimi_linear |") or line.startswith("| qwen3_next |")
    ]
    assert len(table) == len(FIDELITY.read_text().splitlines())
    assert any("Command: `python benchmarks/fidelity_quant.py --json" in line for line in lines)


def test_the_plot_marks_the_oracle_and_labels_its_axes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mamba_radix import experiment_report

    groups = [
        {"name": "chat: static", "synthetic": CHAT, "vary": {"budget_gib": [2.0, 4.0], "mamba_full_memory_ratio": [3.0]}},
        {"name": "chat: oracle", "synthetic": CHAT, "policy": "oracle",
         "vary": {"budget_gib": [2.0, 4.0], "mamba_full_memory_ratio": [3.0]}},
    ]  # fmt: skip
    records = [run_one(s) for s in expand_definition(_definition(*groups))]
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at it
    spec = {"kind": "memory", "file": "m.png", "groups": ["chat: static"], "oracle_group": "chat: oracle",
            "xlabel": "KV + state memory per rank (GiB)", "fidelity": str(FIDELITY)}  # fmt: skip
    assert experiment_report.memory_plot(records, spec, tmp_path / "m.png")
    hit_ax, err_ax, agree_ax = figures[0].axes[:3]
    labels = hit_ax.get_legend_handles_labels()[1]
    assert "offline oracle (static split, ratio 3.0, model checkpoints)" in labels
    oracle_line = next(line for line in hit_ax.get_lines() if line.get_label().startswith("offline oracle"))
    oracle_hits = sorted(100 * r["metrics"]["token_hit_rate"] for r in records if r["params"].get("policy"))
    assert sorted(oracle_line.get_ydata()) == pytest.approx(oracle_hits)
    # visible, and underneath the options' lines (which reach it where memory suffices)
    assert oracle_line.get_visible() and oracle_line.get_color() == "black"
    assert all(
        oracle_line.get_zorder() < line.get_zorder()
        for line in hit_ax.get_lines()
        if line.get_marker() != "None"
    )
    assert hit_ax.get_ylim() == (0, 100) and hit_ax.get_ylabel() == "token hit rate (%)"
    assert hit_ax.get_xlabel() == "KV + state memory per rank (GiB) (log scale)"
    assert "logit units" in err_ax.get_xlabel() and err_ax.get_xscale() == "log"
    assert agree_ax.get_xlim() == (0, 100) and "(%)" in agree_ax.get_xlabel()
    # one bar per measured row: its restore error, its agreement
    rows = [json.loads(line) for line in FIDELITY.read_text().splitlines()]
    assert sorted(b.get_width() for b in err_ax.patches) == pytest.approx(
        sorted(r["max_abs_dlogit_restore"] for r in rows)
    )
    assert sorted(b.get_width() for b in agree_ax.patches) == pytest.approx(
        sorted(100 * r["tokens_agree"] / r["tokens"] for r in rows)
    )
