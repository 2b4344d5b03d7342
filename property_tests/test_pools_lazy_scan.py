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
