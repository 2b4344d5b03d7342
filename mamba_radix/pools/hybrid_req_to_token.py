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

Admission (:meth:`alloc`) is transactional, unlike SGLang (#34676): every request of the batch is
validated and every row and slot counted first; if any is short, or an allocation fails anyway (an
injected fault), nothing is taken and ``None`` is returned, and an allocation that raises leaves the pool
as it was.

Ownership: the pool knows which request holds each row and which row holds each state slot (live and
ping-pong slots of running requests), so it refuses a request carrying another request's row or slots,
and :meth:`slot_holder` / :meth:`is_slot_held` let the cache refuse "insert a running request's slot" in
O(1). :meth:`release_slot` ends a running request's hold on its live slot without freeing it (the slot
changes owner, e.g. to the tree, in SGLang's insert-the-live-slot call form) and :meth:`reclaim_slot`
undoes that; :meth:`audit` checks the record against itself, the device mappings and the state pool. The record is kept up to date by every call here; a caller that rewrites ``req.mamba_pool_idx`` or
the track buffer of a running request behind the pool's back makes it stale (and is refused later).

Device mappings for kernels, per request row: ``req_index_to_mamba_index_mapping[row]`` (live slot, 0 =
none, the padding sink) and ``req_index_to_mamba_ping_pong_track_buffer_mapping[row]`` (track slots, -1 =
none). A host mirror of both keeps :meth:`num_reserved_slots` O(1) and every update O(P) per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex, InvariantError
from mamba_radix.pools._indices import check_slot_int
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
        if not isinstance(mamba_pool, MambaPool):
            raise InvalidArgument(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        if not isinstance(config, CacheConfig):
            raise InvalidArgument(f"config must be a CacheConfig, got {type(config).__name__}")
        super().__init__(size, max_context_len, device)
        if mamba_pool.device != self.device:
            raise InvalidArgument(
                f"mamba_pool lives on {mamba_pool.device} but the request pool on {self.device}; "
                "create both on the same device"
            )
        self.mamba_pool = mamba_pool
        self.config = config
        self.ping_pong_size = config.ping_pong_size  # P: 0 (no_buffer), 1 or 2
        self.is_lazy = config.is_lazy
        width = self._track_width = max(self.ping_pong_size, 1)
        self.req_index_to_mamba_index_mapping = torch.zeros(size + 1, dtype=torch.int64, device=self.device)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.full(
            (size + 1, width), NO_SLOT, dtype=torch.int64, device=self.device
        )
        # CPU pools update the mappings through numpy views of the same memory: a row write is ~0.2 us
        # where a torch __setitem__ costs ~10 us, and admission/release write two rows per request.
        self._live_np = self._track_np = None
        if self.device.type == "cpu":
            self._live_np = self.req_index_to_mamba_index_mapping.numpy()
            self._track_np = self.req_index_to_mamba_ping_pong_track_buffer_mapping.numpy()
        self._reset_mirror()

    def _reset_mirror(self) -> None:
        width = max(self.ping_pong_size, 1)
        self._row_live = [0] * (self.size + 1)
        self._row_track = [[NO_SLOT] * width for _ in range(self.size + 1)]
        self._num_reserved = 0
        self._row_req: list[Req | None] = [None] * (self.size + 1)  # row -> the request holding it
        self._slot_row: dict[int, int] = {}  # state slot -> row of the running request holding it

    # ----------------------------------------------------------------------------------------- sizes
    def num_reserved_slots(self) -> int:
        """State slots held by admitted requests (live + track slots of every held row). O(1)."""
        return self._num_reserved

    def reserved_slots(self) -> list[int]:
        """Every slot held by admitted requests, ascending. O(size * P): for conservation checks."""
        held = [s for s in self._row_live if s > 0]
        held += [s for track in self._row_track for s in track if s > 0]
        return sorted(held)

    # ------------------------------------------------------------------------------------- ownership
    def slot_holder(self, slot: int) -> Req | None:
        """The running request holding state slot ``slot`` (its live slot or a ping-pong entry), or
        ``None``. O(1), no tensor touched: the cache's test for "this slot belongs to a running request"."""
        row = self._slot_row.get(slot)
        return None if row is None else self._row_req[row]

    def is_slot_held(self, slot: int) -> bool:
        """Whether a running request holds ``slot`` (live or ping-pong). O(1)."""
        return slot in self._slot_row

    def row_holder(self, row: int) -> Req | None:
        """The request holding request row ``row``, or ``None`` (a free row, or one taken without a
        request through :meth:`ReqToTokenPool.alloc`). O(1)."""
        return self._row_req[row] if type(row) is int and 0 < row <= self.size else None

    # ------------------------------------------------------------------------------------- admission
    def alloc(self, reqs: list[Req], check: bool = True) -> list[int] | None:  # type: ignore[override]
        """Admit ``reqs``: a row for each request without one, a live slot for each request without one
        (a slot already set, e.g. by a copy-on-write hit, is kept), and a track buffer for each request
        without one (``P`` slots eager; lazy: one slot and a ``-1`` entry, ``mamba_next_track_idx = 0``).

        Transactional: every request is validated, then rows and slots are counted; if any is short, or
        an allocation returns ``None`` anyway, nothing is taken or changed and ``None`` is returned; an
        allocation that raises propagates with nothing taken. Returns the rows of ``reqs`` in order.

        Raises :class:`InvalidArgument` / :class:`InvalidIndex` (nothing changed) for anything but a list
        of requests, a request given twice, a row or slot of the wrong type, not allocated, or held by
        another request, a slot repeated within the batch, or a malformed track buffer.
        O(len(reqs) * P).

        ``check=False`` is for the cache's admission, which validated its one fresh request (no row, no
        track buffer, an int ``mamba_next_track_idx``) and gave it, at most, a live slot it had just
        allocated itself: the batch checks are skipped; counting, allocation and commit are the same.
        """
        if check:
            reqs = self._check_admission(reqs)
        track_per_req = self._track_slots_to_take()
        need_rows = need_live = need_track = 0
        for r in reqs:
            need_rows += r.req_pool_idx is None
            need_live += r.mamba_pool_idx is None
            need_track += track_per_req if self._needs_track_buffer(r) else 0
        need_slots = need_live + need_track
        if need_rows > self.available_size() or need_slots > self.mamba_pool.available_size():
            return None
        rows: list[int] = []
        if need_rows:
            taken = self._take_rows(need_rows)
            if taken is None:
                return None
            rows = taken
        new_slots: list[int] = []
        if need_slots:
            try:
                slots = self.mamba_pool.alloc(need_slots, as_list=True)
            except BaseException:
                self._undo_take_rows(rows)
                raise
            if slots is None:
                self._undo_take_rows(rows)
                return None
            new_slots = slots
        # Commit: plain assignments from here on; nothing below can be refused.
        row_iter, slot_iter = iter(rows), iter(new_slots)
        for req in reqs:
            if req.req_pool_idx is None:
                req.req_pool_idx = next(row_iter)
            if req.mamba_pool_idx is None:
                req.mamba_pool_idx = next(slot_iter)
            if self._needs_track_buffer(req):
                taken_track = [next(slot_iter) for _ in range(track_per_req)]
                req.mamba_ping_pong_track_buffer = taken_track + [NO_SLOT] * (
                    self.ping_pong_size - track_per_req
                )
                req.mamba_next_track_idx = 0
            self._attach(req.req_pool_idx, req)
        return [r.req_pool_idx for r in reqs]  # type: ignore[misc]

    def _track_slots_to_take(self) -> int:
        return self.config.slot_budget.track_slots_held

    def _needs_track_buffer(self, req: Req) -> bool:
        return self.ping_pong_size > 0 and req.mamba_ping_pong_track_buffer is None

    def _check_admission(self, reqs: object) -> list[Req]:
        """Validate a batch for :meth:`alloc`; return it as a list. O(len(reqs) * P), no side effects."""
        if not isinstance(reqs, (list, tuple)):
            raise InvalidArgument(
                f"alloc takes a list of Req objects, got {type(reqs).__name__}; wrap one request as [req]"
            )
        seen_reqs: set[int] = set()
        seen_slots: dict[int, object] = {}
        for req in reqs:
            if not isinstance(req, Req):
                raise InvalidArgument(f"alloc takes Req objects, got {type(req).__name__}")
            if id(req) in seen_reqs:
                raise InvalidArgument("alloc got the same request twice; pass each request once")
            seen_reqs.add(id(req))
            row = req.req_pool_idx
            if row is not None:
                if type(row) is not int:
                    raise InvalidArgument(
                        f"request {req.rid!r} has req_pool_idx {row!r}; it must be an int row or None"
                    )
                if not self.is_row_allocated(row):
                    raise InvalidIndex(
                        f"request {req.rid!r} carries row {row}, which is not allocated; "
                        "set req.req_pool_idx = None for a new request"
                    )
                holder = self._row_req[row]
                if holder is not None and holder is not req:
                    raise InvalidArgument(
                        f"request {req.rid!r} carries row {row}, which request {holder.rid!r} holds; "
                        "a new request must come with req_pool_idx = None"
                    )
            for slot in self._checked_slots_of(req):
                if slot in seen_slots:
                    raise InvalidArgument(
                        f"state slot {slot} is given twice in one admission (request {req.rid!r} and "
                        f"request {seen_slots[slot]!r}); each slot belongs to one request, once"
                    )
                seen_slots[slot] = req.rid
                self._check_slot_free_or_own(slot, req)
        return list(reqs)

    def _checked_slots_of(self, req: Req) -> list[int]:
        """The slots ``req`` carries, type- and shape-checked (not yet ownership-checked). O(P)."""
        held: list[int] = []
        live = req.mamba_pool_idx
        if live is not None:
            if type(live) is not int:
                raise InvalidArgument(
                    f"request {req.rid!r} has mamba_pool_idx {live!r}; it must be an int slot or None"
                )
            held.append(live)
        buffer = req.mamba_ping_pong_track_buffer
        if buffer is not None:
            if not isinstance(buffer, list) or any(type(s) is not int for s in buffer):
                raise InvalidArgument(
                    f"request {req.rid!r} has mamba_ping_pong_track_buffer {buffer!r:.80}; it must be a "
                    "list of int slots (-1 for an empty entry) or None"
                )
            if len(buffer) != self.ping_pong_size:
                raise InvalidArgument(
                    f"request {req.rid!r} has a track buffer of {len(buffer)} entries; this pool uses "
                    f"{self.ping_pong_size} (config strategy {self.config.strategy})"
                )
            nxt = req.mamba_next_track_idx
            if type(nxt) is not int or not 0 <= nxt < len(buffer):
                raise InvalidArgument(
                    f"request {req.rid!r} has mamba_next_track_idx {nxt!r}; it must be an int entry of its "
                    f"track buffer, 0..{len(buffer) - 1}"
                )
            held += [s for s in buffer if s != NO_SLOT]
        elif type(req.mamba_next_track_idx) is not int:
            raise InvalidArgument(
                f"request {req.rid!r} has mamba_next_track_idx {req.mamba_next_track_idx!r}; it must be an int"
            )
        return held

    def _check_slot_free_or_own(self, slot: int, req: Req) -> None:
        """``slot`` must be allocated and held by no running request other than ``req``. O(1)."""
        if not self.mamba_pool.is_slot_allocated(slot):
            raise InvalidIndex(
                f"state slot {slot} of request {req.rid!r} is not allocated; a request may carry only "
                "slots taken from this pool's MambaPool"
            )
        row = self._slot_row.get(slot)
        if row is not None and not (row == req.req_pool_idx and self._row_req[row] is req):
            holder = self._row_req[row]
            raise InvalidArgument(
                f"state slot {slot} carried by request {req.rid!r} is held by running request "
                f"{getattr(holder, 'rid', None)!r} (row {row}); pass a slot of its own"
            )

    def _check_holder(self, req: object, verb: str) -> Req:
        """``req`` must be a request this pool admitted, holding exactly the slots it records. O(P)."""
        if not isinstance(req, Req):
            raise InvalidArgument(f"{verb} takes a Req, got {type(req).__name__}")
        row = req.req_pool_idx
        held = self._checked_slots_of(req)
        if row is None or type(row) is not int or not 0 < row <= self.size or self._row_req[row] is not req:
            if not held:
                return req
            raise InvalidArgument(
                f"request {req.rid!r} (row {row!r}) was not admitted by this pool, but carries state slots "
                f"{held}; {verb} only requests this pool admitted"
            )
        for slot in held:
            if self._slot_row.get(slot) != row:
                raise InvalidArgument(
                    f"request {req.rid!r} carries state slot {slot}, which the pool does not record as its "
                    "own (its slots were changed outside the pool); use the pool's calls to change them"
                )
        return req

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
        ints follow the same rule. A request must be the one holding its row.
        """
        if isinstance(req, Req):
            if req.req_pool_idx is None:
                raise InvalidIndex(f"request {req.rid!r} holds no row (already freed, or never admitted)")
            if self._slots_of(req):
                raise InvalidArgument(
                    f"request {req.rid!r} still holds state slots {self._slots_of(req)}; "
                    "call free_mamba_cache(req) before free(req)"
                )
            row = req.req_pool_idx
            holder = self.row_holder(row) if type(row) is int else None
            if holder is not None and holder is not req:
                raise InvalidArgument(
                    f"request {req.rid!r} carries row {row}, but request {holder.rid!r} holds it; "
                    "free only a request's own row"
                )
            rows = [row]
        else:
            rows = self._row_list(req)
        for row in rows:
            if type(row) is int and 0 < row <= self.size and self._row_slot_count(row):
                raise InvalidArgument(
                    f"request row {row} still maps to state slots; call free_mamba_cache first"
                )
        super().free(rows)
        for row in rows:
            self._row_req[row] = None
        if isinstance(req, Req):
            req.req_pool_idx = None

    def free_mamba_cache(self, req: Req, keep: int | None = None, check: bool = True) -> None:
        """Free the live slot and the track slots of ``req`` except ``keep`` (skipping ``-1`` entries),
        then clear ``req.mamba_pool_idx``, ``req.mamba_ping_pong_track_buffer`` and
        ``req.mamba_next_track_idx``. ``keep`` (a slot donated to the tree) must be one of them.

        Raises :class:`InvalidArgument` / :class:`InvalidIndex` and changes nothing otherwise, or when
        ``req`` carries slots the pool does not record as its own. O(P). ``check=False`` is for the
        cache's lifecycle, which validated ``req``: the holder check is skipped and the slots freed
        trusted.
        """
        if check:
            self._check_holder(req, "free_mamba_cache")
        held = self._slots_of(req)
        if keep is not None:
            if type(keep) is not int or keep not in held:
                raise InvalidArgument(
                    f"keep={keep!r} is not a slot of request {req.rid!r} (it holds {held}); "
                    "pass the live slot or a track slot, or None"
                )
            held.remove(keep)
        self.mamba_pool.free(held, check)
        req.mamba_pool_idx = None
        req.mamba_ping_pong_track_buffer = None
        req.mamba_next_track_idx = 0
        self._sync_row(req)

    # ------------------------------------------------------------------------------------- hand-over
    def release_slot(self, req: Req, slot: int) -> None:
        """End running ``req``'s hold on its live slot ``slot`` without freeing it: ``req.mamba_pool_idx``
        becomes ``None``, the row's live mapping 0, and the slot leaves the owner record and
        :meth:`num_reserved_slots`, while it stays allocated in the state pool for its new owner (the tree,
        in SGLang's "insert the live slot, then forget it" form). The request keeps its row and track
        buffer. :meth:`reclaim_slot` is the undo.

        Only the live slot: a track slot changes owner through :meth:`donate_ping_pong_slot` (which puts a
        fresh slot in its place) or ``free_mamba_cache(keep=...)``. Raises :class:`InvalidArgument` (nothing
        changed) when ``req`` is not a request this pool admitted, carries slots the pool does not record
        as its own, or ``slot`` is not an int equal to its live slot. O(P) for the checks, O(1) to commit.
        """
        self._check_admitted(req, "release_slot")
        slot = check_slot_int(slot, "slot")
        if req.mamba_pool_idx != slot:
            where = (
                "a slot of its track buffer; hand it over with donate_ping_pong_slot or "
                "free_mamba_cache(req, keep=slot)"
                if slot in (req.mamba_ping_pong_track_buffer or ())
                else "not one of its slots"
            )
            raise InvalidArgument(
                f"release_slot: state slot {slot} is {where} (request {req.rid!r} has live slot "
                f"{req.mamba_pool_idx!r})"
            )
        row = req.req_pool_idx
        assert row is not None  # _check_admitted
        req.mamba_pool_idx = None
        self._set_live(row, 0, slot)

    def reclaim_slot(self, req: Req, slot: int) -> None:
        """Undo :meth:`release_slot`: running ``req`` takes ``slot`` back as its live slot (the pool's
        record, mapping and :meth:`num_reserved_slots` count it again). The caller vouches that no other
        owner (the tree) keeps ``slot``: the pool cannot see the tree, so it checks only that the slot is
        allocated and held by no running request.

        Raises :class:`InvalidArgument` / :class:`InvalidIndex` (nothing changed) when ``req`` is not a
        request this pool admitted, already holds a live slot, or ``slot`` is not an int, not allocated in
        the state pool, or held by a running request. O(P) for the checks, O(1) to commit.
        """
        self._check_admitted(req, "reclaim_slot")
        slot = check_slot_int(slot, "slot")
        if req.mamba_pool_idx is not None:
            raise InvalidArgument(
                f"reclaim_slot: request {req.rid!r} already holds live slot {req.mamba_pool_idx}; a request "
                "holds one live slot"
            )
        if not self.mamba_pool.is_slot_allocated(slot):
            raise InvalidIndex(f"reclaim_slot: state slot {slot} is not allocated in this pool's MambaPool")
        holder = self.slot_holder(slot)
        if holder is not None:
            raise InvalidArgument(
                f"reclaim_slot: state slot {slot} is held by running request {holder.rid!r}"
            )
        row = req.req_pool_idx
        assert row is not None  # _check_admitted
        req.mamba_pool_idx = slot
        self._set_live(row, slot, 0)

    def _check_admitted(self, req: object, verb: str) -> None:
        """``req`` must hold a row of this pool and exactly the slots the pool records. O(P)."""
        self._check_holder(req, verb)
        row = req.req_pool_idx  # type: ignore[attr-defined]
        if row is None or type(row) is not int or not 0 < row <= self.size or self._row_req[row] is not req:
            raise InvalidArgument(
                f"{verb}: request {req.rid!r} (row {row!r}) was not admitted by this pool"  # type: ignore[attr-defined]
            )

    def _set_live(self, row: int, live: int, released: int) -> None:
        """Point ``row``'s live entry at ``live`` (0: none) in the mirror, owner record and mapping,
        ``released`` (0: none) being the slot it held. O(1)."""
        if released > 0:
            self._slot_row.pop(released, None)
            self._num_reserved -= 1
        if live > 0:
            self._slot_row[live] = row
            self._num_reserved += 1
        self._row_live[row] = live
        if self._live_np is not None:
            self._live_np[row] = live
        else:
            self.req_index_to_mamba_index_mapping[row] = live

    # ---------------------------------------------------------------------------------------- audit
    def audit(self) -> None:
        """Check the pool's own bookkeeping: the rows (:meth:`ReqToTokenPool.audit`), then the slot record.
        Each slot held by a row is held once, by an allocated row with a request, and is allocated in the
        state pool; the owner record (:meth:`slot_holder`) and :meth:`num_reserved_slots` are exactly the
        slots the rows hold; the device mappings equal the host mirror. A slot released to the tree
        (:meth:`release_slot`) is in none of these. Raises :class:`InvariantError`. O(size * P)."""
        super().audit()
        width = self._track_width
        if self._row_live[0] != 0 or self._row_track[0] != [NO_SLOT] * width or self._row_req[0] is not None:
            raise InvariantError("request row 0 (the padding row) maps to state slots or a request")
        owners: dict[int, int] = {}
        for row in range(1, self.size + 1):
            held = [s for s in (self._row_live[row], *self._row_track[row]) if s > 0]
            if not self.is_row_allocated(row) and (held or self._row_req[row] is not None):
                raise InvariantError(f"request row {row} is free but maps to state slots or a request")
            if held and self._row_req[row] is None:
                raise InvariantError(f"request row {row} maps to state slots {held} but no request holds it")
            for slot in held:
                if slot in owners:
                    raise InvariantError(f"state slot {slot} is held by rows {owners[slot]} and {row}")
                if not self.mamba_pool.is_slot_allocated(slot):
                    raise InvariantError(f"state slot {slot} of row {row} is not allocated in the state pool")
                owners[slot] = row
        if owners != self._slot_row:
            stray = sorted(set(owners.items()) ^ set(self._slot_row.items()))[:1]
            raise InvariantError(f"the slot owner record disagrees with the rows' slots (slot, row): {stray}")
        if len(owners) != self._num_reserved:
            raise InvariantError(
                f"num_reserved_slots() is {self._num_reserved}, but the rows hold {len(owners)} slots"
            )
        live = torch.tensor(self._row_live, dtype=torch.int64)
        track = torch.tensor(self._row_track, dtype=torch.int64)
        if not torch.equal(self.req_index_to_mamba_index_mapping.cpu(), live) or not torch.equal(
            self.req_index_to_mamba_ping_pong_track_buffer_mapping.cpu(), track
        ):
            raise InvariantError("the device slot mappings disagree with the pool's host record")

    # ------------------------------------------------------------------------------------- ping-pong
    def ping_pong_other_idx(self, i: int) -> int:
        """The other entry of a ping-pong buffer: ``1 - i`` when ``P == 2``, else ``i``."""
        if type(i) is not int or not 0 <= i < max(self.ping_pong_size, 1):
            raise InvalidArgument(
                f"ping-pong entry {i!r} is out of range for P = {self.ping_pong_size}; pass an int "
                f"0..{max(self.ping_pong_size, 1) - 1}"
            )
        return 1 - i if self.ping_pong_size == 2 else i

    def ping_pong_keep_idx(self, req: Req) -> int:
        """The entry holding the newest checkpoint: lazy ``next_track_idx``; eager the other one."""
        if self.is_lazy:
            return req.mamba_next_track_idx
        return self.ping_pong_other_idx(req.mamba_next_track_idx)

    def donate_ping_pong_slot(self, req: Req, new_slot: int, check: bool = True) -> int:
        """Give away the keep entry's slot (returned) and put ``new_slot`` (allocated by the caller and
        held by no running request) in its place. The number of slots the request holds is unchanged.
        Raises :class:`InvalidArgument` / :class:`InvalidIndex`, nothing changed, otherwise. O(1).

        ``check=False`` is for the cache's lifecycle, which validated ``req`` and allocated ``new_slot``
        itself: no holder or slot checks, and the mirror and mappings are updated in one entry."""
        if not check:
            buffer = req.mamba_ping_pong_track_buffer
            assert buffer is not None
            keep_idx = self.ping_pong_keep_idx(req)
            donated = buffer[keep_idx]
            if donated == NO_SLOT:
                raise InvalidArgument(
                    f"request {req.rid!r} has no slot in ping-pong entry {keep_idx} to donate"
                )
            row = req.req_pool_idx
            assert row is not None
            buffer[keep_idx] = new_slot
            self._row_track[row][keep_idx] = new_slot
            self._slot_row.pop(donated, None)
            self._slot_row[new_slot] = row
            if self._track_np is not None:
                self._track_np[row, keep_idx] = new_slot
            else:
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[row, keep_idx] = new_slot
            return donated
        self._check_holder(req, "donate_ping_pong_slot")
        buffer = self._track_buffer(req)
        keep_idx = self.ping_pong_keep_idx(req)
        donated = buffer[keep_idx]
        if donated == NO_SLOT:
            raise InvalidArgument(f"request {req.rid!r} has no slot in ping-pong entry {keep_idx} to donate")
        new_slot = check_slot_int(new_slot, "new_slot")
        if new_slot in self._slots_of(req):
            raise InvalidArgument(
                f"slot {new_slot} is already held by request {req.rid!r}; pass a fresh slot"
            )
        self._check_slot_free_or_own(new_slot, req)
        buffer[keep_idx] = new_slot
        self._sync_row(req)
        return donated

    def lazy_alloc_boundary_slot(self, req: Req) -> bool:
        """Lazy only: at a decode boundary, borrow a slot into the empty entry and point
        ``next_track_idx`` at it. Returns ``False`` (nothing changed) if no slot is free; ``True`` after a
        borrow, or at once when the second entry is still held (its old slot not released yet).
        An allocation that raises propagates with nothing changed."""
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
                f"lazy boundary slots need mamba_radix_cache_strategy='extra_buffer_lazy' "
                f"(this pool runs {self.config.strategy})"
            )
        self._check_holder(req, "a lazy boundary call")
        return self._track_buffer(req)

    # -------------------------------------------------------------------------------- row bookkeeping
    def _row_slot_count(self, row: int) -> int:
        return (self._row_live[row] > 0) + sum(1 for s in self._row_track[row] if s > 0)

    def _sync_row(self, req: Req) -> None:
        if req.req_pool_idx is not None and self.is_row_allocated(req.req_pool_idx):
            self._attach(req.req_pool_idx, req)

    def _attach(self, row: int, req: Req) -> None:
        """Make ``row``'s mirror, owner record and device mappings show ``req``'s current slots. O(P)."""
        live = req.mamba_pool_idx or 0
        buffer = req.mamba_ping_pong_track_buffer
        track = list(buffer) if buffer else [NO_SLOT] * self._track_width
        slot_row = self._slot_row
        # the row's old slots out of the owner record, counted as they go (as _row_slot_count counts)
        old_live = self._row_live[row]
        released = 0
        if old_live > 0:
            slot_row.pop(old_live, None)
            released = 1
        for s in self._row_track[row]:
            if s > 0:
                slot_row.pop(s, None)
                released += 1
        held = 0
        if live > 0:
            slot_row[live] = row
            held = 1
        for s in track:
            if s > 0:
                slot_row[s] = row
                held += 1
        self._num_reserved += held - released
        self._row_live[row] = live
        self._row_track[row] = track
        self._row_req[row] = req
        if self._live_np is not None:
            self._live_np[row] = live
            track_np = self._track_np
            for i, s in enumerate(track):  # scalar stores: numpy converting a short list costs ~3 us
                track_np[row, i] = s
        else:
            self.req_index_to_mamba_index_mapping[row] = live
            self.req_index_to_mamba_ping_pong_track_buffer_mapping[row] = torch.tensor(
                track, dtype=torch.int64, device=self.device
            )

    def clear(self) -> None:
        """Free every row and reset the mappings and the whole state pool (every slot free)."""
        super().clear()
        self._reset_mirror()
        self.req_index_to_mamba_index_mapping.zero_()
        self.req_index_to_mamba_ping_pong_track_buffer_mapping.fill_(NO_SLOT)
        self.mamba_pool.reset()
