"""Unified memory in the simulator: one byte budget for KV tokens and state slots, and who gives way.

SGLang's ``--enable-unified-memory`` (:mod:`mamba_radix.pools.unified` is the byte pool) lets the
recurrent states and the full-attention KV share one buffer, so the state slots and the KV tokens a run
holds move with its load. The simulator keeps the counting form of it: both pools are built for the whole
budget (:func:`~mamba_radix.sim.budget.unified_pools`) and draw on one
:class:`~mamba_radix.sim.capacity_limit.SharedByteBudget`; SGLang's allocator compacts each side, so there is
no fragmentation to model. At ``page_size > 1`` the KV side is
:class:`~mamba_radix.sim.capacity_limit.LimitedPagedKVAllocator` (``limited_kv_allocator`` picks it): KV is
charged and refunded in whole pages, a KV shortfall is rounded up to whole pages, and bytes short of a page
stay free for states (the core already counts a request's KV in whole pages).

The give-way rule (``CacheConfig.unified_memory_give_way``, :func:`~mamba_radix.pools.unified.give_way_order`)
lives here, at the edge: :class:`UnifiedMemoryCache` is the core cache with three calls overridden, and
the core knows nothing of it.

- :meth:`~UnifiedMemoryCache.evict` (every eviction the cache and its lifecycle make on a refused
  allocation goes through it: ``make_room``, ``alloc_state_slot``, a copy-on-write's slot) frees the
  *bytes* of the units asked for, from the sides the rule names in order. Under ``sglang`` a state
  shortfall that its own checkpoints cannot cover falls back to KV eviction (PR #36713; without it SGLang
  starved states once KV held the bytes, #34441).
- :meth:`~UnifiedMemoryCache.can_admit` / :meth:`~UnifiedMemoryCache.admit` check admission in bytes: the
  request's KV reservation and its slots must fit together (the core checks each pool alone, and both
  would count the same free bytes). A KV shortfall that the rule's eviction can cover is evicted at
  admission (the core's own KV check counts only free and evictable KV; a checkpoint's bytes come back
  only once it is evicted). When the rule's KV side has no victim left, admission evicts checkpoints for
  the KV shortfall (the byte check counted their bytes; SGLang would make the request wait instead).
- Eviction for a shortfall counts the requesting side's *room* (:meth:`SharedByteBudget.room_bytes`) in
  whole units, not the bytes freed: a checkpoint leaf's KV freed with it, or KV the running requests are
  owed, frees bytes the state side cannot take.
- The state side never takes the bytes of running requests' KV reservations that the tree's evictable
  KV does not cover (``SharedByteBudget.protected_kv_tokens``): an admitted request never runs out of KV,
  as under a static split.

Each check costs one more prefix walk per admission attempt (O(L)); eviction is the core's, O(victims *
log n), plus one rule decision per victim under ``older_victim``.
"""

from __future__ import annotations

from mamba_radix.cache import MambaRadixCache
from mamba_radix.cache_results import EvictResult
from mamba_radix.lifecycle_results import AdmitCheck
from mamba_radix.pools.unified import KV, STATE, give_way_order
from mamba_radix.radix_key import RadixKey
from mamba_radix.request import Req
from mamba_radix.sim.capacity_limit import SharedByteBudget

__all__ = ["UNIFIED_FLOOR_FRACTION", "UnifiedMemoryCache"]

# the core's refusals that a byte budget may overturn (the other pool's bytes, freed by the rule)
_POOL_REASONS = ("kv_tokens", "state_slots")

# ``floor`` rule: each side keeps this fraction of its start-up share (the ratio split's bytes) out of the
# other's reach. CacheConfig has no field for it yet; half keeps both sides able to serve a request while
# the other half of each moves with load.
UNIFIED_FLOOR_FRACTION = 0.5


class UnifiedMemoryCache(MambaRadixCache):
    """:class:`~mamba_radix.cache.MambaRadixCache` over pools that share a byte budget (see the module
    docstring). Built like the core cache (``UnifiedMemoryCache.build(..., mamba_pool_factory=LimitedMambaPool,
    kv_allocator_factory=limited_kv_allocator)``), then :meth:`attach_budget`; until then it is the core
    cache unchanged."""

    budget: SharedByteBudget | None = None
    _pending_kv_tokens: int = 0  # the KV reservation an admission in progress is about to add

    def attach_budget(
        self,
        total_bytes: int,
        bytes_per_kv_token: int,
        bytes_per_state_slot: int,
        floor_bytes: dict[str, int] | None = None,
    ) -> SharedByteBudget:
        """Make both pools draw on ``total_bytes`` (and the ``floor`` rule's ``floor_bytes``); returns the
        budget. Raises :class:`~mamba_radix.errors.ConfigError` / InvalidArgument as
        :class:`SharedByteBudget` does. O(1)."""  # fmt: skip
        floors = floor_bytes if self.config.unified_memory_give_way == "floor" else None
        budget = SharedByteBudget(
            total_bytes,
            bytes_per_kv_token,
            bytes_per_state_slot,
            protected_kv_tokens=self._protected_kv_tokens,
            floor_bytes=floors,
        )
        budget.attach(self.token_to_kv_pool_allocator, self.mamba_pool)  # type: ignore[arg-type]
        self.budget = budget
        return budget

    def _protected_kv_tokens(self) -> int:
        """KV tokens running requests reserved (and the admission in progress is adding) that the tree's
        evictable KV does not cover: bytes the state side must leave free. O(1)."""
        owed = self.lifecycle.reserved_kv_tokens + self._pending_kv_tokens
        return max(0, owed - self.tree.full_evictable_size)

    # --------------------------------------------------------------------------------------- give way
    def evict(self, num_tokens: int = 0, num_states: int = 0) -> EvictResult:
        """Free the bytes of ``num_tokens`` KV tokens and of ``num_states`` state slots, each from the
        sides the give-way rule names for that kind, in order (see the module docstring). Without a
        budget: the core's eviction. O(victims * log n)."""
        if self.budget is None:
            return super().evict(num_tokens, num_states)
        tokens = states = 0
        for kind, units in ((STATE, num_states), (KV, num_tokens)):
            if units:
                t, s = self._give_way(kind, units)
                tokens, states = tokens + t, states + s
        return EvictResult(tokens, states)

    def _give_way(self, kind: str, units: int) -> tuple[int, int]:
        """Evict until ``kind``'s side has room for ``units`` more of its units than now, or no side the
        rule allows has a victim that adds room. Returns the (KV tokens, checkpoints) freed.

        Progress is counted in the requesting side's room (:meth:`SharedByteBudget.room_bytes`), not in
        bytes freed: for the state side, evicting KV the running requests' reservations are owed frees
        no room (the reservation's protection grows by what it frees), and neither does a checkpoint
        leaf whose KV goes with it, in part. A side whose eviction adds no room is not asked again, so
        nothing is evicted for nothing. ``older_victim`` decides again at every victim (memory follows
        recency across the two kinds); the other rules evict each side's share at once."""
        assert self.budget is not None
        unit = self.budget.unit_bytes
        rule = self.config.unified_memory_give_way
        if kind == KV:  # paged: KV comes in whole pages, so a shortfall is one too (page size 1: unchanged)
            page = self.budget.kv_page_size
            units = -(-units // page) * page
        # whole units: the room the side's free units plus ``units`` more need (a negative room counts as none)
        target = (self.budget.free_units(kind) + units) * unit[kind]
        tokens = states = 0
        exhausted: set[str] = set()
        while (room := self.budget.room_bytes(kind)) < target:
            order = [s for s in self._order(rule, kind) if s not in exhausted]
            if not order:
                break
            side = order[0]
            want = 1 if rule == "older_victim" else -(-(target - room) // unit[side])
            res = super().evict(num_tokens=want) if side == KV else super().evict(num_states=want)
            tokens, states = tokens + res.num_tokens, states + res.num_states
            if res.num_tokens + res.num_states == 0 or (
                rule != "older_victim" and self.budget.room_bytes(kind) <= room
            ):
                exhausted.add(side)
        return tokens, states

    def _order(self, rule: str, kind: str) -> tuple[str, ...]:
        """The rule's sides for a shortfall of ``kind`` now (the victims' ticks and the floors read
        here). O(log n)."""
        assert self.budget is not None
        if rule == "older_victim":
            leaf, node = self.tree.index.first_full(), self.tree.index.first_mamba()
            ticks = {
                KV: None if leaf is None else leaf.last_access,
                STATE: None if node is None else node.mamba_last_access,
            }
            return give_way_order(rule, kind, ticks)
        other = KV if kind == STATE else STATE
        above = self.budget.used_bytes(other) > self.budget.floor_bytes[other]
        return give_way_order(rule, kind, other_above_floor=above)

    # -------------------------------------------------------------------------------------- admission
    def can_admit(self, req: Req, max_new_tokens: int | None = None) -> AdmitCheck:
        """The core's check, then in bytes: the request's KV reservation and its slots must fit together
        (after what the rule may evict). Read-only. O(L + path)."""
        check = super().can_admit(req, max_new_tokens)
        if self.budget is None or (check.reason is not None and check.reason not in _POOL_REASONS):
            return check
        reason = self._byte_verdict(req, check)
        if reason is None and not check.ok:
            return check._replace(ok=True, reason=None)  # admit evicts what the core does not count
        return check if reason is None else check._replace(ok=False, reason=reason)

    def admit(self, req: Req, max_new_tokens: int | None = None) -> bool:
        """:meth:`can_admit`, then (under a budget) evict by the rule what the core's per-pool check
        finds short, and the core's admission with the request's KV protected from the state side while
        it takes its slots. A refusal changes nothing. O(L + path * log n) plus the eviction."""
        if self.budget is None:
            return super().admit(req, max_new_tokens)
        if not self.can_admit(req, max_new_tokens).ok:
            return False
        core = super().can_admit(req, max_new_tokens)
        while core.reason in _POOL_REASONS:  # bytes suffice once the rule's victims are gone
            if core.reason == "kv_tokens":
                short = core.kv_tokens_needed + self.lifecycle.reserved_kv_tokens
                short -= self.token_to_kv_pool_allocator.available_size() + self.tree.full_evictable_size
                freed = self.evict(num_tokens=max(short, 1))
                if freed.num_tokens == 0 and freed.num_states == 0 and self.budget is not None:
                    # the rule's KV side has no victim left, but the byte check counted the evictable
                    # checkpoints' bytes (SGLang would make the request wait): take them rather than refuse
                    # what the check admitted
                    unit = self.budget.unit_bytes
                    freed = super().evict(num_states=max(1, -(-max(short, 1) * unit[KV] // unit[STATE])))
            else:
                short = core.state_slots_needed - self.mamba_pool.available_size()
                freed = self.evict(num_states=max(short, 1))
            if freed.num_tokens == 0 and freed.num_states == 0:
                return False
            core = super().can_admit(req, max_new_tokens)
        self._pending_kv_tokens = core.kv_tokens_needed
        try:
            return super().admit(req, max_new_tokens)
        finally:
            self._pending_kv_tokens = 0

    def _byte_verdict(self, req: Req, check: AdmitCheck) -> str | None:
        """Why ``req`` does not fit the byte budget (an admission reason), or None. O(L + path)."""
        budget = self.budget
        assert budget is not None
        kvb, stb = budget.unit_bytes[KV], budget.unit_bytes[STATE]
        total, floor = budget.total_bytes, budget.floor_bytes
        need_kv, need_slots = check.kv_tokens_needed, check.state_slots_needed
        if (check.hit_len + need_kv) * kvb > total - floor[STATE] or need_slots * stb > total - floor[KV]:
            return "too_long"
        if (check.hit_len + need_kv) * kvb + need_slots * stb > total:
            return "too_long"
        ids = req.origin_input_ids
        peek = self.peek_prefix(RadixKey.trusted(ids[: len(ids) - 1], req.extra_key))
        evict_kv = self.tree.full_evictable_size - peek.unlocked_tokens
        evict_states = self.tree.mamba_evictable_size - int(peek.unlocked_checkpoint)
        owed = self.lifecycle.reserved_kv_tokens + need_kv
        free = total - budget.used_bytes()
        # everything eviction may free (a KV leaf's eviction frees its checkpoint too, so even under
        # sglang the evictable checkpoints come back), against the reservations and the slots together
        rule = self.config.unified_memory_give_way
        room = free + evict_kv * kvb + evict_states * stb
        if room < owed * kvb + need_slots * stb:
            return "kv_tokens"
        # the slots: free bytes past the protected reservations, the evictable checkpoints, and the KV
        # beyond the reservations where the rule lets a state shortfall evict KV
        state_room = free - max(0, owed - evict_kv) * kvb + evict_states * stb
        if rule != "floor" or budget.used_bytes(KV) > floor[KV]:
            spare_kv = max(0, evict_kv - owed) * kvb
            if rule == "floor":
                spare_kv = min(spare_kv, budget.used_bytes(KV) - floor[KV])
            state_room += spare_kv
        if state_room < need_slots * stb:
            return "state_slots"
        if floor[STATE] and (budget.pools[KV].used - evict_kv + owed) * kvb > total - floor[STATE]:
            return "kv_tokens"
        if floor[KV] and (budget.pools[STATE].used - evict_states + need_slots) * stb > total - floor[KV]:
            return "state_slots"
        return None
