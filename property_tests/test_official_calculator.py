"""The official calculator (SGLang's compute-mamba-ratio skill / Kimi-K3 cookbook) beside the planner's answer.

Checks the formula on the skill's own worked example, its slot table against SGLang's sizing, that its budget
figures are SGLang's resolution at that ratio, and that the named steps from it to the planner's ratio add up.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix.capacity import PRESETS, MemoryBudget, Parallelism, SizingInputs, plan, resolve_pools
from mamba_radix.capacity.cli import main
from mamba_radix.capacity.official import official_answer, official_ratio
from mamba_radix.capacity.planner import Workload
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError

KIMI = PRESETS["kimi-k3"]


def _inputs(cache: CacheConfig | None = None, **changes: object) -> SizingInputs:
    base: dict[str, object] = {
        "model": KIMI,
        "parallelism": Parallelism(tp_size=8),
        "cache": cache or CacheConfig(mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=6144),
        "kv_cache_dtype": "fp8_e4m3",
        "mamba_ssm_dtype": "bfloat16",
        "budget": MemoryBudget(30.0),
    }
    base.update(changes)
    return SizingInputs(**base)  # type: ignore[arg-type]


def test_formula_on_the_skills_worked_example() -> None:
    # "state_bytes_per_slot ≈ 56.4 MB, kv_bytes_per_token ≈ 13.8 KB -> token_equiv ≈ 4080";
    # "extra_buffer_lazy S = 4, L = 9216: r = 4 · 4080 / 9216 ≈ 1.8"; "DCP8: ≈ 14"
    args = {"state_bytes_per_slot": 4080 * 13_800, "kv_bytes_per_token": 13_800, "slots_per_request": 4}
    tp = official_ratio(**args, draft_tokens=0, dcp_size=1, context_len=9216)
    assert tp == pytest.approx(4 * 4080 / 9216) and round(tp, 1) == 1.8
    assert official_ratio(**args, draft_tokens=0, dcp_size=8, context_len=9216) == pytest.approx(8 * tp)
    # "multiply by (S+D)/S for spec"
    assert official_ratio(**args, draft_tokens=8, dcp_size=1, context_len=9216) == pytest.approx(tp * 12 / 4)


@pytest.mark.parametrize(
    "bad",
    [
        {"state_bytes_per_slot": 0},
        {"kv_bytes_per_token": float("nan")},
        {"context_len": -1},
        {"slots_per_request": 0},
        {"draft_tokens": -1},
        {"dcp_size": True},
    ],
)
def test_bad_input_is_a_one_line_error(bad: dict[str, object]) -> None:
    args: dict[str, object] = {
        "state_bytes_per_slot": 1.0,
        "kv_bytes_per_token": 1.0,
        "slots_per_request": 5,
        "draft_tokens": 0,
        "dcp_size": 1,
        "context_len": 100.0,
    }
    args.update(bad)
    with pytest.raises(ConfigError) as info:
        official_ratio(**args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and next(iter(bad)) in str(info.value)


@pytest.mark.parametrize(
    ("cache", "slots", "with_skip"),
    [
        ({"mamba_radix_cache_strategy": "extra_buffer"}, 5, 4),
        ({"mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": True}, 4, 3),
        ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 4, 3),
        ({"mamba_radix_cache_strategy": "no_buffer"}, 3, 3),
        ({"mamba_radix_cache_strategy": "no_buffer", "disable_radix_cache": True}, 1, 1),
    ],
    ids=["eager", "eager-no-overlap", "lazy", "no-buffer", "radix-off"],
)
def test_slot_table_is_the_skills(cache: dict[str, object], slots: int, with_skip: int) -> None:
    """The skill's "S / S with decode-lock skip" table, read through SGLang's sizing (SlotBudget)."""
    for skip, expected in ((False, slots), (True, with_skip)):
        config = CacheConfig(**cache, skip_decode_lock=skip)  # type: ignore[arg-type]
        answer = official_answer(resolve_pools(_inputs(config)), 10_000)
        assert answer.slots_per_request == expected
        assert answer.slots_per_request_without_skip_lock == slots
        assert answer.skip_lock_drop == slots - expected


def test_budget_figures_are_sglangs_sizing_at_that_ratio() -> None:
    r = resolve_pools(_inputs())
    answer = official_answer(r, 16384 + 3072)
    assert answer.outcome is not None and answer.outcome.error is None
    at = resolve_pools(_inputs(mamba_full_memory_ratio=answer.ratio))
    assert (answer.outcome.slots, answer.outcome.kv_tokens, answer.outcome.max_running_requests) == (
        at.num_slots,
        at.num_tokens,
        at.max_running_requests,
    )
    # KV bytes before DCP, times dcp: the same ratio as the per-GPU sharded cost
    dcp = official_answer(resolve_pools(_inputs(parallelism=Parallelism(8, 8))), 16384 + 3072)
    assert dcp.ratio == pytest.approx(8 * answer.ratio)


def test_speculative_draft_tokens_count_only_without_replayssm() -> None:
    cache = CacheConfig(mamba_radix_cache_strategy="extra_buffer", speculative_num_draft_tokens=8)
    plain = official_answer(resolve_pools(_inputs(cache)), 10_000)
    rings = official_answer(resolve_pools(_inputs(cache, enable_linear_replayssm_spec=True)), 10_000)
    assert (plain.draft_tokens, rings.draft_tokens) == (8, 0)


def test_a_ratio_sglang_refuses_is_reported_not_raised() -> None:
    # 2M-token requests: r* leaves the state pool without a single slot
    p = plan(_inputs(budget=MemoryBudget(4.0)), Workload.fixed(2_000_000, 10))
    assert p.official is not None and p.official.official.outcome is not None
    assert p.official.official.outcome.slots == 0
    assert "not enough memory for the state cache" in (p.official.official.outcome.error or "")


def _assert_steps_add_up(p_official: object, ratio_with_checkpoints: float) -> None:
    from mamba_radix.capacity.official import Comparison

    assert isinstance(p_official, Comparison)
    deltas = p_official.deltas()
    official, corrected = deltas[0][0], deltas[-1][1]
    assert corrected.ratio == ratio_with_checkpoints
    assert sum(a.ratio - b.ratio for b, a in deltas) == pytest.approx(corrected.ratio - official.ratio)
    assert [s.seed for s in p_official.steps if s.seed] == [1, 2, 3]
    if official.outcome is not None and corrected.outcome is not None:
        for name in ("slots", "kv_tokens", "max_running_requests", "running_with_checkpoints"):
            total = sum(getattr(a.outcome, name) - getattr(b.outcome, name) for b, a in deltas)
            assert total == getattr(corrected.outcome, name) - getattr(official.outcome, name)


@settings(max_examples=30, deadline=None)
@given(
    strategy=st.sampled_from(["extra_buffer", "extra_buffer_lazy", "no_buffer"]),
    skip=st.booleans(),
    cap=st.sampled_from([-1, 1, 2, 5]),
    chunk=st.sampled_from([2048, 6144, -1]),
    draft=st.sampled_from([0, 4]),
    input_len=st.integers(64, 200_000),
    output_len=st.integers(1, 8192),
    concurrency=st.none() | st.integers(1, 200),
)
def test_the_named_steps_add_up_to_the_planners_ratio(
    strategy: str,
    skip: bool,
    cap: int,
    chunk: int,
    draft: int,
    input_len: int,
    output_len: int,
    concurrency: int | None,
) -> None:
    cache = CacheConfig(
        mamba_radix_cache_strategy=strategy,  # type: ignore[arg-type]
        skip_decode_lock=skip,
        mamba_max_states_per_path=cap,
        chunked_prefill_size=chunk,
        speculative_num_draft_tokens=draft if strategy != "no_buffer" else 0,
    )
    p = plan(_inputs(cache), Workload.fixed(input_len, output_len), concurrency)
    assert p.balance is not None and p.checkpoints is not None
    _assert_steps_add_up(p.official, p.balance.ratio_with_checkpoints)
    assert p.official is not None
    assert p.official.max_mamba_cache_size == p.balance.slots_with_checkpoints
    assert p.official.kept_per_request == p.checkpoints.mean_kept
    # the planner's balance counts SGLang's D intermediate states like the official formula: no step for them
    assert "speculative intermediate states" not in [s.name for s in p.official.steps]


def test_per_path_cap_is_its_own_line() -> None:
    # 16k in, 3k out, chunk 4096: 4 prefill + 1 decode kept; a cap of 2 keeps 2
    cache = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=4096, mamba_max_states_per_path=2
    )
    p = plan(_inputs(cache), Workload.fixed(16384, 3072))
    assert p.official is not None
    first, second = p.official.steps[:2]
    assert (first.kept_per_request, second.kept_per_request) == (5, 2)
    assert second.ratio < first.ratio
    assert second.outcome is not None and first.outcome is not None
    assert second.outcome.running_with_checkpoints > first.outcome.running_with_checkpoints


def _seed_cli(*extra: str) -> list[str]:
    return [
        "--model", "kimi-k3", "--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3", "--mamba-ssm-dtype", "bfloat16",
        "--mamba-radix-cache-strategy", "extra_buffer", "--chunked-prefill-size", "6144",
        "--memory-budget-gb", "28.76", "--input-len", "16384", "--output-len", "3072",
        "--random-range-ratio", "1", *extra,
    ]  # fmt: skip


def test_cli_prints_the_section_with_the_skip_lock_effect(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_seed_cli()) == 0
    out = capsys.readouterr().out
    assert "official calculator vs corrected (same deployment and workload, in 28.76 GB)" in out
    assert "official r* = (S + D) x token_equiv x dcp / L = (5 + 0) x " in out
    for label in ("1. chunked-prefill checkpoints", "2. --mamba-max-states-per-path", "3. reserved slots"):
        assert label in out
    assert "SKIP_DECODE_LOCK=1" not in out.split("official calculator vs corrected")[1]
    assert main(_seed_cli("--skip-decode-lock")) == 0
    out = capsys.readouterr().out.split("official calculator vs corrected")[1]
    assert "(4 (5 - 1 under SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1) + 0)" in out
    assert (
        "S = 4 slots reserved per running request (5 - 1 under SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1: admits"
        in out
    )


def test_cli_json_deltas_add_up(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_seed_cli(), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["official_vs_corrected"]
    official, steps, corrected = data["official"], data["steps"], data["corrected"]
    assert official["slots_per_request"] == 5 and official["draft_tokens"] == 0
    assert [s["seed_defect"] for s in steps if s["seed_defect"]] == [1, 2, 3]
    assert sum(s["delta"]["ratio"] for s in steps) == pytest.approx(
        corrected["mamba_full_memory_ratio"] - official["mamba_full_memory_ratio"]
    )
    for name in ("slots", "max_running_requests", "running_with_checkpoints"):
        assert sum(s["delta"][name] for s in steps) == corrected["outcome"][name] - official["outcome"][name]
