"""The eviction index's deferred removal against the eager reference (issue 12: a fast path keeps its
reference and a test that the two agree).

A lazy candidate set (:class:`mamba_radix.candidates.LazyKeySet`, the default) marks a removed key dead
instead of deleting it from its ``SortedList``, drops dead keys when they reach the front, skips them when
iterating and compacts once they outnumber the live ones. The eager set (:class:`~mamba_radix.candidates.KeySet`)
deletes at once. Both must hold the same members in the same order after any sequence of adds, removals (including a
dead key added again) and queries; and two trees, one per form, must pick the same victims, under the same
keys, over random inserts, matches, locks and evictions, for every order, refresh mode and both the base
policy's fast index paths and the general one (each form chosen by the tree's constructor arguments). The
compaction threshold is shrunk (``compact_min_dead``) so that a few operations reach it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from twin_trees import GeneralPath, run_twins, tree_op_st

from mamba_radix import CacheConfig
from mamba_radix.candidates import KeySet, LazyKeySet
from mamba_radix.config import EVICTION_ORDERS
from mamba_radix.errors import InvariantError
from mamba_radix.eviction import EvictionIndex, LazyStampIndex, OrderIndex, full_evict_key
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.tree import RadixKey, RadixTree

# ------------------------------------------------------------------------------------- the key set alone
set_op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 30)),  # a key (stamp, id) for id, made a member if it is not
    st.tuples(st.just("remove"), st.integers(0, 30)),  # the id-th member (modulo), if any
    st.tuples(st.just("first"), st.just(0)),
)


@settings(deadline=None)
@given(ops=st.lists(set_op_st, max_size=80), compact_from=st.integers(0, 4))
def test_lazy_key_set_matches_the_eager_one(ops: list[tuple[str, int]], compact_from: int) -> None:
    lazy, eager = LazyKeySet(compact_min_dead=compact_from), KeySet()
    members: dict[int, tuple[int, int]] = {}  # id -> its key while a member
    stamp_of: dict[int, int] = {}  # id -> the stamp of its last key (a re-add may reuse a dead key)
    for step, (op, arg) in enumerate(ops):
        if op == "add" and arg not in members:
            # half the re-adds reuse the id's last (now dead) key, the others take a fresh stamp
            stamp = stamp_of[arg] if arg in stamp_of and step % 2 else step
            key = (stamp, arg)
            lazy.add(key)
            eager.add(key)
            members[arg] = key
            stamp_of[arg] = stamp
        elif op == "remove" and members:
            node_id = sorted(members)[arg % len(members)]
            key = members.pop(node_id)
            lazy.remove(key)
            eager.remove(key)
        elif op == "first":
            assert lazy.first() == eager.first() == (min(members.values()) if members else None)
        assert lazy.keys() == eager.keys() == sorted(members.values())
        assert list(lazy) == list(eager)
        assert len(lazy) == len(eager) == len(members)
        assert bool(lazy) == bool(eager) == bool(members)
        # dead keys never outnumber the live ones beyond the threshold (the list stays O(live))
        assert len(lazy._dead) <= max(compact_from, len(members))


def test_lazy_key_set_compacts_and_defers() -> None:
    """A removal is deferred (the key stays in the list, dead) until the dead outnumber the live."""
    keys = LazyKeySet(compact_min_dead=2)
    for i in range(6):
        keys.add((i, i))
    for i in range(3):
        keys.remove((i, i))
    assert len(keys._sorted) == 6 and len(keys._dead) == 3 and len(keys) == 3  # deferred
    keys.remove((3, 3))  # 4 dead > 2 live and > 2: rebuilt from the live keys
    assert list(keys._sorted) == [(4, 4), (5, 5)] and not keys._dead
    keys.remove((4, 4))
    assert keys.first() == (5, 5) and list(keys._sorted) == [(5, 5)]  # the front's dead key dropped


# ---------------------------------------------------------------------------------------- whole trees
def _state(tree: RadixTree) -> tuple[object, ...]:
    index = tree.index
    first_full, first_mamba = index.first_full(), index.first_mamba()
    return (
        [n.id for n in index.full_candidates()],
        [n.id for n in index.mamba_candidates()],
        index.full_keys(),
        index.mamba_keys(),
        len(index),
        None if first_full is None else first_full.id,
        None if first_mamba is None else first_mamba.id,
        sorted((n.id, n.last_access, n.mamba_last_access, n.mamba_slot) for n in tree.nodes()),
    )


def _tree(config: CacheConfig, general: bool, lazy: bool, lazy_stamps: bool = True) -> RadixTree:
    """A tree whose index takes the given forms, compacting a lazy set from one dead key on."""
    return RadixTree(
        config,
        policy=GeneralPath() if general else None,
        lazy_removal=lazy,
        lazy_stamps=lazy_stamps,
        compact_min_dead=1,
    )


# (deferred removal, lazy stamps, the general path) of the tree checked against the eager reference: every
# form is lazy somewhere (a research policy's keys are never lazy-stamped, so the general path only tests
# deferred removal)
LAZY_FORMS = {
    "removal": (True, False, False),
    "removal, general path": (True, False, True),
    "stamps": (False, True, False),
    "removal and stamps": (True, True, False),
}


@settings(deadline=None, max_examples=400)
@given(
    order=st.sampled_from(EVICTION_ORDERS),
    refresh=st.sampled_from(["node", "path"]),
    form=st.sampled_from(sorted(LAZY_FORMS)),
    ops=st.lists(tree_op_st, max_size=40),
)
def test_lazy_index_trees_agree_with_eager_ones(
    order: str, refresh: str, form: str, ops: list[tuple[str, object]]
) -> None:
    """Deferred removal and lazy stamps (a touch that only stamps, the entry re-keyed when it reaches the
    front) pick the same victims, report the same keys and orders and pass the invariant checker, as the
    eager index does."""
    lazy_removal, lazy_stamps, general = LAZY_FORMS[form]
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer", mamba_eviction_order=order, mamba_lru_refresh=refresh
    )
    lazy = _tree(config, general, lazy_removal, lazy_stamps)
    eager = _tree(config, general, lazy=False, lazy_stamps=False)
    assert isinstance(lazy.index._full, LazyKeySet) == lazy_removal and lazy.index.lazy_stamps == lazy_stamps
    assert isinstance(eager.index._full, KeySet) and not eager.index.lazy_stamps
    assert type(eager.index) is (EvictionIndex if general else OrderIndex)
    run_twins(lazy, eager, ops, _state)


def test_lazy_stamps_defer_the_re_key_to_the_front() -> None:
    """A matched leaf stays listed under its old key until it reaches the front; then it is re-keyed
    and the next-oldest leaf goes first. A research policy's keys are never lazy."""
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer")
    tree = _tree(config, False, True, lazy_stamps=True)
    for i, tokens in enumerate(([1, 2], [3, 4], [5, 6])):
        tree.insert(RadixKey(tokens), torch.arange(10 * i, 10 * i + 2), i + 1)
    first = tree.index.first_full()
    assert first is not None and first.key.tolist() == [1, 2]
    listed = first.full_evict_key
    tree.match(RadixKey([1, 2]))
    assert first.full_evict_key == listed  # only the stamp moved
    assert [n.key.tolist() for n in tree.index.full_candidates()] == [[3, 4], [5, 6], [1, 2]]
    second = tree.index.first_full()
    assert second is not None and second.key.tolist() == [3, 4]
    assert first.full_evict_key == full_evict_key(first) != listed  # re-keyed at the front
    assert type(tree.index) is LazyStampIndex
    assert not _tree(config, True, True, lazy_stamps=True).index.lazy_stamps


def test_the_checker_accepts_only_an_older_listed_key() -> None:
    """Under lazy stamps a node may be listed under an older, smaller key of its own; the invariant checker
    accepts that, and refuses a listed key that is larger than the current one or another node's."""
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer")
    tree = _tree(config, False, True, lazy_stamps=True)
    for i, tokens in enumerate(([1, 2], [3, 4])):
        tree.insert(RadixKey(tokens), torch.arange(10 * i, 10 * i + 2), i + 1)
    tree.match(RadixKey([1, 2]))  # the leaf's stamp moves; its listed key does not
    leaf = next(n for n in tree.nodes() if n.key.tolist() == [1, 2])
    other = next(n for n in tree.nodes() if n.key.tolist() == [3, 4])
    assert leaf.full_evict_key != full_evict_key(leaf)
    check_tree_invariants(tree)  # older and smaller: accepted
    listed = leaf.full_evict_key
    for bad in ((listed[0] + 100, *listed[1:]), other.full_evict_key):  # larger; another node's id
        leaf.full_evict_key = bad
        with pytest.raises(InvariantError, match="invariant 5"):
            check_tree_invariants(tree)
    leaf.full_evict_key = listed
    check_tree_invariants(tree)
