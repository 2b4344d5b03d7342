"""The unified memory pool: one byte buffer shared by the recurrent states and the full-attention KV.

``reference/sglang-semantics.md`` §6.3 and the seeds: one ``torch.empty(total_bytes, dtype=torch.uint8)``
buffer; state slots grow up from the low addresses, KV pages down from the high addresses, until they meet;
a start-up ratio only fixes a budget, not a split. Typed views (:mod:`~mamba_radix.pools.unified_layout`)
give the state tensors MambaPool's shapes (``[num_layers, rows, *shape]``, so :mod:`mamba_radix.state_ops`
works on them unchanged) and the KV per-layer tensors ``[num_tokens, heads, dim]``. Byte ranges are kept
disjoint by :class:`~mamba_radix.pools.two_ended.TwoEndedAllocator`; ids are physical (no translation).

When an allocation does not fit, the pool refuses it (None, nothing changed) and its give-way rule
(:data:`GIVE_WAY_RULES`, :meth:`UnifiedMemoryPool.give_way`) tells the caller which side to evict from,
in order:

- ``sglang``: the requesting side evicts its own entries first; a state shortfall then evicts full KV.
  SGLang's ``MultiEndedAllocator.alloc`` refuses a request larger than the gap (``if need_size >
  self.available_size(): ... return None``, ``mem_cache/multi_ended_allocator.py`` line 792 at 526af15);
  its ``alloc_req_slots`` then evicted states only (``tree_cache.evict(EvictParams(num_tokens=0,
  mamba_num=mamba_num))``, ``mem_cache/allocation.py`` line 261), which starved the state side once KV held
  the bytes (issue #34441); PR #36713 (merged) evicts full KV for a state byte shortfall. A KV shortfall
  evicts KV (a KV eviction drops the states of the nodes it deletes too).
- ``older_victim``: the side whose least recently used victim is older gives way first (the caller passes
  both victims' last-access ticks), then the other: memory follows recency across the two kinds.
- ``floor``: each side keeps a floor of bytes the other can never take (``state_floor_bytes``,
  ``kv_floor_bytes``: a side's span is capped at the usable bytes less the other's floor); the requester
  evicts its own entries first, the other side only while it is above its floor.

Four deployments the seeds list as incompatible (PD disaggregation, speculative decoding, the host tier,
DCP > 1) are refused by :class:`~mamba_radix.config.CacheConfig` where it has the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mamba_radix.config import UNIFIED_GIVE_WAY_RULES as GIVE_WAY_RULES
from mamba_radix.errors import InvalidArgument
from mamba_radix.pools._indices import IndexLike, as_index_tensor, resolve_device
from mamba_radix.pools.two_ended import TwoEndedAllocator
from mamba_radix.pools.unified_layout import KVLayout, StateLayout

__all__ = ["GIVE_WAY_RULES", "KV", "STATE", "UnifiedMemoryPool", "give_way_order"]

STATE, KV = "state", "kv"
# the side of the two-ended allocator each kind grows from
_SIDE = {STATE: "low", KV: "high"}


class UnifiedMemoryPool:
    """``total_bytes`` of one ``uint8`` buffer on ``device`` for state slots (``state`` layout) and KV
    pages of ``page_size`` tokens (``kv`` layout).

    The first ``max(slot_bytes, page_bytes)`` bytes are the padding sink: state slot 0 and KV page 0 both
    alias it (padded batch entries write there), so real slots start at :attr:`min_slot` and real KV
    tokens at ``min_page * page_size``. ``min_state_slots`` (default 1): the slots one running request
    needs; a buffer that cannot hold them next to one KV page is refused (:class:`InvalidArgument`).
    ``rule`` is one of :data:`GIVE_WAY_RULES`; the floors apply to ``floor`` only.

    The buffer is ``torch.empty``: on the CPU its pages become resident as they are written. O(layers)
    to build the views; alloc/free are O(k log n) on host ints.
    """

    def __init__(
        self,
        total_bytes: int,
        state: StateLayout,
        kv: KVLayout,
        page_size: int = 1,
        rule: str = "sglang",
        *,
        state_floor_bytes: int = 0,
        kv_floor_bytes: int = 0,
        min_state_slots: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise InvalidArgument(f"page_size must be a positive int, got {page_size!r}")
        if rule not in GIVE_WAY_RULES:
            raise InvalidArgument(f"rule must be one of {', '.join(GIVE_WAY_RULES)}, got {rule!r}")
        self.state_layout, self.kv_layout = state, kv
        self.page_size, self.rule = page_size, rule
        self.slot_bytes = state.slot_bytes
        self.page_bytes = kv.token_bytes * page_size
        sink = max(self.slot_bytes, self.page_bytes)
        self.allocator = TwoEndedAllocator(total_bytes, self.slot_bytes, self.page_bytes, sink)
        need = sink + min_state_slots * self.slot_bytes + self.page_bytes
        if total_bytes < need:
            raise InvalidArgument(
                f"total_bytes={total_bytes:,} cannot hold the {sink:,} B sink, {min_state_slots} state slots "
                f"of {self.slot_bytes:,} B and one KV page of {self.page_bytes:,} B; give at least {need:,}"
            )
        self.floor_bytes = {STATE: state_floor_bytes, KV: kv_floor_bytes}
        if rule == "floor":
            self._set_floor_caps(state_floor_bytes, kv_floor_bytes)
        self.device = resolve_device(device)
        self.total_bytes = total_bytes
        self.raw = torch.empty(total_bytes, dtype=torch.uint8, device=self.device)
        self.num_slot_rows = self.allocator.low_end  # rows of the state views (slot 0 included)
        self.num_kv_tokens = self.allocator.high_end * page_size  # rows of the KV views
        *self.conv, self.temporal = state.views(self.raw, self.num_slot_rows)
        self.kv_views = kv.views(self.raw, self.num_kv_tokens)

    def _set_floor_caps(self, state_floor_bytes: int, kv_floor_bytes: int) -> None:
        """Cap each side's span so that the other's floor (rounded up to its whole units) stays out of
        its reach: a side can always grow to its floor once it is empty. O(1)."""
        a = self.allocator
        bottom = a.min_id["low"] * self.slot_bytes  # the state span's first byte
        top = a.high_end * self.page_bytes  # one past the KV span's last byte
        state_floor = -(-max(state_floor_bytes, 0) // self.slot_bytes) * self.slot_bytes
        kv_floor = -(-max(kv_floor_bytes, 0) // self.page_bytes) * self.page_bytes
        if state_floor_bytes < 0 or kv_floor_bytes < 0 or bottom + state_floor + kv_floor > top:
            raise InvalidArgument(
                f"floors of {state_floor_bytes:,} B (state) and {kv_floor_bytes:,} B (kv) must be >= 0 and fit "
                f"the {top - bottom:,} usable bytes together in whole slots and pages"
            )
        a.set_cap("low", top - kv_floor - bottom)
        a.set_cap("high", top - bottom - state_floor)

    # ------------------------------------------------------------------------------------- geometry
    @property
    def tensors(self) -> list[torch.Tensor]:
        """``[*conv, temporal]``: the list every :mod:`mamba_radix.state_ops` function takes."""
        return [*self.conv, self.temporal]

    @property
    def min_slot(self) -> int:
        """The lowest state slot handed out (the ones below alias the sink)."""
        return self.allocator.min_id["low"]

    @property
    def min_page(self) -> int:
        return self.allocator.min_id["high"]

    def byte_range(self, kind: str, unit: int) -> tuple[int, int]:
        """``[start, end)`` bytes of state slot or KV page ``unit``. O(1)."""
        size = self.slot_bytes if kind == STATE else self.page_bytes
        return unit * size, (unit + 1) * size

    def available(self, kind: str) -> int:
        """State slots, or KV tokens (whole pages), an allocation could take now. O(1)."""
        units = self.allocator.available(_SIDE[_kind(kind)])
        return units if kind == STATE else units * self.page_size

    def used(self, kind: str) -> int:
        """Allocated state slots, or KV tokens."""
        units = self.allocator.used(_SIDE[_kind(kind)])
        return units if kind == STATE else units * self.page_size

    def used_bytes(self, kind: str) -> int:
        return self.allocator.used(_SIDE[_kind(kind)]) * (
            self.slot_bytes if kind == STATE else self.page_bytes
        )

    def fragmented_bytes(self, kind: str) -> int:
        """Bytes of ``kind``'s holes: free, yet out of the other side's reach until its frontier moves."""
        side = _SIDE[_kind(kind)]
        return len(self.allocator.holes(side)) * self.allocator.unit_bytes[side]

    # ----------------------------------------------------------------------------------- state side
    def alloc_slots(self, num_slots: int) -> list[int] | None:
        """``num_slots`` state slots (lowest holes first, then up into the gap), or None and nothing
        changed. Contents are stale. O(k log n)."""
        return self.allocator.alloc("low", num_slots)

    def free_slots(self, slots: Sequence[int]) -> None:
        """Return state slots; :class:`~mamba_radix.errors.InvalidIndex` and nothing freed for one not
        allocated or repeated. The state frontier moves back over free slots at the gap. O(k log n)."""
        self.allocator.free("low", slots)

    # -------------------------------------------------------------------------------------- KV side
    def alloc_kv(self, num_tokens: int) -> torch.Tensor | None:
        """KV token ids for ``num_tokens`` (a multiple of ``page_size``: whole pages, the highest holes
        first, then down into the gap), int64 on the device; or None and nothing changed. O(k log n)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens % self.page_size:
            raise InvalidArgument(
                f"num_tokens must be a multiple of page_size={self.page_size}, got {num_tokens!r}"
            )
        pages = self.allocator.alloc("high", num_tokens // self.page_size)
        if pages is None:
            return None
        ps = self.page_size
        ids = torch.tensor(pages, dtype=torch.int64).repeat_interleave(ps) * ps + torch.arange(ps).repeat(
            len(pages)
        )
        return ids.to(self.device)

    def free_kv(self, tokens: IndexLike) -> None:
        """Free the pages of KV ``tokens`` (every token of each page must be given, as
        :meth:`alloc_kv` returned them). :class:`~mamba_radix.errors.InvalidIndex` / InvalidArgument and
        nothing freed otherwise. O(k log n)."""
        ids = as_index_tensor(tokens, self.device, "KV token").tolist()
        ps = self.page_size
        pages = sorted({t // ps for t in ids})
        if sorted(ids) != [p * ps + o for p in pages for o in range(ps)]:
            raise InvalidArgument(
                f"free_kv frees whole pages of {ps} tokens, each token once; got {len(ids)} ids"
            )
        self.allocator.free("high", pages)

    # ------------------------------------------------------------------------------------ give way
    def give_way(self, kind: str, victim_ticks: Mapping[str, float | None] | None = None) -> tuple[str, ...]:
        """The sides to evict from, in order, after an allocation of ``kind`` was refused (this pool's
        rule; see the module docstring). ``victim_ticks``: ``{"state": t, "kv": t}``, the last-access
        tick of each side's next eviction victim (None: nothing evictable), read by ``older_victim``
        only. No side effects. O(1)."""
        kind = _kind(kind)
        other = KV if kind == STATE else STATE
        above = self.allocator.span_bytes(_SIDE[other]) > self.floor_bytes[other]
        return give_way_order(self.rule, kind, victim_ticks, other_above_floor=above)

    def clear(self) -> None:
        """Free everything on both sides (contents stay). O(1)."""
        self.allocator.clear()


def give_way_order(
    rule: str,
    kind: str,
    victim_ticks: Mapping[str, float | None] | None = None,
    *,
    other_above_floor: bool = True,
) -> tuple[str, ...]:
    """The sides (``"state"``, ``"kv"``) to evict from, in order, after an allocation of ``kind`` was
    refused under ``rule`` (the module docstring states each rule). The one definition of the rules: the
    byte pool (:meth:`UnifiedMemoryPool.give_way`) and the simulator's counting budget
    (:mod:`mamba_radix.sim.unified`) both ask it. ``victim_ticks``: the last-access tick of each side's
    next victim (None: nothing evictable), read by ``older_victim`` only; ``other_above_floor``: whether
    the other side holds more than its floor, read by ``floor`` only. No side effects. O(1)."""
    kind = _kind(kind)
    other = KV if kind == STATE else STATE
    if rule == "sglang":
        return (STATE, KV) if kind == STATE else (KV,)
    if rule == "floor":
        return (kind, other) if other_above_floor else (kind,)
    if rule != "older_victim":
        raise InvalidArgument(f"rule must be one of {', '.join(GIVE_WAY_RULES)}, got {rule!r}")
    ticks = victim_ticks or {}
    own, theirs = ticks.get(kind), ticks.get(other)
    if theirs is not None and (own is None or theirs < own):
        return (other, kind)
    return (kind, other)


def _kind(kind: str) -> str:
    if kind not in _SIDE:
        raise InvalidArgument(f"kind must be 'state' or 'kv', got {kind!r}")
    return kind
