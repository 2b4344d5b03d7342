"""Unified memory in the simulator (issue 26): one byte budget, slots and KV tokens moving with load,
the give-way rules at the edge (:mod:`mamba_radix.sim.unified`), and SGLang's starvation (#34441) absent."""

from __future__ import annotations

from typing import Any

import pytest

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.capacity_limit import LimitedMambaPool, limited_kv_allocator
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.split import SplitOptions
from mamba_radix.sim.traces import TraceRequest
from mamba_radix.sim.unified import UnifiedMemoryCache

KV_BYTES, SLOT_BYTES = 100, 1_000  # one slot costs ten KV tokens
RULES = ("sglang", "older_victim", "floor")


def config(rule: str | None, **kw: Any) -> CacheConfig:
    return CacheConfig(
        mamba_radix_cache_strategy="extra_buffer",
        mamba_cache_chunk_size=4,
        mamba_track_interval=8,
        enable_unified_memory=rule is not None,
        unified_memory_give_way=rule or "sglang",
        **kw,
    )


def pools(kv_tokens: int, slots: int) -> PoolSizes:
    return PoolSizes(kv_tokens, slots, 0, 1.0, 0.5, KV_BYTES, SLOT_BYTES, "test")


def burst(n: int, prompt_len: int, output_len: int = 4) -> list[TraceRequest]:
    """``n`` distinct prompts all arriving at once (timed mode runs as many as fit)."""
    return [
        TraceRequest.from_tokens(
            i, 0.0, [100_000 * (i + 1) + j for j in range(prompt_len)], list(range(output_len))
        )
        for i in range(n)
    ]


def rounds(num_prefixes: int, passes: int, prefix_len: int) -> list[TraceRequest]:
    reqs = []
    for r in range(passes):
        for p in range(num_prefixes):
            prompt = [10_000 * (p + 1) + j for j in range(prefix_len)] + [r]
            reqs.append(TraceRequest.from_tokens(len(reqs), 0.0, prompt, [1, 2, 3, 4]))
    return reqs


def run(rule: str | None, reqs: list[TraceRequest], pool: PoolSizes, mode: str = "timed") -> Engine:
    options = EngineOptions(mode=mode, check_invariants_every=1, keep_per_request=True)  # type: ignore[arg-type]
    engine = Engine(config(rule), pool, max(r.input_len + r.output_len for r in reqs), options)
    engine.run(reqs)
    return engine


@pytest.mark.parametrize("rule", RULES)
def test_short_requests_get_more_slots_and_running_requests_than_the_static_split(rule: str) -> None:
    reqs, pool = burst(60, 8), pools(2_000, 20)  # 20 slots: 4 running requests under the static split
    static, unified = run(None, reqs, pool), run(rule, reqs, pool)
    assert static.metrics.peak_running <= static.max_running == 4
    assert unified.metrics.peak_running > static.max_running
    assert max(s.slots_used for s in unified.metrics.samples) > pool.state_slots
    assert unified.finished == static.finished == len(reqs) and unified.rejected == 0
    used = unified.kv_pool.used * KV_BYTES + unified.mamba_pool.used * SLOT_BYTES
    assert used <= unified.unified_bytes == 2_000 * KV_BYTES + 20 * SLOT_BYTES


@pytest.mark.parametrize("rule", RULES)
def test_long_requests_get_more_kv_than_the_static_split(rule: str) -> None:
    reqs, pool = burst(12, 300, 20), pools(500, 60)  # 500 KV tokens: one 320-token request at a time
    static, unified = run(None, reqs, pool), run(rule, reqs, pool)
    assert max(s.kv_used_tokens for s in static.metrics.samples) <= pool.kv_tokens
    assert max(s.kv_used_tokens for s in unified.metrics.samples) > pool.kv_tokens
    assert unified.metrics.peak_running > static.metrics.peak_running
    assert unified.finished == len(reqs) and unified.rejected == 0


def test_rules_give_identical_hits_where_the_sides_never_meet() -> None:
    reqs, pool = rounds(6, 4, 40), pools(50_000, 500)
    hits = {}
    for rule in (None, *RULES):
        engine = run(rule, reqs, pool, mode="sequential")
        hits[rule] = [(r["index"], r["hit"]) for r in engine.metrics.per_request]
        assert engine.cache.stats.tokens_evicted == engine.cache.stats.states_evicted == 0
    assert all(h == hits[None] for h in hits.values()) and sum(h for _, h in hits[None]) > 0


@pytest.mark.parametrize("rule", RULES)
def test_a_tight_budget_keeps_the_invariants_and_every_request_runs(rule: str) -> None:
    reqs = rounds(12, 5, 40)
    for mode in ("sequential", "timed"):
        engine = run(rule, reqs, pools(300, 12), mode=mode)  # invariants after every finish
        assert engine.finished == len(reqs) and engine.rejected == 0


# ---------------------------------------------------------------------------- starvation (#34441)
def kv_only_cache(order: Any = None) -> UnifiedMemoryCache:
    """A unified cache whose KV holds the bytes: prefix P (50 tokens) with two 10-token branches, each
    with a checkpoint, in a budget 500 B short of one more slot."""
    cache = UnifiedMemoryCache.build(
        config("sglang", mamba_kv_only_leaves=True),
        num_tokens=200,
        num_slots=20,
        mamba_pool_factory=LimitedMambaPool,
        kv_allocator_factory=limited_kv_allocator,
    )
    if order is not None:
        cache._order = order  # type: ignore[method-assign]
    cache.attach_budget(70 * KV_BYTES + 2 * SLOT_BYTES + 500, KV_BYTES, SLOT_BYTES)
    prefix = list(range(1, 51))
    kv = cache.token_to_kv_pool_allocator.alloc(60)
    assert kv is not None
    cache.insert(prefix + list(range(100, 110)), kv, cache.mamba_pool.alloc(1, as_list=True)[0])
    more = cache.token_to_kv_pool_allocator.alloc(10)
    assert more is not None
    import torch

    kv2 = torch.cat([kv[:50], more])
    cache.insert(prefix + list(range(200, 210)), kv2, cache.mamba_pool.alloc(1, as_list=True)[0], 50)
    assert cache.mamba_pool.available_size() == 0
    return cache


def test_a_state_shortfall_falls_back_to_kv_eviction_under_sglang() -> None:
    cache = kv_only_cache()
    slots = [cache.alloc_state_slot() for _ in range(7)]
    assert None not in slots  # the checkpoints went first, then the KV-only prefix gave way
    assert cache.full_evictable_size() == 0 and cache.stats.tokens_evicted == 70
    cache.check_invariants()


def test_without_the_fallback_states_starve_while_kv_holds_the_bytes() -> None:
    """SGLang before PR #36713: a state shortfall evicted states only."""
    cache = kv_only_cache(order=lambda rule, kind: (kind,))
    slots = [cache.alloc_state_slot() for _ in range(7)]
    assert None in slots and cache.full_evictable_size() == 50  # the KV-only prefix holds the bytes


# ------------------------------------------------------------------------------------ refusals, CLI
def test_unified_memory_is_refused_with_an_adaptive_split() -> None:
    with pytest.raises(ConfigError, match="choose one"):
        Engine(config("sglang"), pools(400, 20), 64, EngineOptions(split=SplitOptions()))


def test_the_cli_runs_unified_memory_and_refuses_the_adaptive_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mamba_radix.cli import main

    common = ["simulate", "--limit", "100", "--kv-tokens", "200000", "--state-slots", "64", "--quiet"]
    for rule in RULES:
        args = [*common, "--mode", "sequential", "--no-verify-states", "--check-invariants-every", "10"]
        assert main([*args, "--enable-unified-memory", "--unified-memory-give-way", rule]) == 0
    capsys.readouterr()
    assert main([*common, "--enable-unified-memory", "--adaptive-split"]) == 2
    assert "choose one" in capsys.readouterr().err
