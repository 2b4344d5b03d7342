"""Seed 001's tuning loop (issue 30): the load test sizes its pools as ``plan`` does, ReplaySSM rings and
the verify window included (81 slots and a cap of 16 running requests bound by the state slots, not 138 and
27); ``simulate`` prints TTFT once; a definition cannot sweep the scheduler log's writer; and the loop's bad
input is a one-line error with exit code 2 before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix.capacity import resolve_pools
from mamba_radix.cli import main
from mamba_radix.config import CacheConfig
from mamba_radix.defaults import deployment_for
from mamba_radix.errors import ConfigError
from mamba_radix.sim.budget import pools_for_budget, sizing_inputs
from mamba_radix.sim.sweep import DefinitionError, expand_definition

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "docs" / "examples" / "seed-kimi-k3.json"  # seed 001 section 3.2, as the seed prints it
BUDGET = ["--memory-budget-gb", "28.76"]  # the budget at which the seed's logs show 80-81 slots
SEED_LOAD = ["--dataset-name", "random", "--random-input-len", "16384", "--random-output-len", "3072",
             "--num-prompts", "128", "--max-concurrency", "32", "--request-rate", "4"]  # fmt: skip


def _plan(capsys: pytest.CaptureFixture[str], *extra: str, settings_file: Path = SEED) -> dict[str, Any]:
    assert main(["plan", "--config", str(settings_file), *BUDGET, "--json", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, settings_file: Path = SEED
) -> tuple[dict[str, Any], str]:
    out = tmp_path / "run.jsonl"
    argv = ["simulate", *SEED_LOAD, "--config", str(settings_file), *BUDGET, "--cost-preset", "kimi-k3-8xh200",
            "--quiet", "--out", str(out), "--force", *extra]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    return json.loads(out.read_text()), err


def test_the_seeds_load_test_is_capped_at_16_by_the_state_slots_as_plan_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(capsys)
    assert (plan["max_mamba_cache_size"], plan["max_running_requests"], plan["binding"]) == (
        81,
        16,
        "mamba state cache",
    )
    rec, err = _simulate(tmp_path, capsys)
    pools, m = rec["pools"], rec["metrics"]
    # the planner's sizing, rings included: the same slots, tokens and bytes per slot
    assert pools["state_slots"] == plan["max_mamba_cache_size"] == 81
    assert pools["kv_tokens"] == plan["num_tokens"]
    assert pools["bytes_per_state_slot"] == plan["bytes_per_slot_per_gpu"]
    assert pools["max_running_requests_effective"] == 16
    assert m["peak_running"] == 16 and m["peak_running_bound_by"] == "state_slots"
    assert m["completed_requests"] == 128
    p = rec["params"]
    assert (p["enable_linear_replayssm_spec"], p["linear_replayssm_cache_len"]) == (True, 16)
    assert p["speculative_num_draft_tokens"] == 8  # DSpark's gamma 7: 1 anchor + 7 drafts
    # sizing only, and said so; the settings are no longer listed as ignored
    assert "sizing only: enable_linear_replayssm_spec=True" in err
    assert "speculative decoding itself is not simulated" in err
    assert "ignored (no effect on what simulate models): cuda_graph_max_bs_decode\n" in err


@pytest.mark.parametrize(
    ("dropped", "slots", "running"),
    [
        # no speculative decoding: what simulate sized before it read the rings
        (
            ("enable_linear_replayssm_spec", "speculative_dspark_block_size", "linear_replayssm_cache_len"),
            138,
            27,
        ),
        # plain speculative decoding (8 verify tokens, no rings): intermediate states reserved per request
        (("enable_linear_replayssm_spec", "linear_replayssm_cache_len"), 53, 10),
    ],
)
def test_the_speculative_settings_change_the_slots_in_both(
    dropped: tuple[str, ...], slots: int, running: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(
        json.dumps({k: v for k, v in json.loads(SEED.read_text()).items() if k not in dropped})
    )
    plan = _plan(capsys, settings_file=settings_file)
    rec, _ = _simulate(tmp_path, capsys, settings_file=settings_file)
    assert rec["pools"]["state_slots"] == plan["max_mamba_cache_size"] == slots
    assert rec["pools"]["max_running_requests_effective"] == plan["max_running_requests"] == running
    assert rec["metrics"]["peak_running"] == running


def test_the_skip_decode_lock_switch_runs_20_and_shows_its_risk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1: 4 slots per request, so 81 slots run 20; checkpoints of running
    requests become evictable, and the summary counts those evicted while their request decoded."""
    monkeypatch.setenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "1")
    argv = [
        "simulate",
        *SEED_LOAD,
        "--config",
        str(SEED),
        *BUDGET,
        "--cost-preset",
        "kimi-k3-8xh200",
        "--quiet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "81 state slots, max running 20" in out and "peak running        20 (bound by state_slots" in out
    assert "while their request decoded" in out
    monkeypatch.delenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "81 state slots, max running 16" in out and "while their request decoded" not in out


KIMI = deployment_for("kimi-k3", tp_size=8, kv_cache_dtype="fp8_e4m3", mamba_ssm_dtype="bfloat16")


@settings(max_examples=25, deadline=None)
@given(
    ratio=st.floats(0.05, 3.0),
    budget=st.floats(4.0, 60.0),
    rings=st.booleans(),
    ring_len=st.sampled_from([16, 32, 64]),
    draft=st.sampled_from([0, 2, 4, 8]),
)
def test_the_simulators_pools_are_the_planners(
    ratio: float, budget: float, rings: bool, ring_len: int, draft: int
) -> None:
    """pools_for_budget is resolve_pools of the same inputs: slots, tokens and bytes per slot, for ReplaySSM
    rings on or off and plain speculative decoding's intermediate states (draft > 0 without rings)."""
    config = CacheConfig(chunked_prefill_size=6144, speculative_num_draft_tokens=draft)
    keys = {"enable_linear_replayssm_spec": rings, "linear_replayssm_cache_len": ring_len}
    try:
        res = resolve_pools(sizing_inputs(config, "kimi-k3", budget, ratio, None, KIMI, **keys))
    except ConfigError:
        with pytest.raises(ConfigError):
            pools_for_budget(config, budget, ratio, None, "kimi-k3", KIMI, **keys)
        return
    if res.num_slots // config.slots_per_request < 1:
        return  # the simulator refuses a budget that runs nothing (its own rule, tested elsewhere)
    pools = pools_for_budget(config, budget, ratio, None, "kimi-k3", KIMI, **keys)
    assert (pools.state_slots, pools.kv_tokens, pools.bytes_per_state_slot) == (
        res.num_slots,
        res.num_tokens,
        res.bytes_per_slot,
    )
    assert pools.max_running_requests == res.num_slots // config.slots_per_request


@pytest.mark.parametrize("mode", [[], ["--mode", "sequential"]])
def test_ttft_is_printed_once(mode: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--synthetic", "chat", "--limit", "12", "--quiet", *mode]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    ttft = [line for line in lines if line.startswith("TTFT")]
    assert len(ttft) == 1, lines
    assert ("median" in ttft[0] and "p90" in ttft[0]) if not mode else "simulated" in ttft[0]


def test_the_json_output_keeps_both_ttft_forms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--synthetic", "chat", "--limit", "12", "--quiet", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["ttft_median_ms"] == pytest.approx(1000.0 * m["ttft_p50_s"])
    assert {"ttft_p90_s", "ttft_p99_s", "ttft_mean_ms", "ttft_p99_ms"} <= set(m)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("log", "print", ("'log' cannot be set", "callable")),
        ("log_every", 10, ("'log_every' cannot be set", "--log-every")),
        ("cost", {"decode_step_s": 0.1}, ("'cost' cannot be set", "decode_step_s")),
    ],
)
def test_a_definition_cannot_set_the_scheduler_log(key: str, value: Any, words: tuple[str, ...]) -> None:
    definition = {
        "trace": "synthetic:chat",
        "groups": [{"name": "g", "synthetic": {"generator": "chat"}, "fixed": {key: value}}],
    }
    with pytest.raises(DefinitionError) as err:
        expand_definition(definition)
    (problem,) = err.value.problems
    for w in words:
        assert w in problem, problem


def test_sweep_refuses_a_definition_that_sets_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definition = tmp_path / "d.json"
    definition.write_text(
        json.dumps(
            {
                "trace": "synthetic:chat",
                "groups": [{"name": "g", "synthetic": {"generator": "chat"}, "vary": {"log_every": [0, 10]}}],
            }
        )
    )
    out = tmp_path / "r.jsonl"
    assert main(["sweep", "--definition", str(definition), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'log_every' cannot be set in a definition or swept" in err, err
    assert not out.exists()


def test_a_definition_sweeps_the_ring_settings() -> None:
    """The sizing inputs are run parameters: a definition may set and sweep them, and they size the pools."""
    definition = {
        "trace": "synthetic:chat",
        "base": {"chunked_prefill_size": 6144, "speculative_num_draft_tokens": 8, "budget_gib": 28.76},
        "groups": [
            {
                "name": "rings",
                "synthetic": {"generator": "chat"},
                "fixed": {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": "bfloat16"},
                "vary": {"enable_linear_replayssm_spec": [False, True], "mamba_full_memory_ratio": [0.15]},
            }
        ],
    }
    from mamba_radix.sim.sweep import spec_pools

    specs = expand_definition(definition)
    slots = [spec_pools(s, s.cache_config(), 0, 0, 0).state_slots for s in specs]
    assert slots == [53, 81]  # plain speculative decoding reserves intermediate states; ReplaySSM its rings
    assert all("log" not in s.params() for s in specs)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--request-rate", "0"], ("--request-rate", "> 0")),
        (["--request-rate", "-1"], ("--request-rate", "> 0")),
        (["--max-concurrency", "0"], ("--max-concurrency", "from 1")),
        (["--random-range-ratio", "1.01"], ("--random-range-ratio", "<= 1")),
        (["--random-range-ratio", "-0.1"], ("--random-range-ratio", ">= 0")),
        (["--linear-replayssm-cache-len", "12"], ("--linear-replayssm-cache-len", "power of two")),
    ],
)
def test_the_loops_bad_input_is_one_line_exit_2_and_runs_nothing(
    extra: list[str], words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.jsonl"
    argv = ["simulate", *SEED_LOAD, "--config", str(SEED), *BUDGET, "--quiet", "--out", str(out), *extra]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if "ignored (no effect" not in line]
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    for w in words:
        assert w in err[0], err[0]
    assert not out.exists() and captured.out == ""


def test_a_typod_config_key_is_one_line_exit_2_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(SEED.read_text().replace('"mamba_track_interval"', '"mamba_track_intervall"'))
    out = tmp_path / "run.jsonl"
    argv = ["simulate", *SEED_LOAD, "--config", str(settings_file), "--quiet", "--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == "", captured.err
    assert "mamba_track_intervall" in captured.err and "did you mean mamba_track_interval?" in captured.err
    assert not out.exists()
