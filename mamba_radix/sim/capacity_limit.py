"""Pools with a usable capacity below their physical size, movable at run time: the adaptive split's pools.

An adaptive KV/state split (:mod:`mamba_radix.sim.split`) sizes both pools physically for the whole byte
budget and lends each only part of it: the KV allocator and the state pool each withhold what the other
pool holds in bytes. Withheld ids stay in the free list (they are free, nobody owns them: conservation is
unchanged); ``available_size()`` and ``alloc`` just act as if the pool were smaller.

A research hook, so it lives with the simulator: the core pools (:mod:`mamba_radix.pools`) know nothing of
it, and the engine builds these subclasses only for a run with a split. Each override is one integer test
before the core method while nothing is withheld.
"""

from __future__ import annotations

from typing import Literal, overload

import torch

from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.pools import MambaPool, TokenToKVPoolAllocator
from mamba_radix.pools._indices import check_count

__all__ = ["CapacityLimit", "LimitedKVAllocator", "LimitedMambaPool", "limited_kv_allocator"]


class CapacityLimit:
    """Mixin for a pool with ``size`` ids and ``used`` allocated ones: a usable :attr:`capacity`.

    The pool classes below subtract :attr:`withheld` in ``available_size()`` and refuse an ``alloc``
    beyond it (only while something is withheld: one integer test on the hot path otherwise).
    """

    size: int
    used: int  # allocated ids (each pool defines it)
    withheld: int = 0  # free ids the pool does not hand out (capacity = size - withheld)

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
        """Free slots less the :attr:`withheld` ones. O(1)."""
        return MambaPool.available_size(self) - self.withheld

    @overload
    def alloc(self, num_slots: int) -> torch.Tensor | None: ...
    @overload
    def alloc(self, num_slots: int, *, as_list: Literal[True]) -> list[int] | None: ...
    def alloc(self, num_slots: int, *, as_list: bool = False) -> torch.Tensor | list[int] | None:
        """:meth:`MambaPool.alloc`, or ``None`` and nothing taken past the capacity. O(num_slots)."""
        check_count(num_slots, "num_slots")
        if self.withheld and num_slots > self.available_size():
            return None
        return MambaPool.alloc(self, num_slots, as_list=as_list)  # type: ignore[call-overload]


class LimitedKVAllocator(CapacityLimit, TokenToKVPoolAllocator):
    """A token-granular :class:`~mamba_radix.pools.TokenToKVPoolAllocator` with :meth:`set_capacity`
    (the split moves single tokens: page size 1 only)."""

    def available_size(self) -> int:
        """Free KV indices less the :attr:`withheld` ones. O(1), no device sync."""
        return TokenToKVPoolAllocator.available_size(self) - self.withheld

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """:meth:`TokenToKVPoolAllocator.alloc`, or ``None`` and nothing taken past the capacity.
        O(num_tokens) amortised."""
        check_count(num_tokens, "num_tokens")
        if self.withheld and num_tokens > self.available_size():
            return None
        return TokenToKVPoolAllocator.alloc(self, num_tokens)


def limited_kv_allocator(
    num_tokens: int, page_size: int, device: str | torch.device = "cpu"
) -> LimitedKVAllocator:
    """:func:`~mamba_radix.pools.make_kv_allocator`'s signature for the split's allocator; refuses
    ``page_size > 1`` with :class:`ConfigError` (a paged allocator would move whole pages), before
    anything is allocated. O(num_tokens)."""
    if page_size != 1:
        raise ConfigError(f"the adaptive split moves single KV tokens; use page_size 1, not {page_size}")
    return LimitedKVAllocator(num_tokens, device)
