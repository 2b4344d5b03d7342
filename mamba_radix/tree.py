"""The pure radix tree (:class:`RadixTree`): walk, split, insert, lock, decide evictions.

The tree *decides* and never frees: every operation that releases memory returns the KV indices and
state slots it dropped (:class:`Freed`, :class:`TreeInsert`) and :class:`~mamba_radix.cache.MambaRadixCache`
hands them back to the pools. So the tree is testable without any pool.

Data model (DESIGN.md §5): each node holds the KV indices of its edge and optionally one checkpoint slot;
a node without one is a tombstone. A prefix is usable only up to the deepest checkpoint on its path.

Recency is a logical clock (:attr:`RadixTree.clock`) that ticks once per request-level operation
(:meth:`RadixTree.match`, :meth:`RadixTree.insert`); every node that operation touches gets the new tick,
so a path touched together shares one stamp and ties are broken by depth (see :mod:`mamba_radix.eviction`).

Which walk runs: a walk with page size 1 and no namespace (the common case) takes the page-1 loop. It
runs compiled (``mamba_radix._cwalk``, built from ``mamba_radix/_cwalk.c`` by ``pip install``) when the
extension imported, because on a large tree the Python loop's interpreter work per node dominates a match;
the compiled loop compares in the key's own buffer, so it copies nothing and takes keys of any length.
Else (not built, ``MAMBA_RADIX_C=0`` at import, see :mod:`mamba_radix.native`, or :data:`_C_WALK` set to
False) a key that fits the scratch buffer takes the pure-Python :func:`_walk_in_scratch`, the reference (a
property test checks the two agree). The extension is optional: a machine without a C compiler installs without it and gets the
Python loops, with the same results. Every other walk takes the general loop in
:meth:`RadixTree._walk_tokens`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.eviction import CheckpointOrder, EvictionIndex, VictimPolicy
from mamba_radix.native import compiled_paths_enabled
from mamba_radix.node import (
    ROOT_ID,
    TokenIds,
    TreeNode,
    as_token_ids,
    child_key,
    key_slice,
    prefix_len_bytes,
    prefix_len_in,
)
from mamba_radix.state_stamp import fingerprint_extend

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig

__all__ = ["Freed", "RadixKey", "RadixTree", "TreeInsert", "TreeMatch"]

# Tokens of the walk's scratch buffer (256 KiB, one per tree, reused: no allocation per walk). A key up
# to this long is copied into it once per walk; a longer one is compared edge by edge (prefix_len_in).
_SCRATCH_TOKENS = 32768


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


# Whether a walk with page_size 1, no namespace and a key that fits the scratch buffer takes
# _walk_in_scratch (a property test turns it off to check it against the general loop).
_FAST_WALK = True

try:  # the compiled page-1 loop: optional (setup.py builds it where a C compiler is found)
    from mamba_radix._cwalk import walk_in_scratch as _c_walk_in_scratch
except ImportError:  # not built (no compiler at install time) or built for another Python
    _c_walk_in_scratch = None

# Whether the page-1 loop runs compiled when the extension imported (False: always the pure-Python
# _walk_in_scratch; tests set it to compare the two; MAMBA_RADIX_C=0 sets it at import, mamba_radix.native).
_C_WALK = compiled_paths_enabled()


def c_walk_active() -> bool:
    """Whether the page-1 walk runs compiled now: the extension imported and :data:`_C_WALK` is on."""
    return _C_WALK and _c_walk_in_scratch is not None


def _walk_in_scratch(
    scratch: bytearray, tokens: TokenIds, child: TreeNode, num_tokens: int, path: list[TreeNode]
) -> tuple[list[TreeNode], int, int]:
    """The walk's loop for the common case: page size 1, no namespace, the key's first ``num_tokens``
    tokens already copied into ``scratch``; ``child`` is the first edge's node (its first token matched).
    The same result as :meth:`RadixTree._walk_tokens`'s general loop (a property test checks it), with
    one bound ``startswith`` (``memcmp``) per whole edge and no page or namespace arithmetic.
    O(len(tokens) + path)."""
    startswith = scratch.startswith
    append = path.append
    nbytes = num_tokens * 8
    pos = 0
    while True:
        edge = child.key
        end = pos + len(edge)
        append(child)
        if end > num_tokens or not startswith(edge, pos * 8, nbytes):
            # the first mismatch is inside this edge (or the key ends there): always a partial match
            return path, pos, prefix_len_bytes(edge, scratch, pos, num_tokens)
        if end == num_tokens:
            return path, end, 0
        children = child.children
        if not children:
            return path, end, 0
        child = children.get(tokens[end])  # type: ignore[assignment]
        if child is None:
            return path, end, 0
        pos = end


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
    """

    def __init__(
        self, config: CacheConfig, device: str | torch.device = "cpu", policy: VictimPolicy | None = None
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
        # the walk's scratch buffer: a walk copies its key's int64 bytes here (so a tree is not safe to
        # walk from two threads at once; nothing in it is)
        self._scratch = bytearray(_SCRATCH_TOKENS * 8)
        # A research policy (mamba_radix.policy.CachePolicy and subclasses), or None for the config's
        # own order. What the tree uses of it is taken here, once: its keys, its victim pickers, and
        # whether it needs prefix fingerprints.
        self.policy = policy
        if policy is not None:
            policy.bind(self)
        self._prefix_fps = policy is not None and policy.needs_prefix_fingerprints
        # the config's keys (no research policy's): _touch_path re-keys only leaves, and the index calls
        # the order's key functions directly (a policy's methods would only forward to them)
        self._base_policy_keys = policy is None or policy.uses_config_keys()
        self.index = EvictionIndex(
            CheckpointOrder.from_config(config), keys=None if self._base_policy_keys else policy
        )
        self._pick_full_victim = EvictionIndex.first_full if policy is None else policy.pick_full_victim
        self._pick_mamba_victim = EvictionIndex.first_mamba if policy is None else policy.pick_mamba_victim
        # a touch only stamps: the index re-keys a stale entry when it reaches the front (EvictionIndex)
        self._lazy_stamps = self.index.lazy_stamps
        self.full_evictable_size = 0
        self.full_protected_size = 0
        self.mamba_evictable_size = 0
        self.mamba_protected_size = 0
        self.num_nodes = 1
        self.version = 0  # bumped by every structural change (nodes, edges, checkpoints): a Walk's validity
        # the last _walk's arguments and result, reused by the next _walk of the very same tokens object
        # while version is unchanged (the cache's pre-insert check walks the key, then insert walks it)
        self._last_walk: tuple[object, ...] | None = None
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

    def _walk(
        self,
        tokens: TokenIds,
        extra_key: str | None,
        start: TreeNode | None = None,
        limit: int | None = None,
    ) -> tuple[list[TreeNode], int, int]:
        """Read-only walk from ``start`` (the root by default) along ``tokens[:limit]``, which continue
        ``start``'s prefix: (fully matched nodes top-down, tokens they cover, tokens matched into the next
        node's edge, 0 if none). The match length is rounded down to whole pages. ``tokens``: an int64
        array (a key's ``token_ids``; another int sequence is converted first). Edges are compared with
        ``memcmp`` (:func:`~mamba_radix.node.prefix_len_in`).

        The last walk is remembered: a walk of the very same int64 array object (identity, not
        equality: a key's ``token_ids``, which nothing mutates), namespace, start and limit while
        :attr:`version` is unchanged returns a copy of its result in O(path) (the cache checks an insert's
        KV against a walk, then the insert walks the same key). O(len(tokens)) otherwise."""
        node = start if start is not None else self.root
        last = self._last_walk
        if (
            last is not None
            and last[0] is tokens
            and last[4] == self.version
            and last[2] is node
            and last[1] == extra_key
            and last[3] == limit
        ):
            return list(last[5]), last[6], last[7]  # type: ignore[arg-type, return-value]
        if not (isinstance(tokens, array) and tokens.typecode == "q"):
            return self._walk_tokens(as_token_ids(tokens), extra_key, node, limit)
        path, pos, partial = self._walk_tokens(tokens, extra_key, node, limit)
        self._last_walk = (tokens, extra_key, node, limit, self.version, tuple(path), pos, partial)
        return path, pos, partial

    def _walk_tokens(
        self, tokens: TokenIds, extra_key: str | None, node: TreeNode, limit: int | None
    ) -> tuple[list[TreeNode], int, int]:
        """:meth:`_walk` without the memo, on an int64 array. O(len(tokens))."""
        page = self.page_size
        num_tokens = len(tokens) if limit is None else min(limit, len(tokens))
        path: list[TreeNode] = []
        if num_tokens == 0 or not node.children:
            return path, 0, 0
        fast = page == 1 and extra_key is None  # child_key is then the first token (no call)
        child = node.children.get(tokens[0] if fast else child_key(tokens, 0, page, extra_key))
        if child is None:  # a miss at the first edge: no bytes needed
            return path, 0, 0
        if fast and _FAST_WALK and _C_WALK and _c_walk_in_scratch is not None:
            # The compiled loop compares the edges in the key's own buffer (which holds its first
            # num_tokens tokens, all the loop asks of its scratch argument): no copy, any key length.
            try:
                return _c_walk_in_scratch(tokens, tokens, child, num_tokens, path)
            except TypeError:  # outside the C loop's contract (path left as it was): the Python loops
                pass
        view = memoryview(tokens)[:num_tokens]
        # A key that fits the scratch buffer is copied into it once (no allocation) and every edge is
        # compared there in place; a longer one edge by edge (prefix_len_in: numpy in place on long edges)
        scratch = self._scratch
        nbytes = num_tokens * 8
        if nbytes <= len(scratch):
            memoryview(scratch)[:nbytes] = view.cast("B")
            if fast and _FAST_WALK:
                return _walk_in_scratch(scratch, tokens, child, num_tokens, path)
            haystack: bytearray | None = scratch
        else:
            haystack = None
        # the general loop: any page size, namespace and key length (and the reference for the one above)
        pos = 0
        while True:
            edge = child.key
            n = len(edge)
            # the common case inline: the whole edge matches (one memcmp, no call); else find where not
            if haystack is None or pos + n > num_tokens or not haystack.startswith(edge, pos * 8, nbytes):
                n = (
                    prefix_len_in(edge, view, pos, scratch)
                    if haystack is None
                    else prefix_len_bytes(edge, haystack, pos, num_tokens)
                )
                if page > 1:
                    n -= n % page
                path.append(child)
                if n < len(edge):
                    return path, pos, n
            else:
                path.append(child)
            pos += n
            if pos >= num_tokens or not child.children:
                return path, pos, 0
            # the next edge's child key, as child_key makes it (a page's bytes: a short tail never matches)
            first = tokens[pos] if page == 1 else view[pos : pos + page].tobytes()
            child = child.children.get(first if extra_key is None else (extra_key, first))
            if child is None:
                return path, pos, 0

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
        page = self.page_size
        if page == 1 and extra_key is None:  # child_key's value, without the call
            parent.children[head[0]] = new  # the slot the child hung from: the same first token
            new.children[rest[0]] = child
        else:
            parent.children[child_key(head, 0, page, extra_key)] = new
            new.children[child_key(rest, 0, page, extra_key)] = child
        new.last_access = now
        child.last_access = now
        # The new node is an internal tombstone: a candidate in neither set, whatever the policy, so it
        # needs no index update. The child keeps its membership; with the base policy only a leaf's key
        # reads last_access (the only field that changed), so an internal child needs none either.
        if not self._base_policy_keys:
            self.index.update(child)
        elif not child.children and not self._lazy_stamps:
            self.index.update_full_stamp(child)
        return new

    def _touch_path(self, path: list[TreeNode], now: int) -> None:
        """Stamp the full recency of ``path``'s nodes. With the base policy only a leaf's candidate key
        reads ``last_access`` (an internal node is never a full-KV candidate, and its checkpoint key reads
        ``mamba_last_access``), so only leaves are re-keyed: the other updates would change nothing.
        A research policy's keys may read anything: every stamped node is re-keyed. O(path * log n); with
        the index's lazy stamps nothing is re-keyed here: O(path)."""
        if self._lazy_stamps:
            for node in path:
                node.last_access = now
            return
        if self._base_policy_keys:
            for node in path:
                if node.last_access != now:
                    node.last_access = now
                    if not node.children:  # only the full key reads the stamp, and only a leaf has one
                        self.index.update_full_stamp(node)
            return
        for node in path:
            if node.last_access != now:
                node.last_access = now
                self.index.update(node)

    def _touch_mamba(self, node: TreeNode, now: int) -> None:
        """Stamp the checkpoint recency of ``node`` (if it holds one) and re-key it: with the base policy
        only its checkpoint key reads the stamp. O(log n); O(1) with the index's lazy stamps."""
        if node.mamba_slot is not None and node.mamba_last_access != now:
            node.mamba_last_access = now
            if self._lazy_stamps:
                return
            if self._base_policy_keys:
                self.index.update_mamba_stamp(node)
            else:
                self.index.update(node)

    # -------------------------------------------------------------------------------------------- match
    def walk(self, key: RadixKey) -> Walk:
        """The read-only walk :meth:`match` starts with (whole pages only). O(len(key)).

        On the common case (page size 1, no namespace, the compiled loop on) it calls the loop itself,
        without :meth:`_walk`'s memo and frames: the admission check's walk, half of whose ~13 µs with cold
        CPU caches were those frames. The general path is the reference
        (``property_tests/test_tree_walk_c.py`` runs whole trees both ways)."""
        tokens = key.token_ids
        if (
            self.page_size == 1
            and key.extra_key is None
            and _C_WALK
            and _FAST_WALK
            and _c_walk_in_scratch is not None
            and type(tokens) is TokenIds
        ):
            path: list[TreeNode] = []
            child = self.root.children.get(tokens[0]) if tokens else None
            # tuple.__new__: a NamedTuple's own __new__ is a Python frame
            if child is None:
                return tuple.__new__(Walk, (key, path, 0, 0, self.version))
            try:
                found = _c_walk_in_scratch(tokens, tokens, child, len(tokens), path)
                return tuple.__new__(Walk, (key, *found, self.version))
            except TypeError:  # outside the loop's contract (path left as it was): the general path
                pass
        path, pos, partial = self._walk(
            tokens, key.extra_key, None, len(tokens) - len(tokens) % self.page_size
        )
        return Walk(key, path, pos, partial, self.version)

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
        self._touch_path(path, now)
        best_idx = len(path) - 1
        while best_idx >= 0 and path[best_idx].mamba_slot is None:
            best_idx -= 1
        if best_idx < 0:  # no hit: the shared empty tensor (nothing can be written into zero elements)
            return TreeMatch((), self.root, 0, pos, self._no_kv)
        best = path[best_idx]
        if self.config.mamba_lru_refresh == "path":
            for node in path[: best_idx + 1]:
                self._touch_mamba(node, now)
        else:
            self._touch_mamba(best, now)
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
        extra_key = key.extra_key if start is self.root else start.extra_key
        path, pos, partial = self._walk(tokens, extra_key, start)  # read-only: a refusal changes nothing
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
        self._touch_path(path, now)
        # The caller's KV at [prev_prefix_len, pos) duplicates the tree's: hand it back for freeing.
        if pos > prev_prefix_len:
            duplicate_kv = value[prev_prefix_len:pos]
        else:  # nothing duplicated, the common case of a hand-over: a shared empty tensor (~2 us saved)
            duplicate_kv = self._no_kv if value.device == self.device else _empty_kv(value.device)
        if self.config.mamba_lru_refresh == "path":
            for node in path:
                self._touch_mamba(node, now)
        end = path[-1] if path else self.root
        if pos < num_tokens:
            leaf_key = key_slice(tokens, pos, num_tokens)
            leaf_kv = value.clone() if pos == 0 else value[pos:].clone()  # a torch slice costs ~2 us
            end = self._add_leaf(end, leaf_key, leaf_kv, mamba_slot, extra_key, now)
            return TreeInsert(
                start.depth + pos, False, end, duplicate_kv, self._enforce_path_cap(end), leaf_kv
            )
        if end.mamba_slot is None:
            self._set_checkpoint(end, mamba_slot, now)
        else:
            self._touch_mamba(end, now)
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
            leaf = self._pick_full_victim(self.index)
            if leaf is None:
                break
            if leaf.mamba_slot is not None:  # a KV-only leaf is never the end of a hit: its loss is free
                freed.kv_victim_age += now - leaf.last_access
                freed.kv_victims += 1
            self._remove_leaf(leaf, freed)
        while freed.num_states < num_states:
            node = self._pick_mamba_victim(self.index)
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
