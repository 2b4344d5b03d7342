"""The radix tree's host tier (``config.host_tier``; ``docs/host-tier.md``): :class:`HostTierTree`, the part of
:class:`~mamba_radix.tree.RadixTree` that records host copies, demotes device leaves, promotes host-only nodes
back and evicts host-only leaves. A mixin over the tree's own state (the host registries ``host_only_nodes``,
``host_slot_owner``, ``host_kv_tokens``, ``host_pinned`` are set up in ``RadixTree.__init__``); like the tree it
decides and reports what to free (:class:`~mamba_radix.tree_results.Freed`), and the cache frees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from mamba_radix.errors import check_count
from mamba_radix.node import TreeNode
from mamba_radix.tree_results import Freed

__all__ = ["HostBackup", "HostTierTree"]


class HostBackup(Protocol):
    """What the tree asks of the host tier's owner (the cache) under ``write_back``: copy a node's device
    KV or checkpoint to the host and record it (:meth:`RadixTree.set_host_copy`), making host room by
    :meth:`RadixTree.evict_host` if needed. Each returns whether the copy was made."""

    def backup_kv(self, node: TreeNode) -> bool: ...

    def backup_state(self, node: TreeNode) -> bool: ...


class HostTierTree:
    """The host-tier methods of :class:`~mamba_radix.tree.RadixTree` (see the module docstring)."""

    def set_host_copy(
        self, node: TreeNode, host_kv: torch.Tensor | None = None, host_slot: int | None = None
    ) -> None:
        """Record a host copy the host tier's owner just made of ``node``'s KV (``host_kv``, host KV indices,
        one per token) and/or checkpoint (``host_slot``). Trusted (the cache's backup): the node holds no
        copy of that kind yet and its parent's KV has one (or is the root). O(1)."""
        if host_kv is not None:
            assert node.host_kv is None and host_kv.numel() == len(node.key)
            assert node.parent is self.root or node.parent.host_kv is not None  # type: ignore[union-attr]
            node.host_kv = host_kv
            self.host_kv_tokens += len(node.key)
        if host_slot is not None:
            assert node.host_slot is None and host_slot not in self.host_slot_owner
            node.host_slot = host_slot
            self.host_slot_owner[host_slot] = node

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
        ``write_back``, made now if the host has room) and is worth keeping there (a checkpoint's host copy,
        or host-only children); else remove it as without the tier. O(log n) plus the copy."""
        backup = self.host_backup
        if self.write_back and backup is not None:
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
            self._remove_leaf(leaf, freed)
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
        state slots were released or none is left. A host-only parent left without children and without a
        host checkpoint goes too; a device tombstone left a leaf goes with its device KV unless the config
        keeps KV-only leaves. Returns what to free (host and device); frees nothing. O(victims * host-only
        nodes): a scan per victim (the first slice; no ordered host index yet)."""
        check_count(num_tokens, "num_tokens")
        check_count(num_slots, "num_slots")
        freed = Freed()
        pinned = self.host_pinned
        while freed.num_host_tokens < num_tokens or len(freed.host_slots) < num_slots:
            victim = None
            best: tuple[int, int, int] | None = None
            for node in self.host_only_nodes.values():
                if node.children or node.id in pinned:
                    continue
                key = (node.last_access, -node.depth, node.id)
                if best is None or key < best:
                    best, victim = key, node
            if victim is None:
                break
            self._remove_host_leaf(victim, freed)
        return freed

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
            if parent is self.root or parent.children or parent.id in self.host_pinned:
                return
            if parent.value is None:
                if parent.host_slot is not None:
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
