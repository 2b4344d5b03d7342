"""Counting pools for driving SGLang's cache without device memory (our code, SGLang's interfaces).

SGLang's own pools allocate the KV and state tensors and keep free lists as device tensors that are
concatenated on every free: fine on a GPU, far too slow (and too large for an "infinite" pool) in a
CPU replay. These stand-ins keep SGLang's method names and the bookkeeping its cache relies on (free
counts, request rows, the ping-pong track buffer, donation and release of slots) and hold no state
tensors. Indices are opaque to the cache (only equality and counts matter), so a fresh id per
allocation is exact: the tree behaves as with the real pools.

Every pool records which ids are live, so a double free or a free of an id never handed out raises
:class:`PoolMisuse` (a bug in the cache under test or in the replay), instead of skewing counts.

Complexity: alloc and free are O(n) in the ids touched (vectorised), independent of the pool size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mamba_radix.errors import MambaRadixError

__all__ = [
    "CountingMambaPool",
    "CountingPagedAllocator",
    "CountingSlotAllocator",
    "CountingTokenAllocator",
    "HybridRequestPool",
    "PoolMisuse",
    "advance_track",
]


def advance_track(req_pool: Any, kv: Any) -> int:
    """SGLang's scheduler after it marks a forward to track a state (a prefill chunk in
    ``_mamba_radix_cache_v2_req_prepare_for_extend``, a decode boundary): the entry the model writes,
    ``kv.mamba_next_track_idx``, becomes ``mamba_last_track_idx`` and the other entry the next one.
    Returns the entry written. The one place our SGLang emulation advances SGLang's ping-pong fields.

    Deliberately not :mod:`mamba_radix.buffers` (our lifecycle's own ping-pong step): this side drives
    SGLang's real cache as SGLang's scheduler would, so that the differential replay compares our code with
    an independent model of SGLang's, not with itself."""
    written = kv.mamba_next_track_idx
    kv.mamba_last_track_idx = written
    kv.mamba_next_track_idx = req_pool.get_mamba_ping_pong_other_idx(written)
    return written


class PoolMisuse(MambaRadixError, AssertionError):
    """A free of an id that is not live (double free or never allocated)."""


class _LiveIds:
    """Which ids are handed out: a growing boolean array over the ids issued so far."""

    def __init__(self) -> None:
        self.live = np.zeros(1024, dtype=bool)
        self.next_id = 1  # id 0 is padding in SGLang's pools; never hand it out

    def issue(self, n: int) -> np.ndarray:
        start = self.next_id
        end = start + n
        if end > len(self.live):
            grown = np.zeros(max(end, 2 * len(self.live)), dtype=bool)
            grown[: len(self.live)] = self.live
            self.live = grown
        self.live[start:end] = True
        self.next_id = end
        return np.arange(start, end, dtype=np.int64)

    def retire(self, ids: np.ndarray, what: str) -> None:
        if ids.size == 0:
            return
        if ids.min() < 1 or ids.max() >= self.next_id or not self.live[ids].all():
            bad = ids[(ids < 1) | (ids >= self.next_id)]
            if bad.size == 0:
                bad = ids[~self.live[ids]]
            raise PoolMisuse(f"free of {what} {int(bad[0])}, which is not allocated (double free?)")
        if np.unique(ids).size != ids.size:
            raise PoolMisuse(f"one free names a {what} twice")
        self.live[ids] = False


def _as_numpy(index: Any) -> np.ndarray:
    if isinstance(index, torch.Tensor):
        return index.detach().reshape(-1).to(torch.int64).cpu().numpy()
    return np.asarray(index, dtype=np.int64).reshape(-1)


class CountingTokenAllocator:
    """SGLang's ``TokenToKVPoolAllocator`` interface, page size 1: ``alloc(n)`` gives ``n`` fresh KV
    indices or ``None`` when fewer than ``n`` are free; ``free`` / ``free_segment`` give them back."""

    page_size = 1

    def __init__(self, size: int, device: str = "cpu") -> None:
        self.size = int(size)
        self.device = torch.device(device)
        self.free_tokens = self.size
        self.need_sort = False
        self._ids = _LiveIds()
        self.alloc_calls = 0
        self.free_calls = 0

    @property
    def size_full(self) -> int:
        return self.size

    def available_size(self) -> int:
        return self.free_tokens

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self.free_tokens:
            return None
        self.alloc_calls += 1
        self.free_tokens -= need_size
        return torch.from_numpy(self._ids.issue(need_size))

    def free(self, free_index: Any) -> None:
        ids = _as_numpy(free_index)
        if ids.size == 0:
            return
        self._ids.retire(ids, "KV index")
        self.free_calls += 1
        self.free_tokens += int(ids.size)

    def free_segment(self, free_index: Any, *, start_pos: int = 0) -> None:
        self.free(free_index)

    def free_segments(self, segments: Sequence[tuple[Any, int]]) -> None:
        for free_index, start_pos in segments:
            self.free_segment(free_index, start_pos=start_pos)

    def free_full(self, free_index: Any) -> None:
        self.free(free_index)

    def free_full_segment(self, free_index: Any, *, start_pos: int = 0) -> None:
        self.free(free_index)

    def mamba_full_cache_donor(self) -> None:
        """No pool shares bytes between KV and states here."""
        return None

    def full_available_size(self) -> int:
        return self.available_size()

    def free_group_begin(self) -> None:  # frees are never deferred here
        pass

    def free_group_end(self) -> None:
        pass

    def merge_and_sort_free(self) -> None:
        pass

    def clear(self) -> None:
        self.free_tokens = self.size
        self._ids = _LiveIds()


class CountingPagedAllocator(CountingTokenAllocator):
    """SGLang's ``PagedTokenToKVPoolAllocator`` interface: KV comes in pages of ``page_size`` tokens,
    index ``i`` lies in page ``i // page_size``. :meth:`alloc_extend_one` continues a request's last
    partial page before taking new pages; a free releases every page any freed index lies in."""

    def __init__(self, size: int, page_size: int, device: str = "cpu") -> None:
        if page_size < 2:
            raise ValueError("CountingPagedAllocator needs page_size >= 2; use CountingTokenAllocator")
        super().__init__(size // page_size * page_size, device)
        self.page_size = int(page_size)
        self.free_pages = self.size // self.page_size

    def available_size(self) -> int:
        return self.free_pages * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            raise ValueError(f"paged alloc of {need_size} tokens: not a whole number of pages")
        pages = self._alloc_pages(need_size // self.page_size)
        if pages is None:
            return None
        return torch.from_numpy(self._tokens_of(pages))

    def _alloc_pages(self, n: int) -> np.ndarray | None:
        if n > self.free_pages:
            return None
        self.alloc_calls += 1
        self.free_pages -= n
        return self._ids.issue(n)

    def _tokens_of(self, pages: np.ndarray) -> np.ndarray:
        ps = self.page_size
        return (pages[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)

    def alloc_extend_one(self, prefix_len: int, seq_len: int, last_loc: int) -> torch.Tensor | None:
        """KV indices of positions ``[prefix_len, seq_len)`` of one request whose position
        ``prefix_len - 1`` has index ``last_loc`` (ignored when ``prefix_len`` is page-aligned): the rest
        of that page first, then ``ceil(seq_len / ps) - ceil(prefix_len / ps)`` new pages, or ``None``
        when they are not free (nothing allocated)."""
        ps = self.page_size
        n = seq_len - prefix_len
        new_pages = -(-seq_len // ps) - (-(-prefix_len // ps))
        pages = self._alloc_pages(new_pages) if new_pages else np.empty(0, dtype=np.int64)
        if pages is None:
            return None
        head = np.empty(0, dtype=np.int64)
        if prefix_len % ps:
            take = min(n, ps - prefix_len % ps)
            head = np.arange(last_loc + 1, last_loc + 1 + take, dtype=np.int64)
        out = np.concatenate([head, self._tokens_of(pages)])[:n]
        return torch.from_numpy(out)

    def free(self, free_index: Any) -> None:
        ids = _as_numpy(free_index)
        if ids.size == 0:
            return
        pages = np.unique(ids // self.page_size)
        self._ids.retire(pages, "KV page")
        self.free_calls += 1
        self.free_pages += int(pages.size)

    def clear(self) -> None:
        self.free_pages = self.size // self.page_size
        self._ids = _LiveIds()


class CountingSlotAllocator:
    """SGLang's ``MambaSlotAllocator`` interface: state slots, one id each."""

    def __init__(self, size: int, device: str = "cpu") -> None:
        self.size = int(size)
        self.device = torch.device(device)
        self.free_count = self.size
        self._ids = _LiveIds()
        self._group: list[torch.Tensor] | None = None

    def available_size(self) -> int:
        return self.free_count

    def schedulable_available_size(self) -> int:
        return self.free_count

    def alloc_group_begin(self, num_reqs: int) -> None:
        """SGLang pre-takes one slot per waiting request before a scheduling pass; kept for fidelity of
        the free count during the pass."""
        self._group = None
        if num_reqs > 0:
            got = self._take(num_reqs)
            if got is not None:
                self._group = list(got.split(1))

    def alloc_group_end(self) -> None:
        if self._group:
            self.free(torch.cat(self._group))
        self._group = None

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if self._group and need_size == 1:
            return self._group.pop(0)
        return self._take(need_size)

    def _take(self, n: int) -> torch.Tensor | None:
        if n > self.free_count:
            return None
        self.free_count -= n
        return torch.from_numpy(self._ids.issue(n))

    def free(self, free_index: Any) -> None:
        ids = _as_numpy(free_index)
        if ids.size == 0:
            return
        self._ids.retire(ids, "state slot")
        self.free_count += int(ids.size)

    def clear(self) -> None:
        self.free_count = self.size
        self._ids = _LiveIds()


class CountingMambaPool:
    """The state storage side of SGLang's ``MambaPool``: no tensors, only the copies it was asked to do."""

    replayssm_write_pos = None  # SGLang's ReplaySSM ring is off in a replay

    def __init__(self, size: int) -> None:
        self.size = size
        self.copied_slots = 0

    def copy_from(self, src_index: Any, dst_index: Any) -> None:
        self.copied_slots += int(_as_numpy(dst_index).size)


class HybridRequestPool:
    """SGLang's ``HybridReqToTokenPool`` interface: request rows (``req_to_token``), each running
    request's live state slot and its ping-pong track buffer, donation of a tracked slot to the tree and
    release at finish, with SGLang's semantics for each call (see the method docstrings).

    ``ping_pong_size`` is 2 with overlap scheduling, 1 without; ``lazy`` takes one track slot up front and
    borrows the second at decode boundaries. Rows are reused (free list); the table is
    ``rows x max_context_len`` int64.
    """

    def __init__(
        self,
        rows: int,
        max_context_len: int,
        num_slots: int,
        extra_buffer: bool,
        lazy: bool = False,
        ping_pong_size: int = 2,
        device: str = "cpu",
    ) -> None:
        self.size = rows
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((rows, max_context_len), dtype=torch.int64)
        self._free_rows = list(range(rows))
        self.mamba_allocator = CountingSlotAllocator(num_slots, device)
        self.mamba_pool = CountingMambaPool(num_slots)
        self.enable_mamba_extra_buffer = extra_buffer
        self.enable_mamba_extra_buffer_lazy = lazy
        self.mamba_ping_pong_track_buffer_size = ping_pong_size
        # track slots a request takes with its first chunk (0.5.23 counts them before allocating)
        self.mamba_initial_tracking_slots = (1 if lazy else ping_pong_size) if extra_buffer else 0
        self.req_index_to_mamba_index_mapping = torch.zeros(rows, dtype=torch.int64)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.full(
            (rows, ping_pong_size), -1, dtype=torch.int64
        )

    # ------------------------------------------------------------------------------------------ rows
    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:
        """A row per request that has none (a continuing chunk keeps its row), a live slot per request
        without one (zeroed, "needs clear"), and a track buffer per extra_buffer request without one.
        Raises :class:`PoolMisuse` when a slot is not free (SGLang asserts there)."""
        fresh = [r for r in reqs if r.kv.req_pool_idx is None]
        if len(fresh) > len(self._free_rows):
            return None
        for r in fresh:
            r.kv.req_pool_idx = self._free_rows.pop(0)
        out = []
        for r in reqs:
            if r.kv.mamba_pool_idx is None:
                mid = self.mamba_allocator.alloc(1)
                if mid is None:
                    raise PoolMisuse("no state slot free for a request's live state (SGLang asserts here)")
                r.kv.mamba_pool_idx = mid[0]
                r.kv.mamba_needs_clear = True
            self.req_index_to_mamba_index_mapping[r.kv.req_pool_idx] = r.kv.mamba_pool_idx
            if self.enable_mamba_extra_buffer and r.kv.mamba_ping_pong_track_buffer is None:
                self._alloc_ping_pong_buffer(r)
            if self.enable_mamba_extra_buffer:
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[r.kv.req_pool_idx] = (
                    r.kv.mamba_ping_pong_track_buffer
                )
            out.append(r.kv.req_pool_idx)
        return out

    def free(self, req: Any) -> None:
        """Give the request's row back (its KV and slots are released by the cache before)."""
        row = req.kv.req_pool_idx
        if row is None:
            raise PoolMisuse("free of a request row that is not held")
        self._free_rows.append(row)
        req.kv.req_pool_idx = None

    def write(self, index: Any, values: Any) -> None:
        self.req_to_token[index] = torch.as_tensor(values, dtype=torch.int64)

    def translate_mamba_indices(self, mamba_indices: Any) -> Any:
        return mamba_indices

    # ------------------------------------------------------------------------------------- ping-pong
    def get_mamba_ping_pong_other_idx(self, idx: int) -> int:
        return 1 - idx if self.mamba_ping_pong_track_buffer_size == 2 else idx

    def get_mamba_ping_pong_keep_idx(self, req: Any) -> int:
        """The entry holding the newest tracked state."""
        return req.kv.mamba_last_track_idx

    def _alloc_ping_pong_buffer(self, req: Any) -> None:
        n = 1 if self.enable_mamba_extra_buffer_lazy else self.mamba_ping_pong_track_buffer_size
        slots = self.mamba_allocator.alloc(n)
        if slots is None:
            raise PoolMisuse("no state slots free for a request's track buffer (SGLang asserts here)")
        buf = torch.full((self.mamba_ping_pong_track_buffer_size,), -1, dtype=torch.int64)
        buf[:n] = slots
        req.kv.mamba_ping_pong_track_buffer = buf
        req.kv.mamba_next_track_idx = 0
        req.kv.mamba_last_track_idx = (
            0 if self.enable_mamba_extra_buffer_lazy else self.get_mamba_ping_pong_other_idx(0)
        )

    def set_mamba_ping_pong_slot(self, req: Any, idx: int, value: Any) -> None:
        req.kv.mamba_ping_pong_track_buffer[idx] = value
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[req.kv.req_pool_idx] = (
            req.kv.mamba_ping_pong_track_buffer
        )

    def donate_mamba_ping_pong_slot(self, req: Any, new_slot: torch.Tensor) -> torch.Tensor:
        """Hand the entry with the newest tracked state to the tree (returned, shape [1]) and put
        ``new_slot`` in its place so the request keeps tracking."""
        keep = self.get_mamba_ping_pong_keep_idx(req)
        donated = req.kv.mamba_ping_pong_track_buffer[keep].reshape(1).clone()
        if int(donated[0]) == -1:
            raise PoolMisuse(
                f"donation of an empty ping-pong entry {keep} (request {getattr(req, 'rid', '?')})"
            )
        self.set_mamba_ping_pong_slot(req, keep, new_slot[0])
        return donated

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None) -> None:
        """Free the live slot and the track buffer, except entry ``..._to_keep`` (already given to the
        tree); clear the request's tracking fields."""
        if req.kv.mamba_pool_idx is None:
            raise PoolMisuse("double free of a request's live state slot")
        self.mamba_allocator.free(req.kv.mamba_pool_idx.reshape(1))
        req.kv.mamba_pool_idx = None
        if not self.enable_mamba_extra_buffer:
            return
        buf = req.kv.mamba_ping_pong_track_buffer
        if buf is not None:
            keep = mamba_ping_pong_track_buffer_to_keep
            to_free = [int(buf[i]) for i in range(len(buf)) if i != keep and int(buf[i]) != -1]
            if to_free:
                self.mamba_allocator.free(torch.tensor(to_free, dtype=torch.int64))
        req.kv.mamba_ping_pong_track_buffer = None
        req.kv.mamba_next_track_idx = None
        req.kv.mamba_last_track_idx = None
        req.kv.mamba_last_track_seqlen = None
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False
