"""A device free list of integer ids ``1..num_ids`` with an allocation bitmap (id 0 is padding).

The building block of the token allocators (ids are KV indices or pages) and of :class:`MambaPool`
(ids are state slots). SGLang semantics (seed 003, ``reference/sglang-semantics.md`` §6):

- ``free_pages``: a tensor whose head is handed out by ``alloc`` (a slice, no copy);
- ``need_sort``: freed ids wait in ``release_pages`` and are merged with the free list and sorted only
  when an ``alloc`` asks for more than ``free_pages`` holds, so that later allocations come out in
  ascending, mostly contiguous runs;
- ``free_group_begin`` / ``free_group_end``: frees inside a group are collected and concatenated once.

Freed ids are kept as a list of chunks and concatenated only at a merge, so ``free`` costs O(k) and never
copies the whole free list (SGLang's ``torch.cat`` per free is O(pool size)); a merge costs
O(ids merged + the request) and is paid for by the frees that fed it.

The bitmap ``allocated`` makes every misuse check vectorised: range, double free and never-allocated are
caught in O(k) before anything changes.
"""

from __future__ import annotations

import torch

from mamba_radix.pools._indices import check_allocated, check_in_range, check_no_duplicates

__all__ = ["FreeList"]


class FreeList:
    """Ids ``1..num_ids`` on ``device``; ``what`` names an id in error messages (``"KV index"``, ``"slot"``).

    ``available`` counts every free id, including freed ids not merged yet and frees pending in a group:
    they are free the moment ``free`` returns, and an ``alloc`` that needs them merges them in.
    """

    def __init__(self, num_ids: int, device: torch.device, need_sort: bool, what: str) -> None:
        self.num_ids = num_ids
        self.device = device
        self.need_sort = need_sort
        self.what = what
        self.allocated = torch.zeros(num_ids + 1, dtype=torch.bool, device=device)
        # Scratch for the O(k) duplicate check; contents are meaningless between calls.
        self._scratch = torch.empty(num_ids + 1, dtype=torch.int32, device=device)
        self.clear()

    # ------------------------------------------------------------------------------------------ state
    def clear(self) -> None:
        """Free every id: the free list becomes ``1..num_ids`` in order. O(num_ids)."""
        self.free_pages = torch.arange(1, self.num_ids + 1, dtype=torch.int64, device=self.device)
        self._released: list[torch.Tensor] = []  # freed chunks, not merged yet
        self._num_released = 0
        self._group: list[torch.Tensor] | None = None  # frees of an open group
        self._num_in_group = 0
        self.allocated.zero_()

    @property
    def available(self) -> int:
        """Free ids, merged or not. O(1), no device sync."""
        return self.free_pages.numel() + self._num_released + self._num_in_group

    @property
    def release_pages(self) -> torch.Tensor:
        """Freed ids waiting for the next merge (a new tensor; for inspection and tests)."""
        chunks = [*self._released, *(self._group or [])]
        if not chunks:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return torch.cat(chunks)

    # ------------------------------------------------------------------------------------- alloc/free
    def alloc(self, num_ids: int) -> torch.Tensor | None:
        """Take ``num_ids`` ids from the head of the free list, or return ``None`` and take nothing.

        Side effects: marks the ids allocated; may merge (and sort, with ``need_sort``) released ids.
        O(num_ids) plus an amortised merge.
        """
        if num_ids > self.available:
            return None
        if num_ids > self.free_pages.numel():
            self.merge()
        ids = self.free_pages[:num_ids]
        self.free_pages = self.free_pages[num_ids:]
        self.allocated[ids] = True
        return ids

    def free(self, ids: torch.Tensor, known_unique: bool = False) -> None:
        """Return ``ids`` (1-D int64 on the device) to the free list. O(k). ``known_unique``: the caller
        guarantees no repeats (skips that part of the check).

        Raises :class:`~mamba_radix.errors.InvalidIndex` (nothing changed) for padding, out-of-range,
        never-allocated or already-freed ids, or an id given twice.
        """
        if ids.numel() == 0:
            return
        self._check_freeable(ids, known_unique)
        self.allocated[ids] = False
        # Own the storage: a caller's view of a larger tensor must not be kept alive or aliased.
        ids = ids.clone()
        if self._group is not None:
            self._group.append(ids)
            self._num_in_group += ids.numel()
        else:
            self._released.append(ids)
            self._num_released += ids.numel()

    def _check_freeable(self, ids: torch.Tensor, known_unique: bool) -> None:
        """Range, allocation and repeat checks fused into two host syncs; the precise error (which
        value, which rule) is worked out only on failure."""
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 1 or high > self.num_ids:
            check_in_range(ids, 1, self.num_ids, self.what)
        ok = self.allocated[ids]
        if not known_unique and ids.numel() > 1:
            ranks = torch.arange(ids.numel(), dtype=self._scratch.dtype, device=ids.device)
            self._scratch[ids] = ranks
            ok &= self._scratch[ids] == ranks
        if not bool(ok.all()):
            check_allocated(self.allocated, ids, self.what)
            check_no_duplicates(self._scratch, ids, self.what)

    def check_allocated(self, ids: torch.Tensor) -> None:
        """Raise :class:`~mamba_radix.errors.InvalidIndex` unless every id is in range and allocated."""
        check_in_range(ids, 1, self.num_ids, self.what)
        check_allocated(self.allocated, ids, self.what)

    def check_unique(self, ids: torch.Tensor) -> None:
        """Raise :class:`~mamba_radix.errors.InvalidIndex` if an id occurs twice in ``ids``. O(k)."""
        check_no_duplicates(self._scratch, ids, self.what)

    def unique(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` without repeats (one occurrence of each, order not kept). O(k), no sort; ``ids`` must
        be in ``0..num_ids``. Each position writes its rank; the positions whose write survived are kept."""
        if ids.numel() < 2:
            return ids
        ranks = torch.arange(ids.numel(), dtype=self._scratch.dtype, device=ids.device)
        self._scratch[ids] = ranks
        return ids[self._scratch[ids] == ranks]

    def free_group_begin(self) -> None:
        """Start collecting frees; they are concatenated once at :meth:`free_group_end`. Not re-entrant."""
        if self._group is None:
            self._group = []
            self._num_in_group = 0

    def free_group_end(self) -> None:
        """Close the group: one concatenation of every free made inside it."""
        group, self._group = self._group, None
        if group:
            merged = torch.cat(group)
            self._released.append(merged)
            self._num_released += merged.numel()
        self._num_in_group = 0

    def is_allocated(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask: which of ``ids`` are allocated (out-of-range ids read as not allocated)."""
        inside = (ids >= 1) & (ids <= self.num_ids)
        return inside & self.allocated[ids.clamp(0, self.num_ids)]

    def allocated_ids(self) -> torch.Tensor:
        """Every allocated id, ascending. O(num_ids): for invariant checks, not hot paths."""
        return torch.nonzero(self.allocated).reshape(-1)

    # ---------------------------------------------------------------------------------------- private
    def merge(self) -> None:
        """Move every released id (and those of an open group) into the free list; sort if asked."""
        chunks = [self.free_pages, *self._released]
        if self._group:
            chunks.extend(self._group)
            self._group = []
            self._num_in_group = 0
        merged = torch.cat(chunks)
        if self.need_sort:
            merged = torch.sort(merged).values
        self.free_pages = merged
        self._released = []
        self._num_released = 0
