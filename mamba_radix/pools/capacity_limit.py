"""A usable capacity below a pool's physical size, movable at run time.

An adaptive KV/state split (:mod:`mamba_radix.sim.split`) sizes both pools physically for the whole byte
budget and lends each only part of it: the KV allocator and the state pool each withhold what the other
pool holds in bytes. Withheld ids stay in the free list (they are free, nobody owns them: conservation is
unchanged); ``available_size()`` and ``alloc`` just act as if the pool were smaller.
"""

from __future__ import annotations

from mamba_radix.errors import InvalidArgument
from mamba_radix.pools._indices import check_count

__all__ = ["CapacityLimit"]


class CapacityLimit:
    """Mixin for a pool with ``size`` ids, ``used`` allocated ones and a free list: a usable ``capacity``.

    Subclasses subtract :attr:`withheld` in ``available_size()`` and refuse an ``alloc`` beyond it
    (only while something is withheld: one integer test on the hot path otherwise).
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
