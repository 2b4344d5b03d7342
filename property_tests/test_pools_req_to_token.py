"""ReqToTokenPool: row allocation, misuse, writes, and a stateful set model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import ReqToTokenPool


def test_table_shape_and_row_allocation():
    pool = ReqToTokenPool(3, 16)
    assert pool.req_to_token.shape == (4, 16) and pool.req_to_token.dtype == torch.int32
    assert pool.alloc(2) == [1, 2]
    assert pool.available_size() == 1 and pool.used == 2
    assert pool.alloc(2) is None and pool.used == 2  # all-or-nothing
    assert pool.alloc(0) == []
    pool.free([1])
    pool.free(2)
    assert pool.used == 0


@pytest.mark.parametrize(
    ("rows", "message"),
    [(0, "padding"), (4, "out of range"), (3, "not allocated"), ([1, 1], "twice"), ([1, 0], "padding")],
)
def test_bad_free_changes_nothing(rows, message):
    pool = ReqToTokenPool(3, 8)
    pool.alloc(2)
    with pytest.raises(InvalidIndex, match=message):
        pool.free(rows)
    assert pool.used == 2 and pool.is_row_allocated(1) and pool.is_row_allocated(2)


def test_free_rejects_non_int_rows():
    pool = ReqToTokenPool(3, 8)
    pool.alloc(1)
    with pytest.raises(InvalidArgument, match="ints"):
        pool.free([1.0])
    assert pool.used == 1


def test_write_places_values_in_the_row():
    pool = ReqToTokenPool(2, 8)
    (row,) = pool.alloc(1)
    pool.write(row, 2, torch.tensor([7, 8, 9]))
    pool.write(row, 0, torch.tensor([5, 6], dtype=torch.int32))
    assert pool.req_to_token[row, :5].tolist() == [5, 6, 7, 8, 9]
    assert pool.req_to_token[0].tolist() == [0] * 8  # padding row untouched


@pytest.mark.parametrize(
    ("row", "start", "values", "error", "message"),
    [
        (2, 0, torch.tensor([1]), InvalidIndex, "not allocated"),
        (1, 7, torch.tensor([1, 2]), InvalidArgument, "past max_context_len"),
        (1, -1, torch.tensor([1]), InvalidArgument, "start"),
        (1, 0, torch.tensor([1.0]), InvalidArgument, "int32 or int64"),
        (1, 0, torch.tensor([[1]]), InvalidArgument, "1-D"),
        (1, 0, torch.tensor([2**31]), InvalidArgument, "fit int32"),
    ],
)
def test_bad_write_writes_nothing(row, start, values, error, message):
    pool = ReqToTokenPool(2, 8)
    pool.alloc(1)
    with pytest.raises(error, match=message):
        pool.write(row, start, values)
    assert int(pool.req_to_token.abs().sum()) == 0


def test_clear_frees_rows_and_zeroes_the_table():
    pool = ReqToTokenPool(2, 4)
    (row,) = pool.alloc(1)
    pool.write(row, 0, torch.tensor([3]))
    pool.clear()
    assert pool.available_size() == 2 and int(pool.req_to_token.sum()) == 0


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def test_a_table_sized_for_capacity_is_resident_only_where_written():
    """1 GiB of table (4,096 rows of 65,536 positions) costs the rows written, not the capacity."""
    before = _rss_bytes()
    if before is None:
        pytest.skip("no /proc/self/status on this system")
    pool = ReqToTokenPool(4095, 65536)
    (row,) = pool.alloc(1)
    pool.write(row, 0, torch.arange(1, 65537, dtype=torch.int64))
    grown = _rss_bytes() - before  # type: ignore[operator]
    assert grown < 64 << 20, f"the request table made {grown / 2**20:.0f} MiB resident"
    assert int(pool.req_to_token[row, -1]) == 65536 and int(pool.req_to_token[4095].abs().sum()) == 0


def test_clear_zeroes_every_row_ever_handed_out():
    """clear zeroes only the rows up to the highest ever handed out, which are all a table was written
    in: the whole table reads zero afterwards, also rows freed before the clear."""
    pool = ReqToTokenPool(6, 8)
    rows = pool.alloc(4)
    for row in rows:
        pool.write(row, 0, torch.full((8,), row, dtype=torch.int64))
    pool.free(rows[1:3])
    pool.req_to_token[0, :2] = 7  # a padded batch's dummy write lands in row 0
    pool.clear()
    assert int(pool.req_to_token.abs().sum()) == 0
    assert pool.alloc(6) == [1, 2, 3, 4, 5, 6]


class ReqToTokenMachine(RuleBasedStateMachine):
    SIZE = 6

    def __init__(self) -> None:
        super().__init__()
        self.pool = ReqToTokenPool(self.SIZE, 4)
        self.held: set[int] = set()

    @rule(n=st.integers(0, 4))
    def alloc(self, n):
        got = self.pool.alloc(n)
        if n > self.SIZE - len(self.held):
            assert got is None
            return
        assert got is not None and len(set(got)) == n and not set(got) & self.held
        assert all(1 <= r <= self.SIZE for r in got)
        self.held |= set(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data):
        rows = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self.pool.free(rows)
        self.held -= set(rows)

    @rule(data=st.data())
    def double_free_refused(self, data):
        bad = data.draw(st.sampled_from([r for r in range(self.SIZE + 2) if r not in self.held]))
        with pytest.raises(InvalidIndex):
            self.pool.free([*sorted(self.held)[:1], bad])

    @invariant()
    def conservation(self):
        assert self.pool.available_size() + self.pool.used == self.SIZE
        assert {r for r in range(self.SIZE + 1) if self.pool.is_row_allocated(r)} == self.held


TestReqToTokenMachine = ReqToTokenMachine.TestCase
