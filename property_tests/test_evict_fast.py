"""The eviction path's fast forms against their references (issue 28).

- :class:`mamba_radix.candidates.LazyHeapKeySet` (the lazy-stamp index's candidate sets: a heap, removal
  deferred) against the eager :class:`~mamba_radix.candidates.KeySet` and a plain model: the same members,
  the same smallest, the same order when iterated;
- a victim's removal right after :meth:`first` pops it at once in both lazy forms, also when its entry is a
  revived dead one (equal to the node's key, not the same tuple), so no dead key is left for the next call;
- whole trees: the default tree (lazy-stamp index over heaps, the parent re-key skipped below a fork and for
  a cascading tombstone, a dropped checkpoint's entry taken out alone, the hoisted loop) against the
  reference (the general :class:`~mamba_radix.eviction.EvictionIndex`, every change re-derived, eager
  sets), on random inserts, matches, locks and evictions: every eviction frees the same KV
  chunks in the same order, the same slots in the same order, with the same counters and sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from twin_trees import GeneralPath

from mamba_radix import CacheConfig
from mamba_radix.candidates import KeySet, LazyHeapKeySet, LazyKeySet
from mamba_radix.config import EVICTION_ORDERS
from mamba_radix.errors import InvalidArgument
from mamba_radix.eviction import EvictionIndex, LazyStampIndex, OrderIndex
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.tree import Freed, RadixKey, RadixTree

# ------------------------------------------------------------------------------------- the key set alone
set_op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 30)),  # a key (stamp, id) for id, if it is not a member
    st.tuples(st.just("remove"), st.integers(0, 30)),  # the id-th member (modulo), if any
    st.tuples(st.just("first"), st.just(0)),
    st.tuples(st.just("evict"), st.just(0)),  # remove the member first() gives (an eviction's victim)
    st.tuples(st.just("rekey_first"), st.integers(1, 9)),  # the front member's stamp moves up
)


@settings(deadline=None, max_examples=300)
@given(ops=st.lists(set_op_st, max_size=80), compact_from=st.integers(0, 4))
def test_heap_key_set_matches_the_eager_one(ops: list[tuple[str, int]], compact_from: int) -> None:
    heap, eager = LazyHeapKeySet(compact_min_dead=compact_from), KeySet()
    members: dict[int, tuple[int, int]] = {}  # id -> its key while a member
    stamp_of: dict[int, int] = {}  # id -> the stamp of its last key (a re-add may reuse a dead key)
    for step, (op, arg) in enumerate(ops, start=1):
        if op == "add" and arg not in members:
            # half the re-adds reuse the id's last (now dead) key, as a new but equal tuple
            stamp = stamp_of[arg] if arg in stamp_of and step % 2 else 100 * step
            heap.add((stamp, arg))
            eager.add((stamp, arg))
            members[arg] = (stamp, arg)
            stamp_of[arg] = stamp
        elif op == "remove" and members:
            key = members.pop(sorted(members)[arg % len(members)])
            heap.remove((key[0], key[1]))  # an equal tuple, not the listed one
            eager.remove(key)
        elif op == "first":
            assert heap.first() == eager.first() == (min(members.values()) if members else None)
        elif op == "evict" and members:
            key = heap.first()
            assert key == eager.first() == min(members.values())
            assert key is not None
            entries = len(heap._heap)
            heap.remove(key)
            eager.remove(key)
            del members[key[1]]
            assert len(heap._heap) == entries - 1  # popped at once, not left dead
        elif op == "rekey_first" and members:
            front = heap.first()
            assert front == eager.first() == min(members.values()) and front is not None
            new = (front[0] + 100 * step + arg, front[1])  # a later stamp, as a touch gives
            heap.replace_first(new)
            eager.replace_first(new)
            members[front[1]] = new
            stamp_of[front[1]] = new[0]
        want = sorted(members.values())
        assert heap.keys() == eager.keys() == list(heap) == want
        assert len(heap) == len(eager) == len(want)
        assert bool(heap) == bool(want)
        assert len(heap._dead) <= max(compact_from, len(members))  # compacted as the sorted form is


@pytest.mark.parametrize("form", [LazyKeySet, LazyHeapKeySet])
def test_a_victim_goes_at_once_even_as_a_revived_entry(form: type[LazyKeySet]) -> None:
    """remove(first()) pops the entry instead of marking it dead, also when the entry is a dead one made
    live again (it keeps its first tuple while the caller holds an equal new one). The next first() then
    has no dead key to drop."""
    keys = form(compact_min_dead=100)
    for i in range(5):
        keys.add((i, i))
    keys.remove((2, 2))  # not the front: marked dead
    assert keys._dead == {(2, 2)}
    keys.add((2, 2))  # revived: the entry keeps its old tuple
    assert not keys._dead
    for i in range(3):
        front = keys.first()
        assert front == (i, i)
        keys.remove((i, i))  # equal to the front, a different object
        assert not keys._dead and len(keys) == 4 - i
    assert keys.first() == (3, 3)
    keys.add((-1, 9))  # a new front: (3, 3) is not the first entry any more
    keys.remove((3, 3))
    assert keys._dead == {(3, 3)} and keys.first() == (-1, 9)


def test_the_lazy_stamp_index_keeps_heaps() -> None:
    """The default tree's index is the lazy-stamp one over heaps; the eager reference keeps sorted lists."""
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer")
    assert isinstance(RadixTree(config).index, LazyStampIndex)
    assert type(RadixTree(config).index._mamba) is LazyHeapKeySet
    eager = RadixTree(config, lazy_removal=False, lazy_stamps=False)
    assert type(eager.index) is OrderIndex and type(eager.index._mamba) is KeySet


# ---------------------------------------------------------------------------------------- whole trees
tokens_st = st.lists(st.integers(0, 3), min_size=1, max_size=14)
tree_op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st),
    st.tuples(st.just("match"), tokens_st),
    st.tuples(st.just("lock"), st.tuples(st.integers(0, 50), st.booleans())),  # (which, with checkpoint)
    st.tuples(st.just("unlock"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.tuples(st.integers(0, 10), st.integers(0, 3))),
)


def _freed(freed: Freed) -> tuple[object, ...]:
    return (
        [kv.tolist() for kv in freed.kv],
        list(freed.slots),
        freed.num_tokens,
        freed.num_states,
    )


def _sizes(tree: RadixTree) -> tuple[int, ...]:
    return (
        tree.num_nodes,
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.mamba_evictable_size,
        tree.mamba_protected_size,
        tree.checkpoints_dropped_under_kv_lock,
        len(tree.slot_owner),
        len(tree.index),  # nodes listed in either set
    )


@settings(deadline=None, max_examples=250)
@given(
    order=st.sampled_from(EVICTION_ORDERS),
    kv_only_leaves=st.booleans(),
    compact_from=st.sampled_from([1, 4096]),
    ops=st.lists(tree_op_st, max_size=40),
)
def test_default_tree_evicts_as_the_eager_reference(
    order: str, kv_only_leaves: bool, compact_from: int, ops: list[tuple[str, object]]
) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer",
        mamba_eviction_order=order,
        mamba_kv_only_leaves=kv_only_leaves,
    )
    fast = RadixTree(config, compact_min_dead=compact_from)
    # the reference: the general index (any keys, every change re-derived by update) with eager sets
    ref = RadixTree(config, policy=GeneralPath(), lazy_removal=False, lazy_stamps=False)
    assert type(ref.index) is EvictionIndex and type(ref.index._mamba) is KeySet
    locked: list[tuple[object, object, bool]] = []
    slot, kv = 1, 1
    for op, arg in ops:
        if op == "insert":
            tokens = list(arg)  # type: ignore[call-overload]
            value = torch.arange(kv, kv + len(tokens), dtype=torch.int64)
            kv += len(tokens)
            x, y = (
                fast.insert(RadixKey(tokens), value, slot),
                ref.insert(RadixKey(tokens), value.clone(), slot),
            )
            assert (x.prefix_len, x.node.id, x.duplicate_kv.tolist(), x.capped_slots) == (
                y.prefix_len,
                y.node.id,
                y.duplicate_kv.tolist(),
                y.capped_slots,
            )
            slot += 1
        elif op == "match":
            x_m, y_m = fast.match(RadixKey(list(arg))), ref.match(RadixKey(list(arg)))  # type: ignore[call-overload]
            assert (x_m.best.id, x_m.hit_len) == (y_m.best.id, y_m.hit_len)
        elif op == "lock":
            which, checkpoint = arg  # type: ignore[misc]
            holders = [n for n in fast.nodes() if n.mamba_slot is not None]
            if holders:
                node = holders[which % len(holders)]
                twin = next(n for n in ref.nodes() if n.id == node.id)
                fast.inc_lock_ref(node, checkpoint=checkpoint)
                ref.inc_lock_ref(twin, checkpoint=checkpoint)
                locked.append((node, twin, checkpoint))
        elif op == "unlock":
            if locked:
                node, twin, checkpoint = locked.pop(int(arg) % len(locked))  # type: ignore[call-overload]
                x_u = fast.dec_lock_ref(node, checkpoint=checkpoint)  # type: ignore[arg-type]
                y_u = ref.dec_lock_ref(twin, checkpoint=checkpoint)  # type: ignore[arg-type]
                assert (x_u is None) == (y_u is None)
                if x_u is not None and y_u is not None:
                    assert _freed(x_u) == _freed(y_u)
        else:
            tokens_n, states_n = arg  # type: ignore[misc]
            assert _freed(fast.evict(tokens_n, states_n)) == _freed(ref.evict(tokens_n, states_n))
        assert _sizes(fast) == _sizes(ref)
        check_tree_invariants(fast)
    # drain both: the remaining victims, one at a time, in the same order
    while True:
        x_f, y_f = fast.evict(0, 1), ref.evict(0, 1)
        assert _freed(x_f) == _freed(y_f) and _sizes(fast) == _sizes(ref)
        if not x_f.num_states:
            break


def test_a_cascade_lists_nothing_on_its_way_out() -> None:
    """A leaf's removal that takes a chain of tombstones with it (0.5.20) lists none of them in the full
    set on the way (no add, then a dead mark, per tombstone): the set holds only live keys after it."""
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer", mamba_kv_only_leaves=False)
    tree = RadixTree(config, compact_min_dead=10_000)
    tree.insert(RadixKey([9]), torch.arange(100, 101), 9)  # the oldest leaf: the full set's front
    tree.insert(RadixKey([1, 2]), torch.arange(0, 2), 1)
    tree.insert(RadixKey([1, 2, 3, 4]), torch.arange(0, 4), 2)
    tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), torch.arange(0, 6), 3)
    # drop the two upper checkpoints: [1, 2] and [3, 4] become tombstones above the leaf [5, 6]
    for node in list(tree.nodes()):
        if node.children and node.mamba_slot is not None:
            tree._drop_checkpoint(node, Freed())
    full = tree.index._full
    leaf = next(n for n in tree.nodes() if n.key.tolist() == [5, 6])
    assert len(full) == 2 and leaf.full_evict_key is not None
    entries, dead = len(full._heap), set(full._dead)
    freed = Freed()
    tree._remove_leaf(leaf, freed)
    assert freed.num_tokens == 6 and tree.num_nodes == 2 and len(full) == 1
    # the leaf's own entry marked dead (it is not the front), nothing pushed for the two tombstones
    assert len(full._heap) == entries and len(full._dead) == len(dead) + 1
    assert tree.index.first_full() is not None and tree.index.first_full().key.tolist() == [9]


@pytest.mark.parametrize(
    ("num_tokens", "num_states"), [(True, 0), (0, -1), (np.int64(1), 0), (1.0, 0), (0, None)]
)
def test_evict_refuses_what_is_not_a_count(num_tokens: object, num_states: object) -> None:
    """The quick count check lets only plain ints >= 0 through; anything else gets the full rule's refusal,
    with nothing evicted."""
    tree = RadixTree(CacheConfig(mamba_radix_cache_strategy="no_buffer"))
    tree.insert(RadixKey([1, 2]), torch.arange(0, 2), 1)
    with pytest.raises(InvalidArgument, match="must be an int >= 0"):
        tree.evict(num_tokens, num_states)  # type: ignore[arg-type]
    assert tree.num_nodes == 2 and tree.mamba_evictable_size == 1
