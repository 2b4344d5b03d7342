"""What the tree's operations return (:class:`Walk`, :class:`TreeMatch`, :class:`TreeInsert`,
:class:`Freed`) and the one observer it reports to (:data:`VictimObserver`).

Plain records: the tree fills them, the cache reads them and frees what they list. None of them holds a
reference the caller may write through (a match's chunks are the tree's, read-only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

from mamba_radix.node import TreeNode
from mamba_radix.radix_key import RadixKey

__all__ = ["Freed", "TreeInsert", "TreeMatch", "VictimKind", "VictimObserver", "Walk"]

# Which eviction phase picked a victim: "kv" (a leaf with a checkpoint, taken for KV tokens) or "state"
# (a checkpoint, taken for a state slot).
VictimKind = Literal["kv", "state"]
# Called by RadixTree.evict once per victim with its kind and its age: clock ticks since its last access
# (the KV stamp for "kv", the checkpoint stamp for "state"). Given to the tree at construction; None costs
# nothing. The simulator's adaptive split (mamba_radix.sim.split) is the one user.
VictimObserver = Callable[[VictimKind, int], None]


class Walk(NamedTuple):
    """A read-only walk of a key (:meth:`RadixTree.walk`), reusable by :meth:`RadixTree.match` while the
    tree's structure is unchanged (``version``): a check followed by its match walks once."""

    key: RadixKey
    path: list[TreeNode]  # fully matched nodes top-down, then the node matched in part (if partial)
    pos: int  # tokens the fully matched nodes cover
    partial: int  # tokens matched into the last node's edge, 0 if none
    version: int


class TreeMatch:
    """What :meth:`RadixTree.match` found.

    - ``kv_chunks``: the KV indices of ``[0, hit_len)`` as the matched nodes' own values, top-down (a
      tuple of tensors; read-only: they are the tree's). A caller that writes the hit into a buffer it
      owns (a request's row) copies them there in one call, ``torch.cat(m.kv_chunks, out=row[:hit_len])``,
      without the intermediate tensor ``device_indices`` costs (a fresh allocation on a long path
      page-faults its way in);
    - ``device_indices``: the same indices as one fresh tensor (concatenated on first access, then kept;
      never a node's storage);
    - ``best``: the deepest node with a checkpoint on the matched path, the root if none;
    - ``hit_len``: tokens up to ``best``'s end (the usable hit);
    - ``full_kv_hit_len``: tokens whose KV matched, ``>= hit_len``.

    The node values never change in place (a split gives the halves views, an eviction hands the
    tensor to the allocator, which copies what it keeps), so a late ``device_indices`` is the match's.
    """

    __slots__ = ("_indices", "best", "full_kv_hit_len", "hit_len", "kv_chunks")

    def __init__(
        self,
        kv_chunks: tuple[torch.Tensor, ...],
        best: TreeNode,
        hit_len: int,
        full_kv_hit_len: int,
        indices: torch.Tensor | None = None,
    ) -> None:
        self.kv_chunks = kv_chunks
        self.best = best
        self.hit_len = hit_len
        self.full_kv_hit_len = full_kv_hit_len
        self._indices = indices

    @property
    def device_indices(self) -> torch.Tensor:
        """KV indices of ``[0, hit_len)``, one fresh tensor (``torch.cat`` of :attr:`kv_chunks` on the
        first access, O(hit_len); later accesses return the same tensor)."""
        if self._indices is None:
            # torch.cat copies even a single chunk: the caller never aliases a node's value
            self._indices = torch.cat(self.kv_chunks)
        return self._indices

    def __repr__(self) -> str:
        return (
            f"TreeMatch(best={self.best.id}, hit_len={self.hit_len}, "
            f"full_kv_hit_len={self.full_kv_hit_len}, chunks={len(self.kv_chunks)})"
        )


class TreeInsert(NamedTuple):
    """What :meth:`RadixTree.insert` did. The caller frees ``duplicate_kv`` and ``capped_slots``."""

    prefix_len: int  # tokens the tree held already (before any new leaf)
    mamba_exists: bool  # the end node already had a checkpoint: the caller keeps (and frees) its slot
    node: TreeNode  # the node ending at len(key); the root for an empty key
    duplicate_kv: torch.Tensor  # caller's indices at positions >= prev_prefix_len the tree already had
    capped_slots: list[int]  # checkpoints dropped by the per-path cap
    new_kv: torch.Tensor | None = None  # the new leaf's KV indices (now the tree's); None: no new leaf
    # host tier: the caller's KV that host-only nodes on the path took as their device copy (now the tree's)
    revived_kv: torch.Tensor | None = None


class Freed:
    """Memory an eviction released from the tree; the cache returns it to the pools. The host fields are
    the host tier's (host KV indices, host state slots), empty while it is off.

    ``kv``: the removed nodes' KV index tensors, one per node, handed over (never written again);
    ``num_tokens``: their total length (the cache passes it to the allocator, which then need not read
    the tensors); ``slots`` / ``num_states``: the released checkpoint slots and their count.

    A plain record with ``__slots__`` and a hand-written constructor, not a dataclass: an eviction builds
    one per call, and a dataclass's field factories cost a few calls more with cold caches."""

    __slots__ = ("host_kv", "host_slots", "kv", "num_host_tokens", "num_states", "num_tokens", "slots")

    def __init__(
        self,
        kv: list[torch.Tensor] | None = None,
        slots: list[int] | None = None,
        num_tokens: int = 0,
        num_states: int = 0,
        host_kv: list[torch.Tensor] | None = None,
        host_slots: list[int] | None = None,
        num_host_tokens: int = 0,
    ) -> None:
        self.kv: list[torch.Tensor] = [] if kv is None else kv
        self.slots: list[int] = [] if slots is None else slots
        self.num_tokens = num_tokens
        self.num_states = num_states
        self.host_kv: list[torch.Tensor] = [] if host_kv is None else host_kv
        self.host_slots: list[int] = [] if host_slots is None else host_slots
        self.num_host_tokens = num_host_tokens

    def __repr__(self) -> str:
        return (
            f"Freed(kv={len(self.kv)} tensors, slots={self.slots}, num_tokens={self.num_tokens}, "
            f"num_states={self.num_states}, host_kv={len(self.host_kv)} tensors, "
            f"host_slots={self.host_slots}, num_host_tokens={self.num_host_tokens})"
        )
