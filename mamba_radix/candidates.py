"""One ordered candidate set of the eviction index: unique tuple keys ending with the node id, smallest
first. Two forms with the same members in the same order (``property_tests/test_eviction_lazy.py``
checks them against each other, alone and inside whole trees); :class:`~mamba_radix.eviction.EvictionIndex`
picks one at construction (``lazy_removal``):

- :class:`KeySet`: a ``sortedcontainers.SortedList``, every removal immediate. The reference.
- :class:`LazyKeySet`: a removal is deferred. Why: on a large tree a ``SortedList.remove`` costs 8-10 us
  (two bisections whose tuple compares miss the cache, then a ``del`` inside a sublist), while an
  ``add`` at the end, where a fresh stamp always lands, costs about 1 us. A touch is a remove then an
  add, so the lazy set marks the old key dead (a set insertion, ~0.1 us) and leaves it in the list;
  :meth:`LazyKeySet.first` drops dead keys when they reach the front, iteration skips them, and the
  list is rebuilt without them once they outnumber the live ones (O(n) every n removals: amortised
  O(1)). Keys are unique (they end with the node id), so a dead key added again is the same entry made
  live, never a second one.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

__all__ = ["COMPACT_MIN_DEAD", "KeySet", "LazyKeySet"]

# A lazy set compacts once it holds more than this many dead keys and more dead keys than live ones
# (the default of LazyKeySet's compact_min_dead; a property test passes 1 to reach compaction quickly).
COMPACT_MIN_DEAD = 4096

Key = tuple[int, ...]


class KeySet:
    """Unique keys in sorted order, every removal immediate (the reference). O(log n) per change."""

    __slots__ = ("_sorted",)

    def __init__(self) -> None:
        self._sorted = SortedList()

    def add(self, key: Key) -> None:
        """Make ``key`` a member (it must not be one). O(log n)."""
        self._sorted.add(key)

    def remove(self, key: Key) -> None:
        """Drop member ``key``. O(log n)."""
        self._sorted.remove(key)

    def first(self) -> Key | None:
        """The smallest member, or None. O(1)."""
        return self._sorted[0] if self._sorted else None

    def replace_first(self, key: Key) -> None:
        """Drop the smallest member (the one :meth:`first` just returned) and make ``key`` a member: a
        re-key of the front entry. O(log n)."""
        self._sorted.pop(0)
        self._sorted.add(key)

    def keys(self) -> list[Key]:
        """The members in order. O(n)."""
        return list(self._sorted)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self._sorted)

    def __bool__(self) -> bool:
        return bool(self._sorted)


class LazyKeySet:
    """Unique keys in sorted order, removal deferred (see the module docstring): the same members in the
    same order as a :class:`KeySet`. ``compact_min_dead``: the list is rebuilt once it holds more dead
    keys than this and than live ones."""

    __slots__ = ("_compact_min_dead", "_dead", "_sorted")

    def __init__(self, compact_min_dead: int = COMPACT_MIN_DEAD) -> None:
        self._sorted = SortedList()
        self._dead: set[Key] = set()  # keys still in _sorted but no longer members
        self._compact_min_dead = compact_min_dead

    def add(self, key: Key) -> None:
        """Make ``key`` a member (it must not be one). O(log n)."""
        dead = self._dead
        if dead and key in dead:
            dead.remove(key)  # still in the list: the same entry is live again
        else:
            self._sorted.add(key)

    def remove(self, key: Key) -> None:
        """Drop member ``key``: marked dead, compacted later. O(1) amortised."""
        dead = self._dead
        dead.add(key)
        if len(dead) > self._compact_min_dead and 2 * len(dead) > len(self._sorted):
            self._compact()

    def first(self) -> Key | None:
        """The smallest member, or None. Side effect: dead keys in front of it leave the list.
        O(log n) amortised (each dead key is dropped once)."""
        ordered, dead = self._sorted, self._dead
        while ordered:
            key = ordered[0]
            if not dead or key not in dead:
                return key
            dead.remove(key)
            ordered.pop(0)
        return None

    def replace_first(self, key: Key) -> None:
        """Drop the smallest member (the one :meth:`first` just returned, so the list's front: no dead
        key is left before it) and make ``key`` a member: a re-key of the front entry without marking
        the old key dead and dropping it again at the next :meth:`first`. O(log n)."""
        self._sorted.pop(0)
        self.add(key)

    def _compact(self) -> None:
        """Rebuild the list from its live keys (already sorted: one linear pass). O(n)."""
        dead = self._dead
        live = [key for key in self._sorted if key not in dead]
        self._sorted.clear()
        self._sorted.update(live)
        dead.clear()

    def keys(self) -> list[Key]:
        """The members in order. O(n)."""
        return list(self)

    def __iter__(self) -> Iterator[Key]:
        dead = self._dead
        if not dead:
            return iter(self._sorted)
        return (key for key in self._sorted if key not in dead)

    def __len__(self) -> int:
        return len(self._sorted) - len(self._dead)

    def __bool__(self) -> bool:
        return len(self._sorted) > len(self._dead)
