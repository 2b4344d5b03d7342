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

The host tier (``config.host_tier``, off by default; ``docs/host-tier.md``): a node's KV and checkpoint
may each have a host copy (``host_kv``, ``host_slot``). Device eviction of an unlocked device leaf (a node
whose children are all host-only) that has a host copy *demotes* it: its device KV and checkpoint are
released, the node stays as host-only. Under ``write_back`` the tree asks its :class:`HostBackup` (the
cache, which owns the host pools) to copy a victim to the host first. Host eviction
(:meth:`RadixTree.evict_host`) removes host-only leaves in LRU order; :meth:`RadixTree.promote` makes
host-only nodes device-resident again (a load-back, or an insert that brings the same tokens' KV).

Beside it: the key (:mod:`mamba_radix.radix_key`), the result records (:mod:`mamba_radix.tree_results`,
re-exported here), the argument checks (:mod:`mamba_radix.tree_checks`) and the dump
(:mod:`mamba_radix.tree_view`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from mamba_radix.candidates import COMPACT_MIN_DEAD
from mamba_radix.errors import InvalidArgument, check_count
from mamba_radix.eviction import CheckpointOrder, OrderIndex, VictimPolicy, make_index
from mamba_radix.node import ROOT_ID, TreeNode, child_key
from mamba_radix.radix_key import RadixKey
from mamba_radix.state_stamp import fingerprint_extend
from mamba_radix.token_ids import TokenIds, key_slice
from mamba_radix.tree_checks import check_insert_args, check_insert_below, check_lockable
from mamba_radix.tree_host import HostBackup, HostTierTree
from mamba_radix.tree_results import Freed, TreeInsert, TreeMatch, VictimObserver, Walk
from mamba_radix.tree_view import format_nodes
from mamba_radix.walks import choose_walk

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.walks import WalkKind

# the key and the result records live in their own modules; re-exported here, where callers import them
__all__ = ["Freed", "RadixKey", "RadixTree", "TreeInsert", "TreeMatch", "VictimObserver", "Walk"]


def _empty_kv(device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64, device=device)


class RadixTree(HostTierTree):
    """The Mamba-aware radix tree. Pure: it owns nodes, locks, counters and eviction order, no memory.

    Sizes (kept exact on every 0<->1 lock transition, insert and delete; the root is excluded):
    ``full_evictable_size`` / ``full_protected_size`` in tokens of unlocked / locked nodes,
    ``mamba_evictable_size`` / ``mamba_protected_size`` in checkpoints without / with a mamba lock (a
    KV-only lock, ``inc_lock_ref(node, checkpoint=False)``, protects KV only).

    ``policy``: a research policy (:class:`~mamba_radix.eviction.VictimPolicy`), or None for the config's
    own order. The fast paths, chosen here once (the defaults are the fast forms; the others are the
    references the differential tests build): ``walk``, the walk loop (:func:`mamba_radix.walks.choose_walk`;
    :attr:`walk_kind` says which runs); ``lazy_removal``, ``lazy_stamps`` and ``compact_min_dead``, the
    eviction index's form (:func:`mamba_radix.eviction.make_index`). ``on_victim``: an observer
    :meth:`evict` tells each victim's kind and age (:data:`~mamba_radix.tree_results.VictimObserver`), or
    None; a public attribute, so a component attached to a built cache (the simulator's adaptive split)
    may set it before the evictions it should see.
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
        on_victim: VictimObserver | None = None,
    ) -> None:
        self.config = config
        # told each eviction victim's kind and age (tree_results.VictimObserver); None: nobody listens
        self.on_victim = on_victim
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
        # the state eviction's victims, chosen once: over the order's own keys and picks (no research
        # policy, or the base one) without the host tier, the index hands each victim with its checkpoint
        # entry already out (take_mamba: one call per victim, the entry popped at once); otherwise the
        # picker, and the drop or removal takes the entry out
        self._next_mamba_victim = (
            index.take_mamba
            if isinstance(index, OrderIndex)
            and (policy is None or policy.uses_config_keys())
            and not config.host_tier
            else index.first_mamba
            if policy is None
            else functools.partial(policy.pick_mamba_victim, index)
        )
        self.full_evictable_size = 0
        self.full_protected_size = 0
        self.mamba_evictable_size = 0
        self.mamba_protected_size = 0
        self.num_nodes = 1
        # checkpoints eviction took from nodes a KV-only lock holds (the cost of skip_decode_lock): monotonic
        self.checkpoints_dropped_under_kv_lock = 0
        self.version = 0  # bumped by every structural change (nodes, edges, checkpoints): a Walk's validity
        # slot -> node holding it: catches a slot handed to the tree twice in O(1)
        self.slot_owner: dict[int, TreeNode] = {}
        # the host tier (all empty while it is off): whether it is on, the cache's backup hook (write_back,
        # resumable, the cap's "drop"), host-only nodes by id, host slot -> node, host KV rows held, and the
        # ids a load-back in progress protects from host eviction
        self.host_tier = config.host_tier
        policy = config.host_write_policy
        # resumable (ours) copies at device eviction, through the same hook as write_back
        self.resumable = self.host_tier and policy == "resumable"
        self.write_back = self.host_tier and policy in ("write_back", "resumable")
        self.host_cap_drop = self.host_tier and config.host_path_cap == "drop"
        self.host_backup: HostBackup | None = None
        self.host_only_nodes: dict[int, TreeNode] = {}
        self.host_slot_owner: dict[int, TreeNode] = {}
        self.host_kv_tokens = 0
        self.host_pinned: set[int] = set()
        # the host index: a lazy heap of host-only leaves, (last_access, -depth, id, node), and its ids
        # (tree_host: checked when popped, so a match through host-only nodes writes nothing here)
        self.host_leaves: list[tuple[int, int, int, TreeNode]] = []
        self.host_leaf_ids: set[int] = set()
        # resumable: a lazy heap of host checkpoints that may no longer be resume points (tree_host)
        self.host_stale: list[tuple[int, int, int, TreeNode]] = []
        self.host_stale_ids: set[int] = set()

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
        if value is None:  # a host-only edge: both halves stay host-only
            new = self._new_node(head, None, parent, child.depth - len(key) + num_tokens, extra_key)
            new.host_children = 1
            self.host_only_nodes[new.id] = new
        else:
            new = self._new_node(
                head, value[:num_tokens], parent, child.depth - len(key) + num_tokens, extra_key
            )
            child.value = value[num_tokens:]
        new.full_lock_ref = child.full_lock_ref
        if child.host_kv is not None:  # the host copy splits with the edge (the tiers stay subtrees)
            new.host_kv = child.host_kv[:num_tokens]
            child.host_kv = child.host_kv[num_tokens:]
        new.hit_count = child.hit_count
        rest = key_slice(key, num_tokens, len(key))
        child.key = rest
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
        if self.host_tier:  # KV matched on the device only (host-only nodes end every path)
            pos = self.device_len(path)
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

    def device_len(self, path: Sequence[TreeNode]) -> int:
        """Tokens of ``path`` (a walk's, top-down from the root) whose KV is on the device: up to the first
        host-only node (the device nodes form a subtree from the root). O(path)."""
        for node in path:
            if node.value is None:
                return node.depth - len(node.key)
        return path[-1].depth if path else 0

    def host_extension(self, walk: Walk) -> tuple[TreeNode | None, int]:
        """The host tier's part of ``walk`` (read-only): the deepest node of its fully matched path holding a
        checkpoint on either tier, when its checkpoint is on the host only and it lies deeper than the
        deepest device checkpoint (None otherwise), and that device checkpoint's depth. O(path)."""
        path = walk.path[: len(walk.path) - 1] if walk.partial else walk.path
        device_best = 0
        target = None
        for node in path:
            if node.mamba_slot is not None:
                device_best = node.depth
            if node.host_slot is not None or node.mamba_slot is not None:
                target = node
        if target is None or target.mamba_slot is not None or target.depth <= device_best:
            return None, device_best
        return target, device_best

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
        check_insert_below(node, key, self)
        return self._insert_from(node, key, value, mamba_slot, 0)

    def _insert_from(
        self, start: TreeNode, key: RadixKey, value: torch.Tensor, mamba_slot: int, prev_prefix_len: int
    ) -> TreeInsert:
        tokens = key.token_ids
        num_tokens = len(tokens)
        check_insert_args(num_tokens, value, mamba_slot, prev_prefix_len, self.page_size, self.slot_owner)
        # read-only, so a refusal changes nothing; key.extra_key is start's namespace (insert_below checked)
        walk = self.walk(key, start)
        path, pos, partial = walk.path, walk.pos, walk.partial
        if pos + partial < prev_prefix_len:
            raise InvalidArgument(
                f"prev_prefix_len={prev_prefix_len} but the tree holds only {pos + partial} tokens of this "
                "key; pass the length of the locked prefix the request matched (cache_protected_len)"
            )
        if self.host_tier and prev_prefix_len and self.device_len(path) - start.depth < prev_prefix_len:
            raise InvalidArgument(
                f"prev_prefix_len={prev_prefix_len} reaches into host-only KV (the device holds "
                f"{self.device_len(path) - start.depth} tokens of this key); pass the matched device prefix"
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
        revived = None
        dup_end = pos
        if self.host_tier and path and path[-1].value is None:
            # host-only nodes on the path take the caller's KV as their device copy (SGLang revives them)
            dup_end = self.device_len(path) - start.depth
            chunks = [
                value[n.depth - start.depth - len(n.key) : n.depth - start.depth].clone()
                for n in path
                if n.value is None
            ]
            self.promote([n for n in path if n.value is None], chunks)
            revived = torch.cat(chunks)
        # The caller's KV at [prev_prefix_len, pos) duplicates the tree's: hand it back for freeing.
        if dup_end > prev_prefix_len:
            duplicate_kv = value[prev_prefix_len:dup_end]
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
                start.depth + pos, False, end, duplicate_kv, self._enforce_path_cap(end), leaf_kv, revived
            )
        if end.mamba_slot is None:
            self._set_checkpoint(end, mamba_slot, now)
        else:
            self.index.touch_mamba(end, now)
            return TreeInsert(start.depth + pos, True, end, duplicate_kv, [], None, revived)
        return TreeInsert(
            start.depth + pos, False, end, duplicate_kv, self._enforce_path_cap(end), None, revived
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
        was_leaf = len(parent.children) == parent.host_children  # a device leaf (host-only children aside)
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
        """Tombstone an internal node, or a leaf a KV-only lock holds (its KV stays). The checkpoint must
        be unlocked."""
        self.version += 1
        slot = node.mamba_slot
        assert slot is not None and node.mamba_lock_ref == 0 and (node.children or node.kv_lock_ref)
        node.mamba_slot = None
        del self.slot_owner[slot]
        self.mamba_evictable_size -= 1
        self.index.checkpoint_dropped(node)
        freed.slots.append(slot)
        freed.num_states += 1

    def _enforce_path_cap(self, tail: TreeNode) -> list[int]:
        """Soft cap ``mamba_max_states_per_path`` on the path ending at ``tail`` (SGLang PR #31230).

        Drops the shallowest checkpoints beyond the cap, skipping the tail, forks (``children != 1``)
        and mamba-locked nodes (a KV-only lock does not protect a checkpoint), so a path can stay above the
        cap. With the host tier, ``host_path_cap`` says what happens to a dropped checkpoint's host copy:
        ``keep`` (the default, SGLang #31230) counts device checkpoints only and leaves host copies alone;
        ``drop`` (SGLang #39853) counts a checkpoint held on either tier, skips nodes a load-back pins, and
        frees both copies: the host slots through the :class:`HostBackup` hook at once (the device slots
        come back to the caller). O(path * log n).
        """
        cap = self.config.mamba_max_states_per_path
        if cap < 0:
            return []
        drop_host = self.host_cap_drop
        if drop_host:
            holders = [
                node
                for node in self.path_to_root(tail)
                if node.mamba_slot is not None or node.host_slot is not None
            ]
        else:
            holders = [node for node in self.path_to_root(tail) if node.mamba_slot is not None]
        excess = len(holders) - cap
        freed = Freed()
        host_freed = Freed()
        for node in reversed(holders):  # shallowest first
            if excess <= 0:
                break
            if node is tail or node.mamba_lock_ref > 0 or len(node.children) != 1:
                continue
            if drop_host:
                if node.id in self.host_pinned:
                    continue
                if node.mamba_slot is not None:
                    self._drop_checkpoint(node, freed)
                if node.host_slot is not None:
                    self._drop_host_slot(node, host_freed)
            else:
                self._drop_checkpoint(node, freed)
                if self.resumable and node.host_slot is not None:
                    self._note_stale(node)  # a mid-path copy the cap kept: host eviction takes it first
            excess -= 1
        if host_freed.host_slots:
            assert self.host_backup is not None
            self.host_backup.release_host(host_freed)
        return freed.slots

    # -------------------------------------------------------------------------------------------- locks
    def inc_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> None:
        """Lock ``node``: a full lock on it and every ancestor (their KV stays) and, with ``checkpoint``,
        a mamba lock on its checkpoint.

        ``checkpoint=False`` takes a KV-only lock (``node.kv_lock_ref``; SGLang's
        ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` hand-over lock): the checkpoint stays evictable, so the node
        may become a tombstone while locked (never losing its KV); any node may be KV-locked. A full lock
        needs a node holding a checkpoint (what match returns). The root: a no-op.
        Side effects: the size counters and the candidate sets on 0->1 transitions.
        Raises :class:`InvalidArgument` (nothing changed) for a node not in this tree, or a full lock of a
        tombstone. O(path * log n).
        """
        check_lockable(node, self, "lock")
        if node is self.root:
            return
        if not checkpoint:
            node.kv_lock_ref += 1
        elif node.mamba_slot is None:
            raise InvalidArgument(
                f"cannot lock tombstone node {node.id}: a request locks the checkpoint node match_prefix "
                "returned (last_node), or the root"
            )
        else:
            if node.mamba_lock_ref == 0:
                self.mamba_evictable_size -= 1
                self.mamba_protected_size += 1
            node.mamba_lock_ref += 1
        for x in self.path_to_root(node):
            if x.full_lock_ref == 0:
                self.full_evictable_size -= len(x.key)
                self.full_protected_size += len(x.key)
                x.full_lock_ref = 1
                if x is not node:  # node itself is re-keyed once below, with its own lock too
                    self.index.update(x)
            else:
                x.full_lock_ref += 1
        self.index.update(node)

    def dec_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> Freed | None:
        """Release one lock taken by :meth:`inc_lock_ref` on ``node``, of the same kind (``checkpoint``).

        Releasing the last lock of a KV-only-locked node whose checkpoint was evicted meanwhile leaves an
        unlocked tombstone leaf; unless the config keeps KV-only leaves (``mamba_kv_only_leaves``), it is
        removed then, with the tombstone cascade above it, as eviction would have (:meth:`_remove_leaf`):
        returns what to free (the cache frees it), else None. A full lock's release never removes
        anything (its node holds a checkpoint).
        Raises :class:`InvalidArgument` (nothing changed) if ``node`` holds no lock of that kind.
        O(path * log n).
        """
        check_lockable(node, self, "unlock")
        if node is self.root:
            return None
        if not checkpoint:
            if node.kv_lock_ref == 0:
                raise InvalidArgument(
                    f"node {node.id} holds no KV-only lock (kv_lock_ref=0); release a lock with the "
                    "checkpoint= it was taken with"
                )
            node.kv_lock_ref -= 1
        elif node.mamba_slot is None or node.mamba_lock_ref == 0:
            raise InvalidArgument(
                f"node {node.id} is not locked (mamba_lock_ref={node.mamba_lock_ref}); "
                "every dec_lock_ref needs a matching inc_lock_ref on the same node"
            )
        else:
            node.mamba_lock_ref -= 1
            if node.mamba_lock_ref == 0:
                self.mamba_protected_size -= 1
                self.mamba_evictable_size += 1
        for x in self.path_to_root(node):
            x.full_lock_ref -= 1
            if x.full_lock_ref == 0:
                self.full_protected_size -= len(x.key)
                self.full_evictable_size += len(x.key)
                if x is not node:  # node itself is re-keyed once below, with its own lock too
                    self.index.update(x)
        self.index.update(node)
        if (
            node.mamba_slot is None
            and not node.children
            and node.full_lock_ref == 0
            and not self.config.mamba_kv_only_leaves
        ):
            freed = Freed()  # a tombstone leaf only a KV-only lock kept: it goes now (invariant 1)
            self._remove_leaf(node, freed)
            return freed
        return None

    # ----------------------------------------------------------------------------------------- eviction
    def _remove_leaf(self, leaf: TreeNode, freed: Freed) -> None:
        """Delete an unlocked leaf (KV and checkpoint). Then, unless ``mamba_kv_only_leaves`` (SGLang 0.5.23
        keeps such an ancestor's KV as a KV-only leaf, for KV eviction to take), every unlocked tombstone
        ancestor that becomes a leaf goes too (0.5.20); a KV-only-locked one stays until its release
        (:meth:`dec_lock_ref`). O(removed * log n).

        The index is told about the surviving ancestor only (:meth:`EvictionIndex.child_removed`): a
        tombstone that cascades is in neither candidate set before and after, so re-keying it (an add to
        the full set, then a removal) would change nothing. Locals are hoisted: this runs once per
        removed node on the eviction path."""
        self.version += 1
        index, root, slot_owner, page_size = self.index, self.root, self.slot_owner, self.page_size
        kv_only_leaves = self.config.mamba_kv_only_leaves
        kv, slots = freed.kv, freed.slots
        node = leaf
        while True:
            assert not node.children and node.full_lock_ref == 0 and node.mamba_lock_ref == 0
            parent = node.parent
            assert parent is not None
            key, extra_key = node.key, node.extra_key
            # the edge's child key (mamba_radix.node.child_key), its common form inline: the first token
            del parent.children[
                key[0] if page_size == 1 and extra_key is None else child_key(key, 0, page_size, extra_key)
            ]
            if node.full_evict_key is not None or node.mamba_evict_key is not None:
                index.remove(node)  # a cascading tombstone is listed nowhere: the index holds nothing of it
            node.parent = None
            node.owner = None  # detached: is_attached() is False from now on
            self.num_nodes -= 1
            num_tokens = len(key)
            self.full_evictable_size -= num_tokens
            kv.append(node.value)
            freed.num_tokens += num_tokens
            slot = node.mamba_slot
            if slot is not None:
                del slot_owner[slot]
                self.mamba_evictable_size -= 1
                slots.append(slot)
                freed.num_states += 1
                node.mamba_slot = None
            # the host tier: its host copies go with it (a write_back checkpoint may have a host slot only)
            if node.host_kv is not None or node.host_slot is not None:
                self._drop_host_copies(node, freed)
            if (
                parent is root
                or parent.children
                or parent.mamba_slot is not None
                or parent.full_lock_ref  # a KV-only lock holds it: it goes at that lock's release
                or kv_only_leaves  # 0.5.23: it stays as a KV-only leaf
            ):
                index.child_removed(parent)
                return
            # a tombstone that just became a leaf: it goes too (0.5.20); it was in neither set (an internal
            # node without a checkpoint), so it is not re-keyed on its way out
            assert parent.full_evict_key is None and parent.mamba_evict_key is None
            node = parent

    def evict(self, num_tokens: int = 0, num_states: int = 0) -> Freed:
        """Pick and detach victims until at least ``num_tokens`` KV tokens and ``num_states`` checkpoints
        were released (or no candidate is left). Returns what to free; frees nothing.

        Tokens: unlocked leaves in LRU order, each with its checkpoint and the tombstone cascade.
        States: unlocked checkpoints in ``mamba_eviction_order``; an internal node, or a leaf whose KV a
        KV-only lock holds, becomes a tombstone (counted in :attr:`checkpoints_dropped_under_kv_lock`), an
        unlocked leaf is removed with its KV. States released by the token phase count towards
        ``num_states``.
        Each victim with a checkpoint is reported to :attr:`on_victim` (KV-only leaves are not: their loss
        costs no hit). O(victims * log n).
        """
        if not (type(num_tokens) is int and type(num_states) is int and num_tokens >= 0 and num_states >= 0):
            check_count(num_tokens, "num_tokens")  # the full rule (int subclasses, the error's wording)
            check_count(num_states, "num_states")
        freed = Freed()
        now, observe = self.clock, self.on_victim
        # the per-victim calls, looked up once (a median call takes one or two victims: lookups count)
        remove = self._evict_device_leaf if self.host_tier else self._remove_leaf
        if num_tokens:
            next_full = self._next_full_victim
            while freed.num_tokens < num_tokens:
                leaf = next_full()
                if leaf is None:
                    break
                # a KV-only leaf is never the end of a hit: its loss is free, so it is not reported
                if observe is not None and leaf.mamba_slot is not None:
                    observe("kv", now - leaf.last_access)
                remove(leaf, freed)
        if freed.num_states < num_states:
            next_mamba, drop = self._next_mamba_victim, self._drop_checkpoint
            while freed.num_states < num_states:
                node = next_mamba()
                if node is None:
                    break
                if observe is not None:
                    observe("state", now - node.mamba_last_access)
                if node.kv_lock_ref:  # the checkpoint a decoding request did not lock (skip_decode_lock)
                    self.checkpoints_dropped_under_kv_lock += 1
                # a device leaf (its children, if any, all host-only) goes as without the tier (demoted, not
                # tombstoned: the device order stays the tier-less one); a locked leaf: only a KV-only lock,
                # its KV stays
                if len(node.children) != node.host_children or node.full_lock_ref:
                    if self.write_back and node.host_slot is None and self.host_backup is not None:
                        self.host_backup.backup_state(node)  # the checkpoint keeps a host copy
                    if node.children or node.full_lock_ref:
                        drop(node, freed)
                    else:  # the backup's host eviction took its last (host-only) children: a leaf now
                        remove(node, freed)
                else:
                    remove(node, freed)
        return freed

    # ------------------------------------------------------------------------------------------ display
    def pretty_print(self, max_tokens: int = 8) -> str:
        """A readable dump: a header with the sizes, then one line per node with tokens, KV span, slot,
        locks and stamps, and host copies when the host tier is on (:func:`mamba_radix.tree_view.format_nodes`).
        O(n log n)."""
        header = (
            f"RadixTree(page_size={self.page_size}, nodes={self.num_nodes}, clock={self.clock}, "
            f"full evictable/protected={self.full_evictable_size}/{self.full_protected_size} tokens, "
            f"mamba evictable/protected={self.mamba_evictable_size}/{self.mamba_protected_size} states)"
        )
        return "\n".join([header, *format_nodes(self.root, max_tokens)])
