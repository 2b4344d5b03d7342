"""Page-granular KV index allocator (``page_size > 1``), SGLang's ``PagedTokenToKVPoolAllocator``.

The token pool is cut into pages of ``page_size`` consecutive KV indices; page ``p`` holds indices
``p * page_size .. p * page_size + page_size - 1``. Page 0 is padding, so usable indices run from
``page_size`` to ``(num_pages + 1) * page_size - 1`` and KV storage needs ``size + page_size`` rows.

Whole pages are allocated and freed. A request's tokens keep the page layout of their positions: the
token at position ``pos`` sits at offset ``pos % page_size`` of its page, and positions of one page
share one page. ``alloc_extend`` / ``alloc_decode`` therefore first fill the request's last partial page
(continuing right after ``last_loc``, the KV index of its last token) and only then take new pages.
Everything is plain vectorised torch, O(tokens + requests) per call, no per-request Python loop.
"""

from __future__ import annotations

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools._indices import (
    IndexLike,
    as_index_tensor,
    check_allocated,
    check_count,
    check_size,
    resolve_device,
)
from mamba_radix.pools.free_list import FreeListBatching
from mamba_radix.pools.free_lists import make_free_list

__all__ = ["PagedTokenToKVPoolAllocator", "get_last_loc"]

# Sequence positions above this are refused: page arithmetic (seq + page_size - 1) must not overflow int64.
_MAX_POSITION = 2**62


def get_last_loc(req_to_token: torch.Tensor, rows: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """``req_to_token[rows[i], prefix_lens[i] - 1]`` as int64, or ``-1`` where ``prefix_lens[i] == 0``:
    the ``last_loc`` argument of :meth:`PagedTokenToKVPoolAllocator.alloc_extend`. O(len(rows))."""
    rows = rows.to(torch.int64)
    prefix_lens = prefix_lens.to(torch.int64)
    col = (prefix_lens - 1).clamp(min=0)
    last = req_to_token[rows, col].to(torch.int64)
    return torch.where(prefix_lens > 0, last, torch.full_like(last, -1))


class PagedTokenToKVPoolAllocator(FreeListBatching):
    """``size`` KV indices in ``size // page_size`` pages on ``device``; ``size`` must be a multiple of
    ``page_size``. Sizes are counted in tokens: ``available_size() + used == size``. ``backend``: the free
    list implementation, as for :class:`~mamba_radix.pools.TokenToKVPoolAllocator`."""

    def __init__(
        self,
        size: int,
        page_size: int,
        device: str | torch.device = "cpu",
        need_sort: bool = True,
        backend: str = "auto",
    ) -> None:
        self.size = check_size(size, "size")
        self.page_size = check_size(page_size, "page_size")
        if size % page_size:
            raise InvalidArgument(
                f"size {size} is not a multiple of page_size {page_size}; use {size // page_size * page_size}"
            )
        self.num_pages = size // page_size
        self.device = resolve_device(device)
        self.need_sort = need_sort
        self._free_list = make_free_list(self.num_pages, self.device, need_sort, "KV page", backend)
        self._page_offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)

    @property
    def max_index(self) -> int:
        """The largest KV index handed out; storage rows run ``0..max_index``."""
        return (self.num_pages + 1) * self.page_size - 1

    # ----------------------------------------------------------------------------------------- sizes
    def available_size(self) -> int:
        """Free KV indices (free pages times ``page_size``). O(1), no device sync."""
        return self._free_list.available * self.page_size

    @property
    def used(self) -> int:
        """Allocated KV indices (whole pages)."""
        return self.size - self.available_size()

    # ------------------------------------------------------------------------------------------ alloc
    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Whole pages for ``num_tokens`` (a multiple of ``page_size``) KV indices, page after page, or
        ``None`` and nothing taken. O(num_tokens)."""
        check_count(num_tokens, "num_tokens")
        if num_tokens % self.page_size:
            raise InvalidArgument(
                f"num_tokens {num_tokens} is not a multiple of page_size {self.page_size}; "
                "allocate whole pages, or use alloc_extend for spans that continue a partial page"
            )
        pages = self._free_list.alloc(num_tokens // self.page_size)
        return None if pages is None else self._expand(pages)

    def alloc_extend(
        self, prefix_lens: IndexLike, seq_lens: IndexLike, last_loc: IndexLike, extend_num_tokens: int
    ) -> torch.Tensor | None:
        """KV indices for positions ``[prefix_lens[i], seq_lens[i])`` of each request, concatenated in
        request order (``extend_num_tokens`` in all), or ``None`` and nothing taken.

        A request whose prefix ends inside a page continues that page: its first new tokens get
        ``last_loc[i] + 1, last_loc[i] + 2, ...`` up to the page end; further tokens get fresh pages.
        ``last_loc[i]`` is the KV index of position ``prefix_lens[i] - 1`` (any value, e.g. -1 or 0,
        where the prefix ends on a page boundary). Side effect: takes
        ``sum(ceil(seq / page) - ceil(prefix / page))`` pages. O(extend_num_tokens + requests).

        Raises :class:`InvalidArgument` for mismatched lengths, ``seq < prefix``, a wrong
        ``extend_num_tokens``, or a ``last_loc`` in a page not allocated or at an offset that does not
        match its position.
        """
        check_count(extend_num_tokens, "extend_num_tokens")
        prefix = as_index_tensor(prefix_lens, self.device, "prefix_lens")
        seq = as_index_tensor(seq_lens, self.device, "seq_lens")
        last = as_index_tensor(last_loc, self.device, "last_loc")
        if not prefix.numel() == seq.numel() == last.numel():
            raise InvalidArgument(
                f"prefix_lens, seq_lens and last_loc must have one entry per request, got "
                f"{prefix.numel()}, {seq.numel()} and {last.numel()}"
            )
        if prefix.numel() and bool((prefix < 0).any()):
            raise InvalidArgument(f"prefix_lens must be >= 0, got {prefix.tolist()}")
        if seq.numel() and bool((seq > _MAX_POSITION).any()):
            raise InvalidArgument(f"seq_lens must be <= 2**62 positions, got {seq.max().item()}")
        extend = seq - prefix
        if extend.numel() and bool((extend < 0).any()):
            raise InvalidArgument(f"seq_lens must be >= prefix_lens, got {seq.tolist()} vs {prefix.tolist()}")
        total = int(extend.sum())
        if total != extend_num_tokens:
            raise InvalidArgument(
                f"extend_num_tokens is {extend_num_tokens} but seq_lens - prefix_lens sums to {total}"
            )
        return self._alloc_spans(prefix, seq, last, total)

    def alloc_decode(self, seq_lens: IndexLike, last_loc: IndexLike) -> torch.Tensor | None:
        """One KV index per request for position ``seq_lens[i] - 1`` (the token being decoded): right
        after ``last_loc[i]`` inside its page, or the first index of a fresh page when the position
        starts a page. ``None`` and nothing taken if pages run short. O(requests)."""
        seq = as_index_tensor(seq_lens, self.device, "seq_lens")
        last = as_index_tensor(last_loc, self.device, "last_loc")
        if seq.numel() != last.numel():
            raise InvalidArgument(
                f"seq_lens and last_loc must have one entry per request, got {seq.numel()} and {last.numel()}"
            )
        if seq.numel() and bool(((seq < 1) | (seq > _MAX_POSITION)).any()):
            raise InvalidArgument(
                f"seq_lens must be >= 1 (they include the decoded token) and <= 2**62, got {seq.tolist()}"
            )
        return self._alloc_spans(seq - 1, seq, last, seq.numel())

    def _alloc_spans(
        self, prefix: torch.Tensor, seq: torch.Tensor, last: torch.Tensor, num_tokens: int
    ) -> torch.Tensor | None:
        ps = self.page_size
        self._check_last_loc(prefix, last)
        prefix_pages = (prefix + ps - 1) // ps  # pages the prefix already touches
        new_pages_per_req = (seq + ps - 1) // ps - prefix_pages
        num_new_pages = int(new_pages_per_req.sum()) if prefix.numel() else 0
        pages = self._free_list.alloc(num_new_pages)
        if pages is None:
            return None
        try:
            return self._span_indices(prefix, seq, last, num_tokens, pages, prefix_pages, new_pages_per_req)
        except BaseException:  # e.g. out of memory building the result: the pages were not handed out
            self._free_list.undo_alloc(pages)
            raise

    def _span_indices(
        self,
        prefix: torch.Tensor,
        seq: torch.Tensor,
        last: torch.Tensor,
        num_tokens: int,
        pages: torch.Tensor,
        prefix_pages: torch.Tensor,
        new_pages_per_req: torch.Tensor,
    ) -> torch.Tensor:
        """The KV index of every new position (see :meth:`alloc_extend`), given the fresh ``pages``."""
        ps = self.page_size
        extend = seq - prefix
        num_new_pages = pages.numel()
        if num_tokens == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)

        # One row per output token: which request it belongs to and its position in that request.
        num_reqs = prefix.numel()
        req = torch.repeat_interleave(
            torch.arange(num_reqs, device=self.device), extend, output_size=num_tokens
        )
        token_start = torch.cumsum(extend, 0) - extend  # first output row of each request
        pos = prefix[req] + torch.arange(num_tokens, device=self.device) - token_start[req]

        # Positions before the first new page continue the prefix's partial page after last_loc.
        in_partial_page = pos < prefix_pages[req] * ps
        continued = last[req] + (pos - prefix[req] + 1)

        # Later positions: the request's new pages, in order, at offset pos % page_size.
        page_start = torch.cumsum(new_pages_per_req, 0) - new_pages_per_req
        rank = page_start[req] + pos // ps - prefix_pages[req]
        if num_new_pages:
            fresh = pages[rank.clamp(0, num_new_pages - 1)] * ps + pos % ps
        else:
            fresh = torch.zeros_like(pos)
        return torch.where(in_partial_page, continued, fresh)

    def _check_last_loc(self, prefix: torch.Tensor, last: torch.Tensor) -> None:
        """Where a prefix ends inside a page, ``last_loc`` must sit in an allocated page at the offset of
        position ``prefix - 1``; otherwise the continuation would write into someone else's page."""
        ps = self.page_size
        partial = prefix % ps != 0
        if not prefix.numel() or not bool(partial.any()):
            return
        loc = last[partial]
        pre = prefix[partial]
        bad_range = (loc < ps) | (loc > self.max_index)
        if bool(bad_range.any()):
            value = int(loc[bad_range][0])
            raise InvalidIndex(
                f"last_loc {value} is not a usable KV index (valid: {ps}..{self.max_index}) for a prefix that "
                "ends inside a page; pass the KV index of the request's last prefix token"
            )
        check_allocated(self._free_list.allocated, loc // ps, "KV page")
        misplaced = loc % ps != (pre - 1) % ps
        if bool(misplaced.any()):
            i = int(torch.nonzero(misplaced)[0])
            raise InvalidArgument(
                f"last_loc {int(loc[i])} sits at page offset {int(loc[i]) % ps} but prefix length "
                f"{int(pre[i])} ends at offset {(int(pre[i]) - 1) % ps}; pass the KV index of position "
                "prefix_len - 1"
            )

    def undo_alloc(self, indices: torch.Tensor) -> None:
        """Give back what the most recent :meth:`alloc` returned as if it had not run (the next ``alloc``
        hands out the same pages in order): for a transactional caller whose later step failed. O(k)."""
        idx = as_index_tensor(indices, self.device, "KV index")
        self._free_list.undo_alloc(idx[:: self.page_size] // self.page_size)

    # ------------------------------------------------------------------------------------------- free
    def free(self, indices: IndexLike, check: bool = True) -> None:
        """Free every page that ``indices`` fall in (each page once, however many of its indices are
        given). O(k). Raises :class:`InvalidIndex` and frees nothing for an index in the padding page, out
        of range, or in a page not allocated (double free).

        The check is fused into the page-level pass (an index out of range falls in page 0 or a page past
        the last, which are never allocated); only a failed call works out the token-level message.
        ``check=False``: trusted callers freeing exactly what they were given skip it; a bad index then
        corrupts the pool silently.
        """
        idx = as_index_tensor(indices, self.device, "KV index")
        try:
            self._free_list.free_containing(idx, self.page_size, check)
        except InvalidIndex:
            self._check_token_range(idx)  # raises the more precise token-level error if there is one
            raise

    def free_chunks(self, chunks: list[torch.Tensor], num_ids: int | None = None) -> None:
        """Trusted free of several index tensors at once (an eviction's victims' KV): exactly
        ``free(torch.cat(chunks), check=False)`` (a page is freed once however many chunks hold its
        indices; ``num_ids``, the indices' count, is not needed here). O(indices)."""
        if chunks:
            self.free(chunks[0] if len(chunks) == 1 else torch.cat(chunks), check=False)

    def _check_token_range(self, idx: torch.Tensor) -> None:
        """Raise the token-level error for an index in the padding page or past the last page, if any
        (``from None``: called while the page-level error is handled, which it replaces)."""
        bad = (idx < self.page_size) | (idx > self.max_index)
        if bool(bad.any()):
            value = int(idx[bad][0])
            if 0 <= value < self.page_size:
                raise InvalidIndex(
                    f"KV index {value} lies in page 0, the padding page; it is never freed"
                ) from None
            raise InvalidIndex(
                f"KV index {value} is out of range; valid values are {self.page_size}..{self.max_index}"
            ) from None

    def clear(self) -> None:
        """Free every page; the free list restarts as pages ``1..num_pages``. O(num_pages)."""
        self._free_list.clear()

    # ----------------------------------------------------------------------------------- inspection
    def is_allocated(self, indices: IndexLike) -> torch.Tensor:
        """Bool mask over KV indices: whether each lies in an allocated page. O(k)."""
        idx = as_index_tensor(indices, self.device, "KV index")
        inside = (idx >= 0) & (idx <= self.max_index)
        return inside & self._free_list.is_allocated(idx.clamp(0, self.max_index) // self.page_size)

    def all_allocated(self, indices: torch.Tensor) -> bool:
        """Whether every KV index of the 1-D int32/int64 tensor ``indices`` (on the pool's device) lies
        in an allocated page. O(k) (one host sync on a GPU)."""
        if not indices.numel():
            return True
        if indices.device.type == "cpu":
            a = indices.numpy()
            if int(a.min()) < 0 or int(a.max()) > self.max_index:
                return False
            return self._free_list.all_allocated(torch.from_numpy(a // self.page_size))
        return bool(self.is_allocated(indices).all())

    def has_repeats(self, indices: torch.Tensor) -> bool:
        """Whether a KV index occurs twice in the 1-D int64 tensor ``indices``. O(k log k) (a sort: the
        scratch is sized for pages, not token indices)."""
        if indices.numel() < 2:
            return False
        if indices.device.type == "cpu":
            return len(np.unique(indices.numpy())) != indices.numel()
        return torch.unique(indices).numel() != indices.numel()

    def allocated_indices(self) -> torch.Tensor:
        """Every KV index of every allocated page, ascending. O(size): for conservation checks."""
        return self._expand(self._free_list.allocated_ids())

    def _expand(self, pages: torch.Tensor) -> torch.Tensor:
        """Page ids to their KV indices, page after page: one fused multiply-add. O(pages * page_size)."""
        return torch.add(self._page_offsets, pages.unsqueeze(1), alpha=self.page_size).reshape(-1)
