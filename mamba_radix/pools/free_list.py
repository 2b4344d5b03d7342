"""A free list of integer ids ``1..num_ids`` with an allocation bitmap (id 0 is padding).

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

The bitmap ``allocated`` makes every misuse check one gather: it has ``num_ids + 2`` entries and both
ends, 0 (padding) and ``num_ids + 1`` (a sentinel), are never set, so clamping an id into
``0..num_ids + 1`` and reading the bitmap answers "in range and allocated" at once. Only when that fused
check fails are the precise diagnostics of :mod:`._indices` run (which value, which rule), so the cost of
a good error message is paid only by a bad call.

Two implementations with one behaviour (a differential test drives them side by side):

- :class:`FreeList`, plain torch, any device. ``alloc`` never syncs with the host; a checked ``free`` syncs
  once (one fused ``all()``), an unchecked one never.
- :class:`HostFreeList`, for CPU pools. The same tensors, read and written through numpy views of their
  memory: a numpy call on a small array costs ~0.3 us where the torch call costs 2-5 us, and the
  allocators' per-call cost is nothing but such small calls. It is independent of
  ``torch.get_num_threads()`` (numpy runs these on one thread).

And one for the state pool on the CPU, :class:`FifoFreeList`: without ``need_sort`` a merge only
concatenates, in the order of the frees, so the free list is a FIFO queue (SGLang's ``MambaPool`` appends
freed slots to its free tensor); this one keeps it as a queue of Python ints and never merges.

:func:`make_free_list` picks one by device (and ``backend``).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument, InvariantError
from mamba_radix.pools._indices import (
    allocate_tensor,
    as_index_tensor,
    check_allocated,
    check_fits,
    check_in_range,
    check_no_duplicates,
)

__all__ = ["FifoFreeList", "FreeList", "HostFreeList", "make_free_list"]

# A need_sort merge of a free list this large (relative to the pool) reads the bitmap instead of sorting:
# the free ids in ascending order are exactly the unset bits, an O(num_ids) scan that beats sorting once
# the list is more than ~1/8 of the pool.
_SCAN_FRACTION = 8


class FreeList:
    """Ids ``1..num_ids`` on ``device``; ``what`` names an id in error messages (``"KV index"``, ``"slot"``).

    ``available`` counts every free id, including freed ids not merged yet and frees pending in a group:
    they are free the moment ``free`` returns, and an ``alloc`` that needs them merges them in.

    State: ``_buf[_head:]`` is the merged free list (a head pointer instead of re-slicing on each alloc);
    ``_released`` are freed chunks not merged yet; ``_group`` the chunks of an open free group.
    """

    _unlisted = 0  # free ids a lazy merge has not listed yet (HostFreeList's; clear() resets it)

    def __init__(self, num_ids: int, device: torch.device, need_sort: bool, what: str) -> None:
        self.num_ids = num_ids
        self.device = device
        self.need_sort = need_sort
        self.what = what
        # bitmap (1 byte) + duplicate-check scratch (4) + free list buffer (8) per id
        check_fits(device, (num_ids + 2) * 13, f"a free list of {num_ids} {what}s")
        # [0] padding and [num_ids + 1] sentinel stay False forever (see the module docstring).
        self.allocated = allocate_tensor(
            "the allocation bitmap", torch.zeros, num_ids + 2, dtype=torch.bool, device=device
        )
        # Scratch for the O(k) duplicate check; contents are meaningless between calls.
        self._scratch = allocate_tensor(
            "the free list scratch", torch.empty, num_ids + 2, dtype=torch.int32, device=device
        )
        self.clear()

    # ------------------------------------------------------------------------------------------ state
    def clear(self) -> None:
        """Free every id: the free list becomes ``1..num_ids`` in order. O(num_ids)."""
        self._set_buffer(torch.arange(1, self.num_ids + 1, dtype=torch.int64, device=self.device))
        self._released: list = []  # freed chunks, not merged yet
        self._num_released = 0
        self._group: list | None = None  # chunks freed inside an open group
        self._num_in_group = 0
        self._pre_merge: tuple | None = None  # what the last alloc's merge replaced (see undo_alloc)
        # Free ids of the last merge not listed in _buf yet (HostFreeList's lazy bitmap scan; always 0 for
        # this class): they are the free, not pending bits at positions >= _scan_pos, in order.
        self._unlisted = 0
        self._scan_pos = self.num_ids + 1
        self.allocated.zero_()

    def _set_buffer(self, buf: torch.Tensor) -> None:
        self._buf = buf
        self._head = 0
        self._buf_len = buf.numel()

    @property
    def free_pages(self) -> torch.Tensor:
        """The merged free list; its head is what ``alloc`` hands out next (a view, no copy; a new
        tensor while part of it is still unlisted, see :class:`HostFreeList`)."""
        return self._buf[self._head :]

    @property
    def available(self) -> int:
        """Free ids, merged or not. O(1), no device sync."""
        return self._buf_len - self._head + self._unlisted + self._num_released + self._num_in_group

    @property
    def release_pages(self) -> torch.Tensor:
        """Freed ids waiting for the next merge (a new tensor; for inspection and tests)."""
        chunks = [*self._released, *(self._group or [])]
        if not chunks:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return self._to_tensor(self._cat(chunks)).clone()

    # ------------------------------------------------------------------------------------- alloc/free
    def alloc(self, num_ids: int) -> torch.Tensor | None:
        """Take ``num_ids`` ids from the head of the free list, or return ``None`` and take nothing.

        The result is a view of the free list's buffer (the list never reads those entries again).
        Side effects: marks the ids allocated; may merge (and sort, with ``need_sort``) released ids.
        O(num_ids) plus an amortised merge; no host sync.
        """
        head = self._take(num_ids)
        if head is None:
            return None
        end = head + num_ids
        ids = self._slice(head, end)
        self._mark(head, end, ids)
        return ids

    def alloc_ints(self, num_ids: int) -> list[int] | None:
        """:meth:`alloc` with the ids as a list of Python ints: the same ids, the same state after, and
        :meth:`undo_alloc` undoes it the same way (given the ids as a tensor). For host-side callers that
        want ints (a request's state slots): on a CPU pool no tensor is built. O(num_ids)."""
        ids = self.alloc(num_ids)
        return None if ids is None else ids.tolist()

    def _take(self, num_ids: int) -> int | None:
        """Advance the head over ``num_ids`` ids (merging first if the listed ones are short) and return
        where they start in the buffer; ``None``, nothing taken, if fewer are free. The ids are not
        marked yet (the caller marks them)."""
        head = self._head
        end = head + num_ids
        if end > self._buf_len:
            if num_ids > self.available:
                return None  # nothing taken: an earlier alloc can still be undone exactly
            # The lists a merge replaces (it builds new ones), kept so that undo_alloc can put them back.
            before = (
                self._buf,
                head,
                self._released,
                self._num_released,
                self._group,
                self._num_in_group,
                self._unlisted,
                self._scan_pos,
            )
            if num_ids > self._buf_len - head + self._unlisted:
                self.merge()
            if self._buf_len - self._head < num_ids:  # the merged list is listed lazily (host)
                self._list_more(num_ids - (self._buf_len - self._head))
            self._pre_merge = before
            head = self._head
            end = head + num_ids
        else:
            self._pre_merge = None
        self._head = end
        return head

    def free(self, ids: torch.Tensor, check: bool = True) -> None:
        """Return ``ids`` (1-D int64 on the device, no repeats) to the free list. O(k).

        With ``check`` (the default) raises :class:`~mamba_radix.errors.InvalidIndex`, nothing changed,
        for padding, out-of-range, never-allocated or already-freed ids, or an id given twice; costs one
        host sync on a GPU. ``check=False`` trusts the caller (ids straight from ``alloc``, each once): no
        validation and no sync, and a bad id then corrupts the list silently.
        Side effects: clears the ids' bits; keeps a copy of them (never the caller's tensor).
        """
        if ids.numel() == 0:
            return
        if check and not self._all_allocated_once(ids):
            self._raise_bad_free(ids)
        self.allocated[ids] = False
        self._park(ids.clone(), ids.numel())  # own a copy: never keep or alias a view of the caller's

    def free_containing(self, ids: torch.Tensor, divisor: int, check: bool = True) -> None:
        """Free each id ``ids // divisor`` once, however often it occurs (the paged allocator frees the
        pages its token indices fall in). Errors and ``check`` as :meth:`free`, in terms of the divided
        ids. O(k); on a GPU one host sync, checked or not (the number of distinct ids sizes the result)."""
        if ids.numel() == 0:
            return
        distinct = self._divide_unique(ids, divisor, check)  # a new tensor, owned
        self.allocated[distinct] = False
        self._park(distinct, distinct.numel())

    def _raise_bad_free(self, ids: torch.Tensor) -> None:
        """The precise error for a free whose fused check failed: range, then allocation, then repeats."""
        check_in_range(ids, 1, self.num_ids, self.what)
        check_allocated(self.allocated, ids, self.what)
        check_no_duplicates(self._scratch, ids, self.what)
        raise InvariantError(f"free of {self.what}s {ids.tolist()} failed its check but no rule names it")

    def check_allocated(self, ids: torch.Tensor) -> None:
        """Raise :class:`~mamba_radix.errors.InvalidIndex` unless every id is in range and allocated.
        O(k), one fused check (one host sync on a GPU)."""
        if ids.numel() and not self._all_allocated(ids):
            check_in_range(ids, 1, self.num_ids, self.what)
            check_allocated(self.allocated, ids, self.what)

    def all_allocated(self, ids: torch.Tensor) -> bool:
        """Whether every id of the 1-D integer tensor ``ids`` (int32 or int64, on the device) is in range
        and allocated. O(k), one fused check (one host sync on a GPU); no error raised."""
        return not ids.numel() or self._all_allocated(ids)

    def has_repeats(self, ids: torch.Tensor) -> bool:
        """Whether an id occurs twice in ``ids``, which must lie in ``0..num_ids + 1`` (checked by the
        caller: ids outside are clamped to those ends and may read as repeats). O(k), no sort: each
        position writes its rank into the scratch, a repeat reads back another's. One host sync on a
        GPU."""
        if ids.numel() < 2:
            return False
        clamped = ids.clamp(0, self.num_ids + 1)
        ranks = torch.arange(ids.numel(), dtype=self._scratch.dtype, device=ids.device)
        self._scratch[clamped] = ranks
        return not bool((self._scratch[clamped] == ranks).all())

    def free_ints(self, ids: list[int], check: bool = True) -> None:
        """:meth:`free` for a list of Python ints (a request's state slots, a checkpoint's slot): the same
        checks and result. O(k)."""
        if ids:
            self.free(as_index_tensor(ids, self.device, self.what), check)

    def check_unique(self, ids: torch.Tensor, why: str = "each may be written once per call") -> None:
        """Raise :class:`~mamba_radix.errors.InvalidIndex` if an id occurs twice in ``ids`` (which must be
        in range); ``why`` says in the message why a repeat is wrong. O(k)."""
        check_no_duplicates(self._scratch, ids, self.what, why)

    def is_id_allocated(self, i: int) -> bool:
        """Whether the single id ``i`` (a Python int) is allocated; False for 0 and out-of-range ids.
        O(1): one bitmap read, no tensor built (the cheap ownership test of the cache's edge checks)."""
        return 0 < i <= self.num_ids and bool(self.allocated[i])

    def undo_alloc(self, ids: torch.Tensor) -> None:
        """Give back the ids the most recent :meth:`alloc` returned, as if that call had not run: the next
        ``alloc`` hands out the same ids in the same order. For a transactional caller whose later step
        failed. O(k).

        Exact when nothing was freed or allocated in between: the head pointer steps back over the ids,
        and if that alloc merged, the lists the merge replaced are put back (a ``need_sort`` merge reorders
        the free ids, so keeping it would change what later allocations return). Otherwise (``ids`` not
        the slice just before the head) falls back to a checked :meth:`free`.
        """
        k = ids.numel()
        if k == 0:
            return
        head = self._head
        if k <= head and self._buffer_equals(head - k, head, ids):
            self.allocated[ids] = False
            before, self._pre_merge = self._pre_merge, None
            if before is not None and head == k:
                buf, old_head, released, num_released, group, num_in_group, unlisted, scan_pos = before
                self._set_buffer(buf)
                self._head = old_head
                self._released, self._num_released = released, num_released
                self._group, self._num_in_group = group, num_in_group
                self._unlisted, self._scan_pos = unlisted, scan_pos
                self._repend([*released, *(group or [])])
            else:
                self._head = head - k
            return
        self.free(ids, check=True)

    def free_group_begin(self) -> None:
        """Start collecting frees; they are concatenated once at :meth:`free_group_end`. Not re-entrant."""
        self._pre_merge = None
        if self._group is None:
            self._group = []
            self._num_in_group = 0

    def free_group_end(self) -> None:
        """Close the group: one concatenation of every free made inside it. O(ids freed in the group)."""
        self._pre_merge = None
        group, self._group = self._group, None
        if group:
            merged = self._cat(group)
            self._released.append(merged)
            self._num_released += len(merged)
        self._num_in_group = 0

    def is_allocated(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask: which of ``ids`` are allocated (out-of-range ids read as not allocated). O(k)."""
        return self.allocated[ids.clamp(0, self.num_ids + 1)]

    def allocated_ids(self) -> torch.Tensor:
        """Every allocated id, ascending. O(num_ids): for invariant checks, not hot paths."""
        return torch.nonzero(self.allocated).reshape(-1)

    def listed_free_ids(self) -> torch.Tensor:
        """Every id the list holds as free right now, as a new int64 CPU tensor in hand-out order: the
        merged list, then released chunks, then an open group's (ids a lazy merge has not listed yet,
        ``_unlisted``, are not in it). O(free ids): for :meth:`audit` and tests."""
        chunks = [self._buf_view(), *self._released, *(self._group or [])]
        return self._to_tensor(self._cat(chunks)).to(device="cpu", dtype=torch.int64)

    def audit(self) -> None:
        """Check the list's own bookkeeping; raise :class:`~mamba_radix.errors.InvariantError` on the first
        disagreement. The free count must equal the bitmap's unset ids; every id listed as free must be in
        range, unset in the bitmap (not also allocated) and listed once. A double free through a trusted
        (``check=False``) path breaks the first or the last rule, so the next audit catches it, not the
        next allocation. No side effects. O(num_ids) (one host sync on a GPU)."""
        what = self.what
        bitmap = self.allocated.to("cpu")
        if bool(bitmap[0]) or bool(bitmap[self.num_ids + 1]):
            raise InvariantError(f"{what} free list: the padding id 0 or the sentinel is marked allocated")
        unset = self.num_ids - int(bitmap.sum())
        if self.available != unset:
            raise InvariantError(
                f"{what} free list counts {self.available} free {what}s but its bitmap has {unset} unset "
                "(a double free or a lost id)"
            )
        listed = self.listed_free_ids()
        if listed.numel() + self._unlisted != self.available:
            raise InvariantError(
                f"{what} free list lists {listed.numel()} free {what}s (+{self._unlisted} unlisted) but "
                f"counts {self.available}"
            )
        if not listed.numel():
            return
        outside = (listed < 1) | (listed > self.num_ids)
        if bool(outside.any()):
            raise InvariantError(
                f"{what} free list holds id {int(listed[outside][0])} outside 1..{self.num_ids}"
            )
        taken = bitmap[listed]
        if bool(taken.any()):
            raise InvariantError(
                f"{what} {int(listed[taken][0])} is both on the free list and marked allocated"
            )
        values, counts = torch.unique(listed, return_counts=True)
        if bool((counts > 1).any()):
            raise InvariantError(
                f"{what} {int(values[counts > 1][0])} is on the free list twice (a double free)"
            )

    def merge(self) -> None:
        """Move every released id (and those of an open group) into the free list; sort if asked.

        O(ids merged) without ``need_sort``; with it, a sort of the merged ids, or for a free list over
        1/8 of the pool a scan of the bitmap (the unset bits are the free ids, already in order).
        Raises :class:`~mamba_radix.errors.InvariantError` if the result does not hold exactly the free
        ids counted (a bookkeeping bug; checked in O(1)).
        """
        self._pre_merge = None
        total = self.available
        scan = self.need_sort and total * _SCAN_FRACTION >= self.num_ids
        if self._unlisted and not scan:  # the previous merge's rest first: the sort must see every id
            self._list_more(self._unlisted)
        released = [*self._released, *(self._group or [])]
        self._unpend(released)
        if scan and self._lazy_scan(total):
            return
        chunks = [self._buf_view(), *released]
        if scan:
            merged = self._scan_free()
        elif self.need_sort:
            merged = self._sorted(self._cat(chunks))
        else:
            merged = self._cat(chunks)
        if len(merged) != total:
            raise InvariantError(f"free list merge produced {len(merged)} {self.what}s, expected {total}")
        self._set_buffer(self._as_buffer(merged))
        self._released = []
        self._num_released = 0
        if self._group:
            self._group = []
            self._num_in_group = 0

    # ------------------------------------------------------------- backend: torch, any device, no numpy
    # Chunks are int64 tensors on the device. Each hook below is a handful of torch calls.
    def _mark(self, head: int, end: int, ids: torch.Tensor) -> None:
        self.allocated[ids] = True

    def _all_allocated(self, ids: torch.Tensor) -> bool:
        return bool(self.allocated[ids.clamp(0, self.num_ids + 1)].all())

    def _all_allocated_once(self, ids: torch.Tensor) -> bool:
        """In range, allocated and no repeats, as one fused mask and one host sync."""
        clamped = ids.clamp(0, self.num_ids + 1)
        ok = self.allocated[clamped]
        if ids.numel() > 1:
            # Each position writes its rank; a repeated id keeps only one write, so the other position
            # reads back a rank not its own. Clamped out-of-range ids are already failed above.
            ranks = torch.arange(ids.numel(), dtype=self._scratch.dtype, device=ids.device)
            self._scratch[clamped] = ranks
            ok &= self._scratch[clamped] == ranks
        return bool(ok.all())

    def _divide_unique(self, ids: torch.Tensor, divisor: int, check: bool) -> torch.Tensor:
        """The distinct ids of ``ids // divisor`` (a new tensor), checked if asked; one host sync."""
        divided = ids.div(divisor, rounding_mode="floor") if divisor > 1 else ids
        clamped = divided.clamp(0, self.num_ids + 1)
        ranks = torch.arange(ids.numel(), dtype=self._scratch.dtype, device=ids.device)
        self._scratch[clamped] = ranks
        first = self._scratch[clamped] == ranks  # one position per distinct id
        ok = self.allocated[clamped].all() if check else torch.ones((), dtype=torch.bool, device=ids.device)
        ok_flag, count = torch.stack([ok.to(torch.int64), first.sum()]).tolist()  # the one host sync
        if not ok_flag:
            self._raise_bad_free(divided)
        # nonzero_static takes its size from the host, so the selection itself does not sync again.
        return divided[torch.nonzero_static(first, size=count).reshape(-1)]

    def _park(self, chunk: object, count: int) -> None:
        self._pre_merge = None  # a free since the last alloc: undo_alloc falls back to a plain free
        if self._group is not None:
            self._group.append(chunk)
            self._num_in_group += count
        else:
            self._released.append(chunk)
            self._num_released += count

    def _buf_view(self) -> torch.Tensor:
        return self._buf[self._head :]

    def _list_more(self, need: int) -> None:  # pragma: no cover - only HostFreeList leaves ids unlisted
        raise InvariantError(f"free list has {self._unlisted} unlisted {self.what}s but no lazy scan")

    def _lazy_scan(self, total: int) -> bool:
        """A scan merge done lazily (HostFreeList); False: do it now, eagerly."""
        return False

    def _unpend(self, chunks: list) -> None:
        """Released chunks joined the free list (HostFreeList clears their pending marks)."""

    def _repend(self, chunks: list) -> None:
        """Released chunks put back by undo_alloc (HostFreeList marks them pending again)."""

    def _slice(self, head: int, end: int) -> torch.Tensor:
        """``_buf[head:end]``, a view of the buffer (what ``alloc`` returns)."""
        return self._buf[head:end]

    def _cat(self, chunks: list) -> torch.Tensor:
        return torch.cat(chunks) if len(chunks) > 1 else chunks[0]

    def _sorted(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sort(ids).values

    def _scan_free(self) -> torch.Tensor:
        # nonzero_static: the count is known on the host, so no sync to size the result.
        free = ~self.allocated[1 : self.num_ids + 1]
        return torch.nonzero_static(free, size=self.available).reshape(-1) + 1

    def _to_tensor(self, chunk: torch.Tensor) -> torch.Tensor:
        return chunk

    def _as_buffer(self, chunk: torch.Tensor) -> torch.Tensor:
        """A merged chunk as the free list's buffer (a tensor here; HostFreeList keeps a numpy array)."""
        return chunk

    def _buffer_equals(self, start: int, end: int, ids: torch.Tensor) -> bool:
        """Whether the buffer's ``[start, end)`` holds exactly ``ids`` (undo_alloc's test)."""
        return torch.equal(self._buf[start:end], ids)


class HostFreeList(FreeList):
    """:class:`FreeList` for a CPU pool: the same tensors, worked on through numpy views of their memory.

    ``allocated`` and ``_scratch`` are torch tensors whose numpy views (``_alloc_np``, ``_scratch_np``)
    share their memory, so both always agree. The free list buffer itself is a numpy array (``_buf`` and
    ``_buf_np`` are the same array): a merge builds it with one ``np.concatenate`` and no tensor (a tensor
    built and dropped per merge costs ~4 us; the state pool, nearly full of checkpoints, merges on about
    every second one-slot allocation). Released chunks are numpy arrays (or lists of ints, from small
    frees). ``alloc`` returns a tensor view of the buffer's memory, as the base class does;
    :meth:`alloc_ints` returns Python ints without building a tensor.
    """

    def __init__(self, num_ids: int, device: torch.device, need_sort: bool, what: str) -> None:
        if device.type != "cpu":
            raise InvalidArgument(
                f"HostFreeList works on CPU tensors only, not {device}; use backend='torch'"
            )
        self._pending: np.ndarray | None = None
        super().__init__(num_ids, device, need_sort, what)  # checks the sizes first
        if need_sort:
            # released ids are marked pending (freed, not merged) so that the lazy scan of a merge (see
            # _lazy_scan) skips them; 1 byte per id
            marks = allocate_tensor("the pending marks", torch.zeros, num_ids + 2, dtype=torch.bool)
            self._pending = marks.numpy()
        self._alloc_np = self.allocated.numpy()
        # what one-id reads and writes of the bitmap go through (FifoFreeList: a bytearray of it)
        self._bits: np.ndarray | bytearray = self._alloc_np
        self._scratch_np = self._scratch.numpy()

    # A lazy scan lists at least this many ids at a time (the scan's per-call cost is then negligible).
    LIST_CHUNK = 1 << 16

    def clear(self) -> None:
        super().clear()
        if self._pending is not None:
            self._pending[:] = False

    @property
    def free_pages(self) -> torch.Tensor:
        """As :attr:`FreeList.free_pages`; while part of the merged list is still unlisted, a new tensor
        of the listed head and the rest of the scan (O(num_ids): for inspection and tests)."""
        if not self._unlisted:
            return torch.from_numpy(self._buf_np[self._head :])
        rest = self._scan_range(self._scan_pos, self.num_ids + 1)
        return self._to_tensor(np.concatenate([self._buf_view(), rest]))

    def _scan_range(self, start: int, stop: int) -> np.ndarray:
        """Free, not pending ids in ``[start, stop)``, ascending. O(stop - start)."""
        free = self._alloc_np[start:stop] | self._pending[start:stop]  # type: ignore[index]
        return np.flatnonzero(~free) + start

    def _lazy_scan(self, total: int) -> bool:
        """The scan merge without the scan: after the pending marks of the merged chunks were cleared,
        the merged free list is exactly the unset bits of the bitmap, ascending, so it is listed
        segment by segment as allocations reach it (:meth:`_list_more`) instead of materialising all
        of it at once (an O(num_ids) spike: 30-60 ms on an 8M-token pool). O(chunks merged)."""
        self._set_buffer(np.empty(0, dtype=np.int64))
        self._unlisted, self._scan_pos = total, 1
        self._released, self._num_released = [], 0
        if self._group:
            self._group, self._num_in_group = [], 0
        return True

    def _list_more(self, need: int) -> None:
        """List at least ``need`` more ids of the lazily merged free list (``LIST_CHUNK`` at least, when
        that many remain) after the listed head. O(ids listed + bitmap span scanned)."""
        want = min(self._unlisted, max(need, self.LIST_CHUNK))
        pieces, got, pos, stop = [self._buf_view()], 0, self._scan_pos, self.num_ids + 1
        while got < want:
            if pos >= stop:
                raise InvariantError(
                    f"free list scan found {got} of {want} unlisted {self.what}s (a bookkeeping bug)"
                )
            # the expected span for what is missing, from the density of what is left, plus slack
            span = (want - got) * (stop - pos) // max(self._unlisted - got, 1)
            end = min(stop, pos + span + span // 4 + 1024)
            found = self._scan_range(pos, end)
            if got + len(found) > want:
                found = found[: want - got]
                end = int(found[-1]) + 1
            pieces.append(found)
            got += len(found)
            pos = end
        self._scan_pos = pos
        self._unlisted -= got
        self._set_buffer(self._as_buffer(np.concatenate(pieces)))

    def _unpend(self, chunks: list) -> None:
        if self._pending is not None:
            for chunk in chunks:
                self._pending[chunk] = False

    def _repend(self, chunks: list) -> None:
        if self._pending is not None:
            for chunk in chunks:
                self._pending[chunk] = True

    def _set_buffer(self, buf: torch.Tensor | np.ndarray) -> None:  # type: ignore[override]
        """The buffer as a numpy int64 array (a tensor is viewed, sharing its memory)."""
        arr = buf if type(buf) is np.ndarray else buf.numpy()  # type(): torch's isinstance hook is slow
        self._buf = self._buf_np = arr
        self._head = 0
        self._buf_len = len(arr)

    def _as_buffer(self, chunk: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return np.ascontiguousarray(chunk, dtype=np.int64)

    def _buffer_equals(self, start: int, end: int, ids: torch.Tensor) -> bool:
        return bool(np.array_equal(self._buf_np[start:end], ids.numpy()))

    def alloc_ints(self, num_ids: int) -> list[int] | None:
        """As :meth:`FreeList.alloc_ints`, without a tensor: ~0.5 us for one id where :meth:`alloc` plus
        ``tolist`` costs ~2.5 us."""
        head = self._take(num_ids)
        if head is None:
            return None
        if num_ids == 1:  # a scalar read and store
            i = int(self._buf_np[head])
            self._alloc_np[i] = True
            return [i]
        vals = self._buf_np[head : head + num_ids]
        self._alloc_np[vals] = True
        return vals.tolist()

    def _mark(self, head: int, end: int, ids: torch.Tensor) -> None:
        if end - head == 1:  # one slot: a scalar store, no index array
            self._alloc_np[self._buf_np[head]] = True
        else:
            self._alloc_np[self._buf_np[head:end]] = True

    def _slice(self, head: int, end: int) -> torch.Tensor:
        # the same memory as _buf[head:end], built from the numpy view (~1.4 us instead of ~2.3)
        return torch.from_numpy(self._buf_np[head:end])

    def is_id_allocated(self, i: int) -> bool:
        """As :meth:`FreeList.is_id_allocated`, one read of the host bitmap (~0.1 us)."""
        return 0 < i <= self.num_ids and bool(self._bits[i])

    # A free of up to this many ids is checked and applied in plain Python on ``ids.tolist()``: a few
    # 0.1 us steps per id beat the ~0.5-1 us fixed cost of each numpy call (decode frees 1 id, a paged
    # free of one page 16, a request's state slots a handful).
    SMALL = 16

    def free(self, ids: torch.Tensor, check: bool = True) -> None:
        """As :meth:`FreeList.free`: the same checks and result, in Python for small frees and as a few
        numpy calls on one view of ``ids`` otherwise."""
        k = ids.numel()
        if k == 0:
            return
        if k <= self.SMALL:
            vals = ids.tolist()
            if check and not (self._py_all_allocated(vals) and (k == 1 or len(set(vals)) == k)):
                self._raise_bad_free(ids)
            self._py_release(vals)
            return
        a = ids.numpy()
        if check and not self._np_all_allocated_once(a):
            self._raise_bad_free(ids)
        self._alloc_np[a] = False
        self._park(a.copy(), k)  # copy: own the storage, never alias the caller's tensor

    def has_repeats(self, ids: torch.Tensor) -> bool:
        """As :meth:`FreeList.has_repeats`, in numpy (~10x cheaper than ``torch.unique``'s sort)."""
        if ids.numel() < 2:
            return False
        a = np.minimum(np.maximum(ids.numpy(), 0), self.num_ids + 1)  # np.clip's wrapper costs ~15 us
        scratch, ranks = self._scratch_np, np.arange(len(a), dtype=np.int32)
        scratch[a] = ranks
        return not bool((scratch.take(a) == ranks).all())

    def free_ints(self, ids: list[int], check: bool = True) -> None:
        """As :meth:`FreeList.free_ints`, in plain Python (no tensor built): ~0.3 us per id."""
        k = len(ids)
        if k == 0:
            return
        if k > self.SMALL:
            super().free_ints(ids, check)
            return
        if check and not (self._py_all_allocated(ids) and (k == 1 or len(set(ids)) == k)):
            # the general path names the bad id precisely (an int beyond int64 included)
            self._raise_bad_free(as_index_tensor(ids, self.device, self.what))
        self._py_release(list(ids))

    def free_containing(self, ids: torch.Tensor, divisor: int, check: bool = True) -> None:
        """As :meth:`FreeList.free_containing`. Each distinct id is kept at its last occurrence, in
        order, on both paths."""
        k = ids.numel()
        if k == 0:
            return
        if k <= self.SMALL:
            divided = [v // divisor for v in ids.tolist()]
            if check and not self._py_all_allocated(divided):
                self._raise_bad_free(torch.tensor(divided, dtype=torch.int64))
            self._py_release(list(dict.fromkeys(reversed(divided)))[::-1] if k > 1 else divided)
            return
        divided = ids.numpy() // divisor  # a new array, owned
        if check and not self._alloc_np.take(divided, mode="clip").all():
            self._raise_bad_free(torch.from_numpy(divided))
        # In range now (checked, or trusted), so plain fancy indexing, ~2x cheaper than put(mode="clip").
        scratch, ranks = self._scratch_np, np.arange(k, dtype=np.int32)
        scratch[divided] = ranks  # the last write of a repeated id survives
        divided = divided[scratch.take(divided) == ranks]
        self._alloc_np[divided] = False
        self._park(divided, len(divided))

    def _park(self, chunk: object, count: int) -> None:
        """As :meth:`FreeList._park`, coalescing consecutive small frees (lists of ints) into one list:
        a pool that frees and takes one slot at a time (the state pool, nearly full of checkpoints)
        then converts one list per merge instead of one per free. Order is kept."""
        self._pre_merge = None  # a free since the last alloc: undo_alloc falls back to a plain free
        if self._pending is not None:
            self._pending[chunk] = True
        target = self._group if self._group is not None else self._released
        if type(chunk) is list and target and type(target[-1]) is list:
            target[-1].extend(chunk)
        else:
            target.append(chunk)
        if self._group is not None:
            self._num_in_group += count
        else:
            self._num_released += count

    def _py_all_allocated(self, vals: list[int]) -> bool:
        bits, high = self._bits, self.num_ids
        return all(0 < v <= high and bits[v] for v in vals)

    def _py_release(self, vals: list[int]) -> None:
        bits = self._bits
        for v in vals:
            bits[v] = False
        self._park(vals, len(vals))  # a fresh list: owned, no copy needed; np.concatenate takes lists

    def _all_allocated(self, ids: torch.Tensor) -> bool:
        # take(mode="clip") clamps into 0..num_ids + 1, whose ends are never set: range + bitmap in one.
        return bool(self._alloc_np.take(ids.numpy(), mode="clip").all())

    def _np_all_allocated_once(self, a: np.ndarray) -> bool:
        """In range, allocated and no repeats, as the torch backend's fused mask; here two passes, as
        the range check lets the repeat check use plain fancy indexing (~2x cheaper than clipping)."""
        if not self._alloc_np.take(a, mode="clip").all():
            return False
        scratch, ranks = self._scratch_np, np.arange(len(a), dtype=np.int32)
        scratch[a] = ranks
        return bool((scratch.take(a) == ranks).all())

    def _buf_view(self) -> np.ndarray:
        return self._buf_np[self._head :]

    def _cat(self, chunks: list) -> np.ndarray:
        # Empty chunks dropped first: a merge is most often an exhausted buffer plus one coalesced list
        # of freed slots, and converting that list alone (~0.5 us) beats np.concatenate (~2 us).
        full = [c for c in chunks if len(c)]
        if len(full) > 1:
            return np.concatenate(full)
        if not full:
            return np.empty(0, dtype=np.int64)
        only = full[0]
        return only if type(only) is np.ndarray else np.array(only, dtype=np.int64)

    def _sorted(self, ids: np.ndarray) -> np.ndarray:
        # Stable (timsort for int64): the merged free list is an ascending run followed by the released
        # chunks, which timsort merges in ~O(n + r log r) where a quicksort pays O(n log n).
        return np.sort(ids, kind="stable")

    def _to_tensor(self, chunk: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.int64))


class FreeListBatching:
    """The free-list controls both token allocators share (a mixin over ``self._free_list``).

    Ids are KV indices for :class:`~mamba_radix.pools.TokenToKVPoolAllocator` and page ids for
    :class:`~mamba_radix.pools.PagedTokenToKVPoolAllocator`.
    """

    _free_list: FreeList

    @property
    def free_pages(self) -> torch.Tensor:
        """The merged free list (its head is what ``alloc`` hands out next)."""
        return self._free_list.free_pages

    @property
    def release_pages(self) -> torch.Tensor:
        """Freed ids not merged into the free list yet (a new tensor)."""
        return self._free_list.release_pages

    def free_group_begin(self) -> None:
        """Collect the following frees; :meth:`free_group_end` concatenates them once."""
        self._free_list.free_group_begin()

    def free_group_end(self) -> None:
        """Close the free group opened by :meth:`free_group_begin`."""
        self._free_list.free_group_end()

    def audit(self) -> None:
        """Check the allocator's own bookkeeping (:meth:`FreeList.audit`): the free count equals the
        bitmap's, and no id is both free and allocated. Raises
        :class:`~mamba_radix.errors.InvariantError`. O(size)."""
        self._free_list.audit()

    def merge_and_sort_free(self) -> None:
        """Merge released ids into the free list now (sorted when ``need_sort``). O(free ids)."""
        self._free_list.merge()


class FifoFreeList(HostFreeList):
    """:class:`HostFreeList` without ``need_sort``, kept as one FIFO queue of Python ints: for the state
    pool, whose allocations and frees are a few slots each.

    Without ``need_sort`` a merge concatenates the rest of the buffer and the freed chunks in the order
    they were freed (an open group's last), so every ``alloc`` hands out the ids in the order they became
    free: exactly a queue, which this class keeps built instead of merging. Why: the state pool, nearly
    full of checkpoints, merges on about every second one-slot allocation, and a merge builds a numpy
    array (~1 us warm, ~10 us with cold CPU caches, as when the calls interleave with other work); here an
    allocation is a ``popleft`` and a bitmap store.

    The same ids in the same order as :class:`HostFreeList` (``property_tests/test_pools_fifo_free_list.py``
    replays both), the same checks (inherited: the bitmap and the scratch are the same tensors). What
    differs is only what is visible of the representation: nothing is ever pending, so ``release_pages``
    is empty and ``free_pages`` lists every free id; ``merge`` and the free groups change nothing (a
    group's frees are queued as they come, which is where its concatenation would put them).
    ``undo_alloc`` is exact for the most recent ``alloc`` (the ids go back to the front) unless ``merge``
    ran since, else a checked ``free``. O(k) per call, in Python: not for allocations of thousands of ids (the token pools).
    """

    def __init__(self, num_ids: int, device: torch.device, what: str) -> None:
        super().__init__(num_ids, device, False, what)
        # The bitmap's memory is a bytearray, with the tensor and the numpy array as views of it: the
        # per-slot reads and writes go through the bytearray (a store in CPython's core; numpy's scalar
        # __setitem__ costs ~4 us more with cold caches), the checks over many ids through the views.
        self._bits = flags = bytearray(num_ids + 2)
        self.allocated = torch.frombuffer(flags, dtype=torch.bool)
        self._alloc_np = np.frombuffer(flags, dtype=np.bool_)

    def clear(self) -> None:
        self._queue: deque[int] = deque(range(1, self.num_ids + 1))
        self._last_taken: list[int] | None = None  # the most recent alloc's ids (undo_alloc's test)
        self.allocated.zero_()

    @property
    def free_pages(self) -> torch.Tensor:
        """Every free id, in the order ``alloc`` hands them out (a new tensor). O(free ids)."""
        return torch.tensor(list(self._queue), dtype=torch.int64)

    @property
    def available(self) -> int:
        return len(self._queue)

    @property
    def release_pages(self) -> torch.Tensor:
        """Always empty: a freed id joins the queue at once."""
        return torch.empty(0, dtype=torch.int64)

    def alloc(self, num_ids: int) -> torch.Tensor | None:
        """As :meth:`FreeList.alloc`, as a new tensor (not a view of any buffer). O(num_ids)."""
        ids = self.alloc_ints(num_ids)
        return None if ids is None else torch.tensor(ids, dtype=torch.int64)

    def alloc_ints(self, num_ids: int) -> list[int] | None:
        """As :meth:`FreeList.alloc_ints`: ``num_ids`` ids from the front of the queue, or ``None`` and
        nothing taken. O(num_ids)."""
        queue = self._queue
        if num_ids > len(queue):
            return None
        if num_ids == 1:  # one popleft, one byte stored
            i = queue.popleft()
            self._bits[i] = True
            self._last_taken = [i]
            return [i]
        ids = [queue.popleft() for _ in range(num_ids)]
        self._alloc_np[ids] = True
        self._last_taken = ids[:]  # the caller may change its list
        return ids

    def undo_alloc(self, ids: torch.Tensor) -> None:
        """As :meth:`FreeList.undo_alloc`: the most recent ``alloc``'s ids go back to the front, in order
        (frees since then stay behind them, as in :class:`HostFreeList`); other ids are freed, checked."""
        if ids.numel() == 0:
            return
        vals = ids.tolist()
        if vals == self._last_taken:
            self._last_taken = None
            self._alloc_np[vals] = False
            self._queue.extendleft(reversed(vals))
            return
        self.free(ids, check=True)

    def _park(self, chunk: object, count: int) -> None:
        # every free ends here, its checks done and its bits cleared: the ids join the queue's back
        self._queue.extend(chunk if type(chunk) is list else chunk.tolist())  # type: ignore[attr-defined]

    def listed_free_ids(self) -> torch.Tensor:
        """The queue, front first (a new tensor). O(free ids)."""
        return torch.tensor(list(self._queue), dtype=torch.int64)

    def merge(self) -> None:
        """Nothing to merge: freed ids are queued as they come. As on the host (a merge rebuilds its
        buffer), a later ``undo_alloc`` is then a checked free. O(1)."""
        self._last_taken = None

    def free_group_begin(self) -> None:
        """Nothing to collect: a group's frees are queued in order, where its concatenation would go."""

    def free_group_end(self) -> None:
        """See :meth:`free_group_begin`."""


def make_free_list(
    num_ids: int, device: torch.device, need_sort: bool, what: str, backend: str = "auto"
) -> FreeList:
    """A free list for ``device``: :class:`HostFreeList` on CPU, :class:`FreeList` elsewhere.

    ``backend="torch"`` forces the device implementation (tests run it on CPU to cover the GPU path);
    ``"host"`` forces the numpy one (CPU only); ``"fifo"`` the queue (CPU, without ``need_sort``; the state
    pool's choice on the CPU, see :class:`FifoFreeList`).
    """
    if backend == "auto":
        backend = "host" if device.type == "cpu" else "torch"
    if backend == "host":
        return HostFreeList(num_ids, device, need_sort, what)
    if backend == "torch":
        return FreeList(num_ids, device, need_sort, what)
    if backend == "fifo":
        if need_sort:
            raise InvalidArgument("backend='fifo' keeps ids in the order they were freed; it cannot sort")
        return FifoFreeList(num_ids, device, what)
    raise InvalidArgument(f"backend must be 'auto', 'host', 'torch' or 'fifo', got {backend!r}")
