"""The radix tree node (:class:`TreeNode`) and the key it hangs from its parent under (:func:`child_key`),
which the tree and the invariant checker share.

A node owns one edge of the tree: the token ids of that edge (``key``, a
:class:`~mamba_radix.token_ids.TokenIds`: int64 in one C buffer, compared with ``memcmp``), the KV indices
of those tokens (``value``, one int64 per token) and, optionally, one state checkpoint (``mamba_slot``),
valid at the node's end. A node without a checkpoint is a *tombstone*. The root has an empty key, never holds a
checkpoint and is never evicted.

Field ownership (one writer per field):

- ``tree.py`` writes the structure (``key``, ``value``, ``parent``, ``children``, ``depth``), the
  checkpoint (``mamba_slot``), the locks, the recency stamps, ``owner`` (cleared on removal) and
  ``prefix_fp`` (only for a research policy that asks for prefix fingerprints, chosen at construction);
- ``tree.py`` also writes the host tier's fields (``host_kv``, ``host_slot``, ``host_children``,
  ``hit_count``; all unused, None or 0, while the host tier is off);
- ``eviction.py`` writes ``full_evict_key`` / ``mamba_evict_key`` (the key the node is registered under
  in the ordered candidate sets, ``None`` when it is not a candidate).

Invariants written where the fields live (checked by :mod:`mamba_radix.invariants`):

- ``full_lock_ref >= mamba_lock_ref + kv_lock_ref``, each ``>= 0``; a lock of the node's KV covers the locked
  node and every ancestor (``full_lock_ref``); a request's lock is either a full one, which also locks the
  node's checkpoint (``mamba_lock_ref``, only on a node holding one), or a KV-only one (``kv_lock_ref``:
  SGLang's ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` hand-over lock, which leaves the checkpoint evictable, so
  the node may become a tombstone while locked). So
  ``full_lock_ref == mamba_lock_ref + kv_lock_ref + sum(child.full_lock_ref)`` on every non-root node;
- ``len(key) == len(value) > 0`` on every non-root node, a multiple of ``page_size``;
- ``depth`` is the number of tokens from the root to the node's end; it does not change when an
  ancestor edge is split, so eviction keys that embed it stay valid;
- host tier (``docs/host-tier.md``): a node's KV lives on the device (``value``, None once demoted), on the
  host (``host_kv``, host KV indices), or both; its checkpoint likewise (``mamba_slot`` device,
  ``host_slot`` host). The device-resident nodes and the host-backed nodes each form a subtree hanging from
  the root (a node's parent is on the same tier, or the root), so a *host-only* node (``value is None``)
  has only host-only descendants; it holds no device checkpoint and no lock. ``host_children`` counts the
  host-only children: a device node whose children are all host-only is a device leaf;
- a leaf is never a tombstone, except one whose KV a KV-only lock holds (its checkpoint was evicted
  while a request decoded on it) and the KV-only leaves of ``mamba_kv_only_leaves``.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

# the token buffer and its comparisons live in mamba_radix.token_ids; re-exported here, where the tree,
# the walks and the tests import them
from mamba_radix.token_ids import (
    TokenIds,
    as_token_ids,
    common_prefix_len,
    common_prefix_len_reference,
    key_slice,
    prefix_len_bytes,
    prefix_len_in,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "ROOT_ID",
    "TokenIds",
    "TreeNode",
    "as_token_ids",
    "child_key",
    "common_prefix_len",
    "common_prefix_len_reference",
    "key_slice",
    "prefix_len_bytes",
    "prefix_len_in",
]

ROOT_ID = 0


class TreeNode:
    """One edge of the radix tree. Plain record: the tree keeps every field consistent."""

    __slots__ = (
        "children",
        "depth",
        "extra_key",
        "full_evict_key",
        "full_lock_ref",
        "hit_count",
        "host_children",
        "host_kv",
        "host_slot",
        "id",
        "key",
        "kv_lock_ref",
        "last_access",
        "mamba_evict_key",
        "mamba_last_access",
        "mamba_lock_ref",
        "mamba_slot",
        "owner",
        "parent",
        "prefix_fp",
        "value",
    )

    def __init__(
        self,
        node_id: int,
        key: TokenIds,
        value: torch.Tensor | None,
        *,
        parent: TreeNode | None,
        depth: int,
        extra_key: str | None,
        mamba_slot: int | None = None,
        owner: object | None = None,
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
        self.kv_lock_ref = 0  # KV-only locks taken on this very node (a full lock counts in mamba_lock_ref)
        # Logical-clock stamps: full KV recency and checkpoint recency diverge on purpose (a hit
        # refreshes the KV of the whole matched path but, in "node" mode, only the consumed checkpoint).
        self.last_access = 0
        self.mamba_last_access = 0
        self.full_evict_key: tuple[int, ...] | None = None
        self.mamba_evict_key: tuple[int, ...] | None = None
        # fingerprint of the whole prefix ending here, kept only for a policy that asks for it
        self.prefix_fp = 0
        # the RadixTree holding this node, None once it left it (evicted): is_attached() in O(1)
        self.owner = owner
        # the host tier (None / 0 while it is off): host KV indices and host state slot of this node's
        # copies, how many children are host-only, and hits counted for write_through(_selective)
        self.host_kv: torch.Tensor | None = None
        self.host_slot: int | None = None
        self.host_children = 0
        self.hit_count = 0

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
    def is_host_only(self) -> bool:
        """True for a node whose KV left the device and lives on the host only (host tier). O(1)."""
        return self.value is None

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    @property
    def mamba_value(self) -> int | None:
        """SGLang's name for :attr:`mamba_slot` (read-only), so code written against SGLang's tree nodes
        (its unit tests, through :mod:`mamba_radix.compat.sglang`) reads the checkpoint slot. O(1)."""
        return self.mamba_slot

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, depth={self.depth}, num_tokens={len(self.key)}, "
            f"mamba_slot={self.mamba_slot}, locks={self.full_lock_ref}/{self.mamba_lock_ref}"
            f"{f'+{self.kv_lock_ref}kv' if self.kv_lock_ref else ''})"
        )


def child_key(tokens: Sequence[int], start: int, page_size: int, extra_key: str | None) -> Hashable:
    """The key under which the edge starting at ``tokens[start]`` hangs from its parent.

    The first token (``page_size == 1``, an int) or the first page (the page's int64 bytes, hashed at C
    speed), namespaced by ``extra_key`` so that two namespaces never share a node. A namespaced key is
    ``(extra_key, first)``: a tuple, which never equals an int or bytes. ``tokens``: any int sequence (an
    int64 array takes the fast path). O(page_size).
    """
    if page_size == 1:
        first: Hashable = tokens[start]
    else:
        page = tokens[start : start + page_size]
        first = (
            page.tobytes() if isinstance(page, array) and page.typecode == "q" else array("q", page).tobytes()
        )
    return first if extra_key is None else (extra_key, first)
