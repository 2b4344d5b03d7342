"""One ordered candidate set of the eviction index: unique tuple keys ending with the node id, smallest
first. Three forms with the same members in the same order (``property_tests/test_eviction_lazy.py`` and
``test_evict_fast.py`` check them against each other, alone and inside whole trees);
:class:`~mamba_radix.eviction.EvictionIndex` picks one at construction (``lazy_removal``, and the index's
:attr:`~mamba_radix.eviction.EvictionIndex.lazy_set`):

- :class:`KeySet`: a ``sortedcontainers.SortedList``, every removal immediate. The reference.
- :class:`LazyKeySet`: a removal is deferred. Why: on a large tree a ``SortedList.remove`` costs 8-10 us
  (two bisections whose tuple compares miss the cache, then a ``del`` inside a sublist), while an
  ``add`` at the end, where a fresh stamp always lands, costs about 1 us. A touch is a remove then an
  add, so the lazy set marks the old key dead (a set insertion, ~0.1 us) and leaves it in the list;
  :meth:`LazyKeySet.first` drops dead keys when they reach the front, iteration skips them, and the
  list is rebuilt without them once they outnumber the live ones (O(n) every n removals: amortised
  O(1)). Keys are unique (they end with the node id), so a dead key added again is the same entry made
  live, never a second one.
- :class:`LazyHeapKeySet`: deferred removal as :class:`LazyKeySet`, over a binary heap (``heapq``, in C)
  instead of a sorted list: the eviction path only ever asks for the smallest member, so a heap's push,
  pop and peek (~0.1-0.4 us, C) replace the sorted list's Python-level add and pop (~2-3 us, each a few
  cache misses on a cold call). Ordered iteration sorts the live keys (O(n log n), for tests, the
  invariant checker and research policies). The lazy-stamp index uses it
  (:class:`~mamba_radix.eviction.LazyStampIndex`, whose ordered queries sort anyway).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from sortedcontainers import SortedList

__all__ = ["COMPACT_MIN_DEAD", "KeySet", "LazyHeapKeySet", "LazyKeySet"]

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

    __slots__ = ("_compact_min_dead", "_dead", "_front", "_sorted")

    def __init__(self, compact_min_dead: int = COMPACT_MIN_DEAD) -> None:
        self._sorted = SortedList()
        self._dead: set[Key] = set()  # keys still in _sorted but no longer members
        self._compact_min_dead = compact_min_dead
        # the key the last first() returned while it is still the list's front entry (None: unknown).
        # Why: an eviction removes the victim first() just gave; popping it at once costs less than
        # marking it dead and dropping it at the next first(). Cleared by every change that can put
        # another entry in front of it (add, replace_first, compaction) and by popping it.
        self._front: Key | None = None

    def add(self, key: Key) -> None:
        """Make ``key`` a member (it must not be one). O(log n)."""
        self._front = None  # key may sort before it
        dead = self._dead
        if dead and key in dead:
            dead.remove(key)  # still in the list: the same entry is live again
        else:
            self._sorted.add(key)

    def remove(self, key: Key) -> None:
        """Drop member ``key``: popped at once if it is the front entry :meth:`first` just returned
        (an eviction's victim), else marked dead and compacted later. O(1) amortised."""
        front = self._front
        if front is not None and (front is key or front == key):  # equal, not always identical: a
            self._front = None  # revived dead entry keeps its first tuple while the node holds the new one
            self._sorted.pop(0)
            return
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
                self._front = key
                return key
            dead.remove(key)
            ordered.pop(0)
        return None

    def replace_first(self, key: Key) -> None:
        """Drop the smallest member (the one :meth:`first` just returned, so the list's front: no dead
        key is left before it) and make ``key`` a member: a re-key of the front entry without marking
        the old key dead and dropping it again at the next :meth:`first`. O(log n)."""
        self._sorted.pop(0)
        self.add(key)  # clears _front

    def _compact(self) -> None:
        """Rebuild the list from its live keys (already sorted: one linear pass). O(n)."""
        dead = self._dead
        live = [key for key in self._sorted if key not in dead]
        self._front = None
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


class LazyHeapKeySet(LazyKeySet):
    """Unique keys, removal deferred, smallest first: a :class:`LazyKeySet` (the same members, the same
    :meth:`first`, the same order when iterated) whose entries are a binary heap (see the module
    docstring). Every method of the sorted-list form is overridden; ``_sorted`` is unused.

    Dead keys stay in the heap until they reach its top (:meth:`first`) or a compaction (the same rule:
    more than ``compact_min_dead`` and more than the live ones). Costs: :meth:`add` O(log n) in C (O(1)
    for a dead key made live), :meth:`remove` O(1) (O(log n) in C for the top entry), :meth:`first` O(1)
    plus O(log n) per dead key it drops, iteration O(n log n)."""

    __slots__ = ("_heap",)

    def __init__(self, compact_min_dead: int = COMPACT_MIN_DEAD) -> None:
        self._heap: list[Key] = []
        self._dead: set[Key] = set()  # keys still in _heap but no longer members
        self._compact_min_dead = compact_min_dead
        self._front = None  # unused here: the heap's top is read directly (heap[0])

    def add(self, key: Key) -> None:
        """Make ``key`` a member (it must not be one). O(log n)."""
        dead = self._dead
        if dead and key in dead:
            dead.remove(key)  # still in the heap: the same entry is live again
        else:
            heapq.heappush(self._heap, key)

    def remove(self, key: Key) -> None:
        """Drop member ``key``: popped at once if it is the heap's top (an eviction's victim, which
        :meth:`first` just returned), else marked dead and compacted later. O(1) amortised."""
        heap = self._heap
        top = heap[0]  # a member is never in an empty heap
        if top is key or top == key:  # equal, not always identical (a revived dead entry keeps its tuple)
            heapq.heappop(heap)
            return
        dead = self._dead
        dead.add(key)
        if len(dead) > self._compact_min_dead and 2 * len(dead) > len(heap):
            self._compact()

    def first(self) -> Key | None:
        """The smallest member, or None. Side effect: dead keys on top of the heap leave it.
        O(1), plus O(log n) per dead key dropped (each once)."""
        heap, dead = self._heap, self._dead
        while heap:
            key = heap[0]
            if not dead or key not in dead:
                return key
            dead.remove(key)
            heapq.heappop(heap)
        return None

    def replace_first(self, key: Key) -> None:
        """Drop the smallest member (the one :meth:`first` just returned: the heap's top, no dead key
        above it) and make ``key`` a member, in one sift (``heapreplace``). O(log n)."""
        dead = self._dead
        if dead and key in dead:  # key's old entry is still in the heap: make it live, drop the top
            dead.remove(key)
            heapq.heappop(self._heap)
        else:
            heapq.heapreplace(self._heap, key)

    def _compact(self) -> None:
        """Rebuild the heap from its live keys. O(n)."""
        dead = self._dead
        live = [key for key in self._heap if key not in dead]
        heapq.heapify(live)
        self._heap = live
        dead.clear()

    def keys(self) -> list[Key]:
        """The members in order. O(n log n)."""
        dead = self._dead
        return sorted(key for key in self._heap if key not in dead) if dead else sorted(self._heap)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._heap) - len(self._dead)

    def __bool__(self) -> bool:
        return len(self._heap) > len(self._dead)
