"""Allocation failures injected into live pools, and undone exactly.

Two kinds, both realistic for an engine:

- :class:`CapacityHold`: entries taken from a pool by someone else (another batch, a fragmented
  allocator). They are real allocations, listed as the owner ``"fault"`` in conservation checks, and given
  back by :meth:`CapacityHold.release`.
- :class:`FailNextAllocs`: the next ``count`` calls of an allocation method return ``None`` although the
  pool reports free room (a transient failure: a concurrent allocator, a fragmented device heap). The method
  is wrapped on the *instance*; the class is untouched and the wrapper removes itself once spent, or on
  :meth:`FailNextAllocs.disarm`.

Both are O(1) to arm plus the cost of the allocation they stand for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CapacityHold", "FailNextAllocs"]


class CapacityHold:
    """Entries held away from a pool. ``alloc(n)`` must return an index tensor or ``None``;
    ``free(indices)`` gives them back."""

    def __init__(self, alloc: Callable[[int], Any], free: Callable[[Any], None]) -> None:
        self._alloc = alloc
        self._free = free
        self.held: list[int] = []

    def take(self, num: int) -> int:
        """Take ``num`` entries if the pool has them (all or nothing); returns how many were taken."""
        if num <= 0:
            return 0
        got = self._alloc(num)
        if got is None:
            return 0
        self.held.extend(int(i) for i in got.tolist())
        return len(got)

    def release(self, to_tensor: Callable[[list[int]], Any]) -> None:
        """Give every held entry back (``to_tensor`` builds the argument ``free`` expects)."""
        if self.held:
            self._free(to_tensor(self.held))
        self.held = []


class FailNextAllocs:
    """Make the next ``count`` calls of ``target.<method>`` return ``None``, then restore the method."""

    def __init__(self, target: object, method: str = "alloc") -> None:
        self.target = target
        self.method = method
        self.remaining = 0
        self.fired = 0

    @property
    def armed(self) -> bool:
        return self.remaining > 0

    def arm(self, count: int) -> None:
        """Fail the next ``count`` calls (added to any failures still pending)."""
        if count <= 0:
            return
        if not self.armed:
            original = getattr(type(self.target), self.method)

            def failing(*args: Any, **kwargs: Any) -> Any:
                self.remaining -= 1
                self.fired += 1
                if self.remaining <= 0:
                    self.disarm()
                return None

            failing.__wrapped__ = original  # type: ignore[attr-defined]
            setattr(self.target, self.method, failing)
        self.remaining += count

    def disarm(self) -> None:
        """Restore the class's method on the instance; pending failures are dropped."""
        self.remaining = 0
        if self.method in vars(self.target):
            delattr(self.target, self.method)
