"""Eviction orders: which nodes may be evicted and in what order (:class:`EvictionIndex`).

Two ordered candidate sets, each a ``sortedcontainers.SortedList`` of tuple keys that end with the node
id, so every order is total and deterministic and no wall-clock time is involved:

- **full KV**: unlocked leaves (``full_lock_ref == 0``, no children), keyed
  ``(last_access, -depth, id)``: least recently used first, the deeper of two equally old leaves first.
- **checkpoints**: nodes holding a checkpoint that no request locks (``mamba_lock_ref == 0``); a leaf
  also needs ``full_lock_ref == 0``, because evicting a leaf's checkpoint deletes the leaf and its KV
  (SGLang asserts there instead, issue #21379). Keyed ``(class, stamp, depth rank, id)`` by
  ``mamba_eviction_order``:

  - ``leaf_first``: ``(0, mamba_last_access, -depth, id)``, LRU with the deepest of a tie first;
  - ``root_first``: ``(0, mamba_last_access, depth, id)``, LRU with the shallowest of a tie first;
  - ``mixed``: first class 0, the checkpoints a running request left behind on its own locked KV path
    (``full_lock_ref > 0``: the KV is locked, the superseded checkpoint is not), shallowest first
    whatever their age: ``(0, 0, depth, id)``; then class 1, everything else, LRU with leaf-first ties:
    ``(1, mamba_last_access, -depth, id)``.

``depth`` is in tokens and never changes for an existing node (a split keeps the child's end), so a key
only changes when a stamp, a lock or the leaf status changes. The tree calls :meth:`EvictionIndex.update`
after each such change; membership and key are recomputed from the node in O(1) and the sets are touched
only if they differ: O(log n) per change. Only this module writes ``full_evict_key`` / ``mamba_evict_key``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from mamba_radix.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import EvictionOrder
    from mamba_radix.node import TreeNode

__all__ = [
    "EvictionIndex",
    "full_evict_key",
    "is_full_candidate",
    "is_mamba_candidate",
    "mamba_evict_key",
]


def is_full_candidate(node: TreeNode) -> bool:
    """An unlocked non-root leaf: its KV (and checkpoint, if any) may go."""
    return not node.is_root and not node.children and node.full_lock_ref == 0


def is_mamba_candidate(node: TreeNode) -> bool:
    """A checkpoint no request locks; on a leaf, the leaf's KV must be unlocked too."""
    if node.mamba_slot is None or node.mamba_lock_ref != 0:
        return False
    return bool(node.children) or node.full_lock_ref == 0


def full_evict_key(node: TreeNode) -> tuple[int, ...]:
    return (node.last_access, -node.depth, node.id)


def mamba_evict_key(order: EvictionOrder, node: TreeNode) -> tuple[int, ...]:
    if order == "leaf_first":
        return (0, node.mamba_last_access, -node.depth, node.id)
    if order == "root_first":
        return (0, node.mamba_last_access, node.depth, node.id)
    if node.full_lock_ref > 0:  # mixed, class 0: a running request's superseded checkpoint
        return (0, 0, node.depth, node.id)
    return (1, node.mamba_last_access, -node.depth, node.id)


class EvictionIndex:
    """The two ordered candidate sets. Every operation is O(log n) (n = candidates) except iteration."""

    def __init__(self, order: EvictionOrder) -> None:
        if order not in ("leaf_first", "root_first", "mixed"):
            raise ConfigError(
                f"--mamba-eviction-order must be leaf_first, root_first or mixed, got {order!r}"
            )
        self.order: EvictionOrder = order
        self._full: SortedList = SortedList()
        self._mamba: SortedList = SortedList()
        self._nodes: dict[int, TreeNode] = {}  # id -> node, for every node in either set

    # ------------------------------------------------------------------------------------------ updates
    def update(self, node: TreeNode) -> None:
        """Re-derive ``node``'s membership and keys from its fields. O(log n); no-op if nothing changed."""
        want_full = full_evict_key(node) if is_full_candidate(node) else None
        if want_full != node.full_evict_key:
            if node.full_evict_key is not None:
                self._full.remove(node.full_evict_key)
            if want_full is not None:
                self._full.add(want_full)
            node.full_evict_key = want_full
        want_mamba = mamba_evict_key(self.order, node) if is_mamba_candidate(node) else None
        if want_mamba != node.mamba_evict_key:
            if node.mamba_evict_key is not None:
                self._mamba.remove(node.mamba_evict_key)
            if want_mamba is not None:
                self._mamba.add(want_mamba)
            node.mamba_evict_key = want_mamba
        if want_full is None and want_mamba is None:
            self._nodes.pop(node.id, None)
        else:
            self._nodes[node.id] = node

    def remove(self, node: TreeNode) -> None:
        """Drop ``node`` from both sets (it is leaving the tree). O(log n)."""
        if node.full_evict_key is not None:
            self._full.remove(node.full_evict_key)
            node.full_evict_key = None
        if node.mamba_evict_key is not None:
            self._mamba.remove(node.mamba_evict_key)
            node.mamba_evict_key = None
        self._nodes.pop(node.id, None)

    # ------------------------------------------------------------------------------------------ queries
    def first_full(self) -> TreeNode | None:
        """The next full-KV victim (an unlocked leaf), or None. O(log n)."""
        return self._nodes[self._full[0][-1]] if self._full else None

    def first_mamba(self) -> TreeNode | None:
        """The next checkpoint victim, or None. O(log n)."""
        return self._nodes[self._mamba[0][-1]] if self._mamba else None

    def full_candidates(self) -> Iterator[TreeNode]:
        """Full-KV candidates in eviction order (for tests and the invariant checker). O(n)."""
        return (self._nodes[k[-1]] for k in self._full)

    def mamba_candidates(self) -> Iterator[TreeNode]:
        """Checkpoint candidates in eviction order (for tests and the invariant checker). O(n)."""
        return (self._nodes[k[-1]] for k in self._mamba)

    def full_keys(self) -> list[tuple[int, ...]]:
        return list(self._full)

    def mamba_keys(self) -> list[tuple[int, ...]]:
        return list(self._mamba)

    def __len__(self) -> int:
        return len(self._nodes)
