"""`MambaRadixCache`: the radix tree composed with the pools. The only module that frees pool memory.

The tree (:mod:`mamba_radix.tree`) decides what to keep and what to evict and returns what it released;
this module returns it to the KV allocator and the state pool, allocates the slots a checkpoint needs
(evicting when short) and copies states (copy-on-write of a hit). The request lifecycle is a layer over
it (:mod:`mamba_radix.lifecycle`, built as ``cache.lifecycle``; the cache forwards its calls).

The region map of a running request (what the tree owns, what the request owns) is in one place: the
module docstring of :mod:`mamba_radix.lifecycle`.

Slot exhaustion never raises: a checkpoint that cannot get a slot even after eviction is skipped and
counted in :attr:`MambaRadixCache.stats`.

Checkpoint storage (``config.checkpoint_format``): under ``model`` a node's checkpoint is a state-pool slot
(a hand-over donates or copies one, a hit copies it). Under ``int8`` / ``fp8_e4m3`` it is a slot of the
cache's :attr:`~MambaRadixCache.checkpoint_pool`: a hand-over quantizes the request's state into a fresh
checkpoint slot (evicting checkpoints when that pool is full), a hit dequantizes it into the request's own
slot, and whatever the tree releases is freed there. The state pool then holds running requests' slots
only, so evicting checkpoints frees no state slot: a state-slot shortfall evicts nothing.

The host tier (``config.host_tier``, off by default; ``docs/host-tier.md``): the cache owns a
:class:`~mamba_radix.pools.host_kv_pool.HostKVPool` and a
:class:`~mamba_radix.pools.host_state_pool.HostStatePool`, makes the backups the write policy asks for
(the tree's :class:`~mamba_radix.tree.HostBackup`), frees host copies the tree releases, and loads a
host-resident prefix back (:meth:`MambaRadixCache.plan_load_back`, :meth:`MambaRadixCache.apply_load_plan`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from mamba_radix.buffers import buffer_strategy
from mamba_radix.cache_checkpoints import QuantizedCheckpointCache
from mamba_radix.cache_host import HostTierCache, check_host_tier_options
from mamba_radix.cache_results import (
    CacheStats,
    EvictResult,
    InsertResult,
    LoadPlan,
    MatchResult,
    PrefixPeek,
)
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex, check_count
from mamba_radix.events import CacheEvent, EventLog
from mamba_radix.insert_checks import check_cache_pools, check_caller_owns, check_not_tree_kv
from mamba_radix.invariants import check_invariants
from mamba_radix.lifecycle import AdmitCheck, ForwardPlan, RequestLifecycle
from mamba_radix.node import TreeNode
from mamba_radix.policy import CachePolicy
from mamba_radix.pools import (
    HybridReqToTokenPool,
    KVAllocator,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    make_kv_allocator,
)
from mamba_radix.pools.checkpoint_pool import CheckpointPool, default_checkpoint_slots
from mamba_radix.pools.held import HeldIndices
from mamba_radix.pools.host_kv_pool import KVStorage
from mamba_radix.request import Req
from mamba_radix.tree import Freed, RadixKey, RadixTree, TreeInsert, Walk

# the result records and counters live in mamba_radix.cache_results; re-exported here, where callers
# import them
__all__ = ["CacheStats", "EvictResult", "InsertResult", "MambaRadixCache", "MatchResult", "PrefixPeek"]


def _free_concatenated(allocator: Any, chunks: list[torch.Tensor], num_ids: int) -> None:
    """Free ``chunks`` of KV indices (``num_ids`` in all, unused here) through ``allocator.free`` as one
    tensor, unchecked (an allocator without ``free_chunks``). O(indices)."""
    allocator.free(chunks[0] if len(chunks) == 1 else torch.cat(chunks), check=False)


class MambaRadixCache(HostTierCache, QuantizedCheckpointCache):
    """The Mamba-aware radix prefix cache over a :class:`HybridReqToTokenPool` and a token allocator.

    The request lifecycle is a layer over this cache: :attr:`lifecycle`, a
    :class:`~mamba_radix.lifecycle.RequestLifecycle` built with it, holds the per-request state; the
    calls ``can_admit``, ``admit``, ``prefill_chunk_len``, ``extend``, ``commit``, ``finish`` and SGLang's
    ``cache_unfinished_req`` / ``cache_finished_req`` are forwarded to it, so an engine drives one object.
    The lifecycle uses only this class's public contract (peek, match, insert below a node, make room,
    release, locks, the size accessors). The buffer strategy object (:attr:`buffer`,
    :mod:`mamba_radix.buffers`) decides where states are tracked, and answers every match and peek: from
    the tree (:meth:`match_tree`, :meth:`peek_tree`) or, for a disabled cache (the null strategy,
    :class:`~mamba_radix.buffers.DisabledCache`), with nothing; no method here asks whether it is disabled.

    ``events``: record cache events for a router (:mod:`mamba_radix.events`; :meth:`take_events`): the KV
    blocks and checkpoints the tree stores and frees. Off by default, and then free: the cache holds no
    event log, and an insert or an eviction tests one attribute.

    Construction checks that the pools fit the config (same page size, same strategy); it raises
    :class:`InvalidArgument` otherwise. Every public method documents its side effects and cost;
    ``n`` is the number of tree nodes, ``L`` the key length.
    """

    def __init__(
        self,
        config: CacheConfig,
        req_to_token_pool: HybridReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator,
        *,
        policy: CachePolicy | None = None,
        events: bool = False,
        kv_storage: KVStorage | None = None,
    ) -> None:
        check_cache_pools(config, req_to_token_pool, token_to_kv_pool_allocator)
        check_host_tier_options(config, policy)
        self.config = config
        self.req_to_token_pool = req_to_token_pool
        self.mamba_pool = req_to_token_pool.mamba_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        # an eviction's trusted KV free, chosen once: an allocator of ours takes the victims' chunks as they
        # are with their count (no concatenation, no copy; on the CPU not even read until the free list
        # needs them); another allocator gets them concatenated
        self._free_kv_chunks: Callable[[list[torch.Tensor], int], None] = getattr(
            token_to_kv_pool_allocator, "free_chunks", None
        ) or functools.partial(_free_concatenated, token_to_kv_pool_allocator)
        self.device = token_to_kv_pool_allocator.device
        if policy is not None and not isinstance(policy, CachePolicy):
            raise InvalidArgument(f"policy must be a CachePolicy, got {type(policy).__name__}")
        policy = policy if policy is not None else CachePolicy()
        self.tree = RadixTree(config, self.device, policy)
        # which KV indices the tree holds: built by the first public check that needs it (insert, the
        # SGLang-named calls made directly), then kept (set on an insert's new leaf, cleared on release);
        # None until then, so the lifecycle alone never pays for it
        self._tree_kv: HeldIndices | None = None
        self.policy = policy
        policy.cache = self
        self.buffer = buffer_strategy(config)
        # the quantized checkpoints' own pool; None under checkpoint_format="model" (checkpoints are state
        # slots): every branch on the format tests this one attribute
        self.checkpoint_pool: CheckpointPool | None = None
        if config.checkpoint_format != "model":
            num = config.checkpoint_slots or default_checkpoint_slots(self.mamba_pool.size)
            self.checkpoint_pool = CheckpointPool(self.mamba_pool, config.checkpoint_format, num)
        self._grid = config.mamba_checkpoint_grid  # a property computing an lcm: read once
        self.stats = CacheStats()
        # chosen once: None costs an attribute test per insert and eviction; a log names what they change
        self._events: EventLog | None = EventLog(config.page_size) if events else None
        self._init_host_tier(kv_storage)
        self.lifecycle = RequestLifecycle(self)

    # ------------------------------------------------------------------ the lifecycle, forwarded
    @property
    def reserved_kv_tokens(self) -> int:
        """KV tokens reserved by running requests (:attr:`RequestLifecycle.reserved_kv_tokens`)."""
        return self.lifecycle.reserved_kv_tokens

    def can_admit(self, req: Req, max_new_tokens: int | None = None) -> AdmitCheck:
        """:meth:`RequestLifecycle.can_admit`: would ``req`` be admitted now, and why not. Read-only."""
        return self.lifecycle.can_admit(req, max_new_tokens)

    def admit(self, req: Req, max_new_tokens: int | None = None) -> bool:
        """:meth:`RequestLifecycle.admit`: match, lock, slots, row and KV reservation, or nothing."""
        return self.lifecycle.admit(req, max_new_tokens)

    def take_load_plan(self, req: Req) -> LoadPlan | None:
        """:meth:`RequestLifecycle.take_load_plan`: the load-back ``req``'s admission applied (host tier)."""
        return self.lifecycle.take_load_plan(req)

    def prefill_chunk_len(self, req: Req, budget: int) -> int:
        """:meth:`RequestLifecycle.prefill_chunk_len`: the next prefill chunk's length (SGLang's cut)."""
        return self.lifecycle.prefill_chunk_len(req, budget)

    def extend(self, req: Req, num_tokens: int) -> ForwardPlan | None:
        """:meth:`RequestLifecycle.extend`: KV for the next ``num_tokens`` and where states go."""
        return self.lifecycle.extend(req, num_tokens)

    def commit(self, plan: ForwardPlan, *, finished: bool = False) -> None:
        """:meth:`RequestLifecycle.commit`: the model ran ``plan``; prefill chunks hand over."""
        self.lifecycle.commit(plan, finished=finished)

    def finish(self, req: Req, insert: bool = True) -> None:
        """:meth:`RequestLifecycle.finish`: the newest checkpoint to the tree, the rest freed."""
        self.lifecycle.finish(req, insert)

    def cache_unfinished_req(self, req: Req) -> None:
        """:meth:`RequestLifecycle.cache_unfinished_req` (SGLang's call after a prefill chunk)."""
        self.lifecycle.cache_unfinished_req(req)

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """:meth:`RequestLifecycle.cache_finished_req` (SGLang's call at finish; the row stays)."""
        self.lifecycle.cache_finished_req(req, is_insert)

    @classmethod
    def build(
        cls,
        config: CacheConfig,
        *,
        num_tokens: int,
        num_slots: int,
        max_running_requests: int = 8,
        max_context_len: int = 4096,
        num_layers: int = 1,
        conv_shapes: Sequence[tuple[int, ...]] = ((4, 4),),
        temporal_shape: tuple[int, ...] = (2, 4, 4),
        device: str | torch.device = "cpu",
        policy: CachePolicy | None = None,
        mamba_pool_factory: Callable[..., MambaPool] = MambaPool,
        kv_allocator_factory: Callable[[int, int, str | torch.device], KVAllocator] = make_kv_allocator,
        events: bool = False,
        kv_storage: KVStorage | None = None,
    ) -> MambaRadixCache:
        """A cache with freshly built pools: ``num_tokens`` KV indices (paged when
        ``config.page_size > 1``), ``num_slots`` state slots of small default shapes (large enough for
        :mod:`mamba_radix.state_stamp`), ``max_running_requests`` request rows; ``policy``: a research
        policy (:mod:`mamba_radix.policy`). ``mamba_pool_factory`` (called like :class:`MambaPool`) and
        ``kv_allocator_factory`` (called like :func:`make_kv_allocator`) choose other pool classes, e.g. the
        simulator's capacity-limited ones; ``events``: record cache events (:meth:`take_events`). For
        tests, benchmarks and the simulator; an engine builds its pools itself."""
        mamba_pool = mamba_pool_factory(
            num_slots, num_layers, list(conv_shapes), temporal_shape, device=device
        )
        req_pool = HybridReqToTokenPool(max_running_requests, max_context_len, mamba_pool, config, device)
        allocator = kv_allocator_factory(num_tokens, config.page_size, device)
        return cls(config, req_pool, allocator, policy=policy, events=events, kv_storage=kv_storage)

    # -------------------------------------------------------------------------------------------- sizes
    def full_evictable_size(self) -> int:
        """KV tokens in unlocked nodes. O(1)."""
        return self.tree.full_evictable_size

    def full_protected_size(self) -> int:
        """KV tokens in locked nodes. O(1)."""
        return self.tree.full_protected_size

    def mamba_evictable_size(self) -> int:
        """Checkpoints without a mamba lock. O(1)."""
        return self.tree.mamba_evictable_size

    def mamba_protected_size(self) -> int:
        """Checkpoints with a mamba lock. O(1)."""
        return self.tree.mamba_protected_size

    @property
    def root_node(self) -> TreeNode:
        return self.tree.root

    # -------------------------------------------------------------------------------------------- match
    def _as_key(self, key: RadixKey | Sequence[int], req: Req | None) -> RadixKey:
        if isinstance(key, RadixKey):
            return key
        return RadixKey(key, req.extra_key if req is not None else None)

    def match_prefix(
        self,
        key: RadixKey | Sequence[int],
        *,
        cow_mamba: bool = False,
        req: Req | None = None,
        walk: Walk | None = None,
    ) -> MatchResult:
        """The longest cached prefix of ``key`` that ends at a checkpoint.

        A plain sequence takes ``req.extra_key`` as its namespace. With ``req``, sets
        ``req.prefix_indices`` (the result's ``device_indices``, concatenated when first read),
        ``req.last_node``, ``req.cache_protected_len``, ``req.full_kv_hit_len`` and
        ``req.mamba_branching_seqlen`` (call it before admission: it does not release a lock ``req``
        holds). With ``cow_mamba`` and ``req``, copies the matched checkpoint into ``req``'s live slot,
        allocating one (``req.mamba_pool_idx``) if it has none, evicting one checkpoint if none is free
        (the matched node is locked meanwhile); if no slot can be had the hit is dropped (the result is
        the root) and counted in ``stats.cow_skipped``. A request the pool admitted (it holds a row)
        gets that slot through the pool (:meth:`HybridReqToTokenPool.reclaim_slot`), so the pool's record
        of who holds which slot stays exact; raises :class:`InvalidIndex` (nothing changed) if the
        request's live slot is not its own, or, admitted without one, it carries track slots the pool
        does not record as its own.

        ``walk``: a read-only walk of this very key object taken just before (an admission check's,
        :meth:`RadixTree.walk`), reused if the tree has not changed since, so the key is walked once.

        Side effects: **may split a node** (the new parent is a tombstone); ticks the clock and refreshes
        recency (see :meth:`RadixTree.match`). O(L + path * log n), plus one slot copy.
        """
        radix_key = self._as_key(key, req)
        if cow_mamba and req is not None:
            self._check_cow_target(req)
        # the buffer strategy's answer: the tree's (match_tree), or none under the null strategy
        result, hit_len = self.buffer.match_prefix(self, radix_key, walk, cow_mamba, req)
        if req is not None:
            req.defer_prefix_indices(result)  # the same tensor as result.device_indices, when read
            req.last_node = result.last_node
            req.cache_protected_len = hit_len  # len(device_indices), without torch's Python __len__
            req.mamba_branching_seqlen = result.mamba_branching_seqlen
            req.full_kv_hit_len = result.full_kv_hit_len
        return result

    def match_tree(
        self, radix_key: RadixKey, walk: Walk | None, cow_mamba: bool, req: Req | None
    ) -> tuple[MatchResult, int]:
        """:meth:`match_prefix`'s lookup in the tree, and the usable hit's length: the match, the
        copy-on-write (``cow_mamba`` and ``req``; the hit dropped if no slot can be had) and the counts in
        :attr:`stats`. Called by the buffer strategy (:meth:`BufferStrategy.match_prefix`), which a
        disabled cache's null strategy does not do. Side effects and cost: :meth:`match_prefix`'s."""
        m = self.tree.match(radix_key, walk)
        if self.host_stats is not None and self._host_threshold:
            self._count_host_hits(list(self.tree.path_to_root(m.best))[::-1])
        best = m.best
        branching = self._branching
        hit_len = 0
        if (
            cow_mamba
            and req is not None
            and best.mamba_slot is not None
            and not self._copy_on_write(req, best)
        ):
            best = self.tree.root
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            result = MatchResult(empty, best, None, m.full_kv_hit_len, branching(m.full_kv_hit_len, 0))
        else:
            hit_len = m.hit_len
            result = MatchResult(  # device_indices concatenated only if read
                None, best, best.mamba_slot, m.full_kv_hit_len, branching(m.full_kv_hit_len, hit_len), match=m
            )
        if self.host_stats is not None:  # the host extension beyond the device hit (read-only walk)
            target, _ = self.tree.host_extension(self.tree.walk(radix_key))
            if target is not None:
                result.host_hit_len = target.depth - hit_len
                result.host_checkpoint = True
        stats = self.stats
        stats.matches += 1
        stats.hit_tokens += hit_len
        stats.kv_only_tokens += m.full_kv_hit_len - hit_len
        return result, hit_len

    def peek_prefix(self, key: RadixKey | Sequence[int]) -> PrefixPeek:
        """What :meth:`match_prefix` would find for ``key`` now, without any of its side effects.

        For a scheduler's admission check (does the request fit, given its hit?) before it commits to
        the real match: nothing is split, the clock does not tick, no recency is refreshed and
        :attr:`stats` is not counted, so a probe that is followed by a refusal leaves no trace in the
        eviction order. The hit length equals the one the next ``match_prefix(key)`` returns (a split only
        adds a tombstone parent, which never holds the hit), unless its copy-on-write finds no slot and
        drops the hit. O(L + path).
        """
        return self.peek_with_walk(self._as_key(key, None))[0]

    def peek_with_walk(self, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]:
        """:meth:`peek_prefix` of a :class:`RadixKey`, and its read-only walk for a
        :meth:`match_prefix` that follows at once (``walk=``; reused only if the tree has not changed).
        No side effects. O(L + path)."""
        # the buffer strategy's answer: the tree's (peek_tree), or none under the null strategy
        return self.buffer.peek_prefix(self, radix_key)

    def peek_tree(self, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]:
        """:meth:`peek_with_walk`'s look into the tree. Called by the buffer strategy
        (:meth:`BufferStrategy.peek_prefix`), which a disabled cache's null strategy does not do. No side
        effects. O(L + path)."""
        root = self.tree.root
        walk = self.tree.walk(radix_key)  # read-only
        path, pos, partial = walk.path, walk.pos, walk.partial
        if partial:
            path = path[:-1]  # the edge matched only in part holds no usable state at the match's end
        best_idx = len(path) - 1
        while best_idx >= 0 and path[best_idx].mamba_slot is None:
            best_idx -= 1
        if self.host_stats is not None:  # KV on the device only
            pos, partial = min(self.tree.device_len(walk.path), pos + partial), 0
        if best_idx < 0:
            return PrefixPeek(0, pos + partial, root, 0, False), walk
        best = path[best_idx]
        unlocked = 0  # a loop, not sum(genexpr): the generator's frame costs more than this short path
        for node in path[: best_idx + 1]:
            if node.full_lock_ref == 0:
                unlocked += len(node.key)
        return PrefixPeek(best.depth, pos + partial, best, unlocked, best.mamba_lock_ref == 0), walk

    def _branching(self, full_kv_hit_len: int, hit_len: int) -> int | None:
        grid = self._grid
        branching = full_kv_hit_len // grid * grid
        return branching if branching > hit_len else None

    def _check_cow_target(self, req: Req) -> None:
        """A copy-on-write overwrites ``req``'s live slot: it must be allocated and nobody else's. A request
        the pool admitted without a live slot gets one through the pool, whose record of the request's
        other (track) slots must then be exact. O(P)."""
        dst = req.mamba_pool_idx
        if dst is None:
            if self._is_admitted(req):
                pool = self.req_to_token_pool
                stray = [
                    s
                    for s in req.mamba_ping_pong_track_buffer or ()
                    if s >= 0 and pool.slot_holder(s) is not req
                ]
                if stray:
                    raise InvalidIndex(
                        f"request {req.rid!r} carries track slots {stray} that the pool does not record as its "
                        "own; a copy-on-write attaches a live slot through the pool, which needs its record exact"
                    )
            return
        held_by = self.req_to_token_pool.slot_holder(dst) if isinstance(dst, int) else None
        if (
            not isinstance(dst, int)
            or (self.checkpoint_pool is None and dst in self.tree.slot_owner)
            or not bool(self.mamba_pool.is_allocated([dst])[0])
            or (held_by is not None and held_by is not req)
        ):
            raise InvalidIndex(
                f"request {req.rid!r}'s live slot {dst!r} is a tree checkpoint, another request's slot or not "
                "allocated; a copy-on-write needs the request's own slot (or none: the match allocates one)"
            )

    def _is_admitted(self, req: Req) -> bool:
        """Whether the request pool holds a row for ``req`` (it admitted ``req``). O(1)."""
        row = req.req_pool_idx
        return row is not None and self.req_to_token_pool.row_holder(row) is req

    def _copy_on_write(self, req: Req, node: TreeNode) -> bool:
        """Copy ``node``'s checkpoint into ``req``'s live slot (allocated if missing). False: no slot."""
        dst = req.mamba_pool_idx
        if dst is None:
            # alloc_state_slot's steps, with the lock only if it evicts
            slots = self.mamba_pool.alloc(1, as_list=True)
            if slots is None and self.checkpoint_pool is None:  # quantized: no checkpoint holds a state slot
                # Lock the source so that the eviction that makes room cannot take it.
                self.tree.inc_lock_ref(node)
                try:
                    self.evict(num_states=1)
                    slots = self.mamba_pool.alloc(1, as_list=True)
                finally:
                    self.tree.dec_lock_ref(node)
            if slots is None:
                self.stats.cow_skipped += 1
                return False
            dst = slots[0]
            if self._is_admitted(req):
                # the pool records an admitted request's slots: the new one is attached through it, never
                # set behind its back (its holder record and device mapping would not show it)
                try:
                    self.req_to_token_pool.reclaim_slot(req, dst)
                except BaseException:
                    self.mamba_pool.free([dst], check=False)
                    raise
            else:  # not admitted yet: admission keeps a live slot already set (HybridReqToTokenPool.alloc)
                req.mamba_pool_idx = dst
        assert node.mamba_slot is not None
        if self.checkpoint_pool is None:
            self.mamba_pool.copy_slot(node.mamba_slot, dst)  # trusted: our checkpoint, the request's own slot
        else:  # dequantized into the request's own slot, in the model's dtype
            self.checkpoint_pool.load_into(self.mamba_pool, [node.mamba_slot], [dst], check=False)
        req.mamba_cow_src_slot = node.mamba_slot
        self.stats.state_copies += 1
        return True

    # ------------------------------------------------------------------------------------------- insert
    def insert(
        self,
        key: RadixKey | Sequence[int],
        kv_indices: torch.Tensor,
        mamba_slot: int,
        prev_prefix_len: int = 0,
    ) -> InsertResult:
        """Insert ``key`` with its KV indices and a checkpoint slot at its end.

        Frees the caller's KV indices at positions ``>= prev_prefix_len`` that duplicate tree KV. The
        slot becomes the tree's unless ``mamba_exists`` (then the caller still owns, and frees, it). After
        adding a checkpoint, the per-path cap may free older checkpoints of the path. Under a quantized
        ``checkpoint_format`` the tree keeps a quantized copy and the caller's slot is freed instead (the
        same contract for the caller); with no checkpoint slot free it raises
        :class:`~mamba_radix.errors.OutOfSlots`, nothing changed.

        Side effects: may split a node; ticks the clock. Raises :class:`InvalidArgument` /
        :class:`InvalidIndex` (nothing changed) for unallocated indices or slot, a bad length, or an index
        at a position ``>= prev_prefix_len`` that the tree already holds (anywhere in the tree).
        O(L + path * log n).
        """
        return self._insert(self._as_key(key, None), kv_indices, mamba_slot, prev_prefix_len)[0]

    def _insert(
        self, key: RadixKey, kv_indices: torch.Tensor, mamba_slot: int, prev_prefix_len: int
    ) -> tuple[InsertResult, TreeInsert]:
        check_caller_owns(
            kv_indices,
            mamba_slot,
            prev_prefix_len,
            self.token_to_kv_pool_allocator,
            self.mamba_pool,
            self.req_to_token_pool,
        )
        check_not_tree_kv(kv_indices, prev_prefix_len, self.held_kv)
        if self.checkpoint_pool is None:
            return self._settle_insert(self.tree.insert(key, kv_indices, mamba_slot, prev_prefix_len))
        return self._insert_quantized(key, kv_indices, mamba_slot, prev_prefix_len)

    def insert_below(
        self, node: TreeNode, key: RadixKey, kv_indices: torch.Tensor, mamba_slot: int
    ) -> tuple[InsertResult, TreeInsert]:
        """Trusted hand-over: ``node``'s prefix followed by ``key``, walking from ``node``
        (:meth:`RadixTree.insert_below`); duplicates of tree KV and capped checkpoints are freed. The
        caller validated the KV (allocated, its own, not the tree's) and the slot (its own, allocated):
        the lifecycle's hand-over. O(new tokens + path * log n)."""
        return self._settle_insert(self.tree.insert_below(node, key, kv_indices, mamba_slot))

    def _settle_insert(self, done: TreeInsert) -> tuple[InsertResult, TreeInsert]:
        """Free what an insert returned (duplicate KV, capped checkpoints) and count it."""
        if self._events is not None:
            self._events.inserted(done)
        if done.duplicate_kv.numel():  # the caller's KV, validated as allocated and distinct already
            self.token_to_kv_pool_allocator.free(done.duplicate_kv, check=False)
        if done.new_kv is not None and self._tree_kv is not None:
            self._tree_kv.hold(done.new_kv)
        if done.revived_kv is not None and self._tree_kv is not None:
            self._tree_kv.hold(done.revived_kv)
        if (
            self.host_stats is not None
            and self._host_threshold
            and not done.mamba_exists
            and done.node is not self.tree.root
        ):
            # a node the insert created (or gave a checkpoint) counts its first hit (write_through: backed
            # up now); a match counts one on each node of its path
            self._count_host_hits([done.node])
        if done.capped_slots:
            # checkpoints the tree just dropped
            self._checkpoint_slots().free(done.capped_slots, check=False)
            self.stats.checkpoints_capped += len(done.capped_slots)
        if done.mamba_exists:
            self.stats.checkpoints_existing += 1
        else:
            self.stats.checkpoints_inserted += 1
        return InsertResult(done.prefix_len, done.mamba_exists), done

    def held_kv_if_built(self) -> HeldIndices | None:
        """The held-KV flags if a check has built them, else ``None`` (nothing is built). O(1)."""
        return self._tree_kv

    def is_attached(self, node: TreeNode) -> bool:
        """Whether ``node`` is in the tree (not evicted or detached). O(1)."""
        return self.tree.is_attached(node)

    def path_kv(self, node: TreeNode, above: TreeNode) -> torch.Tensor:
        """The KV indices of the nodes from below ``above`` down to ``node``, in order (a new tensor).
        O(path tokens)."""
        return self.tree.path_values(node, above=above)

    def path_kv_chunks(self, node: TreeNode, above: TreeNode | None = None) -> tuple[torch.Tensor, ...]:
        """The KV of the prefix ending at ``node`` (only the part below its ancestor ``above``, if given),
        as the path's node values from the top down (the tensors themselves, read-only: the tree never
        writes a node's indices in place, so they stay exact after a split or an eviction). O(path nodes
        in that part), no copy."""
        chunks = []
        stop = self.tree.root if above is None else above
        while node is not stop and node is not self.tree.root:
            chunks.append(node.value)
            node = node.parent  # type: ignore[assignment]
        return tuple(reversed(chunks))

    def held_kv(self) -> HeldIndices:
        """Which KV indices the tree holds (the flags a public insert and the SGLang-named calls check
        against), built from the tree on first use (O(tree KV) once) and kept up to date after."""
        if self._tree_kv is None:
            allocator = self.token_to_kv_pool_allocator
            max_index = getattr(allocator, "max_index", allocator.size)
            self._tree_kv = HeldIndices(max_index, self.device)
            for node in self.tree.nodes():
                if not node.is_root and node.value is not None and node.value.numel():
                    self._tree_kv.hold(node.value)
        return self._tree_kv

    # -------------------------------------------------------------------------------------------- locks
    def inc_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> None:
        """Lock ``node`` (a checkpoint node from a match, or the root); ``checkpoint=False``: its KV only
        (SGLang's ``skip_lock_components=(MAMBA,)``, any node). See :meth:`RadixTree.inc_lock_ref`."""
        self.tree.inc_lock_ref(node, checkpoint=checkpoint)

    def dec_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> None:
        """Release a lock taken by :meth:`inc_lock_ref` with the same ``checkpoint``. Releasing a KV-only
        lock may free a tombstone leaf only that lock kept (its checkpoint was evicted meanwhile): its KV
        goes back to the allocator here. See :meth:`RadixTree.dec_lock_ref`. O(path * log n)."""
        freed = self.tree.dec_lock_ref(node, checkpoint=checkpoint)
        if freed is not None:
            self._release(freed)

    def lock_covers_checkpoint(self, req: Req) -> bool:
        """Whether running ``req``'s lock on ``req.last_node`` covers its checkpoint (a full lock: admission,
        or any lock with ``skip_decode_lock`` off) or only its KV (a hand-over under ``skip_decode_lock``).
        See :meth:`RequestLifecycle.lock_covers_checkpoint`. O(1)."""
        return self.lifecycle.lock_covers_checkpoint(req)

    # ----------------------------------------------------------------------------------------- eviction
    def evict(self, num_tokens: int = 0, num_states: int = 0) -> EvictResult:
        """Free at least ``num_tokens`` KV tokens and ``num_states`` checkpoints, or as many as unlocked
        nodes allow. Victim order: see :mod:`mamba_radix.eviction`. O(victims * log n)."""
        tree = self.tree
        under_kv_lock = tree.checkpoints_dropped_under_kv_lock
        freed = tree.evict(num_tokens, num_states)
        self._release(freed)
        self.stats.checkpoints_evicted_while_decoding += (
            tree.checkpoints_dropped_under_kv_lock - under_kv_lock
        )
        return EvictResult(freed.num_tokens, freed.num_states)

    def _release(self, freed: Freed) -> None:
        """Return what the tree released. Trusted frees (no check): every index and slot comes from a node
        the tree just detached, each held by that node alone (the invariants' conservation rule)."""
        if self._events is not None:
            self._events.released(freed)
        if freed.kv:
            # the victims' KV tensors go back as they are, one per node: no concatenation, and on the CPU
            # no copy (the nodes are detached: nothing writes their KV tensors again)
            if self._tree_kv is not None:
                for kv in freed.kv:
                    self._tree_kv.release(kv)
            self._free_kv_chunks(freed.kv, freed.num_tokens)  # the tree counts them: nothing is read
        if freed.slots:
            self._checkpoint_slots().free(freed.slots, check=False)
        if freed.host_kv:  # the host tier: host copies of nodes that left the tree
            assert self.host_kv_pool is not None and self.host_stats is not None
            self.host_kv_pool.free(torch.cat(freed.host_kv))
            self.host_stats.host_tokens_evicted += freed.num_host_tokens
        if freed.host_slots:
            assert self.host_state_pool is not None
            self.host_state_pool.free(freed.host_slots)
        self.stats.tokens_evicted += freed.num_tokens
        self.stats.states_evicted += freed.num_states

    def make_room(self, num_tokens: int = 0, num_states: int = 0, *, check: bool = True) -> bool:
        """Evict just enough that ``num_tokens`` KV tokens and ``num_states`` slots are free.

        Returns whether both are free now. Raises :class:`InvalidArgument` (nothing evicted) for counts
        that are not ints >= 0; ``check=False`` trusts counts the caller computed (the lifecycle's).
        Under a quantized checkpoint format no checkpoint holds a state slot, so a state shortfall evicts
        nothing. O(victims * log n).
        """
        if check:
            check_count(num_tokens, "make_room: num_tokens")
            check_count(num_states, "make_room: num_states")
        short_tokens = max(0, num_tokens - self.token_to_kv_pool_allocator.available_size())
        short_states = max(0, num_states - self.mamba_pool.available_size())
        if self.checkpoint_pool is not None:
            short_states = 0
        if short_tokens or short_states:
            self.evict(short_tokens, short_states)
        return (
            self.token_to_kv_pool_allocator.available_size() >= num_tokens
            and self.mamba_pool.available_size() >= num_states
        )

    def alloc_token_slots(self, num_tokens: int) -> torch.Tensor | None:
        """``num_tokens`` KV indices (whole pages when ``page_size > 1``), evicting if short; ``None`` if
        still short. Raises :class:`InvalidArgument` (nothing evicted) for a count that is not an int
        >= 0, or not a multiple of ``page_size``. O(num_tokens + victims * log n)."""
        page = self.config.page_size
        if (
            isinstance(num_tokens, bool)
            or not isinstance(num_tokens, int)
            or num_tokens < 0
            or num_tokens % page
        ):
            raise InvalidArgument(
                f"alloc_token_slots: num_tokens must be an int >= 0 and a multiple of page_size={page}, "
                f"got {num_tokens!r}"
            )
        self.make_room(num_tokens, check=False)
        return self.token_to_kv_pool_allocator.alloc(num_tokens)

    def alloc_state_slot(self) -> int | None:
        """One state slot, evicting one checkpoint if none is free (not under a quantized format: no
        checkpoint holds a state slot); ``None`` if still none. O(log n)."""
        slots = self.mamba_pool.alloc(1, as_list=True)
        if slots is None and self.checkpoint_pool is None:
            self.evict(num_states=1)
            slots = self.mamba_pool.alloc(1, as_list=True)
        return None if slots is None else slots[0]

    # ------------------------------------------------------------------------------------------- events
    def take_events(self) -> list[CacheEvent]:
        """The cache events since the last call, oldest first, and clears them (SGLang's call): KV
        :class:`~mamba_radix.events.BlockStored` / :class:`~mamba_radix.events.BlockRemoved` and
        :class:`~mamba_radix.events.CheckpointStored` / :class:`~mamba_radix.events.CheckpointRemoved`
        (schema: ``docs/events.md``). Always empty for a cache built with ``events=False``. O(1)."""
        return [] if self._events is None else self._events.take()

    @property
    def events_enabled(self) -> bool:
        """Whether this cache records events (``events=True`` at construction). O(1)."""
        return self._events is not None

    # ---------------------------------------------------------------------------------------- debugging
    def pretty_print(self) -> str:
        """A readable dump of the tree (one line per node). O(n)."""
        return self.tree.pretty_print()

    def check_invariants(self, running_reqs: Iterable[Req] | None = None) -> None:
        """Check every invariant of DESIGN.md §5; raise :class:`~mamba_radix.errors.InvariantError` with
        a tree dump on the first violation. With ``running_reqs`` (every request that holds memory), also
        conservation: each allocated KV index and slot is owned by exactly one node or request.
        O(n + tokens)."""
        check_invariants(self, running_reqs)
