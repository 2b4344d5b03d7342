"""PagedTokenToKVPoolAllocator: unit tests and a stateful check against a per-request page model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import PagedTokenToKVPoolAllocator, ReqToTokenPool, get_last_loc


def snapshot(a: PagedTokenToKVPoolAllocator) -> tuple:
    return (
        a.available_size(),
        a.free_pages.tolist(),
        a.release_pages.tolist(),
        a.allocated_indices().tolist(),
    )


def assert_page_layout(indices: list[int], first_pos: int, page_size: int) -> None:
    """Token at position p sits at offset p % page_size; positions of one page share one page."""
    for k, idx in enumerate(indices):
        pos = first_pos + k
        assert idx % page_size == pos % page_size, f"position {pos} at page offset {idx % page_size}"
        if k and pos % page_size:
            assert idx // page_size == indices[k - 1] // page_size, f"position {pos} left its page"


# ------------------------------------------------------------------------------------------ basics
def test_sizes_and_padding_page():
    a = PagedTokenToKVPoolAllocator(16, 4)
    assert a.num_pages == 4 and a.available_size() == 16 and a.used == 0
    assert a.max_index == 19
    x = a.alloc(8)
    assert x.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]  # page 0 is padding
    assert a.available_size() == 8 and a.used == 8


def test_alloc_needs_whole_pages():
    a = PagedTokenToKVPoolAllocator(16, 4)
    with pytest.raises(InvalidArgument, match="multiple of page_size"):
        a.alloc(3)
    assert a.used == 0


def test_alloc_over_capacity_returns_none():
    a = PagedTokenToKVPoolAllocator(8, 4)
    a.alloc(4)
    before = snapshot(a)
    assert a.alloc(8) is None
    assert snapshot(a) == before


def test_size_must_be_a_page_multiple():
    with pytest.raises(InvalidArgument, match="multiple of page_size"):
        PagedTokenToKVPoolAllocator(10, 4)


# ------------------------------------------------------------------------------------ alloc_extend
def test_alloc_extend_continues_the_last_partial_page():
    a = PagedTokenToKVPoolAllocator(32, 4)
    first = a.alloc_extend([0], [6], [-1], 6)
    assert first.tolist() == [4, 5, 6, 7, 8, 9]  # pages 1, 2; page 2 half used
    # request 0 continues at 10, 11 then takes page 3; request 1 starts fresh on page 4
    out = a.alloc_extend([6, 0], [11, 3], [9, -1], 8)
    assert out.tolist() == [10, 11, 12, 13, 14, 16, 17, 18]
    assert a.used == 16  # four pages


def test_alloc_extend_with_prefix_on_a_page_boundary_ignores_last_loc():
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc_extend([0], [4], [0], 4)
    out = a.alloc_extend([4], [6], [0], 2)  # 0: padding, ignored as the prefix fills its page
    assert out.tolist() == [8, 9]


def test_alloc_extend_within_one_partial_page_takes_no_page():
    a = PagedTokenToKVPoolAllocator(8, 4)
    a.alloc_extend([0], [1], [-1], 1)
    free_before = a.available_size()
    assert a.alloc_extend([1], [3], [4], 2).tolist() == [5, 6]
    assert a.available_size() == free_before


def test_alloc_extend_short_of_pages_takes_nothing():
    a = PagedTokenToKVPoolAllocator(8, 4)
    a.alloc_extend([0], [3], [-1], 3)
    before = snapshot(a)
    assert a.alloc_extend([3, 0], [9, 1], [6, -1], 7) is None
    assert snapshot(a) == before


def test_alloc_extend_zero_tokens():
    a = PagedTokenToKVPoolAllocator(8, 4)
    assert a.alloc_extend([], [], [], 0).numel() == 0
    assert a.alloc_extend([0], [0], [-1], 0).numel() == 0


@pytest.mark.parametrize(
    ("prefix", "seq", "last", "n", "error", "message"),
    [
        ([0], [3], [-1], 2, InvalidArgument, "extend_num_tokens"),
        ([3], [2], [6], 0, InvalidArgument, "seq_lens must be >= prefix_lens"),
        ([0, 1], [3], [-1], 3, InvalidArgument, "one entry per request"),
        ([-1], [2], [-1], 3, InvalidArgument, "prefix_lens must be >= 0"),
        ([2], [4], [-1], 2, InvalidIndex, "last_loc -1"),  # partial prefix needs a real last_loc
        ([2], [4], [12], 2, InvalidIndex, "KV page 3 is not allocated"),
        ([2], [4], [6], 2, InvalidArgument, "page offset 2"),  # position 1 sits at offset 1, not 2
    ],
)
def test_alloc_extend_rejects_bad_input(prefix, seq, last, n, error, message):
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc_extend([0], [2], [-1], 2)  # indices 4, 5 on page 1
    before = snapshot(a)
    with pytest.raises(error, match=message):
        a.alloc_extend(prefix, seq, last, n)
    assert snapshot(a) == before


# ------------------------------------------------------------------------------------ alloc_decode
def test_alloc_decode_continues_or_opens_a_page():
    a = PagedTokenToKVPoolAllocator(16, 4)
    r0 = a.alloc_extend([0], [4], [-1], 4)  # fills page 1
    r1 = a.alloc_extend([0], [2], [-1], 2)  # page 2, offsets 0..1
    out = a.alloc_decode([5, 3], [int(r0[-1]), int(r1[-1])])
    assert out.tolist() == [12, 10]  # r0 opens page 3, r1 continues page 2
    assert a.used == 12


def test_alloc_decode_short_of_pages_takes_nothing():
    a = PagedTokenToKVPoolAllocator(8, 4)
    r0 = a.alloc_extend([0], [4], [-1], 4)
    r1 = a.alloc_extend([0], [4], [-1], 4)
    before = snapshot(a)
    assert a.alloc_decode([5, 5], [int(r0[-1]), int(r1[-1])]) is None
    assert snapshot(a) == before


def test_alloc_decode_rejects_empty_sequences():
    a = PagedTokenToKVPoolAllocator(8, 4)
    with pytest.raises(InvalidArgument, match="seq_lens must be >= 1"):
        a.alloc_decode([0], [-1])


def test_get_last_loc_reads_the_request_table():
    table = ReqToTokenPool(3, 8)
    rows = table.alloc(2)
    table.write(rows[0], 0, torch.tensor([4, 5, 6]))
    last = get_last_loc(table.req_to_token, torch.tensor(rows), torch.tensor([3, 0]))
    assert last.tolist() == [6, -1]


# -------------------------------------------------------------------------------------------- free
def test_free_releases_whole_pages_once():
    a = PagedTokenToKVPoolAllocator(16, 4)
    x = a.alloc(8)
    a.free(x[1:3])  # two indices of page 1: the page is freed once
    assert a.available_size() == 12
    assert a.release_pages.tolist() == [1]
    assert a.is_allocated(x).tolist() == [False] * 4 + [True] * 4


@pytest.mark.parametrize(
    ("indices", "message"),
    [([2], "padding page"), ([20], "out of range"), ([12], "not allocated"), ([4, 13], "not allocated")],
)
def test_bad_paged_free_changes_nothing(indices, message):
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(8)
    before = snapshot(a)
    with pytest.raises(InvalidIndex, match=message):
        a.free(torch.tensor(indices))
    assert snapshot(a) == before


def test_paged_double_free_raises():
    a = PagedTokenToKVPoolAllocator(16, 4)
    x = a.alloc(4)
    a.free(x)
    with pytest.raises(InvalidIndex, match="KV page 1"):
        a.free(x[:1])


def test_paged_need_sort_group_and_clear():
    a = PagedTokenToKVPoolAllocator(16, 4)
    x = a.alloc(16)
    a.free_group_begin()
    a.free(x[12:])
    a.free(x[:4])
    assert a.available_size() == 8
    a.free_group_end()
    assert sorted(a.release_pages.tolist()) == [1, 4]
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 16, 17, 18, 19]  # merged and sorted
    a.clear()
    assert a.available_size() == 16 and a.allocated_indices().numel() == 0


# ----------------------------------------------------------------------------------- stateful model
class PagedAllocatorMachine(RuleBasedStateMachine):
    """Requests grow by extend and decode, and give back page-aligned prefixes or everything. Checks
    page alignment and in-page contiguity of every answer, no page handed out twice, all-or-nothing on
    shortage, and free + allocated == capacity."""

    PAGE = 4
    NUM_PAGES = 10
    BACKEND = "auto"  # the free list implementation; the subclass below runs the device one on CPU

    def __init__(self) -> None:
        super().__init__()
        self.a = PagedTokenToKVPoolAllocator(self.PAGE * self.NUM_PAGES, self.PAGE, backend=self.BACKEND)
        self.seqs: dict[int, list[int]] = {}  # request -> KV index per position
        self.freed_upto: dict[int, int] = {}  # request -> leading positions given back (page multiple)
        self.next_rid = 0

    def owned_pages(self) -> set[int]:
        return {i // self.PAGE for r, seq in self.seqs.items() for i in seq[self.freed_upto[r] :]}

    def new_pages_needed(self, prefix: int, seq: int) -> int:
        ceil = lambda n: -(-n // self.PAGE)  # noqa: E731
        return ceil(seq) - ceil(prefix)

    def last_loc(self, rid: int) -> int:
        seq = self.seqs[rid]
        return seq[-1] if len(seq) > self.freed_upto[rid] else -1

    @rule(new=st.integers(0, 2), data=st.data())
    def extend(self, new, data):
        for _ in range(new):
            self.seqs[self.next_rid], self.freed_upto[self.next_rid] = [], 0
            self.next_rid += 1
        live = sorted(self.seqs)
        rids = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=3)) if live else []
        lens = [data.draw(st.integers(0, 9)) for _ in rids]
        prefix = [len(self.seqs[r]) for r in rids]
        seq = [p + n for p, n in zip(prefix, lens, strict=True)]
        last = [self.last_loc(r) for r in rids]
        need = sum(self.new_pages_needed(p, s) for p, s in zip(prefix, seq, strict=True))
        before = snapshot(self.a)
        out = self.a.alloc_extend(prefix, seq, last, sum(lens))
        if need > self.NUM_PAGES - len(self.owned_pages()):
            assert out is None
            assert snapshot(self.a) == before
            return
        assert out is not None and out.numel() == sum(lens)
        taken_before = self.owned_pages()
        offset = 0
        for r, p, n in zip(rids, prefix, lens, strict=True):
            got = out[offset : offset + n].tolist()
            offset += n
            if p % self.PAGE:  # continues the page of the last prefix token
                assert_page_layout([self.seqs[r][-1], *got], p - 1, self.PAGE)
            else:
                assert_page_layout(got, p, self.PAGE)
            fresh_pages = {i // self.PAGE for k, i in enumerate(got) if (p + k) % self.PAGE == 0}
            assert not fresh_pages & taken_before, "a page handed out twice"
            taken_before |= fresh_pages
            self.seqs[r].extend(got)

    @precondition(lambda self: any(self.seqs.values()))
    @rule(data=st.data())
    def decode(self, data):
        candidates = sorted(r for r, s in self.seqs.items() if len(s) > self.freed_upto[r])
        rids = data.draw(st.lists(st.sampled_from(candidates), min_size=1, unique=True, max_size=4))
        seq_lens = [len(self.seqs[r]) + 1 for r in rids]
        need = sum(1 for s in seq_lens if (s - 1) % self.PAGE == 0)
        before = snapshot(self.a)
        out = self.a.alloc_decode(seq_lens, [self.last_loc(r) for r in rids])
        if need > self.NUM_PAGES - len(self.owned_pages()):
            assert out is None and snapshot(self.a) == before
            return
        assert out is not None
        owned = self.owned_pages()
        for r, s, idx in zip(rids, seq_lens, out.tolist(), strict=True):
            assert_page_layout([self.seqs[r][-1], idx], s - 2, self.PAGE)
            if (s - 1) % self.PAGE == 0:
                assert idx // self.PAGE not in owned, "a page handed out twice"
                owned.add(idx // self.PAGE)
            self.seqs[r].append(idx)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free_pages_of_a_request(self, data):
        r = data.draw(st.sampled_from(sorted(self.seqs)))
        seq, start = self.seqs[r], self.freed_upto[r]
        whole = data.draw(st.booleans())
        if whole:
            self.a.free(torch.tensor(seq[start:], dtype=torch.int64))
            del self.seqs[r], self.freed_upto[r]
            return
        full_pages = (len(seq) - start) // self.PAGE
        if full_pages == 0:
            return
        k = data.draw(st.integers(1, full_pages))
        end = start + k * self.PAGE
        if end == len(seq):  # keep at least the last page so the request can continue after last_loc
            end -= self.PAGE
            if end == start:
                return
        self.a.free(torch.tensor(seq[start:end], dtype=torch.int64))
        self.freed_upto[r] = end

    @precondition(lambda self: any(len(s) > self.freed_upto[r] for r, s in self.seqs.items()))
    @rule(data=st.data())
    def double_free_is_refused(self, data):
        gone = sorted(set(range(1, self.NUM_PAGES + 1)) - self.owned_pages())
        if not gone:
            return
        page = data.draw(st.sampled_from(gone))
        live = next(s[-1] for r, s in self.seqs.items() if len(s) > self.freed_upto[r])
        before = snapshot(self.a)
        with pytest.raises(InvalidIndex):
            self.a.free(torch.tensor([live, page * self.PAGE + 1]))
        assert snapshot(self.a) == before

    @invariant()
    def conservation(self):
        owned = self.owned_pages()
        assert self.a.available_size() + self.a.used == self.PAGE * self.NUM_PAGES
        assert self.a.used == len(owned) * self.PAGE
        allocated = self.a.allocated_indices().tolist()
        assert sorted({i // self.PAGE for i in allocated}) == sorted(owned)
        assert all(i % self.PAGE == 0 for i in allocated[:: self.PAGE]), "allocated indices not page-aligned"
        listed = self.a.free_pages.tolist() + self.a.release_pages.tolist()
        assert len(listed) == len(set(listed))
        assert set(listed) == set(range(1, self.NUM_PAGES + 1)) - owned


TestPagedAllocatorMachine = PagedAllocatorMachine.TestCase


class PagedAllocatorMachineTorchBackend(PagedAllocatorMachine):
    BACKEND = "torch"


TestPagedAllocatorMachineTorchBackend = PagedAllocatorMachineTorchBackend.TestCase
