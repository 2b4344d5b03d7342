"""``skip_decode_lock`` (SGLang's ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1``) as SGLang means it.

At a hand-over (a prefill chunk's checkpoint to the tree) the request's lock moves to the new node for its
KV only: the checkpoint was donated from (or copied out of) the request's own slots and is never read from
that node again by this request, so eviction may take it while the request decodes. The admission lock,
which protects the copy-on-write source, stays a full one. Here: the tree's KV-only lock (counters,
eviction, the tombstone it may leave, its release), the lifecycle's use of it, and a tight state pool in
which the switch turns skipped checkpoints into evicted ones, at no loss of KV.
"""

from __future__ import annotations

import pytest
import torch

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import InvalidArgument
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp
from mamba_radix.tree import RadixKey, RadixTree


# ------------------------------------------------------------------------------------------- the tree
def _tree(**fields: object) -> RadixTree:
    return RadixTree(CacheConfig(**fields))  # type: ignore[arg-type]


def _insert(tree: RadixTree, tokens: list[int], slot: int, kv_base: int = 1) -> None:
    kv = torch.arange(kv_base, kv_base + len(tokens), dtype=torch.int64)
    tree.insert(RadixKey(tokens), kv, slot)


def _sizes(tree: RadixTree) -> tuple[int, int, int, int]:
    return (
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.mamba_evictable_size,
        tree.mamba_protected_size,
    )


def test_kv_only_lock_protects_kv_and_leaves_the_checkpoint_evictable() -> None:
    tree = _tree(mamba_kv_only_leaves=False)
    _insert(tree, [1, 2, 3, 4], slot=1)
    leaf = tree.match(RadixKey([1, 2, 3, 4])).best
    tree.inc_lock_ref(leaf, checkpoint=False)
    assert (leaf.full_lock_ref, leaf.mamba_lock_ref, leaf.kv_lock_ref) == (1, 0, 1)
    assert _sizes(tree) == (0, 4, 1, 0)
    check_tree_invariants(tree)
    # KV eviction cannot take it; checkpoint eviction takes the checkpoint only: a tombstone leaf, locked
    assert tree.evict(num_tokens=4).num_tokens == 0
    freed = tree.evict(num_states=1)
    assert (freed.num_tokens, freed.num_states, freed.slots) == (0, 1, [1])
    assert leaf.is_tombstone and tree.is_attached(leaf) and leaf.value.tolist() == [1, 2, 3, 4]
    assert tree.checkpoints_dropped_under_kv_lock == 1
    assert _sizes(tree) == (0, 4, 0, 0)
    check_tree_invariants(tree)
    # the release, on a tombstone, removes the leaf only that lock kept (0.5.20: no tombstone leaves)
    released = tree.dec_lock_ref(leaf, checkpoint=False)
    assert released is not None and released.num_tokens == 4 and released.num_states == 0
    assert torch.cat(released.kv).tolist() == [1, 2, 3, 4]
    assert not tree.is_attached(leaf) and tree.num_nodes == 1
    assert _sizes(tree) == (0, 0, 0, 0)
    check_tree_invariants(tree)


def test_kv_only_lock_release_keeps_a_kv_only_leaf_under_the_0_5_23_rule() -> None:
    tree = _tree(mamba_kv_only_leaves=True)
    _insert(tree, [1, 2, 3, 4], slot=1)
    leaf = tree.match(RadixKey([1, 2, 3, 4])).best
    tree.inc_lock_ref(leaf, checkpoint=False)
    tree.evict(num_states=1)
    assert tree.dec_lock_ref(leaf, checkpoint=False) is None
    assert tree.is_attached(leaf) and leaf.is_tombstone and _sizes(tree) == (4, 0, 0, 0)
    check_tree_invariants(tree)
    assert tree.evict(num_tokens=4).num_tokens == 4  # KV eviction takes it, as any KV-only leaf


def test_eviction_cascade_stops_at_a_kv_only_locked_tombstone() -> None:
    tree = _tree(mamba_kv_only_leaves=False)
    _insert(tree, [1, 2], slot=1)
    _insert(tree, [1, 2, 3, 4], slot=2, kv_base=1)
    parent = tree.match(RadixKey([1, 2])).best
    tree.inc_lock_ref(parent, checkpoint=False)
    tree.evict(num_states=2)  # the parent's checkpoint (a KV-only lock does not hold it), the child leaf
    assert parent.is_tombstone and parent.is_leaf and tree.is_attached(parent)
    check_tree_invariants(tree)
    freed = tree.dec_lock_ref(parent, checkpoint=False)
    assert freed is not None and freed.num_tokens == 2
    assert tree.num_nodes == 1
    check_tree_invariants(tree)


def test_a_kv_only_locked_node_revived_by_an_insert_keeps_an_evictable_checkpoint() -> None:
    tree = _tree()
    _insert(tree, [1, 2, 3, 4], slot=1)
    leaf = tree.match(RadixKey([1, 2, 3, 4])).best
    tree.inc_lock_ref(leaf, checkpoint=False)
    tree.evict(num_states=1)
    _insert(tree, [1, 2, 3, 4], slot=5)  # the KV is the tree's already; the tombstone takes the slot
    assert leaf.mamba_slot == 5 and _sizes(tree) == (0, 4, 1, 0)
    check_tree_invariants(tree)
    assert tree.dec_lock_ref(leaf, checkpoint=False) is None
    assert _sizes(tree) == (4, 0, 1, 0)
    check_tree_invariants(tree)


@pytest.mark.parametrize(
    ("take", "release", "message"),
    [
        (None, False, "holds no KV-only lock"),
        (False, True, "is not locked"),
        (True, False, "holds no KV-only lock"),
    ],
)
def test_a_release_of_the_wrong_kind_is_refused_and_changes_nothing(
    take: bool | None, release: bool, message: str
) -> None:
    tree = _tree()
    _insert(tree, [1, 2, 3, 4], slot=1)
    leaf = tree.match(RadixKey([1, 2, 3, 4])).best
    if take is not None:
        tree.inc_lock_ref(leaf, checkpoint=take)
    before = (tree.pretty_print(), _sizes(tree), leaf.full_lock_ref, leaf.mamba_lock_ref, leaf.kv_lock_ref)
    with pytest.raises(InvalidArgument, match=message):
        tree.dec_lock_ref(leaf, checkpoint=release)
    assert (
        tree.pretty_print(),
        _sizes(tree),
        leaf.full_lock_ref,
        leaf.mamba_lock_ref,
        leaf.kv_lock_ref,
    ) == before
    check_tree_invariants(tree)


def test_a_full_lock_still_refuses_a_tombstone_and_a_kv_only_lock_takes_one() -> None:
    tree = _tree()
    _insert(tree, [1, 2, 3, 4], slot=1)
    _insert(tree, [1, 2, 5, 6], slot=2, kv_base=11)
    split = tree.match(RadixKey([1, 2])).best  # no checkpoint at [1, 2]: the root
    assert split is tree.root
    tombstone = tree.root.children[1]
    assert tombstone.is_tombstone
    with pytest.raises(InvalidArgument, match="cannot lock tombstone"):
        tree.inc_lock_ref(tombstone)
    tree.inc_lock_ref(tombstone, checkpoint=False)
    assert _sizes(tree)[1] == 2
    check_tree_invariants(tree)
    assert tree.dec_lock_ref(tombstone, checkpoint=False) is None  # internal: it stays
    check_tree_invariants(tree)


# -------------------------------------------------------------------------------------- the lifecycle
GRID = 64


def _cache(
    skip: bool, num_slots: int, rows: int = 8, num_tokens: int = 8192, kv_only_leaves: bool = True
) -> MambaRadixCache:
    config = CacheConfig(
        mamba_kv_only_leaves=kv_only_leaves,
        mamba_radix_cache_strategy="extra_buffer",
        disable_overlap_schedule=True,
        chunked_prefill_size=GRID,
        mamba_track_interval=GRID,
        skip_decode_lock=skip,
    )
    return MambaRadixCache.build(
        config, num_tokens=num_tokens, num_slots=num_slots, max_running_requests=rows, max_context_len=1024
    )


def _check(cache: MambaRadixCache, running: list[Req]) -> None:
    """Every invariant (conservation with every running request), every checkpoint's state is its prefix's,
    and every running request's live state is the state of its KV."""
    cache.check_invariants(running)
    tree = cache.tree
    for node in tree.nodes():
        if node.mamba_slot is not None:
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            assert read_stamp(cache.mamba_pool, node.mamba_slot) == (fingerprint(tokens), node.depth)
    for req in running:
        assert read_stamp(cache.mamba_pool, req.mamba_pool_idx) == (
            fingerprint(req.token_ids(req.kv_len)),
            req.kv_len,
        )


def _forward(cache: MambaRadixCache, req: Req, num_tokens: int) -> None:
    plan = cache.extend(req, num_tokens)
    assert plan is not None, "the KV pool is sized so that KV never runs out"
    write_stamp(cache.mamba_pool, plan.live_slot, fingerprint(req.token_ids(plan.end)), plan.end)
    if plan.track_slot is not None:
        write_stamp(
            cache.mamba_pool, plan.track_slot, fingerprint(req.token_ids(plan.track_len)), plan.track_len
        )
    cache.commit(plan)
    if req.kv_len >= len(req.origin_input_ids):
        req.output_ids.append(1_000_000 + 1000 * int(req.rid) + len(req.output_ids))


def test_switch_off_keeps_the_hand_over_checkpoint_locked() -> None:
    cache = _cache(skip=False, num_slots=16)
    req = Req(1, list(range(200)))
    assert cache.admit(req, max_new_tokens=4)
    _forward(cache, req, GRID)
    assert req.cache_protected_len == GRID and cache.lock_covers_checkpoint(req)
    assert (cache.mamba_protected_size(), req.last_node.mamba_lock_ref, req.last_node.kv_lock_ref) == (
        1,
        1,
        0,
    )
    _check(cache, [req])


def test_switch_on_locks_only_the_kv_after_a_hand_over() -> None:
    cache = _cache(skip=True, num_slots=16)
    first = Req(1, list(range(200)))
    assert cache.admit(first, max_new_tokens=4)
    _forward(cache, first, 200)
    cache.finish(first)
    # admission: a full lock on the hit, the copy-on-write source
    req = Req(2, list(range(200)) + list(range(500, 600)))
    assert cache.admit(req, max_new_tokens=4)
    assert req.cache_protected_len == 192 and cache.lock_covers_checkpoint(req)
    assert req.last_node.mamba_lock_ref == 1
    _check(cache, [req])
    # the hand-over: the new node's KV only; the admission lock is released
    _forward(cache, req, GRID)
    node = req.last_node
    assert req.cache_protected_len == 256 and not cache.lock_covers_checkpoint(req)
    assert (node.mamba_lock_ref, node.kv_lock_ref) == (0, 1)
    assert cache.mamba_protected_size() == 0 and cache.full_protected_size() == 256
    _check(cache, [req])
    # its checkpoint goes; the request keeps running on its own slots, its KV stays
    assert cache.evict(num_states=cache.mamba_evictable_size()).num_states >= 1
    assert node.is_tombstone and cache.is_attached(node)
    assert cache.stats.checkpoints_evicted_while_decoding == 1
    _check(cache, [req])
    while req.kv_len < len(req.origin_input_ids):
        _forward(cache, req, min(GRID, len(req.origin_input_ids) - req.kv_len))
        _check(cache, [req])
    for _ in range(3):
        _forward(cache, req, 1)
        _check(cache, [req])
    cache.finish(req)
    _check(cache, [])
    assert cache.full_protected_size() == cache.mamba_protected_size() == 0


@pytest.mark.parametrize("kv_only_leaves", [False, True])
def test_abort_releases_a_kv_only_lock_on_a_tombstone_leaf(kv_only_leaves: bool) -> None:
    cache = _cache(skip=True, num_slots=16, kv_only_leaves=kv_only_leaves)
    req = Req(1, list(range(200)))
    assert cache.admit(req, max_new_tokens=4)
    _forward(cache, req, GRID)
    node = req.last_node
    cache.evict(num_states=1)
    assert node.is_tombstone and node.is_leaf
    _check(cache, [req])
    cache.finish(req, insert=False)  # abort: nothing inserted
    _check(cache, [])
    allocator = cache.token_to_kv_pool_allocator
    if kv_only_leaves:  # 0.5.23: it stays, a KV-only leaf for KV eviction to take
        assert cache.is_attached(node) and cache.full_evictable_size() == GRID
        cache.evict(num_tokens=GRID)
    else:  # 0.5.20: no tombstone leaves, so it goes with the lock
        assert not cache.is_attached(node)
    _check(cache, [])
    assert allocator.available_size() == allocator.size


def _serve_together(skip: bool, num_requests: int, num_slots: int) -> MambaRadixCache:
    """Requests with distinct 256-token prompts are admitted together, prefilled round-robin chunk by chunk
    (each chunk hands a checkpoint over), then decode round-robin and finish. Every invariant is checked
    after every step; returns the cache (its stats say what happened)."""
    cache = _cache(skip, num_slots, rows=num_requests)
    running: list[Req] = []
    for rid in range(1, num_requests + 1):
        req = Req(rid, [10_000 * rid + t for t in range(256)])
        assert cache.admit(req, max_new_tokens=8)
        running.append(req)
        _check(cache, running)
    while any(req.kv_len < len(req.origin_input_ids) for req in running):
        for req in running:
            if req.kv_len < len(req.origin_input_ids):
                _forward(cache, req, GRID)
                _check(cache, running)
    for _ in range(7):
        for req in running:
            _forward(cache, req, 1)
            _check(cache, running)
    while running:
        cache.finish(running.pop(0))
        _check(cache, running)
    return cache


def test_a_tight_pool_evicts_hand_over_checkpoints_instead_of_skipping_them() -> None:
    # 4 requests, each holding a live and a track slot, in 12 slots: after the first round of hand-overs
    # every slot is taken. Switch off, each request pins its newest hand-over checkpoint, so the next
    # round's hand-overs find no slot and are skipped; switch on, those checkpoints are evictable: the
    # hand-overs evict them instead, and the requests keep going on their own slots, their KV kept.
    num_requests, num_slots = 4, 12
    off = _serve_together(False, num_requests, num_slots)
    on = _serve_together(True, num_requests, num_slots)
    assert off.stats.checkpoints_skipped > 0
    assert off.stats.checkpoints_evicted_while_decoding == 0
    assert on.stats.checkpoints_skipped == 0
    assert on.stats.checkpoints_evicted_while_decoding > 0
    assert on.stats.checkpoints_inserted > off.stats.checkpoints_inserted
    for cache in (off, on):
        assert cache.full_protected_size() == cache.mamba_protected_size() == 0
