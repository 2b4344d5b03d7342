"""The cache's host tier (``config.host_tier``; ``docs/host-tier.md``): :class:`HostTierCache`, the part of
:class:`~mamba_radix.cache.MambaRadixCache` that copies nodes to the host pools the tree asks for (its
:class:`~mamba_radix.tree_host.HostBackup`), evicts host copies, and plans and applies load-backs
(:class:`~mamba_radix.cache_results.LoadPlan`). A mixin over the cache's own state (``host_kv_pool``,
``host_state_pool``, ``host_stats``, set up in ``MambaRadixCache.__init__``); the tree decides, this frees.

Our write policy, ``resumable`` (issue 25; ``docs/host-tier.md``): the host keeps first what a later request
can resume from, not every node. A *resume point* (:meth:`RadixTree.is_resume_point`: below it the tree
reaches a sequence's end or a fork before any other checkpoint) is backed up, with the KV of its path,
top-down, so the host copies stay one subtree, evicting host copies if it must. Any other checkpoint is
copied only into free host memory: it displaces nothing, and when host eviction later trims the deeper
part of its chain (host KV binds), it is the point a request still resumes from. Copying resume points
only lost to SGLang's write_through on the Mooncake conversation trace (at 32 GiB, host 4x: 8.99% token
hits against 10.97%), where host KV binds and chains are trimmed from their ends; with the free-memory
copies it gets 15.36% (docs/host-tier.md). The copies are made
at device eviction (as ``write_back``: the tree's demotion of a leaf, or :meth:`backup_state` before an
internal checkpoint is dropped), not at hand-over. Measured against hand-over copies (as ``write_through``,
for the inserted tail and a fork's checkpoint) and both together, with ``mamba-radix simulate --synthetic
chat|agent|tree|system-prompt --model kimi-k3 --tp-size 8 --mamba-radix-cache-strategy extra_buffer
--mode timed --host-memory-ratio 4`` at 0.5 to 2 GiB (docs/host-tier.md has the numbers): eviction-time
copies gave the same token hit rate on chat, agent and system-prompt and a higher one on tree (78.58% vs
78.03% at 0.5 GiB), with 22% to 75% fewer states copied (chat at 1 GiB: 74 states, 2.87 GiB moved, against
213 states, 6.73 GiB). A hand-over copy of a chunk or turn boundary is mostly wasted: the next chunk or
turn makes it stale before any request could resume there. Host eviction takes stale host checkpoints
first (:meth:`RadixTree.evict_host`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import torch

from mamba_radix.cache_results import EvictResult, HostTierStats, LoadPlan
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, OutOfMemory, OutOfSlots
from mamba_radix.node import TreeNode
from mamba_radix.policy import CachePolicy
from mamba_radix.pools.host_kv_pool import HostKVPool, KVStorage
from mamba_radix.pools.host_state_pool import HostStatePool
from mamba_radix.radix_key import RadixKey
from mamba_radix.tree_results import Freed


def check_host_tier_options(config: CacheConfig, policy: CachePolicy | None) -> None:
    """Refuse, before the cache builds anything, a research policy that cannot run with the host tier
    (``policy.host_tier_problem``: the offline oracle, whose future uses come from a replay without the
    tier). Any other policy chooses the device victims and admission as without the tier; demotion and
    host eviction stay the tier's. Raises :class:`InvalidArgument`; no effect without the tier. O(1)."""
    if not config.host_tier or policy is None:
        return
    problem = getattr(type(policy), "host_tier_problem", None)  # not a CachePolicy: the cache refuses it next
    if problem is not None:
        raise InvalidArgument(
            f"research policy {type(policy).__name__} cannot run with the host tier: {problem}; "
            "pass another policy or set host_kv_tokens=host_state_slots=0"
        )


class HostTierCache:
    """The host-tier methods of :class:`~mamba_radix.cache.MambaRadixCache` (see the module docstring)."""

    def _init_host_tier(self, kv_storage: KVStorage | None) -> None:
        """Build the host tier's pools and state over the cache's config and state pool (called once, by the
        cache's constructor, after the tree): both host pools, the counters, the hit threshold of the
        write policy, the open load plans, and the tree's backup hook. The attributes are None while the
        tier is off (every branch on it tests one attribute). O(host pool sizes)."""
        config = self.config
        self.host_kv_pool: HostKVPool | None = None
        self.host_state_pool: HostStatePool | None = None
        self.host_stats: HostTierStats | None = None
        if not config.host_tier:
            return
        self.host_kv_pool = HostKVPool(config.host_kv_tokens, kv_storage)
        self.host_state_pool = HostStatePool(self.mamba_pool, config.host_state_slots)
        self.host_stats = HostTierStats()
        policy_name = config.host_write_policy
        self._host_threshold = (
            0
            if policy_name == "write_back"
            else 1
            if policy_name == "write_through"
            else config.host_write_through_threshold
        )
        self._plan_ids = itertools.count(1)
        self._open_plans: dict[int, LoadPlan] = {}
        self.tree.host_backup = self

    def _count_host_hits(self, nodes: list[TreeNode]) -> None:
        """Count a hit on each of ``nodes`` (top-down, device-resident) and back up those that reach the
        write policy's threshold (write_through: 1, write_through_selective: ``host_write_through_threshold``)
        and whose parent's KV is on the host (or is the root), as SGLang's ``write_backup`` requires: the
        host copies stay a subtree from the root. Under ``resumable`` nothing is copied here; the last
        node's parent is passed to :meth:`RadixTree.note_shape_change`. O(nodes) plus the copies."""
        threshold = self._host_threshold
        root = self.tree.root
        if self.tree.resumable:
            # no copy now (resumable copies at device eviction); only the shape: the insert's tail may
            # make a checkpoint above it stale (a later turn extends its sequence). O(chain above it)
            if nodes and nodes[-1].parent is not None:
                self.tree.note_shape_change(nodes[-1].parent)
            return
        for node in nodes:
            hits = self.tree.count_hit(node)
            if hits < threshold or node.value is None:
                continue
            if node.host_kv is None and (node.parent is root or node.parent.host_kv is not None):  # type: ignore[union-attr]
                self.backup_kv(node)
            if node.host_kv is not None and node.mamba_slot is not None and node.host_slot is None:
                self._copy_state(node)

    def _backup_path_kv(self, node: TreeNode) -> bool:
        """Back up the KV of device-resident ``node`` and of its ancestors that have no host copy, top-down
        (the host copies stay one subtree); whether ``node``'s KV is on the host now. O(depth) plus the
        copies."""
        root = self.tree.root
        chain = []
        while node is not root and node.host_kv is None:
            chain.append(node)
            node = node.parent  # type: ignore[assignment]
        return all(self.backup_kv(x) for x in reversed(chain))  # all() stops at the first failure

    def backup_kv(self, node: TreeNode) -> bool:
        """Copy ``node``'s device KV into host rows and record it on the node (the tree's
        :class:`~mamba_radix.tree.HostBackup` call), evicting host-only leaves when the host is short;
        False, nothing copied, when it stays short or the pool refuses the backup anyway (``OutOfMemory``:
        a refused backup takes nothing; counted in ``backups_skipped``). O(tokens * bytes per token)."""
        pool, stats = self.host_kv_pool, self.host_stats
        assert pool is not None and stats is not None and node.value is not None
        need = len(node.key)
        if pool.available_size() < need:
            self._release(self.tree.evict_host(num_tokens=need - pool.available_size()))
        try:
            host_kv = pool.backup(node.value) if pool.available_size() >= need else None
        except OutOfMemory:  # the pool refused after all (a fault): it took nothing, so skip the copy
            host_kv = None
        if host_kv is None:
            stats.backups_skipped += 1
            return False
        self.tree.set_host_copy(node, host_kv=host_kv)
        if self._events is not None:
            self._events.backed_up_kv(node)
        stats.kv_backed_up += need
        return True

    def backup_state(self, node: TreeNode) -> bool:
        """Copy ``node``'s device checkpoint into a host slot and record it (as :meth:`backup_kv`): the
        tree's call before it drops a checkpoint (``write_back``, ``resumable``). Under ``resumable`` the
        path's KV is copied first, top-down; a resume point (:meth:`RadixTree.is_resume_point`) is copied
        even if host copies must be evicted for it, any other checkpoint only into free host memory
        (:meth:`_fits_free_host`): it displaces nothing, and it is a fallback if host eviction later trims
        the deeper part of its chain. The copy runs on the current stream, ahead of any later reuse of the
        device slot. O(slot bytes), plus O(depth) and the KV copies under ``resumable``."""
        if self.tree.resumable:
            if not self.tree.is_resume_point(node) and not self._fits_free_host(node):
                return False
            if not self._backup_path_kv(node):
                return False
        return self._copy_state(node)

    def _fits_free_host(self, node: TreeNode) -> bool:
        """Whether a host copy of ``node``'s checkpoint and of its path's KV not on the host yet fits in
        free host memory, without evicting anything. O(depth)."""
        kv_pool, state_pool = self.host_kv_pool, self.host_state_pool
        assert kv_pool is not None and state_pool is not None
        if state_pool.available_size() < 1:
            return False
        missing_tokens, root = 0, self.tree.root
        while node is not root and node.host_kv is None:
            missing_tokens += len(node.key)
            node = node.parent  # type: ignore[assignment]
        return kv_pool.available_size() >= missing_tokens

    def _copy_state(self, node: TreeNode) -> bool:
        """:meth:`backup_state` without the policy's filter; False, nothing copied, as :meth:`backup_kv`
        (the pool's refusal here is ``OutOfSlots``). O(slot bytes)."""
        pool, stats = self.host_state_pool, self.host_stats
        assert pool is not None and stats is not None and node.mamba_slot is not None
        if pool.available_size() < 1:
            self._release(self.tree.evict_host(num_slots=1))
        try:
            host_slots = pool.backup([node.mamba_slot])[0] if pool.available_size() >= 1 else None
        except OutOfSlots:  # the pool refused after all (a fault): it took nothing, so skip the copy
            host_slots = None
        if host_slots is None:
            stats.backups_skipped += 1
            return False
        self.tree.set_host_copy(node, host_slot=int(host_slots[0]))
        if self._events is not None:
            self._events.backed_up_state(node)
        stats.states_backed_up += 1
        return True

    def release_host(self, freed: Freed) -> None:
        """Free host copies the tree dropped from live nodes (the tree's
        :class:`~mamba_radix.tree_host.HostBackup` call: the per-path cap under ``host_path_cap="drop"``:
        host slots only, the nodes stay). Freed here, not by ``_release``, so that the event log names
        them ``capped``. Trusted: each slot was the node's alone. O(slots)."""
        assert self.host_state_pool is not None and not (freed.kv or freed.slots or freed.host_kv)
        if self._events is not None:
            self._events.host_capped(freed.host_slots)
        self.host_state_pool.free(freed.host_slots)

    def evict_host(self, num_tokens: int = 0, num_slots: int = 0) -> EvictResult:
        """Free at least ``num_tokens`` host KV rows and ``num_slots`` host state slots by removing host-only
        leaves, least recently used first (:meth:`RadixTree.evict_host`). Raises :class:`InvalidArgument`
        without the host tier or for counts that are not ints >= 0 (nothing changed). Returns the host
        tokens and slots freed. O(victims * log n) amortized (the host index)."""
        if self.host_stats is None:
            raise InvalidArgument(
                "evict_host needs the host tier; set host_kv_tokens and host_state_slots > 0"
            )
        freed = self.tree.evict_host(num_tokens, num_slots)
        self._release(freed)
        return EvictResult(freed.num_host_tokens, len(freed.host_slots))

    def plan_load_back(self, key: RadixKey | Sequence[int]) -> LoadPlan | None:
        """The load-back that would make ``key``'s deepest host-resident checkpoint a device hit, with its
        device memory allocated: None when the host holds no checkpoint deeper than the device hit (or the
        host tier is off), or when the device has no room even after eviction (counted in
        ``host_stats.loads_skipped``; nothing kept). Side effects: allocates (evicting) the device KV and the
        device slot the plan names, pins the host path against host eviction and KV-locks its device end
        until :meth:`apply_load_plan`, which is to follow before any other call on this cache (the
        lifecycle's admission applies it at once); the tree is not split. O(L + path + victims * log n)."""
        stats = self.host_stats
        if stats is None:
            return None
        tree = self.tree
        walk = tree.walk(self._as_key(key, None))
        target, _ = tree.host_extension(walk)
        if target is None:
            return None
        path = walk.path
        nodes = tuple(node for node in path[: path.index(target) + 1] if node.value is None)
        anchor = nodes[0].parent if nodes else target
        assert anchor is not None
        num_tokens = sum(len(node.key) for node in nodes)
        tree.host_pinned.update(node.id for node in nodes)
        tree.host_pinned.add(target.id)  # its host checkpoint too (a stale one could be taken, resumable)
        tree.inc_lock_ref(anchor, checkpoint=False)  # the root: a no-op
        kv = (
            self.alloc_token_slots(num_tokens)
            if num_tokens
            else torch.empty(0, dtype=torch.int64, device=self.device)
        )
        slot = self.alloc_state_slot() if kv is not None else None
        if kv is None or slot is None:
            if kv is not None and kv.numel():
                self.token_to_kv_pool_allocator.free(kv, check=False)
            self._end_load_back(nodes, anchor, target)
            stats.loads_skipped += 1
            return None
        assert target.host_slot is not None
        host_kv = torch.cat([node.host_kv for node in nodes]) if nodes else kv[:0].cpu()  # type: ignore[misc]
        plan = LoadPlan(
            next(self._plan_ids),
            host_kv,
            kv,
            target.host_slot,
            slot,
            target.depth,
            nodes=nodes,
            target=target,
        )
        self._open_plans[plan.plan_id] = plan
        return plan

    def _end_load_back(self, nodes: tuple[TreeNode, ...], anchor: TreeNode, target: TreeNode) -> None:
        self.tree.host_pinned.difference_update(node.id for node in nodes)
        self.tree.host_pinned.discard(target.id)
        self.dec_lock_ref(anchor, checkpoint=False)

    def apply_load_plan(self, plan: LoadPlan) -> LoadPlan:
        """Copy ``plan``'s host KV rows and host slot into its device KV indices and slot (through the host
        pools: ``state_ops`` gather/scatter for the state), make its nodes device-resident again (their
        host copies stay), give the target node its device checkpoint, and release the pin and lock
        :meth:`plan_load_back` took. Returns the plan with ``applied`` and the copy's ``event``. Raises
        :class:`InvalidArgument` (nothing changed) for a plan applied already or not made by this cache.
        O(tokens * bytes per token + slot bytes + nodes * log n)."""
        if (
            not isinstance(plan, LoadPlan)
            or self.host_stats is None
            or self._open_plans.get(plan.plan_id) is not plan
        ):
            raise InvalidArgument(
                "this load plan was applied already or is not this cache's; make a new one with plan_load_back"
            )
        del self._open_plans[plan.plan_id]
        kv_pool, state_pool = self.host_kv_pool, self.host_state_pool
        assert kv_pool is not None and state_pool is not None and plan.target is not None
        if plan.nodes:
            kv_pool.load(plan.host_kv, plan.device_kv)
        event = state_pool.load([plan.host_slot], [plan.device_slot])
        values = (
            list(torch.split(plan.device_kv, [len(node.key) for node in plan.nodes])) if plan.nodes else []
        )
        self.tree.promote(plan.nodes, values)
        self.tree.set_device_checkpoint(plan.target, plan.device_slot)
        if self._events is not None:
            self._events.loaded(plan.nodes, plan.target)
        if self._tree_kv is not None and plan.nodes:
            self._tree_kv.hold(plan.device_kv)
        anchor = plan.nodes[0].parent if plan.nodes else plan.target
        assert anchor is not None
        self._end_load_back(plan.nodes, anchor, plan.target)
        stats = self.host_stats
        stats.host_hits += 1
        stats.kv_loaded += plan.num_tokens
        stats.states_loaded += 1
        return replace(plan, applied=True, event=event)

    def load_back(self, key: RadixKey | Sequence[int]) -> LoadPlan | None:
        """:meth:`plan_load_back` then :meth:`apply_load_plan`: the applied plan, or None (nothing to load,
        or no device room). The lifecycle's admission calls it before its match. Side effects and cost:
        theirs."""
        plan = self.plan_load_back(key)
        return None if plan is None else self.apply_load_plan(plan)
