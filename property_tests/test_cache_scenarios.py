"""MambaRadixCache on the real pools: SGLang's unit-test scenarios (sglang-semantics §11) with exact pool
deltas, copy-on-write contents, slot exhaustion, bad input, and invariant checks that catch corruption."""

from __future__ import annotations

import pytest
import torch

from mamba_radix import (
    CacheConfig,
    InvalidArgument,
    InvalidIndex,
    InvariantError,
    MambaRadixCache,
    RadixKey,
    Req,
)
from mamba_radix.cache import EvictResult
from mamba_radix.pools import PagedTokenToKVPoolAllocator
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp

NO_BUFFER = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)


def make_cache(
    config: CacheConfig = NO_BUFFER, num_tokens: int = 128, num_slots: int = 16
) -> MambaRadixCache:
    return MambaRadixCache.build(config, num_tokens=num_tokens, num_slots=num_slots, max_context_len=256)


def insert_fresh(cache: MambaRadixCache, tokens: list[int]) -> tuple[int, bool]:
    """Insert ``tokens`` with freshly allocated KV and a stamped slot, as an engine would at finish."""
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    slot = cache.alloc_state_slot()
    assert kv is not None and slot is not None
    write_stamp(cache.mamba_pool, slot, fingerprint(tokens), len(tokens))
    result = cache.insert(tokens, kv, slot)
    if result.mamba_exists:
        cache.mamba_pool.free([slot])
    cache.check_invariants([])
    return result


def used(cache: MambaRadixCache) -> tuple[int, int]:
    return cache.token_to_kv_pool_allocator.used, cache.mamba_pool.used


def test_sglang_four_insert_scenario_with_pool_deltas() -> None:
    cache = make_cache()
    insert_fresh(cache, [1, 2, 3])
    assert insert_fresh(cache, [1, 2, 3, 4, 5, 6, 7]) == (3, False)
    insert_fresh(cache, [10, 11, 12])
    assert insert_fresh(cache, [1, 2, 3, 4, 5, 60, 70]) == (5, False)
    assert used(cache) == (3 + 4 + 3 + 2, 4)  # duplicates were freed at insert
    assert (cache.full_evictable_size(), cache.mamba_evictable_size()) == (12, 4)

    assert cache.evict(num_tokens=1) == (3, 1)  # the LRU leaf [10, 11, 12], KV and checkpoint
    assert used(cache) == (9, 3)
    assert cache.evict(num_states=1) == (0, 1)  # [1, 2, 3] becomes a tombstone; its KV stays
    assert used(cache) == (9, 2)
    assert len(cache.match_prefix([1, 2, 3, 4, 5]).device_indices) == 0
    m = cache.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert len(m.device_indices) == 7 and m.last_node.key == (60, 70)
    assert len(cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).device_indices) == 7
    assert cache.evict(num_states=1) == (2, 1)  # the [60, 70] leaf goes with its KV
    assert used(cache) == (7, 1)
    m = cache.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert len(m.device_indices) == 0 and m.last_node is cache.root_node

    req = Req(rid="cow", origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8])
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7], cow_mamba=True, req=req)
    assert req.mamba_pool_idx is not None and req.mamba_pool_idx != m.mamba_slot
    for t in cache.mamba_pool.tensors:
        assert torch.equal(t[:, req.mamba_pool_idx], t[:, m.mamba_slot])
    assert read_stamp(cache.mamba_pool, req.mamba_pool_idx) == (fingerprint([1, 2, 3, 4, 5, 6, 7]), 7)
    assert req.mamba_cow_src_slot == m.mamba_slot and cache.stats.state_copies == 1
    cache.mamba_pool.free([req.mamba_pool_idx])
    cache.check_invariants([])


@pytest.mark.parametrize("prev_prefix_len", [0, 2, 4, 6, 8])
def test_prev_prefix_len_frees_exactly_the_duplicates(prev_prefix_len: int) -> None:
    cache = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 3, 4, 5, 6, 7, 8])  # the tree now holds 8 tokens over two nodes
    tree_kv = cache.match_prefix(list(range(1, 9))).device_indices
    allocator = cache.token_to_kv_pool_allocator
    # positions below prev_prefix_len carry the tree's own indices (a request's locked prefix)
    fresh = allocator.alloc(12 - prev_prefix_len)
    assert fresh is not None
    kv = torch.cat([tree_kv[:prev_prefix_len], fresh])
    slot = cache.alloc_state_slot()
    assert slot is not None
    before = allocator.used
    result = cache.insert(list(range(1, 13)), kv, slot, prev_prefix_len=prev_prefix_len)
    assert result == (8, False)
    assert allocator.used == before - (8 - prev_prefix_len)
    assert not allocator.is_allocated(kv[prev_prefix_len:8]).any()
    assert allocator.is_allocated(kv[8:]).all() and allocator.is_allocated(tree_kv).all()
    cache.check_invariants([])


def test_cow_evicts_another_checkpoint_never_the_matched_one() -> None:
    cache = make_cache(num_slots=2)
    insert_fresh(cache, [1, 2, 3])  # older
    insert_fresh(cache, [7, 8, 9])
    assert cache.mamba_pool.available_size() == 0
    req = Req(rid=1, origin_input_ids=[1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3], cow_mamba=True, req=req)  # the matched [1, 2, 3] is the LRU one
    assert len(m.device_indices) == 3 and m.mamba_slot is not None
    assert cache.match_prefix([7, 8, 9]).mamba_slot is None  # the other checkpoint was evicted instead
    assert read_stamp(cache.mamba_pool, req.mamba_pool_idx) == (fingerprint([1, 2, 3]), 3)


def test_cow_without_any_slot_drops_the_hit() -> None:
    cache = make_cache(num_slots=1)
    insert_fresh(cache, [1, 2, 3])
    req = Req(rid=1, origin_input_ids=[1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3], cow_mamba=True, req=req)
    assert m.last_node is cache.root_node and len(m.device_indices) == 0 and m.mamba_slot is None
    assert req.mamba_pool_idx is None and req.cache_protected_len == 0
    assert cache.stats.cow_skipped == 1
    assert cache.match_prefix([1, 2, 3]).mamba_slot is not None  # nothing was evicted
    cache.check_invariants([])


def test_branching_seqlen_rounds_down_to_the_grid() -> None:
    cache = make_cache(CacheConfig(mamba_cache_chunk_size=4), num_tokens=64)
    insert_fresh(cache, list(range(1, 12)))  # 11 tokens, checkpoint at 11
    m = cache.match_prefix([*range(1, 10), 99])  # KV matches 9 tokens, no checkpoint before 11
    assert (len(m.device_indices), m.full_kv_hit_len, m.mamba_branching_seqlen) == (0, 9, 8)
    m = cache.match_prefix(list(range(1, 4)))  # 3 tokens: rounds down to 0, no branch
    assert m.mamba_branching_seqlen is None
    insert_fresh(cache, list(range(1, 9)))  # checkpoint at 8: a branch at 8 is not deeper than the hit
    m = cache.match_prefix([*range(1, 10), 99])
    assert (len(m.device_indices), m.mamba_branching_seqlen) == (8, None)


def test_evict_and_alloc_return_memory_to_the_pools() -> None:
    cache = make_cache(num_tokens=10, num_slots=4)
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [5, 6, 7, 8])
    assert cache.token_to_kv_pool_allocator.available_size() == 2
    kv = cache.alloc_token_slots(5)  # evicts the LRU leaf [1, 2, 3, 4]
    assert kv is not None and kv.numel() == 5
    assert cache.stats.tokens_evicted == 4 and cache.stats.states_evicted == 1
    assert cache.alloc_token_slots(10) is None  # still short after evicting everything
    assert cache.full_evictable_size() == 0
    cache.token_to_kv_pool_allocator.free(kv)
    cache.check_invariants([])


def test_insert_rejects_memory_the_caller_does_not_hold() -> None:
    cache = make_cache()
    insert_fresh(cache, [1, 2])
    tree_slot = cache.match_prefix([1, 2]).mamba_slot
    before = cache.pretty_print()
    slot = cache.alloc_state_slot()
    with pytest.raises(InvalidIndex, match="KV index 50 is not allocated"):
        cache.insert([5, 6], torch.tensor([50, 51]), slot)
    kv = cache.token_to_kv_pool_allocator.alloc(2)
    with pytest.raises(InvalidIndex, match="state slot 9 is not allocated"):
        cache.insert([5, 6], kv, 9)
    with pytest.raises(InvalidArgument, match="already belongs to tree node"):
        cache.insert([5, 6], kv, tree_slot)
    assert cache.pretty_print() == before


def test_constructor_rejects_mismatched_pools() -> None:
    cache = make_cache()
    with pytest.raises(InvalidArgument, match="page_size=4 but the config says page_size=1"):
        MambaRadixCache(NO_BUFFER, cache.req_to_token_pool, PagedTokenToKVPoolAllocator(64, 4))
    with pytest.raises(InvalidArgument, match="built with another CacheConfig"):
        MambaRadixCache(CacheConfig(), cache.req_to_token_pool, cache.token_to_kv_pool_allocator)


def test_check_invariants_catches_corruption() -> None:
    cache = make_cache(NO_BUFFER.replace(mamba_kv_only_leaves=False))  # invariant 1 holds strictly
    insert_fresh(cache, [1, 2, 3, 4])
    insert_fresh(cache, [1, 2, 3, 4, 5, 6])
    cache.check_invariants([])
    tree = cache.tree

    tree.full_evictable_size += 1  # invariant 4
    with pytest.raises(InvariantError, match="invariant 4") as info:
        cache.check_invariants()
    assert "root" in str(info.value) and "[1 2 3 4]" in str(info.value)  # carries the dump
    tree.full_evictable_size -= 1

    leaked = cache.token_to_kv_pool_allocator.alloc(1)  # invariant 3: allocated, owned by nobody
    with pytest.raises(InvariantError, match=r"invariant 3: KV index .* owned by nobody"):
        cache.check_invariants([])
    cache.check_invariants()  # without the running requests, a leak cannot be told from a request
    cache.token_to_kv_pool_allocator.free(leaked)

    leaf = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    slot = leaf.mamba_slot
    leaf.mamba_slot = None  # invariant 1: a tombstone leaf
    with pytest.raises(InvariantError, match="invariant 1"):
        cache.check_invariants()
    leaf.mamba_slot = slot

    leaf.full_lock_ref = 1  # a lock without a holder
    with pytest.raises(InvariantError, match="a lock leaked"):
        cache.check_invariants()
    leaf.full_lock_ref = 0

    tree.index.remove(leaf)  # invariant 5
    with pytest.raises(InvariantError, match="invariant 5"):
        cache.check_invariants()
    tree.index.update(leaf)
    cache.check_invariants([])

    cache.mamba_pool.free([slot])  # invariant 3: a slot the tree holds went back to the free list
    with pytest.raises(InvariantError, match=r"state slot .* owned but not allocated"):
        cache.check_invariants()


def test_running_request_locks_are_accounted() -> None:
    cache = make_cache()
    insert_fresh(cache, [1, 2, 3, 4])
    req = Req(rid=1, origin_input_ids=[1, 2, 3, 4, 5])
    assert cache.admit(req)
    cache.check_invariants([req])
    with pytest.raises(InvariantError, match="mamba locks but 0 running requests"):
        cache.check_invariants([])
    other = RadixKey([1, 2, 3, 4])
    assert cache.match_prefix(other).last_node is req.last_node


@pytest.mark.parametrize("kv_only_leaves", [True, False])
def test_a_deleted_leaf_keeps_or_drops_its_stateless_ancestors(kv_only_leaves: bool) -> None:
    """SGLang 0.5.23 keeps a deleted leaf's ancestors without a state as KV-only leaves (their KV still
    tells a later request where to checkpoint the branch); 0.5.20 deletes them with the leaf."""
    cache = make_cache(NO_BUFFER.replace(mamba_kv_only_leaves=kv_only_leaves))
    insert_fresh(cache, [1, 2, 3, 4, 5, 6])
    insert_fresh(cache, [1, 2, 3, 9])  # splits [1..6] at 3: the parent [1 2 3] is a tombstone
    assert cache.evict(num_states=1) == EvictResult(3, 1)  # the older leaf [4 5 6] goes, with its KV
    cache.check_invariants([])
    assert cache.evict(num_states=1) == EvictResult(1 if kv_only_leaves else 4, 1)  # then [9]
    cache.check_invariants([])
    left = cache.full_evictable_size()
    assert left == (3 if kv_only_leaves else 0)
    if kv_only_leaves:
        m = cache.match_prefix([1, 2, 3, 4])
        assert (len(m.device_indices), m.full_kv_hit_len) == (0, 3)  # KV, but no state to resume from
        assert cache.evict(num_tokens=1) == EvictResult(3, 0)  # KV eviction takes the KV-only leaf
    assert cache.tree.num_nodes == 1
