"""The reference serving loop: a transformers hybrid model served through our pools and cache.

What the engine owns: the model, the full-attention KV storage (written at the indices the cache hands
out), the waiting queue and the schedule (FIFO admission, round-robin steps, chunked prefill, greedy
decode), sampling and stop conditions. What the cache owns: every allocation and free of KV indices,
request rows and state slots, the match (with the copy-on-write of the hit's checkpoint into the live
slot, through :mod:`mamba_radix.state_ops`), where checkpoints are tracked, what goes to the tree, and
eviction. The engine calls only the lifecycle API: :meth:`~MambaRadixCache.can_admit`, ``admit``,
``extend``, ``commit`` and ``finish``; per forward it does exactly what the :class:`ForwardPlan` says.

One step: admit waiting requests in arrival order while they fit, then run one forward for every running
request (a prefill chunk of at most ``chunked_prefill_size`` tokens, or one decode token), so several
requests are in flight at once. Each forward is a separate model call (batch size 1): batching changes
no cache call, only the model's arithmetic.

:func:`greedy_reference` is the cache-free oracle: plain transformers forwards of the whole sequence.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mamba_radix.cache import MambaRadixCache
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument
from mamba_radix.lifecycle import ForwardPlan
from mamba_radix.pools import HybridReqToTokenPool, make_kv_allocator
from mamba_radix.reference_engine.models import HybridModel, SlotState
from mamba_radix.request import Req

__all__ = [
    "CheckpointAudit",
    "EngineStats",
    "ForwardRecord",
    "ReferenceEngine",
    "audit_checkpoints",
    "greedy_reference",
]


@dataclass
class EngineStats:
    """Counters of one engine since construction. Token counts are tokens the model computed."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0  # prompt tokens restored from the cache at admission (not computed)
    prefill_tokens: int = 0  # prompt tokens the model computed
    decode_tokens: int = 0
    forwards: int = 0
    model_s: float = 0.0  # wall time inside the model


@dataclass(frozen=True)
class ForwardRecord:
    """One model call, for tests and audits: the plan's span, the request's hit at admission and the
    logits of the span's tokens (``[end - start, vocab]``)."""

    rid: Any
    start: int
    end: int
    hit_len: int
    track_len: int | None
    is_prefill: bool
    logits: torch.Tensor


@dataclass(eq=False)
class _Running:
    req: Req
    max_new_tokens: int
    hit_len: int = 0


class ReferenceEngine:
    """Serve greedy generations of ``model`` with prefix caching through ``cache``.

    Build it with :meth:`build` (fresh pools sized for the model), or pass a cache whose
    :class:`MambaPool` has the model's shapes (``model.new_mamba_pool``) and a KV storage from
    ``model.new_kv_pool`` with as many rows as the cache's allocator.

    ``chunked_prefill_size``: the most prompt tokens one forward computes (``config.chunked_prefill_size``
    by default; -1: the whole uncached prompt). ``eos_token_id``: generation stops after sampling it.
    ``record``: keep a :class:`ForwardRecord` of every forward in :attr:`records`. ``on_forward``: called
    as ``on_forward(plan, logits)`` after every model call, before the commit.
    """

    def __init__(
        self,
        model: HybridModel,
        cache: MambaRadixCache,
        kv_pool: Any,
        *,
        chunked_prefill_size: int | None = None,
        eos_token_id: int | None = None,
        record: bool = False,
        on_forward: Callable[[ForwardPlan, torch.Tensor], None] | None = None,
    ) -> None:
        if (
            tuple(cache.mamba_pool.temporal.shape[2:]) != model.temporal_shape
            or [tuple(c.shape[2:]) for c in cache.mamba_pool.conv] != model.conv_shapes
        ):
            raise InvalidArgument(
                "the cache's MambaPool does not have this model's state shapes; build it with "
                "model.new_mamba_pool(num_slots) (or use ReferenceEngine.build)"
            )
        num_kv = cache.token_to_kv_pool_allocator.size
        if kv_pool.size != num_kv or kv_pool.page_size != cache.config.page_size:
            raise InvalidArgument(
                f"the KV storage holds {kv_pool.size} indices in pages of {kv_pool.page_size} but the "
                f"allocator hands out {num_kv} in pages of {cache.config.page_size}; build it with "
                "model.new_kv_pool(allocator.size, config.page_size)"
            )
        chunk = cache.config.chunked_prefill_size if chunked_prefill_size is None else chunked_prefill_size
        if chunk == 0 or chunk < -1:
            raise InvalidArgument(f"chunked_prefill_size must be -1 or a positive count, got {chunk}")
        self.model = model
        self.cache = cache
        self.kv_pool = kv_pool
        self.pools = model.pools_view(kv_pool, cache.mamba_pool)
        self.chunked_prefill_size = chunk
        self.eos_token_id = eos_token_id
        self.on_forward = on_forward
        self.records: list[ForwardRecord] | None = [] if record else None
        self.stats = EngineStats()
        self.waiting: deque[_Running] = deque()
        self.running: list[_Running] = []
        self.finished: dict[Any, list[int]] = {}  # rid -> output tokens
        self.requests: dict[Any, Req] = {}  # rid -> the finished Req (prompt, outputs, final kv_len)
        self._next_rid = 0

    @classmethod
    def build(
        cls,
        model: HybridModel,
        config: CacheConfig,
        *,
        num_tokens: int = 1024,
        num_slots: int = 32,
        max_running_requests: int = 4,
        max_context_len: int = 512,
        **kwargs: Any,
    ) -> ReferenceEngine:
        """An engine with fresh pools: ``num_tokens`` KV indices (paged when ``config.page_size > 1``),
        ``num_slots`` state slots of the model's shapes, ``max_running_requests`` request rows."""
        mamba_pool = model.new_mamba_pool(num_slots)
        req_pool = HybridReqToTokenPool(max_running_requests, max_context_len, mamba_pool, config)
        cache = MambaRadixCache(config, req_pool, make_kv_allocator(num_tokens, config.page_size))
        return cls(model, cache, model.new_kv_pool(num_tokens, config.page_size), **kwargs)

    # ------------------------------------------------------------------------------------ requests
    def submit(self, prompt: Sequence[int], max_new_tokens: int, rid: Any = None) -> Any:
        """Queue a request; returns its id (``rid`` or the next integer). No cache call happens here."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidArgument("the prompt is empty; give it at least one token")
        if rid is None:
            rid = self._next_rid
            self._next_rid += 1
        self.waiting.append(_Running(Req(rid=rid, origin_input_ids=tokens), max_new_tokens))
        return rid

    def run(self) -> dict[Any, list[int]]:
        """Step until every submitted request finished; returns ``{rid: output tokens}`` of all requests
        finished so far. Raises :class:`InvalidArgument` if the head of the queue can never be admitted."""
        while self.waiting or self.running:
            self.step()
        return self.finished

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Serve one request to completion (others queued before it are served too)."""
        rid = self.submit(prompt, max_new_tokens)
        self.run()
        return self.finished[rid]

    # -------------------------------------------------------------------------------------- schedule
    def step(self) -> list[Any]:
        """Admit what fits, then one forward per running request. Returns the ids finished this step."""
        self._admit()
        done = []
        forwards = self.stats.forwards
        for run in list(self.running):
            if self._forward(run):
                self.running.remove(run)
                done.append(run.req.rid)
        if self.running and self.stats.forwards == forwards:  # cannot happen while admission reserves KV
            raise InvalidArgument(
                f"no running request could get KV for its next forward ({len(self.running)} running); "
                "the KV pool is too small for the admitted requests"
            )
        return done

    def _admit(self) -> None:
        while self.waiting:
            run = self.waiting[0]
            check = self.cache.can_admit(run.req, run.max_new_tokens)
            if not check.ok:
                if check.reason == "too_long":
                    raise InvalidArgument(
                        f"request {run.req.rid!r} cannot be admitted: it is longer than a request row "
                        "(max_context_len) or than the KV pool; give the engine longer rows or more KV tokens"
                    )
                if not self.running:
                    raise InvalidArgument(
                        f"request {run.req.rid!r} cannot be admitted ({check.reason}) even with nothing "
                        "running; give the engine more KV tokens, state slots or request rows"
                    )
                return  # FIFO: wait for running requests to finish
            admitted = self.cache.admit(run.req, run.max_new_tokens)
            assert admitted, "can_admit said yes"
            self.waiting.popleft()
            run.hit_len = run.req.kv_len
            self.running.append(run)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(run.req.origin_input_ids)
            self.stats.hit_tokens += run.hit_len

    def _forward(self, run: _Running) -> bool:
        """One forward of ``run``; returns whether the request finished (and was handed to ``finish``)."""
        req = run.req
        prompt_len = len(req.origin_input_ids)
        if req.kv_len < prompt_len:
            left = prompt_len - req.kv_len
            n = left if self.chunked_prefill_size == -1 else min(self.chunked_prefill_size, left)
        else:
            n = 1  # the last sampled token
        plan = self.cache.extend(req, n)
        if plan is None:
            return False  # KV short even after eviction: retry next step (admission reserves, so rare)
        logits = self._run_model(plan)
        if plan.is_prefill:
            self.stats.prefill_tokens += plan.num_tokens
        else:
            self.stats.decode_tokens += plan.num_tokens
        if self.records is not None:
            self.records.append(
                ForwardRecord(
                    req.rid, plan.start, plan.end, run.hit_len, plan.track_len, plan.is_prefill, logits
                )
            )
        if self.on_forward is not None:
            self.on_forward(plan, logits)
        samples = plan.end == req.seq_len  # the span ends at the newest token: its logits pick the next
        token = int(torch.argmax(logits[-1])) if samples else None
        finishing = token is not None and (
            len(req.output_ids) + 1 >= run.max_new_tokens or token == self.eos_token_id
        )
        self.cache.commit(plan, finished=finishing)
        if token is not None:
            req.output_ids.append(token)
        if finishing:
            self.cache.finish(req)
            self.finished[req.rid] = list(req.output_ids)
            self.requests[req.rid] = req
        return finishing

    def _run_model(self, plan: ForwardPlan) -> torch.Tensor:
        req = plan.req
        assert req.req_pool_idx is not None
        row = self.cache.req_to_token_pool.req_to_token[req.req_pool_idx]
        prefix_kv = row[: plan.start].to(torch.int64)
        t0 = time.perf_counter()
        logits = self.model.forward_span(
            self.pools,
            req.token_ids(plan.end)[plan.start :],
            plan.start,
            prefix_kv,
            plan.kv_indices,
            plan.live_slot,
            plan.live_slot,
            plan.track_len,
            plan.track_slot,
        )
        self.stats.model_s += time.perf_counter() - t0
        self.stats.forwards += 1
        return logits


@torch.no_grad()
def greedy_reference(model: HybridModel, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from plain transformers forwards of the whole sequence at every step (no cache of any
    kind: the oracle). O(max_new_tokens * (len + max_new_tokens)^2) attention; for tiny tests only."""
    tokens = [int(t) for t in prompt]
    out: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(torch.argmax(model.reference_logits(tokens + out)[-1]))
        out.append(nxt)
    return out


@dataclass(frozen=True)
class CheckpointAudit:
    """One checkpoint in the tree, probed: the node's depth, its slot, and the max |logit difference|
    between the probe token run from that checkpoint (its state and the tree's KV of the path) and a
    from-scratch transformers forward of the path followed by the probe token. Under a quantized
    ``checkpoint_format`` the slot is a checkpoint-pool slot and the state probed is the one a hit
    restores (dequantized), so the difference includes the format's error."""

    depth: int
    slot: int
    max_abs_diff: float


@torch.no_grad()
def audit_checkpoints(engine: ReferenceEngine, probe_token: int = 3) -> list[CheckpointAudit]:
    """Probe every checkpoint in ``engine.cache``'s tree: is it the state the model has at its position?

    For each node holding a slot, the slot's state is copied (``state_ops`` gather/scatter) into a
    private one-slot pool and the probe token is run at position ``depth`` over the tree's KV of the path
    (its own KV goes to the KV storage's padding row 0, which nothing reads). Under a quantized
    ``checkpoint_format`` the node's slot is in ``cache.checkpoint_pool`` and is dequantized into that
    pool instead (:meth:`~mamba_radix.pools.checkpoint_pool.CheckpointPool.read`: what a hit restores).
    Read-only for the cache: no match, lock, clock tick or recency change. O(checkpoints * depth) model
    work.
    """
    cache, model = engine.cache, engine.model
    scratch = model.new_mamba_pool(1)
    scratch_slot = int(scratch.alloc(1)[0])  # type: ignore[index]
    view = model.pools_view(engine.kv_pool, scratch)
    out: list[CheckpointAudit] = []
    for node in cache.tree.nodes():
        if node.is_root or node.mamba_slot is None:
            continue
        path = list(cache.tree.path_to_root(node))
        tokens = [t for n in reversed(path) for t in n.key]
        kv = cache.tree.path_values(node).to(torch.int64)
        if cache.checkpoint_pool is None:
            SlotState.gather(model, cache.mamba_pool, node.mamba_slot).scatter(scratch, scratch_slot)
        else:  # the state a hit on this checkpoint restores, in the model's dtype
            restored = cache.checkpoint_pool.read(node.mamba_slot, cache.mamba_pool.tensors)
            for t, r in zip(scratch.tensors, restored, strict=True):
                t[:, scratch_slot] = r
        got = model.forward_span(
            view, [probe_token], node.depth, kv, torch.zeros(1, dtype=torch.int64), scratch_slot, scratch_slot
        )
        want = model.reference_logits([*tokens, probe_token])[-1:]
        out.append(CheckpointAudit(node.depth, node.mamba_slot, float((got - want).abs().max())))
    return out
