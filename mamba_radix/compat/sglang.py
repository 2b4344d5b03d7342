"""SGLang's hybrid (full attention + Mamba) prefix cache API over :class:`mamba_radix.MambaRadixCache`.

Targets the semantics of SGLang 0.5.23 (``MambaRadixCache`` as the legacy standalone tree of the 2026
source and the unified cache's FULL + MAMBA configuration share them: checkpoints on a sparse set of nodes,
tombstones, copy-on-write hits, ping-pong donation), with SGLang's names: the constructor takes a
:class:`~mamba_radix.compat.sglang_params.CacheInitParams`; ``match_prefix`` / ``insert`` / ``evict`` take
``MatchPrefixParams`` / ``InsertParams`` / ``EvictParams`` and return SGLang's result records;
``cache_unfinished_req`` / ``cache_finished_req`` take the SGLang-shaped request
(:class:`~mamba_radix.compat.sglang_req.Req`); the size accessors, ``sanity_check``, ``pretty_print`` and
``available_and_evictable_str`` are SGLang's. It maps; every decision is the core's (:attr:`core`).

The one convention it translates rather than renames is **ownership of a running request's slot**. SGLang
inserts the slot a running request holds (``InsertParams(mamba_value=req.mamba_pool_idx.unsqueeze(0))``,
and its ``cache_finished_req``) and the request then simply stops using it: for a moment two owners. The
core has one owner per slot and refuses to insert a slot a running request holds. Here :meth:`insert`
makes it a hand-over in the same call: the request gives the slot up (``req.mamba_pool_idx`` becomes
``None``) and the tree takes it; if the insert is refused, the request still holds the slot and nothing
changed; if the tree had a checkpoint at the key's end already (``mamba_exist``), the slot stays the
request's. The request keeps its row and any ping-pong track buffer (the pool's ``release_slot`` /
``reclaim_slot``); a slot of a track buffer is handed over through ``cache_unfinished_req`` /
``cache_finished_req`` (the core donates the tracked slot there), and ``insert`` refuses it.

Deliberate differences from SGLang (docs/compat-sglang.md): ``free(req)`` is refused while the request
holds slots; an ``mamba_last_track_seqlen`` off the page grid is refused; paged child keys are bytes (a
node's ``children`` keys); slot ids on nodes are ints (``node.mamba_slot``); the host tier (HiCache) and
the speculative conv-window buffers are not mapped (the retraction copies, ``get_cpu_copy`` /
``load_cpu_copy``, are: the pools forward them); quantized checkpoints are refused (a ``config`` with
``checkpoint_format`` int8 / fp8_e4m3: SGLang's forms read a checkpoint as a state slot). KV cache
events (``enable_kv_cache_events``, :meth:`MambaRadixCache.take_events`) are the core's
(:mod:`mamba_radix.events`): SGLang's ``BlockStored`` / ``BlockRemoved`` field names, this project's own
block hashes, and, if asked for, the checkpoint events SGLang does not have. Refused calls
raise :class:`~mamba_radix.errors.InvalidArgument` / :class:`~mamba_radix.errors.InvalidIndex` and change
nothing.
"""

from __future__ import annotations

import torch

from mamba_radix import RadixKey
from mamba_radix.cache import MambaRadixCache as CoreCache
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument
from mamba_radix.events import BlockRemoved, BlockStored, CacheEvent
from mamba_radix.node import TreeNode
from mamba_radix.policy import CachePolicy
from mamba_radix.pools import HybridReqToTokenPool as CoreHybridReqToTokenPool
from mamba_radix.request import Req as CoreReq

from .sglang_params import (
    CacheInitParams,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from .sglang_pools import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MambaPool,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from .sglang_req import Req, as_core_req
from .strip_thinking import insert_keeps_prompt_state

__all__ = [
    "SGLANG_VERSION",
    "BlockRemoved",
    "BlockStored",
    "CacheInitParams",
    "DecLockRefParams",
    "EvictParams",
    "EvictResult",
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "InsertParams",
    "InsertResult",
    "MambaPool",
    "MambaRadixCache",
    "MatchPrefixParams",
    "MatchResult",
    "PagedTokenToKVPoolAllocator",
    "RadixKey",
    "Req",
    "TokenToKVPoolAllocator",
    "available_and_evictable_str",
]

SGLANG_VERSION = "0.5.23"  # the release whose semantics this layer maps


def _strategy(params: CacheInitParams) -> str:
    if params.enable_mamba_extra_buffer_lazy:
        return "extra_buffer_lazy"
    return "extra_buffer" if params.enable_mamba_extra_buffer else "no_buffer"


def _slot_id(mamba_value: object) -> int:
    """SGLang's ``mamba_value`` (a one-element int tensor, as ``req.mamba_pool_idx.unsqueeze(0)``, or an
    int) as the slot id. Raises :class:`InvalidArgument` otherwise. O(1)."""
    if isinstance(mamba_value, torch.Tensor):
        if mamba_value.numel() != 1 or mamba_value.dtype.is_floating_point or mamba_value.dtype == torch.bool:
            raise InvalidArgument(
                f"mamba_value must hold one integer slot id, got a {mamba_value.dtype} tensor of shape "
                f"{tuple(mamba_value.shape)}"
            )
        return int(mamba_value.reshape(-1)[0])
    if isinstance(mamba_value, int) and not isinstance(mamba_value, bool):
        return mamba_value
    raise InvalidArgument(
        f"mamba_value must be a one-element int tensor or an int slot id, got {type(mamba_value).__name__}; "
        "a hybrid cache inserts every key with the state at its end"
    )


def _as_key(key: object) -> RadixKey:
    if isinstance(key, RadixKey):
        return key
    token_ids = getattr(key, "token_ids", None)
    if token_ids is None:
        raise InvalidArgument(f"key must be a RadixKey (token_ids, extra_key), got {type(key).__name__}")
    return RadixKey(token_ids, getattr(key, "extra_key", None))


class MambaRadixCache:
    """SGLang's ``MambaRadixCache(params)`` over a core cache (:attr:`core`). ``config``: a full
    :class:`CacheConfig` for the core's own knobs (its page size, strategy and chunked prefill size are
    overridden by ``params``); ``policy``: a research policy (:mod:`mamba_radix.policy`);
    ``checkpoint_events``: with ``params.enable_kv_cache_events``, :meth:`take_events` returns the
    checkpoint events too (off: SGLang's KV events only, what a consumer written for SGLang expects).

    Raises :class:`InvalidArgument` for params the core cannot honour
    (:meth:`CacheInitParams.unsupported`) or pools of another kind. O(pool sizes) to build.
    """

    def __init__(
        self,
        params: CacheInitParams,
        *,
        config: CacheConfig | None = None,
        policy: CachePolicy | None = None,
        checkpoint_events: bool = False,
    ) -> None:
        if not isinstance(params, CacheInitParams):
            raise InvalidArgument(f"params must be a CacheInitParams, got {type(params).__name__}")
        bad = params.unsupported()
        if bad:
            raise InvalidArgument(
                f"the compat cache cannot honour {', '.join(bad)} (see docs/compat-sglang.md)"
            )
        pool = params.req_to_token_pool
        if not isinstance(pool, (HybridReqToTokenPool, CoreHybridReqToTokenPool)):
            raise InvalidArgument(
                f"req_to_token_pool must be a HybridReqToTokenPool, got {type(pool).__name__}"
            )
        base = config if config is not None else pool.config
        changes: dict[str, object] = {
            "page_size": params.page_size,
            "mamba_radix_cache_strategy": _strategy(params),
            "disable_radix_cache": bool(params.disable),
        }
        if params.chunked_prefill_size is not None:
            changes["chunked_prefill_size"] = params.chunked_prefill_size
        resolved = base.replace(**changes)
        if resolved.checkpoint_format != "model":
            # SGLang's forms read a checkpoint as a state slot (node.mamba_slot, MatchResult's
            # mamba_branching / cow source, a donated mamba_value); a quantized format keeps it in
            # another pool, in a layout SGLang's int8 pool does not share (docs/checkpoint-formats.md)
            raise InvalidArgument(
                f"the compat cache maps SGLang's call forms onto state-pool checkpoints, and "
                f"checkpoint_format={resolved.checkpoint_format!r} keeps them in a quantized pool those "
                "forms would read as state slots; use checkpoint_format='model'"
            )
        allocator = params.token_to_kv_pool_allocator
        # both checks before either rebuild: a refused construction changes neither pool
        if isinstance(pool, HybridReqToTokenPool):
            pool.check_bind_config(resolved)
        if isinstance(allocator, TokenToKVPoolAllocator):
            allocator.bind_page_size(params.page_size)  # checks first: refused, nothing rebuilt
            core_allocator = allocator.core
        else:
            core_allocator = allocator
        if isinstance(pool, HybridReqToTokenPool):
            pool.bind_config(resolved)
            core_pool = pool.core
        else:
            core_pool = pool
        self.core = CoreCache(
            resolved, core_pool, core_allocator, policy=policy, events=bool(params.enable_kv_cache_events)
        )
        self.enable_kv_cache_events = bool(params.enable_kv_cache_events)
        self.checkpoint_events = checkpoint_events
        self.req_to_token_pool = pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.disable = params.disable
        self.enable_mamba_extra_buffer = params.enable_mamba_extra_buffer
        self.strip_thinking_cache = params.strip_thinking_cache
        self.device = self.core.device

    # ------------------------------------------------------------------------------------------ shape
    @property
    def config(self) -> CacheConfig:
        return self.core.config

    @property
    def root_node(self) -> TreeNode:
        return self.core.root_node

    def supports_mamba(self) -> bool:
        return True

    def _core_pool(self) -> CoreHybridReqToTokenPool:
        return self.core.req_to_token_pool

    # ------------------------------------------------------------------------------------------ match
    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached prefix of ``params.key`` ending at a checkpoint (:meth:`CoreCache.match_prefix`:
        may split a node, refreshes recency; with ``cow_mamba`` and ``req``, copies the checkpoint into the
        request's live slot, allocating one if it has none). With ``req``, sets its cache fields.
        O(L + path * log n)."""
        if not isinstance(params, MatchPrefixParams):
            raise InvalidArgument(f"match_prefix takes MatchPrefixParams, got {type(params).__name__}")
        core_req = None if params.req is None else as_core_req(params.req)
        m = self.core.match_prefix(_as_key(params.key), cow_mamba=bool(params.cow_mamba), req=core_req)
        hit = int(m.device_indices.numel())
        return MatchResult(
            device_indices=m.device_indices,
            last_device_node=m.last_node,
            last_host_node=m.last_node,
            best_match_node=m.last_node,
            mamba_branching_seqlen=m.mamba_branching_seqlen,
            cache_protected_len=hit,
            full_kv_hit_length=m.full_kv_hit_len,
        )

    # ----------------------------------------------------------------------------------------- insert
    def insert(self, params: InsertParams) -> InsertResult:
        """Insert ``params.key`` with its KV (``value``) and the checkpoint slot ``mamba_value`` at its end
        (:meth:`CoreCache.insert`: KV at positions ``>= prev_prefix_len`` that duplicates tree KV is freed).

        A slot a running request holds as its live slot is handed over in this call (with or without a
        ping-pong track buffer, which the request keeps): the request gives it up and the tree takes it,
        atomically: a refused insert (a typed error) leaves the request holding it and nothing changed;
        ``mamba_exist`` leaves it the request's. A slot held in a request's track buffer is refused: hand
        those over with :meth:`cache_unfinished_req` / :meth:`cache_finished_req`. O(L + path * log n).
        """
        if not isinstance(params, InsertParams):
            raise InvalidArgument(f"insert takes InsertParams, got {type(params).__name__}")
        if params.key is None or params.value is None:
            raise InvalidArgument("insert needs key and value (the key's KV indices)")
        if params.chunked or params.priority:
            raise InvalidArgument("insert: chunked and priority are not mapped; leave them at their defaults")
        key = _as_key(params.key)
        value = params.value
        if (
            isinstance(value, torch.Tensor)
            and value.dtype != torch.int64
            and not value.dtype.is_floating_point
        ):
            value = value.to(torch.int64)  # SGLang's rows are int32; the tree keeps int64 indices
        slot = _slot_id(params.mamba_value)
        pool = self._core_pool()
        holder = pool.slot_holder(slot)
        if holder is None:
            result = self.core.insert(key, value, slot, params.prev_prefix_len)
            return InsertResult(result.prefix_len, result.mamba_exists, self._node_at(key))
        return self._hand_over_insert(holder, key, value, slot, params.prev_prefix_len)

    def _hand_over_insert(
        self, holder: CoreReq, key: RadixKey, value: torch.Tensor, slot: int, prev_prefix_len: int
    ) -> InsertResult:
        """Insert ``slot``, the live slot of running request ``holder``, which gives it up in the same
        call: the pool's ``release_slot`` ends the request's hold (its row and any track buffer stay), the
        core inserts, and a refused insert (or ``mamba_exist``: the tree did not take it) is undone by
        ``reclaim_slot``, so the request holds exactly what it held. A slot of a track buffer is refused,
        nothing changed: the request calls hand those over. O(L + path * log n)."""
        if holder.mamba_pool_idx != slot:
            raise InvalidArgument(
                f"insert: state slot {slot} is a track slot of running request {holder.rid!r}; hand a "
                "running request's tracked checkpoint over with cache_unfinished_req / cache_finished_req"
            )
        pool = self._core_pool()
        pool.release_slot(holder, slot)  # the request lets go; the slot stays allocated
        try:
            result = self.core.insert(key, value, slot, prev_prefix_len)
        except BaseException:
            pool.reclaim_slot(holder, slot)
            raise
        if result.mamba_exists:  # the tree did not take it: it is the request's again
            pool.reclaim_slot(holder, slot)
        return InsertResult(result.prefix_len, result.mamba_exists, self._node_at(key))

    def _node_at(self, key: RadixKey) -> TreeNode:
        """The node holding the checkpoint at ``key``'s end after an insert: the deepest checkpoint node
        on its path (:meth:`CoreCache.peek_prefix`, read-only). O(L + path)."""
        return self.core.peek_prefix(key).last_node

    # ------------------------------------------------------------------------------- request-level
    def cache_unfinished_req(self, req: Req | CoreReq, chunked: bool = False) -> None:
        """After a prefill chunk: the request's newest checkpoint and the KV before it to the tree; then
        ``req.prefix_indices`` is the cached prefix and ``cache_protected_len`` its length
        (:meth:`RequestLifecycle.cache_unfinished_req`). ``chunked`` is SGLang's flag, not needed here."""
        self.core.cache_unfinished_req(as_core_req(req))

    def cache_finished_req(self, req: Req | CoreReq, is_insert: bool = True) -> None:
        """At finish: the newest checkpoint to the tree (donated: the request gives its slot up), KV past
        it and every other slot freed, the lock released; the row stays (:meth:`free` it).
        With ``strip_thinking_cache`` and a request whose ``reasoning_tokens > 0``, the checkpoint is
        inserted only if it lies within the prompt (:mod:`mamba_radix.compat.strip_thinking`)."""
        core = as_core_req(req)
        if self.strip_thinking_cache and getattr(req, "reasoning_tokens", 0) > 0:
            is_insert = insert_keeps_prompt_state(self.core, core, is_insert)
        self.core.cache_finished_req(core, is_insert)

    # --------------------------------------------------------------------------------------- evict
    def evict(self, params: EvictParams) -> EvictResult:
        """Free at least ``num_tokens`` KV tokens and ``mamba_num`` checkpoints, as far as unlocked nodes
        allow. O(victims * log n)."""
        if not isinstance(params, EvictParams):
            raise InvalidArgument(f"evict takes EvictParams, got {type(params).__name__}")
        if params.swa_num_tokens:
            raise InvalidArgument("evict: this cache has no sliding-window pool (swa_num_tokens must be 0)")
        done = self.core.evict(params.num_tokens, params.mamba_num)
        return EvictResult(num_tokens_evicted=done.num_tokens, mamba_num_evicted=done.num_states)

    def evict_mamba(self, mamba_num: int) -> int:
        return self.core.evict(0, mamba_num).num_states

    def evict_full(self, full_num_tokens: int) -> int:
        return self.core.evict(full_num_tokens, 0).num_tokens

    # --------------------------------------------------------------------------------------- locks
    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        before = self.core.full_evictable_size()
        self.core.inc_lock_ref(node)
        return IncLockRefResult(delta=before - self.core.full_evictable_size())

    def dec_lock_ref(self, node: TreeNode, params: DecLockRefParams | None = None) -> DecLockRefResult:
        before = self.core.full_evictable_size()
        self.core.dec_lock_ref(node)
        return DecLockRefResult(delta=self.core.full_evictable_size() - before)

    # --------------------------------------------------------------------------------------- sizes
    def evictable_size(self) -> tuple[int, int]:
        """(KV tokens, checkpoints) that eviction may take. O(1)."""
        return self.core.full_evictable_size(), self.core.mamba_evictable_size()

    def protected_size(self) -> tuple[int, int]:
        """(KV tokens, checkpoints) locked by running requests. O(1)."""
        return self.core.full_protected_size(), self.core.mamba_protected_size()

    def full_evictable_size(self) -> int:
        return self.core.full_evictable_size()

    def mamba_evictable_size(self) -> int:
        return self.core.mamba_evictable_size()

    def full_protected_size(self) -> int:
        return self.core.full_protected_size()

    def mamba_protected_size(self) -> int:
        return self.core.mamba_protected_size()

    def total_size(self) -> tuple[int, int]:
        """(KV tokens, checkpoints) in the tree. O(1)."""
        full, mamba = self.evictable_size()
        locked_full, locked_mamba = self.protected_size()
        return full + locked_full, mamba + locked_mamba

    def available_and_evictable_str(self) -> str:
        """One line per pool: free, evictable and locked, as SGLang's scheduler logs them. O(1)."""
        kv = self.core.token_to_kv_pool_allocator
        states = self.core.mamba_pool
        full_ev, mamba_ev = self.evictable_size()
        full_pr, mamba_pr = self.protected_size()
        return (
            f"Available full tokens: {kv.available_size()}, full evictable: {full_ev}, "
            f"full protected: {full_pr}\n"
            f"Available mamba slots: {states.available_size()}, mamba evictable: {mamba_ev}, "
            f"mamba protected: {mamba_pr}\n"
        )

    # -------------------------------------------------------------------------------------- events
    def take_events(self) -> list[CacheEvent]:
        """SGLang's call: the events since the last call, oldest first, and clears them; empty unless
        built with ``enable_kv_cache_events``. KV events in SGLang's shape (``BlockStored``,
        ``BlockRemoved``: one block per page, per token at page size 1, chained per node); with
        ``checkpoint_events``, the ``CheckpointStored`` / ``CheckpointRemoved`` events in their place in
        the stream (docs/events.md). O(events)."""
        events = self.core.take_events()
        if self.checkpoint_events:
            return events
        return [e for e in events if isinstance(e, (BlockStored, BlockRemoved))]

    # ----------------------------------------------------------------------------------- debugging
    def sanity_check(self) -> None:
        """Every invariant of the tree and its pools (:meth:`CoreCache.check_invariants`); raises
        :class:`~mamba_radix.errors.InvariantError` on the first violation. O(n + tokens)."""
        self.core.check_invariants()

    def pretty_print(self) -> None:
        """Print the tree (SGLang prints; :meth:`CoreCache.pretty_print` returns the text). O(n)."""
        print(self.core.pretty_print())


def available_and_evictable_str(tree_cache: MambaRadixCache) -> str:
    """SGLang's ``mem_cache.common.available_and_evictable_str(tree_cache)``: the cache's own line."""
    return tree_cache.available_and_evictable_str()
