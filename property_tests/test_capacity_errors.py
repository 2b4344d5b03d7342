"""Bad input to the capacity planner raises a typed error whose message names the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix.capacity import (
    PRESETS,
    MemoryBudget,
    Parallelism,
    SizingInputs,
    kv_token_bytes,
    load_model,
    model_from_dict,
    replay_ring_bytes,
    resolve_pools,
    state_slot_bytes,
)
from mamba_radix.capacity.memory import check_ring_len
from mamba_radix.capacity.models import expand_layer_pattern
from mamba_radix.capacity.planner import Workload, expected_checkpoints
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, TraceFormatError

KIMI = PRESETS["kimi-k3"]
QWEN = PRESETS["qwen3-next-80b-a3b"]


def test_tp_not_dividing_linear_heads() -> None:
    with pytest.raises(
        ConfigError, match=r"tp_size=5 does not divide the 96 key heads of the kda layers"
    ) as e:
        state_slot_bytes(KIMI, Parallelism(tp_size=5))
    assert "1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96" in str(e.value)
    with pytest.raises(ConfigError, match=r"tp_size=32 does not divide the 16 key heads of the gdn layers"):
        state_slot_bytes(QWEN, Parallelism(tp_size=32))


def test_tp_not_dividing_attention_heads() -> None:
    with pytest.raises(ConfigError, match=r"tp_size=3 does not divide the 16 query heads"):
        kv_token_bytes(QWEN, Parallelism(tp_size=3), "auto")


def test_dcp_must_divide_tp_and_replication() -> None:
    with pytest.raises(ConfigError, match=r"dcp_size=3 must divide tp_size=8; use one of 1, 2, 4, 8"):
        Parallelism(tp_size=8, dcp_size=3)
    # Qwen3-Next at TP8 holds each of its 2 KV heads on 4 GPUs: DCP can use at most that replication.
    with pytest.raises(
        ConfigError, match=r"dcp_size=8 must divide the KV replication factor 4 .* use a dcp_size in 1, 2, 4$"
    ):
        kv_token_bytes(QWEN, Parallelism(tp_size=8, dcp_size=8), "auto")
    assert kv_token_bytes(QWEN, Parallelism(tp_size=8, dcp_size=4), "auto").dcp_size == 4
    with pytest.raises(ConfigError, match=r"tp_size must be a positive integer, got 0"):
        Parallelism(tp_size=0)


@pytest.mark.parametrize("bad", ["fp4", "int8", "float64", "e4m3"])
def test_unknown_kv_dtype(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"kv_cache_dtype='{bad}' is not a known dtype; use one of"):
        kv_token_bytes(KIMI, Parallelism(8), bad)


def test_unknown_state_dtypes() -> None:
    with pytest.raises(ConfigError, match=r"mamba_ssm_dtype='fp8_e4m3' is not a known dtype"):
        state_slot_bytes(KIMI, Parallelism(8), "fp8_e4m3")
    with pytest.raises(ConfigError, match=r"mamba_conv_dtype='int8' is not a known dtype"):
        state_slot_bytes(KIMI, Parallelism(8), "bfloat16", "int8")


@pytest.mark.parametrize(("cache_len", "fix"), [(12, "use 8 or 16"), (24, "use 16 or 32"), (3, "use 2 or 4")])
def test_ring_len_not_power_of_two(cache_len: int, fix: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"linear_replayssm_cache_len={cache_len} is not a power of two; {fix}"
    ):
        replay_ring_bytes(KIMI, Parallelism(8), cache_len=cache_len)


def test_ring_len_hint_names_only_lengths_the_verify_window_allows() -> None:
    # 8 verify tokens need L >= 16: the hint for 12 must not offer 8, which the next check refuses
    with pytest.raises(ConfigError, match=r"linear_replayssm_cache_len=12 is not a power of two; use 16$"):
        check_ring_len(12, 8)
    with pytest.raises(ConfigError, match=r"is not a power of two; use 16 or 32$"):
        check_ring_len(24, 8)


def test_ring_len_below_twice_the_verify_tokens() -> None:
    with pytest.raises(
        ConfigError, match=r"linear_replayssm_cache_len=8 must be >= 2 x the 8 verify tokens .*use 16"
    ):
        replay_ring_bytes(KIMI, Parallelism(8), cache_len=8, verify_tokens=8)
    with pytest.raises(ConfigError, match=r"must be >= 2 x the 9 verify tokens .*use 32"):
        replay_ring_bytes(KIMI, Parallelism(8), cache_len=16, verify_tokens=9)


def test_rings_need_gdn_or_kda() -> None:
    mamba = model_from_dict(
        {
            "name": "m2",
            "layer_pattern": "LLLF*4",
            "full_attention": {"kind": "gqa", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128},
            "linear": {"kind": "mamba2", "num_heads": 64, "head_dim": 64, "state_size": 128, "n_groups": 8},
        }
    )
    with pytest.raises(
        ConfigError,
        match=r"enable_linear_replayssm_spec=True needs GDN or KDA .* leave enable_linear_replayssm_spec off",
    ):
        replay_ring_bytes(mamba, Parallelism(1))


def test_bad_models(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model='llama' is neither a preset"):
        load_model("llama")
    with pytest.raises(ConfigError, match=r"layer pattern part 'LLXF\*3' .* is not valid"):
        expand_layer_pattern("LLXF*3")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        load_model(str(bad))
    with pytest.raises(ConfigError, match=r"missing section 'linear'"):
        model_from_dict({"name": "x", "layer_pattern": "LF", "full_attention": {"kind": "mla"}})
    with pytest.raises(ConfigError, match=r"no linear layer"):
        model_from_dict(
            {
                "name": "x",
                "layer_pattern": "F*4",
                "full_attention": {"kind": "gqa", "num_q_heads": 8, "num_kv_heads": 8, "head_dim": 64},
                "linear": {"kind": "kda", "num_heads": 8, "head_dim": 64},
            }
        )
    with pytest.raises(ConfigError, match=r"num_q_heads \(10\) must be a multiple of num_kv_heads \(4\)"):
        model_from_dict(
            {
                "name": "x",
                "layer_pattern": "LF",
                "full_attention": {"kind": "gqa", "num_q_heads": 10, "num_kv_heads": 4, "head_dim": 64},
                "linear": {"kind": "kda", "num_heads": 8, "head_dim": 64},
            }
        )


def test_sizing_needs_a_budget_or_a_slot_count() -> None:
    with pytest.raises(ConfigError, match=r"give a memory budget .*rest_gib.* or max_mamba_cache_size"):
        SizingInputs(model=KIMI, parallelism=Parallelism(8), cache=CacheConfig())
    with pytest.raises(ConfigError, match=r"rest_gib must be > 0"):
        MemoryBudget(0)
    with pytest.raises(ConfigError, match=r"no memory left for the caches"):
        MemoryBudget.from_gpu(80, 0.9, 100)
    with pytest.raises(ConfigError, match=r"mamba_full_memory_ratio must be > 0"):
        SizingInputs(
            model=KIMI,
            parallelism=Parallelism(8),
            cache=CacheConfig(),
            budget=MemoryBudget(10),
            mamba_full_memory_ratio=0,
        )


def test_budget_too_small_for_a_request() -> None:
    inputs = SizingInputs(
        model=KIMI, parallelism=Parallelism(8), cache=CacheConfig(), budget=MemoryBudget(0.05)
    )
    with pytest.raises(
        ConfigError, match=r"0 state slots .*raise budget.rest_gib or mamba_full_memory_ratio"
    ):
        resolve_pools(inputs)
    few = SizingInputs(model=KIMI, parallelism=Parallelism(8), cache=CacheConfig(), max_mamba_cache_size=4)
    with pytest.raises(ConfigError, match=r"too small to serve any request: 4 state slots, 5 slots"):
        resolve_pools(few)


def test_cache_config_errors_pass_through() -> None:
    # strategy rules are CacheConfig's, reused: lazy needs overlap
    with pytest.raises(ConfigError, match=r"extra_buffer_lazy' requires overlap"):
        CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy", disable_overlap_schedule=True)


def test_bad_workloads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"range_ratio must be in \[0, 1\]"):
        Workload.random_range(100, 10, 1.5)
    with pytest.raises(ConfigError, match=r"input_len >= 1"):
        Workload.fixed(0, 10)
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]})
        + "\n"
        + json.dumps({"timestamp": 1, "input_length": -3, "output_length": 5, "hash_ids": []})
        + "\n"
    )
    with pytest.raises(TraceFormatError, match=r"t.jsonl:2: field 'input_length'") as e:
        Workload.from_trace(trace)
    assert e.value.line == 2
    trace.write_text('{"timestamp": 0, "output_length": 5}\n')
    with pytest.raises(TraceFormatError, match=r":1: field 'input_length': missing"):
        Workload.from_trace(trace)
    trace.write_text("[1, 2]\n")
    with pytest.raises(TraceFormatError, match=r":1: a row must be a JSON object"):
        Workload.from_trace(trace)
    with pytest.raises(ConfigError, match=r"cannot read"):
        Workload.from_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=r"cached prefix 10 must be in \[0, input_len=10\)"):
        expected_checkpoints(CacheConfig(), 10, 5, cached_len=10)


# ------------------------------------------------------------------- wrong types, non-finite, absurd sizes
@pytest.mark.parametrize(
    "args",
    [("10", 1), (10, "1"), (1.5, 1), (True, 1), (None, 1), (float("inf"), 1), (2**31, 0), (10, 2**31)],
    ids=["str-input", "str-output", "float", "bool", "none", "inf", "input-2^31", "output-2^31"],
)
def test_workload_lengths_must_be_ints_a_request_can_have(args: tuple[object, object]) -> None:
    with pytest.raises(ConfigError, match=r"input_len|output_len"):
        Workload.fixed(*args)  # type: ignore[arg-type]


def test_absurd_lengths_are_refused_at_once_instead_of_looping() -> None:
    """``plan --input-len 1e12`` looped over 10**9 chunks; ``--output-len 1e15`` built a huge list."""
    with pytest.raises(ConfigError, match=r"above the 2,147,483,647 a request can have"):
        Workload.fixed(10**12, 1)
    with pytest.raises(ConfigError, match=r"above the 2,147,483,647"):
        expected_checkpoints(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), 10, 10**15)


@given(
    strategy=st.sampled_from(["no_buffer", "extra_buffer"]),
    chunk=st.sampled_from([-1, 1, 7, 64, 100, 256, 2048]),
    interval=st.sampled_from([1, 16, 64, 256]),
    input_len=st.integers(1, 5000),
    output_len=st.integers(0, 3000),
    cached_frac=st.floats(0, 1, exclude_max=True),
)
def test_checkpoints_are_counted_in_closed_form_exactly(
    strategy, chunk, interval, input_len, output_len, cached_frac
):
    """The O(1) counts equal the lengths of the position lists (chunk tails equal to the grid included)."""
    from mamba_radix.capacity.planner import decode_checkpoint_positions, prefill_checkpoint_positions

    config = CacheConfig(
        mamba_radix_cache_strategy=strategy, chunked_prefill_size=chunk, mamba_track_interval=interval
    )
    cached = int(input_len * cached_frac)
    count = expected_checkpoints(config, input_len, output_len, cached)
    assert count.prefill == len(prefill_checkpoint_positions(config, input_len, cached))
    assert count.decode == len(decode_checkpoint_positions(config, input_len, output_len))


def test_checkpoint_count_of_a_chunk_tail_exactly_on_the_grid() -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=100, mamba_track_interval=16
    )
    grid = config.mamba_checkpoint_grid
    count = expected_checkpoints(config, 200 + grid, 1)  # two full chunks, then a tail of exactly one grid
    assert count.prefill == 3


def test_a_request_of_2_31_minus_1_tokens_plans_in_constant_time() -> None:
    import time

    start = time.perf_counter()
    count = expected_checkpoints(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), 2**30, 2**30 - 1)
    assert time.perf_counter() - start < 0.1 and count.decode > 4_000_000


@pytest.mark.parametrize(
    "value",
    [float("inf"), float("nan"), "10", None, True, 2.0**21],
    ids=["inf", "nan", "str", "none", "bool", "2^21"],
)
def test_memory_budget_must_be_a_finite_positive_number(value: object) -> None:
    with pytest.raises(ConfigError, match=r"rest_gib"):
        MemoryBudget(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args", [(float("inf"), 0.9, 1), ("80", 0.9, 1), (80, None, 1), (80, 0.9, float("nan"))]
)
def test_gpu_budget_inputs_must_be_finite_numbers(args: tuple[object, object, object]) -> None:
    with pytest.raises(ConfigError):
        MemoryBudget.from_gpu(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mamba_full_memory_ratio": float("inf")},
        {"mamba_full_memory_ratio": "0.9"},
        {"mamba_full_memory_ratio": 1e300},
        {"budget": 40},
        {"model": "qwen"},
        {"parallelism": (1, 1)},
        {"cache": "extra_buffer"},
        {"max_total_tokens": 2**70},
        {"enable_linear_replayssm_spec": "yes"},
    ],
)
def test_sizing_inputs_of_the_wrong_type_or_size_are_config_errors(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "model": QWEN,
        "parallelism": Parallelism(1, 1),
        "cache": CacheConfig(),
        "budget": MemoryBudget(40.0),
    }
    with pytest.raises(ConfigError):
        resolve_pools(SizingInputs(**{**base, **kwargs}))  # type: ignore[arg-type]


def test_plan_arguments_of_the_wrong_type_are_config_errors() -> None:
    from mamba_radix.capacity.planner import balance, compare_dcp, plan

    inputs = SizingInputs(
        model=QWEN, parallelism=Parallelism(1, 1), cache=CacheConfig(), budget=MemoryBudget(40.0)
    )
    workload = Workload.fixed(1000, 100)
    resolution = resolve_pools(inputs)
    for call in (
        lambda: plan(inputs, "workload"),  # type: ignore[arg-type]
        lambda: plan(inputs, workload, concurrency="4"),  # type: ignore[arg-type]
        lambda: balance(None, workload),  # type: ignore[arg-type]
        lambda: compare_dcp(resolution, workload, 0),  # was a ZeroDivisionError
        lambda: resolve_pools(None),  # type: ignore[arg-type]
        lambda: kv_token_bytes(None, Parallelism(), "auto"),  # type: ignore[arg-type]
        lambda: Parallelism(2**70, 1),
    ):
        with pytest.raises(ConfigError):
            call()


def test_model_files_that_are_not_models_are_config_errors(tmp_path: Path) -> None:
    for name, content in (("utf8", b"\xff\xfe"), ("deep", b"[" * 100_000 + b"]" * 100_000), ("list", b"[1]")):
        path = tmp_path / f"{name}.json"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=r"model="):
            load_model(str(path))
    with pytest.raises(ConfigError, match=r"must hold one JSON object"):
        model_from_dict([1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"more than 100,000 layers"):
        expand_layer_pattern("LF*1000000000000")  # was a MemoryError
    with pytest.raises(ConfigError, match=r"must be a string"):
        expand_layer_pattern(None)  # type: ignore[arg-type]


def test_a_trace_path_that_is_a_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is a folder"):
        Workload.from_trace(tmp_path)
