"""Token-granular KV index allocator (``page_size == 1``).

Hands out rows of the KV storage (``MHATokenToKVPool`` and friends): KV indices ``1..size``, index 0
being the padding row that dummy reads and writes of a padded batch land on. Semantics as SGLang's
``TokenToKVPoolAllocator`` (seed 003 §4): ``alloc`` slices the head of a device free list or returns
``None``; ``free`` parks indices in ``release_pages`` (``need_sort``) that are merged and sorted only when
an ``alloc`` needs them; ``free_group_begin/end`` batch many frees into one concatenation.
"""

from __future__ import annotations

import torch

from mamba_radix.pools._indices import IndexLike, as_index_tensor, check_count, check_size, resolve_device
from mamba_radix.pools.free_list import FreeListBatching
from mamba_radix.pools.free_lists import make_free_list

__all__ = ["TokenToKVPoolAllocator"]


class TokenToKVPoolAllocator(FreeListBatching):
    """KV indices ``1..size`` of a token pool on ``device``.

    ``available_size()`` counts free indices (merged or not); ``used`` counts allocated ones; they always
    sum to ``size``. Every method is O(k) in the
    indices it takes or returns, except ``clear`` and ``allocated_indices`` (O(size), not for hot paths).

    ``backend`` picks the free list implementation (see :mod:`.free_lists`): ``"auto"`` (numpy views on
    CPU, torch elsewhere); ``"torch"`` forces the device one, which tests use to cover it on CPU.
    """

    page_size = 1

    def __init__(
        self, size: int, device: str | torch.device = "cpu", need_sort: bool = True, backend: str = "auto"
    ) -> None:
        self.size = check_size(size, "size")
        self.device = resolve_device(device)
        self.need_sort = need_sort
        self._free_list = make_free_list(self.size, self.device, need_sort, "KV index", backend)

    # ----------------------------------------------------------------------------------------- sizes
    def available_size(self) -> int:
        """Free KV indices. O(1), no device sync."""
        return self._free_list.available

    @property
    def used(self) -> int:
        """Allocated KV indices."""
        return self.size - self._free_list.available

    # ------------------------------------------------------------------------------------- alloc/free
    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """``num_tokens`` free KV indices (int64, on the device), or ``None`` and nothing taken.

        Side effects: marks them allocated; may merge released indices first. O(num_tokens) amortised.
        """
        check_count(num_tokens, "num_tokens")
        return self._free_list.alloc(num_tokens)

    def free(self, indices: IndexLike, check: bool = True) -> None:
        """Return KV indices to the pool (batched while a free group is open). O(k).

        Raises :class:`~mamba_radix.errors.InvalidIndex` and changes nothing for index 0, an index out of
        range, never allocated or already freed, or given twice; :class:`InvalidArgument` for a
        non-integer tensor or one on another device. The check is one fused pass (one host sync on a GPU).

        ``check=False`` is for trusted hot paths that free exactly what ``alloc`` returned, once: it skips
        the misuse check (and so its host sync on a GPU); a bad index then corrupts the pool silently.
        """
        self._free_list.free(as_index_tensor(indices, self.device, "KV index"), check)

    def free_chunks(self, chunks: list[torch.Tensor], num_ids: int | None = None) -> None:
        """Trusted free of several 1-D int64 index tensors at once (an eviction's victims' KV, one tensor
        per node): as ``free(torch.cat(chunks), check=False)``, without the concatenation, and on the CPU
        without a copy (the pool keeps the tensors: never write them afterwards). ``num_ids``: their total
        length, when the caller knows it (on the CPU nothing of the chunks is then read until the free
        list next needs them: :meth:`.host_free_list.HostFreeList.free_chunks`). O(indices), O(chunks) on
        the CPU with ``num_ids``."""
        self._free_list.free_chunks(chunks, num_ids)

    def undo_alloc(self, indices: torch.Tensor) -> None:
        """Give back what the most recent :meth:`alloc` returned as if it had not run (the next ``alloc``
        hands out the same indices in order): for a transactional caller whose later step failed. O(k)."""
        self._free_list.undo_alloc(as_index_tensor(indices, self.device, "KV index"))

    def clear(self) -> None:
        """Free every index; the free list restarts as ``1..size``. O(size)."""
        self._free_list.clear()

    # ----------------------------------------------------------------------------------- inspection
    def is_allocated(self, indices: torch.Tensor) -> torch.Tensor:
        """Bool mask over ``indices``: allocated or not (0 and out-of-range read as not). O(k)."""
        return self._free_list.is_allocated(as_index_tensor(indices, self.device, "KV index"))

    def all_allocated(self, indices: torch.Tensor) -> bool:
        """Whether every KV index of the 1-D int32/int64 tensor ``indices`` (on the pool's device; a
        request row's span, read as is) is allocated. O(k), one fused check without building a mask
        tensor (numpy on CPU; one host sync on a GPU)."""
        return self._free_list.all_allocated(indices)

    def has_repeats(self, indices: torch.Tensor) -> bool:
        """Whether a KV index occurs twice in the 1-D int64 tensor ``indices`` (every index in
        ``0..size + 1``: check that first). O(k), no sort."""
        return self._free_list.has_repeats(indices)

    def allocated_indices(self) -> torch.Tensor:
        """Every allocated KV index, ascending. O(size): for conservation checks."""
        return self._free_list.allocated_ids()
