"""A two-ended byte-range allocator: one side grows up from the low addresses, the other down from the top.

The unified memory pool (:mod:`mamba_radix.pools.unified`) lends one byte buffer to two kinds of units of
different sizes: recurrent-state slots (the ``low`` side) and KV pages (the ``high`` side). Unit ``u`` of a
side covers bytes ``[u * unit_bytes, (u + 1) * unit_bytes)`` of the buffer, so an id is also its address and
needs no translation. Region map (addresses grow to the right)::

    [0, reserved)          the padding sink: unit 0 of both sides aliases it, nothing real lives there
    [low_min, low_top)     the low side's span: live units and holes (freed units below its frontier)
    [low_top, high_bottom) the gap: free bytes either side may take
    [high_bottom, top)     the high side's span: live units and holes
    [top, total_bytes)     slack: less than one high unit, never used

Allocation takes a side's own holes first (lowest first on the low side, highest first on the high side,
so each side stays packed against its end) and only then extends its frontier into the gap. A free that
leaves the unit next to the gap free pulls the frontier back over every free unit behind it, so the gap
grows again. A hole inside one side is not usable by the other: that is this allocator's fragmentation
(SGLang's ``MultiEndedAllocator`` avoids it by moving survivors into holes and translating virtual ids;
see ``docs/pools.md``). The allocator never decides who gives way when the sides meet: it refuses the
allocation (``None``, nothing changed) and the pool's give-way rule names the side to evict from.

Pure Python ints, no torch: the pool and the simulator share it. Every method is O(k log n) for k ids
(heaps of holes with lazy deletion); nothing scans the buffer.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from mamba_radix.errors import InvalidArgument, InvalidIndex

__all__ = ["SIDES", "TwoEndedAllocator"]

SIDES: tuple[str, str] = ("low", "high")


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
    return value


class TwoEndedAllocator:
    """Byte ranges of ``total_bytes`` for ``low`` units of ``low_unit_bytes`` and ``high`` units of
    ``high_unit_bytes``; the first ``reserved_bytes`` are the padding sink.

    ``cap_bytes[side]`` bounds a side's span (live units and holes), None for no bound: the ``floor``
    give-way rule keeps the other side's floor out of reach with it. Raises :class:`InvalidArgument`
    when the buffer holds no unit of a side past the sink.
    """

    def __init__(
        self,
        total_bytes: int,
        low_unit_bytes: int,
        high_unit_bytes: int,
        reserved_bytes: int = 0,
    ) -> None:
        self.total_bytes = _positive(total_bytes, "total_bytes")
        self.unit_bytes = {
            "low": _positive(low_unit_bytes, "low_unit_bytes"),
            "high": _positive(high_unit_bytes, "high_unit_bytes"),
        }
        if isinstance(reserved_bytes, bool) or not isinstance(reserved_bytes, int) or reserved_bytes < 0:
            raise InvalidArgument(f"reserved_bytes must be an int >= 0, got {reserved_bytes!r}")
        self.reserved_bytes = reserved_bytes
        lub, hub = low_unit_bytes, high_unit_bytes
        # first ids past the sink (ceil), and one past the high side's last id
        self.min_id = {"low": -(-reserved_bytes // lub), "high": -(-reserved_bytes // hub)}
        self.high_end = total_bytes // hub
        self.low_end = total_bytes // lub
        for side, end in (("low", self.low_end), ("high", self.high_end)):
            if end <= self.min_id[side]:
                raise InvalidArgument(
                    f"total_bytes={total_bytes} holds no {side} unit of {self.unit_bytes[side]} B past the "
                    f"{reserved_bytes} B padding sink; give a larger buffer"
                )
        self.cap_bytes: dict[str, int | None] = {"low": None, "high": None}
        self.clear()

    # ------------------------------------------------------------------------------------------ state
    def clear(self) -> None:
        """Free every unit of both sides; both frontiers go back to their ends. O(1) (drops the sets)."""
        self.low_frontier = self.min_id["low"]  # one past the low span's last id
        self.high_frontier = self.high_end  # the high span's lowest id
        self._live: dict[str, set[int]] = {"low": set(), "high": set()}
        self._holes: dict[str, set[int]] = {"low": set(), "high": set()}
        # min-heaps; the high side stores negated ids so its highest hole pops first
        self._heap: dict[str, list[int]] = {"low": [], "high": []}

    def set_cap(self, side: str, cap_bytes: int | None) -> None:
        """Bound ``side``'s span to ``cap_bytes`` (None: no bound). Raises :class:`InvalidArgument`
        below its span now (nothing changed). O(1)."""
        self._check_side(side)
        if cap_bytes is not None:
            if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0:
                raise InvalidArgument(f"cap_bytes must be an int >= 0 or None, got {cap_bytes!r}")
            if cap_bytes < self.span_bytes(side):
                raise InvalidArgument(
                    f"cap {cap_bytes} B is below the {side} side's span of {self.span_bytes(side)} B; free first"
                )
        self.cap_bytes[side] = cap_bytes

    # ------------------------------------------------------------------------------------ boundaries
    @property
    def low_top(self) -> int:
        """First byte past the low span."""
        return self.low_frontier * self.unit_bytes["low"]

    @property
    def high_bottom(self) -> int:
        """First byte of the high span (the top of the high side's range when it is empty)."""
        return self.high_frontier * self.unit_bytes["high"]

    @property
    def gap_bytes(self) -> int:
        """Free bytes between the two spans."""
        return self.high_bottom - self.low_top

    def span_bytes(self, side: str) -> int:
        """Bytes of ``side``'s span: its live units and its holes."""
        return self.span_units(side) * self.unit_bytes[side]

    def span_units(self, side: str) -> int:
        if side == "low":
            return self.low_frontier - self.min_id["low"]
        return self.high_end - self.high_frontier

    def live(self, side: str) -> frozenset[int]:
        """Allocated ids of ``side``. O(n) (a copy)."""
        return frozenset(self._live[side])

    def holes(self, side: str) -> frozenset[int]:
        """Free ids inside ``side``'s span. O(n) (a copy)."""
        return frozenset(self._holes[side])

    def used(self, side: str) -> int:
        return len(self._live[side])

    def extendable(self, side: str) -> int:
        """Units ``side`` may add past its frontier now: the gap in its units, less what its cap
        forbids. O(1)."""
        unit = self.unit_bytes[side]
        cap = self.cap_bytes[side]
        cap_units = None if cap is None else cap // unit - self.span_units(side)
        if side == "low":
            room = self.high_bottom // unit - self.low_frontier
            room = min(room, self.low_end - self.low_frontier)
        else:
            lowest = max(-(-self.low_top // unit), self.min_id["high"])
            room = self.high_frontier - lowest
        return max(0, room if cap_units is None else min(room, cap_units))

    def available(self, side: str) -> int:
        """Units an :meth:`alloc` of ``side`` could take now: its holes plus :meth:`extendable`. O(1)."""
        return len(self._holes[side]) + self.extendable(side)

    # ------------------------------------------------------------------------------------ alloc/free
    def alloc(self, side: str, count: int) -> list[int] | None:
        """``count`` ids of ``side``: holes first (the low side's lowest, the high side's highest), then
        new ids past the frontier, in that order; or None and nothing changed when fewer are available.
        O(count log holes)."""
        self._check_side(side)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgument(f"count must be an int >= 0, got {count!r}")
        if count > self.available(side):
            return None
        out: list[int] = []
        holes, heap, live = self._holes[side], self._heap[side], self._live[side]
        sign = 1 if side == "low" else -1
        while len(out) < count and holes:
            unit = sign * heapq.heappop(heap)
            if unit in holes:  # else a stale entry: the id was pulled back into the gap since
                holes.discard(unit)
                out.append(unit)
        more = count - len(out)
        if more:
            if side == "low":
                new = range(self.low_frontier, self.low_frontier + more)
                self.low_frontier += more
            else:
                new = range(self.high_frontier - 1, self.high_frontier - more - 1, -1)
                self.high_frontier -= more
            out.extend(new)
        live.update(out)
        return out

    def free(self, side: str, ids: Iterable[int]) -> None:
        """Give back allocated ``ids`` of ``side``. Raises :class:`InvalidIndex` and frees nothing for an
        id not allocated or repeated. Side effect: the frontier moves back over free units at the gap.
        O(k log n)."""
        self._check_side(side)
        units = list(ids)
        live = self._live[side]
        if len(set(units)) != len(units):
            raise InvalidIndex(f"free got a repeated {side} id in {sorted(units)}; free each id once")
        for u in units:
            if type(u) is not int or u not in live:
                raise InvalidIndex(f"{side} id {u!r} is not allocated; free only ids alloc returned")
        holes, heap = self._holes[side], self._heap[side]
        sign = 1 if side == "low" else -1
        for u in units:
            live.discard(u)
            holes.add(u)
            heapq.heappush(heap, sign * u)
        self._retract(side)
        if len(heap) > 2 * len(holes) + 64:  # drop stale entries now and then: O(n) amortised away
            self._heap[side] = [sign * u for u in holes]
            heapq.heapify(self._heap[side])

    def _retract(self, side: str) -> None:
        """Pull ``side``'s frontier back over the free units next to the gap (they leave the hole set;
        their heap entries go stale). O(units pulled back)."""
        holes = self._holes[side]
        if side == "low":
            while self.low_frontier > self.min_id["low"] and self.low_frontier - 1 in holes:
                self.low_frontier -= 1
                holes.discard(self.low_frontier)
        else:
            while self.high_frontier < self.high_end and self.high_frontier in holes:
                holes.discard(self.high_frontier)
                self.high_frontier += 1

    def _check_side(self, side: str) -> None:
        if side not in SIDES:
            raise InvalidArgument(f"side must be 'low' or 'high', got {side!r}")
