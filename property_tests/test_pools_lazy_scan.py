"""The host free list's lazy scan merge (issue 12: no O(pool) spike at a merge) against the torch free
list's eager one: same ids in the same order, same free list and pending frees at every step, also
across undo_alloc, free groups and listing in many small segments."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import rule

from mamba_radix.pools.host_free_list import HostFreeList
from property_tests.test_pools_free_list import FreeListDifferential


class LazyScanDifferential(FreeListDifferential):
    """The differential machine of test_pools_free_list, plus undo_alloc, with the host list listing
    at most 3 ids per scan segment (so a merge is listed in many segments, interleaved with frees)."""

    N = 40

    def __init__(self) -> None:
        self._chunk = HostFreeList.LIST_CHUNK
        HostFreeList.LIST_CHUNK = 3
        super().__init__()

    def teardown(self) -> None:
        HostFreeList.LIST_CHUNK = self._chunk

    @rule(n=st.integers(1, 12))
    def alloc_then_undo(self, n):
        """An alloc given back at once: the next alloc hands out the same ids, in the same order."""
        kind, got = self.both(lambda fl: fl.alloc(n))
        if got is None:
            return
        self.both(lambda fl: fl.undo_alloc(torch.tensor(got, dtype=torch.int64)))
        assert self.both(lambda fl: fl.alloc(n)) == (kind, got)
        self.held += got


TestLazyScanDifferential = LazyScanDifferential.TestCase


@pytest.mark.parametrize("num_ids", [1 << 20])
def test_a_scan_merge_lists_lazily_and_hands_out_the_free_ids_in_order(num_ids: int) -> None:
    """A merge with most of a large pool free costs O(merged chunks), not a bitmap scan; the ids then
    come out ascending, every free id once."""
    fl = HostFreeList(num_ids, torch.device("cpu"), True, "KV index")
    taken = fl.alloc(num_ids)
    assert taken is not None
    fl.free(taken[::2].clone())  # half the pool, scattered
    first = fl.alloc(1)  # merges (scan path: the free list is over 1/8 of the pool)
    assert first is not None and first.tolist() == [1]
    assert fl._unlisted > 0  # listed lazily: most of the merged list is not materialised yet
    rest = fl.alloc(num_ids // 2 - 1)
    assert rest is not None
    assert rest.tolist() == list(range(3, num_ids + 1, 2))
    assert fl.available == 0 and fl._unlisted == 0


def test_a_fresh_list_materialises_only_what_it_hands_out_and_clear_starts_over() -> None:
    """A fresh host list holds no id array of its capacity: ids are listed LIST_CHUNK at a time as
    allocations reach them, 1, 2, 3 ... in order; after clear the same ids come out again, and only the
    bitmap bytes of ids ever listed needed clearing (the rest were never written)."""
    num_ids = 1 << 24
    fl = HostFreeList(num_ids, torch.device("cpu"), True, "KV index")
    assert len(fl._buf) == 0 and fl._unlisted == num_ids and fl.available == num_ids
    got = fl.alloc(5)
    assert got is not None and got.tolist() == [1, 2, 3, 4, 5]
    assert len(fl._buf) == HostFreeList.LIST_CHUNK  # one segment listed, not the capacity
    more = fl.alloc(HostFreeList.LIST_CHUNK)  # crosses into a second segment
    assert more is not None and more.tolist() == list(range(6, HostFreeList.LIST_CHUNK + 6))
    fl.free(got)
    fl.audit()
    fl.clear()
    assert fl.available == num_ids and not bool(fl.allocated.any())
    again = fl.alloc(3)
    assert again is not None and again.tolist() == [1, 2, 3]
    fl.audit()
