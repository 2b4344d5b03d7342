"""Unified memory in the simulator at page sizes > 1 (issue 26, item 1): KV charged and refunded to the
shared byte budget in whole pages (:class:`~mamba_radix.sim.capacity_limit.LimitedPagedKVAllocator`), the
invariant suite over :class:`~mamba_radix.sim.unified.UnifiedMemoryCache` at page sizes 1, 4 and 16 under
each give-way rule, the engine running a paged unified workload with hits, and the adaptive split moving
its line in whole pages."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import settings

from mamba_radix.config import UNIFIED_GIVE_WAY_RULES, CacheConfig
from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.pools import PagedTokenToKVPoolAllocator
from mamba_radix.pools.unified import STATE
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.capacity_limit import (
    LimitedKVAllocator,
    LimitedMambaPool,
    LimitedPagedKVAllocator,
    SharedByteBudget,
    limited_kv_allocator,
)
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.split import AdaptiveSplit, SplitOptions
from mamba_radix.sim.traces import TraceRequest
from mamba_radix.sim.unified import UnifiedMemoryCache
from mamba_radix.testing import make_machine
from mamba_radix.testing.unified_adapter import UnifiedRadixAdapter, unified_params

KV_BYTES, SLOT_BYTES = 10, 100  # one slot costs ten KV tokens


def paged_budget(
    page: int, total_bytes: int, kv_tokens: int = 64
) -> tuple[Any, LimitedMambaPool, SharedByteBudget]:
    kv = limited_kv_allocator(kv_tokens, page)
    states = LimitedMambaPool(
        max(total_bytes // SLOT_BYTES, 1), 1, [(2, 2)], (2,), torch.float32, torch.float32
    )
    budget = SharedByteBudget(total_bytes, KV_BYTES, SLOT_BYTES)
    budget.attach(kv, states)
    return kv, states, budget


# ------------------------------------------------------------------------------- the paged allocator
def test_limited_kv_allocator_is_paged_above_page_size_one() -> None:
    assert type(limited_kv_allocator(16, 1)) is LimitedKVAllocator
    paged = limited_kv_allocator(16, 4)
    assert isinstance(paged, LimitedPagedKVAllocator) and isinstance(paged, PagedTokenToKVPoolAllocator)
    with pytest.raises(InvalidArgument, match="multiple of page_size"):
        limited_kv_allocator(18, 4)


def test_the_budget_charges_and_refunds_whole_pages() -> None:
    kv, states, budget = paged_budget(4, 370)  # 37 tokens' bytes: 9 whole pages of 4 (36 tokens)
    assert budget.kv_page_size == 4 and kv.available_size() == 36
    one = kv.alloc_extend([0], [1], [-1], 1)  # one token takes a whole page
    assert one is not None and kv.used == 4 and budget.used_bytes("kv") == 40
    # the state side sees the page's bytes gone: 330 B buy 3 slots; 3 slots leave 30 B, short of a page
    assert states.available_size() == 3
    slots = states.alloc(3)
    assert slots is not None and budget.room_bytes("kv") == 30 and kv.available_size() == 0
    assert kv.alloc_extend([0], [1], [-1], 1) is None and kv.used == 4  # refused: nothing taken
    # continuing the partial page takes no fresh page, so it fits in no free bytes at all
    more = kv.alloc_extend([1], [4], [int(one[0])], 3)
    assert more is not None and kv.used == 4 and torch.equal(more, one + torch.arange(1, 4))
    states.free(slots[:1])  # 130 B free: three pages (12 tokens), the last 10 B stay the states'
    assert kv.available_size() == 12 and states.available_size() == 1
    kv.free(one)  # the whole page comes back
    assert kv.used == 0 and budget.used_bytes() == 200 and kv.available_size() == 16


def test_alloc_decode_and_alloc_refuse_past_the_budget_and_change_nothing() -> None:
    kv, states, budget = paged_budget(4, 80)  # two pages of KV bytes, less than one slot's
    first = kv.alloc_extend([0], [7], [-1], 7)  # positions 0..6: two pages
    assert first is not None and kv.used == 8 and kv.available_size() == 0
    # position 7 continues the second page: no fresh page, so no bytes needed
    seventh = kv.alloc_decode([8], [int(first[-1])])
    assert seventh is not None and int(seventh[0]) == int(first[-1]) + 1 and kv.used == 8
    before = (kv.used, budget.used_bytes())
    # position 8 starts a page: a fresh one, past the budget: refused, nothing taken
    assert kv.alloc_decode([9], [int(seventh[0])]) is None and (kv.used, budget.used_bytes()) == before
    assert kv.alloc(4) is None and (kv.used, budget.used_bytes()) == before
    with pytest.raises(InvalidArgument):  # misuse is still the parent's error, not a quiet None
        kv.alloc_extend([0, 1], [1], [-1], 1)
    with pytest.raises(InvalidArgument, match="not a multiple"):
        kv.alloc(3)
    assert states.available_size() == 0
    kv.free(first)
    assert kv.available_size() == 8 and states.available_size() == 0  # 80 B: not one 100 B slot


def test_set_capacity_moves_whole_pages_only() -> None:
    kv = LimitedPagedKVAllocator(32, 8)
    kv.set_capacity(16)
    assert kv.available_size() == 16 and kv.alloc(24) is None and kv.used == 0
    with pytest.raises(InvalidArgument, match="use 8"):
        kv.set_capacity(12)
    assert kv.capacity == 16
    assert kv.alloc_extend([0], [17], [-1], 17) is None  # three pages past a two-page capacity


# ------------------------------------------------------------------------- the invariant suite, paged
# One machine per page size (1, 4, 16) and give-way rule, extra_buffer (no_buffer runs at page size 1
# only): the whole suite plus the byte budget's invariants, pages never split, after every step.
def _machine(page: int, rule: str) -> Any:
    machine = make_machine(
        UnifiedRadixAdapter,
        unified_params(page_sizes=(page,), give_way_rules=(rule,)),
        f"UnifiedPagedMachine_p{page}_{rule}",
    )
    case = machine.TestCase
    case.settings = settings(settings.default, max_examples=max(3, settings.default.max_examples // 10))
    return case


for _page in (1, 4, 16):
    for _rule in UNIFIED_GIVE_WAY_RULES:
        globals()[f"TestUnifiedPaged_p{_page}_{_rule}"] = _machine(_page, _rule)


# ----------------------------------------------------------------------------------------- the engine
def rounds(num_prefixes: int, passes: int, prefix_len: int) -> list[TraceRequest]:
    reqs = []
    for r in range(passes):
        for p in range(num_prefixes):
            prompt = [10_000 * (p + 1) + j for j in range(prefix_len)] + [r]
            reqs.append(TraceRequest.from_tokens(len(reqs), 0.0, prompt, [1, 2, 3, 4]))
    return reqs


@pytest.mark.parametrize("rule", UNIFIED_GIVE_WAY_RULES)
def test_the_engine_runs_paged_unified_memory_with_hits_on_a_tight_budget(rule: str) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer",
        mamba_cache_chunk_size=16,
        mamba_track_interval=16,
        page_size=16,
        enable_unified_memory=True,
        unified_memory_give_way=rule,
    )
    pools = PoolSizes(400, 12, 0, 1.0, 0.5, KV_BYTES, SLOT_BYTES, "test")  # 5,200 B
    reqs = rounds(6, 4, 64)  # six 64-token prefixes: 3,840 B of KV and 600 B of checkpoints to keep
    evicted = {}
    for mode in ("sequential", "timed"):
        options = EngineOptions(mode=mode, check_invariants_every=1)  # type: ignore[arg-type]
        engine = Engine(config, pools, 80, options)
        assert isinstance(engine.kv_pool, LimitedPagedKVAllocator)
        engine.run(reqs)
        assert engine.finished == len(reqs) and engine.rejected == 0
        assert engine.metrics.cached_tokens > 0 and engine.metrics.cached_tokens % 16 == 0
        stats = engine.cache.stats
        evicted[mode] = stats.tokens_evicted + stats.states_evicted
        assert engine.kv_pool.used % 16 == 0
        assert engine.kv_pool.used * KV_BYTES + engine.mamba_pool.used * SLOT_BYTES <= engine.unified_bytes
    assert evicted["timed"] > 0  # concurrent requests: the sides met and one gave way


# ------------------------------------------------------------------------------------ give way, paged
def test_a_kv_shortfall_is_rounded_up_to_a_whole_page_before_the_rule_evicts() -> None:
    """Bytes short of a page buy no KV: a one-token KV shortfall with 30 B free (a page is 40 B) must
    still evict, here the checkpoint (the order puts the state side first), until a whole page is free."""
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer",
        mamba_cache_chunk_size=4,
        mamba_track_interval=4,
        page_size=4,
        enable_unified_memory=True,
    )
    cache = UnifiedMemoryCache.build(
        config,
        num_tokens=64,
        num_slots=8,
        mamba_pool_factory=LimitedMambaPool,
        kv_allocator_factory=limited_kv_allocator,
    )
    cache._order = lambda rule, kind: (STATE,)  # type: ignore[method-assign]
    cache.attach_budget(8 * KV_BYTES + SLOT_BYTES + 30, KV_BYTES, SLOT_BYTES)
    kv = cache.token_to_kv_pool_allocator.alloc(8)
    assert kv is not None
    cache.insert(list(range(1, 9)), kv, cache.mamba_pool.alloc(1, as_list=True)[0])
    assert cache.token_to_kv_pool_allocator.available_size() == 0
    freed = cache.evict(num_tokens=1)
    assert freed.num_states == 1 and cache.token_to_kv_pool_allocator.available_size() >= 4


# ------------------------------------------------------------------------------ the adaptive split, paged
def test_a_paged_split_starts_and_stays_on_whole_pages_and_refuses_another_page_size() -> None:
    split = AdaptiveSplit(
        SplitOptions(), 10 * 1_000 + 5 * SLOT_BYTES, KV_BYTES, SLOT_BYTES, 1_000, 5, page_size=16
    )
    assert split.kv_tokens == 992 and split.physical_kv_tokens == 1_040  # 1,000 and 1,050 in whole pages
    cache = UnifiedMemoryCache.build(
        CacheConfig(
            mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=16, mamba_track_interval=16
        ),
        num_tokens=64,
        num_slots=8,
        mamba_pool_factory=LimitedMambaPool,
        kv_allocator_factory=limited_kv_allocator,
    )
    with pytest.raises(ConfigError, match="page_size 16 but the cache has 1"):
        split.attach(cache)
    with pytest.raises(ConfigError, match="page_size"):
        AdaptiveSplit(SplitOptions(), 10_000, KV_BYTES, SLOT_BYTES, 100, 5, page_size=0)


@pytest.mark.parametrize(("kv_tokens", "slots", "grows"), [(4_000, 8, "states"), (320, 60, "kv")])
def test_a_paged_split_moves_the_line_in_whole_pages_toward_the_pool_that_binds(
    kv_tokens: int, slots: int, grows: str
) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer",
        mamba_cache_chunk_size=16,
        mamba_track_interval=16,
        page_size=16,
    )
    pools = PoolSizes(kv_tokens, slots, 0, 1.0, 0.5, 100, 1_000, "test")  # one slot: ten KV tokens' bytes
    reqs = rounds(12, 6, 40)
    options = EngineOptions(
        mode="sequential", check_invariants_every=1, split=SplitOptions(every=4, min_slots=4)
    )
    engine = Engine(config, pools, 48, options)
    assert isinstance(engine.kv_pool, LimitedPagedKVAllocator) and engine.split is not None
    engine.run(reqs)
    split = engine.split
    assert engine.finished == len(reqs) and split.history
    assert all(step.kv_tokens % 16 == 0 for step in split.history)
    assert engine.kv_pool.capacity == split.kv_tokens
    assert split.kv_tokens * 100 + split.state_slots * 1_000 <= split.budget_bytes
    if grows == "states":
        assert split.state_slots > slots and split.kv_tokens < kv_tokens
    else:
        assert split.kv_tokens > kv_tokens and split.state_slots < slots
