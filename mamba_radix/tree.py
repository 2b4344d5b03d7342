"""The pure radix tree (:class:`RadixTree`): walk, split, insert, lock, decide evictions.

The tree *decides* and never frees: every operation that releases memory returns the KV indices and
state slots it dropped (:class:`Freed`, :class:`TreeInsert`) and :class:`~mamba_radix.cache.MambaRadixCache`
hands them back to the pools. So the tree is testable without any pool.

Data model (DESIGN.md §5): each node holds the KV indices of its edge and optionally one checkpoint slot;
a node without one is a tombstone. A prefix is usable only up to the deepest checkpoint on its path.

Recency is a logical clock (:attr:`RadixTree.clock`) that ticks once per request-level operation
(:meth:`RadixTree.match`, :meth:`RadixTree.insert`); every node that operation touches gets the new tick,
so a path touched together shares one stamp and ties are broken by depth (see :mod:`mamba_radix.eviction`).

The fast paths are chosen once, when a tree is built, each behind its own module, and each keeps the
pure-Python reference a property test checks it against: the walk loop (:mod:`mamba_radix.walks`: compiled,
scratch or general) and the eviction index's form (:func:`mamba_radix.eviction.make_index`: lazy stamps,
deferred removal). So the tree's own code is the reference's shape: one :meth:`RadixTree.walk`, and one
``index.touch`` / ``index.touch_mamba`` per stamp.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from mamba_radix.candidates import COMPACT_MIN_DEAD
from mamba_radix.errors import InvalidArgument
from mamba_radix.eviction import CheckpointOrder, VictimPolicy, make_index
from mamba_radix.node import ROOT_ID, TokenIds, TreeNode, as_token_ids, child_key, key_slice
from mamba_radix.state_stamp import fingerprint_extend
from mamba_radix.walks import choose_walk

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.walks import WalkKind

__all__ = ["Freed", "RadixKey", "RadixTree", "TreeInsert", "TreeMatch"]


@dataclass(frozen=True)
class RadixKey:
    """Token ids plus an optional namespace (``extra_key``: LoRA id, cache salt).

    Keys in different namespaces never share a node. ``token_ids`` is normalised to a fresh
    :class:`~mamba_radix.node.TokenIds` (int64 in one C buffer; it compares equal to a tuple or list of
    the same ints): a list, tuple, ``array('q')``, numpy array or 1-D tensor is accepted. An int64 array
    or tensor is copied with one ``memcpy``; a list of Python ints costs one C-level conversion per token
    (about 15-25 ns), which is also the check. Not hashable (the ids are an array). O(len).
    """

    token_ids: TokenIds | Sequence[int]
    extra_key: str | None = None

    def __post_init__(self) -> None:
        ids = self.token_ids
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            if ids.ndim != 1:
                raise InvalidArgument(f"token_ids must be 1-D, got shape {tuple(ids.shape)}")
            ids = _int64_buffer(ids)
        elif isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Sequence):
            raise InvalidArgument(f"token_ids must be a sequence of ints, got {type(ids).__name__}")
        try:  # one C-speed pass: floats, None, strings and ints beyond int64 are refused
            object.__setattr__(self, "token_ids", as_token_ids(ids))
        except (TypeError, OverflowError, ValueError) as exc:
            raise InvalidArgument(f"token_ids must be int token ids in int64 range: {exc}") from None
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise InvalidArgument(
                f"extra_key must be a str or None, got {self.extra_key!r}; convert it with str()"
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def trusted(cls, token_ids: Sequence[int], extra_key: str | None) -> RadixKey:
        """A key from tokens the caller already validated (the lifecycle's, checked at admission): no
        check, one conversion (:func:`~mamba_radix.node.as_token_ids`: a ``memcpy`` from an int64 array,
        one C-level step per token from a list). O(len)."""
        key = object.__new__(cls)
        object.__setattr__(key, "token_ids", as_token_ids(token_ids))
        object.__setattr__(key, "extra_key", extra_key)
        return key


def _int64_buffer(ids: torch.Tensor | np.ndarray) -> np.ndarray | list[int]:
    """A 1-D tensor or numpy array as a contiguous int64 numpy array when its dtype converts exactly
    (signed ints, unsigned up to 32 bits), else as a list of Python items for the checked conversion
    (floats and bools keep their refusal or acceptance; uint64 beyond int64 overflows there). O(len)."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if kind == "i" or (kind == "u" and size <= 4):
        return np.ascontiguousarray(arr, dtype=np.int64)
    return arr.tolist()


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
      without the intermediate tensor ``device_indices`` costs (on a long path that fresh allocation
      page-faults its way in: tens of µs);
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


@dataclass
class Freed:
    """Memory an eviction released from the tree; the cache returns it to the pools."""

    kv: list[torch.Tensor] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    num_tokens: int = 0
    num_states: int = 0
    # how long each phase's victims had gone unused (clock ticks since their last access), summed
    kv_victim_age: int = 0  # over the leaves with a checkpoint KV eviction picked
    kv_victims: int = 0
    state_victim_age: int = 0  # over the checkpoints state eviction picked
    state_victims: int = 0


def _empty_kv(device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64, device=device)


class RadixTree:
    """The Mamba-aware radix tree. Pure: it owns nodes, locks, counters and eviction order, no memory.

    Sizes (kept exact on every 0<->1 lock transition, insert and delete; the root is excluded):
    ``full_evictable_size`` / ``full_protected_size`` in tokens of unlocked / locked nodes,
    ``mamba_evictable_size`` / ``mamba_protected_size`` in checkpoints without / with a mamba lock.

    ``policy``: a research policy (:class:`~mamba_radix.eviction.VictimPolicy`), or None for the config's
    own order. The fast paths, chosen here once (the defaults are the fast forms; the others are the
    references the differential tests build): ``walk``, the walk loop (:func:`mamba_radix.walks.choose_walk`;
    :attr:`walk_kind` says which runs); ``lazy_removal``, ``lazy_stamps`` and ``compact_min_dead``, the
    eviction index's form (:func:`mamba_radix.eviction.make_index`).
    """

    def __init__(
        self,
        config: CacheConfig,
        device: str | torch.device = "cpu",
        policy: VictimPolicy | None = None,
        *,
        walk: WalkKind | None = None,
        lazy_removal: bool = True,
        lazy_stamps: bool = True,
        compact_min_dead: int = COMPACT_MIN_DEAD,
    ) -> None:
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(device)
        self.clock = 0
        self._next_id = ROOT_ID + 1
        self.root = TreeNode(
            ROOT_ID, TokenIds("q"), _empty_kv(self.device), parent=None, depth=0, extra_key=None, owner=self
        )
        self.root.full_lock_ref = 1  # the root is always locked, never evicted
        # the empty KV an insert that duplicates nothing hands back: one shared tensor, as nothing can
        # be written into zero elements (torch.empty costs ~2 us a call)
        self._no_kv = _empty_kv(self.device)
        # the walk loop: (tokens, extra_key, start, num_tokens) -> (path, pos, partial); it owns a scratch
        # buffer, so a tree is not safe to walk from two threads at once (nothing in it is)
        self.walk_kind, self._walk = choose_walk(self.page_size, walk)
        # A research policy (mamba_radix.policy.CachePolicy and subclasses), or None for the config's
        # own order. What the tree uses of it is taken here, once: its keys, its victim pickers, and
        # whether it needs prefix fingerprints.
        self.policy = policy
        if policy is not None:
            policy.bind(self)
        self._prefix_fps = policy is not None and policy.needs_prefix_fingerprints
        # the config's own keys (no research policy's): the index calls the order's key functions directly
        # (a policy's methods would only forward to them), and may stamp lazily
        self.index = make_index(
            CheckpointOrder.from_config(config),
            None if policy is None or policy.uses_config_keys() else policy,
            lazy_removal=lazy_removal,
            lazy_stamps=lazy_stamps,
            compact_min_dead=compact_min_dead,
        )
        index = self.index
        self._next_full_victim = (
            index.first_full if policy is None else functools.partial(policy.pick_full_victim, index)
        )
        self._next_mamba_victim = (
            index.first_mamba if policy is None else functools.partial(policy.pick_mamba_victim, index)
        )
        self.full_evictable_size = 0
        self.full_protected_size = 0
        self.mamba_evictable_size = 0
        self.mamba_protected_size = 0
        self.num_nodes = 1
        self.version = 0  # bumped by every structural change (nodes, edges, checkpoints): a Walk's validity
        # slot -> node holding it: catches a slot handed to the tree twice in O(1)
        self.slot_owner: dict[int, TreeNode] = {}

    # ------------------------------------------------------------------------------------------ helpers
    def tick(self) -> int:
        """Advance the logical clock (once per request-level operation) and return the new time."""
        self.clock += 1
        return self.clock

    def _child_key(self, tokens: TokenIds, start: int, extra_key: str | None) -> object:
        return child_key(tokens, start, self.page_size, extra_key)

    def _new_node(
        self, key: TokenIds, value: torch.Tensor, parent: TreeNode, depth: int, extra_key: str | None
    ) -> TreeNode:
        self.version += 1
        node = TreeNode(
            self._next_id, key, value, parent=parent, depth=depth, extra_key=extra_key, owner=self
        )
        if self._prefix_fps:
            node.prefix_fp = fingerprint_extend(parent.prefix_fp, key)
        self._next_id += 1
        self.num_nodes += 1
        return node

    def is_attached(self, node: TreeNode) -> bool:
        """Whether ``node`` is part of this tree (not evicted, not from another tree). O(1): every node
        records its tree (``owner``), and removal clears it."""
        return node.owner is self

    def path_to_root(self, node: TreeNode) -> Iterator[TreeNode]:
        """``node`` and its ancestors below the root, bottom-up. O(path)."""
        while node is not self.root:
            yield node
            node = node.parent  # type: ignore[assignment]

    def path_values(self, node: TreeNode, above: TreeNode | None = None) -> torch.Tensor:
        """The KV indices of the prefix ending at ``node``: [0, node.depth), or only the part below its
        ancestor ``above``: [above.depth, node.depth). O(nodes and tokens in that part)."""
        chunks = []
        while node is not self.root and node is not above:
            chunks.append(node.value)
            node = node.parent  # type: ignore[assignment]
        if not chunks:
            return _empty_kv(self.device)
        chunks.reverse()
        return torch.cat(chunks)

    def nodes(self) -> Iterator[TreeNode]:
        """Every node, the root first, parents before children (iterative DFS). O(n)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _split(self, child: TreeNode, num_tokens: int, now: int) -> TreeNode:
        """Split ``child``'s edge after ``num_tokens`` tokens; return the new parent (the first part).

        The new parent is a tombstone (a state is valid only at the child's end, so none is copied) and
        inherits the child's full lock count, so the lock counters and sizes stay exact. Both halves are
        touched (stamped ``now``). The key halves are fresh copies (one ``memcpy`` each); the value halves
        are views of the child's former value (nothing writes into a node's value, every path's KV is
        concatenated into a fresh tensor and a free copies what it keeps), so a split makes no tensor
        copy: two slices, about 1 us each. O(len(child.key)).
        """
        parent = child.parent
        assert parent is not None
        key, value, extra_key = child.key, child.value, child.extra_key
        head = key_slice(key, 0, num_tokens)
        new = self._new_node(head, value[:num_tokens], parent, child.depth - len(key) + num_tokens, extra_key)
        new.full_lock_ref = child.full_lock_ref
        rest = key_slice(key, num_tokens, len(key))
        child.key = rest
        child.value = value[num_tokens:]
        child.parent = new
        parent.children[self._child_key(head, 0, extra_key)] = new  # the slot the child hung from
        new.children[self._child_key(rest, 0, extra_key)] = child
        # The new node is an internal tombstone, a candidate in neither set; the child keeps its
        # membership, and only its stamp moved.
        self.index.touch((new, child), now)
        return new

    # -------------------------------------------------------------------------------------------- match
    def walk(self, key: RadixKey, start: TreeNode | None = None) -> Walk:
        """The read-only walk of ``key`` (whole pages only) from ``start``, the root by default, along which
        :meth:`match` and :meth:`insert` go; ``key`` continues ``start``'s prefix in its namespace. The
        loop is the one chosen at construction (:mod:`mamba_radix.walks`). O(len(key) + path)."""
        tokens = key.token_ids
        num_tokens = len(tokens) - len(tokens) % self.page_size
        found = self._walk(tokens, key.extra_key, self.root if start is None else start, num_tokens)
        return tuple.__new__(Walk, (key, *found, self.version))  # a NamedTuple's __new__ is a Python frame

    def match(self, key: RadixKey, walk: Walk | None = None) -> TreeMatch:
        """Longest cached prefix of ``key`` that ends at a checkpoint.

        Side effects: ticks the clock; **may split a node** (a match that ends inside an edge splits it,
        leaving a tombstone parent); stamps the full recency of every matched node; stamps the checkpoint
        recency of the consumed node only (``mamba_lru_refresh="node"``) or of every checkpoint on the
        matched path (``"path"``). With ``page_size > 1`` only whole pages are compared. ``walk``: this
        key's :meth:`walk`, reused when the tree has not changed since (else walked again).
        O(len(key) + path * log n).
        """
        if walk is None or walk.key is not key or walk.version != self.version:
            walk = self.walk(key)
        path, pos, partial = walk.path, walk.pos, walk.partial
        now = self.tick()
        if partial:  # the walk's own list stays as it was (copied only when it changes)
            path = path.copy()
            path[-1] = self._split(path[-1], partial, now)
            pos += partial
        self.index.touch(path, now)
        best_idx = len(path) - 1
        while best_idx >= 0 and path[best_idx].mamba_slot is None:
            best_idx -= 1
        if best_idx < 0:  # no hit: the shared empty tensor (nothing can be written into zero elements)
            return TreeMatch((), self.root, 0, pos, self._no_kv)
        best = path[best_idx]
        if self.config.mamba_lru_refresh == "path":
            for node in path[: best_idx + 1]:
                self.index.touch_mamba(node, now)
        else:
            self.index.touch_mamba(best, now)
        # the KV stays in the nodes' chunks until the caller asks for one tensor (or writes them out)
        return TreeMatch(tuple([node.value for node in path[: best_idx + 1]]), best, best.depth, pos)

    # ------------------------------------------------------------------------------------------- insert
    def insert(
        self, key: RadixKey, value: torch.Tensor, mamba_slot: int, prev_prefix_len: int = 0
    ) -> TreeInsert:
        """Insert ``key`` with KV indices ``value`` and a checkpoint ``mamba_slot`` at its end.

        Three outcomes at the end node: a new leaf holding the uncached remainder and the slot; a revived
        tombstone (it takes the slot); or ``mamba_exists`` (a checkpoint is already there: the slot stays
        the caller's). The caller's indices that duplicate tree KV at positions ``>= prev_prefix_len``
        come back in ``duplicate_kv`` for the caller to free (positions below it are already the tree's).
        After adding a checkpoint the per-path cap may tombstone older checkpoints (``capped_slots``).

        Side effects: ticks the clock; may split a node; stamps every node on the path.
        Raises :class:`InvalidArgument` (nothing changed) on a bad value, a slot the tree already holds,
        an unaligned length or a ``prev_prefix_len`` deeper than the tree's match.
        O(len(key) + path * log n).
        """
        return self._insert_from(self.root, key, value, mamba_slot, prev_prefix_len)

    def insert_below(self, node: TreeNode, key: RadixKey, value: torch.Tensor, mamba_slot: int) -> TreeInsert:
        """:meth:`insert` of ``node``'s prefix followed by ``key`` (``value`` and the returned
        ``duplicate_kv`` cover ``key`` only), walking from ``node`` instead of the root: the cost depends on
        the new tokens, not on the prefix (the prefix's nodes are stamped, O(their number)). ``node`` is
        the end of the caller's locked prefix (a request's ``last_node``), so none of its KV is the
        caller's; ``prefix_len`` in the result is absolute. Raises :class:`InvalidArgument` (nothing
        changed) for a node not in this tree or a namespace other than ``node``'s.
        O(len(key) + path * log n).
        """
        if not self.is_attached(node):
            raise InvalidArgument(
                f"insert_below: node {node.id} is not in this tree; pass a locked last_node"
            )
        if node is not self.root and key.extra_key != node.extra_key:
            raise InvalidArgument(
                f"insert_below: key namespace {key.extra_key!r} differs from node {node.id}'s "
                f"{node.extra_key!r}; continue a prefix in its own namespace"
            )
        return self._insert_from(node, key, value, mamba_slot, 0)

    def _insert_from(
        self, start: TreeNode, key: RadixKey, value: torch.Tensor, mamba_slot: int, prev_prefix_len: int
    ) -> TreeInsert:
        tokens = key.token_ids
        num_tokens = len(tokens)
        self._check_insert_args(num_tokens, value, mamba_slot, prev_prefix_len)
        # read-only, so a refusal changes nothing; key.extra_key is start's namespace (insert_below checked)
        walk = self.walk(key, start)
        path, pos, partial = walk.path, walk.pos, walk.partial
        if pos + partial < prev_prefix_len:
            raise InvalidArgument(
                f"prev_prefix_len={prev_prefix_len} but the tree holds only {pos + partial} tokens of this "
                "key; pass the length of the locked prefix the request matched (cache_protected_len)"
            )
        now = self.tick()
        if num_tokens == 0:
            return TreeInsert(start.depth, True, start, _empty_kv(self.device), [])
        if partial:
            path[-1] = self._split(path[-1], partial, now)
            pos += partial
        if start is not self.root:  # the prefix above is part of this insert's path
            path = [*reversed(list(self.path_to_root(start))), *path]
        self.index.touch(path, now)
        # The caller's KV at [prev_prefix_len, pos) duplicates the tree's: hand it back for freeing.
        if pos > prev_prefix_len:
            duplicate_kv = value[prev_prefix_len:pos]
        else:  # nothing duplicated, the common case of a hand-over: a shared empty tensor (~2 us saved)
            duplicate_kv = self._no_kv if value.device == self.device else _empty_kv(value.device)
        if self.config.mamba_lru_refresh == "path":
            for node in path:
                self.index.touch_mamba(node, now)
        end = path[-1] if path else self.root
        if pos < num_tokens:
            leaf_key = key_slice(tokens, pos, num_tokens)
            leaf_kv = value.clone() if pos == 0 else value[pos:].clone()  # a torch slice costs ~2 us
            end = self._add_leaf(end, leaf_key, leaf_kv, mamba_slot, key.extra_key, now)
            return TreeInsert(
                start.depth + pos, False, end, duplicate_kv, self._enforce_path_cap(end), leaf_kv
            )
        if end.mamba_slot is None:
            self._set_checkpoint(end, mamba_slot, now)
        else:
            self.index.touch_mamba(end, now)
            return TreeInsert(start.depth + pos, True, end, duplicate_kv, [])
        return TreeInsert(start.depth + pos, False, end, duplicate_kv, self._enforce_path_cap(end))

    def _check_insert_args(
        self, num_tokens: int, value: torch.Tensor, mamba_slot: int, prev_prefix_len: int
    ) -> None:
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.dim() != 1:
            got = (
                f"{value.dtype} tensor of shape {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise InvalidArgument(f"kv indices must be a 1-D int64 tensor, got {got}")
        if value.shape[0] != num_tokens:  # shape, not len(): a tensor's len() costs a Python-level call
            raise InvalidArgument(
                f"kv indices have {value.shape[0]} entries for {num_tokens} tokens; pass one index per token"
            )
        if num_tokens % self.page_size:
            raise InvalidArgument(
                f"insert of {num_tokens} tokens is not a multiple of page_size={self.page_size}; "
                "truncate the key to whole pages"
            )
        if isinstance(prev_prefix_len, bool) or not isinstance(prev_prefix_len, int):
            raise InvalidArgument(f"prev_prefix_len must be an int, got {prev_prefix_len!r}")
        if not 0 <= prev_prefix_len <= num_tokens or prev_prefix_len % self.page_size:
            raise InvalidArgument(
                f"prev_prefix_len={prev_prefix_len} must be a multiple of page_size={self.page_size} "
                f"in [0, {num_tokens}]"
            )
        if isinstance(mamba_slot, bool) or not isinstance(mamba_slot, int) or mamba_slot < 1:
            raise InvalidArgument(
                f"mamba_slot must be a state slot id >= 1 (0 is padding), got {mamba_slot!r}"
            )
        if mamba_slot in self.slot_owner:
            raise InvalidArgument(
                f"mamba_slot {mamba_slot} already belongs to tree node {self.slot_owner[mamba_slot].id}; "
                "insert a fresh slot (copy the state first)"
            )

    def _add_leaf(
        self,
        parent: TreeNode,
        key: TokenIds,
        value: torch.Tensor,
        mamba_slot: int,
        extra_key: str | None,
        now: int,
    ) -> TreeNode:
        leaf = self._new_node(key, value, parent, parent.depth + len(key), extra_key)
        was_leaf = not parent.children
        parent.children[self._child_key(key, 0, extra_key)] = leaf
        leaf.last_access = now
        self.full_evictable_size += len(key)
        self._set_checkpoint(leaf, mamba_slot, now)
        if was_leaf:
            self.index.update(parent)
        return leaf

    def _set_checkpoint(self, node: TreeNode, mamba_slot: int, now: int) -> None:
        self.version += 1
        node.mamba_slot = mamba_slot
        node.mamba_last_access = now
        self.slot_owner[mamba_slot] = node
        self.mamba_evictable_size += 1  # a fresh checkpoint has no mamba lock
        self.index.update(node)

    def _drop_checkpoint(self, node: TreeNode, freed: Freed) -> None:
        """Tombstone an internal node (its KV stays). The checkpoint must be unlocked."""
        self.version += 1
        slot = node.mamba_slot
        assert slot is not None and node.mamba_lock_ref == 0 and node.children
        node.mamba_slot = None
        del self.slot_owner[slot]
        self.mamba_evictable_size -= 1
        self.index.update(node)
        freed.slots.append(slot)
        freed.num_states += 1

    def _enforce_path_cap(self, tail: TreeNode) -> list[int]:
        """Soft cap ``mamba_max_states_per_path`` on the path ending at ``tail`` (SGLang PR #31230).

        Drops the shallowest checkpoints beyond the cap, skipping the tail, forks (``children != 1``)
        and mamba-locked nodes, so a path can stay above the cap. O(path * log n).
        """
        cap = self.config.mamba_max_states_per_path
        if cap < 0:
            return []
        holders = [node for node in self.path_to_root(tail) if node.mamba_slot is not None]
        excess = len(holders) - cap
        freed = Freed()
        for node in reversed(holders):  # shallowest first
            if excess <= 0:
                break
            if node is tail or node.mamba_lock_ref > 0 or len(node.children) != 1:
                continue
            self._drop_checkpoint(node, freed)
            excess -= 1
        return freed.slots

    # -------------------------------------------------------------------------------------------- locks
    def _check_lockable(self, node: TreeNode, verb: str) -> None:
        if not isinstance(node, TreeNode):
            raise InvalidArgument(f"{verb} needs a TreeNode, got {type(node).__name__}")
        if not self.is_attached(node):
            raise InvalidArgument(
                f"cannot {verb} node {node.id}: it is no longer in the tree (evicted, or from another "
                "cache); lock the last_node of a fresh match_prefix"
            )

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock ``node``: a mamba lock on its checkpoint, a full lock on it and every ancestor.

        Only a node holding a checkpoint (what match returns) or the root (a no-op) can be locked.
        O(path * log n) for the counter and candidate-set updates on 0->1 transitions.
        """
        self._check_lockable(node, "lock")
        if node is self.root:
            return
        if node.mamba_slot is None:
            raise InvalidArgument(
                f"cannot lock tombstone node {node.id}: a request locks the checkpoint node match_prefix "
                "returned (last_node), or the root"
            )
        if node.mamba_lock_ref == 0:
            self.mamba_evictable_size -= 1
            self.mamba_protected_size += 1
        node.mamba_lock_ref += 1
        for x in self.path_to_root(node):
            if x.full_lock_ref == 0:
                self.full_evictable_size -= len(x.key)
                self.full_protected_size += len(x.key)
                x.full_lock_ref = 1
                if x is not node:  # node itself is re-keyed once below, with its mamba lock too
                    self.index.update(x)
            else:
                x.full_lock_ref += 1
        self.index.update(node)

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one lock taken by :meth:`inc_lock_ref` on ``node``. O(path * log n).

        Raises :class:`InvalidArgument` (nothing changed) if ``node`` holds no lock of its own.
        """
        self._check_lockable(node, "unlock")
        if node is self.root:
            return
        if node.mamba_slot is None or node.mamba_lock_ref == 0:
            raise InvalidArgument(
                f"node {node.id} is not locked (mamba_lock_ref={node.mamba_lock_ref}); "
                "every dec_lock_ref needs a matching inc_lock_ref on the same node"
            )
        node.mamba_lock_ref -= 1
        if node.mamba_lock_ref == 0:
            self.mamba_protected_size -= 1
            self.mamba_evictable_size += 1
        for x in self.path_to_root(node):
            x.full_lock_ref -= 1
            if x.full_lock_ref == 0:
                self.full_protected_size -= len(x.key)
                self.full_evictable_size += len(x.key)
                if x is not node:  # node itself is re-keyed once below, with its mamba lock too
                    self.index.update(x)
        self.index.update(node)

    # ----------------------------------------------------------------------------------------- eviction
    def _remove_leaf(self, leaf: TreeNode, freed: Freed) -> None:
        """Delete an unlocked leaf (KV and checkpoint). Then, unless ``mamba_kv_only_leaves`` (SGLang 0.5.23
        keeps such an ancestor's KV as a KV-only leaf, for KV eviction to take), every tombstone ancestor
        that becomes a leaf goes too (0.5.20). O(removed * log n)."""
        self.version += 1
        node = leaf
        while True:
            assert not node.children and node.full_lock_ref == 0 and node.mamba_lock_ref == 0
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0, node.extra_key)]
            self.index.remove(node)
            node.parent = None
            node.owner = None  # detached: is_attached() is False from now on
            self.num_nodes -= 1
            self.full_evictable_size -= len(node.key)
            freed.kv.append(node.value)
            freed.num_tokens += len(node.key)
            if node.mamba_slot is not None:
                del self.slot_owner[node.mamba_slot]
                self.mamba_evictable_size -= 1
                freed.slots.append(node.mamba_slot)
                freed.num_states += 1
                node.mamba_slot = None
            self.index.update(parent)
            if (
                parent is self.root
                or parent.children
                or parent.mamba_slot is not None
                or self.config.mamba_kv_only_leaves  # 0.5.23: it stays as a KV-only leaf
            ):
                return
            node = parent  # a tombstone that just became a leaf: it goes too (0.5.20)

    def evict(self, num_tokens: int = 0, num_states: int = 0) -> Freed:
        """Pick and detach victims until at least ``num_tokens`` KV tokens and ``num_states`` checkpoints
        were released (or no candidate is left). Returns what to free; frees nothing.

        Tokens: unlocked leaves in LRU order, each with its checkpoint and the tombstone cascade.
        States: unlocked checkpoints in ``mamba_eviction_order``; an internal node becomes a tombstone,
        a leaf is removed with its KV. States released by the token phase count towards ``num_states``.
        O(victims * log n).
        """
        for name, count in (("num_tokens", num_tokens), ("num_states", num_states)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidArgument(f"{name} must be an int >= 0, got {count!r}")
        freed = Freed()
        now = self.clock
        while freed.num_tokens < num_tokens:
            leaf = self._next_full_victim()
            if leaf is None:
                break
            if leaf.mamba_slot is not None:  # a KV-only leaf is never the end of a hit: its loss is free
                freed.kv_victim_age += now - leaf.last_access
                freed.kv_victims += 1
            self._remove_leaf(leaf, freed)
        while freed.num_states < num_states:
            node = self._next_mamba_victim()
            if node is None:
                break
            freed.state_victim_age += now - node.mamba_last_access
            freed.state_victims += 1
            if node.children:
                self._drop_checkpoint(node, freed)
            else:
                self._remove_leaf(node, freed)
        return freed

    # ------------------------------------------------------------------------------------------ display
    def pretty_print(self, max_tokens: int = 8) -> str:
        """A readable dump: one line per node with tokens, KV span, slot, locks and stamps. O(n)."""
        lines = [
            f"RadixTree(page_size={self.page_size}, nodes={self.num_nodes}, clock={self.clock}, "
            f"full evictable/protected={self.full_evictable_size}/{self.full_protected_size} tokens, "
            f"mamba evictable/protected={self.mamba_evictable_size}/{self.mamba_protected_size} states)"
        ]

        def describe(node: TreeNode) -> str:
            if node is self.root:
                return "root"
            head = " ".join(str(t) for t in node.key[:max_tokens])
            more = f" …(+{len(node.key) - max_tokens})" if len(node.key) > max_tokens else ""
            ns = f"ns={node.extra_key!r} " if node.extra_key is not None and node.parent is self.root else ""
            first, last = int(node.value[0]), int(node.value[-1])
            kv_text = f"kv={first}" if len(node.value) == 1 else f"kv={first}..{last}"
            state = "tombstone" if node.mamba_slot is None else f"slot={node.mamba_slot}"
            return (
                f"#{node.id} {ns}[{head}{more}] len={len(node.key)} end={node.depth} {kv_text} {state} "
                f"lock={node.full_lock_ref}/{node.mamba_lock_ref} "
                f"t={node.last_access}/{node.mamba_last_access}"
            )

        stack: list[tuple[TreeNode, str, str]] = [(self.root, "", "")]
        while stack:
            node, prefix, branch = stack.pop()
            lines.append(prefix + branch + describe(node))
            children = sorted(node.children.values(), key=lambda c: c.id)
            child_prefix = prefix + ("" if not branch else ("   " if branch == "└─ " else "│  "))
            for i, child in enumerate(reversed(children)):
                stack.append((child, child_prefix, "└─ " if i == 0 else "├─ "))
        return "\n".join(lines)
