"""Planner and simulator sizing at equal bytes per checkpoint format, ``plan --enable-unified-memory`` and
``plan --compare-memory-options`` (issue 26): slot counts follow ``checkpoint_format.bytes_per_slot``
exactly, the KV side never moves, refusals are one-line errors that change nothing, the comparison's rows."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix import checkpoint_format
from mamba_radix.capacity import PRESETS, MemoryBudget, Parallelism, SizingInputs, resolve_pools
from mamba_radix.capacity.cli import add_plan_arguments, build_inputs, main
from mamba_radix.capacity.formats import (
    CHECKPOINT_FORMAT_NAMES,
    checkpoint_slot_bytes,
    resolve_checkpoints,
    sglang_int8_pool,
    split_state_bytes,
)
from mamba_radix.capacity.options import MECHANISMS, compare_memory_options
from mamba_radix.capacity.planner import Workload, expected_workload_checkpoints
from mamba_radix.capacity.unified import unified_plan
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.flags import FLAGS

KIMI = PRESETS["kimi-k3"]
TP8 = Parallelism(8, 1)
ROOT = Path(__file__).resolve().parents[1]
SEED_CONFIG = ROOT / "docs" / "examples" / "seed-kimi-k3.json"
QUANTIZED = ("int8", "fp8_e4m3")
_TORCH = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _inputs(cache: CacheConfig | None = None, **changes: object) -> SizingInputs:
    """Seed 000's bf16 Kimi K3 rank without speculative decoding (unified memory allowed)."""
    base: dict[str, object] = {
        "model": KIMI,
        "parallelism": TP8,
        "cache": cache or CacheConfig(mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=6144),
        "kv_cache_dtype": "fp8_e4m3",
        "mamba_ssm_dtype": "bfloat16",
        "budget": MemoryBudget(28.76),
        "mamba_full_memory_ratio": 0.15,
    }
    base.update(changes)
    return SizingInputs(**base)  # type: ignore[arg-type]


def _independent_slot_bytes(inputs: SizingInputs, fmt: str) -> int:
    """``checkpoint_format.bytes_per_slot`` called directly on the state tensors' shapes and torch dtypes."""
    state = resolve_pools(inputs).state
    shapes = [(state.conv_shape, _TORCH[state.conv_dtype]), (state.temporal_shape, _TORCH[state.ssm_dtype])]
    return checkpoint_format.bytes_per_slot(fmt, state.num_linear_layers, shapes)


def test_format_names_are_the_format_modules() -> None:
    assert tuple(CHECKPOINT_FORMAT_NAMES) == tuple(checkpoint_format.CHECKPOINT_FORMATS)
    flag = next(f for f in FLAGS() if f.flag == "--checkpoint-format")
    for name in checkpoint_format.CHECKPOINT_FORMATS:
        assert flag.kind(name) == name
    with pytest.raises(argparse.ArgumentTypeError):
        flag.kind("int4")


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(QUANTIZED),
    ssm=st.sampled_from(["bfloat16", "float32"]),
    budget=st.floats(8.0, 80.0),
    ratio=st.floats(0.05, 3.0),
    rings=st.booleans(),
)
def test_default_split_follows_bytes_per_slot_at_equal_bytes(
    fmt: str, ssm: str, budget: float, ratio: float, rings: bool
) -> None:
    inputs = _inputs(
        mamba_ssm_dtype=ssm,
        budget=MemoryBudget(budget),
        mamba_full_memory_ratio=ratio,
        enable_linear_replayssm_spec=rings,
    )
    model = resolve_pools(inputs)
    try:
        f = resolve_checkpoints(model, fmt)
    except ConfigError:  # too small for one running request's working slots: the model format's bound too
        assert (
            model.num_slots
            * model.bytes_per_slot
            // (model.bytes_per_slot + 2 * _independent_slot_bytes(inputs, fmt))
            < 5
        )
        return
    c = _independent_slot_bytes(inputs, fmt)
    w = model.bytes_per_slot
    assert f.checkpoint_slot_bytes == c and f.working_slot_bytes == w
    budget_bytes = model.num_slots * w
    assert f.state_bytes == budget_bytes
    # SGLang's proportion (two checkpoint slots per working slot), as many as fit, at equal bytes
    assert f.checkpoint_slots == 2 * f.working_slots
    assert f.working_slots * w + f.checkpoint_slots * c <= budget_bytes
    assert (f.working_slots + 1) * w + (f.checkpoint_slots + 2) * c > budget_bytes
    assert f.max_running_requests <= f.working_slots // f.slots_per_request
    assert f.cached_prefixes(f.max_running_requests) == f.checkpoint_slots


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(QUANTIZED), ckpts=st.integers(1, 400))
def test_given_checkpoint_slots_leave_the_rest_to_working_slots(fmt: str, ckpts: int) -> None:
    model = resolve_pools(_inputs())
    w, c = model.bytes_per_slot, checkpoint_slot_bytes(model.state, fmt, model.bytes_per_slot)
    budget = model.num_slots * w
    if ckpts * c > budget or (budget - ckpts * c) // w < model.slots_per_request:
        with pytest.raises(ConfigError) as err:
            resolve_checkpoints(resolve_pools(_inputs(checkpoint_format=fmt, checkpoint_slots=ckpts)))
        assert "\n" not in str(err.value)
        return
    f = resolve_checkpoints(resolve_pools(_inputs(checkpoint_format=fmt, checkpoint_slots=ckpts)))
    assert f.checkpoint_slots == ckpts
    assert f.working_slots == (budget - ckpts * c) // w


def test_kv_side_is_the_same_for_every_format() -> None:
    model = resolve_pools(_inputs())
    for fmt in QUANTIZED:
        res = resolve_pools(_inputs(checkpoint_format=fmt))
        assert res.num_tokens == model.num_tokens and res.num_slots == model.num_slots
        f = resolve_checkpoints(res)
        assert f.limits["full KV tokens"] == model.limits["full KV tokens"]
        assert f.working_pool_bytes + f.checkpoint_pool_bytes <= model.num_slots * model.bytes_per_slot
    # a quantized checkpoint is 3.3 x smaller than a bf16 slot with rings: more checkpoints fit than slots
    f = resolve_checkpoints(model, "int8")
    assert f.working_slots + f.checkpoint_slots > model.num_slots


def test_working_slots_rule_and_split_refusals() -> None:
    assert split_state_bytes(1000, 100, 10, working_slots=5) == (5, 50)
    assert split_state_bytes(1000, 100, 10, checkpoint_slots=30) == (7, 30)
    assert split_state_bytes(1000, 100, 10) == (8, 16)
    for kwargs in (
        {"working_slots": 11},
        {"checkpoint_slots": 101},
        {"working_slots": 1, "checkpoint_slots": 1},
    ):
        with pytest.raises(ConfigError):
            split_state_bytes(1000, 100, 10, **kwargs)  # type: ignore[arg-type]


def test_sglang_view_adds_its_int8_pool_beyond_the_budget() -> None:
    model = resolve_pools(_inputs())
    pool = sglang_int8_pool(model.state, model.num_slots)
    heads, d_v, d_k = model.state.temporal_shape
    per_slot = KIMI.num_linear_layers * (heads * d_v * d_k + heads * d_k * 2 + 3 * 4608 * 2)
    assert pool.slots == 2 * model.num_slots
    assert pool.total_bytes == (pool.slots + 1) * per_slot
    assert resolve_checkpoints(model, "int8").sglang == pool
    assert resolve_checkpoints(model, "fp8_e4m3").sglang is None


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"checkpoint_format": "int4"}, "checkpoint_format"),
        ({"checkpoint_slots": 10}, "checkpoint_slots"),
        ({"checkpoint_format": "int8", "enable_hierarchical_cache": True}, "host tier"),
        ({"checkpoint_format": "int8", "checkpoint_slots": 0}, "checkpoint_slots"),
    ],
)
def test_format_refusals_are_one_line(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        _inputs(**changes)
    assert needle in str(err.value) and "\n" not in str(err.value)


def _unified(**changes: object) -> SizingInputs:
    cache = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=6144, enable_unified_memory=True
    )
    return _inputs(cache=cache, **changes)


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: _unified(enable_hierarchical_cache=True), "host tier"),
        (lambda: _unified(parallelism=Parallelism(8, 2)), "DCP > 1"),
        (
            lambda: CacheConfig(enable_unified_memory=True, speculative_num_draft_tokens=8),
            "speculative decoding",
        ),
        (lambda: CacheConfig(enable_unified_memory=True, disaggregation_mode="prefill"), "PD disaggregation"),
    ],
)
def test_the_four_unified_incompatibilities(build: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        build()  # type: ignore[operator]
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_unified_plan_peak_and_coverage() -> None:
    inputs = _unified()
    res = resolve_pools(inputs)
    work = Workload.fixed(16384, 3072)
    u = unified_plan(res, work)
    per_request = work.mean_peak_kv_len * float(res.kv.bytes_per_token) + 5 * res.bytes_per_slot
    assert u.max_concurrency == int(u.usable_bytes // per_request)
    assert u.usable_bytes == inputs.budget.rest_bytes - max(res.bytes_per_slot, res.kv.row_bytes)  # type: ignore[union-attr]
    # the most it holds fits; one more request does not
    at_most = unified_plan(res, work, u.max_concurrency)
    assert at_most.covers and not unified_plan(res, work, u.max_concurrency + 1).covers
    assert at_most.peak_kv_tokens == math.ceil(u.max_concurrency * work.mean_peak_kv_len)
    assert at_most.peak_state_slots == 5 * u.max_concurrency
    # the start-up split still sets max_running_requests (0.15: 16), below what the buffer holds
    assert u.max_running_requests == res.max_running_requests and at_most.capped_by_startup
    kept = expected_workload_checkpoints(inputs.cache, work).mean_kept
    assert u.max_concurrency_with_checkpoints == int(
        u.usable_bytes // (per_request + kept * res.bytes_per_slot)
    )


def test_compare_table_rows_and_recommendation() -> None:
    work = Workload.fixed(16384, 3072)
    inputs = _inputs(mamba_ssm_dtype="float32", kv_cache_dtype="bfloat16")
    c = compare_memory_options(inputs, work)
    formats = ("model", "bf16 state", "int8", "fp8_e4m3")
    assert [(r.mechanism, r.fmt) for r in c.rows] == [(m, f) for m in MECHANISMS for f in formats]
    rows = {(r.mechanism, r.fmt): r for r in c.rows}
    # the given ratio's static row is plan's own resolution
    res = resolve_pools(inputs)
    assert (
        rows["static", "model"].state_slots == res.num_slots
        and rows["static", "model"].kv_tokens == res.num_tokens
    )
    # the best static ratio keeps at least as many requests' checkpoints as the given one, per format
    for f in formats:
        assert rows["static best", f].with_checkpoints >= rows["static", f].with_checkpoints
        assert rows["static best", f].running >= rows["static best", f].with_checkpoints
    # int8 and fp8 take the same bytes per checkpoint: identical counts
    for m in MECHANISMS:
        a, b = rows[m, "int8"], rows[m, "fp8_e4m3"]
        assert (a.state_slots, a.checkpoint_slots, a.kv_tokens, a.running) == (
            b.state_slots,
            b.checkpoint_slots,
            b.kv_tokens,
            b.running,
        ) or a.refused
    # unified with a quantized pool: the config's own refusal
    assert rows["unified", "int8"].refused and "enable_unified_memory" in rows["unified", "int8"].refused
    # the recommendation: an allowed, deployable row that no other beats on (w/ ckpts, running)
    best = c.best
    assert best.allowed and best.mechanism != "adaptive"
    for r in c.rows:
        if r.allowed and r.mechanism != "adaptive":
            assert (r.with_checkpoints, r.running) <= (best.with_checkpoints, best.running)


def test_compare_refuses_unified_under_speculative_decoding_and_adaptive_at_page_size_2() -> None:
    cache = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", speculative_num_draft_tokens=8, page_size=2
    )
    inputs = _inputs(cache=cache, enable_linear_replayssm_spec=True)
    rows = compare_memory_options(inputs, Workload.fixed(16384, 3072)).rows
    for r in rows:
        if r.mechanism == "unified":
            assert r.refused is not None and "speculative decoding" in r.refused
        if r.mechanism == "adaptive":
            assert r.refused is not None and "page_size 1" in r.refused
    assert all(r.allowed for r in rows if r.mechanism.startswith("static"))


def test_compare_needs_a_budget() -> None:
    with pytest.raises(ConfigError, match="memory budget"):
        compare_memory_options(
            dataclasses.replace(_inputs(), budget=None, max_mamba_cache_size=80), Workload.fixed(100, 10)
        )


def test_cli_prints_both_counts_and_exits_2_on_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "kimi-k3", "--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3", "--mamba-ssm-dtype", "bfloat16",
            "--memory-budget-gb", "28.76", "--mamba-full-memory-ratio", "0.15"]  # fmt: skip
    assert main([*base, "--checkpoint-format", "int8"]) == 0
    out = capsys.readouterr().out
    f = resolve_checkpoints(resolve_pools(build_inputs(_parse([*base, "--checkpoint-format", "int8"]))))
    assert f"working slots       {f.working_slots} x" in out
    assert f"checkpoint slots    {f.checkpoint_slots} x {f.checkpoint_slot_bytes:,} B (int8)" in out
    assert "sglang view" in out
    for extra in (["--enable-unified-memory", "--speculative-num-draft-tokens", "8"],
                  ["--enable-unified-memory", "--enable-hierarchical-cache"],
                  ["--enable-unified-memory", "--disaggregation-mode", "decode"],
                  ["--enable-unified-memory", "--dcp-size", "2"],
                  ["--checkpoint-format", "int8", "--enable-unified-memory"],
                  ["--compare-memory-options"]):  # fmt: skip
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err
    assert main([*base, "--enable-unified-memory", "--input-len", "16384", "--output-len", "3072"]) == 0
    out = capsys.readouterr().out
    assert "unified memory (one buffer" in out and "one buffer covers it" in out


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    return parser.parse_args(argv)


def test_simulator_sizes_through_the_planner_rule() -> None:
    from mamba_radix.sim.budget import pools_for_budget

    model = pools_for_budget(CacheConfig(), 27.25, 0.9)
    for fmt in QUANTIZED:
        sized = pools_for_budget(CacheConfig(checkpoint_format=fmt), 27.25, 0.9)
        assert sized.kv_tokens == model.kv_tokens
        w, c = sized.bytes_per_state_slot, sized.bytes_per_checkpoint_slot
        assert c is not None and sized.checkpoint_slots == 2 * sized.state_slots
        assert sized.state_slots * w + sized.checkpoint_slots * c <= model.state_slots * w
        assert (sized.state_slots + 1) * w + (sized.checkpoint_slots + 2) * c > model.state_slots * w
    given = pools_for_budget(CacheConfig(checkpoint_format="int8", checkpoint_slots=100), 27.25, 0.9)
    assert given.checkpoint_slots == 100
    assert (
        given.state_slots
        == (model.state_slots * model.bytes_per_state_slot - 100 * c) // model.bytes_per_state_slot
    )


@pytest.mark.parametrize("budget_gib", ["2", "4"])
def test_unified_admission_takes_what_its_byte_check_counted(
    budget_gib: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The memory-options experiment's chat runs refused admissions their byte check allowed ("cache.admit
    refused although can_admit agrees"). At 2 GiB a state shortfall counted bytes freed rather than room for
    slots: a checkpoint leaf's KV that goes with it raises the running requests' protected KV by as much. At
    4 GiB a KV shortfall found no KV victim while the check counted evictable checkpoints' bytes."""
    from mamba_radix.cli import main as cli_main

    argv = ["simulate", "--synthetic", "chat", "--enable-unified-memory", "--memory-budget-gb", budget_gib,
            "--mamba-radix-cache-strategy", "extra_buffer"]  # fmt: skip
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert "120 requests completed" in capsys.readouterr().out


def test_simulate_prints_the_checkpoint_pool_of_a_quantized_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mamba_radix.cli import main as cli_main

    argv = ["simulate", "--synthetic", "chat", "--memory-budget-gb", "2", "--checkpoint-format", "int8",
            "--no-verify-states", "--quiet"]  # fmt: skip
    assert cli_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "checkpoint pool     34 quantized checkpoint slots (int8, 14,944,572 B each" in out
    assert cli_main([*argv[:5], "--quiet"]) == 0
    assert "checkpoint pool" not in capsys.readouterr().out  # "model": checkpoints are state slots
