"""The reference free list of integer ids ``1..num_ids`` with an allocation bitmap (id 0 is padding), and the
free-list controls the token allocators share (:class:`FreeListBatching`).

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

:class:`FreeList` is plain torch and runs on any device: ``alloc`` never syncs with the host; a checked
``free`` syncs once (one fused ``all()``), an unchecked one never. It is the behaviour every variant must
match: the CPU variants (:mod:`.host_free_list`, :mod:`.fifo_free_list`) hand out the same ids in the same
order, and differential tests replay them side by side. Its representation is reached only through the
hooks at the end of the class (``_mark``, ``_park``, ``_cat``, ...), which is what a variant overrides;
the lazy-merge hooks (``_unlisted``, ``_list_more``, ``_lazy_scan``, ``_unpend``, ``_repend``) do nothing
here. A pool gets its free list from :func:`.free_lists.make_free_list`, which picks the variant.
"""

from __future__ import annotations

import torch

from mamba_radix.errors import InvariantError
from mamba_radix.pools._indices import (
    allocate_tensor,
    as_index_tensor,
    check_allocated,
    check_fits,
    check_in_range,
    check_no_duplicates,
    lazy_zeros,
)

__all__ = ["FreeList", "FreeListBatching"]

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
        # lazy_zeros: on the CPU resident only where ids were ever marked (the ids in use, not capacity)
        self.allocated = lazy_zeros("the allocation bitmap", num_ids + 2, torch.bool, device)
        # Scratch for the O(k) duplicate check; contents are meaningless between calls. torch.empty of a
        # large size is fresh pages too: resident only where ids were ever checked.
        self._scratch = allocate_tensor(
            "the free list scratch", torch.empty, num_ids + 2, dtype=torch.int32, device=device
        )
        self.clear()

    # ------------------------------------------------------------------------------------------ state
    def clear(self) -> None:
        """Free every id: the free list becomes ``1..num_ids`` in order. O(num_ids) here (an ``arange``
        and a zeroed bitmap); :class:`HostFreeList` lists the ids lazily (O(ids ever handed out))."""
        self._released: list = []  # freed chunks, not merged yet
        self._num_released = 0
        self._group: list | None = None  # chunks freed inside an open group
        self._num_in_group = 0
        self._pre_merge: tuple | None = None  # what the last alloc's merge replaced (see undo_alloc)
        self._reset_free_ids()

    def _reset_free_ids(self) -> None:
        """Every id free and listed in order, the bitmap cleared (the representation's part of
        :meth:`clear`)."""
        self._set_buffer(torch.arange(1, self.num_ids + 1, dtype=torch.int64, device=self.device))
        # Free ids not listed in _buf yet (HostFreeList's lazy listing; always 0 for this class): they
        # are the free, not pending bits at positions >= _scan_pos, in order.
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

    def free_chunks(self, chunks: list[torch.Tensor], num_ids: int | None = None) -> None:
        """Trusted free of several 1-D int64 id tensors at once (an eviction's victims, one per node): the
        same result as ``free(torch.cat(chunks), check=False)`` (the same bits, the same ids waiting in
        the same order), which is what this reference does. No misuse check (see :meth:`free`): the
        chunks must hold allocated ids, each once. A variant may keep the chunks themselves instead of a
        copy (:class:`~.host_free_list.HostFreeList`), so the caller must never write them afterwards.
        ``num_ids``: the chunks' total length when the caller knows it (a variant then need not read the
        chunks to count them); this reference checks it and raises
        :class:`~mamba_radix.errors.InvariantError`, nothing freed, if it is wrong. O(ids)."""
        if num_ids is not None and num_ids != sum(chunk.numel() for chunk in chunks):
            raise InvariantError(
                f"free_chunks was told {num_ids} {self.what}s but its chunks hold "
                f"{sum(chunk.numel() for chunk in chunks)} (a caller's count is wrong)"
            )
        if chunks:
            self.free(chunks[0] if len(chunks) == 1 else torch.cat(chunks), check=False)

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
