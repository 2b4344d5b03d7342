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
copy-on-write's slot) goes through the give-way rule. Paged (``page_size > 1``), the KV side is
:class:`~mamba_radix.sim.capacity_limit.LimitedPagedKVAllocator` and the byte invariant adds that pages
never split: the KV side holds, offers and is charged whole pages only.
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
    draw: st.DrawFn,
    strategies: Sequence[str] = ("extra_buffer",),
    page_sizes: Sequence[int] = (1,),
    give_way_rules: Sequence[str] = UNIFIED_GIVE_WAY_RULES,
    **suite: Any,
) -> SuiteParams:
    """:func:`radix_params` with a give-way rule drawn from ``give_way_rules``; ``page_sizes`` as
    :func:`radix_params` takes them (the default, page size 1, draws what it drew before pages existed)."""
    base = draw(radix_params(strategies=strategies, page_sizes=page_sizes, **suite))
    fields = {k: getattr(base, k) for k in RadixSuiteParams.__dataclass_fields__}
    return UnifiedSuiteParams(**fields, give_way=draw(st.sampled_from(list(give_way_rules))))


class UnifiedRadixAdapter(MambaRadixAdapter):
    """:class:`MambaRadixAdapter` over :class:`UnifiedMemoryCache` with a shared byte budget (module
    docstring). Each KV token is one byte unit, each state slot :data:`STATE_SLOT_UNITS`."""

    def _build(self, params: SuiteParams, conv: list[tuple[int, ...]], temporal: tuple[int, ...]) -> None:
        rule = getattr(params, "give_way", "sglang")
        self.config = self.config.replace(enable_unified_memory=True, unified_memory_give_way=rule)  # type: ignore[arg-type]
        page = params.page_size
        total = params.kv_pages * page + params.state_slots * STATE_SLOT_UNITS
        # both pools sized for the whole budget: the budget, not the sizes, decides who holds what (the KV
        # side in whole pages: the budget's last bytes short of a page can only hold states)
        self.mamba_pool = LimitedMambaPool(total // STATE_SLOT_UNITS, 2, conv, temporal)
        self.req_pool = HybridReqToTokenPool(params.req_rows, MAX_CONTEXT, self.mamba_pool, self.config)
        self.allocator = limited_kv_allocator(total // page * page, page)
        self.cache = UnifiedMemoryCache(self.config, self.req_pool, self.allocator)
        # eight tokens or two pages of KV (whichever is more: a 16-token page's eight would leave a pool of
        # three pages no room to move), two slots of states
        floors = {"kv": max(8, 2 * page), "state": STATE_SLOT_UNITS * 2}
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
        each side's free units at most what the unspent bytes buy (nothing handed out past it), and pages
        never split (:meth:`_check_whole_pages`). O(1) beyond the cache's own."""
        super().check_invariants(idle)
        self._check_whole_pages()
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

    def _check_whole_pages(self) -> None:
        """Pages never split between KV and free bytes: the budget's KV granule is the allocator's page
        size, and the KV side's held, offered and withheld tokens are whole pages (which page each index
        lies in, and that each page has one owner, is the suite's conservation check). O(1)."""
        page = getattr(self.allocator, "page_size", 1)
        if self.budget.kv_page_size != page:
            raise SuiteViolation(
                f"unified budget: KV granule {self.budget.kv_page_size} is not the allocator's page size {page}"
            )
        counts = {
            "held": int(self.allocator.used),
            "offered": self.allocator.available_size(),
            "withheld": self.allocator.withheld,
        }
        split = {k: v for k, v in counts.items() if v % page}
        if split:
            raise SuiteViolation(f"unified budget: KV tokens {split} are not whole pages of {page}")
