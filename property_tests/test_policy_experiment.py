"""The main job (:mod:`mamba_radix.experiment`): its definition, its memory points at equal bytes, a tiny
run end to end (rows, report, plots, progress in requests), the report's arithmetic, and the committed
reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mamba_radix import experiment as ex
from mamba_radix import experiment_report as rep
from mamba_radix.data import definition_path
from mamba_radix.policies.registry import POLICIES
from mamba_radix.sim.sweep import DefinitionError

REPO = Path(__file__).resolve().parents[1]


def _tiny(limit: int = 10, workloads: tuple[str, ...] = ("chat", "tree"), policies: tuple[str, ...] = ("sglang-0.5.23", "sift", "oracle")) -> ex.PolicyExperiment:  # fmt: skip
    return ex.load_policy_definition(definition_path("default")).with_limit(limit).only(workloads, policies)


# ------------------------------------------------------------------------------------------ definition
def test_the_bundled_default_compares_every_registered_policy_on_five_workloads() -> None:
    e = ex.load_policy_definition(definition_path("default"))
    assert e.policies == tuple(POLICIES) and "oracle" in e.policies
    assert [w.name for w in e.workloads] == ["conversation", "chat", "system-prompt", "agent", "tree"]
    conv = e.workloads[0]
    assert (
        conv.limit == 2000
        and conv.slot_points == (64, 256, 1024, 4096, 16384)
        and conv.kv_fractions[-1] == 1.0
    )
    assert ex.is_policy_definition(definition_path("default"))
    assert not ex.is_policy_definition(definition_path("sglang-knobs"))


def test_a_definition_with_problems_names_each_on_its_own_line(tmp_path: Path) -> None:
    bad = {
        "kind": "policies",
        "policies": ["sift", "lru-9000"],
        "bogus": 1,
        "workloads": [
            {"name": "a", "synthetic": {"generator": "forest"}, "slots_bind": {"state_slots": [2]},
             "kv_binds": {"kv_fractions": [0.5]}},
            {"name": "b", "trace": "no_such.jsonl", "slots_bind": {"state_slots": [8]},
             "kv_binds": {"kv_fractions": [0, 2]}},
            {"name": "c", "synthetic": {"generator": "chat", "args": {"bogus": 1}},
             "slots_bind": {"state_slots": [8]}, "kv_binds": {"kv_fractions": [0.5]}},
        ],
    }  # fmt: skip
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DefinitionError) as err:
        ex.load_policy_definition(path)
    problems = err.value.problems
    text = "\n".join(problems)
    for words in (
        "unknown key 'bogus'",
        "unknown policy 'lru-9000'",
        "must include 'oracle'",
        "workload 'a': 'synthetic' must be",
        "workload 'b': trace file not found",
        "kv_fractions must be a non-empty list of numbers in (0, 1]",
        "workload 'c': synthetic args: got an unexpected keyword argument 'bogus'",
    ):
        assert words in text, (words, problems)
    assert len(problems) == len(set(problems)) >= 7


def test_only_and_with_limit_cut_the_experiment_and_refuse_unknown_names() -> None:
    e = _tiny(limit=7)
    assert [w.name for w in e.workloads] == ["chat", "tree"] and all(w.limit == 7 for w in e.workloads)
    assert e.policies == ("sglang-0.5.23", "sift", "oracle")
    from mamba_radix.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown workload 'forest'"):
        e.only(["forest"], None)


# ------------------------------------------------------------------------------------- memory points
def test_memory_points_are_equal_bytes_and_bind_the_pool_they_say() -> None:
    e = _tiny(limit=30)
    for w in e.workloads:
        requests = ex.load_requests(w)
        points = ex.memory_points(w, requests, e.model)
        every = ex.workload_tokens(requests) + 1
        slots, kv = points["slots bind"], points["KV binds"]
        # slots bind: the KV pool holds every token (never evicts); the slots are the definition's points
        assert [p.kv_tokens for p in slots] == [every] * len(slots)
        assert [p.state_slots for p in slots] == list(w.slot_points)
        # KV binds: slots for every request; KV pools increasing, never beyond every token, none rejects
        assert len({p.state_slots for p in kv}) == 1 and kv[0].state_slots >= 3 * len(requests)
        sizes = [p.kv_tokens for p in kv]
        assert sizes == sorted(set(sizes)) and sizes[-1] <= every
        assert sizes[0] > max(r.input_len + r.output_len for r in requests)
        for p in slots + kv:  # bytes through the capacity module: the same for every policy at a point
            assert p.budget_gib * (1 << 30) == pytest.approx(
                p.kv_tokens * p.bytes_per_kv_token + p.state_slots * p.bytes_per_state_slot
            )


# ------------------------------------------------------------------------------------ a tiny real run
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("tiny") / "run"
    info = ex.run_policy_experiment(_tiny(), folder, processes=1, quiet=True, command="tiny")
    rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    return folder, info, rows


def test_a_tiny_run_writes_one_row_per_point_and_policy(tiny_run: tuple[Path, dict[str, Any], list[dict[str, Any]]]) -> None:  # fmt: skip
    folder, info, rows = tiny_run
    e = _tiny()
    _, plan = ex.plan_tasks(e)
    assert len(rows) == len(plan) * len(e.policies) and info["runs"] == len(rows) + len(e.workloads)
    assert {(r["workload"], r["regime"], r["point"], r["policy"]) for r in rows} == {
        (w.name, regime, i, p) for w, regime, i, _ in plan for p in e.policies
    }
    assert rows == sorted(rows, key=ex.row_order(e))
    for r in rows:
        # nothing beats the cache's own ceiling, nor the trace's
        assert r["token_hit_rate"] <= r["infinite_hit_rate"] + 1e-12 <= r["ideal_hit_rate"] + 2e-12
    # where KV does not bind the oracle is optimal: no online policy beats it
    assert not [r for r in rep.oracle_exceeded(rows) if r["regime"] == "slots bind"]
    report = (folder / "report.md").read_text()
    for section in ("## Each policy as a fraction of the oracle", "## Gap to the oracle closed, against sglang-0.5.23",
                    "## Hit rates at every point", "## Where an online policy beats the oracle",
                    "## Compared with the reference", "### chat, slots bind: KV fixed at"):  # fmt: skip
        assert section in report, section
    assert "| chat | slots bind | 5 |" in report and "1.00 (1.00) |" in report  # the oracle's own cell
    for png in ("chat.png", "tree.png", "overview.png"):
        assert (folder / png).stat().st_size > 5000 and f"![{png}]({png})" in report
    # the reference has 120 chat requests, this run 10: said, not compared
    assert "Not comparable on chat (10 requests here" in report


def test_processes_do_not_change_the_results_and_progress_counts_requests(
    tiny_run: tuple[Path, dict[str, Any], list[dict[str, Any]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, rows = tiny_run
    e = _tiny()
    ex.run_policy_experiment(e, tmp_path / "two", processes=2, quiet=False, every_s=1e6)
    two = [json.loads(x) for x in (tmp_path / "two" / "results.jsonl").read_text().splitlines()]
    key = ("workload", "regime", "point", "policy", "kv_tokens", "state_slots", "token_hit_rate")
    assert [tuple(r[k] for k in key) for r in two] == [tuple(r[k] for k in key) for r in rows]
    err = capsys.readouterr().err
    total = sum(r["requests"] for r in rows) + 10 * len(e.workloads)  # every run, the demand passes included
    assert f"{total:,}/{total:,} requests (100.0%)" in err and f"{len(rows) + 2}/{len(rows) + 2} runs" in err


def test_the_core_runs_the_experiment_without_matplotlib(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None\n"
        "from mamba_radix import experiment as ex\n"
        "from mamba_radix.data import definition_path\n"
        "e = ex.load_policy_definition(definition_path('default')).with_limit(5).only(['agent'], ['sglang-0.5.23', 'oracle'])\n"
        f"ex.run_policy_experiment(e, {str(tmp_path / 'r')!r}, processes=1, quiet=True)\n"
        "assert 'matplotlib' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "report.md").is_file() and not list((tmp_path / "r").glob("*.png"))


# ------------------------------------------------------------------------------ the report's arithmetic
def _row(
    workload: str, regime: str, point: int, policy: str, hit: float, requests: int = 100
) -> dict[str, Any]:
    return {"workload": workload, "regime": regime, "point": point, "policy": policy, "token_hit_rate": hit,
            "kv_tokens": 1000 * (point + 1), "state_slots": 64, "requests": requests}  # fmt: skip


def test_fractions_gap_closed_and_oracle_exceeded_by_hand() -> None:
    rows = [
        _row("w", "slots bind", 0, "sglang-0.5.23", 0.2), _row("w", "slots bind", 0, "sift", 0.3),
        _row("w", "slots bind", 0, "oracle", 0.4),
        _row("w", "slots bind", 1, "sglang-0.5.23", 0.5), _row("w", "slots bind", 1, "sift", 0.45),
        _row("w", "slots bind", 1, "oracle", 0.5),
        _row("w", "KV binds", 0, "sglang-0.5.23", 0.1), _row("w", "KV binds", 0, "sift", 0.25),
        _row("w", "KV binds", 0, "oracle", 0.2),
    ]  # fmt: skip
    fr = rep.fractions(rows)
    assert fr[("w", "slots bind", "sift")] == pytest.approx([0.75, 0.9])
    assert fr[("w", "slots bind", "oracle")] == [1.0, 1.0]
    closed, below = rep.gap_closed(rows)[("w", "slots bind", "sift")]
    assert closed == pytest.approx([0.5]) and below == 1  # point 1: no gap to close, and sift is below
    assert rep.gap_closed(rows)[("w", "KV binds", "sift")][0] == pytest.approx([1.5])
    (beat,) = rep.oracle_exceeded(rows)
    assert (beat["regime"], beat["policy"], beat["oracle"]) == ("KV binds", "sift", 0.2)


def test_reference_comparison_counts_identical_runs_and_lists_the_others() -> None:
    rows = [_row("w", "slots bind", i, "sift", 0.1 * i) for i in range(3)]
    ref = [dict(r) for r in rows]
    ref[2]["token_hit_rate"] = 0.25
    lines = rep.reference_comparison(rows, ref, "ref.jsonl")
    assert lines[0].startswith("2 of 3 runs identical") and any(
        "| 2 | sift | 0.2000 | 0.2500 | -0.0500 |" in x for x in lines
    )
    assert rep.reference_comparison(rows, [dict(r, requests=7) for r in ref], "r")[0].startswith(
        "Not comparable on w"
    )
    assert rep.reference_comparison(rows, None, "x (not found)") == [
        "Reference x (not found): no comparison."
    ]


# ------------------------------------------------------------------------------------- the reference
def test_the_bundled_reference_is_the_committed_reference_run(tmp_path: Path) -> None:
    committed = REPO / "experiments" / "reference" / "default"
    ex.write_reference(committed / "results.jsonl", tmp_path / "ref.jsonl")
    bundled = definition_path("default").parent / "default.reference.jsonl"
    assert (tmp_path / "ref.jsonl").read_text() == bundled.read_text()
    info = json.loads((committed / "run_info.json").read_text())
    assert info["command"] == "python experiments/policies.py --update-reference"
    rows = [json.loads(x) for x in (committed / "results.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rows} == set(info["policies"]) and info["workloads"]["conversation"][
        "requests"
    ] == 2000


def test_the_target_check_writes_its_table(tmp_path: Path) -> None:
    folder = ex.run_conversation_target(
        tmp_path / "t",
        requests=30,
        kv_tokens=200_000,
        slots=(16,),
        policies=("sglang-0.5.23", "sift", "oracle"),
        quiet=True,
    )
    rows = [json.loads(x) for x in (folder / "target.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["sglang-0.5.23", "sift", "oracle"]
    assert (
        max(r["token_hit_rate"] for r in rows) == rows[-1]["token_hit_rate"]
    )  # KV does not bind: oracle on top
    assert "| 16 |" in (folder / "target.md").read_text()


def test_a_failing_run_stops_the_workers_and_propagates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run that raises is a bug: the error reaches the caller, and no worker process is left behind."""
    import multiprocessing

    import mamba_radix.policies.registry as registry

    def broken(name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError(f"policy {name} broke")

    if sys.platform == "darwin":
        pytest.skip("workers are spawned there and do not inherit the patch")
    monkeypatch.setattr(registry, "run_policy", broken)  # the forked workers inherit the patch
    with pytest.raises(RuntimeError, match="broke"):
        ex.run_policy_experiment(
            _tiny(limit=5, workloads=("agent",)), tmp_path / "r", processes=2, quiet=True
        )
    assert not multiprocessing.active_children()


def test_rerunning_one_policy_replaces_its_rows_and_keeps_the_others(
    tiny_run: tuple[Path, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    import shutil

    folder, _, rows = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    marked = [dict(r, token_hit_rate=-1.0) if r["policy"] == "sift" else r for r in rows]  # stale sift rows
    (copy / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in marked))
    info = ex.rerun_policies(copy, _tiny(), ["sift"], processes=1, quiet=True, command="rerun sift")
    merged = [json.loads(x) for x in (copy / "results.jsonl").read_text().splitlines()]
    key = ("workload", "regime", "point", "policy", "token_hit_rate")
    assert [tuple(r[k] for k in key) for r in merged] == [tuple(r[k] for k in key) for r in rows]
    assert info["reruns"][-1]["policies"] == ["sift"] and info["reruns"][-1]["command"] == "rerun sift"
    assert "Re-run since: sift (`rerun sift`" in (copy / "report.md").read_text()
    from mamba_radix.errors import ConfigError

    with pytest.raises(ConfigError, match="re-run the whole experiment"):
        ex.rerun_policies(copy, _tiny(limit=7), ["sift"], processes=1, quiet=True)
    with pytest.raises(ConfigError, match="must be some of"):
        ex.rerun_policies(copy, _tiny(), ["marconi"], processes=1, quiet=True)


def test_a_policy_new_to_the_folder_joins_in_the_definitions_order(
    tiny_run: tuple[Path, dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    import shutil

    folder, _, rows = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    info = json.loads((copy / "run_info.json").read_text())
    info["policies"] = [p for p in info["policies"] if p != "sift"]  # a folder made before sift existed
    (copy / "run_info.json").write_text(json.dumps(info))
    (copy / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["policy"] != "sift"))
    merged = ex.rerun_policies(copy, _tiny(), ["sift"], processes=1, quiet=True)
    assert merged["policies"] == ["sglang-0.5.23", "sift", "oracle"]  # not appended after the oracle
