"""A refused call changes nothing (issue 11, cache level): misuse of the cache's public calls raises a
typed error before any split, clock tick, eviction, count or allocation."""

from __future__ import annotations

import pytest
import torch
from lifecycle_helpers import prefill

from mamba_radix import CacheConfig, InvalidArgument, InvalidIndex, MambaRadixCache, RadixKey, Req
from mamba_radix.state_stamp import fingerprint, write_stamp

NO_BUFFER = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
PAGED = CacheConfig(mamba_radix_cache_strategy="extra_buffer", page_size=4, mamba_track_interval=8)


def fresh(config: CacheConfig = NO_BUFFER) -> MambaRadixCache:
    cache = MambaRadixCache.build(config, num_tokens=64, num_slots=12, max_context_len=64)
    put(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    return cache


def put(cache: MambaRadixCache, tokens: list[int]) -> None:
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    slot = int(cache.mamba_pool.alloc(1)[0])
    write_stamp(cache.mamba_pool, slot, fingerprint(tokens), len(tokens))
    cache.insert(tokens, kv, slot)


def state(cache: MambaRadixCache) -> tuple:
    tree = cache.tree
    nodes = sorted((n.id, n.key, tuple(n.value.tolist()), n.mamba_slot, n.last_access) for n in tree.nodes())
    return (
        nodes,
        tree.clock,
        repr(cache.stats),
        cache.token_to_kv_pool_allocator.available_size(),
        cache.mamba_pool.available_size(),
        cache.req_to_token_pool.available_size(),
        cache.reserved_kv_tokens,
    )


def refused(cache: MambaRadixCache, error: type[Exception], match: str, call, *args, **kwargs) -> None:
    before = state(cache)
    with pytest.raises(error, match=match):
        call(*args, **kwargs)
    assert state(cache) == before


def test_insert_refuses_repeated_indices_and_the_trees_own_kv() -> None:
    cache = fresh()
    kv = cache.token_to_kv_pool_allocator.alloc(2)
    slot = int(cache.mamba_pool.alloc(1)[0])
    refused(cache, InvalidIndex, "repeat", cache.insert, [9, 9], torch.stack([kv[0], kv[0]]), slot)
    own = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]).device_indices
    refused(cache, InvalidArgument, "already the tree's", cache.insert, [1, 2, 3, 4, 5, 6, 7, 8], own, slot)


@pytest.mark.parametrize("config", [NO_BUFFER, PAGED], ids=["page1", "page4"])
def test_insert_refuses_the_trees_kv_past_the_matched_prefix(config: CacheConfig) -> None:
    """A tree index handed over where the key is new (no position-wise duplicate to compare with) would
    become a second node's: it must be refused too (it used to be accepted, breaking conservation)."""
    cache = fresh(config)
    tree_kv = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]).device_indices
    fresh_kv = cache.token_to_kv_pool_allocator.alloc(4)
    slot = int(cache.mamba_pool.alloc(1)[0])
    mixed = torch.cat([fresh_kv, tree_kv[:4]])  # a new key: nothing of it is matched
    refused(
        cache,
        InvalidArgument,
        "already the tree's",
        cache.insert,
        [30, 31, 32, 33, 34, 35, 36, 37],
        mixed,
        slot,
    )
    # past a real match as well: the shared prefix [1..4] is handed back with prev_prefix_len=4, the
    # rest is new, and one of the new positions reuses the tree's index at position 6
    tail = torch.cat([tree_kv[:4], fresh_kv[:2], tree_kv[6:8]])
    refused(cache, InvalidArgument, "position 6", cache.insert, [1, 2, 3, 4, 50, 51, 52, 53], tail, slot, 4)
    cache.check_invariants()


def test_held_flags_follow_the_tree_through_inserts_and_evictions() -> None:
    cache = fresh()
    put(cache, [1, 2, 3, 4, 9, 9, 9, 9])  # splits [1..8]: the split keeps the KV held
    put(cache, [20, 21, 22, 23])
    cache.check_invariants()  # checks the flags equal the tree's KV
    assert cache.evict(num_tokens=64).num_tokens == 16
    assert cache.held_kv_if_built().held_indices().numel() == 0
    reused = cache.token_to_kv_pool_allocator.alloc(4)  # indices the tree held before: fresh again
    cache.insert([60, 61, 62, 63], reused, int(cache.mamba_pool.alloc(1)[0]))
    cache.check_invariants()


def test_held_flags_are_built_from_the_tree_by_the_first_public_insert() -> None:
    """The lifecycle alone never builds the flags; the first public insert builds them from the tree, so
    a tree index the lifecycle inserted is refused there too."""
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=64, num_slots=12, max_context_len=64)
    req = Req(rid=1, origin_input_ids=list(range(1, 13)))
    assert cache.admit(req, 1)
    prefill(cache, req, 8)
    cache.finish(req)
    assert cache.held_kv_if_built() is None and cache.full_evictable_size() > 0
    tree_kv = cache.match_prefix(list(range(1, 13))).device_indices
    fresh_kv = cache.token_to_kv_pool_allocator.alloc(3)
    slot = int(cache.mamba_pool.alloc(1)[0])
    mixed = torch.cat([fresh_kv, tree_kv[:1]])
    refused(cache, InvalidArgument, "already the tree's", cache.insert, [70, 71, 72, 73], mixed, slot)
    assert cache.held_kv_if_built() is not None
    cache.check_invariants()  # the flags built from the tree equal its KV


@pytest.mark.parametrize("call", ["cache_unfinished_req", "cache_finished_req"])
def test_the_sglang_named_calls_refuse_a_tree_index_in_a_requests_own_kv(call: str) -> None:
    """A row that holds a tree index past cache_protected_len (an engine bug) is refused before anything
    changes: inserted, the index would have two owners; freed past the checkpoint, it would be freed
    under the tree."""
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=128, num_slots=12, max_context_len=64)
    done = Req(rid=1, origin_input_ids=list(range(1, 13)))
    assert cache.admit(done, 1)
    prefill(cache, done, 8)
    cache.finish(done)
    tree_kv = cache.match_prefix(list(range(1, 13))).device_indices
    req = Req(rid=2, origin_input_ids=list(range(100, 120)))
    assert cache.admit(req, 1)
    assert cache.extend(req, 8) is not None
    req.kv_len, req.pending_plan = 8, None  # the SGLang call form: the engine advances kv_len itself
    cache.req_to_token_pool.req_to_token[req.req_pool_idx, 3] = int(tree_kv[0])
    refused(cache, InvalidIndex, "at row position 3 .* is the tree's", getattr(cache, call), req)
    cache.req_to_token_pool.req_to_token[req.req_pool_idx, 3] = 0  # not allocated: the older check names it
    refused(cache, InvalidIndex, "not allocated", getattr(cache, call), req)


def test_insert_refuses_a_running_requests_slot() -> None:
    cache = fresh()
    req = Req(rid=1, origin_input_ids=[40, 41, 42])
    assert cache.admit(req)
    kv = cache.token_to_kv_pool_allocator.alloc(2)
    refused(cache, InvalidIndex, "running request", cache.insert, [9, 9], kv, req.mamba_pool_idx)


def test_copy_on_write_into_a_checkpoint_or_foreign_slot_is_refused_before_the_match() -> None:
    cache = fresh()
    node = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]).last_node
    thief = Req(rid=2, origin_input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 0], mamba_pool_idx=node.mamba_slot)
    refused(cache, InvalidIndex, "tree checkpoint", cache.match_prefix, [1, 2, 3], cow_mamba=True, req=thief)


def test_admission_of_a_carried_or_malformed_request_changes_nothing() -> None:
    cache = fresh()
    refused(
        cache,
        InvalidArgument,
        "carries pool fields",
        cache.admit,
        Req(rid=3, origin_input_ids=[1, 2], mamba_pool_idx=5),
    )
    refused(cache, InvalidArgument, "int token ids", cache.admit, Req(rid=4, origin_input_ids=[1, 2.5]))  # type: ignore[list-item]
    refused(cache, InvalidArgument, "list of int", cache.admit, Req(rid=5, origin_input_ids=(1, 2)))  # type: ignore[arg-type]
    refused(cache, InvalidArgument, "empty prompt", cache.admit, Req(rid=6, origin_input_ids=[]))
    refused(cache, InvalidArgument, "max_new_tokens", cache.admit, Req(rid=7, origin_input_ids=[1]), 0)


def test_lifecycle_misuse_changes_nothing() -> None:
    cache = fresh()
    req = Req(rid=8, origin_input_ids=list(range(100, 110)))
    assert cache.admit(req)
    refused(cache, InvalidArgument, "knows 10 tokens", cache.extend, req, 11)
    refused(cache, InvalidArgument, "num_tokens", cache.extend, req, 0)
    plan = cache.extend(req, 10)
    assert plan is not None
    refused(cache, InvalidArgument, "uncommitted plan", cache.extend, req, 1)
    refused(cache, InvalidArgument, "uncommitted plan", cache.finish, req)
    cache.commit(plan)
    refused(cache, InvalidArgument, "not request", cache.commit, plan)
    refused(cache, InvalidArgument, "append the sampled token", cache.extend, req, 1)
    req.output_ids.append(3.5)  # type: ignore[arg-type]
    refused(cache, InvalidArgument, "int token ids", cache.extend, req, 1)
    req.output_ids[-1] = 7
    req.kv_len = 3.0  # type: ignore[assignment]
    refused(cache, InvalidArgument, "kv_len", cache.extend, req, 1)
    req.kv_len = 10
    cache.finish(req)
    refused(cache, InvalidArgument, "holds no request row", cache.finish, req)


def test_an_aborted_plan_frees_its_kv() -> None:
    cache = fresh()
    free = cache.token_to_kv_pool_allocator.available_size()
    req = Req(rid=9, origin_input_ids=list(range(200, 220)))
    assert cache.admit(req)
    assert cache.extend(req, 20) is not None
    cache.finish(req, insert=False)
    assert cache.token_to_kv_pool_allocator.available_size() == free
    cache.check_invariants([])


def test_allocation_and_eviction_arguments_are_checked_before_evicting() -> None:
    cache = fresh(PAGED)
    refused(cache, InvalidArgument, "multiple of page_size", cache.alloc_token_slots, 6)
    refused(cache, InvalidArgument, "num_tokens", cache.make_room, None)
    refused(cache, InvalidArgument, "num_states", cache.make_room, 0, -1)


def test_radix_keys_refuse_non_int_tokens() -> None:
    for bad in ([1, None], [1.0], [2**63], ["a"]):
        with pytest.raises(InvalidArgument, match="int token ids"):
            RadixKey(bad)  # type: ignore[arg-type]


def test_locking_another_caches_node_is_refused() -> None:
    cache, other = fresh(), fresh()
    foreign = other.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]).last_node
    refused(cache, InvalidArgument, "no longer in the tree", cache.inc_lock_ref, foreign)
    cache.check_invariants([])
