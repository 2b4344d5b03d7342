"""The radix tree's host tier (``config.host_tier``; ``docs/host-tier.md``): :class:`HostTierTree`, the part of
:class:`~mamba_radix.tree.RadixTree` that records host copies, demotes device leaves, promotes host-only nodes
back and evicts host-only leaves. A mixin over the tree's own state (the host registries ``host_only_nodes``,
``host_slot_owner``, ``host_kv_tokens``, ``host_pinned``, ``host_leaves``, ``host_stale`` are set up in
``RadixTree.__init__``); like the tree it decides and reports what to free
(:class:`~mamba_radix.tree_results.Freed`), and the cache frees.

The host index (``host_leaves``, ids in ``host_leaf_ids``): a lazy heap of the host-only leaves under the
key ``(last_access, -depth, id)``, so that host eviction takes each victim in O(log n) amortized instead of
scanning the host-only nodes (:meth:`_scan_host_victim`, kept as the reference a property test checks it
against). A node is pushed when it becomes a host-only leaf (a demotion without children, a host-only parent
whose last child went) unless its id is listed already; nothing is done where a node stops being one (a
load-back or an insert promotes it, it leaves the tree) or where its stamp moves (a match or an insert walks
through it): each entry is checked when it reaches the front, as the device's ``LazyStampIndex`` does. Exact
because ``depth`` and ``id`` never change and ``last_access`` only grows, so every listed key is at most its
node's current one.

The ``resumable`` write policy's tree side: which checkpoints are *resume points* (:meth:`is_resume_point`;
the cache's backup copies those first), and host eviction that takes *stale* host checkpoints (a deeper
checkpoint on the same single-child chain serves every request that passes: a sequence's end that a later
turn extended, a branch point that lost its branches) before the host-only leaves, least recently used
first within each class. Stale candidates are kept in a lazy heap (``host_stale``): noted when an insert
or a removal may have made one stale (O(depth) each), checked when popped, so no host eviction scans the
tree for them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from mamba_radix.errors import check_count
from mamba_radix.node import TreeNode
from mamba_radix.tree_results import Freed

__all__ = ["HostBackup", "HostTierTree"]


# an entry of the tree's lazy host heaps (the host index, the resumable policy's stale heap): the node's
# stamp when pushed, -depth, id, the node; smallest first is least recently used, the deeper of a tie first
_Entry = tuple[int, int, int, TreeNode]


def _pop_lru(
    heap: list[_Entry],
    ids: set[int],
    pinned: set[int],
    held: list[_Entry],
    member: Callable[[TreeNode], bool],
) -> TreeNode | None:
    """Pop the least recently used node of a lazy heap that is still a ``member`` and not ``pinned``, or None
    when none is left. Lazy: entries of nodes that are no members any more are dropped (with their ids),
    entries whose stamp moved are re-pushed under the current one (stamps only grow, so the order stays
    exact), pinned nodes' entries are moved to ``held`` (a load-back in progress reads them; the caller
    hands them to :func:`_push_back`). O(entries popped * log n)."""
    while heap:
        stamp, neg_depth, node_id, node = heap[0]
        if not member(node):
            heapq.heappop(heap)
            ids.discard(node_id)
        elif node.last_access != stamp:
            heapq.heapreplace(heap, (node.last_access, neg_depth, node_id, node))
        elif node_id in pinned:
            held.append(heapq.heappop(heap))
        else:
            heapq.heappop(heap)
            ids.discard(node_id)
            return node
    return None


def _push_back(heap: list[_Entry], ids: set[int], held: list[_Entry]) -> None:
    """Put the entries :func:`_pop_lru` held back into their heap, ids too (a compaction may have run while
    they were out; none can have been pushed again meanwhile: a pinned node keeps its class). O(held * log
    n)."""
    for entry in held:
        heapq.heappush(heap, entry)
        ids.add(entry[2])


class HostBackup(Protocol):
    """What the tree asks of the host tier's owner (the cache) under ``write_back``: copy a node's device
    KV or checkpoint to the host and record it (:meth:`RadixTree.set_host_copy`), making host room by
    :meth:`RadixTree.evict_host` if needed. Each returns whether the copy was made."""

    def backup_kv(self, node: TreeNode) -> bool: ...

    def backup_state(self, node: TreeNode) -> bool: ...

    def release_host(self, freed: Freed) -> None:
        """Free the host copies in ``freed`` that the tree just dropped from live nodes (the per-path cap
        under ``host_path_cap="drop"``)."""


class HostTierTree:
    """The host-tier methods of :class:`~mamba_radix.tree.RadixTree` (see the module docstring)."""

    def set_host_copy(
        self, node: TreeNode, host_kv: torch.Tensor | None = None, host_slot: int | None = None
    ) -> None:
        """Record a host copy the host tier's owner just made of ``node``'s KV (``host_kv``, host KV indices,
        one per token) and/or checkpoint (``host_slot``). Trusted (the cache's backup): the node holds no
        copy of that kind yet and its parent's KV has one (or is the root). Under ``resumable`` a checkpoint
        copied while it may be stale (one child: a fallback copied into free host memory) is noted for
        host eviction to take first. O(1), O(log n) for such a note."""
        if host_kv is not None:
            assert node.host_kv is None and host_kv.numel() == len(node.key)
            assert node.parent is self.root or node.parent.host_kv is not None  # type: ignore[union-attr]
            node.host_kv = host_kv
            self.host_kv_tokens += len(node.key)
        if host_slot is not None:
            assert node.host_slot is None and host_slot not in self.host_slot_owner
            node.host_slot = host_slot
            self.host_slot_owner[host_slot] = node
            if len(node.children) == 1:
                self._note_stale(node)  # checked again when taken; a no-op but under resumable

    def _drop_host_slot(self, node: TreeNode, freed: Freed) -> None:
        """Hand ``node``'s host checkpoint to ``freed``; the node stays (its host KV too). O(1)."""
        self.version += 1
        slot = node.host_slot
        assert slot is not None and self.host_slot_owner.get(slot) is node
        del self.host_slot_owner[slot]
        freed.host_slots.append(slot)
        node.host_slot = None

    # ------------------------------------------------------------------------------ resumable placement
    def is_resume_point(self, node: TreeNode) -> bool:
        """Whether a later request can resume from ``node``'s checkpoint, as the tree stands: below it, the
        single-child chain reaches a leaf (a sequence's end) or a fork (>= 2 children: requests that
        diverge there resume here) before any other checkpoint, on either tier. Otherwise a deeper
        checkpoint serves every request that passes (a track-interval checkpoint inside a prompt, a turn
        that a later turn extended): the checkpoint is *stale*. O(chain below it)."""
        while len(node.children) == 1:
            (node,) = node.children.values()
            if node.mamba_slot is not None or node.host_slot is not None:
                return False
        return True

    def note_shape_change(self, node: TreeNode) -> None:
        """``resumable``: ``node`` gained or lost a child. Walk up its single-child chain to the nearest
        checkpoint holder (either tier) and note it stale (:meth:`_note_stale`) if it has one child: its
        chain may now reach a deeper checkpoint. A fork or the root ends the walk. O(depth + log n)."""
        while node is not self.root:
            if node.mamba_slot is not None or node.host_slot is not None:
                if len(node.children) == 1:
                    self._note_stale(node)
                return
            if len(node.children) != 1:
                return
            node = node.parent  # type: ignore[assignment]

    def _note_stale(self, node: TreeNode) -> None:
        """``resumable``: note that ``node`` may hold a stale host checkpoint (see :meth:`is_resume_point`),
        for :meth:`evict_host` to take before the resumable ones; checked again when taken. A no-op for a
        node without a host checkpoint, one noted already, or another policy. O(log n)."""
        if self.resumable and node.host_slot is not None and node.id not in self.host_stale_ids:
            if len(self.host_stale) > 2 * len(self.host_slot_owner) + 64:
                self._compact_stale()
            heapq.heappush(self.host_stale, (node.last_access, -node.depth, node.id, node))
            self.host_stale_ids.add(node.id)

    def _compact_stale(self) -> None:
        """Drop the heap's entries that no longer name a stale host checkpoint, so that it stays within a
        constant factor of the host slots. O(heap * chain): amortized O(chain) per note."""
        keep = [e for e in self.host_stale if self._is_stale(e[3])]
        heapq.heapify(keep)
        self.host_stale = keep
        self.host_stale_ids = {e[2] for e in keep}

    def _is_stale(self, node: TreeNode) -> bool:
        return node.owner is self and node.host_slot is not None and not self.is_resume_point(node)

    def _evict_stale(self, num_slots: int, freed: Freed) -> None:
        """Free the host checkpoints of stale nodes (see :meth:`_note_stale`), least recently used first (the
        deeper of a tie first), until ``freed`` holds ``num_slots`` host slots or none is left; the nodes
        stay. Entries whose node changed class are discarded, ones whose stamp moved are re-pushed (stamps
        only grow, so the heap's order stays LRU). O(entries popped * log n)."""
        held: list[_Entry] = []
        while len(freed.host_slots) < num_slots:
            node = _pop_lru(self.host_stale, self.host_stale_ids, self.host_pinned, held, self._is_stale)
            if node is None:
                break
            self._drop_host_slot(node, freed)
        _push_back(self.host_stale, self.host_stale_ids, held)

    def _drop_host_copies(self, node: TreeNode, freed: Freed) -> None:
        """Hand ``node``'s host copies to ``freed`` (the node is leaving the tree). O(1)."""
        if node.host_kv is not None:
            freed.host_kv.append(node.host_kv)
            freed.num_host_tokens += len(node.host_kv)
            self.host_kv_tokens -= len(node.host_kv)
            node.host_kv = None
        if node.host_slot is not None:
            del self.host_slot_owner[node.host_slot]
            freed.host_slots.append(node.host_slot)
            node.host_slot = None

    def _evict_device_leaf(self, leaf: TreeNode, freed: Freed) -> None:
        """Device eviction of an unlocked device leaf with the host tier on: demote it (device KV and
        checkpoint released, the node kept as host-only) when it has a host copy of its KV (under
        ``write_back``, made now if the host has room; under ``resumable`` made with its checkpoint's copy,
        which the cache's :meth:`HostBackup.backup_state` decides) and is worth keeping there (a
        checkpoint's host copy, or host-only children); else remove it as without the tier. O(depth) plus
        the copy."""
        backup = self.host_backup
        if self.resumable and backup is not None:
            # a leaf without a checkpoint is not worth a host copy of its own KV: nothing could resume there
            if leaf.mamba_slot is not None and leaf.host_slot is None:
                backup.backup_state(leaf)
        elif self.write_back and backup is not None:
            # the host copies stay a subtree from the root: ancestors without one are copied first, top-down
            # (SGLang's write_back copies the victim alone; ours also keeps its ancestors' KV on the host)
            chain = []
            node = leaf
            while node is not self.root and node.host_kv is None:
                chain.append(node)
                node = node.parent  # type: ignore[assignment]
            for node in reversed(chain):
                if not backup.backup_kv(node):
                    break
            if leaf.host_kv is not None and leaf.mamba_slot is not None and leaf.host_slot is None:
                backup.backup_state(leaf)
        if leaf.host_kv is None or (not leaf.children and leaf.host_slot is None):
            if leaf.host_kv is None and leaf.host_slot is not None:
                # a checkpoint write_back copied while the node's KV had no host copy: it cannot stay on the
                # host without its KV, and the removal frees host copies only with host KV
                self._drop_host_slot(leaf, freed)
            if not self.resumable:
                self._remove_leaf(leaf, freed)
                return
            # the surviving ancestor lost a child: it may have become stale (the removal's cascade stops
            # at a fork, a checkpoint or a lock; a miss only costs the preference, never correctness)
            above = leaf.parent
            assert above is not None
            while (
                above is not self.root
                and len(above.children) == 1
                and above.mamba_slot is None
                and not above.full_lock_ref
                and not self.config.mamba_kv_only_leaves
            ):
                above = above.parent  # type: ignore[assignment]
            self._remove_leaf(leaf, freed)
            if above is not self.root and above.owner is self:
                self.note_shape_change(above)
            return
        self.version += 1
        freed.kv.append(leaf.value)  # type: ignore[arg-type]
        freed.num_tokens += len(leaf.key)
        self.full_evictable_size -= len(leaf.key)
        leaf.value = None
        if leaf.mamba_slot is not None:
            del self.slot_owner[leaf.mamba_slot]
            self.mamba_evictable_size -= 1
            freed.slots.append(leaf.mamba_slot)
            freed.num_states += 1
            leaf.mamba_slot = None
        self.host_only_nodes[leaf.id] = leaf
        if not leaf.children:
            self._note_host_leaf(leaf)
        self.index.update(leaf)  # out of both sets: a host-only node is no device candidate
        parent = leaf.parent
        assert parent is not None
        parent.host_children += 1
        self.index.update(parent)  # it may have become a device leaf

    def promote(self, nodes: Sequence[TreeNode], values: Sequence[torch.Tensor]) -> None:
        """Make host-only ``nodes`` (top-down, each the previous one's child or the first one's parent
        device-resident) device-resident with the device KV indices ``values`` (now the tree's); their
        host copies stay. Trusted: the caller (an insert, a load-back) allocated or owns the indices.
        O(nodes * log n)."""
        if not nodes:
            return
        self.version += 1
        for node, value in zip(nodes, values, strict=True):
            assert node.value is None and value.numel() == len(node.key)
            parent = node.parent
            assert parent is not None and parent.value is not None
            node.value = value
            del self.host_only_nodes[node.id]
            parent.host_children -= 1
            if node.full_lock_ref == 0:
                self.full_evictable_size += len(node.key)
            else:  # pragma: no cover - a host-only node holds no lock (invariant)
                self.full_protected_size += len(node.key)
            self.index.update(parent)
            self.index.update(node)

    def count_hit(self, node: TreeNode) -> int:
        """Count one hit on ``node`` for the host write policy (write_through_selective); its new count.
        O(1)."""
        node.hit_count += 1
        return node.hit_count

    def set_device_checkpoint(self, node: TreeNode, mamba_slot: int) -> None:
        """Give device-resident ``node`` (a tombstone on the device) the checkpoint ``mamba_slot`` loaded
        from its host copy. Trusted. O(log n)."""
        assert node.value is not None and node.mamba_slot is None and mamba_slot not in self.slot_owner
        self._set_checkpoint(node, mamba_slot, node.mamba_last_access)

    def evict_host(self, num_tokens: int = 0, num_slots: int = 0) -> Freed:
        """Remove host-only leaves, least recently used first (the deeper of a tie first; a load-back's
        :attr:`host_pinned` nodes are skipped), until ``num_tokens`` host KV rows and ``num_slots`` host
        state slots were released or none is left. Under ``resumable``, host slots are first taken from
        stale host checkpoints (:meth:`_evict_stale`; the nodes stay). A host-only parent left without
        children and without a host checkpoint goes too; a device tombstone left a leaf goes with its device
        KV unless the config keeps KV-only leaves. Returns what to free (host and device); frees nothing.
        O(victims * log n) amortized: each victim comes from the host index (:meth:`_next_host_victim`)."""
        check_count(num_tokens, "num_tokens")
        check_count(num_slots, "num_slots")
        freed = Freed()
        if self.resumable and num_slots:
            self._evict_stale(num_slots, freed)
        held: list[_Entry] = []
        while freed.num_host_tokens < num_tokens or len(freed.host_slots) < num_slots:
            victim = self._next_host_victim(held)
            if victim is None:
                break
            self._remove_host_leaf(victim, freed)
        _push_back(self.host_leaves, self.host_leaf_ids, held)
        return freed

    def _next_host_victim(self, held: list[_Entry]) -> TreeNode | None:
        """Pop the host index's least recently used unpinned host-only leaf (the deeper of a tie first, then
        the lower id: :meth:`_scan_host_victim`'s pick), or None when there is none. Side effects on the
        index: entries whose node is no host-only leaf any more are dropped, entries whose stamp moved are
        re-pushed under the current one, pinned leaves' entries are moved to ``held`` (the caller pushes
        them back). O(entries popped * log n); each pop but the victim's follows a touch, a promotion, a
        removal or a pin (a load-back's few nodes), so amortized O(log n) per victim."""
        return _pop_lru(self.host_leaves, self.host_leaf_ids, self.host_pinned, held, self._is_host_leaf)

    def _scan_host_victim(self) -> TreeNode | None:
        """The reference for :meth:`_next_host_victim`: the least recently used unpinned host-only leaf by a
        scan of every host-only node (the deeper of a tie first, then the lower id), or None. No side
        effects. O(host-only nodes)."""
        victim = None
        best: tuple[int, int, int] | None = None
        pinned = self.host_pinned
        for node in self.host_only_nodes.values():
            if node.children or node.id in pinned:
                continue
            key = (node.last_access, -node.depth, node.id)
            if best is None or key < best:
                best, victim = key, node
        return victim

    def _is_host_leaf(self, node: TreeNode) -> bool:
        """Whether ``node`` is a host-only leaf of this tree (what the host index lists). O(1)."""
        return node.owner is self and node.value is None and not node.children

    def _note_host_leaf(self, node: TreeNode) -> None:
        """List ``node``, which just became a host-only leaf, in the host index under its current key; a
        no-op if its id is listed already (that entry's key is at most the current one: it is re-keyed when
        it reaches the front). Compacts first when the heap outgrew twice the host-only nodes (plus a
        constant, so that small trees never compact). O(log n), amortized with the compaction."""
        if node.id in self.host_leaf_ids:
            return
        if len(self.host_leaves) > 2 * len(self.host_only_nodes) + 64:
            self._compact_host_leaves()
        heapq.heappush(self.host_leaves, (node.last_access, -node.depth, node.id, node))
        self.host_leaf_ids.add(node.id)

    def _compact_host_leaves(self) -> None:
        """Drop the host index's entries whose node is no host-only leaf any more and re-key the others
        under their current stamps. O(heap): amortized O(1) per push, as a compaction at least halves
        the heap."""
        keep = [
            (node.last_access, neg_depth, node_id, node)
            for _, neg_depth, node_id, node in self.host_leaves
            if self._is_host_leaf(node)
        ]
        heapq.heapify(keep)
        self.host_leaves = keep
        self.host_leaf_ids = {entry[2] for entry in keep}

    def _remove_host_leaf(self, node: TreeNode, freed: Freed) -> None:
        """Detach host-only leaf ``node`` and its host copies, then the cascade of :meth:`evict_host`."""
        while True:
            self.version += 1
            parent = node.parent
            assert parent is not None and node.value is None and not node.children
            del parent.children[self._child_key(node.key, 0, node.extra_key)]
            parent.host_children -= 1
            del self.host_only_nodes[node.id]
            self.index.remove(node)
            node.parent = None
            node.owner = None
            self.num_nodes -= 1
            self._drop_host_copies(node, freed)
            self.index.update(parent)
            if self.resumable and parent is not self.root:
                self.note_shape_change(parent)  # a branch point may have lost its last branch but one
            if parent is self.root or parent.children:
                return
            if parent.id in self.host_pinned:
                if parent.value is None:  # a load-back's target, say: listed for after the load-back
                    self._note_host_leaf(parent)
                return
            if parent.value is None:
                if parent.host_slot is not None:
                    self._note_host_leaf(parent)  # a host-only leaf now: host eviction may take it later
                    return
                node = parent  # a host-only tombstone left a leaf: useless, it goes too
                continue
            if (
                parent.mamba_slot is None
                and parent.full_lock_ref == 0
                and not self.config.mamba_kv_only_leaves
            ):
                self._remove_leaf(parent, freed)  # invariant 1: no device tombstone leaf
            return
