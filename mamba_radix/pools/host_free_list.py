"""The free list for CPU pools: :class:`HostFreeList`, the reference :class:`~.free_list.FreeList` worked on
through numpy.

Why: on the CPU the allocators' per-call cost is nothing but calls on small arrays, and a numpy call on a
small array costs ~0.3 us where the torch call costs 2-5 us; numpy also runs these on one thread,
independent of ``torch.get_num_threads()``. The same tensors (the bitmap, the scratch) are read and written
through numpy views of their memory, so ``allocated`` stays the tensor the pools and tests read.

What it trades: CPU only. The free list buffer and the released chunks are numpy arrays (or lists of
Python ints, from small frees), so ``free_pages`` is a tensor view built on demand; frees of up to
:attr:`HostFreeList.SMALL` ids are checked and applied in plain Python. A ``need_sort`` merge of a large free
list is not materialised at once (an O(num_ids) spike) but listed from the bitmap as allocations reach it,
at the price of 1 byte of pending marks per id. Nothing else differs: the same ids in the same order and
the same errors as :class:`~.free_list.FreeList` (``property_tests/test_pools_free_list.py`` and
``test_pools_lazy_scan.py`` replay both).

An eviction's free (:meth:`HostFreeList.free_chunks` given the count) touches neither the ids nor the
tensors: it parks the victims' tensors as one batch, counts them free at once, and their bits and pending
marks are written (and the tensors viewed as numpy arrays) the first time anything reads the bitmap or the
released chunks: a merge, a check, an inspection (:meth:`HostFreeList._settle`). Why: an eviction of
a long conversation's leaves frees 50-120k ids, and writing their bits means reading every id, cold (~1 ns
each: most of such a call); and each torch call on a victim's tensor (``numpy()``, ``numel()``) costs
several us with cold CPU caches, where an eviction runs. The merge that later takes those ids reads them
anyway. Until then the ids read as allocated and not pending (what a lazy scan needs to skip them), and
every reader sees the bitmap and the chunks as if the free had written them.

Memory grows with use, not with capacity: a fresh (or cleared) list is the range ``1..num_ids`` listed
lazily, ``LIST_CHUNK`` ids at a time as allocations reach them (ids from ``_fresh`` on, never listed
before, are an ``arange``, not a bitmap scan), and the per-id arrays (bitmap, pending marks, scratch) are
fresh pages written only at ids ever handed out (:func:`~._indices.lazy_zeros`). A pool of 28M KV indices
of which a few million are ever used holds a few bytes per used id, not 14 bytes per id of capacity.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument, InvariantError
from mamba_radix.native import compiled_paths_enabled
from mamba_radix.pools._indices import as_index_tensor, lazy_zeros
from mamba_radix.pools.free_list import FreeList

__all__ = ["HostFreeList", "compiled_release_ids"]

try:  # the compiled multi-chunk release: optional (setup.py builds it where a C compiler is found)
    from mamba_radix._cfree import release_ids as _c_release_ids
except ImportError:  # not built (no compiler at install time) or built for another Python
    _c_release_ids = None

# release_ids(bits, pending, chunks) -> bool: True when it cleared the bits (and set the pending marks) of
# every id; False, nothing written, to hand the chunks back to the reference (numpy scatters)
ReleaseIds = Callable[[np.ndarray, "np.ndarray | None", list[np.ndarray]], bool]


def compiled_release_ids(compiled: bool | None = None) -> ReleaseIds | None:
    """The compiled release a new host free list uses, or None for the reference alone: the compiled one
    when it was built and ``compiled`` (None: :func:`mamba_radix.native.compiled_paths_enabled`, read
    now). Read at each free list's construction, never on the free path. O(1)."""
    if compiled is None:
        compiled = compiled_paths_enabled()
    return _c_release_ids if compiled else None


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
            self._pending = lazy_zeros("the pending marks", num_ids + 2, torch.bool, device).numpy()
        self._alloc_np = self.allocated.numpy()
        # what one-id reads and writes of the bitmap go through (FifoFreeList: a bytearray of it)
        self._bits: np.ndarray | bytearray = self._alloc_np
        self._scratch_np = self._scratch.numpy()
        self._release_ids = compiled_release_ids()  # free_chunks' compiled path, or None

    # A lazy scan lists at least this many ids at a time (the scan's per-call cost is then negligible).
    LIST_CHUNK = 1 << 16
    # Batches free_chunks parked (a tuple of tensors each, in _released or an open _group) whose bits and
    # pending marks are not written yet (see the module docstring); a class default so that the first
    # clear, run before __init__ has set anything, reads it.
    _unsettled: list[tuple[torch.Tensor, ...]] | tuple[()] = ()
    # The lowest id never listed: ids from here up are free, not pending, and their bitmap bytes were
    # never written (a class default: the first clear runs before __init__ has set anything).
    _fresh = 1

    def _reset_free_ids(self) -> None:
        """Every id free, listed lazily from 1 (nothing materialised); only the bitmap and pending bytes
        below ``_fresh`` (ids ever listed) are cleared, the rest were never written. O(ids ever listed)."""
        fresh = self._fresh
        self._unsettled = []  # their ids are below _fresh: zeroed with the rest just below
        self._allocated[:fresh].zero_()
        if self._pending is not None:
            self._pending[:fresh] = False
        self._set_buffer(np.empty(0, dtype=np.int64))
        self._unlisted, self._scan_pos, self._fresh = self.num_ids, 1, 1

    @property
    def allocated(self) -> torch.Tensor:
        """The allocation bitmap (as :class:`FreeList`'s), with every parked eviction's bits written
        first (:meth:`_settle`): a reader never sees them unwritten. O(1) when none is waiting."""
        if self._unsettled:
            self._settle()
        return self._allocated

    @allocated.setter
    def allocated(self, bitmap: torch.Tensor) -> None:
        self._allocated = bitmap

    def _settle(self) -> None:
        """Settle the batches :meth:`free_chunks` parked: each batch (a tuple of tensors in ``_released`` or
        an open ``_group``) is replaced there by its chunks' numpy views, in order, and their ids' bits are
        cleared and pending marks set, by the compiled ``release_ids`` (runs of consecutive ids as memsets,
        ~0.5-1 ns per id, bounded by reading the ids) when it was built, else by two numpy scatters per
        chunk (the reference). Called by every method that reads the bitmap, the pending marks or the
        released chunks (callers test ``self._unsettled`` first). Raises
        :class:`~mamba_radix.errors.InvariantError` if a batch is no longer where it was parked (a
        bookkeeping bug); an id out of range makes the compiled pass decline with nothing written and the
        reference raise IndexError (a broken trusted free). O(ids parked + chunks released)."""
        batches, self._unsettled = self._unsettled, []
        arrays: list[np.ndarray] = []
        found = 0
        for box in (self._released, self._group):
            if not box:
                continue
            settled: list = []
            for entry in box:
                if type(entry) is tuple:
                    found += 1
                    for chunk in entry:
                        a = chunk.numpy()
                        if len(a):
                            settled.append(a)
                            arrays.append(a)
                else:
                    settled.append(entry)
            box[:] = settled  # in place: an alloc's saved lists (undo_alloc) may share the list object
        if found != len(batches):
            raise InvariantError(
                f"{self.what} free list: {len(batches)} parked eviction batches, {found} found among the "
                "released chunks (a bookkeeping bug)"
            )
        if arrays:
            self._release_now(arrays)

    def merge(self) -> None:
        """As :meth:`FreeList.merge`, after writing any parked eviction's bits (the merge reads them)."""
        if self._unsettled:
            self._settle()
        super().merge()

    def free_group_end(self) -> None:
        """As :meth:`FreeList.free_group_end`, after settling any parked eviction (the group's chunks are
        concatenated)."""
        if self._unsettled:
            self._settle()
        super().free_group_end()

    @property
    def release_pages(self) -> torch.Tensor:
        """As :attr:`FreeList.release_pages`, after settling any parked eviction."""
        if self._unsettled:
            self._settle()
        return super().release_pages

    def listed_free_ids(self) -> torch.Tensor:
        """As :meth:`FreeList.listed_free_ids`, after settling any parked eviction."""
        if self._unsettled:
            self._settle()
        return super().listed_free_ids()

    @property
    def free_pages(self) -> torch.Tensor:
        """As :attr:`FreeList.free_pages`; while part of the merged list is still unlisted, a new tensor
        of the listed head and the rest of the scan (O(num_ids): for inspection and tests)."""
        if not self._unlisted:
            return torch.from_numpy(self._buf_np[self._head :])
        rest = self._scan_range(self._scan_pos, self.num_ids + 1)
        return self._to_tensor(np.concatenate([self._buf_view(), rest]))

    def _scan_range(self, start: int, stop: int) -> np.ndarray:
        """Free, not pending ids in ``[start, stop)``, ascending: the bitmap (and pending marks) below
        ``_fresh``, an ``arange`` from there on (never listed, so all free; no page of the bitmap read).
        O(stop - start)."""
        fresh = self._fresh
        if start >= fresh:
            return np.arange(start, stop, dtype=np.int64)
        if stop > fresh:
            return np.concatenate([self._scan_bits(start, fresh), np.arange(fresh, stop, dtype=np.int64)])
        return self._scan_bits(start, stop)

    def _scan_bits(self, start: int, stop: int) -> np.ndarray:
        """Free, not pending ids in ``[start, stop)`` (below ``_fresh``), from the bitmap. Without
        ``need_sort`` nothing is pending: an unlisted id below ``_fresh`` is then one an undone alloc
        listed (``undo_alloc`` puts the scan back), free and never released since. O(stop - start)."""
        free = self._alloc_np[start:stop]
        if self._pending is not None:
            free = free | self._pending[start:stop]
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
        if pos > self._fresh:
            self._fresh = pos
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
        if self._unsettled:
            self._settle()
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

    def free_chunks(self, chunks: list[torch.Tensor], num_ids: int | None = None) -> None:
        """As :meth:`FreeList.free_chunks`, without the concatenation and without a copy (the caller hands
        the tensors over and never writes them again: an eviction's detached node values).

        ``num_ids`` given (the chunks' total length, which the caller knows: the tree counts an
        eviction's tokens): nothing of the chunks is read here. They are parked as one batch, counted
        free at once, and settled (viewed as numpy arrays, their bits and pending marks written) by the
        next reader of the bitmap or the released chunks (:meth:`_settle`; see the module
        docstring). O(chunks), no torch call (each costs a few us with cold caches). A wrong count
        breaks the free count silently (:meth:`audit` catches it).

        ``num_ids`` None: each chunk's numpy view is parked as it is and its bits and pending marks are
        written now, by the compiled ``release_ids`` (runs of consecutive ids as memsets) when it was
        built, else by two numpy scatters per chunk (the reference). An id out of range makes the
        compiled pass decline with nothing written; the reference then raises IndexError. O(ids)."""
        if num_ids is None:
            arrays = [c.numpy() for c in chunks if c.numel()]
            if arrays:
                self._release_now(arrays)
                for a in arrays:
                    self._park(a, len(a), marked=True)
            return
        if not num_ids:
            return
        batch = tuple(chunks)
        self._unsettled.append(batch)  # type: ignore[union-attr]
        self._pre_merge = None  # a free since the last alloc: undo_alloc falls back to a plain free
        if self._group is not None:
            self._group.append(batch)
            self._num_in_group += num_ids
        else:
            self._released.append(batch)
            self._num_released += num_ids

    def _release_now(self, arrays: list[np.ndarray]) -> None:
        """Clear the bits and set the pending marks of every id of ``arrays``: the compiled
        ``release_ids`` when it was built and accepts them, else numpy scatters. O(ids)."""
        pending, release = self._pending, self._release_ids
        if release is None or not release(self._alloc_np, pending, arrays):
            for a in arrays:
                self._alloc_np[a] = False
                if pending is not None:
                    pending[a] = True

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
        if check and not self._all_allocated_np(divided):
            self._raise_bad_free(torch.from_numpy(divided))
        # In range now (checked, or trusted), so plain fancy indexing, ~2x cheaper than put(mode="clip").
        scratch, ranks = self._scratch_np, np.arange(k, dtype=np.int32)
        scratch[divided] = ranks  # the last write of a repeated id survives
        divided = divided[scratch.take(divided) == ranks]
        self._alloc_np[divided] = False
        self._park(divided, len(divided))

    def _park(self, chunk: object, count: int, marked: bool = False) -> None:
        """As :meth:`FreeList._park`, coalescing consecutive small frees (lists of ints) into one list:
        a pool that frees and takes one slot at a time (the state pool, nearly full of checkpoints)
        then converts one list per merge instead of one per free. Order is kept. ``marked``: the
        chunk's pending marks are already set (:meth:`free_chunks`)."""
        self._pre_merge = None  # a free since the last alloc: undo_alloc falls back to a plain free
        if self._pending is not None and not marked:
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
        if self._unsettled:
            self._settle()
        bits, high = self._bits, self.num_ids
        return all(0 < v <= high and bits[v] for v in vals)

    def _py_release(self, vals: list[int]) -> None:
        bits = self._bits
        for v in vals:
            bits[v] = False
        self._park(vals, len(vals))  # a fresh list: owned, no copy needed; np.concatenate takes lists

    def _all_allocated_np(self, a: np.ndarray) -> bool:
        # take(mode="clip") clamps into 0..num_ids + 1, whose ends are never set: range + bitmap in one.
        if self._unsettled:
            self._settle()
        return bool(self._alloc_np.take(a, mode="clip").all())

    def _all_allocated(self, ids: torch.Tensor) -> bool:
        return self._all_allocated_np(ids.numpy())

    def _np_all_allocated_once(self, a: np.ndarray) -> bool:
        """In range, allocated and no repeats, as the torch backend's fused mask; here two passes, as
        the range check lets the repeat check use plain fancy indexing (~2x cheaper than clipping)."""
        if self._unsettled:
            self._settle()
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
