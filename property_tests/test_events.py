"""Cache events for routers (issue 27 item 3, :mod:`mamba_radix.events`), and the copy-on-write slot of an
admitted request attached through the pool.

The property that matters is checked over Hypothesis state machines that drive the cache with eviction
(the suite's tree machine and the paged-lifecycle machine, each over a cache built with ``events=True``):
after every step, the events taken so far, replayed into a :class:`~mamba_radix.events.PrefixIndex`, give
exactly the tree's KV blocks and exactly its checkpoints, recomputed from the tree's own tokens (not from
the event log's maps); and a router's predicted hit for any sequence (``reusable_tokens``) equals what
``peek_prefix`` says the cache would reuse. The replay is strict, so an event stream that advertised a
checkpoint whose block was gone, or removed an unknown block, fails at once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from mamba_radix import RadixKey
from mamba_radix.cache import MambaRadixCache
from mamba_radix.compat.sglang import (
    CacheInitParams,
    EvictParams,
    HybridReqToTokenPool,
    InsertParams,
    PagedTokenToKVPoolAllocator,
)
from mamba_radix.compat.sglang import MambaRadixCache as SGLangCache
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.events import (
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    PrefixIndex,
    chain_block_hashes,
    namespace_seed,
)
from mamba_radix.node import TreeNode
from mamba_radix.request import Req
from mamba_radix.testing.machine import CacheMachine, LifecycleMachine, make_machine
from mamba_radix.testing.radix_adapter import MambaRadixAdapter, lifecycle_params, radix_params


# ------------------------------------------------------------------------------------------ helpers
def tree_view(cache: MambaRadixCache) -> tuple[dict[int, int | None], dict[int, int]]:
    """The tree's blocks (hash -> parent hash) and checkpoints (hash of the block it sits at -> depth),
    hashed from the nodes' own tokens top-down: independent of the event log's bookkeeping. O(n + tokens)."""
    page = cache.config.page_size
    blocks: dict[int, int | None] = {}
    checkpoints: dict[int, int] = {}
    last: dict[int, int | None] = {cache.tree.root.id: None}  # node id -> hash of its last block
    for node in cache.tree.nodes():
        if node.is_root:
            continue
        assert node.parent is not None
        parent = last[node.parent.id]
        hashes = chain_block_hashes(node.key, page, parent_block_hash=parent, extra_key=node.extra_key)
        for block_hash in hashes:
            blocks[block_hash] = parent
            parent = block_hash
        last[node.id] = parent
        if node.mamba_slot is not None:
            assert parent is not None
            checkpoints[parent] = node.depth
    return blocks, checkpoints


def insert(cache: MambaRadixCache, tokens: list[int], extra_key: str | None = None) -> TreeNode:
    """Insert ``tokens`` with fresh KV and a fresh slot (freed again if the tree had a checkpoint)."""
    kv = cache.alloc_token_slots(len(tokens))
    slot = cache.alloc_state_slot()
    assert kv is not None and slot is not None
    done = cache.insert(RadixKey(tokens, extra_key), kv, slot)
    if done.mamba_exists:
        cache.mamba_pool.free([slot])
    return cache.peek_prefix(RadixKey(tokens, extra_key)).last_node


def build(page: int = 1, events: bool = True, **config: Any) -> MambaRadixCache:
    return MambaRadixCache.build(
        CacheConfig(page_size=page, **config), num_tokens=128, num_slots=12, events=events
    )


def replayed(cache: MambaRadixCache, index: PrefixIndex | None = None) -> PrefixIndex:
    index = index if index is not None else PrefixIndex()
    index.apply(cache.take_events())
    return index


def assert_mirrors(index: PrefixIndex, cache: MambaRadixCache) -> None:
    blocks, checkpoints = tree_view(cache)
    assert index.blocks == blocks
    assert index.checkpoints["device"] == checkpoints
    assert index.checkpoints["host"] == {}


# ------------------------------------------------------------------------------------------ examples
def test_events_are_off_by_default_and_cost_no_log() -> None:
    cache = build(events=False)
    insert(cache, [1, 2, 3, 4])
    cache.evict(num_tokens=4)
    assert cache.take_events() == []
    assert not cache.events_enabled and cache._events is None


def test_page_one_publishes_one_block_per_token_in_one_event_per_node() -> None:
    cache = build(page=1)
    insert(cache, [5, 6, 7])
    stored, checkpoint = cache.take_events()
    assert isinstance(stored, BlockStored) and isinstance(checkpoint, CheckpointStored)
    assert stored.block_size == 1 and stored.token_ids == [5, 6, 7] and stored.parent_block_hash is None
    assert stored.block_hashes == chain_block_hashes([5, 6, 7], 1)
    assert (checkpoint.block_hash, checkpoint.depth_tokens, checkpoint.tier) == (
        stored.block_hashes[-1],
        3,
        "device",
    )
    assert stored.to_dict()["type"] == "BlockStored" and checkpoint.to_dict()["type"] == "CheckpointStored"


def test_paged_blocks_chain_across_a_split() -> None:
    cache = build(page=4)
    insert(cache, list(range(12)))
    insert(cache, [*range(4), 9, 9, 9, 9])  # splits the first node after one page
    events = cache.take_events()
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [3, 1]
    assert stored[1].parent_block_hash == stored[0].block_hashes[0]  # the split changed no hash
    assert stored[1].block_hashes == chain_block_hashes([*range(4), 9, 9, 9, 9], 4)[1:]
    assert_mirrors(replayed_from(events), cache)


def replayed_from(events: list[Any]) -> PrefixIndex:
    index = PrefixIndex()
    index.apply(events)
    return index


def test_namespaces_hash_apart() -> None:
    assert namespace_seed(None) != namespace_seed("")
    assert chain_block_hashes([1, 2], 1, extra_key="a") != chain_block_hashes([1, 2], 1, extra_key="b")
    cache = build()
    insert(cache, [1, 2], "a")
    insert(cache, [1, 2], "b")
    index = replayed(cache)
    assert index.reusable_tokens([1, 2], 1, "a") == 2 and index.reusable_tokens([1, 2], 1, None) == 0
    assert_mirrors(index, cache)


def test_every_removal_reason() -> None:
    """``capped`` (the per-path cap), ``evicted`` (a state eviction tombstones an internal checkpoint:
    its KV stays) and ``dropped`` (its block went in the same eviction); a checkpoint is retracted before
    its block."""
    cache = build(mamba_max_states_per_path=1, mamba_eviction_order="root_first")
    index = PrefixIndex()
    insert(cache, [1, 2])
    insert(cache, [1, 2, 3, 4])  # the cap takes the checkpoint at depth 2
    events = cache.take_events()
    assert [e.reason for e in events if isinstance(e, CheckpointRemoved)] == ["capped"]
    index.apply(events)
    cache2 = build(mamba_eviction_order="root_first")
    insert(cache2, [1, 2])
    insert(cache2, [1, 2, 3, 4])
    index2 = replayed(cache2)
    cache2.evict(num_states=1)  # root_first: the internal checkpoint at depth 2 goes, its KV stays
    events = cache2.take_events()
    assert [(type(e), e.reason, e.depth_tokens) for e in events] == [(CheckpointRemoved, "evicted", 2)]
    index2.apply(events)
    assert index2.reusable_tokens([1, 2, 9], 1) == 0 and index2.reusable_tokens([1, 2, 3, 4], 1) == 4
    cache2.evict(num_tokens=4)
    events = cache2.take_events()
    assert isinstance(events[0], CheckpointRemoved) and events[0].reason == "dropped"
    assert isinstance(events[-1], BlockRemoved) and len(events[-1].block_hashes) == 4
    index2.apply(events)
    assert index2.blocks == {} and index2.checkpoints["device"] == {}
    assert_mirrors(index2, cache2)


def test_the_replay_is_strict() -> None:
    index = PrefixIndex()
    with pytest.raises(InvalidArgument):
        index.apply([CheckpointStored(7, 1)])  # a checkpoint on no block
    index.apply([BlockStored([7], None, [1], 1)])
    with pytest.raises(InvalidArgument):
        index.apply([BlockStored([7], None, [1], 1)])  # stored twice
    index.apply([CheckpointStored(7, 1)])
    with pytest.raises(InvalidArgument):
        index.apply([BlockRemoved([7])])  # under a live checkpoint: the stream advertised a gone state
    with pytest.raises(InvalidArgument):
        index.apply([BlockRemoved([8])])
    with pytest.raises(InvalidArgument):
        chain_block_hashes([1], 0)


def test_a_cow_evicting_for_its_slot_reports_the_eviction() -> None:
    """The copy-on-write of a match may evict a checkpoint for a slot: that eviction is an event too."""
    cache = MambaRadixCache.build(CacheConfig(), num_tokens=64, num_slots=2, events=True)
    insert(cache, [1, 2])
    insert(cache, [3, 4])
    index = replayed(cache)
    req = Req(rid="r", origin_input_ids=[1, 2, 5])
    cache.match_prefix([1, 2], cow_mamba=True, req=req)  # 2 checkpoints + nothing free: evicts [3, 4]
    index.apply(cache.take_events())
    assert_mirrors(index, cache)
    assert index.reusable_tokens([3, 4], 1) == 0 and index.reusable_tokens([1, 2], 1) == 2


# ------------------------------------------------------------------- copy-on-write of an admitted request
def _admitted_without_live_slot() -> tuple[MambaRadixCache, Req]:
    cache = MambaRadixCache.build(
        CacheConfig(mamba_radix_cache_strategy="extra_buffer"), num_tokens=64, num_slots=8
    )
    insert(cache, [1, 2, 3, 4])
    pool = cache.req_to_token_pool
    req = Req(rid="r", origin_input_ids=[1, 2, 3, 4, 5])
    assert pool.alloc([req]) is not None
    live = req.mamba_pool_idx
    pool.release_slot(req, live)  # e.g. SGLang's call form handed it to the tree; here simply freed
    cache.mamba_pool.free([live])
    return cache, req


def test_cow_of_an_admitted_request_attaches_its_slot_through_the_pool() -> None:
    """Before the fix the match set ``req.mamba_pool_idx`` behind the pool's back: the pool did not record
    the slot as the request's (``slot_holder`` None, row mapping 0), so a later insert of it would not be
    seen as a running request's slot and free_mamba_cache would be refused."""
    cache, req = _admitted_without_live_slot()
    pool = cache.req_to_token_pool
    m = cache.match_prefix([1, 2, 3, 4], cow_mamba=True, req=req)
    slot = req.mamba_pool_idx
    assert m.last_node is not cache.root_node and isinstance(slot, int)
    assert pool.slot_holder(slot) is req
    assert int(pool.req_index_to_mamba_index_mapping[req.req_pool_idx]) == slot
    pool.audit()
    pool.free_mamba_cache(req)  # the pool frees it as the request's own
    assert not cache.mamba_pool.is_slot_allocated(slot)


def test_cow_of_an_admitted_request_with_a_stale_track_slot_is_refused_unchanged() -> None:
    cache, req = _admitted_without_live_slot()
    pool = cache.req_to_token_pool
    assert req.mamba_ping_pong_track_buffer
    stray = cache.mamba_pool.alloc(1, as_list=True)
    assert stray is not None
    req.mamba_ping_pong_track_buffer = [stray[0], *req.mamba_ping_pong_track_buffer[1:]]  # behind its back
    before = (cache.mamba_pool.available_size(), cache.tree.clock, pool.num_reserved_slots())
    with pytest.raises(InvalidIndex):
        cache.match_prefix([1, 2, 3, 4], cow_mamba=True, req=req)
    assert req.mamba_pool_idx is None
    assert (cache.mamba_pool.available_size(), cache.tree.clock, pool.num_reserved_slots()) == before


# ------------------------------------------------------------------------------------ state machines
class EventsAdapter(MambaRadixAdapter):
    """Our adapter over a cache that records events."""

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        # the same pools, nothing allocated yet: the cache the suite drives now records events
        self.cache = MambaRadixCache(self.config, self.req_pool, self.allocator, events=True)


class ReplayRules:
    """Mixed into a suite machine: after every step the events replay into exactly the tree's blocks and
    checkpoints; a rule asks the replay, as a router would, what a sequence would reuse."""

    coverage: ClassVar[Counter[str]]
    index: PrefixIndex

    @invariant()
    def check_everything(self) -> None:
        """The suite's checks, then the replay's: also at teardown, whose final eviction empties the tree."""
        super().check_everything()  # type: ignore[misc]
        self.events_rebuild_the_reusable_prefixes()

    def events_rebuild_the_reusable_prefixes(self) -> None:
        adapter = getattr(self, "adapter", None)
        if adapter is None:
            return
        if not hasattr(self, "index"):
            self.index = PrefixIndex()
        events = adapter.cache.take_events()
        for event in events:
            label = type(event).__name__
            type(self).coverage[f"event {label} {getattr(event, 'reason', '')}".rstrip()] += 1
        self.index.apply(events)
        assert_mirrors(self.index, adapter.cache)

    @rule(seq=CacheMachine.sequences)
    def router_predicts_the_hit(self, seq: tuple[Any, tuple[int, ...]]) -> None:
        extra, tokens = seq
        cache = self.adapter.cache  # type: ignore[attr-defined]
        # the invariant after the previous step applied every event so far (the first ran after set-up)
        predicted = self.index.reusable_tokens(tokens, cache.config.page_size, extra)
        assert predicted == cache.peek_prefix(RadixKey(tokens, extra)).hit_len


TreeEvents = make_machine(
    EventsAdapter, radix_params(), "TreeEvents", base=type("TreeBase", (ReplayRules, CacheMachine), {})
)
LIFECYCLE_CONFIGURATIONS = (("no_buffer", 1), ("extra_buffer", 4), ("extra_buffer_lazy", 16))
LifecycleEvents = {
    (strategy, page): make_machine(
        EventsAdapter,
        lifecycle_params(strategies=(strategy,), page_sizes=(page,)),
        f"LifecycleEvents_{strategy}_page{page}",
        base=type("LifecycleBase", (ReplayRules, LifecycleMachine), {}),
    )
    for strategy, page in LIFECYCLE_CONFIGURATIONS
}

_PROFILE = settings.default
BUDGET = settings(_PROFILE, max_examples=max(3, _PROFILE.max_examples // 4))


def test_tree_machine_events_replay_to_the_tree() -> None:
    TreeEvents.coverage.clear()
    run_state_machine_as_test(TreeEvents, settings=BUDGET)
    reached = TreeEvents.coverage
    for kind in ("BlockStored", "BlockRemoved", "CheckpointStored"):
        assert reached[f"event {kind}"], dict(reached)
    assert any(k.startswith("event CheckpointRemoved") for k in reached), dict(reached)


@pytest.mark.parametrize(
    ("strategy", "page"), LIFECYCLE_CONFIGURATIONS, ids=[f"{s}-page{p}" for s, p in LIFECYCLE_CONFIGURATIONS]
)
def test_lifecycle_machine_events_replay_to_the_tree(strategy: str, page: int) -> None:
    machine = LifecycleEvents[(strategy, page)]
    machine.coverage.clear()
    run_state_machine_as_test(machine, settings=BUDGET)
    assert machine.coverage["event BlockRemoved"], dict(machine.coverage)


def test_events_cost_nothing_when_off() -> None:
    """Off, the cache holds no log: an insert and an eviction test one attribute and record nothing."""
    cache = build(events=False)
    for i in range(8):
        insert(cache, [i, i + 1, i + 2])
    cache.evict(num_tokens=64)
    assert cache._events is None and cache.take_events() == []
    assert torch.equal(cache.tree.root.value, torch.empty(0, dtype=torch.int64))


# ----------------------------------------------------------------------------------------- SGLang's form
def _compat_cache(checkpoint_events: bool) -> SGLangCache:
    pool = HybridReqToTokenPool(size=2, mamba_size=6, max_context_len=32, enable_mamba_extra_buffer=True)
    allocator = PagedTokenToKVPoolAllocator(size=64, page_size=4)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=4,
        enable_mamba_extra_buffer=True,
        enable_kv_cache_events=True,
    )
    return SGLangCache(params, checkpoint_events=checkpoint_events)


@pytest.mark.parametrize("checkpoint_events", [False, True])
def test_sglang_form_takes_kv_events_and_checkpoint_events_on_request(checkpoint_events: bool) -> None:
    cache = _compat_cache(checkpoint_events)
    core = cache.core
    kv = core.alloc_token_slots(8)
    slot = core.alloc_state_slot()
    cache.insert(InsertParams(key=RadixKey(list(range(8))), value=kv, mamba_value=torch.tensor([slot])))
    cache.evict(EvictParams(num_tokens=8))
    events = cache.take_events()
    kinds = [type(e).__name__ for e in events]
    if checkpoint_events:
        assert kinds == ["BlockStored", "CheckpointStored", "CheckpointRemoved", "BlockRemoved"]
    else:
        assert kinds == ["BlockStored", "BlockRemoved"]
    stored = events[0]
    assert stored.block_size == 4 and len(stored.block_hashes) == 2 and stored.lora_id is None
    assert events[-1].block_hashes == stored.block_hashes
    assert cache.take_events() == []
