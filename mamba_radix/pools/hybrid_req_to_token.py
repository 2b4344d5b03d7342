"""Request rows plus the state slots each running request holds (``reference/sglang-semantics.md`` §6.2).

A running request of a hybrid model holds a row of ``req_to_token`` (full-attention KV), a live state slot
(``req.mamba_pool_idx``, the recurrent state at ``kv_len``) and, under ``extra_buffer``, a ping-pong track
buffer of ``P`` slots (``req.mamba_ping_pong_track_buffer``) that prefill/decode checkpoints are written
into and then donated to the tree:

- eager ``extra_buffer``: ``P = 2`` with overlap scheduling (the GPU writes one entry while the CPU
  donates the other), ``P = 1`` without; ``mamba_next_track_idx`` flips after each checkpoint;
- ``extra_buffer_lazy``: two entries, but only one is held; the second is borrowed at a decode boundary
  (:meth:`lazy_alloc_boundary_slot`) and the old one released after it (:meth:`lazy_release_old_slot`);
- ``no_buffer``: no track buffer.

Admission (:meth:`alloc`) is transactional, unlike SGLang (#34676): every row and slot of the batch is
counted first and, if any is short, nothing is taken and ``None`` is returned.

Device mappings for kernels, per request row: ``req_index_to_mamba_index_mapping[row]`` (live slot, 0 =
none, the padding sink) and ``req_index_to_mamba_ping_pong_track_buffer_mapping[row]`` (track slots, -1 =
none). A host mirror of both keeps :meth:`num_reserved_slots` O(1) and every update O(P) per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools.mamba_pool import MambaPool
from mamba_radix.pools.req_to_token import ReqToTokenPool
from mamba_radix.request import Req

__all__ = ["HybridReqToTokenPool"]

NO_SLOT = -1  # an empty ping-pong entry (lazy second entry, or a row without a request)


class HybridReqToTokenPool(ReqToTokenPool):
    """``size`` request rows, each mapped to the state slots of ``mamba_pool`` its request holds."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        mamba_pool: MambaPool,
        config: CacheConfig,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(size, max_context_len, device)
        if not isinstance(mamba_pool, MambaPool):
            raise InvalidArgument(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        if not isinstance(config, CacheConfig):
            raise InvalidArgument(f"config must be a CacheConfig, got {type(config).__name__}")
        if mamba_pool.device != self.device:
            raise InvalidArgument(
                f"mamba_pool lives on {mamba_pool.device} but the request pool on {self.device}; "
                "create both on the same device"
            )
        self.mamba_pool = mamba_pool
        self.config = config
        self.ping_pong_size = config.ping_pong_size  # P: 0 (no_buffer), 1 or 2
        self.is_lazy = config.is_lazy
        width = max(self.ping_pong_size, 1)
        self.req_index_to_mamba_index_mapping = torch.zeros(size + 1, dtype=torch.int64, device=self.device)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.full(
            (size + 1, width), NO_SLOT, dtype=torch.int64, device=self.device
        )
        self._reset_mirror()

    def _reset_mirror(self) -> None:
        width = max(self.ping_pong_size, 1)
        self._row_live = [0] * (self.size + 1)
        self._row_track = [[NO_SLOT] * width for _ in range(self.size + 1)]
        self._num_reserved = 0

    # ----------------------------------------------------------------------------------------- sizes
    def num_reserved_slots(self) -> int:
        """State slots held by admitted requests (live + track slots of every held row). O(1)."""
        return self._num_reserved

    def reserved_slots(self) -> list[int]:
        """Every slot held by admitted requests, ascending. O(size * P): for conservation checks."""
        held = [s for s in self._row_live if s > 0]
        held += [s for track in self._row_track for s in track if s > 0]
        return sorted(held)

    # ------------------------------------------------------------------------------------- admission
    def alloc(self, reqs: list[Req]) -> list[int] | None:  # type: ignore[override]
        """Admit ``reqs``: a row for each request without one, a live slot for each request without one
        (a slot already set, e.g. by a copy-on-write hit, is kept), and a track buffer for each request
        without one (``P`` slots eager; lazy: one slot and a ``-1`` entry, ``mamba_next_track_idx = 0``).

        Transactional: if rows or slots are short, returns ``None`` and nothing is taken or changed.
        Returns the rows of ``reqs`` in order. Raises :class:`InvalidArgument` / :class:`InvalidIndex`
        (nothing changed) for a request given twice or holding a row or slot that is not allocated.
        O(len(reqs) * P).
        """
        self._check_admission(reqs)
        need_rows = sum(1 for r in reqs if r.req_pool_idx is None)
        need_live = sum(1 for r in reqs if r.mamba_pool_idx is None)
        track_per_req = self._track_slots_to_take()
        need_track = sum(track_per_req for r in reqs if self._needs_track_buffer(r))
        need_slots = need_live + need_track
        if need_rows > self.available_size() or need_slots > self.mamba_pool.available_size():
            return None
        rows = self._take_rows(need_rows)
        slots = self.mamba_pool.alloc(need_slots)
        assert rows is not None and slots is not None  # both counted above
        new_rows = iter(rows)
        new_slots = iter(slots.tolist())
        for req in reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = next(new_rows)
            if req.mamba_pool_idx is None:
                req.mamba_pool_idx = next(new_slots)
            if self._needs_track_buffer(req):
                taken = [next(new_slots) for _ in range(track_per_req)]
                req.mamba_ping_pong_track_buffer = taken + [NO_SLOT] * (self.ping_pong_size - track_per_req)
                req.mamba_next_track_idx = 0
            self._attach(req.req_pool_idx, req)
        return [r.req_pool_idx for r in reqs]  # type: ignore[misc]

    def _track_slots_to_take(self) -> int:
        if self.ping_pong_size == 0:
            return 0
        return 1 if self.is_lazy else self.ping_pong_size

    def _needs_track_buffer(self, req: Req) -> bool:
        return self.ping_pong_size > 0 and req.mamba_ping_pong_track_buffer is None

    def _check_admission(self, reqs: Sequence[Req]) -> None:
        if len({id(r) for r in reqs}) != len(reqs):
            raise InvalidArgument("alloc got the same request twice; pass each request once")
        for req in reqs:
            if not isinstance(req, Req):
                raise InvalidArgument(f"alloc takes Req objects, got {type(req).__name__}")
            if req.req_pool_idx is not None and not self.is_row_allocated(req.req_pool_idx):
                raise InvalidIndex(
                    f"request {req.rid!r} carries row {req.req_pool_idx}, which is not allocated; "
                    "set req.req_pool_idx = None for a new request"
                )
            held = self._slots_of(req)
            if held:
                self.mamba_pool.check_allocated(held)
            buffer = req.mamba_ping_pong_track_buffer
            if buffer is not None and len(buffer) != self.ping_pong_size:
                raise InvalidArgument(
                    f"request {req.rid!r} has a track buffer of {len(buffer)} entries; this pool uses "
                    f"{self.ping_pong_size} (config strategy {self.config.strategy})"
                )

    @staticmethod
    def _slots_of(req: Req) -> list[int]:
        """The state slots ``req`` holds: live slot and non-empty track entries."""
        held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
        held += [s for s in (req.mamba_ping_pong_track_buffer or []) if s != NO_SLOT]
        return held

    # --------------------------------------------------------------------------------------- release
    def free(self, req: Req | int | Sequence[int]) -> None:  # type: ignore[override]
        """Free the request row only (``req.req_pool_idx`` becomes ``None``). O(1) per row.

        The request must have released its state slots first (:meth:`free_mamba_cache`), otherwise they
        would leak from the accounting: raises :class:`InvalidArgument` and frees nothing. Rows given as
        ints follow the same rule.
        """
        if isinstance(req, Req):
            if req.req_pool_idx is None:
                raise InvalidIndex(f"request {req.rid!r} holds no row (already freed, or never admitted)")
            if self._slots_of(req):
                raise InvalidArgument(
                    f"request {req.rid!r} still holds state slots {self._slots_of(req)}; "
                    "call free_mamba_cache(req) before free(req)"
                )
            rows = [req.req_pool_idx]
        else:
            rows = [req] if isinstance(req, int) else list(req)
        for row in rows:
            if isinstance(row, int) and 0 < row <= self.size and self._row_slot_count(row):
                raise InvalidArgument(
                    f"request row {row} still maps to state slots; call free_mamba_cache first"
                )
        super().free(rows)
        if isinstance(req, Req):
            req.req_pool_idx = None

    def free_mamba_cache(self, req: Req, keep: int | None = None) -> None:
        """Free the live slot and the track slots of ``req`` except ``keep`` (skipping ``-1`` entries),
        then clear ``req.mamba_pool_idx``, ``req.mamba_ping_pong_track_buffer`` and
        ``req.mamba_next_track_idx``. ``keep`` (a slot donated to the tree) must be one of them.

        Raises :class:`InvalidArgument` / :class:`InvalidIndex` and changes nothing otherwise. O(P).
        """
        held = self._slots_of(req)
        if keep is not None:
            if keep not in held:
                raise InvalidArgument(
                    f"keep={keep} is not a slot of request {req.rid!r} (it holds {held}); "
                    "pass the live slot or a track slot, or None"
                )
            held.remove(keep)
        self.mamba_pool.free(held)
        req.mamba_pool_idx = None
        req.mamba_ping_pong_track_buffer = None
        req.mamba_next_track_idx = 0
        if req.req_pool_idx is not None and self.is_row_allocated(req.req_pool_idx):
            self._attach(req.req_pool_idx, req)

    # ------------------------------------------------------------------------------------- ping-pong
    def ping_pong_other_idx(self, i: int) -> int:
        """The other entry of a ping-pong buffer: ``1 - i`` when ``P == 2``, else ``i``."""
        if not 0 <= i < max(self.ping_pong_size, 1):
            raise InvalidArgument(f"ping-pong entry {i} is out of range for P = {self.ping_pong_size}")
        return 1 - i if self.ping_pong_size == 2 else i

    def ping_pong_keep_idx(self, req: Req) -> int:
        """The entry holding the newest checkpoint: lazy ``next_track_idx``; eager the other one."""
        if self.is_lazy:
            return req.mamba_next_track_idx
        return self.ping_pong_other_idx(req.mamba_next_track_idx)

    def donate_ping_pong_slot(self, req: Req, new_slot: int) -> int:
        """Give away the keep entry's slot (returned) and put ``new_slot`` (allocated by the caller) in its
        place. The number of slots the request holds is unchanged. O(1)."""
        buffer = self._track_buffer(req)
        keep_idx = self.ping_pong_keep_idx(req)
        donated = buffer[keep_idx]
        if donated == NO_SLOT:
            raise InvalidArgument(f"request {req.rid!r} has no slot in ping-pong entry {keep_idx} to donate")
        self.mamba_pool.check_allocated(new_slot)
        if new_slot in self._slots_of(req):
            raise InvalidArgument(
                f"slot {new_slot} is already held by request {req.rid!r}; pass a fresh slot"
            )
        buffer[keep_idx] = new_slot
        self._sync_row(req)
        return donated

    def lazy_alloc_boundary_slot(self, req: Req) -> bool:
        """Lazy only: at a decode boundary, borrow a slot into the empty entry and point
        ``next_track_idx`` at it. Returns ``False`` (nothing changed) if no slot is free; ``True`` after a
        borrow, or at once when the second entry is still held (its old slot not released yet)."""
        buffer = self._lazy_buffer(req)
        other = self.ping_pong_other_idx(req.mamba_next_track_idx)
        if buffer[other] != NO_SLOT:
            return True
        slots = self.mamba_pool.alloc(1)
        if slots is None:
            return False
        buffer[other] = int(slots[0])
        req.mamba_next_track_idx = other
        self._sync_row(req)
        return True

    def lazy_release_old_slot(self, req: Req) -> None:
        """Lazy only: after a boundary, free the entry ``next_track_idx`` does not point at (to ``-1``)."""
        buffer = self._lazy_buffer(req)
        old = self.ping_pong_other_idx(req.mamba_next_track_idx)
        if buffer[old] == NO_SLOT:
            return
        self.mamba_pool.free([buffer[old]])
        buffer[old] = NO_SLOT
        self._sync_row(req)

    def _track_buffer(self, req: Req) -> list[int]:
        if self.ping_pong_size == 0 or req.mamba_ping_pong_track_buffer is None:
            raise InvalidArgument(
                f"request {req.rid!r} has no ping-pong track buffer (strategy {self.config.strategy})"
            )
        return req.mamba_ping_pong_track_buffer

    def _lazy_buffer(self, req: Req) -> list[int]:
        if not self.is_lazy:
            raise InvalidArgument(
                f"lazy boundary slots need --mamba-radix-cache-strategy extra_buffer_lazy "
                f"(this pool runs {self.config.strategy})"
            )
        return self._track_buffer(req)

    # -------------------------------------------------------------------------------- row bookkeeping
    def _row_slot_count(self, row: int) -> int:
        return (self._row_live[row] > 0) + sum(1 for s in self._row_track[row] if s > 0)

    def _sync_row(self, req: Req) -> None:
        if req.req_pool_idx is not None and self.is_row_allocated(req.req_pool_idx):
            self._attach(req.req_pool_idx, req)

    def _attach(self, row: int, req: Req) -> None:
        """Make ``row``'s mirror and device mappings show ``req``'s current slots. O(P)."""
        live = req.mamba_pool_idx or 0
        width = max(self.ping_pong_size, 1)
        track = list(req.mamba_ping_pong_track_buffer or [NO_SLOT] * width)
        self._num_reserved -= self._row_slot_count(row)
        self._row_live[row] = live
        self._row_track[row] = track
        self._num_reserved += self._row_slot_count(row)
        self.req_index_to_mamba_index_mapping[row] = live
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[row] = torch.tensor(track, dtype=torch.int64)

    def clear(self) -> None:
        """Free every row and reset the mappings and the whole state pool (every slot free)."""
        super().clear()
        self._reset_mirror()
        self.req_index_to_mamba_index_mapping.zero_()
        self.req_index_to_mamba_ping_pong_track_buffer_mapping.fill_(NO_SLOT)
        self.mamba_pool.reset()
