"""Bad input to the capacity planner raises a typed error whose message names the value and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
from mamba_radix.capacity.models import expand_layer_pattern
from mamba_radix.capacity.planner import Workload, expected_checkpoints
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, TraceFormatError

KIMI = PRESETS["kimi-k3"]
QWEN = PRESETS["qwen3-next-80b-a3b"]


def test_tp_not_dividing_linear_heads() -> None:
    with pytest.raises(
        ConfigError, match=r"--tp-size 5 does not divide the 96 key heads of the kda layers"
    ) as e:
        state_slot_bytes(KIMI, Parallelism(tp_size=5))
    assert "1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96" in str(e.value)
    with pytest.raises(ConfigError, match=r"--tp-size 32 does not divide the 16 key heads of the gdn layers"):
        state_slot_bytes(QWEN, Parallelism(tp_size=32))


def test_tp_not_dividing_attention_heads() -> None:
    with pytest.raises(ConfigError, match=r"--tp-size 3 does not divide the 16 query heads"):
        kv_token_bytes(QWEN, Parallelism(tp_size=3), "auto")


def test_dcp_must_divide_tp_and_replication() -> None:
    with pytest.raises(ConfigError, match=r"--dcp-size 3 must divide --tp-size 8"):
        Parallelism(tp_size=8, dcp_size=3)
    # Qwen3-Next at TP8 holds each of its 2 KV heads on 4 GPUs: DCP can use at most that replication.
    with pytest.raises(ConfigError, match=r"--dcp-size 8 must divide the KV replication factor 4"):
        kv_token_bytes(QWEN, Parallelism(tp_size=8, dcp_size=8), "auto")
    assert kv_token_bytes(QWEN, Parallelism(tp_size=8, dcp_size=4), "auto").dcp_size == 4
    with pytest.raises(ConfigError, match=r"--tp-size must be a positive integer, got 0"):
        Parallelism(tp_size=0)


@pytest.mark.parametrize("bad", ["fp4", "int8", "float64", "e4m3"])
def test_unknown_kv_dtype(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"--kv-cache-dtype '{bad}' is not a known dtype; use one of"):
        kv_token_bytes(KIMI, Parallelism(8), bad)


def test_unknown_state_dtypes() -> None:
    with pytest.raises(ConfigError, match=r"--mamba-ssm-dtype 'fp8_e4m3' is not a known dtype"):
        state_slot_bytes(KIMI, Parallelism(8), "fp8_e4m3")
    with pytest.raises(ConfigError, match=r"--mamba-conv-dtype .*'int8'"):
        state_slot_bytes(KIMI, Parallelism(8), "bfloat16", "int8")


@pytest.mark.parametrize(("cache_len", "fix"), [(12, "use 8 or 16"), (24, "use 16 or 32"), (3, "use 2 or 4")])
def test_ring_len_not_power_of_two(cache_len: int, fix: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"--linear-replayssm-cache-len {cache_len} is not a power of two; {fix}"
    ):
        replay_ring_bytes(KIMI, Parallelism(8), cache_len=cache_len)


def test_ring_len_below_twice_the_verify_tokens() -> None:
    with pytest.raises(ConfigError, match=r"must be >= 2 x the 8 verify tokens .*use 16"):
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
        ConfigError, match=r"--enable-linear-replayssm-spec needs GDN or KDA .* drop the flag"
    ):
        replay_ring_bytes(mamba, Parallelism(1))


def test_bad_models(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--model 'llama' is neither a preset"):
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
    with pytest.raises(ConfigError, match=r"give a memory budget .* or --max-mamba-cache-size"):
        SizingInputs(model=KIMI, parallelism=Parallelism(8), cache=CacheConfig())
    with pytest.raises(ConfigError, match=r"--memory-budget-gb must be > 0"):
        MemoryBudget(0)
    with pytest.raises(ConfigError, match=r"no memory left for the caches"):
        MemoryBudget.from_gpu(80, 0.9, 100)
    with pytest.raises(ConfigError, match=r"--mamba-full-memory-ratio must be > 0"):
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
    with pytest.raises(ConfigError, match=r"max_mamba_cache_size=0"):
        resolve_pools(inputs)
    few = SizingInputs(model=KIMI, parallelism=Parallelism(8), cache=CacheConfig(), max_mamba_cache_size=4)
    with pytest.raises(ConfigError, match=r"too small to serve any request: max_mamba_cache_size=4, 5 slots"):
        resolve_pools(few)


def test_cache_config_errors_pass_through() -> None:
    # strategy rules are CacheConfig's, reused: lazy needs overlap
    with pytest.raises(ConfigError, match=r"extra_buffer_lazy requires overlap"):
        CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy", disable_overlap_schedule=True)


def test_bad_workloads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--random-range-ratio must be in \[0, 1\]"):
        Workload.random_range(100, 10, 1.5)
    with pytest.raises(ConfigError, match=r"--input-len >= 1"):
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
