"""The invariant suite over unified memory: our cache on one byte budget for KV and states.

The core cache does not build SGLang's byte pool (:class:`~mamba_radix.pools.UnifiedMemoryPool`):
``CacheConfig(enable_unified_memory=True)`` alone builds the two separate pools. Unified memory runs in
the simulator's counting form (:mod:`mamba_radix.sim.unified`): both pools are sized for the whole
budget and draw on one :class:`~mamba_radix.sim.capacity_limit.SharedByteBudget`, and
:class:`~mamba_radix.sim.unified.UnifiedMemoryCache` frees bytes by the give-way rule. This adapter drives
that cache through the suite (:class:`UnifiedRadixAdapter`), so the oracle, stamps, conservation and the
cache's own invariants run while the KV / state line moves with load, and adds the byte-level
invariant of the counting form after every step: KV bytes + state bytes + free bytes = the budget, each
side's free units what the budget buys (the byte pool's own invariants, no two live views overlap and
every byte is free, KV or state, are :func:`~mamba_radix.pools.check_unified`'s, run by
``property_tests/test_pools_unified.py``'s state machine).

The suite's direct ``evict(num_tokens, num_states)`` asks for units, so it runs the core's eviction
(units, not bytes); every eviction the cache makes on its own (admission, a hand-over's or a
copy-on-write's slot) goes through the give-way rule. Unified memory moves single KV tokens: page size 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from mamba_radix.cache import MambaRadixCache
from mamba_radix.config import UNIFIED_GIVE_WAY_RULES
from mamba_radix.pools import HybridReqToTokenPool
from mamba_radix.sim.capacity_limit import LimitedMambaPool, limited_kv_allocator
from mamba_radix.sim.unified import UnifiedMemoryCache
from mamba_radix.testing.adapter import EvictOutcome, Ownership, SuiteParams
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.radix_adapter import MAX_CONTEXT, MambaRadixAdapter, RadixSuiteParams, radix_params

__all__ = ["STATE_SLOT_UNITS", "UnifiedRadixAdapter", "UnifiedSuiteParams", "unified_params"]

# a state slot costs this many KV tokens' bytes (real ratios are far larger; small here so that both
# sides hold several units of a budget of a few dozen tokens and the line moves both ways)
STATE_SLOT_UNITS = 4


@dataclass(frozen=True)
class UnifiedSuiteParams(RadixSuiteParams):
    """:class:`RadixSuiteParams` plus the give-way rule; the byte budget is ``kv_pages`` tokens' bytes
    plus ``state_slots`` slots' bytes (each pool alone could take all of it)."""

    give_way: str = "sglang"


@st.composite
def unified_params(
    draw: st.DrawFn, strategies: Sequence[str] = ("extra_buffer",), **suite: Any
) -> SuiteParams:
    """:func:`radix_params` at page size 1 (unified memory moves single KV tokens), with a give-way rule."""
    base = draw(radix_params(strategies=strategies, page_sizes=(1,), **suite))
    fields = {k: getattr(base, k) for k in RadixSuiteParams.__dataclass_fields__}
    return UnifiedSuiteParams(**fields, give_way=draw(st.sampled_from(UNIFIED_GIVE_WAY_RULES)))


class UnifiedRadixAdapter(MambaRadixAdapter):
    """:class:`MambaRadixAdapter` over :class:`UnifiedMemoryCache` with a shared byte budget (module
    docstring). Each KV token is one byte unit, each state slot :data:`STATE_SLOT_UNITS`."""

    def _build(self, params: SuiteParams, conv: list[tuple[int, ...]], temporal: tuple[int, ...]) -> None:
        rule = getattr(params, "give_way", "sglang")
        self.config = self.config.replace(enable_unified_memory=True, unified_memory_give_way=rule)  # type: ignore[arg-type]
        total = params.kv_pages * params.page_size + params.state_slots * STATE_SLOT_UNITS
        # both pools sized for the whole budget: the budget, not the sizes, decides who holds what
        self.mamba_pool = LimitedMambaPool(total // STATE_SLOT_UNITS, 2, conv, temporal)
        self.req_pool = HybridReqToTokenPool(params.req_rows, MAX_CONTEXT, self.mamba_pool, self.config)
        self.allocator = limited_kv_allocator(total, params.page_size)
        self.cache = UnifiedMemoryCache(self.config, self.req_pool, self.allocator)
        floors = {"kv": params.page_size * 8, "state": STATE_SLOT_UNITS * 2}
        self.budget = self.cache.attach_budget(total, 1, STATE_SLOT_UNITS, floors)

    def evict(self, num_tokens: int, num_states: int) -> EvictOutcome:
        """The suite's direct eviction asks for units: the core's eviction (the give-way rule frees bytes
        for a shortfall, and runs inside the cache's own allocations)."""
        res = MambaRadixCache.evict(self.cache, num_tokens=num_tokens, num_states=num_states)
        return EvictOutcome(res.num_tokens, res.num_states)

    def ownership(self) -> list[Ownership]:
        """As :meth:`MambaRadixAdapter.ownership`, with each pool's capacity what it holds plus what the
        shared budget lets it take now (its physical size is the whole budget)."""
        out = []
        for record in super().ownership():
            pool = {"KV": self.allocator, "state slots": self.mamba_pool}.get(record.name)
            if pool is not None:
                record = Ownership(
                    record.name,
                    record.owners,
                    record.allocated,
                    record.available,
                    int(pool.used) + pool.available_size(),
                    record.page_size,
                )
            out.append(record)
        return out

    def check_invariants(self, idle: bool = False) -> None:
        """The cache's invariants, then the byte budget's: KV bytes plus state bytes within the budget,
        and each side's free units at most what the unspent bytes buy (nothing handed out past it)."""
        super().check_invariants(idle)
        budget = self.budget
        kv_bytes = int(self.allocator.used) * budget.unit_bytes["kv"]
        state_bytes = int(self.mamba_pool.used) * budget.unit_bytes["state"]
        if budget.used_bytes() != kv_bytes + state_bytes or kv_bytes + state_bytes > budget.total_bytes:
            raise SuiteViolation(
                f"unified budget: KV {kv_bytes} B + states {state_bytes} B against {budget.total_bytes} B "
                f"(the budget counts {budget.used_bytes()} B)"
            )
        free = budget.total_bytes - kv_bytes - state_bytes
        for kind, pool in (("kv", self.allocator), ("state", self.mamba_pool)):
            if pool.available_size() * budget.unit_bytes[kind] > free:
                raise SuiteViolation(
                    f"unified budget: the {kind} side offers {pool.available_size()} units, more than the "
                    f"{free} free bytes buy"
                )
