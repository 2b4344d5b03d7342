"""`check_invariants`: every structural invariant of the cache (DESIGN.md §5), in one O(n) pass.

1. a non-root leaf is never a tombstone, unless the config keeps KV-only leaves (SGLang 0.5.23), which
   are never the end of a hit (6) and leave through KV eviction, or a KV-only lock holds it (its checkpoint
   was evicted while a request decoded on it, ``skip_decode_lock``; it goes at that lock's release);
2. a split never copies a checkpoint: every slot is held by exactly one node (``slot_owner`` agrees);
3. conservation: every allocated KV index and state slot is owned by exactly one of a tree node, a
   running request (when the caller passes the complete set of running requests) or the free list (under a
   quantized ``checkpoint_format``: every allocated checkpoint slot by exactly one tree node, always, and
   every allocated state slot by a running request; no node holds a state slot); each
   allocator's own bookkeeping agrees with itself (free count equals its bitmap's, no id both free and
   allocated: a double free is caught here, not at the next allocation); the cache's held-KV flags (:mod:`mamba_radix.pools.held`) mark exactly the tree's KV;
4. the evictable/protected counters equal the sums over unlocked/locked nodes;
5. the eviction candidate sets hold exactly the evictable candidates, under the right keys;
6. a match never ends inside an edge or at a tombstone: every running request's ``last_node`` is the
   root or a node ending at its ``cache_protected_len``, whose KV its row holds, and a checkpoint node
   unless the request's lock is KV-only (its checkpoint may have been evicted since the hand-over);
7. locked nodes are never evicted: every running request's ``last_node`` is still in the tree, locked
   the way the request says (``cache.lock_covers_checkpoint(req)``): each node's direct locks
   (``mamba_lock_ref`` full, ``kv_lock_ref`` KV-only) are exactly its running requests'.

With the host tier on (``docs/host-tier.md``), also: the device-resident nodes and the host-backed nodes
each form a subtree from the root; a host-only node holds host KV, no device checkpoint and no lock, and a
host-only leaf a host checkpoint; ``host_children`` counts the host-only children; a node's host KV has one
index per token; every host KV index and host state slot is owned by exactly one node and allocated in its
host pool, and every allocated one is owned (host pool used == sum over nodes; freed exactly once); the
``resumable`` policy's stale heap names each node once, as its id set says; the host index (a lazy heap,
``tree_host``) names each node once, as its id set says, is a heap, and lists every host-only leaf under
its own depth and id and a stamp not ahead of the node's (entries of nodes that stopped being host-only
leaves may stay until popped or compacted).

Plus the structure itself: parent/child links and child keys, ``depth``, page alignment, lock arithmetic
(``full_lock_ref == mamba_lock_ref + kv_lock_ref + sum(child.full_lock_ref)``), stamps not ahead of the
clock.
Violations raise :class:`~mamba_radix.errors.InvariantError` with a readable tree dump.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import torch

from mamba_radix.errors import InvariantError
from mamba_radix.node import ROOT_ID, TreeNode, child_key

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from mamba_radix.pools.held import HeldIndices
    from mamba_radix.pools.hybrid_req_to_token import HybridReqToTokenPool
    from mamba_radix.request import Req
    from mamba_radix.tree import RadixTree


class CheckedCache(Protocol):
    """What the checker reads of a cache (:class:`~mamba_radix.cache.MambaRadixCache` has it): its tree,
    its three pools, its held-KV flags if built and which kind of lock a running request holds. Declared
    here, by its user, so that the cache can import this module without a circle."""

    tree: RadixTree
    req_to_token_pool: HybridReqToTokenPool
    token_to_kv_pool_allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
    mamba_pool: MambaPool

    def held_kv_if_built(self) -> HeldIndices | None: ...

    def lock_covers_checkpoint(self, req: Req) -> bool: ...


__all__ = ["check_invariants", "check_tree_invariants"]

_MAX_DUMP_LINES = 200
_NO_SLOT = -1


def _fail(tree: RadixTree, message: str) -> None:
    dump = tree.pretty_print().splitlines()
    if len(dump) > _MAX_DUMP_LINES:
        dump = [*dump[:_MAX_DUMP_LINES], f"... ({len(dump) - _MAX_DUMP_LINES} more lines)"]
    raise InvariantError(message + "\n" + "\n".join(dump))


def _check_node(tree: RadixTree, node: TreeNode, ids: set[int]) -> None:
    page = tree.page_size
    if node.id in ids:
        _fail(tree, f"node id {node.id} occurs twice")
    ids.add(node.id)
    if node.last_access > tree.clock or node.mamba_last_access > tree.clock:
        _fail(tree, f"node {node.id} has a stamp ahead of the clock {tree.clock}")
    if (
        node.mamba_lock_ref < 0
        or node.kv_lock_ref < 0
        or node.mamba_lock_ref + node.kv_lock_ref > node.full_lock_ref
    ):
        _fail(tree, f"node {node.id}: need 0 <= mamba_lock_ref + kv_lock_ref <= full_lock_ref, got {node!r}")
    if node.mamba_slot is None and node.mamba_lock_ref:
        _fail(tree, f"tombstone node {node.id} holds a mamba lock")
    if node.mamba_slot is not None and tree.slot_owner.get(node.mamba_slot) is not node:
        _fail(
            tree, f"slot {node.mamba_slot} of node {node.id} is not registered to it (shared or copied slot)"
        )
    children_locks = 0
    for ck, child in node.children.items():
        if child.parent is not node:
            _fail(tree, f"node {child.id} is a child of {node.id} but its parent link points elsewhere")
        if not child.key or ck != child_key(child.key, 0, page, child.extra_key):
            _fail(tree, f"node {child.id} hangs under the wrong child key {ck!r}")
        if node.id != ROOT_ID and child.extra_key != node.extra_key:
            _fail(tree, f"node {child.id} has namespace {child.extra_key!r}, its parent {node.extra_key!r}")
        children_locks += child.full_lock_ref
    if node.id == ROOT_ID:
        if node is not tree.root or node.key or node.value.numel() or node.mamba_slot is not None:
            _fail(tree, "the root must be the tree's root, empty and without a checkpoint")
        if node.full_lock_ref != 1 or node.mamba_lock_ref != 0 or node.kv_lock_ref != 0:
            _fail(tree, f"the root must hold exactly one full lock, got {node!r}")
        return
    parent = node.parent
    assert parent is not None
    if tree.host_tier:
        _check_host_residency(tree, node, parent)
    if node.value is None:  # host-only (checked above); the device checks below do not apply
        if len(node.key) % page or node.depth != parent.depth + len(node.key):
            _fail(tree, f"node {node.id}: host-only edge of {len(node.key)} tokens misaligned or mis-deep")
        return
    if len(node.key) != node.value.numel() or node.value.dtype != torch.int64 or node.value.dim() != 1:
        _fail(
            tree,
            f"node {node.id}: {len(node.key)} tokens but value {tuple(node.value.shape)} {node.value.dtype}",
        )
    if len(node.key) % page:
        _fail(tree, f"node {node.id}: {len(node.key)} tokens is not a multiple of page_size={page}")
    if node.depth != parent.depth + len(node.key):
        _fail(tree, f"node {node.id}: depth {node.depth} != parent depth {parent.depth} + {len(node.key)}")
    if (
        not node.children
        and node.mamba_slot is None
        and not node.kv_lock_ref
        and not tree.config.mamba_kv_only_leaves
        and node.value is not None
    ):
        _fail(tree, f"invariant 1: leaf node {node.id} is a tombstone")
    if node.full_lock_ref != node.mamba_lock_ref + node.kv_lock_ref + children_locks:
        _fail(
            tree,
            f"node {node.id}: full_lock_ref {node.full_lock_ref} != own mamba locks {node.mamba_lock_ref} + "
            f"own KV-only locks {node.kv_lock_ref} + children's full locks {children_locks} (a lock leaked, "
            "or a tombstone was locked)",
        )


def _check_host_residency(tree: RadixTree, node: TreeNode, parent: TreeNode) -> None:
    """The host tier's per-node rules (see the module docstring). O(children)."""
    host_kv = node.host_kv
    if node.value is None:
        if host_kv is None:
            _fail(tree, f"node {node.id} is on neither tier (no device KV, no host KV)")
        if node.mamba_slot is not None or node.full_lock_ref or node.mamba_lock_ref or node.kv_lock_ref:
            _fail(tree, f"host-only node {node.id} holds a device checkpoint or a lock: {node!r}")
        if not node.children and node.host_slot is None:
            _fail(tree, f"host-only leaf {node.id} holds no host checkpoint (a useless host tombstone)")
        if tree.host_only_nodes.get(node.id) is not node:
            _fail(tree, f"host-only node {node.id} is not registered in host_only_nodes")
    elif parent.id != ROOT_ID and parent.value is None:
        _fail(
            tree,
            f"device node {node.id} hangs under host-only node {parent.id} (the device tier is a subtree)",
        )
    if host_kv is not None:
        if host_kv.numel() != len(node.key) or host_kv.dtype != torch.int64 or host_kv.dim() != 1:
            _fail(tree, f"node {node.id}: {len(node.key)} tokens but host KV {tuple(host_kv.shape)}")
        if parent.id != ROOT_ID and parent.host_kv is None:
            _fail(
                tree,
                f"node {node.id} has a host copy, its parent {parent.id} none (the host tier is a subtree)",
            )
    if node.host_slot is not None and tree.host_slot_owner.get(node.host_slot) is not node:
        _fail(tree, f"host slot {node.host_slot} of node {node.id} is not registered to it")
    host_children = sum(1 for child in node.children.values() if child.value is None)
    if node.host_children != host_children:
        _fail(
            tree,
            f"node {node.id}: host_children={node.host_children}, {host_children} children are host-only",
        )


def _check_host_index(tree: RadixTree) -> None:
    """The host index (``tree.host_leaves``, a lazy heap; see :mod:`mamba_radix.tree_host`): each id once, as
    ``host_leaf_ids`` says; the heap order; every host-only leaf listed under ``(stamp, -depth, id)`` with
    a stamp at most its ``last_access`` (the entry is re-keyed when it reaches the front, which makes host
    eviction's order exact). Run after ``host_only_nodes`` was checked against the tree. O(heap + host-only
    nodes)."""
    heap = tree.host_leaves
    listed = {entry[2]: entry for entry in heap}
    if listed.keys() != tree.host_leaf_ids or len(heap) != len(listed):
        _fail(tree, "host tier: the host index and its id set disagree, or an id is in it twice")
    for i in range(1, len(heap)):
        if heap[i][:3] < heap[(i - 1) // 2][:3]:
            _fail(tree, f"host tier: the host index is not a heap at entry {i}: {heap[i][:3]}")
    for node in tree.host_only_nodes.values():
        if node.children:
            continue
        entry = listed.get(node.id)
        if entry is None:
            _fail(
                tree,
                f"host tier: host-only leaf {node.id} is not in the host index (host eviction misses it)",
            )
        elif entry[3] is not node or entry[1] != -node.depth or entry[0] > node.last_access:
            _fail(
                tree,
                f"host tier: host-only leaf {node.id} is listed in the host index under {entry[:3]}, its key is "
                f"{(node.last_access, -node.depth, node.id)}",
            )


def check_tree_invariants(tree: RadixTree) -> None:
    """The pool-free invariants (structure, 1, 2, 4, 5). A research policy first settles the re-keys it
    deferred (:meth:`CachePolicy.settle_keys`: keys change to their current values, nothing else). O(n)."""
    if tree.policy is not None:
        tree.policy.settle_keys()
    ids: set[int] = set()
    sizes = [0, 0, 0, 0]  # full evictable, full protected, mamba evictable, mamba protected
    full_keys: list[tuple[int, ...]] = []
    mamba_keys: list[tuple[int, ...]] = []
    num_slots = 0
    host_only = host_tokens = host_slots = 0
    index = tree.index
    for node in tree.nodes():
        _check_node(tree, node, ids)
        if node.is_root:
            continue
        if node.value is None:  # host-only: no device size, no candidate
            host_only += 1
        else:
            sizes[0 if node.full_lock_ref == 0 else 1] += len(node.key)
        if node.host_kv is not None:
            host_tokens += len(node.key)
        if node.host_slot is not None:
            host_slots += 1
        if node.mamba_slot is not None:
            num_slots += 1
            sizes[2 if node.mamba_lock_ref == 0 else 3] += 1
        want_full, want_mamba = index.current_keys(node)
        if not (
            index.is_listed_under(node, node.full_evict_key, want_full)
            and index.is_listed_under(node, node.mamba_evict_key, want_mamba)
        ):
            _fail(
                tree,
                f"invariant 5: node {node.id} is registered under ({node.full_evict_key}, "
                f"{node.mamba_evict_key}), expected ({want_full}, {want_mamba})",
            )
        if want_full is not None:
            full_keys.append(want_full)
        if want_mamba is not None:
            mamba_keys.append(want_mamba)
    if (host_only, host_tokens, host_slots) != (
        len(tree.host_only_nodes),
        tree.host_kv_tokens,
        len(tree.host_slot_owner),
    ):
        _fail(
            tree,
            f"host tier: the tree counts {len(tree.host_only_nodes)} host-only nodes, {tree.host_kv_tokens} host "
            f"KV tokens, {len(tree.host_slot_owner)} host slots; its nodes hold {host_only}, {host_tokens}, {host_slots}",
        )
    if {entry[2] for entry in tree.host_stale} != tree.host_stale_ids or len(tree.host_stale) != len(
        tree.host_stale_ids
    ):
        _fail(tree, "host tier: the stale heap (resumable) and its id set disagree, or an id is in it twice")
    _check_host_index(tree)
    if len(ids) != tree.num_nodes:
        _fail(tree, f"num_nodes is {tree.num_nodes} but the tree has {len(ids)} nodes")
    if num_slots != len(tree.slot_owner):
        _fail(tree, f"invariant 2: {len(tree.slot_owner)} slots registered but {num_slots} nodes hold one")
    got = [
        tree.full_evictable_size,
        tree.full_protected_size,
        tree.mamba_evictable_size,
        tree.mamba_protected_size,
    ]
    if got != sizes:
        _fail(
            tree,
            "invariant 4: counters (full evictable, full protected, mamba evictable, mamba protected) are "
            f"{got}, the tree sums to {sizes}",
        )
    if sorted(full_keys) != tree.index.full_keys():
        _fail(tree, "invariant 5: the full-KV candidate set differs from the unlocked leaves")
    if sorted(mamba_keys) != tree.index.mamba_keys():
        _fail(tree, "invariant 5: the checkpoint candidate set differs from the unlocked checkpoints")


def _check_requests(cache: CheckedCache, reqs: list[Req]) -> tuple[list[torch.Tensor], list[int]]:
    """Invariants 6-7 for each running request; returns the KV spans and slots the requests own."""
    tree = cache.tree
    pool = cache.req_to_token_pool
    kv: list[torch.Tensor] = []
    slots: list[int] = []
    direct_locks: dict[int, int] = {}  # node id -> running requests holding a full lock on it
    kv_only_locks: dict[int, int] = {}  # node id -> running requests holding a KV-only lock on it
    for req in reqs:
        node = req.last_node
        if node is None or not tree.is_attached(node):
            _fail(tree, f"invariant 7: running request {req.rid!r} has no last_node in the tree")
        assert node is not None
        covers_checkpoint = cache.lock_covers_checkpoint(req)
        if not node.is_root and node.mamba_slot is None and covers_checkpoint:
            _fail(tree, f"invariant 6: request {req.rid!r} is locked on tombstone node {node.id}")
        if node.depth != req.cache_protected_len:
            _fail(
                tree,
                f"invariant 6: request {req.rid!r} protects {req.cache_protected_len} tokens, "
                f"node {node.id} ends at {node.depth}",
            )
        if not node.is_root:
            locks = direct_locks if covers_checkpoint else kv_only_locks
            locks[node.id] = locks.get(node.id, 0) + 1
        slots += [
            s
            for s in [req.mamba_pool_idx, *(req.mamba_ping_pong_track_buffer or [])]
            if s is not None and s != _NO_SLOT
        ]
        if req.req_pool_idx is None:
            continue
        row = pool.req_to_token[req.req_pool_idx].to(torch.int64)
        if not torch.equal(row[: req.cache_protected_len], tree.path_values(node)):
            _fail(tree, f"invariant 6: request {req.rid!r}'s row does not hold the tree's KV of its prefix")
        # an extend not committed yet owns its KV too (its plan may continue the request's last page)
        end = req.kv_len if req.pending_plan is None else req.pending_plan.end
        kv.append(row[req.cache_protected_len : end])
    for node in tree.nodes():
        if node.is_root:
            continue
        if node.mamba_lock_ref != direct_locks.get(node.id, 0):
            _fail(
                tree,
                f"node {node.id} holds {node.mamba_lock_ref} mamba locks but {direct_locks.get(node.id, 0)} "
                "running requests are locked on it",
            )
        if node.kv_lock_ref != kv_only_locks.get(node.id, 0):
            _fail(
                tree,
                f"node {node.id} holds {node.kv_lock_ref} KV-only locks but {kv_only_locks.get(node.id, 0)} "
                "running requests hold one on it",
            )
    return kv, slots


def _check_pool_bookkeeping(cache: CheckedCache) -> None:
    """Invariant 3 inside each allocator: its free count equals its bitmap's and nothing is both free and
    allocated (``audit``), so a double free through a trusted path is caught at the next check."""
    pools: list = [cache.token_to_kv_pool_allocator, cache.mamba_pool, cache.req_to_token_pool]
    checkpoint_pool = getattr(cache, "checkpoint_pool", None)
    if checkpoint_pool is not None:
        pools.append(checkpoint_pool)
    for pool in pools:
        try:
            pool.audit()
        except InvariantError as err:
            _fail(cache.tree, f"invariant 3: {err}")


def _check_owners(
    cache: CheckedCache, what: str, owned: list[torch.Tensor], allocated: torch.Tensor, complete: bool
) -> None:
    """Each id in ``owned`` occurs once and is allocated; with ``complete``, they cover ``allocated``."""
    tree = cache.tree
    ids = torch.cat(owned) if owned else torch.empty(0, dtype=torch.int64, device=allocated.device)
    unique = torch.unique(ids)
    if unique.numel() != ids.numel():
        _fail(tree, f"invariant 3: some {what} is owned twice")
    missing = unique[~torch.isin(unique, allocated)]
    if missing.numel():
        _fail(tree, f"invariant 3: {what} {int(missing[0])} is owned but not allocated (freed while in use)")
    if complete and unique.numel() != allocated.numel():
        leaked = allocated[~torch.isin(allocated, unique)]
        _fail(tree, f"invariant 3: {what} {int(leaked[0])} is allocated but owned by nobody (a leak)")


def _check_held_flags(cache: CheckedCache, tree_kv: list[torch.Tensor]) -> None:
    """The cache's record of which KV indices the tree holds (what a public insert checks against; kept
    from the first public insert on) equals the union of the tree's node values."""
    flags = cache.held_kv_if_built()
    if flags is None:
        return
    held = flags.held_indices().cpu()
    values = torch.unique(torch.cat(tree_kv).cpu()) if tree_kv else held[:0]
    if torch.equal(held, values):
        return
    extra, missing = held[~torch.isin(held, values)], values[~torch.isin(values, held)]
    what = (
        f"{int(extra[0])} is marked but no node holds it"
        if extra.numel()
        else f"{int(missing[0])} is held by a node but not marked"
    )
    _fail(cache.tree, f"invariant 3: the held-KV flags disagree with the tree: index {what}")


def _check_host_pools(cache: CheckedCache) -> None:
    """Host conservation: each host pool's own bookkeeping holds, and its allocated host KV indices / host
    slots are exactly the nodes' copies, each owned once (the tree alone owns host copies). O(host size)."""
    tree = cache.tree
    kv_pool, state_pool = cache.host_kv_pool, cache.host_state_pool  # type: ignore[attr-defined]
    for pool in (kv_pool, state_pool):
        try:
            pool.audit()
        except InvariantError as err:
            _fail(tree, f"invariant 3 (host): {err}")
    host_kv = [node.host_kv for node in tree.nodes() if node.host_kv is not None]
    _check_owners(cache, "host KV index", host_kv, kv_pool.allocated_indices().cpu(), True)
    slots = torch.tensor(list(tree.host_slot_owner), dtype=torch.int64)
    _check_owners(cache, "host state slot", [slots], state_pool.allocated_slots().cpu(), True)


def check_invariants(cache: CheckedCache, running_reqs: Iterable[Req] | None = None) -> None:
    """Every invariant of DESIGN.md §5 (see the module docstring). ``running_reqs``, when given, must be
    every request that holds a lock, KV or slots: conservation is then exact. O(n + tokens)."""
    tree = cache.tree
    check_tree_invariants(tree)
    _check_pool_bookkeeping(cache)
    reqs = None if running_reqs is None else list(running_reqs)
    req_kv, req_slots = _check_requests(cache, reqs) if reqs is not None else ([], [])
    complete = reqs is not None
    allocator = cache.token_to_kv_pool_allocator
    page = tree.page_size
    tree_kv = [node.value for node in tree.nodes() if not node.is_root and node.value is not None]
    allocated_kv = allocator.allocated_indices()
    if page == 1:
        _check_owners(cache, "KV index", tree_kv + req_kv, allocated_kv, complete)
    else:
        # Pages are the unit of ownership: a tree node holds whole pages, a request may hold a partial
        # last page. Each owner contributes its distinct pages.
        tree_all = torch.cat(tree_kv) if tree_kv else allocated_kv[:0]
        tree_pages = torch.unique(tree_all // page)
        if tree_pages.numel() * page != tree_all.numel():
            _fail(tree, "invariant 3: tree KV does not fill whole pages exactly once")
        pages = [tree_pages] + [torch.unique(kv // page) for kv in req_kv]
        _check_owners(cache, "KV page", pages, torch.unique(allocated_kv // page), complete)
    _check_held_flags(cache, tree_kv)
    if getattr(cache, "host_kv_pool", None) is not None:
        _check_host_pools(cache)
    tree_slots = torch.tensor(list(tree.slot_owner), dtype=torch.int64)
    request_slots = torch.tensor(req_slots, dtype=torch.int64)
    allocated_slots = cache.mamba_pool.allocated_slots().cpu()
    checkpoint_pool = getattr(cache, "checkpoint_pool", None)
    if checkpoint_pool is None:  # checkpoints are state slots
        _check_owners(cache, "state slot", [tree_slots, request_slots], allocated_slots, complete)
        return
    # quantized: the tree alone owns checkpoint slots (complete whatever the caller passed); the state pool
    # holds running requests' slots only
    _check_owners(cache, "checkpoint slot", [tree_slots], checkpoint_pool.allocated_slots().cpu(), True)
    _check_owners(cache, "state slot", [request_slots], allocated_slots, complete)
