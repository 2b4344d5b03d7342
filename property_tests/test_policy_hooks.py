"""The research-policy extension point (mamba_radix.policy): keys, victim choice, checkpoint admission,
prefix fingerprints, all through the real cache and lifecycle."""

from __future__ import annotations

import pytest
from lifecycle_helpers import serve_prompt

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import InvalidArgument
from mamba_radix.policy import CachePolicy
from mamba_radix.state_stamp import fingerprint, write_stamp

NO_BUFFER = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)


def insert(cache: MambaRadixCache, tokens: list[int]) -> None:
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    slot = int(cache.mamba_pool.alloc(1)[0])
    write_stamp(cache.mamba_pool, slot, fingerprint(tokens), len(tokens))
    if cache.insert(tokens, kv, slot).mamba_exists:
        cache.mamba_pool.free([slot])


class MostRecentFirst(CachePolicy):
    name = "mru"

    def mamba_key(self, node):  # type: ignore[no-untyped-def]
        return (-node.mamba_last_access, node.id)


def test_a_policy_key_orders_checkpoint_victims() -> None:
    lru = MambaRadixCache.build(NO_BUFFER, num_tokens=64, num_slots=8)
    mru = MambaRadixCache.build(NO_BUFFER, num_tokens=64, num_slots=8, policy=MostRecentFirst())
    for cache in (lru, mru):
        insert(cache, [1, 2, 3])
        insert(cache, [4, 5, 6])
        cache.evict(num_states=1)
    assert lru.match_prefix([4, 5, 6, 7]).full_kv_hit_len == 3  # LRU took [1 2 3]
    assert mru.match_prefix([1, 2, 3, 7]).full_kv_hit_len == 3  # MRU took [4 5 6]
    assert (
        lru.match_prefix([1, 2, 3, 7]).full_kv_hit_len == mru.match_prefix([4, 5, 6, 7]).full_kv_hit_len == 0
    )
    mru.check_invariants([])


class PickDeepest(CachePolicy):
    """An O(n) chooser, as a renormalised utility would be."""

    def pick_mamba_victim(self, index):  # type: ignore[no-untyped-def]
        return max(index.mamba_candidates(), key=lambda n: n.depth, default=None)


def test_a_policy_can_choose_victims_itself() -> None:
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=64, num_slots=8, policy=PickDeepest())
    insert(cache, [1, 2, 3, 4, 5])
    insert(cache, [9])
    cache.match_prefix([1, 2, 3, 4, 5, 6])  # [1..5] is the most recent, and the deepest
    cache.evict(num_states=1)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).full_kv_hit_len == 0
    assert len(cache.match_prefix([9, 9]).device_indices) == 1


class DeclineShallow(CachePolicy):
    def __init__(self, min_len: int) -> None:
        super().__init__()
        self.min_len = min_len
        self.admitted: list[object] = []
        self.hits: list[int] = []

    def on_admit(self, req: Req) -> None:
        self.admitted.append(req.rid)

    def on_hit(self, req: Req) -> None:
        assert self.cache is not None and req.last_node is not None
        self.hits.append(req.cache_protected_len)

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        return seq_len >= self.min_len


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_declined_checkpoints_are_not_inserted_and_their_kv_is_freed(strategy: str) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy=strategy,  # type: ignore[arg-type]
        disable_overlap_schedule=strategy == "no_buffer",
        mamba_cache_chunk_size=4,
        chunked_prefill_size=8,
    )
    policy = DeclineShallow(min_len=16)
    cache = MambaRadixCache.build(config, num_tokens=256, num_slots=16, policy=policy)
    serve_prompt(cache, list(range(100, 124)), rid=24, chunk=8)  # hand-overs at 8, 16, 24
    depths = sorted(n.depth for n in cache.tree.nodes() if n.mamba_slot is not None)
    assert depths == [16, 24]
    assert cache.stats.checkpoints_declined == 1
    assert policy.admitted == [24] and policy.hits == [0]
    assert policy.cache is cache
    cache.check_invariants([])
    assert cache.token_to_kv_pool_allocator.used == 24


class Fingerprinted(CachePolicy):
    needs_prefix_fingerprints = True


def test_prefix_fingerprints_follow_splits() -> None:
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=64, num_slots=8, policy=Fingerprinted())
    insert(cache, [1, 2, 3, 4, 5])
    insert(cache, [1, 2, 9])  # splits [1..5] after 2
    cache.match_prefix([1, 2, 3, 7])  # splits [3 4 5] after 3
    tree = cache.tree
    for node in tree.nodes():
        tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
        assert node.prefix_fp == fingerprint(tokens), node.id
    assert tree.num_nodes == 5


def test_a_policy_serves_one_cache() -> None:
    policy = CachePolicy()
    MambaRadixCache.build(NO_BUFFER, num_tokens=8, num_slots=4, policy=policy)
    with pytest.raises(InvalidArgument, match="already serves another cache"):
        MambaRadixCache.build(NO_BUFFER, num_tokens=8, num_slots=4, policy=policy)
    with pytest.raises(InvalidArgument, match="must be a CachePolicy"):
        MambaRadixCache.build(NO_BUFFER, num_tokens=8, num_slots=4, policy=object())  # type: ignore[arg-type]
