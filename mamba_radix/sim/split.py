"""An adaptive KV/state split: one byte budget, the line between the two pools moved while a trace runs.

A static split fixes how many KV tokens and how many state slots a budget buys (SGLang's
``mamba_full_memory_ratio``). But a hit needs both halves: the checkpoint (a slot) and the KV of the whole
path above it. Under LRU-like eviction each pool has a *characteristic time* T (Che's approximation: an
entry survives iff it is reused within T of its last use; the age of the pool's victims), and a
checkpoint is usable only while both survive, so the hit rate follows ``min(T_kv, T_state)``. Bytes
given to the pool whose victims are older buy nothing that the other pool does not also keep; moving
them to the pool whose victims are younger raises the minimum. :class:`AdaptiveSplit` does that: every
``every`` finished requests it compares the mean age of each pool's victims since its last decision
(:class:`VictimAges`, in tree clock ticks: the observer the cache's tree reports its victims to) and
moves ``step_fraction`` of the state pool's current bytes (at least one slot's) toward the pool with the
younger victims, if it is younger by more than ``tolerance``: a step relative to the pool, so a 16-slot
pool moves by 2 and a 1,024-slot one by 128. A pool that evicted nothing has an unbounded T: it gives
bytes to the other if the other evicted.

Both pools are built physically for the whole budget (``budget // bytes per unit``) and lent part of it
through :meth:`~mamba_radix.sim.capacity_limit.CapacityLimit.set_capacity`, so ``used * bytes`` of the
two never exceeds the budget. A shrink first evicts what no longer fits (the cache's own eviction order)
and never goes below what is allocated, reserved for running requests' decode, or the floors.

What it is not: a per-entry cross-pool victim choice (which KV leaf or which checkpoint gives the most
hits per byte); the split moves in steps between requests, and each pool keeps its own eviction order.

Paged (``page_size > 1``): the KV line moves in whole pages (the allocator is
:class:`~mamba_radix.sim.capacity_limit.LimitedPagedKVAllocator`): every KV capacity is rounded down to a page
multiple, and the bytes short of a page that the growing state pool cannot use either stay unlent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mamba_radix.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.cache import MambaRadixCache
    from mamba_radix.tree_results import VictimKind

__all__ = ["AdaptiveSplit", "SplitOptions", "SplitStep", "VictimAges"]


@dataclass
class VictimAges:
    """How long the victims of each pool's eviction had gone unused (tree clock ticks since their last
    access), summed since the split attached. Under LRU the victim's age is the pool's characteristic time
    (Che's approximation: an entry is hit iff it is reused within it). Called by the tree
    (:attr:`~mamba_radix.tree.RadixTree.on_victim`) once per victim: a leaf with a checkpoint KV eviction
    picked (``"kv"``; a KV-only leaf costs no hit and is not reported) or a checkpoint state eviction
    picked (``"state"``). O(1) a call."""

    kv_age: int = 0
    kv_victims: int = 0
    state_age: int = 0
    state_victims: int = 0

    def __call__(self, kind: VictimKind, age_ticks: int) -> None:
        if kind == "kv":
            self.kv_age += age_ticks
            self.kv_victims += 1
        else:
            self.state_age += age_ticks
            self.state_victims += 1


@dataclass(frozen=True)
class SplitOptions:
    """How the split moves: every ``every`` finished requests, by ``step_fraction`` of the state pool's
    bytes (at least one slot's), when one pool's mean victim age is below ``1 - tolerance`` of the
    other's; never below ``min_slots`` slots or ``min_kv_tokens`` KV tokens (the engine raises the
    latter to its longest request)."""

    every: int = 16
    step_fraction: float = 0.125
    tolerance: float = 0.25
    min_slots: int = 8
    min_kv_tokens: int = 0

    def __post_init__(self) -> None:
        if self.every < 1 or self.min_slots < 1 or self.min_kv_tokens < 0:
            raise ConfigError(
                "split options: every and min_slots must be >= 1 and min_kv_tokens >= 0, got "
                f"{self.every}, {self.min_slots}, {self.min_kv_tokens}"
            )
        if not 0.0 < self.step_fraction <= 1.0 or not 0.0 <= self.tolerance < 1.0:
            raise ConfigError(
                f"split step_fraction must be in (0, 1] and tolerance in [0, 1), got {self.step_fraction} "
                f"and {self.tolerance}"
            )

    def step_slots(self, state_slots: int) -> int:
        """Slots one decision moves when the state pool holds ``state_slots``."""
        return max(1, round(state_slots * self.step_fraction))


@dataclass(frozen=True)
class SplitStep:
    """One decision: after ``finished`` requests the pools may hand out ``kv_tokens`` and ``state_slots``
    (the mean victim ages that led to it, ``None`` where a pool evicted nothing)."""

    finished: int
    kv_tokens: int
    state_slots: int
    kv_victim_age: float | None
    state_victim_age: float | None


@dataclass
class AdaptiveSplit:
    """The controller (see the module docstring). ``budget_bytes`` is shared by
    ``kv_tokens * bytes_per_kv_token + state_slots * bytes_per_state_slot``; ``kv_tokens`` and
    ``state_slots`` are where it starts. ``page_size``: the KV allocator's; every KV line is a whole number of
    pages (a starting ``kv_tokens`` is rounded down to one, as a static paged pool is)."""

    options: SplitOptions
    budget_bytes: int
    bytes_per_kv_token: int
    bytes_per_state_slot: int
    kv_tokens: int
    state_slots: int
    page_size: int = 1
    history: list[SplitStep] = field(default_factory=list)
    victim_ages: VictimAges = field(default_factory=VictimAges)
    _finished: int = 0
    _seen: tuple[int, int, int, int] = (0, 0, 0, 0)

    def __post_init__(self) -> None:
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ConfigError(f"page_size must be a positive integer, got {self.page_size!r}")
        self.kv_tokens = self._whole_pages(self.kv_tokens)
        used = self.kv_tokens * self.bytes_per_kv_token + self.state_slots * self.bytes_per_state_slot
        if used > self.budget_bytes:
            raise ConfigError(
                f"the starting split takes {used} bytes, over the budget of {self.budget_bytes}"
            )

    @property
    def physical_kv_tokens(self) -> int:
        """KV tokens the whole budget buys, in whole pages: the allocator's physical size."""
        return self._whole_pages(self.budget_bytes // self.bytes_per_kv_token)

    @property
    def physical_state_slots(self) -> int:
        """State slots the whole budget buys: the state pool's physical size."""
        return self.budget_bytes // self.bytes_per_state_slot

    def attach(self, cache: MambaRadixCache) -> None:
        """Lend the pools of ``cache`` (built at the physical sizes) the starting split, and make
        :attr:`victim_ages` the observer of its tree's evictions (before any: attach a fresh cache).
        Raises :class:`ConfigError` for a cache of another page size than the split's or a tree that
        reports to another observer. O(1)."""
        if cache.config.page_size != self.page_size:
            raise ConfigError(
                f"the adaptive split was built for page_size {self.page_size} but the cache has "
                f"{cache.config.page_size}; pass the cache's page_size to AdaptiveSplit"
            )
        tree = cache.tree
        if tree.on_victim is not None and tree.on_victim is not self.victim_ages:
            raise ConfigError("the cache's tree already reports its eviction victims to another observer")
        tree.on_victim = self.victim_ages
        cache.token_to_kv_pool_allocator.set_capacity(self.kv_tokens)
        cache.mamba_pool.set_capacity(self.state_slots)

    def after_finish(self, cache: MambaRadixCache) -> SplitStep | None:
        """Count a finished request; every ``every`` of them, decide and maybe move the line (evicting
        what the shrinking pool no longer holds). Returns the decision, if one was taken. O(1) plus the
        eviction's cost."""
        self._finished += 1
        if self._finished % self.options.every:
            return None
        ages = self.victim_ages
        now = (ages.kv_age, ages.kv_victims, ages.state_age, ages.state_victims)
        kv_age, kv_n, state_age, state_n = (a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        kv_mean = kv_age / kv_n if kv_n else None
        state_mean = state_age / state_n if state_n else None
        keep = 1.0 - self.options.tolerance
        if kv_mean is not None and (state_mean is None or kv_mean < keep * state_mean):
            self._to_kv(cache)
        elif state_mean is not None and (kv_mean is None or state_mean < keep * kv_mean):
            self._to_states(cache)
        step = SplitStep(self._finished, self.kv_tokens, self.state_slots, kv_mean, state_mean)
        self.history.append(step)
        return step

    def _to_kv(self, cache: MambaRadixCache) -> None:
        """Move ``step_slots`` slots' worth of bytes from the state pool to the KV pool."""
        pool = cache.mamba_pool
        slots = min(self.options.step_slots(self.state_slots), self.state_slots - self.options.min_slots)
        if slots <= 0:
            return
        target = self.state_slots - slots
        if pool.used > target:
            cache.evict(num_states=pool.used - target)
        target = max(target, pool.used)  # locked checkpoints and running requests' slots stay
        if target >= self.state_slots:
            return
        pool.set_capacity(target)
        self.state_slots = target
        self.kv_tokens = self._whole_pages(
            self._rest_of_budget(
                self.state_slots * self.bytes_per_state_slot, self.bytes_per_kv_token, self.physical_kv_tokens
            )
        )
        cache.token_to_kv_pool_allocator.set_capacity(self.kv_tokens)

    def _to_states(self, cache: MambaRadixCache) -> None:
        """Move ``step_slots`` slots' worth of bytes from the KV pool to the state pool."""
        allocator = cache.token_to_kv_pool_allocator
        page = self.page_size
        min_kv_tokens = -(-self.options.min_kv_tokens // page) * page  # the floor, in whole pages
        spare = (self.kv_tokens - min_kv_tokens) * self.bytes_per_kv_token // self.bytes_per_state_slot
        slots = min(
            self.options.step_slots(self.state_slots), self.physical_state_slots - self.state_slots, spare
        )
        if slots <= 0:
            return
        # whole pages: at least the slots' bytes leave the KV pool (a page multiple above the floor stays so)
        target = self._whole_pages(
            self.kv_tokens - math.ceil(slots * self.bytes_per_state_slot / self.bytes_per_kv_token)
        )
        held = allocator.used + cache.reserved_kv_tokens  # running requests' decode is reserved
        if held > target:
            cache.evict(num_tokens=held - target)
            held = allocator.used + cache.reserved_kv_tokens
        if held > target:
            return  # locked KV: try again at the next decision
        allocator.set_capacity(target)
        self.kv_tokens = target
        self.state_slots = self._rest_of_budget(
            self.kv_tokens * self.bytes_per_kv_token, self.bytes_per_state_slot, self.physical_state_slots
        )
        cache.mamba_pool.set_capacity(self.state_slots)

    def _whole_pages(self, kv_tokens: int) -> int:
        """``kv_tokens`` rounded down to whole pages."""
        return kv_tokens - kv_tokens % self.page_size

    def _rest_of_budget(self, other_bytes: int, unit_bytes: int, physical_units: int) -> int:
        """The units of ``unit_bytes`` the budget buys besides the other pool's ``other_bytes`` (at most the
        pool's physical size): the pool that grows gets every byte the other one does not hold."""
        return min((self.budget_bytes - other_bytes) // unit_bytes, physical_units)
