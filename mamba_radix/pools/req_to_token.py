"""The request table: one row of KV indices per running request (seed 003 §3).

``req_to_token[row, pos]`` is the KV index of token ``pos`` of the request that holds ``row``. Row 0 is
padding: a padded batch points its dummy entries there. Rows are few (about the number of running
requests), so the free list is a Python stack and the allocation state a ``bytearray``: every call is
O(rows it touches).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex, InvariantError
from mamba_radix.pools._indices import (
    check_count,
    check_fits,
    check_size,
    lazy_zeros,
    resolve_device,
)

__all__ = ["ReqToTokenPool"]

_INT32_MAX = 2**31 - 1


class ReqToTokenPool:
    """``size`` request rows of ``max_context_len`` int32 KV indices each, on ``device``."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        self.size = check_size(size, "size")
        self.max_context_len = check_size(max_context_len, "max_context_len")
        self.device = resolve_device(device)
        check_fits(
            self.device, (size + 1) * max_context_len * 4, f"a request table of {size} x {max_context_len}"
        )
        # Sized for capacity (every running request's row at the longest context) but on the CPU resident
        # only where written: rows are handed out last-freed first, so a replay that runs few requests at a
        # time writes few rows, and a row only as far as its request's context (see lazy_zeros).
        self.req_to_token = lazy_zeros(
            "the request table", (size + 1, max_context_len), torch.int32, self.device
        )
        self._row_allocated = bytearray(size + 1)
        self._free_rows: list[int] = []
        # CPU: trusted writes go through a numpy view of the table (a cast-and-copy of a span costs ~1 us
        # where torch's __setitem__ with a dtype change costs ~5-10 us)
        self._table_np = self.req_to_token.numpy() if self.device.type == "cpu" else None
        self._reset_rows()

    def _reset_rows(self) -> None:
        # A stack popped from the end: reversed so that a fresh pool hands out rows 1, 2, 3, ...
        self._free_rows = list(range(self.size, 0, -1))
        self._row_allocated = bytearray(self.size + 1)
        self._rows_written = 1  # rows 0.. _rows_written - 1 may hold entries (clear zeroes only those)

    # ----------------------------------------------------------------------------------------- sizes
    def available_size(self) -> int:
        """Free rows. O(1)."""
        return len(self._free_rows)

    @property
    def used(self) -> int:
        """Rows held by requests."""
        return self.size - len(self._free_rows)

    def is_row_allocated(self, row: int) -> bool:
        """Whether ``row`` is currently held (False for 0, out-of-range rows and non-ints). O(1)."""
        return type(row) is int and 1 <= row <= self.size and bool(self._row_allocated[row])

    def audit(self) -> None:
        """Check the pool's own bookkeeping: the free stack holds exactly the rows not marked held, each
        once. Raises :class:`~mamba_radix.errors.InvariantError`. O(size)."""
        free = self._free_rows
        held = [row for row in range(1, self.size + 1) if self._row_allocated[row]]
        if self._row_allocated[0] or len(free) + len(held) != self.size or len(set(free)) != len(free):
            raise InvariantError(
                f"request rows: {len(free)} on the free stack ({len(set(free))} distinct) and {len(held)} "
                f"marked held do not add up to {self.size} (a double free or a lost row)"
            )
        both = [row for row in free if not 1 <= row <= self.size or self._row_allocated[row]]
        if both:
            raise InvariantError(
                f"request row {both[0]} is on the free stack but marked held (or out of range)"
            )

    # ------------------------------------------------------------------------------------- alloc/free
    def alloc(self, num_reqs: int) -> list[int] | None:
        """``num_reqs`` free rows, or ``None`` and nothing taken. O(num_reqs)."""
        check_count(num_reqs, "num_reqs")
        return self._take_rows(num_reqs)

    def _take_rows(self, num_rows: int) -> list[int] | None:
        if num_rows > len(self._free_rows):
            return None
        rows = self._free_rows[len(self._free_rows) - num_rows :][::-1]
        del self._free_rows[len(self._free_rows) - num_rows :]
        written = self._rows_written
        for row in rows:
            self._row_allocated[row] = 1
            if row >= written:
                written = row + 1
        self._rows_written = written
        return rows

    def free(self, rows: int | Sequence[int]) -> None:
        """Return rows to the pool. The table contents are left as they are (the next owner overwrites).

        Raises :class:`InvalidIndex` and frees nothing if any row is 0, out of range, not held, or given
        twice; :class:`InvalidArgument` if ``rows`` is not an int or a list/tuple/range of ints.
        O(len(rows)).
        """
        row_list = self._row_list(rows)
        self._check_rows_held(row_list)
        if len(set(row_list)) != len(row_list):
            dup = next(r for r in row_list if row_list.count(r) > 1)
            raise InvalidIndex(
                f"request row {dup} occurs twice in one free (a double free); pass each row once"
            )
        self._release_rows(row_list)

    @staticmethod
    def _row_list(rows: object) -> list[int]:
        if isinstance(rows, int) and not isinstance(rows, bool):
            return [rows]
        if isinstance(rows, (list, tuple, range)):
            return list(rows)
        raise InvalidArgument(
            f"rows must be an int or a list of ints, got {type(rows).__name__} {rows!r:.80}"
        )

    def _undo_take_rows(self, rows: list[int]) -> None:
        """Put back rows that :meth:`_take_rows` just returned, restoring the free stack exactly (the next
        ``_take_rows`` hands out the same rows in the same order). O(len(rows))."""
        for row in rows:
            self._row_allocated[row] = 0
        self._free_rows.extend(reversed(rows))

    def _release_rows(self, rows: list[int]) -> None:
        for row in rows:
            self._row_allocated[row] = 0
        self._free_rows.extend(rows)

    def _check_rows_held(self, rows: Sequence[int]) -> None:
        for row in rows:
            if isinstance(row, bool) or not isinstance(row, int):
                raise InvalidArgument(f"request rows must be ints, got {row!r}")
            if row == 0:
                raise InvalidIndex("request row 0 is the padding row and is never allocated or freed")
            if not 1 <= row <= self.size:
                raise InvalidIndex(f"request row {row} is out of range; valid rows are 1..{self.size}")
            if not self._row_allocated[row]:
                raise InvalidIndex(
                    f"request row {row} is not allocated (a double free, or a row never handed out); "
                    "free only rows returned by alloc"
                )

    # ------------------------------------------------------------------------------------------ write
    def write(self, row: int, start: int, values: torch.Tensor, check: bool = True) -> None:
        """``req_to_token[row, start:start + len(values)] = values``. O(len(values)).

        ``row`` must be held; ``values`` a 1-D int32/int64 tensor on the pool's device whose entries are KV
        indices (``0 <= v <= 2**31 - 1``; 0 is the padding row). Raises :class:`InvalidIndex` /
        :class:`InvalidArgument` and writes nothing otherwise. ``check=False`` is for trusted callers
        (the cache's lifecycle, writing indices its allocator or tree handed out into a row it holds):
        no validation, no host sync.
        """
        if not check:
            table = self._table_np
            if table is not None and values.device.type == "cpu":
                table[row, start : start + values.numel()] = values.numpy()
            else:
                self.req_to_token[row, start : start + values.numel()] = values
            return
        self._check_rows_held([row])
        check_count(start, "start")
        if not isinstance(values, torch.Tensor) or values.dtype not in (torch.int32, torch.int64):
            got = values.dtype if isinstance(values, torch.Tensor) else type(values).__name__
            raise InvalidArgument(f"values must be an int32 or int64 tensor, got {got}")
        if values.dim() != 1:
            raise InvalidArgument(f"values must be 1-D, got shape {tuple(values.shape)}")
        if values.device != self.device:
            raise InvalidArgument(f"values are on {values.device} but the pool lives on {self.device}")
        end = start + values.numel()
        if end > self.max_context_len:
            raise InvalidArgument(
                f"writing {values.numel()} entries at {start} ends at {end}, past max_context_len "
                f"{self.max_context_len}; raise max_context_len or write a shorter span"
            )
        if values.numel():
            # One pass, no abs(): abs(-2**63) overflows back to -2**63 and would pass a `> max` test.
            bad = (values < 0) | (values > _INT32_MAX) if values.dtype == torch.int64 else values < 0
            if bool(bad.any()):
                value = int(values[bad][0])
                raise InvalidArgument(
                    f"values must be KV indices in 0..{_INT32_MAX}, got {value}: negative indices are "
                    "invalid, and values must fit int32 (the table stores int32)"
                )
        self.req_to_token[row, start:end] = values.to(torch.int32)

    def clear(self) -> None:
        """Free every row and zero the table. O(rows ever handed out * max_context_len): rows above the
        highest one ever handed out were never written (only a held row, or the padding row 0, is)."""
        written = self._rows_written
        self._reset_rows()
        self.req_to_token[:written].zero_()
