"""Replay requests through SGLang's real prefix cache with SGLang's scheduler rules, one at a time.

The cache is SGLang's own code (loaded by :mod:`.loader`); the pools are counting stand-ins with its
interfaces (:mod:`.pools`); what this module supplies is the scheduler around the cache, as SGLang's
scheduler drives it in a sequential run (one request in flight, the next arriving when it is done), read
from the release's ``managers/schedule_batch.py``, ``managers/scheduler.py``,
``managers/schedule_policy.py``, ``managers/scheduler_components/batch_result_processor.py``,
``mem_cache/allocation.py`` and ``mem_cache/common.py``:

1. **admission**: ``match_prefix(input, limit=len(input)-1, cow_mamba=True)`` (a hit takes a live slot,
   evicting one state if none is free), the hit locked (``inc_lock_ref(last_node)``);
2. **each prefill chunk** (``chunked_prefill_size`` tokens; pages: the first chunk's end rounded down to a
   page): state-slot headroom (0.5.20: evict states until 3 slots are free, ``alloc_req_slots``), the
   request row, live slot and track buffer (``HybridReqToTokenPool.alloc``), KV (evict the shortfall;
   pages: ``extend + page_size``), then extra_buffer prefill tracking
   (``_mamba_radix_cache_v2_req_prepare_for_extend``: a chunk of at least one checkpoint grid step tracks
   ``prefix + floor(extend / grid) * grid``, or the branch point when it lies inside the chunk on the chunk
   grid; eager buffers flip the ping-pong index);
3. **after each chunk**: ``cache_unfinished_req(chunked=True)``; after the last chunk the first token is
   sampled and, unless the request is done, ``cache_unfinished_req()``;
4. **decode**, token by token: KV for the token (evict 1; pages: a page whenever none is free), then at
   ``seq_len % lcm(grid, interval) == 0`` the state is tracked (``mamba_last_track_seqlen``, eager: flip
   the index) and *nothing is inserted* (``decoding_reqs`` suppresses ``cache_unfinished_req``);
5. **finish**: ``release_kv_cache``: ``cache_finished_req(kv_len_to_handle = input + output - 1)`` inserts
   the newest tracked state (no_buffer: the live state at the end), then the request row is freed.

That is 0.5.20 (``MambaRadixCache``). 0.5.23 (``UnifiedRadixCache``, Python tree core) differs where its
scheduler does (:class:`_Driver0523`): exact slot eviction before a chunk instead of the headroom,
``checkpoint(req, up_to)`` after a chunk, ``release_kv_cache(checkpoint=True)`` at finish. Both releases
take the same match key, chunking, prefill and decode tracking and per-step KV eviction.

With pages, 0.5.20's match key is cut to whole pages (its walk raises ``IndexError`` on a sub-page tail;
the hit is the same); ``ReplayConfig`` also has two switches that change one rule each, for diagnosis.

Use::

    sg = load_sglang("0.5.20")
    result = replay(sg, requests, ReplayConfig(strategy="extra_buffer", kv_tokens=8_000_000, state_slots=1024))
    result.rows[i].hit, result.rows[i].kv_match, result.mamba_evicted

Cost: the cache's own work plus O(tokens) per request here; decode is stepped token by token (exact: the
KV evictions happen at the step SGLang's do).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mamba_radix.errors import MambaRadixError
from mamba_radix.testing.sglang.loader import SGLangModules
from mamba_radix.testing.sglang.pools import advance_track

__all__ = [
    "INFINITE",
    "ExtendRange",
    "KvRecord",
    "ReplayConfig",
    "ReplayError",
    "ReplayRequest",
    "ReplayResult",
    "ReplayRow",
    "driver_for",
    "replay",
    "requests_from_trace",
]

INFINITE = 1 << 40  # pool size standing for "never runs out" (counting pools hold no per-slot memory)
FLA_CHUNK_SIZE = 64  # the kernels' chunk, SGLang's floor for mamba_cache_chunk_size
# Slots SGLang 0.5.20's alloc_req_slots wants free before every prefill batch (MAMBA_STATE_PER_REQ_*)
HEADROOM_SLOTS = {"extra_buffer": 3, "no_buffer": 3, "extra_buffer_lazy": 2}
CLIP_MAX_NEW_TOKENS = 4096  # SGLang's admission reserves at most this many output tokens

Strategy = Literal["no_buffer", "extra_buffer"]


class ReplayError(MambaRadixError):
    """The replay cannot go on: a request does not fit the pools, or SGLang's cache raised."""


@dataclass(frozen=True)
class ReplayRequest:
    """One request: its input tokens and the output tokens it will produce (their ids matter: a finished
    request's outputs enter the tree)."""

    index: int
    input_ids: Sequence[int]
    output_ids: Sequence[int]
    extra_key: str | None = None


def prefill_chunk_len(start: int, left: int, chunk: int, page_size: int, first: bool) -> int:
    """The scheduler's next prefill chunk of a request at ``start`` with ``left`` prompt tokens to go: all of
    them when they fit ``chunk`` (or chunking is off, ``chunk <= 0``); else ``chunk``, except that the
    request's first chunk ends on a page boundary (counted from position 0, as SGLang's scheduler cuts it).
    The one rule for the parity replay and the suite adapter. O(1)."""
    if chunk <= 0 or left <= chunk:
        return left
    if not first:
        return chunk
    return (start + chunk // page_size * page_size) // page_size * page_size - start


def requests_from_trace(traces: Iterable[Any]) -> list[ReplayRequest]:
    """:class:`ReplayRequest` from :class:`mamba_radix.sim.traces.TraceRequest` (the simulator's ids)."""
    return [ReplayRequest(t.index, t.input_ids, t.output_ids, getattr(t, "extra_key", None)) for t in traces]


@dataclass(frozen=True)
class ReplayConfig:
    """The cache and scheduler settings of a replay (SGLang's server-argument meanings).

    ``kv_tokens`` / ``state_slots``: pool sizes (:data:`INFINITE` for unbounded). ``chunk_size`` is
    SGLang's ``mamba_cache_chunk_size`` (``max(64, page_size)`` when left ``None``). ``overlap`` sets the
    ping-pong size (2 with overlap scheduling, 1 without).
    """

    strategy: Strategy = "extra_buffer"
    kv_tokens: int = INFINITE
    state_slots: int = INFINITE
    page_size: int = 1
    chunked_prefill_size: int = 8192
    track_interval: int = 256
    chunk_size: int | None = None
    overlap: bool = True
    # Rule switches for diagnosis (not SGLang's behaviour when changed): the state slots to keep free
    # before every prefill chunk (None: the release's rule), and inserting at every decode boundary
    # (``cache_unfinished_req`` there, as our simulator did before the lifecycle rewrite).
    headroom_slots: int | None = None
    insert_at_decode_boundary: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in ("no_buffer", "extra_buffer"):
            raise ReplayError(f"strategy must be no_buffer or extra_buffer, got {self.strategy!r}")
        if self.strategy == "no_buffer" and self.page_size != 1:
            raise ReplayError("no_buffer needs page_size 1 (SGLang asserts it)")
        if self.kv_tokens < 1 or self.state_slots < 1 or self.page_size < 1:
            raise ReplayError("kv_tokens, state_slots and page_size must be >= 1")

    @property
    def extra_buffer(self) -> bool:
        return self.strategy == "extra_buffer"

    @property
    def effective_chunk_size(self) -> int:
        return self.chunk_size if self.chunk_size is not None else max(FLA_CHUNK_SIZE, self.page_size)

    @property
    def checkpoint_grid(self) -> int:
        return math.lcm(self.effective_chunk_size, self.page_size)

    @property
    def track_grid(self) -> int:
        return math.lcm(self.checkpoint_grid, self.track_interval)


@dataclass
class ReplayRow:
    """One request's outcome: ``hit`` (cached tokens the request reused) and ``kv_match`` (the longest
    prefix whose KV was in the tree, state or not)."""

    index: int
    input_len: int
    hit: int
    kv_match: int


@dataclass
class ReplayResult:
    version: str
    config: ReplayConfig
    rows: list[ReplayRow] = field(default_factory=list)
    mamba_evicted: int = 0  # states the cache reported evicted (EvictResult.mamba_num_evicted)
    # states the tree gave up by eviction, leaves deleted by KV eviction included (EvictResult does not
    # count those): the count comparable with our CacheStats.states_evicted
    states_evicted: int = 0
    kv_evicted: int = 0  # KV tokens the cache reported evicted
    evict_calls: int = 0

    @property
    def hit_rate(self) -> float:
        total = sum(r.input_len for r in self.rows)
        return sum(r.hit for r in self.rows) / total if total else 0.0


# ------------------------------------------------------------------------------------- the request
@dataclass
class KvRecord:
    """The fields of SGLang's per-request KV record (``req.kv``) that its Mamba cache reads and writes
    (both releases; shared with :mod:`mamba_radix.testing.sglang_adapter`)."""

    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    swa_evict_floor: int = 0
    swa_evicted_seqlen: int = 0
    mamba_pool_idx: torch.Tensor | None = None
    mamba_ping_pong_track_buffer: torch.Tensor | None = None
    mamba_next_track_idx: int | None = None
    mamba_last_track_idx: int | None = None
    mamba_last_track_seqlen: int | None = None
    mamba_prev_track_seqlen: int | None = None
    mamba_cow_src_index: torch.Tensor | None = None
    mamba_needs_clear: bool = False
    lock_receipt: Any = None
    cache_inserted_len: int = 0  # 0.5.23: the longest prefix this request inserted

    def get_evicted_seqlen(self, component: Any) -> int:
        return self.swa_evicted_seqlen  # no sliding-window layers: nothing window-evicted

    def swa_dead_lo(self, page_size: int) -> int:
        return self.cache_protected_len

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None


class ExtendRange:
    """SGLang's ``req.extend_range``: the span ``[start, end)`` a forward extends."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    @property
    def length(self) -> int:
        return self.end - self.start


class _Req:
    """The request fields SGLang's cache touches (``schedule_batch.Req``), nothing else."""

    def __init__(self, request: ReplayRequest) -> None:
        self.rid = str(request.index)
        self.origin_input_ids = array("q", request.input_ids)
        self.output_ids = array("q")
        self.all_output = request.output_ids
        self.full_untruncated_fill_ids = self.origin_input_ids
        self.extra_key = request.extra_key
        self.cache_salt = None
        self.kv = KvRecord()
        self.last_node: Any = None
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.mamba_branching_seqlen: int | None = None
        self.extend_range: ExtendRange | None = None
        self.lock_receipt: Any = None
        self.session = None
        self.is_chunked = 0
        self.mamba_lazy_is_insert = True
        # 0.5.23's request fields
        self.prefix_len = 0
        self.extend_end: int | None = None
        self.lock: Any = None
        self.finished_reason: str | None = None
        self.finished_len: int | None = None
        self.skip_radix_cache_insert = False
        self.priority: int | None = None
        self.session_id: str | None = None
        self.kv_rotation_base: int | None = None
        self.best_match_node: Any = None

    @property
    def extend_len(self) -> int:
        assert self.extend_end is not None
        return self.extend_end - self.prefix_len

    def finished(self) -> bool:
        return self.finished_reason is not None

    def owned_kv_len(self) -> int:
        return self.kv.kv_committed_len

    def get_fill_ids(self) -> array:
        assert self.extend_range is not None
        return self.full_untruncated_fill_ids[: self.extend_range.end]

    def refresh_fill_ids(self) -> None:
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    def effective_kv_committed_len(self) -> int:
        return self.kv.kv_committed_len

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


# ---------------------------------------------------------------------------------------- the driver
class _Driver:
    """SGLang's scheduler steps for one request at a time around one cache (0.5.20 rules)."""

    def prefix_len(self, req: _Req) -> int:
        return len(req.prefix_indices)

    def __init__(self, sg: SGLangModules, cfg: ReplayConfig, max_context_len: int) -> None:
        self.sg, self.cfg = sg, cfg
        ns = sg.standins
        s = ns.settings
        s.page_size, s.chunk_size, s.track_interval = (
            cfg.page_size,
            cfg.effective_chunk_size,
            cfg.track_interval,
        )
        s.extra_buffer, s.lazy = cfg.extra_buffer, False
        if cfg.page_size == 1:
            self.kv_pool = ns.TokenToKVPoolAllocator(cfg.kv_tokens)
        else:
            self.kv_pool = ns.PagedTokenToKVPoolAllocator(cfg.kv_tokens, cfg.page_size)
        self.req_pool = ns.HybridReqToTokenPool(
            rows=2,
            max_context_len=max_context_len + cfg.page_size,
            num_slots=cfg.state_slots,
            extra_buffer=cfg.extra_buffer,
            ping_pong_size=2 if cfg.overlap else 1,
        )
        self.cache = self._build_cache()
        self.result = ReplayResult(sg.version, cfg)
        self._count_evictions()

    def _build_cache(self) -> Any:
        params = self.sg.CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv_pool,
            page_size=self.cfg.page_size,
            enable_mamba_extra_buffer=self.cfg.extra_buffer,
            enable_mamba_extra_buffer_lazy=False,
        )
        return self.sg.MambaRadixCache(params)

    def _count_evictions(self) -> None:
        """Wrap the cache instance's ``evict`` so every eviction, the cache's own included, is counted."""
        inner: Callable[..., Any] = self.cache.evict
        result = self.result

        def counted(params: Any) -> Any:
            out = inner(params)
            result.evict_calls += 1
            result.mamba_evicted += int(getattr(out, "mamba_num_evicted", 0) or 0)
            result.kv_evicted += int(getattr(out, "num_tokens_evicted", 0) or 0)
            return out

        self.cache.evict = counted
        self._count_state_evictions()

    def _count_state_evictions(self) -> None:
        """Count every state eviction frees: a leaf deleted (by state or KV eviction) or an inner node
        tombstoned; both helpers run only on eviction paths of 0.5.20's cache."""
        cache, result = self.cache, self.result
        leaf, tomb = cache._evict_leaf_node, cache._tombstone_internal_node

        def evict_leaf(*args: Any, **kwargs: Any) -> Any:
            result.states_evicted += 1
            return leaf(*args, **kwargs)

        def tombstone(*args: Any, **kwargs: Any) -> Any:
            result.states_evicted += 1
            return tomb(*args, **kwargs)

        cache._evict_leaf_node, cache._tombstone_internal_node = evict_leaf, tombstone

    # ------------------------------------------------------------------------------------- helpers
    def evict_params(self, **kw: int) -> Any:
        return self.sg.EvictParams(**kw)

    def evict_kv_for(self, num_tokens: int) -> None:
        """``evict_from_tree_cache``: evict only the shortfall below ``num_tokens``."""
        avail = self.kv_pool.available_size()
        if avail < num_tokens:
            self.cache.evict_for_alloc(self.evict_params(num_tokens=num_tokens - avail))

    def kv_match_len(self, key: Any) -> int:
        """Tokens of ``key`` whose KV is in the tree (a read-only walk after the match split)."""
        node, total, page = self.cache.root_node, 0, self.cfg.page_size
        while len(key) >= page:
            child = node.children.get(key.child_key(page))
            if child is None:
                break
            m = child.key.match(key, page_size=page)
            total += m
            if m < len(child.key):
                break
            key, node = key[m:], child
        return total

    # ---------------------------------------------------------------------------------- admission
    def admit(self, req: _Req) -> tuple[int, int]:
        input_len = len(req.origin_input_ids)
        limit = max(input_len - 1, 0)
        if self.cfg.page_size > 1:
            # 0.5.20's MambaRadixCache walks keys page by page and raises IndexError on a key whose tail
            # is shorter than a page (its server never builds this class: the registry builds
            # UnifiedRadixCache). Matching the page-aligned key gives the hit the walk would have given.
            limit = limit // self.cfg.page_size * self.cfg.page_size
        key = self.sg.RadixKey(req.full_untruncated_fill_ids, req.extra_key, limit=limit)
        allocator = self.req_pool.mamba_allocator
        allocator.alloc_group_begin(1)  # one waiting request: SGLang pre-takes one slot per waiting request
        match = self.cache.match_prefix(self.sg.MatchPrefixParams(key=key, req=req, cow_mamba=True))
        req.prefix_indices = match.device_indices
        req.last_node = match.last_device_node
        req.mamba_branching_seqlen = match.mamba_branching_seqlen
        req.kv.cache_protected_len = (
            match.cache_protected_len if match.cache_protected_len is not None else len(req.prefix_indices)
        )
        hit = len(req.prefix_indices)
        kv_match = self.kv_match_len(key)
        self._check_budget(req, hit)
        req.lock_receipt = self.cache.inc_lock_ref(req.last_node)
        allocator.alloc_group_end()
        return hit, kv_match

    def _check_budget(self, req: _Req, hit: int) -> None:
        """PrefillAdder's KV gate with nothing else running: the uncached input plus the reserved output
        must be below free + evictable KV (else SGLang would wait forever)."""
        need = (
            len(req.origin_input_ids)
            - hit
            + min(len(req.all_output), CLIP_MAX_NEW_TOKENS)
            + self.cfg.page_size
        )
        room = self.kv_pool.available_size() + self.cache.full_evictable_size()
        if need >= room:
            raise ReplayError(
                f"request {req.rid}: needs {need} KV tokens, the pool can give {room}; SGLang would never admit it"
            )

    # ------------------------------------------------------------------------------------ prefill
    def chunk_len(self, req: _Req, first: bool) -> int:
        prefix = self.prefix_len(req)
        return prefill_chunk_len(
            prefix,
            len(req.origin_input_ids) - prefix,
            self.cfg.chunked_prefill_size,
            self.cfg.page_size,
            first,
        )

    def slot_headroom(self, req: _Req) -> None:
        """0.5.20 ``alloc_req_slots``: evict states until the per-request headroom is free."""
        need = (
            HEADROOM_SLOTS[self.cfg.strategy] if self.cfg.headroom_slots is None else self.cfg.headroom_slots
        )
        avail = self.req_pool.mamba_allocator.schedulable_available_size()
        if avail < need:
            self.cache.evict_for_alloc(self.evict_params(mamba_num=need - avail))

    def prefix_kv(self, req: _Req, prefix: int) -> torch.Tensor:
        """The KV indices of the request's prefix (0.5.20 keeps them on the request)."""
        return req.prefix_indices

    def alloc_extend_kv(self, req: _Req, prefix: int, end: int, prefix_kv: torch.Tensor) -> torch.Tensor:
        n = end - prefix
        if self.cfg.page_size == 1:
            self.evict_kv_for(n)
            out = self.kv_pool.alloc(n)
        else:
            self.evict_kv_for(n + self.cfg.page_size)
            last = int(prefix_kv[-1]) if len(prefix_kv) else -1
            out = self.kv_pool.alloc_extend_one(prefix, end, last)
        if out is None:
            raise ReplayError(f"request {req.rid}: prefill out of KV memory ({n} tokens)")
        return out

    def prefill_chunk(self, req: _Req, first: bool) -> None:
        if not first:
            req.refresh_fill_ids()  # init_next_round_input() without a cache: no match
        prefix = self.prefix_len(req)
        n = self.chunk_len(req, first)
        end = prefix + n
        req.extend_range = ExtendRange(prefix, end)
        req.extend_end = end
        prefix_kv = self.prefix_kv(req, prefix)
        self.slot_headroom(req)
        if self.req_pool.alloc([req]) is None:
            raise ReplayError(f"request {req.rid}: no request row free")
        out = self.alloc_extend_kv(req, prefix, end, prefix_kv)
        row = req.kv.req_pool_idx
        self.req_pool.write((row, slice(0, prefix)), prefix_kv)
        self.req_pool.write((row, slice(prefix, end)), out)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = end
        if self.cfg.extra_buffer:
            self.track_prefill(req, prefix, n)
        req.kv.mamba_cow_src_index = None  # the deferred copy-on-write runs with the forward
        req.kv.mamba_needs_clear = False

    def track_prefill(self, req: _Req, prefix: int, n: int) -> None:
        """``_mamba_radix_cache_v2_req_prepare_for_extend``: which length this chunk's track slot holds."""
        grid, chunk = self.cfg.checkpoint_grid, self.cfg.effective_chunk_size
        if n < grid:
            return
        end = prefix + n
        aligned = prefix + n // grid * grid
        track_seqlen = end
        if prefix + n // FLA_CHUNK_SIZE * FLA_CHUNK_SIZE != aligned:
            track_seqlen = aligned + 1  # forced read of an intermediate state
        advance_track(self.req_pool, req.kv)
        branch = req.mamba_branching_seqlen
        if branch is not None and prefix < branch < track_seqlen and (branch - prefix) % chunk == 0:
            aligned = branch
        req.kv.mamba_last_track_seqlen = aligned

    # ------------------------------------------------------------------------------------- decode
    def decode_step(self, req: _Req) -> None:
        kv = req.kv.kv_committed_len
        ps = self.cfg.page_size
        if ps == 1:
            self.evict_kv_for(1)  # check_decode_mem, then alloc_token_slots(1)
            out = self.kv_pool.alloc(1)
        else:
            self.evict_kv_for(ps if kv % ps == 0 else 0)  # check_decode_mem
            self.evict_kv_for(ps)  # alloc_paged_token_slots_decode over-estimates one page per request
            last = int(self.req_pool.req_to_token[req.kv.req_pool_idx, kv - 1])
            out = self.kv_pool.alloc_extend_one(kv, kv + 1, last)
        if out is None:
            raise ReplayError(f"request {req.rid}: decode out of KV memory")
        self.req_pool.write((req.kv.req_pool_idx, kv), out)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = kv + 1
        req.output_ids.append(req.all_output[len(req.output_ids)])
        if self.cfg.extra_buffer and (kv + 1) % self.cfg.track_grid == 0:
            req.kv.mamba_last_track_seqlen = kv + 1
            advance_track(self.req_pool, req.kv)
            if self.cfg.insert_at_decode_boundary and len(req.output_ids) < len(req.all_output):
                req.refresh_fill_ids()
                req.extend_range = ExtendRange(kv, kv + 1)
                self.cache.cache_unfinished_req(req)

    # ------------------------------------------------------------------------------------- finish
    def finish(self, req: _Req) -> None:
        """``release_kv_cache(req, cache)``: the cache inserts and unlocks; the row is freed."""
        self.cache.cache_finished_req(req, is_insert=True, kv_len_to_handle=req.effective_kv_committed_len())
        if req.kv.holds_kv:
            self.req_pool.free(req)

    def after_chunk(self, req: _Req, last: bool) -> None:
        if not last:
            self.cache.cache_unfinished_req(req, chunked=True)
            return
        req.output_ids.append(req.all_output[0])
        if len(req.output_ids) >= len(req.all_output):
            self.finish(req)
        else:
            self.cache.cache_unfinished_req(req)

    # --------------------------------------------------------------------------------------- run
    def run_one(self, request: ReplayRequest) -> ReplayRow:
        if not request.output_ids:
            raise ReplayError(f"request {request.index}: needs at least one output token")
        req = _Req(request)
        hit, kv_match = self.admit(req)
        first = True
        while True:
            self.prefill_chunk(req, first)
            first = False
            last = req.kv.kv_committed_len == len(req.origin_input_ids)
            self.after_chunk(req, last)
            if last:
                break
        while len(req.output_ids) < len(req.all_output):
            self.decode_step(req)
        if req.kv.holds_kv:
            self.finish(req)
        return ReplayRow(request.index, len(req.origin_input_ids), hit, kv_match)


def driver_for(sg: SGLangModules, config: ReplayConfig, max_context_len: int) -> _Driver:
    """A fresh cache of version ``sg`` with its pools, driven by that release's scheduler rules, for
    callers that step requests themselves (benchmarks timing the cache's calls, adapters): ``.cache``,
    ``.req_pool``, ``.kv_pool``, ``.result`` and ``.run_one(request) -> ReplayRow``. Build and use it inside
    ``with sg.activated():``. Raises :class:`ReplayError` for a version without a driver."""
    driver_cls = _DRIVERS.get(sg.version)
    if driver_cls is None:
        raise ReplayError(f"no replay driver for sglang {sg.version}; known: {', '.join(_DRIVERS)}")
    return driver_cls(sg, config, max_context_len)


def replay(
    sg: SGLangModules,
    requests: Sequence[ReplayRequest],
    config: ReplayConfig,
    on_request: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``requests`` in order through a fresh SGLang cache of version ``sg``; returns the per-request
    hits and the eviction counts. ``on_request(n)`` after each request (progress bars).

    Raises :class:`ReplayError` when a request cannot fit the pools or SGLang's cache raises (its
    message says which request). Side effects: none outside the new cache and pools.
    """
    if not requests:
        return ReplayResult(sg.version, config)
    max_len = max(len(r.input_ids) + len(r.output_ids) for r in requests)
    with sg.activated():
        driver = driver_for(sg, config, max_len)
        for n, request in enumerate(requests, 1):
            try:
                driver.result.rows.append(driver.run_one(request))
            except ReplayError:
                raise
            except (AssertionError, RuntimeError, IndexError, ValueError, TypeError) as err:
                raise ReplayError(
                    f"sglang {sg.version} raised on request {request.index}: {type(err).__name__}: {err}"
                ) from err
            if on_request is not None:
                on_request(n)
    return driver.result


class _Driver0523(_Driver):
    """0.5.23's scheduler steps around ``UnifiedRadixCache`` (Python tree core), where they differ from
    0.5.20 (``managers/schedule_batch.py``, ``mem_cache/common.py``, ``mem_cache/allocation.py``):

    - match through ``match_kv_cache``: the request keeps ``prefix_len`` (its KV is read off the tree
      with ``prefix_device_indices`` when the row is bound) and the tree's lock receipt (``req.lock``);
    - state slots before a chunk: ``ensure_mamba_capacity`` evicts exactly what the pool will hand out
      (the live slot if the request has none, the initial tracking slots if it has no buffer);
    - after a chunk: ``checkpoint_kv_cache`` (``cache.checkpoint(req, up_to=extend_end)``), then
      ``prefix_len = extend_end``;
    - finish: ``release_kv_cache(checkpoint=True)``: checkpoint up to the owned KV, free the rest of the
      row past the protected prefix, unlock, ``on_release``, free the row.
    """

    def prefix_len(self, req: _Req) -> int:
        return req.prefix_len

    def _build_cache(self) -> Any:
        ct = self.sg.ComponentType
        params = self.sg.CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.kv_pool,
            page_size=self.cfg.page_size,
            enable_mamba_extra_buffer=self.cfg.extra_buffer,
            enable_mamba_extra_buffer_lazy=False,
            chunked_prefill_size=self.cfg.chunked_prefill_size,
            tree_components=(ct.FULL, ct.MAMBA),
            tree_core_backend="python",
        )
        return self.sg.UnifiedRadixCache(params)

    def _count_state_evictions(self) -> None:
        """0.5.23 reports every state it evicts in ``EvictResult``; KV eviction's collateral state
        frees are counted by watching the slot allocator while ``evict`` runs."""
        cache, result, slots = self.cache, self.result, self.req_pool.mamba_allocator
        inner = cache.evict_for_alloc

        def counted(params: Any, **kwargs: Any) -> Any:
            before = slots.available_size()
            out = inner(params, **kwargs)
            result.evict_calls += 1
            result.mamba_evicted += int(getattr(out, "mamba_num_evicted", 0) or 0)
            result.kv_evicted += int(getattr(out, "num_tokens_evicted", 0) or 0)
            result.states_evicted += slots.available_size() - before
            return out

        cache.evict_for_alloc = counted

    def _count_evictions(self) -> None:
        self._count_state_evictions()

    def admit(self, req: _Req) -> tuple[int, int]:
        input_len = len(req.origin_input_ids)
        key = self.sg.RadixKey(req.full_untruncated_fill_ids, req.extra_key, limit=max(input_len - 1, 0))
        match = self.cache.match_prefix(self.sg.MatchPrefixParams(key=key, req=req, cow_mamba=True))
        req.prefix_len = int(match.device_prefix_len)
        req.last_node = match.last_device_node
        req.best_match_node = match.best_match_node
        if match.mamba_branching_seqlen is not None:
            req.mamba_branching_seqlen = match.mamba_branching_seqlen
        req.kv.cache_protected_len = (
            match.cache_protected_len if match.cache_protected_len is not None else req.prefix_len
        )
        hit = req.prefix_len
        kv_match = int(match.full_kv_hit_length)
        self._check_budget(req, hit)
        req.lock = self.cache.lock(req.last_node)
        return hit, kv_match

    def prefix_kv(self, req: _Req, prefix: int) -> torch.Tensor:
        if req.kv.holds_kv:
            return self.req_pool.req_to_token[req.kv.req_pool_idx, :prefix].to(torch.int64)
        if prefix == 0:
            return torch.empty(0, dtype=torch.int64)
        return self.cache.prefix_device_indices(req)

    def slot_headroom(self, req: _Req) -> None:
        needed = 0 if req.kv.holds_mamba else 1
        if req.kv.mamba_ping_pong_track_buffer is None:
            needed += self.req_pool.mamba_initial_tracking_slots
        avail = self.req_pool.mamba_allocator.schedulable_available_size()
        if avail < needed:
            self.cache.evict_for_alloc(self.evict_params(mamba_num=needed - avail))

    def _checkpoint(self, req: _Req) -> None:
        self.cache.checkpoint(req, up_to=req.extend_end)
        req.prefix_len = req.extend_end  # type: ignore[assignment]

    def after_chunk(self, req: _Req, last: bool) -> None:
        if not last:
            self._checkpoint(req)
            return
        req.output_ids.append(req.all_output[0])
        if len(req.output_ids) >= len(req.all_output):
            self.finish(req)
        else:
            self._checkpoint(req)

    def decode_step(self, req: _Req) -> None:
        prev = req.kv.mamba_last_track_seqlen
        super().decode_step(req)
        if req.kv.mamba_last_track_seqlen != prev and prev is not None:
            req.kv.mamba_prev_track_seqlen = prev

    def finish(self, req: _Req) -> None:
        req.finished_reason = "length"
        if self.cache.claim_kv_row(req):
            return
        owned = req.owned_kv_len()
        req.refresh_fill_ids()
        self.cache.checkpoint(req, up_to=owned)
        self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned)])
        self.cache.unlock(req.lock)
        req.lock = None
        self.cache.on_release(req, checkpointed=True)
        self.req_pool.free(req)


_DRIVERS: dict[str, type[_Driver]] = {"0.5.20": _Driver, "0.5.23": _Driver0523}
