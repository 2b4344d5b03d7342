"""The radix tree node (:class:`TreeNode`) and the key helpers the tree and the invariant checker share.

A node owns one edge of the tree: the token ids of that edge (``key``), the KV indices of those tokens
(``value``, one int64 per token) and, optionally, one state checkpoint (``mamba_slot``), valid at the
node's end. A node without a checkpoint is a *tombstone*. The root has an empty key, never holds a
checkpoint and is never evicted.

Field ownership (one writer per field):

- ``tree.py`` writes the structure (``key``, ``value``, ``parent``, ``children``, ``depth``), the
  checkpoint (``mamba_slot``), the locks and the recency stamps;
- ``eviction.py`` writes ``full_evict_key`` / ``mamba_evict_key`` (the key the node is registered under
  in the ordered candidate sets, ``None`` when it is not a candidate).

Invariants written where the fields live (checked by :mod:`mamba_radix.invariants`):

- ``full_lock_ref >= mamba_lock_ref >= 0``; a full lock covers the locked node and every ancestor, a
  mamba lock only the locked node; a tombstone is never locked directly, so
  ``full_lock_ref == mamba_lock_ref + sum(child.full_lock_ref)`` on every non-root node;
- ``len(key) == len(value) > 0`` on every non-root node, a multiple of ``page_size``;
- ``depth`` is the number of tokens from the root to the node's end; it does not change when an
  ancestor edge is split, so eviction keys that embed it stay valid;
- a leaf is never a tombstone.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["ROOT_ID", "TreeNode", "child_key", "common_prefix_len"]

ROOT_ID = 0

# Tokens compared per slice in common_prefix_len: the equal prefix is found slice by slice in C, then at
# most this many tokens one by one in Python.
_COMPARE_BLOCK = 64


class TreeNode:
    """One edge of the radix tree. Plain record: the tree keeps every field consistent."""

    __slots__ = (
        "children",
        "depth",
        "extra_key",
        "full_evict_key",
        "full_lock_ref",
        "id",
        "key",
        "last_access",
        "mamba_evict_key",
        "mamba_last_access",
        "mamba_lock_ref",
        "mamba_slot",
        "parent",
        "prefix_fp",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: tuple[int, ...],
        value: torch.Tensor,
        *,
        parent: TreeNode | None,
        depth: int,
        extra_key: str | None,
        mamba_slot: int | None = None,
    ) -> None:
        self.id = node_id
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[Hashable, TreeNode] = {}
        self.depth = depth
        self.extra_key = extra_key
        self.mamba_slot = mamba_slot
        self.full_lock_ref = 0
        self.mamba_lock_ref = 0
        # Logical-clock stamps: full KV recency and checkpoint recency diverge on purpose (a hit
        # refreshes the KV of the whole matched path but, in "node" mode, only the consumed checkpoint).
        self.last_access = 0
        self.mamba_last_access = 0
        self.full_evict_key: tuple[int, ...] | None = None
        self.mamba_evict_key: tuple[int, ...] | None = None
        # fingerprint of the whole prefix ending here, kept only for a policy that asks for it
        self.prefix_fp = 0

    @property
    def is_root(self) -> bool:
        return self.id == ROOT_ID

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_tombstone(self) -> bool:
        """True for a non-root node without a checkpoint (its KV is kept, its state is gone)."""
        return self.mamba_slot is None and not self.is_root

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, depth={self.depth}, num_tokens={len(self.key)}, "
            f"mamba_slot={self.mamba_slot}, locks={self.full_lock_ref}/{self.mamba_lock_ref})"
        )


def child_key(tokens: tuple[int, ...], start: int, page_size: int, extra_key: str | None) -> Hashable:
    """The key under which the edge starting at ``tokens[start]`` hangs from its parent.

    The first token (``page_size == 1``) or the first page as a tuple, namespaced by ``extra_key`` so
    that two namespaces never share a node. A namespaced key is ``(extra_key, first)`` with a ``str`` in
    front, so it can never equal a page tuple of ints. O(page_size).
    """
    first: Hashable = tokens[start] if page_size == 1 else tokens[start : start + page_size]
    return first if extra_key is None else (extra_key, first)


def common_prefix_len(node_key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """Length of the common prefix of ``node_key`` and ``tokens[start:]``.

    O(n) token comparisons, nearly all done by C-level tuple slice comparison (n = the common length
    plus at most one block); the Python loop runs O(n / 64 + 64) times.
    """
    n = min(len(node_key), len(tokens) - start)
    if node_key[:n] == tokens[start : start + n]:
        return n
    i = 0
    while i < n:
        j = min(i + _COMPARE_BLOCK, n)
        if node_key[i:j] != tokens[start + i : start + j]:
            while node_key[i] == tokens[start + i]:
                i += 1
            return i
        i = j
    return n  # pragma: no cover - the first comparison returned already
