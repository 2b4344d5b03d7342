"""The adapter that drives :class:`mamba_radix.cache.MambaRadixCache` and its pools through the suite.

It builds a tiny cache from :class:`~mamba_radix.testing.adapter.SuiteParams` (pools of a few dozen KV
tokens and a handful of state slots, so eviction and slot exhaustion happen all the time), plays the part
of the model by stamping state slots (:mod:`mamba_radix.state_stamp`), and runs requests through the
cache's request lifecycle (:mod:`mamba_radix.lifecycle`: ``admit``, ``extend`` / ``commit`` per prefill
chunk and decode step, ``finish``), writing states exactly where each plan says. With capability
``"lifecycle_steps"`` it also exposes the two halves of a forward separately (``start_forward`` extends
and leaves the plan pending, ``commit_forward`` plays the model and commits), aborts with a plan pending,
SGLang's chunk cut, and every refused misuse as :class:`~mamba_radix.testing.adapter.Refused`, with
``lifecycle_state`` to show that a refusal changed nothing.

Before running a chunk or a decode step the adapter checks that the live state it starts from is the state
of exactly the tokens whose KV the request holds (a model would otherwise continue from garbage).

:func:`radix_params` is the Hypothesis strategy of configurations this cache accepts;
:func:`lifecycle_params` its paged-lifecycle variant (page sizes 1, 4 and 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from mamba_radix.cache import MambaRadixCache
from mamba_radix.config import DEFAULT_FLOP_CROSSOVER, DEFAULT_FLOP_WEIGHT, CacheConfig
from mamba_radix.errors import InvalidArgument, OutOfSlots
from mamba_radix.lifecycle import ForwardPlan
from mamba_radix.pools import HybridReqToTokenPool, KVAllocator, MambaPool, make_kv_allocator
from mamba_radix.request import Req
from mamba_radix.testing.adapter import (
    AdmitOutcome,
    EvictOutcome,
    InsertOutcome,
    LifecycleView,
    MatchOutcome,
    Offer,
    Ownership,
    PendingForward,
    Refused,
    RunningView,
    SuiteParams,
    TreeSnapshot,
    snapshot_tree,
)
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.faults import CapacityHold, FailNextAllocs
from mamba_radix.testing.params import suite_params
from mamba_radix.testing.stamps import expected_stamp
from mamba_radix.testing.value_stamps import StateStamps
from mamba_radix.tree import RadixKey

__all__ = [
    "CHECKPOINT_FORMATS",
    "LIFECYCLE_PAGE_SIZES",
    "MambaRadixAdapter",
    "RadixSuiteParams",
    "lifecycle_params",
    "radix_params",
]

# Request rows are this wide: a request's tokens (a prompt of <= 32 and <= 12 outputs; a retracted one comes
# back with its outputs so far in its prompt, the same 44 in all), plus room for the refused probes' decode
# spans up to the next boundary (<= 3 pages of 16 + 1) past that, so that such a probe is refused for
# crossing the boundary, not for the row's width.
MAX_CONTEXT = 128
LIFECYCLE_PAGE_SIZES: tuple[int, ...] = (1, 4, 16)
_NO_SLOT = -1
CHECKPOINT_FORMATS: tuple[str, ...] = ("model", "int8", "fp8_e4m3")
# Checkpoint-pool sizes drawn for a quantized format: None is the default (twice the state slots); the
# small ones make the checkpoint pool the one under pressure (hand-overs evict checkpoints there).
_CHECKPOINT_SLOTS: tuple[int | None, ...] = (None, 2, 4)


@dataclass(frozen=True)
class RadixSuiteParams(SuiteParams):
    """:class:`SuiteParams` plus the knobs only this cache has: ``eviction_order`` and ``lru_refresh``
    (``mamba_eviction_order`` / ``mamba_lru_refresh``), the peers' policies (DESIGN.md §9):
    ``checkpoint_admission`` (``mamba_checkpoint_admission``), ``flop_weight`` and ``flop_crossover``
    (``mamba_flop_weight`` / ``mamba_flop_crossover``, used by ``eviction_order="flop_weighted"``),
    ``slot_headroom`` and ``decode_insert`` (``mamba_slot_headroom`` / ``mamba_decode_insert``, the SGLang
    release switches; ``kv_only_leaves`` is a :class:`SuiteParams` field), ``skip_decode_lock`` (SGLang's
    ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``: hand-over locks are KV-only), ``checkpoint_format`` and
    ``checkpoint_slots`` (the tree's checkpoints quantized in their own pool; stamps are then value stamps,
    :mod:`mamba_radix.testing.value_stamps`). A plain :class:`SuiteParams` runs with the defaults."""

    eviction_order: str = "leaf_first"
    lru_refresh: str = "node"
    checkpoint_admission: str = "all"
    flop_weight: float = DEFAULT_FLOP_WEIGHT
    flop_crossover: int = DEFAULT_FLOP_CROSSOVER
    slot_headroom: str = "exact"
    decode_insert: bool = False
    skip_decode_lock: bool = False
    checkpoint_format: str = "model"
    checkpoint_slots: int | None = None


@st.composite
def radix_params(
    draw: st.DrawFn,
    strategies: Sequence[str] = ("no_buffer", "extra_buffer", "extra_buffer_lazy"),
    page_sizes: Sequence[int] = (1, 2, 4),
    caps: Sequence[int] = (-1, -1, 1, 2, 3),
    checkpoint_formats: Sequence[str] = ("model",),
    **suite: Any,
) -> SuiteParams:
    """Valid, tiny configurations of :class:`MambaRadixCache`: :func:`suite_params` (the shared rules:
    no_buffer needs page size 1 and runs without overlap; lazy needs overlap; the track interval is a
    page multiple; ``suite``: more of its arguments) plus this cache's own knobs (branch-and-end admission needs extra_buffer). The FLOP
    crossover is drawn down to a few tokens so the quadratic term matters for these short sequences.
    ``checkpoint_formats``: the formats drawn from (with a quantized one, also the checkpoint pool's size);
    the default ``("model",)`` draws nothing, so existing machines keep their examples."""
    formats = tuple(checkpoint_formats)
    if not formats or any(f not in CHECKPOINT_FORMATS for f in formats):
        raise InvalidArgument(
            f"checkpoint_formats must be a non-empty subset of {CHECKPOINT_FORMATS}, got {formats}"
        )
    base = draw(suite_params(strategies=strategies, page_sizes=page_sizes, caps=caps, **suite))
    fields = {k: getattr(base, k) for k in SuiteParams.__dataclass_fields__}
    return RadixSuiteParams(
        **fields,
        eviction_order=draw(st.sampled_from(["leaf_first", "root_first", "mixed", "flop_weighted"])),
        lru_refresh=draw(st.sampled_from(["node", "path"])),
        checkpoint_admission="all"
        if base.strategy == "no_buffer"
        else draw(st.sampled_from(["all", "branch_and_end"])),
        flop_weight=draw(st.sampled_from([0.0, 0.5, 2.0, DEFAULT_FLOP_WEIGHT])),
        flop_crossover=draw(st.sampled_from([1, 4, DEFAULT_FLOP_CROSSOVER])),
        slot_headroom=draw(st.sampled_from(["exact", "per_chunk"])),
        decode_insert=draw(st.booleans()),
        skip_decode_lock=draw(st.booleans()),
        **_draw_checkpoint_format(draw, formats),
    )


def _draw_checkpoint_format(draw: st.DrawFn, formats: tuple[str, ...]) -> dict[str, Any]:
    """``checkpoint_format`` (and ``checkpoint_slots`` for a quantized one) drawn from ``formats``; no draw
    at all for a single format, so that adding the choice changed no existing machine's examples."""
    fmt = formats[0] if len(formats) == 1 else draw(st.sampled_from(formats))
    if fmt == "model":
        return {"checkpoint_format": fmt}
    return {"checkpoint_format": fmt, "checkpoint_slots": draw(st.sampled_from(_CHECKPOINT_SLOTS))}


def lifecycle_params(
    strategies: Sequence[str] = ("no_buffer", "extra_buffer", "extra_buffer_lazy"),
    page_sizes: Sequence[int] = LIFECYCLE_PAGE_SIZES,
    **suite: Any,
) -> st.SearchStrategy[SuiteParams]:
    """:func:`radix_params` for the paged-lifecycle machine: page sizes 1, 4 and 16 (no_buffer: 1), KV
    pools of 16-64 tokens, and of 48-96 tokens (3-6 pages) at page size 16, so that a prompt of up to
    32 tokens and 12 outputs (3 pages) fits, two or three requests (rows) compete, and the tree evicts."""
    suite.setdefault("kv_tokens", (16, 64))
    suite.setdefault("req_rows", (2, 3))
    suite.setdefault("kv_tokens_by_page", {16: (48, 96)})
    return radix_params(strategies=strategies, page_sizes=page_sizes, **suite)


class MambaRadixAdapter:
    """:class:`~mamba_radix.testing.adapter.CacheAdapter` for our cache, pools and engine protocol."""

    capabilities = frozenset(
        {
            "requests",
            "cow",
            "extra_key",
            "faults",
            "branching",
            "full_kv_hit_len",
            "exact_evict_report",
            "partial_page_keys",
            "eviction_totals",
            "lifecycle_steps",
        }
    )

    def __init__(self, params: SuiteParams) -> None:
        self.params = params
        self.config = CacheConfig(
            page_size=params.page_size,
            mamba_radix_cache_strategy=params.strategy,  # type: ignore[arg-type]
            disable_overlap_schedule=not params.overlap,
            mamba_track_interval=params.track_interval,
            mamba_cache_chunk_size=params.state_chunk,
            mamba_max_states_per_path=params.max_states_per_path,
            mamba_eviction_order=getattr(params, "eviction_order", "leaf_first"),  # type: ignore[arg-type]
            mamba_lru_refresh=getattr(params, "lru_refresh", "node"),  # type: ignore[arg-type]
            chunked_prefill_size=params.prefill_chunk,
            mamba_checkpoint_admission=getattr(params, "checkpoint_admission", "all"),  # type: ignore[arg-type]
            mamba_flop_weight=getattr(params, "flop_weight", DEFAULT_FLOP_WEIGHT),
            mamba_flop_crossover=getattr(params, "flop_crossover", DEFAULT_FLOP_CROSSOVER),
            mamba_kv_only_leaves=params.kv_only_leaves,
            mamba_slot_headroom=getattr(params, "slot_headroom", "exact"),  # type: ignore[arg-type]
            mamba_decode_insert=getattr(params, "decode_insert", False),
            skip_decode_lock=getattr(params, "skip_decode_lock", False),
            checkpoint_format=getattr(params, "checkpoint_format", "model"),  # type: ignore[arg-type]
            checkpoint_slots=getattr(params, "checkpoint_slots", None),
        )
        page = params.page_size
        fmt = self.config.checkpoint_format
        # Two conv tensors (bf16) and a temporal one (fp32): a copy or restore that skips a tensor or a
        # layer leaves inconsistent stamps, which the stamp reader reports. Raw stamps need >= 16 bytes per
        # layer row; value stamps (quantized formats) 32 payload elements per layer's slot, so one
        # quantization row of 64 elements each (value_stamps.py).
        conv, temporal = ([(2, 4), (4, 2)], (2, 2, 2)) if fmt == "model" else ([(2, 32), (4, 16)], (2, 4, 8))
        self.mamba_pool: MambaPool
        self.allocator: KVAllocator
        self.cache: MambaRadixCache
        self._build(params, conv, temporal)
        self.stamps = StateStamps(fmt, self.mamba_pool)
        # Under a quantized format the tree's checkpoints are slots of cache.checkpoint_pool, another id
        # space than the state slots. The suite sees one id space: checkpoint slot k is suite slot
        # ckpt_base + k (above every state slot), so snapshots, hits and reads never mix the two.
        self.checkpoint_pool = self.cache.checkpoint_pool
        self.ckpt_base = self.mamba_pool.size
        self.reqs: dict[int, Req] = {}
        # Finished requests stay nameable: the misuse probes finish, extend or commit them again. O(1) each.
        self.gone: dict[int, Req] = {}
        # rid -> the newest plan it extended (the stale-commit probe, once committed or aborted)
        self.newest_plan: dict[int, ForwardPlan] = {}
        self.raw_locks = 0  # locks taken through lock(), outside any request
        self.kv_hold = CapacityHold(self.allocator.alloc, self.allocator.free)
        self.state_hold = CapacityHold(self.mamba_pool.alloc, self.mamba_pool.free)
        kv_methods = ["alloc"] if page == 1 else ["alloc", "alloc_extend"]
        self.kv_faults = [FailNextAllocs(self.allocator, m) for m in kv_methods]
        self.state_faults = [FailNextAllocs(self.mamba_pool, "alloc")]
        if self.checkpoint_pool is not None:  # a hand-over's checkpoint slot is state memory too
            self.state_faults.append(FailNextAllocs(self.checkpoint_pool, "alloc"))

    def _build(self, params: SuiteParams, conv: list[tuple[int, ...]], temporal: tuple[int, ...]) -> None:
        """Build ``mamba_pool`` (``conv`` / ``temporal`` inner shapes, two layers), ``req_pool``,
        ``allocator`` and ``cache`` for ``params`` and ``self.config`` (a subclass builds other pools)."""
        self.mamba_pool = MambaPool(params.state_slots, 2, conv, temporal, conv_dtypes=torch.bfloat16)
        self.req_pool = HybridReqToTokenPool(params.req_rows, MAX_CONTEXT, self.mamba_pool, self.config)
        self.allocator = make_kv_allocator(params.kv_pages * params.page_size, params.page_size)
        self.cache = MambaRadixCache(self.config, self.req_pool, self.allocator)

    # ------------------------------------------------------------------------------------ helpers
    def _tree_size(self) -> tuple[int, int]:
        c = self.cache
        return (
            c.full_evictable_size() + c.full_protected_size(),
            c.mamba_evictable_size() + c.mamba_protected_size(),
        )

    def _stamp(self, slot: int, tokens: Sequence[int]) -> None:
        self.stamps.write(slot, *expected_stamp(tuple(tokens)))

    def _suite_slot(self, tree_slot: int | None) -> int | None:
        """A node's checkpoint slot as the suite names it (see ``ckpt_base``). O(1)."""
        if tree_slot is None or self.checkpoint_pool is None:
            return tree_slot
        return self.ckpt_base + int(tree_slot)

    def _row(self, req: Req, upto: int) -> tuple[int, ...]:
        assert req.req_pool_idx is not None
        return tuple(self.req_pool.req_to_token[req.req_pool_idx, :upto].tolist())

    def _check_live(self, req: Req) -> None:
        """The model is about to continue from the live slot: it must hold the state at ``kv_len``."""
        assert req.mamba_pool_idx is not None
        got = self.stamps.read(req.mamba_pool_idx)
        want = expected_stamp(tuple(req.token_ids(req.kv_len)))
        if got != want:
            raise SuiteViolation(
                f"req {req.rid}: the model would continue from live slot {req.mamba_pool_idx} holding {got}, "
                f"but its KV covers {req.kv_len} tokens {want}"
            )

    def _commit(self, plan: ForwardPlan) -> None:
        """Play the model for ``plan`` (stamp the end state into the live slot and the tracked state into
        the track slot), commit it, then check that the hand-over made progress: unless the cache reports
        the checkpoint skipped for want of a slot, the request's protected prefix now ends at the state it
        handed over (a cache that silently never caches would otherwise pass every other check)."""
        req = plan.req
        self._stamp(plan.live_slot, req.token_ids(plan.end))
        if plan.track_slot is not None:
            assert plan.track_len is not None
            self._stamp(plan.track_slot, req.token_ids(plan.track_len))
        if plan.is_prefill:
            handed = plan.track_len if self.cache.buffer.tracks else plan.end
        else:
            handed = plan.track_len if self.config.mamba_decode_insert else None
        protected, skipped = req.cache_protected_len, self.cache.stats.checkpoints_skipped
        self.cache.commit(plan)
        self.newest_plan[req.rid] = plan
        if handed is None or handed <= protected or self.cache.stats.checkpoints_skipped > skipped:
            return
        if req.cache_protected_len != handed:
            raise SuiteViolation(
                f"req {req.rid}: a hand-over of the state at {handed} tokens left the protected prefix at "
                f"{req.cache_protected_len}"
            )

    def _offer(self, req: Req, upto: int | None = None) -> Offer:
        """What ``req`` holds up to ``upto`` tokens (its ``kv_len`` by default): tokens, row, protected."""
        end = req.kv_len if upto is None else upto
        return (req.extra_key, tuple(req.token_ids(end)), self._row(req, end), req.cache_protected_len)

    # ------------------------------------------------------------------------------------ tree ops
    def insert(self, extra_key: Any, tokens: Sequence[int]) -> InsertOutcome | None:
        """Allocate KV and a stamped state slot and ``cache.insert`` them. Under a quantized format the
        caller makes room in the checkpoint pool first (the public insert evicts nothing; ``OutOfSlots``
        if it is full, then this returns ``None`` with everything given back), and the slot reported is
        the checkpoint slot the cache quantized into (the one checkpoint slot the call left allocated)."""
        before = self._tree_size()
        kv = self.cache.alloc_token_slots(len(tokens))
        if kv is None:
            return None
        slot = self.cache.alloc_state_slot()
        if slot is None:
            self.allocator.free(kv)
            return None
        self._stamp(slot, tokens)
        ckpt = self.checkpoint_pool
        if ckpt is not None and ckpt.available_size() == 0:
            self.cache.evict(num_states=1)
        held = set() if ckpt is None else set(ckpt.allocated_slots().tolist())
        evicted = self._tree_size() != before
        try:
            res = self.cache.insert(RadixKey(tuple(tokens), extra_key), kv, slot)
        except OutOfSlots:  # every checkpoint locked: nothing changed, the caller gives its memory back
            self.mamba_pool.free([slot])
            self.allocator.free(kv)
            return None
        if res.mamba_exists:
            self.mamba_pool.free([slot])
        reported = slot
        if ckpt is not None and not res.mamba_exists:
            fresh = set(ckpt.allocated_slots().tolist()) - held
            if len(fresh) != 1:
                raise SuiteViolation(
                    f"insert {tokens}: checkpoint slots {sorted(fresh)} newly allocated, expected one"
                )
            reported = self.ckpt_base + fresh.pop()
        return InsertOutcome(res.prefix_len, res.mamba_exists, tuple(kv.tolist()), reported, evicted)

    def match(self, extra_key: Any, tokens: Sequence[int], cow: bool) -> MatchOutcome:
        req = Req(rid="match", origin_input_ids=list(tokens), extra_key=extra_key) if cow else None
        skipped = self.cache.stats.cow_skipped
        m = self.cache.match_prefix(RadixKey(tuple(tokens), extra_key), cow_mamba=cow, req=req)
        cow_stamp = None
        if req is not None and req.mamba_pool_idx is not None:
            cow_stamp = self.stamps.read(req.mamba_pool_idx)
            self.mamba_pool.free([req.mamba_pool_idx])
        return MatchOutcome(
            hit_len=len(m.device_indices),
            kv_indices=tuple(m.device_indices.tolist()),
            node=m.last_node,
            slot=self._suite_slot(m.mamba_slot),
            full_kv_hit_len=m.full_kv_hit_len,
            branching_seqlen=m.mamba_branching_seqlen,
            cow_stamp=cow_stamp,
            cow_skipped=self.cache.stats.cow_skipped > skipped,
        )

    def lock(self, node: Any) -> None:
        self.cache.inc_lock_ref(node)
        self.raw_locks += 1

    def unlock(self, node: Any) -> None:
        self.cache.dec_lock_ref(node)
        self.raw_locks -= 1

    def evict(self, num_tokens: int, num_states: int) -> EvictOutcome:
        res = self.cache.evict(num_tokens=num_tokens, num_states=num_states)
        return EvictOutcome(res.num_tokens, res.num_states)

    # ------------------------------------------------------------------------------------ requests
    def admit(
        self, rid: int, extra_key: Any, input_ids: Sequence[int], max_new_tokens: int | None = None
    ) -> AdmitOutcome | None:
        """:meth:`MambaRadixCache.admit`: match on ``input[:-1]`` with copy-on-write, lock, make room,
        allocate, write the hit into the row, reserve the output's KV; or refuse with nothing changed
        (injected allocation faults included: the pools' allocation is transactional)."""
        req = Req(rid=rid, origin_input_ids=list(input_ids), extra_key=extra_key)
        skipped = self.cache.stats.cow_skipped
        admitted = self.cache.admit(req, max_new_tokens)
        if not admitted:
            if req.mamba_pool_idx is not None or req.last_node is not None or req.req_pool_idx is not None:
                raise SuiteViolation(
                    f"admit {rid}: a refused admission left the request holding slot {req.mamba_pool_idx}, "
                    f"lock {req.last_node} or row {req.req_pool_idx}"
                )
            return None
        self.reqs[rid] = req
        assert req.mamba_pool_idx is not None
        if req.kv_len != req.cache_protected_len or self._row(req, req.kv_len) != tuple(
            req.prefix_indices.tolist()
        ):
            raise SuiteViolation(f"admit {rid}: kv_len / row do not start at the hit's indices")
        stamp = self.stamps.read(req.mamba_pool_idx)
        return AdmitOutcome(rid, req.cache_protected_len, stamp, self.cache.stats.cow_skipped > skipped)

    def in_prefill(self, rid: int) -> bool:
        req = self.reqs[rid]
        return req.kv_len < len(req.origin_input_ids)

    def prefill_chunk(self, rid: int) -> list[Offer] | None:
        req = self.reqs[rid]
        self._check_live(req)
        plan = self.cache.extend(req, min(self.params.prefill_chunk, len(req.origin_input_ids) - req.kv_len))
        if plan is None:
            return None
        offer = self._offer(req, plan.end)
        self._commit(plan)
        return [offer]

    def decode(self, rid: int, token: int) -> list[Offer] | None:
        req = self.reqs[rid]
        self._check_live(req)
        req.output_ids.append(token)
        plan = self.cache.extend(req, 1)
        if plan is None:
            req.output_ids.pop()
            return None
        offer = self._offer(req, plan.end)
        self._commit(plan)
        return [offer] if self.config.mamba_decode_insert and plan.track_len is not None else []

    def finish(self, rid: int, insert: bool) -> list[Offer]:
        out = self._finish(rid, insert)
        if isinstance(out, Refused):
            raise SuiteViolation(f"finish {rid} (insert={insert}) was refused: {out.reason}")
        return out

    def finish_step(self, rid: int, insert: bool) -> list[Offer] | Refused:
        """:meth:`MambaRadixCache.finish` of request ``rid`` (running or finished already); a refusal
        (``insert=True`` with a plan pending, a request finished twice) is returned, nothing changed here."""
        return self._finish(rid, insert)

    def _finish(self, rid: int, insert: bool) -> list[Offer] | Refused:
        req = self._req(rid)
        running = rid in self.reqs
        offer = self._offer(req) if running else None
        cache_len, protected = self.cache.buffer.checkpoint_len(req), req.cache_protected_len
        skipped = self.cache.stats.checkpoints_skipped
        try:
            self.cache.finish(req, insert=insert)
        except InvalidArgument as exc:
            return Refused("finish", str(exc))
        if running:
            self.gone[rid] = self.reqs.pop(rid)
        # under a quantized format the finish hand-over needs a checkpoint slot and may skip (counted)
        handed = self.cache.stats.checkpoints_skipped == skipped
        if insert and handed and req.mamba_lazy_is_insert and cache_len is not None and cache_len > protected:
            key = (req.extra_key, tuple(req.token_ids(cache_len)))
            if key not in self.snapshot().checkpoints:
                raise SuiteViolation(
                    f"finish {rid}: no checkpoint at {cache_len} tokens after cache_finished_req"
                )
        return [] if offer is None else [offer]

    # ------------------------------------------------------------------------ lifecycle steps
    def _req(self, rid: int) -> Req:
        """Running request ``rid``, else the finished one (KeyError if neither)."""
        req = self.reqs.get(rid)
        return self.gone[rid] if req is None else req

    def lifecycle_view(self, rid: int) -> LifecycleView:
        req = self.reqs[rid]
        plan = req.pending_plan
        prompt = len(req.origin_input_ids)
        boundary = self.cache.buffer.next_decode_boundary(req.kv_len) if req.kv_len >= prompt else None
        pending = None if plan is None else PendingForward(rid, plan.start, plan.end, plan.is_prefill)
        return LifecycleView(rid, prompt, req.kv_len, req.seq_len, pending, boundary)

    def prefill_chunk_len(self, rid: int, budget: int) -> int:
        return self.cache.prefill_chunk_len(self.reqs[rid], budget)

    def can_admit(
        self, extra_key: Any, input_ids: Sequence[int], max_new_tokens: int | None
    ) -> tuple[bool, str | None]:
        """:meth:`MambaRadixCache.can_admit` for a fresh request of ``input_ids``. Read-only."""
        check = self.cache.can_admit(
            Req(rid="can_admit", origin_input_ids=list(input_ids), extra_key=extra_key), max_new_tokens
        )
        return check.ok, check.reason

    def start_forward(
        self, rid: int, num_tokens: int, sampled: Sequence[int] = ()
    ) -> PendingForward | Refused | None:
        """Append ``sampled`` to the request's outputs and :meth:`MambaRadixCache.extend` it by
        ``num_tokens``; the plan stays pending (``req.pending_plan``). On a refusal or a KV shortage the
        sampled tokens are taken back, so the request is as before. A finished request is extended too
        (a misuse probe: the cache must refuse)."""
        req = self._req(rid)
        if rid in self.reqs:
            self._check_live(req)
        req.output_ids.extend(sampled)
        try:
            plan = self.cache.extend(req, num_tokens)
        except InvalidArgument as exc:
            del req.output_ids[len(req.output_ids) - len(sampled) :]
            return Refused("extend", str(exc))
        if plan is None:
            del req.output_ids[len(req.output_ids) - len(sampled) :]
            return None
        self.newest_plan[rid] = plan
        return PendingForward(rid, plan.start, plan.end, plan.is_prefill)

    def commit_forward(self, rid: int) -> list[Offer]:
        """Play the model for the pending plan and commit it (:meth:`_commit`); the offers as
        :meth:`prefill_chunk` / :meth:`decode` report them."""
        req = self.reqs[rid]
        plan = req.pending_plan
        if plan is None:
            raise SuiteViolation(f"commit_forward {rid}: no plan is pending")
        offer = self._offer(req, plan.end)
        self._commit(plan)
        if plan.is_prefill or (self.config.mamba_decode_insert and plan.track_len is not None):
            return [offer]
        return []

    def recommit(self, rid: int) -> list[Offer] | Refused | None:
        """Commit the newest plan request ``rid`` extended, with none pending (stale: committed already, or
        its request finished since, an aborted forward's plan included); ``None`` if it extended none."""
        plan = self.newest_plan.get(rid)
        if plan is None:
            return None
        try:
            self.cache.commit(plan)
        except InvalidArgument as exc:
            return Refused("commit", str(exc))
        return [self._offer(plan.req)] if rid in self.reqs else []

    def _request_state(self, req: Req) -> dict[str, Any]:
        """Every field of ``req`` the lifecycle may write, and its request row, as plain data. O(row)."""
        plan = req.pending_plan
        row = None
        if req.req_pool_idx is not None:
            row = tuple(self.req_pool.req_to_token[req.req_pool_idx].tolist())
        return {
            "kv_len": req.kv_len,
            "pending_plan": None
            if plan is None
            else (
                id(plan),
                plan.start,
                plan.end,
                tuple(plan.kv_indices.tolist()),
                plan.live_slot,
                plan.track_slot,
                plan.track_len,
                plan.is_prefill,
            ),
            "prefill_chunks": req.prefill_chunks,
            "mamba_next_track_idx": req.mamba_next_track_idx,
            "mamba_last_track_seqlen": req.mamba_last_track_seqlen,
            "cache_protected_len": req.cache_protected_len,
            "kv_reserved_tokens": req.kv_reserved_tokens,
            "mamba_pool_idx": req.mamba_pool_idx,
            "track_buffer": None
            if req.mamba_ping_pong_track_buffer is None
            else tuple(req.mamba_ping_pong_track_buffer),
            "mamba_lazy_is_insert": req.mamba_lazy_is_insert,
            "req_pool_idx": req.req_pool_idx,
            "row": row,
            "last_node": None if req.last_node is None else req.last_node.id,
            "lock_covers_checkpoint": self.cache.lock_covers_checkpoint(req),
            "output_ids": tuple(req.output_ids),
            "finished": req.finished,
        }

    def lifecycle_state(self) -> dict[str, Any]:
        """The tree (its dump: nodes, KV spans, slots, locks, recency stamps, clock; and its resident
        pages), the pools (free counts and allocated ids), the cache's size counters, ``reserved_kv_tokens``
        and stats, and every request's fields and row, running or finished. O(tree + pools + rows)."""
        cache = self.cache
        rows = self.req_pool
        return {
            "tree": cache.pretty_print(),
            "resident": self.snapshot().kv,
            "kv pool": (self.allocator.available_size(), tuple(self.allocator.allocated_indices().tolist())),
            "state pool": (
                self.mamba_pool.available_size(),
                tuple(self.mamba_pool.allocated_slots().tolist()),
            ),
            "checkpoint pool": None
            if self.checkpoint_pool is None
            else (
                self.checkpoint_pool.available_size(),
                tuple(self.checkpoint_pool.allocated_slots().tolist()),
                self.checkpoint_pool.stores,
                self.checkpoint_pool.loads,
            ),
            "request rows": (
                rows.available_size(),
                tuple(r for r in range(1, rows.size + 1) if rows.is_row_allocated(r)),
                tuple(rows.reserved_slots()),
            ),
            "sizes": (
                cache.full_evictable_size(),
                cache.full_protected_size(),
                cache.mamba_evictable_size(),
                cache.mamba_protected_size(),
            ),
            "reserved_kv_tokens": cache.reserved_kv_tokens,
            "stats": asdict(cache.stats),
            "requests": {
                rid: self._request_state(req) for rid, req in sorted({**self.gone, **self.reqs}.items())
            },
        }

    def running(self) -> list[RunningView]:
        views = []
        for rid, req in sorted(self.reqs.items()):
            assert req.last_node is not None
            track = tuple(s for s in (req.mamba_ping_pong_track_buffer or []) if s != _NO_SLOT)
            views.append(
                RunningView(
                    rid=rid,
                    extra_key=req.extra_key,
                    tokens=tuple(req.all_token_ids),
                    kv_len=req.kv_len,
                    protected_len=req.cache_protected_len,
                    row=self._row(req, req.kv_len),
                    lock_node=req.last_node.id,
                    live_slot=req.mamba_pool_idx,
                    track_slots=track,
                    lock_covers_checkpoint=self.cache.lock_covers_checkpoint(req),
                )
            )
        return views

    # ------------------------------------------------------------------------------------ faults
    def hold(self, pool: str, num: int) -> int:
        if pool == "kv":
            page = self.params.page_size
            return self.kv_hold.take(num * page) // page
        return self.state_hold.take(num)

    def release_holds(self) -> None:
        as_tensor = lambda ids: torch.tensor(ids, dtype=torch.int64)  # noqa: E731
        self.kv_hold.release(as_tensor)
        self.state_hold.release(as_tensor)

    def fail_next_allocs(self, pool: str, count: int) -> None:
        for fault in self.kv_faults if pool == "kv" else self.state_faults:
            fault.arm(count)

    # ------------------------------------------------------------------------------------ observe
    def snapshot(self) -> TreeSnapshot:
        """Walk the tree (not ``match``) and list its content. O(resident tokens x depth)."""
        return snapshot_tree(
            self.cache,
            self.cache.tree.root,
            self.params.page_size,
            lambda n: (n.extra_key, n.key),
            lambda n: self._suite_slot(None if n.mamba_slot is None else int(n.mamba_slot)),
        )

    def ownership(self) -> list[Ownership]:
        tree_kv: list[int] = []
        tree_slots: list[int] = []
        for node in self.cache.tree.nodes():
            tree_kv.extend(node.value.tolist())
            if node.mamba_slot is not None:
                tree_slots.append(int(node.mamba_slot))
        kv_owners: dict[str, list[int]] = {"tree": tree_kv, "fault": list(self.kv_hold.held)}
        # quantized: the tree's checkpoints are the checkpoint pool's (their own record below)
        slot_owners: dict[str, list[int]] = {
            "tree": tree_slots if self.checkpoint_pool is None else [],
            "fault": list(self.state_hold.held),
        }
        row_owners: dict[str, list[int]] = {}
        for rid, req in self.reqs.items():
            # an extend not committed yet owns its KV too (paged: it may continue the last partial page)
            end = req.kv_len if req.pending_plan is None else req.pending_plan.end
            kv_owners[f"req {rid}"] = list(self._row(req, end)[req.cache_protected_len :])
            held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
            held += [s for s in (req.mamba_ping_pong_track_buffer or []) if s != _NO_SLOT]
            slot_owners[f"req {rid}"] = held
            row_owners[f"req {rid}"] = [] if req.req_pool_idx is None else [req.req_pool_idx]
        rows = self.req_pool
        # quantized: the checkpoint pool's record first
        records = [] if self.checkpoint_pool is None else [self._checkpoint_ownership(tree_slots)]
        return [
            *records,
            Ownership(
                "KV",
                kv_owners,
                self.allocator.allocated_indices().tolist(),
                self.allocator.available_size(),
                self.allocator.size,
                self.params.page_size,
            ),
            Ownership(
                "state slots",
                slot_owners,
                self.mamba_pool.allocated_slots().tolist(),
                self.mamba_pool.available_size(),
                self.mamba_pool.size,
            ),
            Ownership(
                "request rows",
                row_owners,
                [r for r in range(1, rows.size + 1) if rows.is_row_allocated(r)],
                rows.available_size(),
                rows.size,
            ),
        ]

    def _checkpoint_ownership(self, tree_slots: list[int]) -> Ownership:
        """Quantized formats: the checkpoint pool's slots, every one the tree's (its own ids)."""
        pool = self.checkpoint_pool
        assert pool is not None
        return Ownership(
            "checkpoint slots",
            {"tree": tree_slots},
            pool.allocated_slots().tolist(),
            pool.available_size(),
            pool.size,
        )

    def read_stamp(self, slot: int) -> tuple[int, int]:
        """The stamp suite slot ``slot`` holds: a state slot's, or (above ``ckpt_base``, quantized
        formats) the stamp a checkpoint restores to, read through the format's dequantization."""
        if self.checkpoint_pool is not None and slot > self.ckpt_base:
            return self.stamps.read_checkpoint(self.checkpoint_pool, slot - self.ckpt_base)
        return self.stamps.read(slot)

    def eviction_totals(self) -> tuple[int, int]:
        """Tokens and states the cache's eviction removed so far (``CacheStats``)."""
        return self.cache.stats.tokens_evicted, self.cache.stats.states_evicted

    def check_invariants(self, idle: bool = False) -> None:
        """The cache's own check, plus the request pool's slot mirror against the requests' fields.

        The cache's request checks need every holder of memory and of locks, so the running requests are
        passed only while no capacity is held away by the fault injector and no lock is held outside a
        request (neither of which the cache can know of).
        """
        complete = not (self.kv_hold.held or self.state_hold.held or self.raw_locks)
        if idle and (self.reqs or self.raw_locks):
            raise SuiteViolation(f"told the tree is idle, but {len(self.reqs)} requests run here")
        if idle and (self.cache.full_protected_size() or self.cache.mamba_protected_size()):
            raise SuiteViolation(
                f"idle tree still protects {self.cache.full_protected_size()} tokens and "
                f"{self.cache.mamba_protected_size()} states: a lock leaked"
            )
        self.cache.check_invariants(list(self.reqs.values()) if complete else None)
        held = sorted(
            s
            for req in self.reqs.values()
            for s in [req.mamba_pool_idx or 0, *(req.mamba_ping_pong_track_buffer or [])]
            if s > 0
        )
        if self.req_pool.reserved_slots() != held:
            raise SuiteViolation(
                f"HybridReqToTokenPool thinks requests hold slots {self.req_pool.reserved_slots()}, "
                f"their fields say {held}"
            )

    def dump(self) -> str:
        return self.cache.pretty_print()
