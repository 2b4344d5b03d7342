"""Fast state stamps for the engine: the bytes of :mod:`mamba_radix.state_stamp`'s layout, written and
checked at a fraction of the cost on the simulator's hot path.

The engine stamps a slot at every prefill chunk end, track point and decode event, and checks the live
slot before each chunk and event. The fingerprints come from
:class:`~mamba_radix.state_stamp.PrefixFingerprints` (every prefix of a request's tokens, hashed once,
vectorised; re-exported here for the simulator's and the policies' imports). The reference
:func:`~mamba_radix.state_stamp.write_stamp` writes through a chain of torch views (tens of microseconds
per call); :class:`StampIO` writes and checks through numpy views of the same rows
(:func:`~mamba_radix.state_stamp.stamp_rows`) of a CPU pool (a few microseconds), byte for byte what
``write_stamp`` writes, so :func:`~mamba_radix.state_stamp.read_stamp` reads them back. If the pool
replaces a tensor, the views are rebuilt (identity check on every call).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.state_stamp import (
    STAMP_BYTES,
    check_slot,
    check_stamp,
    stamp_rows,
    state_tensors,
)

__all__ = ["StampIO"]


class StampIO:
    """Write and check state stamps in a CPU :class:`~mamba_radix.pools.MambaPool` (or anything with
    ``conv`` and ``temporal`` tensors), in the layout of :mod:`mamba_radix.state_stamp`: the first
    :data:`~mamba_radix.state_stamp.STAMP_BYTES` bytes of every layer's row of every state tensor with at
    least that many bytes per slot hold ``int64[fingerprint, num_tokens]``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._sources: list[torch.Tensor] = []
        self._views: list[np.ndarray] = []
        self._refresh()

    def _refresh(self) -> None:
        """Rebuild the byte views if the pool's tensors are not the ones they were made from. O(tensors);
        :class:`InvalidArgument` for a pool without conv and temporal tensors, off the CPU, or without a
        tensor large enough for a stamp."""
        sources = state_tensors(self.pool)
        if len(sources) == len(self._sources) and all(
            a is b for a, b in zip(sources, self._sources, strict=True)
        ):
            return
        rows = stamp_rows(sources)
        if any(r.device.type != "cpu" for r in rows):
            raise InvalidArgument("StampIO works on CPU pools; use mamba_radix.state_stamp on a device")
        self._sources, self._views = sources, [r.numpy() for r in rows]  # numpy views sharing memory
        self._num_slots = int(rows[0].shape[1])

    @staticmethod
    def _payload(fp: int, num_tokens: int) -> np.ndarray:
        return np.array([fp, num_tokens], dtype=np.int64).view(np.uint8)

    def _checked(self, slot: int, fp: int, num_tokens: int) -> tuple[int, np.ndarray]:
        """Validate the arguments (InvalidArgument, nothing written) and build the payload. O(1).
        The fast path (a Python int slot in range, values in int64) costs two comparisons."""
        self._refresh()
        if not (type(slot) is int and 0 <= slot < self._num_slots):
            slot = check_slot(slot, self._num_slots)
        if not (type(fp) is int and type(num_tokens) is int and 0 <= fp < 2**63 and 0 <= num_tokens < 2**63):
            fp, num_tokens = check_stamp(fp, num_tokens)
        return slot, self._payload(fp, num_tokens)

    def write(self, slot: int, fp: int, num_tokens: int) -> None:
        """Stamp ``slot`` with ``(fp, num_tokens)`` in every layer of every stamped tensor. O(layers).
        Raises :class:`InvalidArgument` (nothing written) for a slot outside the pool or values outside
        ``0..2**63-1``."""
        slot, payload = self._checked(slot, fp, num_tokens)
        for view in self._views:
            view[:, slot, :STAMP_BYTES] = payload

    def holds(self, slot: int, fp: int, num_tokens: int) -> bool:
        """Whether every layer of every stamped tensor of ``slot`` holds ``(fp, num_tokens)``. O(layers)."""
        slot, payload = self._checked(slot, fp, num_tokens)
        return all(bool((view[:, slot, :STAMP_BYTES] == payload).all()) for view in self._views)
