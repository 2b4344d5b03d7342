"""Pools with a usable capacity below their physical size, movable at run time: the adaptive split's pools.

An adaptive KV/state split (:mod:`mamba_radix.sim.split`) sizes both pools physically for the whole byte
budget and lends each only part of it: the KV allocator and the state pool each withhold what the other
pool holds in bytes. Withheld ids stay in the free list (they are free, nobody owns them: conservation is
unchanged); ``available_size()`` and ``alloc`` just act as if the pool were smaller.

A research hook, so it lives with the simulator: the core pools (:mod:`mamba_radix.pools`) know nothing of
it, and the engine builds these subclasses only for a run with a split. Each override is one integer test
before the core method while nothing is withheld.

Unified memory (``enable_unified_memory``) uses the same pools another way: both draw on one
:class:`SharedByteBudget`, so the state slots and KV tokens a run may hold move with its load (the counting
form of :class:`~mamba_radix.pools.UnifiedMemoryPool`, without fragmentation: SGLang compacts each side).

At ``page_size > 1`` the KV side is :class:`LimitedPagedKVAllocator`: SGLang's unified pool hands KV out in
whole pages, so the budget charges and refunds whole pages (``page_size * bytes_per_kv_token`` each) and
the KV side's free units are the whole pages the unspent bytes buy; a page is never split between KV and
states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, overload

import torch

from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mamba_radix.pools._indices import IndexLike, as_index_tensor, check_count

__all__ = [
    "CapacityLimit",
    "LimitedKVAllocator",
    "LimitedMambaPool",
    "LimitedPagedKVAllocator",
    "SharedByteBudget",
    "limited_kv_allocator",
]


class SharedByteBudget:
    """``total_bytes`` that a KV allocator (``bytes_per_kv_token`` each) and a state pool
    (``bytes_per_state_slot`` each) draw on together: an id may be handed out only while ``used`` of
    both, in bytes, stays within the budget. Attach it with :meth:`attach` to both pools (sized
    physically for the whole budget); their ``available_size()`` and ``alloc`` then honour it. Who gives
    way when it is spent is the caller's eviction (the pool's give-way rule). O(1) per query.

    A paged KV allocator (``page_size > 1``) holds whole pages, so its ``used`` (tokens) is always a page
    multiple and the KV side's free units (:meth:`free_units`) are whole pages' tokens: :attr:`kv_page_size`
    is read from the allocator at :meth:`attach`.

    Two optional limits (:mod:`mamba_radix.sim.unified` sets them):

    - ``protected_kv_tokens``: a callable giving the KV tokens the state side must leave free (running
      requests' KV reservations that the tree's evictable KV does not cover), so that a state never
      takes the bytes an admitted request will decode into;
    - ``floor_bytes``: ``{"state": b, "kv": b}``, bytes each side keeps out of the other's reach (the
      ``floor`` give-way rule).
    """

    def __init__(
        self,
        total_bytes: int,
        bytes_per_kv_token: int,
        bytes_per_state_slot: int,
        *,
        protected_kv_tokens: Callable[[], int] | None = None,
        floor_bytes: dict[str, int] | None = None,
    ) -> None:
        for name, value in (
            ("total_bytes", total_bytes),
            ("bytes_per_kv_token", bytes_per_kv_token),
            ("bytes_per_state_slot", bytes_per_state_slot),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        floors = dict(floor_bytes or {})
        if any(floors.get(k, 0) < 0 for k in ("kv", "state")) or sum(floors.values()) > total_bytes:
            raise ConfigError(
                f"floor_bytes {floors} must be >= 0 and fit the {total_bytes:,} B budget together"
            )
        self.total_bytes = total_bytes
        self.unit_bytes = {"kv": bytes_per_kv_token, "state": bytes_per_state_slot}
        self.protected_kv_tokens = protected_kv_tokens
        # the bytes the *other* side may never take from each side (0: no floor)
        self.floor_bytes = {"kv": floors.get("kv", 0), "state": floors.get("state", 0)}
        self.pools: dict[str, CapacityLimit] = {}
        # KV tokens per page of the attached allocator: the KV side's granule (1 until attached)
        self.kv_page_size = 1

    def attach(
        self, kv_allocator: LimitedKVAllocator | LimitedPagedKVAllocator, state_pool: LimitedMambaPool
    ) -> None:
        """Make both pools draw on this budget (the KV side in whole pages of the allocator's
        ``page_size``). Raises :class:`InvalidArgument` (nothing changed) when what they hold already
        exceeds it. O(1)."""
        used = kv_allocator.used * self.unit_bytes["kv"] + state_pool.used * self.unit_bytes["state"]
        if used > self.total_bytes:
            raise InvalidArgument(f"the pools hold {used:,} B, more than the {self.total_bytes:,} B budget")
        self.pools = {"kv": kv_allocator, "state": state_pool}
        self.kv_page_size = getattr(kv_allocator, "page_size", 1)
        kv_allocator.shared = state_pool.shared = self

    def used_bytes(self, kind: str | None = None) -> int:
        """Bytes held by ``kind``'s pool (``"kv"`` or ``"state"``), or by both (None). O(1)."""
        if kind is not None:
            return self.pools[kind].used * self.unit_bytes[kind]
        return sum(p.used * self.unit_bytes[k] for k, p in self.pools.items())

    def room_bytes(self, kind: str) -> int:
        """Unspent bytes ``kind``'s side (``"kv"`` or ``"state"``) may take: less the protected KV for the
        state side, never into the other side's floor; negative when the protection exceeds what is free.
        O(1) (plus the protection callable)."""
        free = self.total_bytes - self.used_bytes()
        if kind == "state" and self.protected_kv_tokens is not None:
            free -= self.protected_kv_tokens() * self.unit_bytes["kv"]
        other = "state" if kind == "kv" else "kv"
        if self.floor_bytes[other]:
            free = min(free, self.total_bytes - self.floor_bytes[other] - self.used_bytes(kind))
        return free

    def free_units(self, kind: str) -> int:
        """KV tokens (``kind="kv"``) or state slots the unspent bytes buy (:meth:`room_bytes`, whole
        units; KV in whole pages of :attr:`kv_page_size` tokens). O(1) (plus the protection callable)."""
        units = max(self.room_bytes(kind), 0) // self.unit_bytes[kind]
        if kind == "kv" and self.kv_page_size != 1:
            # a page is KV or free as a whole: bytes short of a page buy no KV token
            units -= units % self.kv_page_size
        return units


class CapacityLimit:
    """Mixin for a pool with ``size`` ids and ``used`` allocated ones: a usable :attr:`capacity`.

    The pool classes below subtract :attr:`withheld` in ``available_size()`` and refuse an ``alloc``
    beyond it (only while something is withheld: one integer test on the hot path otherwise).
    """

    size: int
    used: int  # allocated ids (each pool defines it)
    withheld: int = 0  # free ids the pool does not hand out (capacity = size - withheld)
    shared: SharedByteBudget | None = None  # unified memory: the byte budget both pools draw on

    @property
    def capacity(self) -> int:
        """Ids this pool may hand out in all: ``used + available_size()``."""
        return self.size - self.withheld

    def set_capacity(self, capacity: int) -> None:
        """Let the pool hand out at most ``capacity`` ids in all. Raises :class:`InvalidArgument` (nothing
        changed) past the physical size or below what is allocated now (evict first). O(1)."""
        check_count(capacity, "capacity")
        if capacity > self.size:
            raise InvalidArgument(f"capacity {capacity} exceeds the pool's physical size {self.size}")
        if capacity < self.used:
            raise InvalidArgument(
                f"capacity {capacity} is below the {self.used} ids allocated now; evict or free first"
            )
        self.withheld = self.size - capacity


class LimitedMambaPool(CapacityLimit, MambaPool):
    """A :class:`~mamba_radix.pools.MambaPool` with :meth:`set_capacity`. ``fork`` reads
    ``available_size()``, so it honours the capacity too."""

    def available_size(self) -> int:
        """Free slots less the :attr:`withheld` ones, at most what the shared budget buys. O(1)."""
        free = MambaPool.available_size(self) - self.withheld
        return free if self.shared is None else min(free, self.shared.free_units("state"))

    @overload
    def alloc(self, num_slots: int) -> torch.Tensor | None: ...
    @overload
    def alloc(self, num_slots: int, *, as_list: Literal[True]) -> list[int] | None: ...
    def alloc(self, num_slots: int, *, as_list: bool = False) -> torch.Tensor | list[int] | None:
        """:meth:`MambaPool.alloc`, or ``None`` and nothing taken past the capacity. O(num_slots)."""
        check_count(num_slots, "num_slots")
        if (self.withheld or self.shared is not None) and num_slots > self.available_size():
            return None
        return MambaPool.alloc(self, num_slots, as_list=as_list)  # type: ignore[call-overload]


class LimitedKVAllocator(CapacityLimit, TokenToKVPoolAllocator):
    """A token-granular :class:`~mamba_radix.pools.TokenToKVPoolAllocator` with :meth:`set_capacity`
    (page size 1; :class:`LimitedPagedKVAllocator` above)."""

    def available_size(self) -> int:
        """Free KV indices less the :attr:`withheld` ones, at most what the shared budget buys. O(1), no
        device sync."""
        free = TokenToKVPoolAllocator.available_size(self) - self.withheld
        return free if self.shared is None else min(free, self.shared.free_units("kv"))

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """:meth:`TokenToKVPoolAllocator.alloc`, or ``None`` and nothing taken past the capacity.
        O(num_tokens) amortised."""
        check_count(num_tokens, "num_tokens")
        if (self.withheld or self.shared is not None) and num_tokens > self.available_size():
            return None
        return TokenToKVPoolAllocator.alloc(self, num_tokens)


class LimitedPagedKVAllocator(CapacityLimit, PagedTokenToKVPoolAllocator):
    """A page-granular :class:`~mamba_radix.pools.PagedTokenToKVPoolAllocator` with :meth:`set_capacity`
    and a shared byte budget, both in whole pages: ``size``, ``used``, ``withheld`` and ``available_size()``
    count tokens, always page multiples, so a page is charged to (and refunded from) the budget as a
    whole. Every allocation (``alloc``, ``alloc_extend``, ``alloc_decode``) first counts the fresh pages
    it would take and returns ``None``, nothing taken, past the capacity."""

    def set_capacity(self, capacity: int) -> None:
        """:meth:`CapacityLimit.set_capacity` for a page multiple of tokens. Raises
        :class:`InvalidArgument` (nothing changed) for a capacity that would split a page. O(1)."""
        check_count(capacity, "capacity")
        if capacity % self.page_size:
            raise InvalidArgument(
                f"capacity {capacity} is not a multiple of page_size {self.page_size}; "
                f"use {capacity - capacity % self.page_size}"
            )
        CapacityLimit.set_capacity(self, capacity)

    @property
    def used(self) -> int:
        """Allocated KV indices (whole pages): the physical count, whatever the capacity (the parent
        derives it from ``available_size()``, which this class lowers)."""
        return self.size - PagedTokenToKVPoolAllocator.available_size(self)

    def available_size(self) -> int:
        """Free KV indices (whole pages) less the :attr:`withheld` ones, at most the whole pages the
        shared budget buys. O(1), no device sync."""
        free = PagedTokenToKVPoolAllocator.available_size(self) - self.withheld
        return free if self.shared is None else min(free, self.shared.free_units("kv"))

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """:meth:`PagedTokenToKVPoolAllocator.alloc` (whole pages), or ``None`` and nothing taken past the
        capacity; a count that is not whole pages raises as the parent does. O(num_tokens)."""
        check_count(num_tokens, "num_tokens")
        limited = self.withheld or self.shared is not None
        if limited and not num_tokens % self.page_size and num_tokens > self.available_size():
            return None
        return PagedTokenToKVPoolAllocator.alloc(self, num_tokens)

    def alloc_extend(
        self, prefix_lens: IndexLike, seq_lens: IndexLike, last_loc: IndexLike, extend_num_tokens: int
    ) -> torch.Tensor | None:
        """:meth:`PagedTokenToKVPoolAllocator.alloc_extend`, or ``None`` and nothing taken when its fresh
        pages (``sum(ceil(seq / page) - ceil(prefix / page))``) exceed the capacity. Misuse raises as the
        parent does. O(extend_num_tokens + requests)."""
        if self.withheld or self.shared is not None:
            pages = self._fresh_pages(prefix_lens, seq_lens)
            if pages is not None and pages * self.page_size > self.available_size():
                return None
        return PagedTokenToKVPoolAllocator.alloc_extend(
            self, prefix_lens, seq_lens, last_loc, extend_num_tokens
        )

    def alloc_decode(self, seq_lens: IndexLike, last_loc: IndexLike) -> torch.Tensor | None:
        """:meth:`PagedTokenToKVPoolAllocator.alloc_decode`, or ``None`` and nothing taken when the
        requests whose decoded token starts a page need more pages than the capacity leaves. O(requests)."""
        if self.withheld or self.shared is not None:
            seq = as_index_tensor(seq_lens, self.device, "seq_lens")
            pages = self._fresh_pages(seq - 1, seq)
            if pages is not None and pages * self.page_size > self.available_size():
                return None
        return PagedTokenToKVPoolAllocator.alloc_decode(self, seq_lens, last_loc)

    def _fresh_pages(self, prefix_lens: IndexLike, seq_lens: IndexLike) -> int | None:
        """The pages an allocation of positions ``[prefix, seq)`` takes, or ``None`` for arguments the
        parent refuses (it raises the error then). O(requests)."""
        prefix = as_index_tensor(prefix_lens, self.device, "prefix_lens")
        seq = as_index_tensor(seq_lens, self.device, "seq_lens")
        if prefix.numel() != seq.numel() or not prefix.numel():
            return None
        if bool((prefix < 0).any()) or bool((seq < prefix).any()):
            return None
        ps = self.page_size
        return int(((seq + ps - 1) // ps - (prefix + ps - 1) // ps).sum())


def limited_kv_allocator(
    num_tokens: int, page_size: int, device: str | torch.device = "cpu"
) -> LimitedKVAllocator | LimitedPagedKVAllocator:
    """:func:`~mamba_radix.pools.make_kv_allocator`'s signature for the capacity-limited allocators of the
    split and of unified memory: token-granular at page size 1, :class:`LimitedPagedKVAllocator` above
    (``num_tokens`` a multiple of ``page_size``, else :class:`InvalidArgument`, before anything is
    allocated). O(num_tokens)."""
    if page_size == 1:
        return LimitedKVAllocator(num_tokens, device)
    return LimitedPagedKVAllocator(num_tokens, page_size, device)
