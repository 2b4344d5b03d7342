"""FifoFreeList, the state pool's queue on the CPU, against HostFreeList without need_sort: the same ids in
the same order from every alloc, the same errors, the same bitmap, across frees of every form, free
groups, merges and undo_alloc; and the pool picks it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import MambaPool
from mamba_radix.pools.free_list import FifoFreeList, FreeList, HostFreeList, make_free_list

CPU = torch.device("cpu")


def order(fl: FreeList) -> list[int]:
    """The ids the next allocations hand out, in order: without need_sort a merge appends the pending
    frees after the merged list."""
    return fl.free_pages.tolist() + fl.release_pages.tolist()


class FifoAgainstHost(RuleBasedStateMachine):
    N = 40  # frees of up to 40 ids cross the host list's small-free cut-off (16)

    def __init__(self) -> None:
        super().__init__()
        self.fifo = make_free_list(self.N, CPU, False, "slot", backend="fifo")
        self.host = make_free_list(self.N, CPU, False, "slot", backend="host")
        self.held: list[int] = []
        self.last: list[int] | None = None  # the most recent alloc's ids

    def both(self, call) -> tuple:
        """Apply ``call`` to both lists; the results, or the errors' types and messages, must agree."""
        out = []
        for fl in (self.fifo, self.host):
            try:
                res = call(fl)
                out.append(("ok", res.tolist() if isinstance(res, torch.Tensor) else res))
            except InvalidIndex as exc:
                out.append(("error", str(exc)))
        assert out[0] == out[1], out
        return out[0]

    @rule(n=st.integers(0, N + 1), as_ints=st.booleans())
    def alloc(self, n, as_ints):
        kind, got = self.both(lambda fl: fl.alloc_ints(n) if as_ints else fl.alloc(n))
        assert kind == "ok"
        if got is not None:
            self.held += got
            self.last = got

    @rule(data=st.data(), check=st.booleans(), as_ints=st.booleans())
    def free(self, data, check, as_ints):
        if not self.held:
            return
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        free = (
            (lambda fl: fl.free_ints(list(ids), check))
            if as_ints
            else (lambda fl: fl.free(torch.tensor(ids), check))
        )
        assert self.both(free)[0] == "ok"
        self.held = [i for i in self.held if i not in ids]
        if self.last is not None and set(ids) & set(self.last):
            self.last = None

    @rule(data=st.data())
    def bad_free(self, data):
        ids = data.draw(st.lists(st.integers(-2, self.N + 2), min_size=1, max_size=self.N))
        if len(set(ids)) == len(ids) and set(ids) <= set(self.held):
            return  # a valid free
        before = (self.fifo.allocated.tolist(), order(self.fifo))
        assert self.both(lambda fl: fl.free(torch.tensor(ids, dtype=torch.int64)))[0] == "error"
        assert (self.fifo.allocated.tolist(), order(self.fifo)) == before

    @rule(data=st.data(), divisor=st.sampled_from([1, 2, 4]))
    def free_containing(self, data, divisor):
        if not self.held:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        tokens = [*chosen, *data.draw(st.lists(st.sampled_from(chosen), max_size=2 * len(chosen)))]
        tokens = [t * divisor + data.draw(st.integers(0, divisor - 1)) for t in tokens]
        assert self.both(lambda fl: fl.free_containing(torch.tensor(tokens), divisor))[0] == "ok"
        self.held = [i for i in self.held if i not in chosen]
        if self.last is not None and set(chosen) & set(self.last):
            self.last = None

    @rule()
    def undo_last_alloc(self):
        """The most recent alloc given back, also after frees of other ids: the same order after."""
        if not self.last:
            return
        ids = self.last
        assert self.both(lambda fl: fl.undo_alloc(torch.tensor(ids, dtype=torch.int64)))[0] == "ok"
        self.held = [i for i in self.held if i not in ids]
        self.last = None

    @rule()
    def group_begin(self):
        self.both(lambda fl: fl.free_group_begin())

    @rule()
    def group_end(self):
        self.both(lambda fl: fl.free_group_end())

    @rule()
    def merge(self):
        self.both(lambda fl: fl.merge())

    @invariant()
    def same_order_bitmap_and_count(self):
        assert order(self.fifo) == order(self.host)
        assert self.fifo.release_pages.numel() == 0
        assert self.fifo.allocated.tolist() == self.host.allocated.tolist()
        assert self.fifo.available == self.host.available == self.N - len(self.held)
        assert self.fifo.allocated_ids().tolist() == sorted(self.held)


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
