"""The state pool's free list on the CPU: :class:`FifoFreeList`, a FIFO queue of Python ints.

Why: without ``need_sort`` a merge only concatenates, in the order of the frees, so the free list is a FIFO
queue (SGLang's ``MambaPool`` appends freed slots to its free tensor). The state pool, nearly full of
checkpoints, merges on about every second one-slot allocation, and each merge builds a numpy array; this
list keeps the queue built instead and never merges.

What it trades: O(k) per call in Python, so it suits allocations and frees of a few ids (the state pool),
not of thousands (the token pools); no ``need_sort``; what is visible of the representation
(``free_pages``, ``release_pages``) differs, the ids and their order do not (see the class).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from mamba_radix.pools.host_free_list import HostFreeList

__all__ = ["FifoFreeList"]


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

    def free_ints(self, ids: list[int], check: bool = True) -> None:
        """As :meth:`HostFreeList.free_ints`. A trusted free (``check=False``: the cache returning the
        checkpoints an eviction released) clears the bits and queues the ids here directly, one frame
        instead of three (cold, each costs about a us). O(k)."""
        if check:
            super().free_ints(ids, check)
            return
        bits = self._bits
        for i in ids:
            bits[i] = False
        self._queue.extend(ids)

    def free_chunks(self, chunks: list[torch.Tensor], num_ids: int | None = None) -> None:
        """As :meth:`HostFreeList.free_chunks` without a count: the ids' bits are cleared and the ids join
        the queue's back at once, in chunk order (this list parks nothing, so nothing may wait unsettled;
        ``num_ids`` is not needed). O(ids)."""
        super().free_chunks(chunks)

    def _park(self, chunk: object, count: int, marked: bool = False) -> None:
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
