"""Every figure the seeds print about memory, reproduced from the byte math to the printed precision.

Each test names the seed and quotes the figure. Inputs are what the seeds state (model shapes, TP, dtypes,
slot and token counts); outputs are computed, never looked up.
"""

from __future__ import annotations

import pytest

from mamba_radix.capacity import (
    PRESETS,
    MemoryBudget,
    Parallelism,
    SizingInputs,
    balance,
    capped_message,
    decode_slots_in_use,
    expected_checkpoints,
    kv_pool_bytes,
    kv_token_bytes,
    plan,
    replay_ring_bytes,
    resolve_pools,
    state_slot_bytes,
)
from mamba_radix.capacity.memory import GIB, MIB, gib, kib, mib, torch_dtype_name
from mamba_radix.capacity.planner import Workload, compare_dcp, decode_checkpoint_positions
from mamba_radix.config import CacheConfig

KIMI = PRESETS["kimi-k3"]
TP8 = Parallelism(tp_size=8)
RING_NAMES = ("d", "k", "g", "rawv", "rawk", "beta")


def gb2(num_bytes: int) -> str:  # SGLang's pool log precision
    return f"{gib(num_bytes):.2f}"


def gb3(num_bytes: int) -> str:  # SGLang's ReplaySSM ring log precision
    return f"{gib(num_bytes):.3f}"


# ----------------------------------------------------------------------------------------- model structure
def test_kimi_k3_layers_seed000() -> None:
    # "93层 = 23模块x (3 linear + 1 MLA) + 最后一层 MLA，也就是69 KDA linear + 24 MLA dense层"
    assert (KIMI.num_layers, KIMI.num_linear_layers, KIMI.num_full_layers) == (93, 69, 24)
    assert KIMI.layers.endswith("LLLFF") and KIMI.layers.startswith("LLLF")


def test_qwen3_next_layers_design() -> None:
    qwen = PRESETS["qwen3-next-80b-a3b"]
    assert (qwen.num_layers, qwen.num_linear_layers, qwen.num_full_layers) == (48, 36, 12)


# ------------------------------------------------------------------------------------------------ KV bytes
def test_mla_kv_per_token_seed000() -> None:
    # "24（layer）*576*2 (bf16) = 27 KB" and "直接减半为每个token 13.5 KB"
    bf16 = kv_token_bytes(KIMI, TP8, "bfloat16")
    fp8 = kv_token_bytes(KIMI, TP8, "fp8_e4m3")
    assert bf16.elements_per_layer == 576
    assert f"{kib(bf16.bytes_per_token):g}" == "27"
    assert f"{kib(fp8.bytes_per_token):g}" == "13.5"
    # "在TP并行，非DP attention/DCP的情况下，同一个请求每个GPU的KV cache是一模一样的"
    assert kv_token_bytes(KIMI, Parallelism(1), "bfloat16").row_bytes == bf16.row_bytes
    assert bf16.replication == 8


@pytest.mark.parametrize(
    ("dtype", "num_tokens", "torch_name", "printed"),
    [
        ("bfloat16", 974_656, "torch.bfloat16", "25.10"),  # seed 000 / 001 sample 1
        ("fp8_e4m3", 1_947_648, "torch.float8_e4m3fn", "25.08"),  # seed 000 / 001 sample 2
    ],
)
def test_kv_pool_log_seed000(dtype: str, num_tokens: int, torch_name: str, printed: str) -> None:
    # "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 974656, KV size: 25.10 GB"
    kv = kv_token_bytes(KIMI, TP8, dtype)
    assert torch_dtype_name(kv.dtype) == torch_name
    for page_size in (1, 64):  # the padding page does not move the printed figure
        assert gb2(kv_pool_bytes(kv, num_tokens, page_size)) == printed


# --------------------------------------------------------------------------------------------- state bytes
def test_kda_state_shapes_tp8_seed000() -> None:
    # "conv state shape = [3, 1536 × 3] = [3, 4608] SSM state shape = [12, 128, 128]"
    state = state_slot_bytes(KIMI, TP8, "bfloat16")
    assert state.conv_shape == (3, 3 * 1536)
    assert state.temporal_shape == (12, 128, 128)


def test_kda_state_per_request_tp8_seed000() -> None:
    # "SSM大小为96/8*128*128*69(layer)*2 (bf16) = 25.9MB。conv state大小为3*1536*3*69*2 = 1.82MB"
    state = state_slot_bytes(KIMI, TP8, "bfloat16", "bfloat16")
    assert state.temporal_bytes == 96 // 8 * 128 * 128 * 69 * 2
    assert f"{mib(state.temporal_bytes):.3g}" == "25.9"
    assert f"{mib(state.conv_bytes):.3g}" == "1.82"
    # "TP 8总和为(25.9+1.82)*8 = 221.8MB": the seed sums its rounded figures; the exact sum is 221.6 MiB.
    rounded_sum = (round(mib(state.temporal_bytes), 1) + round(mib(state.conv_bytes), 2)) * 8
    assert f"{rounded_sum:.1f}" == "221.8"
    assert f"{mib(state.slot_bytes * 8):.1f}" == "221.6"
    # TP splits the state: the eight shards add up to the TP1 state exactly.
    assert state_slot_bytes(KIMI, Parallelism(1), "bfloat16").slot_bytes == 8 * state.slot_bytes


def test_hundred_requests_need_about_22_gb_seed001() -> None:
    # "如果你要支持 100 路并发，光 linear state 就要 22 GB 左右" (over the 8 GPUs of TP8, bf16)
    state = state_slot_bytes(KIMI, TP8, "bfloat16")
    assert round(gib(100 * 8 * state.slot_bytes)) == 22


@pytest.mark.parametrize(
    ("slots", "ssm_dtype", "conv", "ssm"),
    [
        (
            51,
            "float32",
            "0.09",
            "2.63",
        ),  # "max_mamba_cache_size: 51, conv_state size: 0.09GB, ssm_state size: 2.63GB"
        (
            80,
            "bfloat16",
            "0.14",
            "2.05",
        ),  # "max_mamba_cache_size: 80, conv_state size: 0.14GB, ssm_state size: 2.05GB"
    ],
)
def test_mamba_pool_log_seed000(slots: int, ssm_dtype: str, conv: str, ssm: str) -> None:
    state = state_slot_bytes(KIMI, TP8, ssm_dtype)
    assert gb2(state.pool_conv_bytes(slots)) == conv
    assert gb2(state.pool_temporal_bytes(slots)) == ssm
    # "实际分配的slot为size + 1": without the padding slot the fp32 figure would read 2.58, not 2.63.
    if slots == 51:
        assert gb2(slots * state.temporal_bytes) != ssm


# --------------------------------------------------------------------------------------------------- rings
def test_ring_bytes_l16_81_slots_seed000() -> None:
    # "所有 ring 都按 69 层、81 个 slot、16 个位置分配"
    rings = replay_ring_bytes(KIMI, TP8, cache_len=16)
    assert rings.pool_bytes("d", 80) == 69 * 81 * 12 * 16 * 128 * 2 == 274_710_528
    assert rings.pool_bytes("g", 80) == 549_421_056  # "包含最后一个 128 维，而且强制使用 FP32"
    assert rings.pool_bytes("beta", 80) == 4_292_352
    assert f"{gib(rings.pool_bytes('d', 80)):.6f}" == "0.255844"
    assert f"{gib(rings.pool_bytes('g', 80)):.6f}" == "0.511688"
    assert f"{gib(rings.pool_bytes('beta', 80)):.6f}" == "0.003998"
    printed = {name: gb3(rings.pool_bytes(name, 80)) for name in RING_NAMES}
    assert printed == {
        "d": "0.256",
        "k": "0.256",
        "g": "0.512",
        "rawv": "0.256",
        "rawk": "0.256",
        "beta": "0.004",
    }
    # "d + k + g + rawv + rawk + beta = 1.539063 GiB"; "每个 slot 跨 69 层：20,401,920 bytes ≈ 19.457 MiB"
    total = sum(rings.pool_bytes(n, 80) for n in RING_NAMES)
    assert total == 81 * rings.slot_bytes
    # 81 x 20,401,920 = 1,652,555,520 bytes = 1.5390623 GiB: the seed's last digit (1.539063) is one off;
    # it agrees to the five decimals its own per-slot figure supports.
    assert f"{gib(total):.5f}" == "1.53906"
    assert abs(gib(total) - 1.539063) < 1e-6
    assert rings.slot_bytes == 20_401_920
    assert f"{mib(rings.slot_bytes):.3f}" == "19.457"
    # "d + k = 0.511688 GiB/卡 属于当前实现的额外开销"
    assert f"{gib(rings.pool_bytes('d', 80) + rings.pool_bytes('k', 80)):.6f}" == "0.511688"


def test_kda_gate_is_128x_a_gdn_gate_seed000() -> None:
    # "真正 GDN 的g是每 head 一个标量, shape 为[69,81,12,16]; KDA 的g是 128 维向量，所以恰好大 128 倍"
    rings = replay_ring_bytes(KIMI, TP8, cache_len=16)
    assert rings.shapes["g"] == (12, 16, 128)
    assert rings.shapes["beta"] == (12, 16)
    qwen = PRESETS["qwen3-next-80b-a3b"]
    gdn = replay_ring_bytes(qwen, TP8, cache_len=16)
    assert gdn.shapes["g"] == gdn.shapes["beta"]


def test_ring_log_at_51_slots_seed000() -> None:
    # sample 1: "GDN ReplaySSM ring buffers allocated (L=16): d=0.164GB, k=0.164GB, g=0.328GB
    # rawv=0.164GB, rawk=0.164GB, beta=0.003GB"
    rings = replay_ring_bytes(KIMI, TP8, cache_len=16)
    printed = {name: gb3(rings.pool_bytes(name, 51)) for name in RING_NAMES}
    assert printed == {
        "d": "0.164",
        "k": "0.164",
        "g": "0.328",
        "rawv": "0.164",
        "rawk": "0.164",
        "beta": "0.003",
    }


def test_ring_log_seed001_matches_exactly_one_pool_size() -> None:
    # seed 001 §4.4 prints "d=0.379GB, k=0.379GB, g=0.758GB rawv=0.379GB, rawk=0.379GB, beta=0.006GB" without
    # the pool size; the byte math admits exactly one size for all six figures: 119 slots (120 allocated).
    rings = replay_ring_bytes(KIMI, TP8, cache_len=16)
    wanted = {"d": "0.379", "k": "0.379", "g": "0.758", "rawv": "0.379", "rawk": "0.379", "beta": "0.006"}
    sizes = [n for n in range(1, 2000) if {k: gb3(rings.pool_bytes(k, n)) for k in RING_NAMES} == wanted]
    assert sizes == [119]


def test_ring_len_rule_seed001() -> None:
    # "它必须满足L >= 2 × 最大 speculative verify token 数，且必须是 2 的幂。DSpark 里 gamma=7，target verify
    # window = 1 anchor + 7 drafts = 8，所以 L 最小为 16。"
    verify = 1 + 7
    allowed = [L for L in range(1, 65) if _ring_ok(L, verify)]
    assert allowed == [16, 32, 64]


def _ring_ok(cache_len: int, verify: int) -> bool:
    from mamba_radix.errors import ConfigError

    try:
        replay_ring_bytes(KIMI, TP8, cache_len=cache_len, verify_tokens=verify)
    except ConfigError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- resolution
def _seed_sample2(**changes: object) -> SizingInputs:
    """Seed 001's launch (TP8, fp8 KV, bf16 SSM, extra_buffer, ReplaySSM L=16, DSpark 1 + 7, chunk 6144,
    --max-running-requests 64) with the pool sizes its log prints (80 slots, 1,947,648 tokens)."""
    base = {
        "model": KIMI,
        "parallelism": TP8,
        "cache": CacheConfig(
            mamba_radix_cache_strategy="extra_buffer",
            chunked_prefill_size=6144,
            speculative_num_draft_tokens=8,
        ),
        "kv_cache_dtype": "fp8_e4m3",
        "mamba_ssm_dtype": "bfloat16",
        "enable_linear_replayssm_spec": True,
        "linear_replayssm_cache_len": 16,
        "max_mamba_cache_size": 80,
        "max_total_tokens": 1_947_648,
        "max_running_requests": 64,
    }
    base.update(changes)
    return SizingInputs(**base)  # type: ignore[arg-type]


def test_capped_to_16_by_the_state_cache_seed001() -> None:
    # "max_running_requests is capped to 16 by the mamba state cache (max_mamba_cache_size=80, 5 state slots
    # per request)." -- "extra_buffer 模式下每请求预留 5 个（基础安全容量 3 + overlap ping-pong buffer 2），80/5=16"
    r = resolve_pools(_seed_sample2())
    assert r.slots_per_request == 5
    assert r.max_running_requests == 16
    assert r.binding == "mamba state cache"
    assert r.message is not None
    assert r.message.startswith(
        "max_running_requests is capped to 16 by the mamba state cache "
        "(max_mamba_cache_size=80, 5 state slots per request). To raise it: "
    )
    # With an fp32 state the whole line is SGLang's, word for word.
    assert capped_message(16, 80, 5, "float32") == (
        "max_running_requests is capped to 16 by the mamba state cache (max_mamba_cache_size=80, 5 state slots "
        "per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the "
        "state size with --mamba-ssm-dtype bfloat16."
    )
    # "如果显存实在紧，试SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1降到 4 个 slot": 80 // 4 = 20.
    skip = resolve_pools(_seed_sample2(cache=_seed_sample2().cache.replace(skip_decode_lock=True)))
    assert (skip.slots_per_request, skip.max_running_requests) == (4, 20)


SGLANG_HEAD = (
    "max_running_requests is capped to {n} by the mamba state cache (max_mamba_cache_size=80, {s} state slots "
    "per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size"
)
BF16_HINT = ", or halve the state size with --mamba-ssm-dtype bfloat16"


def _capped(strategy: str, ssm: str, **cache: object) -> str:
    config = CacheConfig(mamba_radix_cache_strategy=strategy, chunked_prefill_size=6144, **cache)  # type: ignore[arg-type]
    # no speculative decoding and no rings: every strategy (no_buffer too) sizes alike
    r = resolve_pools(
        _seed_sample2(
            cache=config, mamba_ssm_dtype=ssm, enable_linear_replayssm_spec=False, max_running_requests=None
        )
    )
    assert r.state_capped and r.message is not None
    return r.message


@pytest.mark.parametrize(
    ("strategy", "ssm", "cache", "expected"),
    [
        # fp32, extra_buffer, switch off: SGLang's bf16 clause, then the switch (5 -> 4 slots)
        ("extra_buffer", "float32", {}, SGLANG_HEAD.format(n=16, s=5)
         + BF16_HINT + ", or set SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 (4 state slots per request instead of 5)."),
        # a 16-bit state cannot be halved again: only the switch
        ("extra_buffer", "bfloat16", {}, SGLANG_HEAD.format(n=16, s=5)
         + ", or set SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 (4 state slots per request instead of 5)."),
        ("extra_buffer_lazy", "bfloat16", {}, SGLANG_HEAD.format(n=20, s=4)
         + ", or set SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 (3 state slots per request instead of 4)."),
        # the switch already on: never suggested again; bf16 state: the sentence ends after the size hint
        ("extra_buffer", "bfloat16", {"skip_decode_lock": True}, SGLANG_HEAD.format(n=20, s=4) + "."),
        ("extra_buffer", "float32", {"skip_decode_lock": True}, SGLANG_HEAD.format(n=20, s=4) + BF16_HINT + "."),
        # no_buffer keeps 3 slots with the switch on: SGLang's line word for word with fp32, bare with bf16
        ("no_buffer", "float32", {}, SGLANG_HEAD.format(n=26, s=3) + BF16_HINT + "."),
        ("no_buffer", "bfloat16", {}, SGLANG_HEAD.format(n=26, s=3) + "."),
    ],
    ids=["fp32-eager", "bf16-eager", "bf16-lazy", "bf16-skip-on", "fp32-skip-on", "fp32-no-buffer", "bf16-no-buffer"],
)  # fmt: skip
def test_capped_warning_gives_only_hints_that_change_something(
    strategy: str, ssm: str, cache: dict[str, object], expected: str
) -> None:
    assert _capped(strategy, ssm, **cache) == expected


def test_capped_warning_without_radix_cache_never_suggests_the_switch() -> None:
    # one slot per request with the radix cache off, switch or not
    assert capped_message(16, 80, 1, "bfloat16", slots_per_request_with_skip_lock=1) == (
        "max_running_requests is capped to 16 by the mamba state cache (max_mamba_cache_size=80, 1 state slots "
        "per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size."
    )
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_radix_cache=True)
    r = resolve_pools(
        _seed_sample2(cache=config, enable_linear_replayssm_spec=False, max_mamba_cache_size=10)
    )
    assert r.slots_per_request == 1 and r.message is not None
    assert "SKIP_DECODE_LOCK" not in r.message and r.message.endswith("--max-mamba-cache-size.")


def test_sample2_log_lines_from_resolution_seed001() -> None:
    r = resolve_pools(_seed_sample2())
    assert r.rings is not None
    assert (gb2(r.state.pool_conv_bytes(r.num_slots)), gb2(r.state.pool_temporal_bytes(r.num_slots))) == (
        "0.14",
        "2.05",
    )
    assert gb3(r.rings.pool_bytes("g", r.num_slots)) == "0.512"
    assert r.num_tokens == 1_947_648
    assert r.kv_pool_bytes is not None and gb2(r.kv_pool_bytes) == "25.08"


def test_in16k_out3k_imbalance_seed000() -> None:
    # "# in 16k out 3k Decode batch, #running-req: 16, #full token: 206080, full token usage: 0.11,
    #  mamba num: 64, mamba usage: 0.80"
    inputs = _seed_sample2()
    p = plan(inputs, Workload.fixed(16384, 3072))
    r = p.resolution
    assert r.max_running_requests == 16 and r.binding == "mamba state cache"
    # usage as the log computes it, from the pool sizes the planner resolved
    assert f"{206_080 / r.num_tokens:.2f}" == "0.11"
    # a decoding extra_buffer request occupies live + 2 ping-pong + its locked checkpoint = 4 slots
    assert decode_slots_in_use(inputs.cache) == 4
    assert 16 * decode_slots_in_use(inputs.cache) == 64
    assert f"{p.state_usage_at_max_running:.2f}" == "0.80"
    # even at their peak (whole 19,456-token sequences) the 16 requests leave >= 84% of the KV idle
    assert p.kv_usage_at_max_running is not None and p.kv_usage_at_max_running <= 0.16
    assert 206_080 / r.num_tokens <= p.kv_usage_at_max_running
    assert p.workload_binding == "mamba state cache" and p.workload_kv_limit == 1_947_648 // 19_456
    # the fix: in the same memory, the balanced split runs far more requests, at a ratio far above the
    # seed's 0.15 (the state and KV of one such request cost about the same: ratio ~ 0.92)
    assert p.max_concurrency_admission is not None and p.max_concurrency_admission >= 3 * 16
    b = balance(r, Workload.fixed(16384, 3072), concurrency=16)
    assert 0.85 < b.ratio_admission < 1.0
    assert b.slots_admission == 80  # 16 x 5: the seed's pool is exactly the admission minimum at 16


# ------------------------------------------------------------------------------------- checkpoints per request
def test_checkpoints_13600_in_seed000() -> None:
    # "例如输入13600, 输出512， chunked prefill=6144，总共进行3次prefill计算，存3个state，然后decode完成存一次
    # ... 总共4个mamba state" and "in_len // chunked_prefill_size + 2"
    for strategy in ("extra_buffer", "no_buffer"):
        cache = CacheConfig(mamba_radix_cache_strategy=strategy, chunked_prefill_size=6144)  # type: ignore[arg-type]
        c = expected_checkpoints(cache, 13600, 512)
        assert c.prefill == 3
        assert c.kept == 4 == c.seed_bound == 13600 // 6144 + 2


def test_track_interval_positions_seed000() -> None:
    # "prompt 长度为1000、interval 为256，decode checkpoint 会在总长度：1024、1280、1536……也就是分别 decode 约24、
    # 280、536……个已处理 token 后触发"
    cache = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    positions = decode_checkpoint_positions(cache, 1000, 600)
    assert positions[:3] == [1024, 1280, 1536]
    assert [p - 1000 for p in positions[:3]] == [24, 280, 536]
    # "decode部分如果输出很短，不会产生新的mamba state"
    assert expected_checkpoints(cache, 1000, 20).decode == 0


def test_dcp_multiplies_the_ratio_by_tp_seed000() -> None:
    # "只开TP不开启DCP时... 比例更低，而开启DCP时，没有这个冗余，这个mem ratio要乘以TP数"
    r = resolve_pools(_seed_sample2())
    options = {o.dcp_size: o for o in compare_dcp(r, Workload.fixed(16384, 3072), concurrency=16)}
    assert sorted(options) == [1, 2, 4, 8]
    assert options[8].ratio_admission == pytest.approx(8 * options[1].ratio_admission, rel=1e-12)
    assert options[8].kv_bytes_per_token * 8 == options[1].kv_bytes_per_token


def test_budget_path_reproduces_sglang_split() -> None:
    # SGLang: state budget = rest * r / (1 + r); slots = budget // bytes_per_slot; KV gets the rest.
    budget = MemoryBudget(28.8)
    r = resolve_pools(
        _seed_sample2(
            max_mamba_cache_size=None, max_total_tokens=None, budget=budget, mamba_full_memory_ratio=0.15
        )
    )
    per_slot = r.bytes_per_slot
    assert r.num_slots == int(budget.rest_bytes * 0.15 / 1.15 // per_slot)
    assert r.num_tokens == (budget.rest_bytes - r.num_slots * per_slot) // r.kv.row_bytes
    # the seeds' neighbourhood: ~80 slots and ~1.95M fp8 tokens in ~28.8 GiB at ratio 0.15
    assert 75 <= r.num_slots <= 85
    assert abs(r.num_tokens - 1_947_648) < 0.03 * 1_947_648
    assert r.state_pool_bytes + (r.kv_pool_bytes or 0) <= budget.rest_bytes + per_slot + r.kv.row_bytes
    assert GIB == 1 << 30 and MIB == 1 << 20
