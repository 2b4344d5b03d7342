"""FifoFreeList, the state pool's queue on the CPU, against HostFreeList without need_sort: the same ids in
the same order from every alloc, the same errors, the same bitmap, across frees of every form, free
groups, merges and undo_alloc; and the pool picks it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import MambaPool
from mamba_radix.pools.fifo_free_list import FifoFreeList
from mamba_radix.pools.free_list import FreeList
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.host_free_list import HostFreeList
from property_tests.test_pools_free_list import FreeListDifferential

CPU = torch.device("cpu")


def order(fl: FreeList) -> list[int]:
    """The ids the next allocations hand out, in order: without need_sort a merge appends the pending
    frees after the merged list."""
    return fl.free_pages.tolist() + fl.release_pages.tolist()


class FifoAgainstHost(FreeListDifferential):
    """The differential machine of test_pools_free_list (allocs, checked and unchecked frees, bad frees,
    free_containing, groups, merges) on a FifoFreeList and a HostFreeList without need_sort, plus allocs
    and frees by Python ints and undo_alloc of the most recent alloc; the ids handed out next must come
    in the same order, not only as the same set."""

    @rule()
    def restart(self, need_sort: bool = False) -> None:  # the parent's __init__ passes True: never sorted
        self.lists = [make_free_list(self.N, CPU, False, "slot", backend=b) for b in ("fifo", "host")]
        self.held: list[int] = []
        self.last: list[int] | None = None  # the most recent alloc's ids

    @rule(n=st.integers(0, FreeListDifferential.N + 1), as_ints=st.booleans())
    def alloc(self, n, as_ints):
        def call(fl: FreeList) -> torch.Tensor | None:
            ids = fl.alloc_ints(n) if as_ints else fl.alloc(n)
            return torch.tensor(ids, dtype=torch.int64) if type(ids) is list else ids

        kind, got = self.both(call)
        assert kind == "ok"
        if got is not None:
            self.held += got
            self.last = got

    @rule(data=st.data(), check=st.booleans())
    def free_ints(self, data, check):
        if not self.held:
            return
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        assert self.both(lambda fl: fl.free_ints(list(ids), check))[0] == "ok"
        self.held = [i for i in self.held if i not in ids]

    @rule()
    def undo_last_alloc(self):
        """The most recent alloc given back, also after frees of other ids: the same order after."""
        ids = self.last
        if not ids or not set(ids) <= set(self.held):  # none, or freed since
            return
        assert self.both(lambda fl: fl.undo_alloc(torch.tensor(ids, dtype=torch.int64)))[0] == "ok"
        self.held = [i for i in self.held if i not in ids]
        self.last = None

    @invariant()
    def same_order_and_bitmap(self):
        fifo, host = self.lists
        assert order(fifo) == order(host)
        assert fifo.release_pages.numel() == 0
        assert fifo.allocated.tolist() == host.allocated.tolist()


TestFifoAgainstHost = FifoAgainstHost.TestCase


def test_undo_of_an_older_alloc_is_a_checked_free_as_on_the_host() -> None:
    """Only the most recent alloc goes back to the front; an older one joins the back (checked)."""
    lists = [make_free_list(8, CPU, False, "slot", backend=b) for b in ("fifo", "host")]
    for fl in lists:
        first = fl.alloc(2)
        fl.alloc(1)
        fl.undo_alloc(first)
        with pytest.raises(InvalidIndex):
            fl.undo_alloc(first)  # no longer allocated: the checked free refuses it
    assert order(lists[0]) == order(lists[1]) == [4, 5, 6, 7, 8, 1, 2]


def test_the_state_pool_takes_the_queue_on_the_cpu_and_fifo_cannot_sort() -> None:
    assert type(MambaPool(4, 1, [(2, 4)], (2, 4))._free_list) is FifoFreeList
    assert type(MambaPool(4, 1, [(2, 4)], (2, 4), backend="host")._free_list) is HostFreeList
    assert type(MambaPool(4, 1, [(2, 4)], (2, 4), backend="torch")._free_list) is FreeList
    with pytest.raises(InvalidArgument, match="cannot sort"):
        make_free_list(4, CPU, True, "slot", backend="fifo")
    with pytest.raises(InvalidArgument, match="'fifo'"):
        make_free_list(4, CPU, False, "slot", backend="deque")


def test_clear_requeues_every_id_in_order() -> None:
    fl = FifoFreeList(5, CPU, "slot")
    fl.free(fl.alloc(3)[[2, 0]])
    fl.clear()
    assert order(fl) == [1, 2, 3, 4, 5] and fl.allocated_ids().numel() == 0
