"""The unified memory pool: byte layouts, typed views under state_ops, give-way rules, refusals, and a
stateful machine driving both sides with byte-level invariants (check_unified) after every step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mamba_radix import state_ops
from mamba_radix.config import FIELD_CHOICES, CacheConfig
from mamba_radix.errors import ConfigError, InvalidArgument, InvalidIndex, InvariantError
from mamba_radix.pools import (
    GIVE_WAY_RULES,
    KVLayout,
    MambaPool,
    StateLayout,
    UnifiedMemoryPool,
    check_unified,
)
from mamba_radix.pools.two_ended import TwoEndedAllocator

CONV_SHAPES = ((3, 8), (3, 4))
TEMPORAL = (2, 4, 4)
CONV_DTYPES = (torch.bfloat16, torch.float16)


def state_layout() -> StateLayout:
    return StateLayout(2, CONV_SHAPES, TEMPORAL, CONV_DTYPES, torch.float32)


def mha(layers: int = 2) -> KVLayout:
    return KVLayout("mha", layers, torch.bfloat16, head_num=2, head_dim=4)


def make_pool(total: int = 8000, page_size: int = 2, rule: str = "sglang", **kw: int) -> UnifiedMemoryPool:
    return UnifiedMemoryPool(total, state_layout(), mha(), page_size, rule, **kw)


def snapshot(pool: UnifiedMemoryPool) -> tuple:
    a = pool.allocator
    return (a.low_frontier, a.high_frontier, a.live("low"), a.holes("low"), a.live("high"), a.holes("high"))


# ------------------------------------------------------------------------------------------ layout
def test_state_entry_bytes_match_mamba_pool_and_views_have_its_shapes():
    pool = make_pool()
    plain = MambaPool(4, 2, list(CONV_SHAPES), TEMPORAL, list(CONV_DTYPES), torch.float32)
    assert pool.slot_bytes == plain.bytes_per_slot == 400  # sum over layers of conv rows + temporal row
    assert pool.state_layout.padding_bytes == 0
    rows = pool.num_slot_rows
    assert [tuple(t.shape[2:]) for t in pool.tensors] == [tuple(t.shape[2:]) for t in plain.tensors]
    assert [t.dtype for t in pool.tensors] == [t.dtype for t in plain.tensors]
    assert all(t.shape[:2] == (2, rows) for t in pool.tensors)
    assert pool.raw.dtype == torch.uint8 and pool.raw.numel() == 8000


def test_misaligned_sections_are_padded_and_views_stay_aligned():
    layout = StateLayout(1, ((3,),), (2,), (torch.float16,), torch.float32)  # 6 B conv, then fp32
    assert layout.section_offsets == (0, 8) and layout.slot_bytes == 16 and layout.padding_bytes == 2
    raw = torch.zeros(64, dtype=torch.uint8)
    conv, temporal = layout.views(raw, 4)
    temporal[0, 3] = 1.5
    assert conv.shape == (1, 4, 3) and temporal.shape == (1, 4, 2)
    assert float(temporal[0, 3, 0]) == 1.5 and int(raw[:48].count_nonzero()) == 0


def test_kv_views_mha_and_mla_address_the_token_envelope():
    pool = make_pool(page_size=2)
    k, v = pool.kv_views[1]
    tokens = pool.alloc_kv(2)
    t = int(tokens[0])
    k[t] = 2.0
    v[t] = 3.0
    start = t * pool.kv_layout.token_bytes
    written = pool.raw[start : start + pool.kv_layout.token_bytes].view(torch.bfloat16)
    assert written[16:24].tolist() == [2.0] * 8 and written[24:32].tolist() == [3.0] * 8
    mla = UnifiedMemoryPool(6000, state_layout(), KVLayout("mla", 3, torch.bfloat16, kv_cache_dim=6), 1)
    assert mla.kv_layout.token_bytes == 3 * 6 * 2 and mla.kv_views[2][0].shape == (mla.num_kv_tokens, 1, 6)


# ---------------------------------------------------------------------------- state ops on the views
def test_copy_slot_through_state_ops_on_views_is_bit_exact_with_mamba_pool():
    pool = make_pool()
    plain = MambaPool(4, 2, list(CONV_SHAPES), TEMPORAL, list(CONV_DTYPES), torch.float32)
    src, dst = pool.alloc_slots(2)
    psrc, pdst = plain.alloc(2).tolist()
    gen = torch.Generator().manual_seed(7)
    for view, tensor in zip(pool.tensors, plain.tensors, strict=True):
        data = torch.randn(tensor[:, psrc].shape, generator=gen).to(tensor.dtype)
        view[:, src] = data
        tensor[:, psrc] = data
    state_ops.copy_slots(pool.tensors, [src], [dst])
    plain.copy_from([psrc], [pdst])
    for view, tensor in zip(pool.tensors, plain.tensors, strict=True):
        got, want = view[:, dst].contiguous(), tensor[:, pdst].contiguous()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    # the copy wrote the destination slot's envelope and nothing else
    lo, _ = pool.byte_range("state", dst)
    before = pool.raw.clone()
    state_ops.copy_slots(pool.tensors, [dst], [src], check=False)
    changed = (pool.raw != before).nonzero().flatten()
    s_lo, s_hi = pool.byte_range("state", src)
    assert changed.numel() == 0 or (int(changed.min()) >= s_lo and int(changed.max()) < s_hi)
    assert lo != s_lo


# ------------------------------------------------------------------------------------ two sides meet
def test_sides_grow_toward_each_other_and_meet():
    pool = make_pool(total=8000, page_size=2)
    slots = pool.alloc_slots(pool.available("state"))
    assert slots == list(range(pool.min_slot, pool.min_slot + len(slots)))
    assert pool.allocator.gap_bytes < pool.slot_bytes  # what is left is less than a slot: KV's
    first = pool.alloc_kv(pool.available("kv"))
    assert first is not None and int(first.max()) == pool.num_kv_tokens - 1  # KV starts at the top
    assert pool.available("kv") == 0 and pool.alloc_kv(2) is None and pool.alloc_slots(1) is None
    check_unified(pool)
    pool.free_slots(slots[-3:])  # the frontier moves back: the gap reopens for KV
    check_unified(pool)
    assert pool.allocator.gap_bytes >= 3 * pool.slot_bytes and pool.available("kv") > 0
    tokens = pool.alloc_kv(pool.available("kv"))
    assert tokens is not None and pool.alloc_slots(1) is None
    assert int(tokens.max()) < int(first.min())  # and grows down
    check_unified(pool)


def test_holes_are_reused_before_the_gap_and_fragmentation_is_reported():
    pool = make_pool()
    slots = pool.alloc_slots(4)
    pool.free_slots([slots[1]])
    assert pool.fragmented_bytes("state") == pool.slot_bytes
    frontier = pool.allocator.low_frontier
    assert pool.alloc_slots(1) == [slots[1]] and pool.allocator.low_frontier == frontier
    assert pool.fragmented_bytes("state") == 0


def test_refusals_change_nothing():
    pool = make_pool()
    pool.alloc_slots(2)
    pool.alloc_kv(4)
    before = snapshot(pool)
    assert pool.alloc_slots(10_000) is None and pool.alloc_kv(10_000) is None
    with pytest.raises(InvalidIndex):
        pool.free_slots([pool.min_slot, 999])
    with pytest.raises(InvalidIndex):
        pool.free_slots([pool.min_slot, pool.min_slot])
    with pytest.raises(InvalidArgument):
        pool.alloc_kv(3)  # not whole pages
    with pytest.raises(InvalidArgument):
        pool.free_kv([int(pool.num_kv_tokens - 1)])  # half a page
    assert snapshot(pool) == before
    check_unified(pool)


def test_budget_too_small_for_one_request_and_bad_rules_are_refused():
    with pytest.raises(InvalidArgument, match="cannot hold"):
        UnifiedMemoryPool(1000, state_layout(), mha(), 2, min_state_slots=3)
    with pytest.raises(InvalidArgument, match="rule must be one of"):
        make_pool(rule="kv_first")
    with pytest.raises(InvalidArgument, match="floors"):
        make_pool(rule="floor", state_floor_bytes=6000, kv_floor_bytes=6000)


def test_check_unified_catches_a_corrupted_boundary():
    pool = make_pool()
    pool.alloc_slots(2)
    pool.allocator.low_frontier += 1  # a slot in the span that is neither live nor a hole
    with pytest.raises(InvariantError):
        check_unified(pool)


# ------------------------------------------------------------------------------------- give-way rules
def test_give_way_rules():
    assert FIELD_CHOICES["unified_memory_give_way"] == GIVE_WAY_RULES
    sg = make_pool(rule="sglang")
    assert sg.give_way("state") == ("state", "kv") and sg.give_way("kv") == ("kv",)
    ov = make_pool(rule="older_victim")
    assert ov.give_way("state", {"state": 5, "kv": 2}) == ("kv", "state")
    assert ov.give_way("kv", {"state": 5, "kv": 2}) == ("kv", "state")
    assert ov.give_way("state", {"state": None, "kv": 9}) == ("kv", "state")
    fl = make_pool(rule="floor", state_floor_bytes=1200, kv_floor_bytes=2048)
    top = fl.allocator.high_end * fl.page_bytes
    assert fl.min_slot * fl.slot_bytes + fl.available("state") * fl.slot_bytes <= top - 2048
    assert fl.give_way("state") == ("state",)  # KV is not above its floor yet
    fl.alloc_kv(fl.available("kv"))
    assert fl.allocator.span_bytes("high") > 2048 and fl.give_way("state") == ("state", "kv")
    assert fl.available("state") * fl.slot_bytes >= 1200  # the state floor stayed out of KV's reach


def test_config_refuses_the_seeds_incompatibilities():
    CacheConfig(enable_unified_memory=True, unified_memory_give_way="floor")
    with pytest.raises(ConfigError, match="speculative"):
        CacheConfig(enable_unified_memory=True, speculative_num_draft_tokens=2, mamba_track_interval=256)
    with pytest.raises(ConfigError, match="PD disaggregation"):
        CacheConfig(enable_unified_memory=True, disaggregation_mode="decode")
    with pytest.raises(ConfigError, match="unified_memory_give_way must be one of"):
        CacheConfig(unified_memory_give_way="nope")  # type: ignore[arg-type]
    CacheConfig(speculative_num_draft_tokens=2)  # without unified memory: as before


@given(st.integers(1, 64), st.integers(1, 64), st.integers(0, 64), st.integers(64, 2048))
def test_two_ended_allocator_capacity_is_the_gap(low_unit: int, high_unit: int, reserved: int, total: int):
    try:
        a = TwoEndedAllocator(total, low_unit, high_unit, reserved)
    except InvalidArgument:
        return
    lows = a.alloc("low", a.available("low"))
    assert (lows is not None and a.available("high") == 0) or a.gap_bytes >= high_unit
    assert a.low_top <= a.high_bottom


# --------------------------------------------------------------------------------- stateful machine
class UnifiedPoolMachine(RuleBasedStateMachine):
    """Alloc/free on both sides with random page sizes and slot bytes; the invariants after each step,
    and a model of which ids are live."""

    @initialize(
        conv=st.integers(1, 12),
        temporal=st.integers(1, 12),
        heads=st.integers(1, 3),
        page_size=st.sampled_from([1, 2, 4, 16]),
        total=st.integers(2000, 20000),
        rule=st.sampled_from(GIVE_WAY_RULES),
    )
    def setup(self, conv: int, temporal: int, heads: int, page_size: int, total: int, rule: str) -> None:
        state = StateLayout(2, ((conv, 4),), (temporal, 2), (torch.bfloat16,), torch.float32)
        kv = KVLayout("mha", 2, torch.float16, head_num=heads, head_dim=4)
        floors = {}
        if rule == "floor":
            floors = {"state_floor_bytes": state.slot_bytes, "kv_floor_bytes": kv.token_bytes * page_size}
        try:
            self.pool = UnifiedMemoryPool(total, state, kv, page_size, rule, **floors)
        except InvalidArgument:
            self.pool = UnifiedMemoryPool(200_000, state, kv, page_size, rule, **floors)
        self.slots: set[int] = set()
        self.pages: set[int] = set()

    @rule(n=st.integers(0, 6))
    def alloc_slots(self, n: int) -> None:
        holes = self.pool.allocator.holes("low")
        before = snapshot(self.pool)
        got = self.pool.alloc_slots(n)
        if got is None:
            assert n > self.pool.available("state") and snapshot(self.pool) == before
            return
        assert len(got) == n and not (set(got) & self.slots)
        assert set(got[: len(holes)]) <= holes  # holes are reused before the gap
        self.slots.update(got)

    @rule(pages=st.integers(0, 6))
    def alloc_kv(self, pages: int) -> None:
        ps = self.pool.page_size
        before = snapshot(self.pool)
        got = self.pool.alloc_kv(pages * ps)
        if got is None:
            assert pages * ps > self.pool.available("kv") and snapshot(self.pool) == before
            return
        new = {t // ps for t in got.tolist()}
        assert len(new) == pages and not (new & self.pages)
        self.pages.update(new)

    @precondition(lambda self: self.slots)
    @rule(data=st.data())
    def free_slots(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.slots)), min_size=1, unique=True))
        self.pool.free_slots(chosen)
        self.slots.difference_update(chosen)

    @precondition(lambda self: self.pages)
    @rule(data=st.data())
    def free_kv(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.pages)), min_size=1, unique=True))
        ps = self.pool.page_size
        self.pool.free_kv([p * ps + o for p in chosen for o in range(ps)])
        self.pages.difference_update(chosen)

    @rule(bad=st.integers(-3, 3))
    def refused_free_changes_nothing(self, bad: int) -> None:
        before = snapshot(self.pool)
        victim = self.pool.min_slot + abs(bad) + 10_000
        with pytest.raises(InvalidIndex):
            self.pool.free_slots([victim])
        assert snapshot(self.pool) == before

    @invariant()
    def byte_invariants(self) -> None:
        check_unified(self.pool)
        assert set(self.pool.allocator.live("low")) == self.slots
        assert set(self.pool.allocator.live("high")) == self.pages


TestUnifiedPoolMachine = UnifiedPoolMachine.TestCase


# ------------------------------------------------------------------ the simulator's shared byte budget
def test_shared_byte_budget_moves_slots_and_kv_tokens_with_load():
    from mamba_radix.sim.capacity_limit import LimitedMambaPool, SharedByteBudget, limited_kv_allocator

    kv = limited_kv_allocator(100, 1)
    states = LimitedMambaPool(10, 1, [(2, 2)], (2,), torch.float32, torch.float32)
    budget = SharedByteBudget(1000, bytes_per_kv_token=10, bytes_per_state_slot=100)
    budget.attach(kv, states)
    assert kv.available_size() == 100 and states.available_size() == 10
    tokens = kv.alloc(60)  # 600 B of KV leave 400 B: 4 slots
    assert tokens is not None and states.available_size() == 4
    before = (states.available_size(), states.used)
    assert states.alloc(5) is None and (states.available_size(), states.used) == before
    slots = states.alloc(4)
    assert slots is not None and kv.available_size() == 0 and kv.alloc(1) is None
    kv.free(tokens[:30])  # KV shrinks: the states may grow again
    assert states.available_size() == 3 and budget.used_bytes() == 300 + 400
    with pytest.raises(InvalidArgument):
        SharedByteBudget(100, 10, 100).attach(kv, states)


def test_unified_budget_sizes_both_pools_for_the_whole_budget():
    from mamba_radix.sim.budget import pools_for_budget, unified_pools_for_budget

    config = CacheConfig(enable_unified_memory=True)
    split = pools_for_budget(config, 4.0, 0.9, model="qwen3-next-80b-a3b")
    sizes, total = unified_pools_for_budget(config, 4.0, 0.9, model="qwen3-next-80b-a3b")
    assert total == 4 << 30 and sizes.max_running_requests == split.max_running_requests
    assert sizes.kv_tokens > split.kv_tokens and sizes.state_slots > split.state_slots
    assert sizes.kv_tokens * sizes.bytes_per_kv_token <= total
    with pytest.raises(ConfigError):
        unified_pools_for_budget(config, 1e-6, 0.9, model="qwen3-next-80b-a3b")
