"""Planner behaviour: checkpoint counts against a step-by-step oracle, byte-math laws, SGLang's resolution
laws, the balanced ratio round trip, workloads from traces, and the ``plan`` CLI end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix.capacity import (
    PRESETS,
    MemoryBudget,
    Parallelism,
    SizingInputs,
    balance,
    expected_checkpoints,
    expected_workload_checkpoints,
    kv_token_bytes,
    model_from_dict,
    plan,
    resolve_pools,
    state_slot_bytes,
)
from mamba_radix.capacity.cli import add_plan_arguments, build_inputs, main
from mamba_radix.capacity.planner import RequestShape, Workload, prefill_checkpoint_positions
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError

KIMI = PRESETS["kimi-k3"]
QWEN = PRESETS["qwen3-next-80b-a3b"]
ROOT = Path(__file__).resolve().parents[1]

caches = st.builds(
    CacheConfig,
    mamba_radix_cache_strategy=st.sampled_from(["extra_buffer", "no_buffer", "extra_buffer_lazy"]),
    chunked_prefill_size=st.sampled_from([-1, 48, 64, 100, 512, 2048, 6144]),
    mamba_track_interval=st.sampled_from([64, 128, 256]),
    mamba_cache_chunk_size=st.sampled_from([16, 64]),
)


def oracle_checkpoints(config: CacheConfig, input_len: int, output_len: int) -> tuple[list[int], list[int]]:
    """Walk the engine loop one chunk and one decode step at a time, recording where states are stored."""
    prefill: list[int] = []
    done = 0
    while done < input_len:
        extend = (
            input_len - done
            if config.chunked_prefill_size < 0
            else min(config.chunked_prefill_size, input_len - done)
        )
        if config.strategy == "no_buffer":
            prefill.append(done + extend)  # live state copied at every chunk end
        else:
            aligned = max((n for n in range(0, extend + 1, config.mamba_checkpoint_grid)), default=0)
            if aligned > 0:
                prefill.append(done + aligned)
        done += extend
    decode: list[int] = []
    seq_len = input_len
    for _ in range(output_len - 1):  # the last sampled token is never fed back
        seq_len += 1
        if config.strategy != "no_buffer" and seq_len % config.mamba_track_interval == 0:
            decode.append(seq_len)
    if config.strategy == "no_buffer" and seq_len > input_len:
        decode.append(seq_len)  # the live state is donated at finish (a new position only past the prompt)
    return prefill, decode


@given(caches, st.integers(1, 5000), st.integers(0, 1500))
def test_checkpoints_match_step_oracle(config: CacheConfig, input_len: int, output_len: int) -> None:
    prefill, decode = oracle_checkpoints(config, input_len, output_len)
    assert prefill_checkpoint_positions(config, input_len) == prefill
    count = expected_checkpoints(config, input_len, output_len)
    assert (count.prefill, count.decode) == (len(prefill), len(decode))
    assert count.kept == len(prefill) + min(1, len(decode))
    # seed 000's bound: "mamba state存储数量最大为 ... in_len // chunked_prefill_size + 2"
    assert count.kept <= count.seed_bound


@given(caches, st.integers(2, 5000), st.data())
def test_prefill_positions_after_a_hit(config: CacheConfig, input_len: int, data: st.DataObject) -> None:
    cached = data.draw(st.integers(0, input_len - 1))
    positions = prefill_checkpoint_positions(config, input_len, cached)
    assert positions == sorted(set(positions))
    assert all(cached < p <= input_len for p in positions)
    if config.uses_extra_buffer:  # aligned from the request's own prefix start, per chunk
        chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else input_len
        for p in positions:
            start = cached + (p - cached - 1) // chunk * chunk
            assert (p - start) % config.mamba_checkpoint_grid == 0


@given(st.integers(1, 6))
def test_per_path_cap_limits_kept(cap: int) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=1024, mamba_max_states_per_path=cap
    )
    count = expected_checkpoints(config, 20_000, 2_000)
    assert count.prefill == 20  # taken regardless; the cap only thins what is kept
    assert count.kept == min(cap, 21)


def test_workload_totals_for_the_simulator() -> None:
    config = CacheConfig(chunked_prefill_size=2048)
    shapes = [RequestShape(5000, 300), RequestShape(100, 10), RequestShape(2048, 256)]
    totals = expected_workload_checkpoints(config, shapes)
    singles = [expected_checkpoints(config, s.input_len, s.output_len) for s in shapes]
    assert totals.prefill_total == sum(c.prefill for c in singles) == 3 + 1 + 1
    assert totals.decode_total == sum(c.decode for c in singles)
    assert totals.taken_total == totals.prefill_total + totals.decode_total
    hit = expected_workload_checkpoints(config, shapes, cached_lens=[4096, 0, 0])
    assert hit.prefill_total == totals.prefill_total - 2  # 904 tokens left: one chunk, one checkpoint


# ------------------------------------------------------------------------------------------------ byte laws
@given(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from(["float32", "bfloat16"]))
def test_tp_shards_add_up_to_the_whole_state(tp: int, ssm: str) -> None:
    for model in (KIMI, QWEN):
        whole = state_slot_bytes(model, Parallelism(1), ssm)
        shard = state_slot_bytes(model, Parallelism(tp), ssm)
        assert shard.conv_bytes * tp == whole.conv_bytes
        assert shard.temporal_bytes * tp == whole.temporal_bytes


def test_gqa_kv_bytes_and_replication() -> None:
    # Qwen3-Next: 12 full layers x K,V x 2 KV heads x 256 x 2 bytes at TP1; one head per GPU from TP2 on
    assert kv_token_bytes(QWEN, Parallelism(1), "auto").row_bytes == 12 * 2 * 2 * 256 * 2
    for tp, replication in ((2, 1), (4, 2), (8, 4)):
        kv = kv_token_bytes(QWEN, Parallelism(tp), "bfloat16")
        assert (kv.row_bytes, kv.replication) == (12 * 2 * 1 * 256 * 2, replication)
    dcp = kv_token_bytes(QWEN, Parallelism(8, 4), "fp8_e4m3")
    assert dcp.bytes_per_token * 4 == 12 * 2 * 256


def test_gdn_state_shapes() -> None:
    s = state_slot_bytes(QWEN, Parallelism(4))
    # conv channels: q and k over 16 key heads, v over 32 value heads, all of dim 128, split by TP
    assert s.conv_shape == (3, (2 * 16 * 128 + 32 * 128) // 4)
    assert s.temporal_shape == (8, 128, 128)
    assert s.ssm_dtype == "float32"  # the model's default when --mamba-ssm-dtype is not given
    assert s.temporal_bytes == 36 * 8 * 128 * 128 * 4


def test_mamba2_model_from_dict() -> None:
    m = model_from_dict(
        {
            "name": "nemotron-like",
            "layer_pattern": "LLLLLF*4+L",
            "full_attention": {"kind": "gqa", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128},
            "linear": {"kind": "mamba2", "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8},
        }
    )
    assert (m.num_linear_layers, m.num_full_layers) == (21, 4)
    s = state_slot_bytes(m, Parallelism(4), "float32")
    assert s.conv_shape == (3, 32 * 64 + 2 * 2 * 128)
    assert s.temporal_shape == (32, 64, 128)
    assert s.conv_bytes == 21 * 3 * (2048 + 512) * 2


# ------------------------------------------------------------------------------------------ resolution laws
def _inputs(budget_gib: float, ratio: float, **kw: object) -> SizingInputs:
    return SizingInputs(
        model=kw.pop("model", KIMI),  # type: ignore[arg-type]
        parallelism=kw.pop("parallelism", Parallelism(8)),  # type: ignore[arg-type]
        cache=kw.pop("cache", CacheConfig(page_size=kw.pop("page_size", 1))),  # type: ignore[arg-type]
        budget=MemoryBudget(budget_gib),
        mamba_full_memory_ratio=ratio,
        mamba_ssm_dtype="bfloat16",
        **kw,  # type: ignore[arg-type]
    )


@given(st.floats(8, 120), st.floats(0.05, 3), st.floats(0.05, 3), st.sampled_from([1, 16, 64]))
def test_budget_split_laws(budget: float, r1: float, r2: float, page: int) -> None:
    lo, hi = sorted((r1, r2))
    a = resolve_pools(_inputs(budget, lo, page_size=page))
    b = resolve_pools(_inputs(budget, hi, page_size=page))
    assert a.num_slots <= b.num_slots  # more ratio, more slots ...
    assert a.num_tokens is not None and b.num_tokens is not None
    assert a.num_tokens >= b.num_tokens  # ... and fewer tokens
    for r in (a, b):
        assert r.num_tokens % page == 0
        used = r.num_slots * r.bytes_per_slot + r.num_tokens * r.kv.row_bytes
        assert used <= MemoryBudget(budget).rest_bytes
        assert r.max_running_requests == min(r.limits.values())


@given(st.integers(4, 200), st.integers(256, 64_000), st.integers(1, 8_000))
def test_balanced_ratio_round_trip(concurrency: int, input_len: int, output_len: int) -> None:
    """Resolving with the recommended ratio in just the recommended memory admits the target concurrency."""
    workload = Workload.fixed(input_len, output_len)
    probe = resolve_pools(_inputs(40.0, 0.9))
    bal = balance(probe, workload, concurrency)
    memory_gib = bal.bytes_needed() / (1 << 30) * 1.001
    r = resolve_pools(_inputs(memory_gib, bal.ratio_admission, max_running_requests=10**6))
    assert r.num_slots // r.slots_per_request >= concurrency - 1
    assert r.num_tokens is not None and r.num_tokens >= (concurrency - 1) * workload.mean_total_len
    # both pools are nearly full at that concurrency: what is left over is the 0.1% of slack plus the
    # remainder of flooring the slot count, which SGLang hands to the KV pool
    slack = bal.bytes_needed() * 0.001
    assert r.num_slots <= bal.slots_admission + slack / r.bytes_per_slot + 1
    assert r.num_tokens <= bal.kv_tokens + (slack + r.bytes_per_slot) / r.kv.row_bytes + 1


def test_spec_intermediate_states_are_reserved() -> None:
    # plain speculative decoding: slots = budget // (slot * (1 + D / ratio)), D states per running request
    cache = CacheConfig(speculative_num_draft_tokens=4)
    r = resolve_pools(_inputs(30.0, 0.5, cache=cache, max_running_requests=32))
    budget = MemoryBudget(30.0).rest_bytes * 0.5 / 1.5
    assert r.num_slots == int(budget // (r.bytes_per_slot * (1 + 4 / 5)))
    assert r.intermediate_bytes == r.bytes_per_slot * min(32, r.num_slots // 5) * 4
    # ReplaySSM replaces them with rings charged per slot
    replay = resolve_pools(_inputs(30.0, 0.5, cache=cache, enable_linear_replayssm_spec=True))
    assert replay.intermediate_bytes == 0 and replay.rings is not None


def test_strategy_sets_the_reservation() -> None:
    slots = {}
    for strategy, overlap_off in (
        ("extra_buffer", False),
        ("extra_buffer", True),
        ("extra_buffer_lazy", False),
        ("no_buffer", False),
    ):
        cache = CacheConfig(mamba_radix_cache_strategy=strategy, disable_overlap_schedule=overlap_off)  # type: ignore[arg-type]
        r = resolve_pools(
            SizingInputs(model=KIMI, parallelism=Parallelism(8), cache=cache, max_mamba_cache_size=120)
        )
        slots[(strategy, overlap_off)] = (r.slots_per_request, r.max_running_requests)
    assert slots == {
        ("extra_buffer", False): (5, 24),
        ("extra_buffer", True): (4, 30),
        ("extra_buffer_lazy", False): (4, 30),
        ("no_buffer", False): (3, 40),
    }


# ----------------------------------------------------------------------------------------------- workloads
def test_trace_lengths_only(tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": list(range(14))},
        {"timestamp": 10, "input_length": 6472, "output_length": 26, "hash_ids": [0, 1, 2]},
        {"timestamp": 20, "input_ids": [1, 2, 3], "output_ids": [4]},
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    w = Workload.from_trace(trace)
    assert [(r.input_len, r.output_len) for r in w.requests] == [(6955, 52), (6472, 26), (3, 1)]
    assert w.mean_input_len == pytest.approx((6955 + 6472 + 3) / 3)


def test_random_range_grid() -> None:
    w = Workload.random_range(1000, 100, 0.5)
    ins = sorted({r.input_len for r in w.requests})
    assert ins[0] == 500 and ins[-1] == 1000
    assert w.mean_input_len == pytest.approx(750, abs=1)
    assert Workload.random_range(1000, 100, 1.0).requests == (RequestShape(1000, 100),)


def test_random_range_zero_matches_bench_serving() -> None:
    # SGLang's compute_random_lens: randint(max(int(len * ratio), 1), len + 1), input and output alike
    w = Workload.random_range(1000, 100, 0.0)
    ins = sorted({r.input_len for r in w.requests})
    outs = sorted({r.output_len for r in w.requests})
    assert (ins[0], ins[-1], outs[0], outs[-1]) == (1, 1000, 1, 100)
    assert w.mean_input_len == pytest.approx(500.5, abs=1) and w.mean_output_len == pytest.approx(50.5, abs=1)
    # floor(len * ratio), never below 1
    assert min(r.input_len for r in Workload.random_range(1000, 100, 0.0015).requests) == 1
    assert min(r.output_len for r in Workload.random_range(1000, 100, 0.25).requests) == 25
    # a zero output length stays zero; None is documented as fixed lengths (ratio 1), not bench's 0
    assert {r.output_len for r in Workload.random_range(1000, 0, 0.0).requests} == {0}
    assert Workload.random_range(1000, 100, None).requests == (RequestShape(1000, 100),)


def test_cli_range_ratio_zero_draws_lengths_from_one(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "kimi-k3", "--memory-budget-gb", "30", "--input-len", "1000", "--output-len", "100"]
    assert main([*args, "--random-range-ratio", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["num_shapes"] == 65 * 65
    assert data["workload"]["mean_input_len"] == pytest.approx(500.5, abs=1)
    assert main([*args, "--random-range-ratio", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["num_shapes"] == 1


# ----------------------------------------------------------------------------------------------------- CLI
SEED_ARGS = [
    "--model", "kimi-k3", "--tp-size", "8", "--kv-cache-dtype", "fp8_e4m3", "--mamba-ssm-dtype", "bfloat16",
    "--mamba-radix-cache-strategy", "extra_buffer", "--chunked-prefill-size", "6144",
    "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "16", "--speculative-num-draft-tokens", "8",
    "--max-mamba-cache-size", "80", "--max-total-tokens", "1947648", "--max-running-requests", "64",
]  # fmt: skip
# the seed's fixed lengths: bench_serving's default range ratio is 0 (lengths drawn from 1 up), so pin 1
SEED_WORKLOAD = ["--input-len", "16384", "--output-len", "3072", "--random-range-ratio", "1"]


def test_cli_table_prints_sglang_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED_ARGS, *SEED_WORKLOAD]) == 0
    out = capsys.readouterr().out
    assert (
        "Mamba Cache is allocated. max_mamba_cache_size: 80, conv_state size: 0.14GB, ssm_state size: 2.05GB"
        in out
    )
    assert (
        "GDN ReplaySSM ring buffers allocated (L=16): d=0.256GB, k=0.256GB, g=0.512GB "
        "rawv=0.256GB, rawk=0.256GB, beta=0.004GB"
    ) in out
    assert "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1947648, KV size: 25.08 GB" in out
    assert "max_running_requests is capped to 16 by the mamba state cache (max_mamba_cache_size=80" in out
    assert "prefill 3 + decode 11 taken; kept 4" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED_ARGS, *SEED_WORKLOAD, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_running_requests"] == 16 and data["binding"] == "mamba state cache"
    assert data["slots_per_request"] == 5 and data["allocated_slots"] == 81
    assert f"{data['kv_gib']:.2f}" == "25.08"
    assert [o["dcp_size"] for o in data["dcp_options"]] == [1, 2, 4, 8]
    assert data["workload"]["per_request"] == {"prefill": 3, "decode": 11, "kept": 4, "seed_bound": 4}


def test_cli_budget_and_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "tiny.json"
    spec.write_text(
        json.dumps(
            {
                "layer_pattern": "LLLF*8",
                "full_attention": {
                    "kind": "mla",
                    "num_q_heads": 16,
                    "kv_lora_rank": 256,
                    "qk_rope_head_dim": 32,
                },
                "linear": {"kind": "kda", "num_heads": 16, "head_dim": 64},
            }
        )
    )
    assert (
        main(
            ["--model", str(spec), "--tp-size", "2", "--gpu-memory-gb", "80", "--weights-gb", "20", "--json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "tiny"
    assert data["budget_gib"] == pytest.approx(80 * 0.9 - 20)
    assert data["kv_bytes_per_token_per_gpu"] == 8 * (256 + 32) * 2


def test_cli_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "kimi-k3", "--tp-size", "5", "--max-mamba-cache-size", "80"]) == 2
    err = capsys.readouterr().err.strip()
    # one line, "<prog>: error: <message>" (the CLI names the command before "error:")
    assert err.count("\n") == 0 and "error: --tp-size 5 does not divide the 96" in err
    assert main([*SEED_ARGS, "--linear-replayssm-cache-len", "12"]) == 2
    assert "not a power of two" in capsys.readouterr().err
    # an unknown dtype is refused by the flag parser itself (argparse exits with status 2)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "--model",
                "kimi-k3",
                "--tp-size",
                "8",
                "--kv-cache-dtype",
                "fp4",
                "--max-mamba-cache-size",
                "80",
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--kv-cache-dtype" in err and "fp4" in err


@pytest.mark.parametrize(
    ("argv", "library", "cli"),
    [
        (
            ["--model", "kimi-k3", "--tp-size", "5", "--max-mamba-cache-size", "80"],
            "tp_size=5 does not divide the 96 key heads of the kda layers of kimi-k3; use a tp_size that divides 96",
            "--tp-size 5 does not divide the 96 key heads of the kda layers of kimi-k3; use a --tp-size that "
            "divides 96",
        ),
        (
            ["--model", "kimi-k3", "--tp-size", "8", "--memory-budget-gb", "0.05"],
            "raise budget.rest_gib or mamba_full_memory_ratio, or use mamba_ssm_dtype='bfloat16'",
            "raise --memory-budget-gb or --mamba-full-memory-ratio, or use --mamba-ssm-dtype bfloat16",
        ),
    ],
    ids=["tp-divides-heads", "budget-too-small"],
)
def test_planner_errors_name_python_arguments_and_the_cli_their_flags(
    argv: list[str], library: str, cli: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The library's message names the Python arguments (``tp_size=5``); the one-line CLI error is the
    same message in the flags that set them (``--tp-size 5``), through ``flag_message``."""
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    with pytest.raises(ConfigError) as e:
        plan(build_inputs(parser.parse_args(argv)))
    assert library in str(e.value) and "--" not in str(e.value)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("mamba-radix plan: error: ") and cli in err
    assert library not in err


def test_module_runs_standalone() -> None:
    help_run = subprocess.run(
        [sys.executable, "-m", "mamba_radix.capacity.cli", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert help_run.returncode == 0
    for flag in (
        "--tp-size",
        "--dcp-size",
        "--mamba-full-memory-ratio",
        "--linear-replayssm-cache-len",
        "--trace",
    ):
        assert flag in help_run.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "mamba_radix.capacity.cli",
            "--model",
            "qwen3-next-80b-a3b",
            "--tp-size",
            "32",
            "--max-mamba-cache-size",
            "64",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_workload_can_exhaust_kv_before_the_state_cache() -> None:
    # long sequences: SGLang's state cap admits more requests than the KV pool holds at their peak
    inputs = SizingInputs(
        model=QWEN,
        parallelism=Parallelism(4),
        cache=CacheConfig(),
        budget=MemoryBudget(34.0),
        mamba_full_memory_ratio=0.9,
    )
    p = plan(inputs, Workload.fixed(8192, 1024))
    r = p.resolution
    assert r.binding == "mamba state cache"
    assert p.workload_kv_limit == r.num_tokens // 9216 < r.max_running_requests
    assert p.workload_binding == "full KV tokens"
    short = plan(inputs, Workload.fixed(512, 128))
    assert short.workload_binding == "mamba state cache"
