"""TokenToKVPoolAllocator (page_size 1): unit tests of every operation and a stateful model check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import TokenToKVPoolAllocator


def snapshot(a: TokenToKVPoolAllocator) -> tuple:
    return (
        a.available_size(),
        a.used,
        a.free_pages.tolist(),
        a.release_pages.tolist(),
        a.allocated_indices().tolist(),
    )


# ------------------------------------------------------------------------------------------ alloc
def test_fresh_pool_hands_out_one_to_size_in_order():
    a = TokenToKVPoolAllocator(8)
    assert a.available_size() == 8 and a.used == 0 and a.page_size == 1
    x = a.alloc(3)
    assert x.dtype == torch.int64 and x.tolist() == [1, 2, 3]
    assert a.alloc(5).tolist() == [4, 5, 6, 7, 8]
    assert a.available_size() == 0 and a.used == 8


def test_over_allocation_returns_none_and_takes_nothing():
    a = TokenToKVPoolAllocator(4)
    a.alloc(3)
    before = snapshot(a)
    assert a.alloc(2) is None
    assert snapshot(a) == before


def test_alloc_zero_is_empty():
    a = TokenToKVPoolAllocator(4)
    assert a.alloc(0).numel() == 0
    assert a.available_size() == 4


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_alloc_rejects_bad_counts(bad):
    a = TokenToKVPoolAllocator(4)
    with pytest.raises(InvalidArgument, match="num_tokens"):
        a.alloc(bad)


@pytest.mark.parametrize("bad", [0, -3, 2.0])
def test_constructor_rejects_bad_size(bad):
    with pytest.raises(InvalidArgument, match="size"):
        TokenToKVPoolAllocator(bad)


# ------------------------------------------------------------------------------------ need_sort
def test_need_sort_parks_frees_and_merges_sorted_on_demand():
    a = TokenToKVPoolAllocator(8, need_sort=True)
    x = a.alloc(6)  # free list now [7, 8]
    a.free(torch.tensor([5, 2]))
    a.free(torch.tensor([4]))
    assert sorted(a.release_pages.tolist()) == [2, 4, 5]
    assert a.free_pages.tolist() == [7, 8]
    assert a.available_size() == 5
    # fits in the merged free list: no merge yet
    assert a.alloc(1).tolist() == [7]
    assert a.release_pages.numel() == 3
    # needs more than the free list holds: merge + sort, then take the head
    assert a.alloc(3).tolist() == [2, 4, 5]
    assert a.free_pages.tolist() == [8]
    assert a.release_pages.numel() == 0
    assert x.numel() == 6


def test_without_need_sort_frees_keep_fifo_order():
    a = TokenToKVPoolAllocator(6, need_sort=False)
    a.alloc(6)
    a.free(torch.tensor([5, 2]))
    a.free(torch.tensor([4]))
    assert a.alloc(3).tolist() == [5, 2, 4]


def test_merge_and_sort_free_can_be_forced():
    a = TokenToKVPoolAllocator(4)
    a.alloc(4)
    a.free(torch.tensor([3, 1]))
    a.merge_and_sort_free()
    assert a.free_pages.tolist() == [1, 3] and a.release_pages.numel() == 0


# ---------------------------------------------------------------------------------- free groups
def test_free_group_batches_and_counts_pending_frees():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(8)
    a.free_group_begin()
    a.free(x[:2])
    a.free(x[5:6])
    # free the moment free() returns: counted, and an alloc may use them
    assert a.available_size() == 3 and a.used == 5
    with pytest.raises(InvalidIndex, match="KV index 1"):
        a.free(x[:1])  # double free inside the group is caught at once
    a.free_group_end()
    assert sorted(a.release_pages.tolist()) == [1, 2, 6]
    assert a.alloc(3).tolist() == [1, 2, 6]


def test_alloc_inside_a_group_can_use_group_frees():
    a = TokenToKVPoolAllocator(4)
    x = a.alloc(4)
    a.free_group_begin()
    a.free(x[2:])
    assert a.alloc(2).tolist() == [3, 4]
    a.free(x[:1])
    a.free_group_end()
    assert a.available_size() == 1 and a.alloc(1).tolist() == [1]


def test_empty_group_is_a_no_op():
    a = TokenToKVPoolAllocator(4)
    a.free_group_begin()
    a.free_group_end()
    assert a.available_size() == 4


# ------------------------------------------------------------------------------------- bad frees
@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([0], "padding"),
        ([9], "out of range"),
        ([-1], "out of range"),
        ([5], "not allocated"),  # never allocated
        ([2, 2], "twice"),
        ([1, 0], "padding"),
    ],
)
def test_bad_free_raises_and_changes_nothing(indices, message):
    a = TokenToKVPoolAllocator(8)
    a.alloc(4)
    a.free(torch.tensor([3]))
    before = snapshot(a)
    with pytest.raises(InvalidIndex, match=message):
        a.free(torch.tensor(indices))
    assert snapshot(a) == before


def test_double_free_raises_and_names_the_index():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(3)
    a.free(x[1:2])
    with pytest.raises(InvalidIndex, match="KV index 2"):
        a.free(x)
    assert a.is_allocated(torch.tensor([1, 2, 3])).tolist() == [True, False, True]


@pytest.mark.parametrize(
    "bad",
    [torch.tensor([1.0]), torch.tensor([True]), torch.tensor([[1]]), "x", [1.5]],
)
def test_free_rejects_bad_argument_types(bad):
    a = TokenToKVPoolAllocator(4)
    a.alloc(2)
    with pytest.raises(InvalidArgument):
        a.free(bad)
    assert a.used == 2


def test_free_accepts_int32_lists_ints_and_views():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(6)
    a.free(x[4:6].to(torch.int32))
    a.free([1, 2])
    a.free(3)
    a.free(torch.tensor(4))
    assert a.used == 0
    assert a.free(torch.empty(0, dtype=torch.int64)) is None


def test_free_copies_the_indices_it_keeps():
    a = TokenToKVPoolAllocator(4)
    x = a.alloc(2)
    a.free(x)
    x.fill_(99)  # the caller reuses its tensor: the pool must not see it
    assert sorted(a.alloc(4).tolist()) == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------ inspection
def test_is_allocated_and_allocated_indices():
    a = TokenToKVPoolAllocator(6)
    a.alloc(4)
    a.free(torch.tensor([2]))
    assert a.allocated_indices().tolist() == [1, 3, 4]
    assert a.is_allocated(torch.tensor([0, 1, 2, 3, 7, -1])).tolist() == [
        False,
        True,
        False,
        True,
        False,
        False,
    ]


def test_clear_frees_everything():
    a = TokenToKVPoolAllocator(5)
    a.alloc(3)
    a.free(torch.tensor([1]))
    a.free_group_begin()
    a.free(torch.tensor([2]))
    a.clear()
    assert a.available_size() == 5 and a.used == 0
    assert a.alloc(5).tolist() == [1, 2, 3, 4, 5]


# ----------------------------------------------------------------------------------- stateful model
class TokenAllocatorMachine(RuleBasedStateMachine):
    """The allocator against a set model: free + allocated == capacity, nothing handed out twice, every
    refused call changes nothing."""

    SIZE = 24
    BACKEND = "auto"  # the free list implementation; the subclass below runs the device one on CPU

    def __init__(self) -> None:
        super().__init__()
        self.need_sort = True
        self.alloc_ = TokenToKVPoolAllocator(self.SIZE, need_sort=self.need_sort, backend=self.BACKEND)
        self.allocated: set[int] = set()
        self.in_group = False

    @rule(need_sort=st.booleans())
    def restart(self, need_sort):
        self.alloc_ = TokenToKVPoolAllocator(self.SIZE, need_sort=need_sort, backend=self.BACKEND)
        self.allocated.clear()
        self.in_group = False

    @rule(n=st.integers(0, SIZE + 2))
    def alloc(self, n):
        free_before = self.SIZE - len(self.allocated)
        got = self.alloc_.alloc(n)
        if n > free_before:
            assert got is None
            return
        assert got is not None and got.numel() == n
        new = got.tolist()
        assert len(set(new)) == n, "an index handed out twice in one call"
        assert not set(new) & self.allocated, "an allocated index handed out again"
        assert all(1 <= i <= self.SIZE for i in new)
        self.allocated |= set(new)

    @precondition(lambda self: self.allocated)
    @rule(data=st.data())
    def free(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.allocated)), min_size=1, unique=True))
        self.alloc_.free(torch.tensor(chosen))
        self.allocated -= set(chosen)

    @rule(data=st.data())
    def bad_free(self, data):
        free_indices = sorted(set(range(self.SIZE + 2)) - self.allocated)
        bad = data.draw(st.sampled_from(free_indices))
        good = sorted(self.allocated)[:2]
        before = snapshot(self.alloc_)
        with pytest.raises(InvalidIndex):
            self.alloc_.free(torch.tensor([*good, bad]))
        assert snapshot(self.alloc_) == before

    @rule()
    def group_begin(self):
        self.alloc_.free_group_begin()
        self.in_group = True

    @rule()
    def group_end(self):
        self.alloc_.free_group_end()
        self.in_group = False

    @invariant()
    def conservation(self):
        a = self.alloc_
        assert a.available_size() + a.used == self.SIZE
        assert a.used == len(self.allocated)
        assert a.allocated_indices().tolist() == sorted(self.allocated)
        free_listed = a.free_pages.tolist() + a.release_pages.tolist()
        assert len(free_listed) == len(set(free_listed)), "an index is on the free list twice"
        assert set(free_listed) == set(range(1, self.SIZE + 1)) - self.allocated


TestTokenAllocatorMachine = TokenAllocatorMachine.TestCase


class TokenAllocatorMachineTorchBackend(TokenAllocatorMachine):
    BACKEND = "torch"


TestTokenAllocatorMachineTorchBackend = TokenAllocatorMachineTorchBackend.TestCase
