"""An eviction's KV free with its count, which on the CPU touches nothing of the chunks (issue 28), against the
reference free of their concatenation; and the tree's count of what it frees.

- ``HostFreeList.free_chunks(chunks, num_ids)`` parks the chunks unread and unmarked: on random histories
  (allocations, such frees inside a free group or not, checked frees, refused double frees of parked ids,
  undos, merges, bitmap reads, clears) it answers every query as the torch free list freeing
  ``torch.cat(chunks)`` at once (``check=False``) does, and hands out the same ids in the same order, with
  the compiled release on and off;
- every reader of the bitmap or the released chunks sees a parked free as done, each called first after
  the free (so none can lean on another having settled it);
- the torch reference checks the count it is given, and refuses a wrong one with nothing freed;
- the tree's eviction counts exactly the tokens of the chunks it returns (``Freed.num_tokens``, the count
  the cache passes on), on random trees, for every order, with KV-only leaves or the cascade, through both
  phases.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix import CacheConfig
from mamba_radix.config import EVICTION_ORDERS
from mamba_radix.errors import InvalidIndex, InvariantError
from mamba_radix.pools.free_list import FreeList
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.host_free_list import HostFreeList, compiled_release_ids
from mamba_radix.tree import RadixKey, RadixTree

CPU = torch.device("cpu")
C_BUILT = compiled_release_ids(True) is not None


def _state(fl: FreeList) -> tuple:
    return (
        fl.available,
        fl.free_pages.tolist(),
        fl.release_pages.tolist(),
        fl.allocated_ids().tolist(),
    )


def _chunks(ids: list[int], cuts: list[int]) -> list[torch.Tensor]:
    """``ids`` cut at ``cuts`` into consecutive chunks (empty ones kept), as fresh tensors."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [torch.tensor(ids[a:b], dtype=torch.int64) for a, b in itertools.pairwise(bounds)]


def _outcome(f: Callable[[], object]) -> object:
    """What a call returned, or the type of what it raised (nothing changed then, on both sides)."""
    try:
        out = f()
    except (InvalidIndex, IndexError) as err:
        return type(err).__name__
    return out.tolist() if isinstance(out, torch.Tensor) else out


# One step: ("alloc", n) | ("evict", picks, cuts, group) | ("free", picks) | ("double", pick) |
# ("undo",) | ("merge",) | ("read", pick) | ("clear",) | ("state",)
STEP = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 40)),
    st.tuples(
        st.just("evict"),
        st.lists(st.integers(0, 10_000), min_size=1, max_size=60),
        st.lists(st.integers(0, 100), max_size=5),
        st.booleans(),
    ),
    st.tuples(st.just("free"), st.lists(st.integers(0, 10_000), min_size=1, max_size=20)),
    st.tuples(st.just("double"), st.integers(0, 10_000)),
    st.tuples(st.just("undo")),
    st.tuples(st.just("merge")),
    st.tuples(st.just("read"), st.integers(0, 10_000)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("state")),
)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(STEP, min_size=1, max_size=40),
    need_sort=st.booleans(),
    compiled=st.booleans(),
    num_ids=st.sampled_from([64, 300]),
)
def test_a_counted_free_answers_as_the_free_of_the_concatenation(steps, need_sort, compiled, num_ids):
    ours = make_free_list(num_ids, CPU, need_sort, "id", backend="host")
    assert isinstance(ours, HostFreeList)
    ours._release_ids = compiled_release_ids(compiled and C_BUILT)
    # a lazily listed merge lists a few ids at a time: a parked free then meets a scan of the bitmap that
    # must skip its ids (unwritten bits read as allocated; once settled, its pending marks)
    ours.LIST_CHUNK = 4
    ref = make_free_list(num_ids, CPU, need_sort, "id", backend="torch")
    held: list[int] = []  # allocated, in allocation order
    parked: list[int] = []  # freed by a counted free since the last full comparison
    last_alloc: torch.Tensor | None = None
    group_open = False
    for step in steps:
        op = step[0]
        if op == "alloc":
            a, b = ours.alloc(step[1]), ref.alloc(step[1])
            assert (a is None) == (b is None)
            if a is not None:
                assert a.tolist() == b.tolist()
                held.extend(a.tolist())
                last_alloc = b.clone()
        elif op == "evict" and held:
            _, picks, cuts, group = step
            chosen = list(dict.fromkeys(held[p % len(held)] for p in picks))
            held = [i for i in held if i not in set(chosen)]
            if group and not group_open:
                ours.free_group_begin()
                ref.free_group_begin()
                group_open = True
            ours.free_chunks(_chunks(chosen, cuts), len(chosen))
            ref.free(torch.tensor(chosen, dtype=torch.int64), check=False)
            parked.extend(chosen)
            assert ours.available == ref.available  # counted at once
            last_alloc = None
        elif op == "free" and held:
            chosen = list(dict.fromkeys(held[p % len(held)] for p in step[1]))
            held = [i for i in held if i not in set(chosen)]
            ids = torch.tensor(chosen, dtype=torch.int64)
            ours.free(ids.clone())
            ref.free(ids)
            last_alloc = None
        elif op == "double" and parked:
            # a checked free of an id a counted free just parked: refused, nothing changed
            bad = torch.tensor([parked[step[1] % len(parked)]], dtype=torch.int64)
            assert [_outcome(functools.partial(fl.free, bad.clone())) for fl in (ours, ref)] == [
                "InvalidIndex",
                "InvalidIndex",
            ]
        elif op == "undo" and last_alloc is not None:
            ours.undo_alloc(last_alloc.clone())
            ref.undo_alloc(last_alloc)
            held = held[: len(held) - last_alloc.numel()]
            last_alloc = None
        elif op == "merge":
            if group_open:
                ours.free_group_end()
                ref.free_group_end()
                group_open = False
            ours.merge()
            ref.merge()
            last_alloc = None
        elif op == "read":
            i = (parked or held or [1])[step[1] % len(parked or held or [1])]
            assert ours.is_id_allocated(i) == ref.is_id_allocated(i)
            assert bool(ours.allocated[i]) == bool(ref.allocated[i])
        elif op == "clear":
            if group_open:
                ours.free_group_end()
                ref.free_group_end()
                group_open = False
            ours.clear()
            ref.clear()
            held, parked, last_alloc = [], [], None
        elif op == "state":
            assert _state(ours) == _state(ref)
            ours.audit()
            parked = []
    if group_open:
        ours.free_group_end()
        ref.free_group_end()
    assert _state(ours) == _state(ref)
    ours.audit()
    rest = ours.available  # every free id, in the order both hand them out
    assert ours.alloc(rest).tolist() == ref.alloc(rest).tolist()


# Each reader, called first after a counted free of ids [5, 25) of 40 (all allocated): what the torch
# free list freeing them at once answers. Frees of up to HostFreeList.SMALL ids run in Python, larger ones
# through numpy: both forms of each check are read.
READERS: dict[str, Callable[[FreeList, torch.Tensor], object]] = {
    "allocated": lambda fl, ids: fl.allocated[ids].tolist(),
    "is_id_allocated": lambda fl, ids: [fl.is_id_allocated(int(i)) for i in ids],
    "is_allocated": lambda fl, ids: fl.is_allocated(ids).tolist(),
    "all_allocated": lambda fl, ids: fl.all_allocated(ids),
    "check_allocated": lambda fl, ids: _outcome(lambda: fl.check_allocated(ids)),
    "checked free": lambda fl, ids: _outcome(lambda: fl.free(ids[:3].clone())),
    "checked large free": lambda fl, ids: _outcome(lambda: fl.free(ids.clone())),
    "checked free_ints": lambda fl, ids: _outcome(lambda: fl.free_ints([int(ids[0])])),
    "checked free_containing": lambda fl, ids: _outcome(lambda: fl.free_containing(ids[:3].clone(), 1)),
    "checked large free_containing": lambda fl, ids: _outcome(lambda: fl.free_containing(ids.clone(), 1)),
    "allocated_ids": lambda fl, ids: fl.allocated_ids().tolist(),
    "release_pages": lambda fl, ids: fl.release_pages.tolist(),
    "listed_free_ids": lambda fl, ids: fl.listed_free_ids().tolist(),
    "free_pages": lambda fl, ids: fl.free_pages.tolist(),
    "audit": lambda fl, ids: fl.audit(),
    "merge": lambda fl, ids: (fl.merge(), fl.free_pages.tolist()),
    "alloc all": lambda fl, ids: fl.alloc(fl.available).tolist(),
    "undo_alloc": lambda fl, ids: (fl.undo_alloc(torch.tensor([38, 39])), fl.allocated_ids().tolist()),
    "free_group_end": lambda fl, ids: (fl.free_group_end(), fl.release_pages.tolist()),
    "clear": lambda fl, ids: (fl.clear(), fl.allocated_ids().tolist(), fl.available),
}


@pytest.mark.parametrize("need_sort", [True, False])
@pytest.mark.parametrize("in_group", [False, True])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_sees_a_counted_free_as_done(reader, in_group, need_sort):
    ours = make_free_list(40, CPU, need_sort, "id", backend="host")
    ref = make_free_list(40, CPU, need_sort, "id", backend="torch")
    assert ours.alloc(40).tolist() == ref.alloc(40).tolist()
    if in_group:
        ours.free_group_begin()
        ref.free_group_begin()
    ids = torch.arange(5, 25, dtype=torch.int64)
    assert ids.numel() > HostFreeList.SMALL
    ours.free_chunks([ids[:4].clone(), ids[4:4].clone(), ids[4:].clone()], 20)
    ref.free(ids.clone(), check=False)
    assert READERS[reader](ours, ids) == READERS[reader](ref, ids)
    if in_group and reader != "free_group_end":
        ours.free_group_end()
        ref.free_group_end()
    assert _state(ours) == _state(ref)


def test_a_counted_free_reads_nothing_until_a_reader_needs_it():
    """The chunks are parked as given (no numpy view, no bit written) and counted at once; the first
    reader settles them, the chunks' memory then backing the released ids (no copy)."""
    fl = make_free_list(100, CPU, True, "id", backend="host")
    fl.alloc(30)
    chunk = torch.arange(11, 21, dtype=torch.int64)
    fl.free_chunks([chunk], 10)
    assert fl.available == 80
    assert fl._alloc_np[11:21].all()  # not written yet
    assert not fl.is_id_allocated(11)  # the first reader writes them
    assert not fl._alloc_np[11:21].any()
    assert any(np.shares_memory(a, chunk.numpy()) for a in fl._released if isinstance(a, np.ndarray))


@pytest.mark.parametrize("compiled", [False, True])
def test_a_settled_free_is_skipped_by_the_scan_of_a_lazy_merge(compiled):
    """A lazy (scan) merge lists its free ids from the bitmap as allocations reach them. Ids freed after it
    by a counted free, above the scan's position, then settled by a reader, must be skipped by that scan
    (their pending marks), not listed a second time beside their released chunk."""
    if compiled and not C_BUILT:
        pytest.skip("the compiled release (mamba_radix._cfree) was not built")
    ours = make_free_list(64, CPU, True, "id", backend="host")
    ours._release_ids = compiled_release_ids(compiled)
    ours.LIST_CHUNK = 4
    ref = make_free_list(64, CPU, True, "id", backend="torch")
    for fl in (ours, ref):
        fl.alloc(64)
        fl.free(torch.tensor([*range(1, 21), *range(57, 65)]))
        fl.alloc(2)  # a scan merge (28 free of 64), listed lazily: 1..4 now, the rest as reached
    ids = torch.arange(50, 56)
    ours.free_chunks([ids[:2].clone(), ids[2:].clone()], 6)
    ref.free(ids.clone(), check=False)
    assert ours.is_id_allocated(50) is ref.is_id_allocated(50) is False  # settles them
    got, want = ours.alloc(26), ref.alloc(26)  # the scan runs through 50..55 to reach 57..64
    assert got.tolist() == want.tolist() and len(set(got.tolist())) == 26
    assert _state(ours) == _state(ref)
    ours.audit()


def test_nothing_to_free_changes_nothing():
    fl = make_free_list(50, CPU, True, "id", backend="host")
    fl.alloc(10)
    before = _state(fl)
    fl.free_chunks([], 0)
    fl.free_chunks([torch.empty(0, dtype=torch.int64)], 0)
    assert _state(fl) == before


def test_the_reference_refuses_a_wrong_count_with_nothing_freed():
    fl = make_free_list(50, CPU, True, "KV index", backend="torch")
    ids = fl.alloc(10)
    before = _state(fl)
    with pytest.raises(InvariantError, match="told 9 KV indexs but its chunks hold 10"):
        fl.free_chunks([ids[:4], ids[4:]], 9)
    assert _state(fl) == before
    fl.free_chunks([ids[:4], ids[4:]], 10)
    assert fl.available == 50


# ------------------------------------------------------------------------- the tree's count of its frees
tree_op_st = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
    st.tuples(st.just("match"), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
    st.tuples(st.just("lock"), st.tuples(st.integers(0, 50), st.booleans())),
    st.tuples(st.just("unlock"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.tuples(st.integers(0, 12), st.integers(0, 3))),
)


@settings(deadline=None, max_examples=150)
@given(
    order=st.sampled_from(EVICTION_ORDERS),
    kv_only_leaves=st.booleans(),
    ops=st.lists(tree_op_st, max_size=40),
)
def test_an_eviction_counts_exactly_the_tokens_it_frees(order, kv_only_leaves, ops):
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer",
        mamba_eviction_order=order,
        mamba_kv_only_leaves=kv_only_leaves,
    )
    tree = RadixTree(config)
    locked: list[tuple[object, bool]] = []
    slot, kv = 1, 1

    def counted(freed) -> None:
        assert freed.num_tokens == sum(int(c.numel()) for c in freed.kv)
        assert freed.num_states == len(freed.slots)

    for op, arg in ops:
        if op == "insert":
            value = torch.arange(kv, kv + len(arg), dtype=torch.int64)
            kv += len(arg)
            tree.insert(RadixKey(list(arg)), value, slot)
            slot += 1
        elif op == "match":
            tree.match(RadixKey(list(arg)))
        elif op == "lock":
            holders = [n for n in tree.nodes() if n.mamba_slot is not None]
            if holders:
                node = holders[arg[0] % len(holders)]
                tree.inc_lock_ref(node, checkpoint=arg[1])
                locked.append((node, arg[1]))
        elif op == "unlock" and locked:
            node, checkpoint = locked.pop(arg % len(locked))
            freed = tree.dec_lock_ref(node, checkpoint=checkpoint)  # type: ignore[arg-type]
            if freed is not None:
                counted(freed)
        elif op == "evict":
            counted(tree.evict(*arg))
    counted(tree.evict(10**6, 10**6))
