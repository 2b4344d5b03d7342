"""The invariant suite against SGLang's own ``MambaRadixCache``, loaded from its PyPI wheel at run time.

:class:`SGLangAdapter` drives SGLang 0.5.20's real cache (imported by
:func:`mamba_radix.testing.sglang.load_sglang`; no SGLang code is stored here) over the loader's counting
pools, which hold no state memory: the adapter plays the model with a tensor-free
:class:`~mamba_radix.testing.stamps.StampStore` (it stamps a slot where the forward would write a state and
copies stamps where SGLang copies states). Most of the adapter is tree calls and observation; the rest is
SGLang's scheduler steps around the cache, as in ``managers/scheduler.py`` and ``schedule_batch.py``:

- **admission** (``admit``): the scheduler's limits (running requests at most the request rows and the
  state pool's ``num_slots // slots_per_request``, SGLang's ``_calculate_mamba_ratio``: its
  ``PrefillAdder`` has no slot gate for a separate state pool; the KV budget of every admitted request's
  input and reserved output against free plus evictable), then ``match_prefix(input[:-1] (page-aligned),
  cow_mamba=True)`` inside the waiting request's slot pre-take, and ``inc_lock_ref`` on the hit;
- **a prefill chunk**: 0.5.20's slot headroom (evict states until 3 are free), the row, live slot and track
  buffer (``HybridReqToTokenPool.alloc``), KV (evicting the shortfall), extra_buffer prefill tracking at
  the checkpoint grid (branch point on the chunk grid), then ``cache_unfinished_req`` (``chunked=True``
  but for the last chunk);
- **decode**: KV for one token, tracking at ``seq_len % lcm(grid, interval) == 0``; nothing is inserted;
- **finish**: ``cache_finished_req(kv_len_to_handle=kv_committed_len)`` then the row is freed; a request
  that never ran a chunk only drops its lock and its copy-on-write slot.

Capabilities: requests, cow, extra_key, branching, eviction_totals (measured around every call of its
``evict``, so a step that evicted nothing must lose nothing). Not declared: ``exact_evict_report``
(SGLang's ``EvictResult`` does not count the state of a leaf evicted for its KV), ``full_kv_hit_len`` (not
in its ``MatchResult``), ``partial_page_keys`` (its page walk raises ``IndexError`` on a key that ends
inside a page) and ``faults``. ``max_raw_locks = 1``: SGLang's scheduler never holds locks
outside requests, so an unbounded number would starve it of slots by the suite's doing.

Known failures (:data:`KNOWN_ISSUES`), counted by the machine and never hidden:

- ``sglang-34676``: the state pool runs dry inside the cache. ``_alloc_mamba_slot`` (a chunk's
  ``cache_unfinished_req``) or the copy-on-write of a match evicts one state, finds none evictable (all
  locked by running requests) and asserts ``Can not alloc mamba cache`` (SGLang issue #34676 and its
  duplicates). The scheduler's admission counts slots per request but not the slot each chunk's hand-over
  and each waiting request's copy-on-write take.
- ``sglang-34676-pool``: the same exhaustion met one step earlier, in ``HybridReqToTokenPool.alloc`` (the
  live slot or the track buffer of a request's first chunk), where SGLang asserts too; the counting pool
  raises its stand-in message.

:func:`sglang_params` draws only configurations SGLang's configurator accepts (:meth:`SGLangAdapter.accepts`).

Against the public-bug scenarios (:mod:`mamba_radix.testing.scenarios`) SGLang 0.5.20 shows #36935 (a
branch forking mid-chain under slot pressure hits 0); #34780 needs a state grid finer than the page, which
its configurator refuses.
"""

from __future__ import annotations

import contextlib
import io
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from mamba_radix.testing.adapter import (
    AdmitOutcome,
    EvictOutcome,
    InsertOutcome,
    MatchOutcome,
    Offer,
    Ownership,
    RunningView,
    SuiteParams,
    TreeSnapshot,
    snapshot_tree,
)
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.known import KnownFailure, KnownIssue
from mamba_radix.testing.params import slots_per_request, suite_params
from mamba_radix.testing.sglang import SGLangModules, load_sglang
from mamba_radix.testing.sglang.pools import advance_track
from mamba_radix.testing.sglang.replay import ExtendRange, KvRecord, prefill_chunk_len
from mamba_radix.testing.stamps import EMPTY_STAMP, StampStore

__all__ = ["KNOWN_ISSUES", "SGLANG_VERSION", "SGLangAdapter", "sglang_params"]

SGLANG_VERSION = "0.5.20"
MAX_CONTEXT = 64  # request rows: inputs (<= 20) plus outputs (<= 12), with room to spare
HEADROOM_SLOTS = 3  # 0.5.20 alloc_req_slots: states evicted until this many slots are free per chunk

KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "sglang-34676",
        "https://github.com/sgl-project/sglang/issues/34676",
        "state slots exhausted inside the cache: one state evicted, none evictable, assert",
        ("AssertionError",),
        "Can not alloc mamba cache",
    ),
    KnownIssue(
        "sglang-34676-pool",
        "https://github.com/sgl-project/sglang/issues/34676",
        "state slots exhausted at a request's first chunk (HybridReqToTokenPool.alloc asserts)",
        ("PoolMisuse",),
        "no state slot",
    ),
)


@st.composite
def sglang_params(draw: st.DrawFn) -> SuiteParams:
    """Configurations SGLang 0.5.20's configurator accepts: no_buffer (page 1) or extra_buffer (page
    1, 2 or 4, with or without overlap: ping-pong of 2 or 1); the state chunk a multiple of the page
    (``mamba_cache_chunk_size`` is); no per-path cap and no KV-only leaves (not in 0.5.20). KV pools of
    24-96 tokens: its admission reserves every request's output, so smaller pools would refuse most.
    State pools of one request's share plus 0-3 and short prefill chunks (several hand-overs per request):
    slot pressure at a hand-over is where its known failure lives."""
    base = draw(
        suite_params(
            strategies=("no_buffer", "extra_buffer"),
            caps=(-1,),
            kv_only_leaves=(False,),
            kv_tokens=(24, 96),
            spare_slots=(0, 3),
            prefill_chunks=(2, 3, 4),
        ).filter(lambda p: p.state_chunk % p.page_size == 0)
    )
    return base


@dataclass
class _Req:
    """The fields of SGLang's ``schedule_batch.Req`` its cache touches."""

    rid: int
    origin_input_ids: array
    extra_key: Any
    max_new_tokens: int | None
    output_ids: array = field(default_factory=lambda: array("q"))
    kv: KvRecord = field(default_factory=KvRecord)
    last_node: Any = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    mamba_branching_seqlen: int | None = None
    extend_range: ExtendRange | None = None
    lock_receipt: Any = None
    cache_salt: Any = None
    session: Any = None
    is_chunked: int = 0
    mamba_lazy_is_insert: bool = True
    chunks: int = 0

    def get_fill_ids(self) -> array:
        assert self.extend_range is not None
        return (self.origin_input_ids + self.output_ids)[: self.extend_range.end]

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(self.origin_input_ids) + tuple(self.output_ids)

    @property
    def kv_len(self) -> int:
        return self.kv.kv_committed_len if self.chunks else len(self.prefix_indices)


def _slot(value: torch.Tensor | None) -> int | None:
    return None if value is None else int(value.reshape(-1)[0])


class SGLangAdapter:
    """:class:`~mamba_radix.testing.adapter.CacheAdapter` for SGLang 0.5.20's ``MambaRadixCache``.

    Raises :class:`~mamba_radix.testing.sglang.SGLangUnavailableError` when the wheel cannot be fetched.
    """

    capabilities = frozenset({"requests", "cow", "extra_key", "branching", "eviction_totals"})
    max_raw_locks = 1

    @staticmethod
    def accepts(params: SuiteParams) -> bool:
        """Whether SGLang's configurator accepts ``params`` (the rules :func:`sglang_params` draws by)."""
        return (
            params.strategy in ("no_buffer", "extra_buffer")
            and (params.strategy == "extra_buffer" or (params.page_size == 1 and not params.overlap))
            and params.state_chunk % params.page_size == 0
            and params.max_states_per_path < 0
            and not params.kv_only_leaves
        )

    def __init__(self, params: SuiteParams, version: str = SGLANG_VERSION) -> None:
        if not self.accepts(params):
            raise SuiteViolation(f"SGLang {version} cannot build {params}; draw from sglang_params()")
        self.params = params
        self.sg: SGLangModules = load_sglang(version)
        ns = self.sg.standins
        s = ns.settings
        s.page_size, s.chunk_size, s.track_interval = (
            params.page_size,
            params.state_chunk,
            params.track_interval,
        )
        s.extra_buffer, s.lazy, s.max_states_per_path = params.strategy == "extra_buffer", False, -1
        self.extra_buffer = params.strategy == "extra_buffer"
        page = params.page_size
        self.grid = math.lcm(params.state_chunk, page)
        self.track_grid = math.lcm(self.grid, params.track_interval)
        kv_tokens = params.kv_pages * page
        with self.sg.activated():
            if page == 1:
                self.kv_pool = ns.TokenToKVPoolAllocator(kv_tokens)
            else:
                self.kv_pool = ns.PagedTokenToKVPoolAllocator(kv_tokens, page)
            self.req_pool = ns.HybridReqToTokenPool(
                rows=params.req_rows,
                max_context_len=MAX_CONTEXT + page,
                num_slots=params.state_slots,
                extra_buffer=self.extra_buffer,
                ping_pong_size=2 if params.overlap else 1,
            )
            self.cache = self.sg.MambaRadixCache(
                self.sg.CacheInitParams(
                    disable=False,
                    req_to_token_pool=self.req_pool,
                    token_to_kv_pool_allocator=self.kv_pool,
                    page_size=page,
                    enable_mamba_extra_buffer=self.extra_buffer,
                    enable_mamba_extra_buffer_lazy=False,
                )
            )
        self.slots = self.req_pool.mamba_allocator
        self.stamps = StampStore()
        states = self.req_pool.mamba_pool
        inner_copy = states.copy_from

        def copy_from(src: Any, dst: Any) -> None:  # SGLang copies a state: so do the stamps
            inner_copy(src, dst)
            for a, b in zip(src.reshape(-1).tolist(), dst.reshape(-1).tolist(), strict=True):
                self.stamps.copy(a, b)

        states.copy_from = copy_from
        self.evicted = [0, 0]  # tokens and states that left the tree through SGLang's evict, measured
        inner_evict = self.cache.evict

        def evict(params: Any) -> Any:  # every eviction, the cache's own included, goes through here
            before = self._tree_size()
            out = inner_evict(params)
            after = self._tree_size()
            self.evicted[0] += before[0] - after[0]
            self.evicted[1] += before[1] - after[1]
            return out

        self.cache.evict = evict
        base = self.sg.modules["sglang.srt.mem_cache.base_prefix_cache"]
        self._insert_params = base.InsertParams
        self.reqs: dict[int, _Req] = {}
        self.raw_locks = 0
        # SGLang bounds running requests by the state pool it sized (_calculate_mamba_ratio): no slot gate
        # in PrefillAdder for a separate state pool
        self.max_running = min(
            params.req_rows, params.state_slots // slots_per_request(params.strategy, params.overlap)
        )

    # ------------------------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _sglang(self) -> Iterator[None]:
        """Run SGLang code: its modules active; a documented failure becomes :class:`KnownFailure`."""
        with self.sg.activated():
            try:
                yield
            except Exception as exc:
                for issue in KNOWN_ISSUES:
                    if issue.matches(exc):
                        raise KnownFailure(issue, f"{type(exc).__name__}: {exc}") from exc
                raise

    def _key(self, extra_key: Any, tokens: Sequence[int]) -> Any:
        return self.sg.RadixKey(array("q", tokens), extra_key)

    def _evict(self, num_tokens: int = 0, num_states: int = 0) -> Any:
        return self.cache.evict(self.sg.EvictParams(num_tokens=num_tokens, mamba_num=num_states))

    def _kv_for(self, num_tokens: int) -> None:
        """``evict_from_tree_cache``: evict only the shortfall."""
        avail = self.kv_pool.available_size()
        if avail < num_tokens:
            self._evict(num_tokens=num_tokens - avail)

    def _tree_size(self) -> tuple[int, int]:
        c = self.cache
        return (
            c.full_evictable_size() + c.full_protected_size(),
            c.mamba_evictable_size() + c.mamba_protected_size(),
        )

    def _row(self, req: _Req, upto: int) -> tuple[int, ...]:
        if req.kv.req_pool_idx is None:
            return tuple(req.prefix_indices[:upto].tolist())
        return tuple(self.req_pool.req_to_token[req.kv.req_pool_idx, :upto].tolist())

    def _req_slots(self, req: _Req) -> list[int]:
        held = [] if req.kv.mamba_pool_idx is None else [_slot(req.kv.mamba_pool_idx)]
        buf = req.kv.mamba_ping_pong_track_buffer
        held += [] if buf is None else [int(s) for s in buf.tolist() if int(s) != -1]
        return held  # type: ignore[return-value]

    def _reserved_kv(self) -> int:
        """KV the admitted requests will still allocate (their uncached input and reserved output)."""
        total = 0
        for r in self.reqs.values():
            final = len(r.origin_input_ids) + (r.max_new_tokens or 0)
            total += max(final - r.kv_len, 0)
        return total

    # ------------------------------------------------------------------------------------ tree ops
    def insert(self, extra_key: Any, tokens: Sequence[int]) -> InsertOutcome | None:
        before = self._tree_size()
        with self._sglang():
            self._kv_for(len(tokens))
            kv = self.kv_pool.alloc(len(tokens))
            if kv is None:
                return None
            slot = self.slots.alloc(1)
            if slot is None:
                self._evict(num_states=1)
                slot = self.slots.alloc(1)
            if slot is None:
                self.kv_pool.free(kv)
                return None
            evicted = self._tree_size() != before
            self.stamps.write(int(slot[0]), tokens)
            res = self.cache.insert(
                self._insert_params(key=self._key(extra_key, tokens), value=kv.clone(), mamba_value=slot)
            )
            if res.mamba_exist:
                self.slots.free(slot)
        return InsertOutcome(res.prefix_len, res.mamba_exist, tuple(kv.tolist()), int(slot[0]), evicted)

    def match(self, extra_key: Any, tokens: Sequence[int], cow: bool) -> MatchOutcome | None:
        if cow and self.slots.available_size() == 0 and self.cache.mamba_evictable_size() == 0:
            return None  # the scheduler would not match with copy-on-write without a slot in sight
        req = _Req(-1, array("q", tokens), extra_key, None)
        with self._sglang():
            m = self.cache.match_prefix(
                self.sg.MatchPrefixParams(key=self._key(extra_key, tokens), req=req, cow_mamba=cow)
            )
        hit = len(m.device_indices)
        node = m.last_device_node
        cow_stamp = None
        if req.kv.mamba_pool_idx is not None:  # the deferred copy runs with the forward: play it, free
            dst = _slot(req.kv.mamba_pool_idx)
            self.stamps.copy(_slot(req.kv.mamba_cow_src_index), dst)  # type: ignore[arg-type]
            cow_stamp = self.stamps.read(dst)  # type: ignore[arg-type]
            with self._sglang():
                self.slots.free(req.kv.mamba_pool_idx.reshape(1))
        return MatchOutcome(
            hit_len=hit,
            kv_indices=tuple(m.device_indices.tolist()),
            node=node,
            slot=_slot(node.mamba_value) if hit else None,
            full_kv_hit_len=None,
            branching_seqlen=m.mamba_branching_seqlen,
            cow_stamp=cow_stamp,
        )

    def lock(self, node: Any) -> None:
        with self._sglang():
            self.cache.inc_lock_ref(node)
        self.raw_locks += 1

    def unlock(self, node: Any) -> None:
        with self._sglang():
            self.cache.dec_lock_ref(node)
        self.raw_locks -= 1

    def evict(self, num_tokens: int, num_states: int) -> EvictOutcome:
        with self._sglang():
            res = self._evict(num_tokens, num_states)
        return EvictOutcome(int(res.num_tokens_evicted), int(res.mamba_num_evicted))

    # ------------------------------------------------------------------------------------ requests
    def admit(
        self, rid: int, extra_key: Any, input_ids: Sequence[int], max_new_tokens: int | None = None
    ) -> AdmitOutcome | None:
        page = self.params.page_size
        req = _Req(rid, array("q", input_ids), extra_key, max_new_tokens)
        limit = (len(input_ids) - 1) // page * page
        if len(self.reqs) >= self.max_running:
            return None
        with self._sglang():
            self.slots.alloc_group_begin(1)  # the scheduler pre-takes one slot per waiting request
            try:
                m = self.cache.match_prefix(
                    self.sg.MatchPrefixParams(
                        key=self._key(extra_key, input_ids[:limit]), req=req, cow_mamba=True
                    )
                )
            finally:
                self.slots.alloc_group_end()
            hit = len(m.device_indices)
            final = len(input_ids) + (max_new_tokens or 0) - hit + page
            room = self.kv_pool.available_size() + self.cache.full_evictable_size()
            if final + self._reserved_kv() > room:  # PrefillAdder: the KV budget; undo the copy-on-write
                if req.kv.mamba_pool_idx is not None:
                    self.slots.free(req.kv.mamba_pool_idx.reshape(1))
                return None
            req.prefix_indices = m.device_indices
            req.last_node = m.last_device_node
            req.mamba_branching_seqlen = m.mamba_branching_seqlen
            req.kv.cache_protected_len = hit
            self.cache.inc_lock_ref(req.last_node)
        live = EMPTY_STAMP
        if req.kv.mamba_pool_idx is not None:
            dst = _slot(req.kv.mamba_pool_idx)
            self.stamps.copy(_slot(req.kv.mamba_cow_src_index), dst)  # type: ignore[arg-type]
            live = self.stamps.read(dst)  # type: ignore[arg-type]
            req.kv.mamba_cow_src_index = None
        self.reqs[rid] = req
        return AdmitOutcome(rid, hit, live)

    def in_prefill(self, rid: int) -> bool:
        req = self.reqs[rid]
        return req.kv_len < len(req.origin_input_ids)

    def _chunk_len(self, req: _Req) -> int:
        left = len(req.origin_input_ids) - req.kv_len
        return prefill_chunk_len(
            req.kv_len, left, self.params.prefill_chunk, self.params.page_size, not req.chunks
        )

    def prefill_chunk(self, rid: int) -> list[Offer] | None:
        req = self.reqs[rid]
        start = req.kv_len
        n = self._chunk_len(req)
        end = start + n
        page = self.params.page_size
        need = -(-end // page) * page - -(-start // page) * page
        if self.kv_pool.available_size() + self.cache.full_evictable_size() < need + (
            page if page > 1 else 0
        ):
            return None  # the request waits for KV
        protected = req.kv.cache_protected_len
        with self._sglang():
            req.extend_range = ExtendRange(start, end)
            avail = self.slots.available_size()
            if avail < HEADROOM_SLOTS:
                self.cache.evict_for_alloc(self.sg.EvictParams(mamba_num=HEADROOM_SLOTS - avail))
            fresh_live = req.kv.mamba_pool_idx is None
            if self.req_pool.alloc([req]) is None:
                raise SuiteViolation(f"req {rid}: no request row, though admission counted one")
            if fresh_live:  # a fresh live slot is zeroed ("needs clear"): the state of no tokens
                self.stamps.clear(_slot(req.kv.mamba_pool_idx))  # type: ignore[arg-type]
            self._kv_for(need + (page if page > 1 else 0))
            if page == 1:
                out = self.kv_pool.alloc(n)
            else:
                last = int(self.req_pool.req_to_token[req.kv.req_pool_idx, start - 1]) if start % page else -1
                out = self.kv_pool.alloc_extend_one(start, end, last)
            if out is None:
                raise SuiteViolation(f"req {rid}: KV alloc failed after the room was checked")
            row = req.kv.req_pool_idx
            if req.chunks == 0:
                self.req_pool.write((row, slice(0, start)), req.prefix_indices)
            self.req_pool.write((row, slice(start, end)), out)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = end
            if self.extra_buffer:
                self._track_prefill(req, start, n)
            req.kv.mamba_needs_clear = False
            self.stamps.write(_slot(req.kv.mamba_pool_idx), req.tokens[:end])  # type: ignore[arg-type]
            req.chunks += 1
            offer = (req.extra_key, req.tokens[:end], self._row(req, end), protected)
            last_chunk = end == len(req.origin_input_ids)
            self.cache.cache_unfinished_req(req, chunked=not last_chunk)
        return [offer]

    def _track_prefill(self, req: _Req, start: int, n: int) -> None:
        """``_mamba_radix_cache_v2_req_prepare_for_extend``: the state at the last grid step of the chunk
        (or the branch point, on the chunk grid) goes to the next ping-pong entry; the model writes it."""
        if n < self.grid:
            return
        aligned = start + n // self.grid * self.grid
        kv = req.kv
        advance_track(self.req_pool, kv)
        branch = req.mamba_branching_seqlen
        if (
            branch is not None
            and start < branch < start + n
            and (branch - start) % self.params.state_chunk == 0
        ):
            aligned = branch
        kv.mamba_last_track_seqlen = aligned
        track = int(kv.mamba_ping_pong_track_buffer[kv.mamba_last_track_idx])  # type: ignore[index]
        self.stamps.write(track, req.tokens[:aligned])

    def decode(self, rid: int, token: int) -> list[Offer] | None:
        req = self.reqs[rid]
        kv = req.kv.kv_committed_len
        page = self.params.page_size
        need = page if kv % page == 0 else 0
        if self.kv_pool.available_size() + self.cache.full_evictable_size() < need:
            return None
        req.output_ids.append(token)
        with self._sglang():
            if page == 1:
                self._kv_for(1)
                out = self.kv_pool.alloc(1)
            else:
                self._kv_for(need)
                last = int(self.req_pool.req_to_token[req.kv.req_pool_idx, kv - 1])
                out = self.kv_pool.alloc_extend_one(kv, kv + 1, last)
            if out is None:
                raise SuiteViolation(f"req {rid}: decode KV alloc failed after the room was checked")
            self.req_pool.write((req.kv.req_pool_idx, kv), out)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = kv + 1
            self.stamps.write(_slot(req.kv.mamba_pool_idx), req.tokens[: kv + 1])  # type: ignore[arg-type]
            if self.extra_buffer and (kv + 1) % self.track_grid == 0:
                r = req.kv
                r.mamba_last_track_seqlen = kv + 1
                track = int(r.mamba_ping_pong_track_buffer[advance_track(self.req_pool, r)])  # type: ignore[index]
                self.stamps.write(track, req.tokens[: kv + 1])
        return []  # decode hands nothing to the tree (decoding_reqs suppresses cache_unfinished_req)

    def finish(self, rid: int, insert: bool) -> list[Offer]:
        req = self.reqs.pop(rid)
        kv_len = req.kv_len
        offer = (req.extra_key, req.tokens[:kv_len], self._row(req, kv_len), req.kv.cache_protected_len)
        with self._sglang():
            if req.kv.req_pool_idx is None:  # still waiting: drop the lock and the copy-on-write slot
                if req.kv.mamba_pool_idx is not None:
                    self.slots.free(req.kv.mamba_pool_idx.reshape(1))
                self.cache.dec_lock_ref(req.last_node)
                return [offer]
            self.cache.cache_finished_req(req, is_insert=insert, kv_len_to_handle=req.kv.kv_committed_len)
            self.req_pool.free(req)
        return [offer]

    def running(self) -> list[RunningView]:
        views = []
        for rid, req in sorted(self.reqs.items()):
            buf = req.kv.mamba_ping_pong_track_buffer
            views.append(
                RunningView(
                    rid=rid,
                    extra_key=req.extra_key,
                    tokens=req.tokens,
                    kv_len=req.kv_len,
                    protected_len=req.kv.cache_protected_len,
                    row=self._row(req, req.kv_len),
                    lock_node=req.last_node.id,
                    live_slot=_slot(req.kv.mamba_pool_idx),
                    track_slots=() if buf is None else tuple(int(s) for s in buf.tolist() if int(s) != -1),
                )
            )
        return views

    def eviction_totals(self) -> tuple[int, int]:
        """Tokens and states that left the tree in SGLang's ``evict`` so far, measured from its size
        counters around each call (its ``EvictResult`` does not count a leaf's state)."""
        return self.evicted[0], self.evicted[1]

    # ------------------------------------------------------------------------------------ faults
    def hold(self, pool: str, num: int) -> int:
        raise NotImplementedError("SGLangAdapter does not inject faults (no 'faults' capability)")

    def release_holds(self) -> None:
        pass  # nothing is ever held

    def fail_next_allocs(self, pool: str, count: int) -> None:
        raise NotImplementedError("SGLangAdapter does not inject faults (no 'faults' capability)")

    # ------------------------------------------------------------------------------------ observe
    def snapshot(self) -> TreeSnapshot:
        """Walk SGLang's tree from ``root_node``. O(resident tokens x depth)."""
        return snapshot_tree(
            self.cache,
            self.cache.root_node,
            self.params.page_size,
            lambda n: (n.key.extra_key, n.key.token_ids),
            lambda n: None if n.mamba_value is None else _slot(n.mamba_value),
        )

    def ownership(self) -> list[Ownership]:
        """Counting pools cannot list their allocations (``allocated=None``: compared by counts)."""
        tree_kv: list[int] = []
        tree_slots: list[int] = []
        stack = [self.cache.root_node]
        while stack:
            node = stack.pop()
            if node is not self.cache.root_node:
                tree_kv.extend(node.value.tolist())
                if node.mamba_value is not None:
                    tree_slots.append(_slot(node.mamba_value))  # type: ignore[arg-type]
            stack.extend(node.children.values())
        kv_owners: dict[str, list[int]] = {"tree": tree_kv}
        slot_owners: dict[str, list[int]] = {"tree": tree_slots}
        row_owners: dict[str, list[int]] = {}
        for rid, req in self.reqs.items():
            if req.kv.req_pool_idx is not None:
                kv_owners[f"req {rid}"] = list(self._row(req, req.kv_len)[req.kv.cache_protected_len :])
                row_owners[f"req {rid}"] = [req.kv.req_pool_idx]
            slot_owners[f"req {rid}"] = self._req_slots(req)
        page = self.params.page_size
        return [
            Ownership("KV", kv_owners, None, self.kv_pool.available_size(), self.kv_pool.size, page),
            Ownership("state slots", slot_owners, None, self.slots.available_size(), self.slots.size, 1, 1),
            Ownership(
                "request rows", row_owners, None, self.req_pool.available_size(), self.req_pool.size, 1, 0
            ),
        ]

    def read_stamp(self, slot: int) -> tuple[int, int]:
        return self.stamps.read(slot)

    def check_invariants(self, idle: bool = False) -> None:
        """SGLang's own ``sanity_check`` (its LRU lists; it asserts nothing is locked, so only when the
        tree is idle) and its size counters against zero."""
        c = self.cache
        sizes = (
            c.full_evictable_size(),
            c.full_protected_size(),
            c.mamba_evictable_size(),
            c.mamba_protected_size(),
        )
        if min(sizes) < 0:
            raise SuiteViolation(f"SGLang's size counters went negative: {sizes}")
        if idle:
            with self._sglang():
                c.sanity_check()

    def dump(self) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.sg.activated():
            self.cache.pretty_print()
        return out.getvalue()
