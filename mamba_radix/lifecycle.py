"""The request lifecycle: the one protocol by which engines, the simulator, the invariant suite's adapter,
the reference engine and the tests drive a request through the cache (DESIGN.md §6.2).

The engine only plays the model. The cache tells it, for every forward over a span of tokens, which KV
indices to write, which slot holds the state to start from, and which slot to track a checkpoint into at
which length (a :class:`ForwardPlan`); the engine runs the model and hands the plan back
(:meth:`RequestLifecycle.commit`). Where checkpoints land and which slot goes to the tree is decided by the
buffer strategy object (:mod:`mamba_radix.buffers`); nobody outside flips ping-pong indices::

    check = cache.can_admit(req, max_new_tokens)      # read-only: would it fit, and why not
    if cache.admit(req, max_new_tokens):              # match input[:-1] (+ copy-on-write), lock, row, slots
        while prefilling or decoding:
            plan = cache.extend(req, num_tokens)      # KV for [kv_len, kv_len + n) (evicting); None: short
            ...the model reads plan.live_slot, writes KV at plan.kv_indices, the end state into
               plan.live_slot and, if plan.track_slot is set, the state at plan.track_len into it...
            cache.commit(plan, finished=...)          # kv_len advances; prefill chunks go to the tree
            (append the sampled token to req.output_ids)
        cache.finish(req)                             # newest checkpoint to the tree, the rest freed

Region map of a running request (the tree owns what is below ``cache_protected_len``)::

    [0, cache_protected_len)          tree KV, locked through req.last_node (its checkpoint mamba-locked,
                                      except after a hand-over under skip_decode_lock: a KV-only lock)
    [cache_protected_len, kv_len)     the request's KV: inserted (deduplicated) by cache_unfinished_req,
                                      inserted up to the newest checkpoint and freed past it at finish
    [kv_len, plan.end)                KV of an extend not yet committed (an abort frees it together with
                                      the request's own KV: a plan may continue its last page)
    live slot                         the state at kv_len (plan.end once the model ran)
    track slots (ping-pong)           the newest tracked checkpoint, at mamba_last_track_seqlen

SGLang's rule differences between releases are config switches (``mamba_slot_headroom``,
``mamba_kv_only_leaves``, ``mamba_decode_insert``); :mod:`mamba_radix.peers` names the release presets.

Locks: admission takes a full lock on ``req.last_node`` (its KV path and its checkpoint, the copy-on-write
source). A hand-over moves the lock to the new node; with ``skip_decode_lock`` (SGLang's
``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``) the moved lock is KV-only: the checkpoint was copied into (or donated
from) the request's own slots and is never read from that node again by this request, so eviction may take
it while the request runs (``stats.checkpoints_evicted_while_decoding``). Every release drops exactly the
kind that was taken (:meth:`RequestLifecycle.lock_covers_checkpoint`).

Every call validates everything first and changes nothing when it refuses (returns ``False``/``None``
for a resource shortage, raises :class:`~mamba_radix.errors.InvalidArgument` for misuse). Validation
happens once, at the public edge: the prompt and each sampled token are checked once (into a per-request
``array('q')`` that keys are cut from), and the SGLang-named calls :meth:`~RequestLifecycle.commit` and
:meth:`~RequestLifecycle.finish` make do not check the request again (called directly, they do).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary, WeakSet

import torch

from mamba_radix.errors import InvalidArgument, check_count
from mamba_radix.lifecycle_checks import (
    check_checkpoint_len,
    check_extend,
    check_new_request,
    check_no_pending_insert,
    check_request_kv,
    check_running,
)
from mamba_radix.lifecycle_contract import LifecycleCache
from mamba_radix.lifecycle_results import ADMIT_REASONS, AdmitCheck, ForwardPlan, PrefixKV
from mamba_radix.request import Req
from mamba_radix.token_checks import make_token_check
from mamba_radix.tree import RadixKey, Walk

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.cache_results import LoadPlan
    from mamba_radix.node import TreeNode

# the result records (mamba_radix.lifecycle_results) and the cache contract (mamba_radix.lifecycle_contract)
# live in their own modules; re-exported here, where callers import them
__all__ = ["ADMIT_REASONS", "AdmitCheck", "ForwardPlan", "LifecycleCache", "RequestLifecycle"]


class RequestLifecycle:
    """The request lifecycle over one cache (a layer: it holds the cache and uses only its public
    contract, :class:`LifecycleCache`). :class:`~mamba_radix.cache.MambaRadixCache` builds one as
    ``cache.lifecycle`` and forwards the lifecycle calls to it.

    KV reservation: :meth:`admit` reserves every KV token the request will still allocate (its
    uncached prompt, plus ``max_new_tokens - 1`` decode tokens when given); :meth:`can_admit` admits a
    request only if free plus evictable KV covers the reservations of every running request and its own,
    so an admitted request never runs out of KV. Its extends draw the reservation down; finish returns the
    rest.

    State (all of it): ``reserved_kv_tokens``; ``kv_only_locked``, the running requests whose lock on
    ``last_node`` is KV-only (taken at a hand-over under ``skip_decode_lock``; weak, dropped at release);
    ``checked_tokens``, per admitted request its tokens as
    validated so far (the prompt at admission, sampled tokens as extends check them) as an
    ``array('q')``, so hand-over keys are cut from it with a ``memcpy`` instead of being converted from the
    request's lists again (weak keys: an entry goes with its request; :meth:`cache_finished_req` drops
    it); ``prefix_chunks``, per running request the KV chunks of its cached prefix (what ``prefix_indices``
    concatenates when read: a hand-over appends the new nodes' chunks, O(new nodes)); ``_validated_req``, the
    request the running :meth:`commit` / :meth:`finish` validated, which the
    SGLang-named call it makes does not validate again.

    ``compiled_token_check``: whether the token-list check may use its compiled fast path (None:
    ``MAMBA_RADIX_C``); chosen once here (:func:`~mamba_radix.token_checks.make_token_check`) and kept as
    :attr:`check_tokens`, so no check reads a global switch.
    """

    def __init__(self, cache: LifecycleCache, *, compiled_token_check: bool | None = None) -> None:
        self.cache = cache
        self.check_tokens = make_token_check(compiled_token_check)
        # Read once: none of them is replaced after the cache is built (the frozen config's derived
        # counts and the pools are the cache's for its lifetime).
        self.config = cache.config
        self.buffer = cache.buffer
        self.req_to_token_pool = cache.req_to_token_pool
        self.token_to_kv_pool_allocator = cache.token_to_kv_pool_allocator
        self.mamba_pool = cache.mamba_pool
        # the quantized checkpoints' pool (checkpoint_format int8 / fp8_e4m3), None under "model"; when set,
        # no checkpoint is a state slot, a hand-over quantizes and nothing is donated
        self.checkpoint_pool = cache.checkpoint_pool
        self.reserved_kv_tokens = 0
        self.kv_only_locked: WeakSet[Req] = WeakSet()
        self.checked_tokens: WeakKeyDictionary[Req, array] = WeakKeyDictionary()
        self.prefix_chunks: WeakKeyDictionary[Req, tuple[torch.Tensor, ...]] = WeakKeyDictionary()
        self._validated_req: Req | None = None
        # the host tier: whether it is on, and each admitted request's applied load-back (take_load_plan)
        self.host_tier = cache.config.host_tier
        self.load_plans: WeakKeyDictionary[Req, LoadPlan] = WeakKeyDictionary()

    # ------------------------------------------------------------------------------------- admission
    def _final_kv_len(self, req: Req, max_new_tokens: int | None) -> int:
        # the last sampled token's KV is never computed
        return len(req.origin_input_ids) + (max_new_tokens - 1 if max_new_tokens else 0)

    def _page_ceil(self, num_tokens: int) -> int:
        page = self.config.page_size
        return -(-num_tokens // page) * page

    def can_admit(self, req: Req, max_new_tokens: int | None = None) -> AdmitCheck:
        """Whether :meth:`admit` would admit ``req`` now, and why not. Read-only: nothing is split,
        stamped, counted or evicted. ``max_new_tokens``: output tokens the request will produce (its
        decode KV is reserved); ``None`` reserves only the prompt. O(L + path)."""
        return self._admission_check(req, max_new_tokens)[0]

    def _admission_check(
        self, req: Req, max_new_tokens: int | None
    ) -> tuple[AdmitCheck, RadixKey, Walk | None, array]:
        """:meth:`can_admit`, plus the admission key, its walk for the match that follows and the
        request's checked tokens."""
        ids = check_new_request(req, max_new_tokens, self.check_tokens)
        # a view of the checked tokens: the key's own copy is the only one made
        key = RadixKey.trusted(memoryview(ids)[: len(req.origin_input_ids) - 1], req.extra_key)  # type: ignore[arg-type]
        peek, walk = self.cache.peek_with_walk(key)
        hit = peek.hit_len
        final = self._final_kv_len(req, max_new_tokens)
        need_tokens = self._page_ceil(final) - hit
        need_slots = self.buffer.admission_slots(req)

        def verdict(reason: str | None) -> tuple[AdmitCheck, RadixKey, Walk | None, array]:
            check = AdmitCheck(reason is None, reason, hit, peek.full_kv_hit_len, need_tokens, need_slots)
            return check, key, walk, ids

        pool = self.req_to_token_pool
        allocator = self.token_to_kv_pool_allocator
        if final > pool.req_to_token.shape[1] or need_tokens > allocator.size:
            return verdict("too_long")
        if pool.available_size() < 1:
            return verdict("req_rows")
        kv_room = allocator.available_size() + self.cache.full_evictable_size() - peek.unlocked_tokens
        if kv_room < self.reserved_kv_tokens + need_tokens:
            return verdict("kv_tokens")
        if self.checkpoint_pool is None:
            slot_room = (
                self.mamba_pool.available_size()
                + self.cache.mamba_evictable_size()
                - int(peek.unlocked_checkpoint)
            )
        else:  # checkpoints live in their own pool: evicting them frees no state slot
            slot_room = self.mamba_pool.available_size()
        if slot_room < need_slots:
            return verdict("state_slots")
        return verdict(None)

    def admit(self, req: Req, max_new_tokens: int | None = None) -> bool:
        """Admit ``req`` if :meth:`can_admit` says it fits; return whether it was admitted.

        Matches the prompt less its last token (one token is always computed, for the logits) with
        copy-on-write of the hit into a live slot, locks ``req.last_node``, evicts checkpoints for the
        slots it takes (``mamba_slot_headroom``), takes a request row, the live slot and the track buffer,
        writes the hit's KV indices into the row, sets ``req.kv_len`` to the hit length (the live slot
        holds the state there; zeroed when there is no hit) and reserves the request's KV.

        A refusal changes nothing. Should a pool allocation fail anyway (only an injected fault can: the
        check counted every slot), the lock, the copy-on-write slot and the request's fields are undone
        and ``False`` returned; the match's split and recency refresh stay (they change no hit), and so
        do checkpoints the headroom evicted before the failing allocation (SGLang evicts, then
        allocates).
        O(L + path * log n), plus one slot copy.
        """
        check, key, walk, ids = self._admission_check(req, max_new_tokens)
        if not check.ok:
            return False
        if self.host_tier:
            # a host-resident prefix deeper than the device hit is loaded back first (the plan is kept for
            # the engine: take_load_plan); then the admission is checked again against the new hit
            plan = self.cache.load_back(key)
            if plan is not None:
                self.load_plans[req] = plan
                check, key, walk, ids = self._admission_check(req, max_new_tokens)
                if not check.ok:
                    return False
        self.cache.policy.on_admit(req)
        match = self.cache.match_prefix(key, cow_mamba=True, req=req, walk=walk)  # the check's walk, if valid
        node = req.last_node
        assert node is not None
        self.cache.policy.on_hit(req)
        self.cache.inc_lock_ref(node)
        headroom = max(self.buffer.per_chunk_headroom_slots, self.buffer.admission_slots(req))
        self.cache.make_room(0, headroom, check=False)
        # trusted: checked fresh above; its one slot, if any, is the copy-on-write's, just allocated
        if self.req_to_token_pool.alloc([req], check=False) is None:
            self._undo_admission(req, node)
            return False
        assert req.req_pool_idx is not None and req.mamba_pool_idx is not None
        if req.cache_protected_len:
            # the hit into the row straight from the tree's chunks: req.prefix_indices is concatenated
            # only if someone reads it
            row, pos = req.req_pool_idx, 0
            for chunk in match.kv_chunks():
                self.req_to_token_pool.write(row, pos, chunk, check=False)
                pos += chunk.numel()
        else:
            self.mamba_pool.clear_slots([req.mamba_pool_idx])
        req.kv_len = req.cache_protected_len
        req.kv_reserved_tokens = check.kv_tokens_needed
        req.prefill_chunks = 0
        self.reserved_kv_tokens += check.kv_tokens_needed
        self.checked_tokens[req] = ids
        self.prefix_chunks[req] = match.kv_chunks() if req.cache_protected_len else ()
        return True

    def take_load_plan(self, req: Req) -> LoadPlan | None:
        """The load-back the admission of ``req`` applied (host tier), once: which host KV rows and host
        slot went to which device indices and slot, and the copy's event to wait on before the forward;
        None if there was none (or it was taken). O(1)."""
        return self.load_plans.pop(req, None)

    def _token_key(self, req: Req, start: int, end: int) -> RadixKey:
        """The key of ``req``'s tokens ``[start, end)``, trusted: cut from its checked tokens when they
        reach ``end`` (the lifecycle's requests), else from its lists (a caller of the low-level calls
        that did not admit through :meth:`admit`). O(end - start)."""
        ids = self.checked_tokens.get(req)
        tokens: Sequence[int] | memoryview = (
            # a view: the key's own copy is the only one made
            memoryview(ids)[start:end] if ids is not None and end <= len(ids) else req.token_slice(start, end)
        )
        return RadixKey.trusted(tokens, req.extra_key)  # type: ignore[arg-type]

    def lock_covers_checkpoint(self, req: Req) -> bool:
        """Whether ``req``'s lock on ``req.last_node`` is a full one (KV and checkpoint: admission's, or
        any with ``skip_decode_lock`` off) rather than a KV-only one (a hand-over's under
        ``skip_decode_lock``). O(1), no side effects."""
        return req not in self.kv_only_locked

    def _release_lock(self, req: Req, node: TreeNode) -> None:
        """Release ``req``'s lock on ``node``, of the kind it took (a KV-only release may free a tombstone
        leaf only that lock kept: the cache frees it). O(path * log n)."""
        if req in self.kv_only_locked:
            self.cache.dec_lock_ref(node, checkpoint=False)
            self.kv_only_locked.discard(req)
        else:
            self.cache.dec_lock_ref(node)

    def _undo_admission(self, req: Req, node: TreeNode) -> None:
        self._release_lock(req, node)
        if req.mamba_pool_idx is not None:  # the copy-on-write target, taken by the match
            # undo_alloc, not free: the next allocation then hands out the slots it would have
            self.mamba_pool.undo_alloc(torch.tensor([req.mamba_pool_idx], dtype=torch.int64))
            req.mamba_pool_idx = None
        req.prefix_indices = torch.empty(0, dtype=torch.int64, device=self.cache.device)
        req.last_node = None
        req.cache_protected_len = 0
        req.full_kv_hit_len = 0
        req.mamba_branching_seqlen = None
        req.mamba_cow_src_slot = None

    # ---------------------------------------------------------------------------------------- extend
    def prefill_chunk_len(self, req: Req, budget: int) -> int:
        """How many prompt tokens the next prefill chunk of running ``req`` takes with at most ``budget``
        tokens (``chunked_prefill_size``, or what is left of a batch's): the rest of the prompt if it
        fits, else as many as end on a page boundary (SGLang's scheduler cuts chunks so). ``0``: the
        budget does not reach the next page boundary; schedule the chunk later. :meth:`extend` refuses
        any other prefill length. No side effects. O(1)."""
        check_count(budget, "budget", 0)
        start, input_len = req.kv_len, len(req.origin_input_ids)
        if start + budget >= input_len:
            return max(input_len - start, 0)
        page = self.config.page_size
        return max((start + budget) // page * page - start, 0)

    def extend(self, req: Req, num_tokens: int) -> ForwardPlan | None:
        """Allocate KV for the next ``num_tokens`` tokens of ``req`` and say where the model writes states.

        A prefill extend (``kv_len`` inside the prompt) must end at or before the prompt's end; a decode
        extend must not cross a decode boundary (``cache.buffer.next_decode_boundary``), it may end on
        one. The tokens must be known (append sampled tokens to ``req.output_ids`` first). KV comes from
        free indices, then from eviction; paged, the request's last partial page is continued. With
        ``mamba_slot_headroom="per_chunk"`` a prefill chunk after the first first evicts checkpoints
        until the headroom is free (SGLang 0.5.20). At a decode boundary the lazy strategy borrows its
        second track slot.

        Returns the plan (commit it with :meth:`commit` once the model ran), or ``None`` with nothing
        changed when KV is short even after eviction, or when the extend goes past the request's own
        reservation (its ``max_new_tokens``) and the rest would come out of other running requests'
        reservations (the engine retracts it: ``finish(req, insert=False)``). Raises :class:`InvalidArgument` for misuse,
        including an extend while the previous plan is not committed. O(num_tokens + victims * log n).
        """
        row = check_running(req, "extend", self.req_to_token_pool, self.cache.is_attached)
        check_extend(req, row, num_tokens, self.config.page_size, self.prefill_chunk_len)
        start, end = req.kv_len, req.kv_len + num_tokens
        is_prefill = start < len(req.origin_input_ids)
        ids: array | None = None
        done, checked = start, array("q")
        if not is_prefill:  # the prompt was checked at admission; sampled tokens are checked here
            ids = self.checked_tokens.get(req)
            done = start if ids is None else max(start, min(len(ids), end))  # checked before: skipped
            checked = self.check_tokens(
                req.token_slice(done, end), f"extend: request {req.rid!r}: output_ids"
            )
        boundary = None if is_prefill else self.buffer.next_decode_boundary(start)
        if boundary is not None and boundary < end:
            raise InvalidArgument(
                f"extend: the decode span [{start}, {end}) crosses the decode boundary {boundary}; "
                f"extend at most {boundary - start} tokens"
            )
        allocator = self.token_to_kv_pool_allocator
        need = self._page_ceil(end) - self._page_ceil(start)
        room = allocator.available_size() + self.cache.full_evictable_size()
        # Past its own reservation a request may take only room nobody reserved: the other running
        # requests' reservations are theirs (so an admitted request that keeps to its max_new_tokens never
        # runs out of KV, whatever the others do).
        beyond = need - min(req.kv_reserved_tokens, need)
        if room < need or (beyond and room - self.reserved_kv_tokens < beyond):
            return None
        headroom = self.buffer.per_chunk_headroom_slots
        if is_prefill and req.prefill_chunks and headroom:
            self.cache.make_room(0, headroom, check=False)
        self.cache.make_room(need, 0, check=False)
        if self.config.page_size == 1:
            kv = allocator.alloc(num_tokens)
        else:
            last_loc = int(row[start - 1]) if start % self.config.page_size else -1
            kv = allocator.alloc_extend([start], [end], [last_loc], num_tokens)
        if kv is None:  # only an injected fault: the check above counted the room
            return None
        self.req_to_token_pool.write(req.req_pool_idx, start, kv, check=False)  # type: ignore[arg-type]
        drawn = min(req.kv_reserved_tokens, need)
        req.kv_reserved_tokens -= drawn
        self.reserved_kv_tokens -= drawn
        track_slot: int | None = None
        track_len: int | None = None
        if is_prefill:
            track_len = self.buffer.prefill_track_len(req, start, num_tokens)
            if track_len is not None:
                track_slot = self.buffer.prefill_track_slot(req)
        elif boundary == end:
            track_slot = self.buffer.decode_track_slot(req, self.req_to_token_pool)
            track_len = end if track_slot is not None else None
        assert req.mamba_pool_idx is not None
        if not is_prefill and ids is not None and len(ids) == done:  # the extend is taken: keep them
            ids.extend(checked)
        plan = ForwardPlan(req, start, end, kv, req.mamba_pool_idx, track_slot, track_len, is_prefill)
        req.pending_plan = plan
        return plan

    def commit(self, plan: ForwardPlan, *, finished: bool = False) -> None:
        """The model ran ``plan``: advance ``req.kv_len`` to ``plan.end``, record the tracked state
        (``mamba_last_track_seqlen``; the ping-pong bookkeeping advances) and, after a prefill chunk, hand
        the newest checkpoint and the KV before it to the tree (:meth:`cache_unfinished_req`). Decode
        checkpoints are only tracked (SGLang); ``mamba_decode_insert`` hands them over at once.
        ``finished``: the request finishes after this forward; nothing is handed over, :meth:`finish`
        inserts the newest state. O(L + path * log n) with a hand-over, else O(P).
        """
        if not isinstance(plan, ForwardPlan):
            raise InvalidArgument(f"commit takes the ForwardPlan extend returned, got {type(plan).__name__}")
        req = plan.req
        check_running(req, "commit", self.req_to_token_pool, self.cache.is_attached)
        if req.pending_plan is not plan:
            raise InvalidArgument(
                f"commit: this plan is not request {req.rid!r}'s pending one (committed already, or from "
                "an older extend); commit each plan once, in order"
            )
        hand_over = plan.is_prefill or (self.config.mamba_decode_insert and plan.track_len is not None)
        if hand_over and not finished:  # validate the hand-over's checkpoint before changing anything
            self._checkpoint_len(req, "commit", plan)
        req.pending_plan = None
        req.kv_len = plan.end
        if plan.track_len is not None:
            req.mamba_last_track_seqlen = plan.track_len
            self.buffer.after_track(req, self.req_to_token_pool, decode=not plan.is_prefill)
        if plan.is_prefill:
            req.prefill_chunks += 1
        if hand_over and not finished:
            with self._validated(req):  # checked above: the hand-over does not check it again
                self.cache_unfinished_req(req)

    def finish(self, req: Req, insert: bool = True) -> None:
        """Finish ``req``: :meth:`cache_finished_req` (the newest checkpoint and the KV before it to the
        tree, the rest freed, every slot released, the lock dropped), then free its request row and return
        its unused KV reservation. ``insert=False`` aborts: nothing is inserted, and an uncommitted plan's
        KV is freed too. Raises :class:`InvalidArgument` (nothing changed) for ``insert=True`` with an
        uncommitted plan: the model may have overwritten the state that would be inserted.
        O(L + path * log n).
        """
        check_running(req, "finish", self.req_to_token_pool, self.cache.is_attached)
        check_no_pending_insert(req, insert, "finish")
        with self._validated(req):  # checked above: cache_finished_req does not check it again
            self.cache_finished_req(req, is_insert=insert)
        self.req_to_token_pool.free(req)
        self.reserved_kv_tokens -= req.kv_reserved_tokens
        req.kv_reserved_tokens = 0
        req.finished = True

    # ------------------------------------------------------------------ SGLang's request-level calls
    def _checkpoint_len(self, req: Req, verb: str, plan: ForwardPlan | None = None) -> int | None:
        """The length of the state the request can hand to the tree now (validated), or ``None``; with
        ``plan``, the one it could hand over once ``plan`` is committed (checked before the commit)."""
        cache_len = self.buffer.checkpoint_len(req, None if plan is None else (plan.end, plan.track_len))
        if cache_len is None:
            return None
        kv_len = req.kv_len if plan is None else plan.end
        return check_checkpoint_len(req, cache_len, kv_len, self.config.page_size, verb)

    def _admitted(self, req: Req, cache_len: int | None) -> int | None:
        """``cache_len`` if the research policy keeps that hand-over (``None`` if declined, counted)."""
        if cache_len is None or cache_len <= req.cache_protected_len:
            return cache_len
        if self.cache.policy.admit_checkpoint(req, cache_len):
            return cache_len
        self.cache.stats.checkpoints_declined += 1
        return None

    @contextmanager
    def _validated(self, req: Req) -> Iterator[None]:
        """Within: ``req`` was validated by the lifecycle call running now (:meth:`commit`,
        :meth:`finish`), so the SGLang-named call it makes skips re-validating the request and its KV
        (validate once at the public edge). Requests are handled one call at a time, so one slot
        suffices; it is cleared on the way out, whatever happens."""
        self._validated_req = req
        try:
            yield
        finally:
            self._validated_req = None

    def _is_validated(self, req: Req) -> bool:
        return self._validated_req is req

    def cache_unfinished_req(self, req: Req) -> None:
        """Hand a running request's newest checkpoint and the KV before it to the tree (SGLang's call,
        after a prefill chunk; :meth:`commit` makes it).

        The buffer strategy names the checkpoint (``checkpoint_len``): extra_buffer, the tracked state at
        ``mamba_last_track_seqlen`` (nothing to hand over when it is ``None``), donated without a copy, a
        fresh slot taking its place; no_buffer, the live state at ``kv_len``, copied into a fresh slot.
        The KV ``[cache_protected_len, cache_len)`` is inserted (the request's duplicates are freed and its
        row rewritten with the tree's indices), the lock moves to the new node and
        ``cache_protected_len`` becomes ``cache_len``. If no slot can be had even after eviction the
        checkpoint is skipped (``stats.checkpoints_skipped``) and the KV stays the request's.
        Validates the request and its KV before changing anything (not again when :meth:`commit`,
        which validated the request just before, makes the call: its row holds only indices the
        lifecycle allocated). O(new tokens + path nodes * log n).
        """
        check = not self._is_validated(req)
        if check:
            row = check_running(req, "cache_unfinished_req", self.req_to_token_pool, self.cache.is_attached)
        else:
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        cache_len = self._checkpoint_len(req, "cache_unfinished_req")
        protected = req.cache_protected_len
        if cache_len is not None and cache_len > protected:
            span = row[protected:cache_len]  # a view of the row, int32
            if check:  # everything validated before the policy is asked or a slot allocated
                check_request_kv(
                    req, span, "cache_unfinished_req", self.token_to_kv_pool_allocator, self.cache.held_kv
                )
                self.buffer.check_hand_over(req, self.req_to_token_pool, "cache_unfinished_req")
            if self._admitted(req, cache_len) is not None:
                self._insert_checkpoint(req, span, cache_len, check)
        req.mamba_last_track_seqlen = None

    def _insert_checkpoint(self, req: Req, span: torch.Tensor, cache_len: int, check: bool = True) -> None:
        """Hand the state at ``cache_len`` and the KV ``span`` (the row's ``[cache_protected_len,
        cache_len)``, validated) to the tree, walking from ``req.last_node``. Only where the tree held
        tokens already (their duplicates freed) is the row rewritten: O(new tokens + path nodes * log n)."""
        quantized = self.checkpoint_pool is not None
        if quantized:
            # quantized into a fresh checkpoint slot (evicting checkpoints when that pool is full); the
            # request keeps every state slot it holds (nothing donated: docs/checkpoint-formats.md)
            source = self.buffer.checkpoint_slot(req, self.req_to_token_pool)
            tree_slot = self.cache.store_checkpoint(source)
            if tree_slot is None:
                self.cache.stats.checkpoints_skipped += 1
                return
        else:
            new_slot = self.cache.alloc_state_slot()
            if new_slot is None:
                self.cache.stats.checkpoints_skipped += 1
                return
            tree_slot, copy = self.buffer.unfinished_tree_slot(req, self.req_to_token_pool, new_slot, check)
            if copy:
                assert req.mamba_pool_idx is not None
                # trusted: the request's, a fresh slot
                self.mamba_pool.copy_slot(req.mamba_pool_idx, tree_slot)
                self.cache.stats.state_copies += 1
        protected = req.cache_protected_len
        old = req.last_node
        assert old is not None
        suffix = self._token_key(req, protected, cache_len)
        result, done = self.cache.insert_below(old, suffix, span.to(torch.int64), tree_slot)
        if result.mamba_exists and quantized:
            self.cache.free_checkpoint(tree_slot)  # the tree has this state already
        elif result.mamba_exists:
            self.mamba_pool.free([tree_slot], check=False)  # the fresh slot just donated back
        if result.prefix_len > protected:
            # The tree held [protected, prefix_len) already and the insert freed the request's duplicates
            # there: point that part of the row at the tree's indices (the rest is the request's own KV,
            # now the new leaf's, already in the row).
            tree_kv = self.cache.path_kv(done.node, old)[: result.prefix_len - protected]
            self.req_to_token_pool.write(req.req_pool_idx, protected, tree_kv, check=False)  # type: ignore[arg-type]
        # The new node is locked before the old one is released, so the shared path never goes unlocked
        # between them. Under skip_decode_lock only its KV: the request continues from its own slots and
        # never reads this checkpoint again, so eviction may take it (the admission lock, protecting the
        # copy-on-write source, stays a full one).
        kv_only = self.config.skip_decode_lock
        self.cache.inc_lock_ref(done.node, checkpoint=not kv_only)
        self._release_lock(req, old)
        if kv_only:
            self.kv_only_locked.add(req)
        req.last_node = done.node
        req.cache_protected_len = cache_len
        # SGLang's contract: prefix_indices is the cached prefix, len == cache_protected_len (a scheduler
        # reads it for the next chunk). Concatenated only if read: the hand-over stays O(new tokens).
        # The chunks grow by the nodes below the old lock only: O(new nodes), whatever the prefix's length.
        before = self.prefix_chunks.get(req)
        if before is None:  # a request this lifecycle did not admit (the SGLang call form)
            chunks = self.cache.path_kv_chunks(done.node)
        else:
            chunks = before + self.cache.path_kv_chunks(done.node, old)
        self.prefix_chunks[req] = chunks
        req.defer_prefix_indices(PrefixKV(chunks, self.cache.device))

    def cache_finished_req(self, req: Req, is_insert: bool = True) -> None:
        """Finish a request's cache work (SGLang's call; :meth:`finish` makes it and frees the row).

        Inserts the newest checkpoint (the buffer strategy's: the tracked ping-pong slot at
        ``mamba_last_track_seqlen``, or the live slot at ``kv_len``), donated without a copy, with the KV
        before it; no insert when ``is_insert`` is False or the lazy boundary slot was not had
        (``req.mamba_lazy_is_insert`` False). KV past the checkpoint (``[cache_len, kv_len)``) is freed:
        no state exists there. Every slot the request still holds is freed, its lock released and
        ``req.last_node`` cleared (of the kind it is, :meth:`lock_covers_checkpoint`; a KV-only lock's
        node, turned tombstone leaf by eviction and not extended by this insert, goes with it). The request
        row stays (the engine frees it). Validates the request and
        its KV before changing anything (not again when :meth:`finish`, which validated the request just
        before, makes the call: the request's own KV and slots are then freed trusted).
        O(new tokens + path nodes * log n).
        """
        check = not self._is_validated(req)
        if check:
            row = check_running(req, "cache_finished_req", self.req_to_token_pool, self.cache.is_attached)
            check_no_pending_insert(req, is_insert, "cache_finished_req")
        else:  # finish validated the request just before
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        protected = req.cache_protected_len
        # An aborted plan's KV is the request's too, past kv_len. Freed with the rest in one call, so a
        # page the plan continued (paged: the request's last partial page) is freed exactly once.
        plan = req.pending_plan
        kv_end = req.kv_len if plan is None else plan.end
        cache_len = protected
        if is_insert and self.buffer.finish_insert_skipped(req):
            self.cache.stats.lazy_inserts_skipped += 1
        elif is_insert:  # the null strategy (a disabled cache) has no checkpoint: cache_len stays
            cache_len = self._admitted(req, self._checkpoint_len(req, "cache_finished_req")) or protected
        own_kv = row[protected:kv_end]  # the request's KV, [protected, kv_end): a view, int32
        if check:
            check_request_kv(
                req, own_kv, "cache_finished_req", self.token_to_kv_pool_allocator, self.cache.held_kv
            )
        node = req.last_node
        assert node is not None
        keep: int | None = None
        ckpt: int | None = None
        if cache_len > protected and self.checkpoint_pool is not None:
            # quantized into a fresh checkpoint slot; every state slot of the request is freed below
            ckpt = self.cache.store_checkpoint(self.buffer.checkpoint_slot(req, self.req_to_token_pool))
            if ckpt is None:  # no checkpoint slot even after eviction: nothing inserted, the KV freed
                self.cache.stats.checkpoints_skipped += 1
                cache_len = protected
        if cache_len > protected:
            tree_slot = (
                ckpt if ckpt is not None else self.buffer.finished_tree_slot(req, self.req_to_token_pool)
            )
            suffix = self._token_key(req, protected, cache_len)
            kv = own_kv[: cache_len - protected].to(torch.int64)
            result, _ = self.cache.insert_below(node, suffix, kv, tree_slot)
            if ckpt is None:
                keep = None if result.mamba_exists else tree_slot
            elif result.mamba_exists:
                self.cache.free_checkpoint(ckpt)  # the tree has this state already
        if kv_end > cache_len:
            self.token_to_kv_pool_allocator.free(own_kv[cache_len - protected :].to(torch.int64), check)
        self.req_to_token_pool.free_mamba_cache(req, keep=keep, check=check)
        self._release_lock(req, node)
        req.pending_plan = None
        req.last_node = None
        req.mamba_last_track_seqlen = None
        self.checked_tokens.pop(req, None)
        self.prefix_chunks.pop(req, None)
