"""Which KV indices the radix tree holds: one flag per index of the token pool.

The cache keeps this beside the allocator so that a public ``insert`` can refuse, in one gather, KV
indices that are already the tree's. Without it the check walked the key, concatenated the matched path's
KV and compared it position by position (about 45 us on a 100k-node tree), and it could not see a
tree index handed over *past* the matched prefix at all: such an insert was accepted and left one index
owned by two nodes (invariant 3). The allocator cannot answer this itself: to it the tree's indices and a
running request's are both just "allocated".

The SGLang-named calls ``cache_unfinished_req`` / ``cache_finished_req``, called directly, check the
request's row past its prefix against them too (a tree index there would get a second owner, or be
freed under the tree). Only the cache writes the flags, at the two places where KV changes hands (an
insert's new leaf, an eviction's release), and only from the first such public check on (it builds them
from the tree then): an engine driving the lifecycle alone, whose hand-overs are trusted, never pays the
O(new tokens) scatter (about 8 us for an 8,192-token chunk). :func:`mamba_radix.invariants.check_invariants`
checks that they equal the union of the tree's node values.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["HeldIndices"]


class HeldIndices:
    """A flag per KV index ``0..max_index``: set while a tree node holds the index.

    On the CPU the flags are a numpy array (a gather or scatter of a few hundred indices costs about a
    microsecond, a tenth of torch's dispatch); on a device they are a bool tensor there, so marking stays
    asynchronous (only :meth:`any_held`, a yes/no answer, syncs). Every method is O(k) in the indices it
    takes, except :meth:`held_indices` (O(max_index), for invariant checks).
    """

    def __init__(self, max_index: int, device: torch.device) -> None:
        self.device = device
        self._on_host = device.type == "cpu"
        if self._on_host:
            self._flags_np = np.zeros(max_index + 1, dtype=np.bool_)
        else:
            self._flags_t = torch.zeros(max_index + 1, dtype=torch.bool, device=device)

    def hold(self, indices: torch.Tensor) -> None:
        """Mark ``indices`` (a 1-D int64 tensor of in-range indices) as the tree's. O(k)."""
        if self._on_host:
            self._flags_np[indices.numpy()] = True
        else:
            self._flags_t[indices] = True

    def release(self, indices: torch.Tensor) -> None:
        """Clear the marks of ``indices`` (the tree gave them up). O(k)."""
        if self._on_host:
            self._flags_np[indices.numpy()] = False
        else:
            self._flags_t[indices] = False

    def any_held(self, indices: torch.Tensor) -> bool:
        """Whether any of ``indices`` (in range) is the tree's. O(k); one host sync on a device."""
        if self._on_host:
            return bool(self._flags_np[indices.numpy()].any())
        return bool(self._flags_t[indices].any())

    def first_held(self, indices: torch.Tensor) -> int | None:
        """The position in ``indices`` of the first one the tree holds, or ``None``. O(k); for messages."""
        mask = self._flags_np[indices.numpy()] if self._on_host else self._flags_t[indices].cpu().numpy()
        hits = np.flatnonzero(mask)
        return int(hits[0]) if hits.size else None

    def held_indices(self) -> torch.Tensor:
        """Every held index, ascending (int64, on the device). O(max_index)."""
        if self._on_host:
            return torch.from_numpy(np.flatnonzero(self._flags_np).astype(np.int64))
        return torch.nonzero(self._flags_t).flatten()
