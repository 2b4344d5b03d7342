"""The cache's request lifecycle (mamba_radix.lifecycle), on the real pools, for
no_buffer, extra_buffer and extra_buffer_lazy. A small engine stamps every state it "computes"
(mamba_radix.state_stamp), so each test also checks that every checkpoint in the tree and every resumed
live state summarise exactly their prefix; invariants (with conservation) run after every step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.lifecycle import ForwardPlan
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp


class MiniEngine:
    """Plays the model for the cache's request lifecycle: every state it "computes" is stamped with the
    fingerprint of its prefix, exactly where each plan says; one request at a time or interleaved."""

    def __init__(self, cache: MambaRadixCache) -> None:
        self.cache = cache
        self.config = cache.config
        self.pool = cache.req_to_token_pool
        self.mamba_pool = cache.mamba_pool
        self.allocator = cache.token_to_kv_pool_allocator
        size = self.config.chunked_prefill_size
        self.chunk = size if size > 0 else 1 << 30
        self.running: list[Req] = []
        self.tracked: list[tuple[int, int]] = []  # (seq_len, slot) of every tracked checkpoint

    # ------------------------------------------------------------------------------------------ checks
    def check(self) -> None:
        self.cache.check_invariants(self.running)
        tree = self.cache.tree
        for node in tree.nodes():
            if node.mamba_slot is None:
                continue
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            assert read_stamp(self.mamba_pool, node.mamba_slot) == (fingerprint(tokens), node.depth)

    def _stamp(self, slot: int, req: Req, seq_len: int) -> None:
        write_stamp(self.mamba_pool, slot, fingerprint(req.token_ids(seq_len)), seq_len)

    # ------------------------------------------------------------------------------------------- steps
    def admit(self, req: Req) -> bool:
        ok = self.cache.admit(req)
        if ok:
            self.running.append(req)
            # the live state must be the state at the hit: a copy of the matched checkpoint, or empty
            assert read_stamp(self.mamba_pool, req.mamba_pool_idx) == (
                fingerprint(req.token_ids(req.kv_len)),
                req.kv_len,
            )
        self.check()
        return ok

    def forward(self, req: Req, num_tokens: int, *, finished: bool = False) -> ForwardPlan:
        """One extend / model / commit round over the next ``num_tokens`` tokens."""
        start = req.kv_len
        assert read_stamp(self.mamba_pool, req.mamba_pool_idx) == (fingerprint(req.token_ids(start)), start)
        plan = self.cache.extend(req, num_tokens)
        assert plan is not None, "test pools are sized so that KV never runs out"
        self._stamp(plan.live_slot, req, plan.end)
        if plan.track_slot is not None:
            self._stamp(plan.track_slot, req, plan.track_len)
            self.tracked.append((plan.track_len, plan.track_slot))
        self.cache.commit(plan, finished=finished)
        return plan

    def prefill_chunk(self, req: Req) -> None:
        self.forward(req, min(self.chunk, len(req.origin_input_ids) - req.kv_len))
        if req.kv_len == len(req.origin_input_ids):
            req.output_ids.append(self.output_token(req))
        self.check()

    def decode_step(self, req: Req) -> None:
        self.forward(req, 1)
        req.output_ids.append(self.output_token(req))
        self.check()

    def finish(self, req: Req) -> None:
        self.cache.finish(req)
        self.running.remove(req)
        self.check()

    @staticmethod
    def output_token(req: Req) -> int:
        return 1_000_000 + 1000 * int(req.rid) + len(req.output_ids)

    def run(self, req: Req, num_output_tokens: int) -> int:
        """The whole request; returns its usable hit length."""
        assert self.admit(req)
        hit = req.cache_protected_len
        while req.kv_len < len(req.origin_input_ids):
            self.prefill_chunk(req)
        for _ in range(num_output_tokens - 1):
            self.decode_step(req)
        self.finish(req)
        return hit


def make_engine(num_tokens: int = 4096, num_slots: int = 64, rows: int = 8, **fields: object) -> MiniEngine:
    config = CacheConfig(**fields)  # type: ignore[arg-type]
    cache = MambaRadixCache.build(
        config, num_tokens=num_tokens, num_slots=num_slots, max_running_requests=rows, max_context_len=1024
    )
    return MiniEngine(cache)


EXTRA = {"mamba_radix_cache_strategy": "extra_buffer"}
NO_BUFFER = {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}
LAZY = {"mamba_radix_cache_strategy": "extra_buffer_lazy"}


def prompt(length: int, base: int = 0) -> list[int]:
    return [base + i for i in range(length)]


# ------------------------------------------------------------------------------- identical prompts (#21158)
def test_repeated_prompt_hits_at_the_aligned_checkpoint_under_extra_buffer() -> None:
    engine = make_engine(**EXTRA)
    assert engine.run(Req(1, prompt(200)), 3) == 0
    assert engine.run(Req(2, prompt(200)), 3) == 192  # floor(200 / 64) * 64
    assert engine.run(Req(3, prompt(200)), 3) == 192


def test_repeated_aligned_prompt_checkpoints_at_the_branch_then_hits() -> None:
    engine = make_engine(**EXTRA)
    engine.run(Req(1, prompt(256)), 3)  # checkpoint at 256; the next match stops at 255
    req = Req(2, prompt(256))
    assert engine.run(req, 3) == 0
    assert req.mamba_branching_seqlen == 192
    assert (192, engine.tracked[-1][1]) in engine.tracked  # it checkpointed at the branch point
    assert engine.run(Req(3, prompt(256)), 3) == 192


def test_repeated_prompt_misses_under_no_buffer() -> None:
    # SGLang #21158: matching input[:-1] splits the cached leaf; the new parent has no state.
    engine = make_engine(**NO_BUFFER)
    engine.run(Req(1, prompt(200)), 3)
    req = Req(2, prompt(200))
    assert engine.run(req, 3) == 0
    assert req.mamba_branching_seqlen == 192  # reported, but no_buffer cannot checkpoint mid-chunk


def test_mid_edge_branch_checkpoints_at_the_branch_for_the_next_request() -> None:
    engine = make_engine(**EXTRA)
    shared = prompt(300)
    assert engine.run(Req(1, shared + prompt(100, 5000)), 2) == 0  # checkpoint at 384
    second = Req(2, shared + prompt(100, 6000))
    assert engine.run(second, 2) == 0  # KV matches 300 tokens mid-edge: no state there
    assert second.mamba_branching_seqlen == 256
    assert engine.run(Req(3, shared + prompt(100, 7000)), 2) == 256


# ---------------------------------------------------------------------------------- checkpoint positions
def test_chunked_prefill_checkpoints_once_per_full_chunk_and_frees_the_tail() -> None:
    engine = make_engine(chunked_prefill_size=128, **EXTRA)
    engine.run(Req(1, prompt(300)), 2)
    assert [seq for seq, _ in engine.tracked] == [128, 256]  # the 44-token last chunk is too short
    tree = engine.cache.tree
    assert sorted(n.depth for n in tree.nodes() if n.mamba_slot is not None) == [128, 256]
    assert engine.allocator.used == 256  # KV past the last checkpoint was freed at finish
    assert engine.mamba_pool.used == 2


def test_decode_boundaries_are_tracked_and_only_the_newest_is_inserted_at_finish() -> None:
    # SGLang: decode tracks the state at every interval boundary but inserts nothing mid-decode
    engine = make_engine(mamba_track_interval=64, **EXTRA)
    engine.run(Req(1, prompt(100)), 100)  # kv_len reaches 199
    assert [seq for seq, _ in engine.tracked] == [64, 128, 192]
    tree = engine.cache.tree
    assert sorted(n.depth for n in tree.nodes() if n.mamba_slot is not None) == [64, 192]
    assert engine.allocator.used == 192 and engine.mamba_pool.used == 2


def test_decode_insert_hands_every_boundary_to_the_tree() -> None:
    engine = make_engine(mamba_track_interval=64, mamba_decode_insert=True, **EXTRA)
    engine.run(Req(1, prompt(100)), 100)
    tree = engine.cache.tree
    assert sorted(n.depth for n in tree.nodes() if n.mamba_slot is not None) == [64, 128, 192]
    assert engine.allocator.used == 192 and engine.mamba_pool.used == 3


def test_no_buffer_copies_at_chunk_ends_and_donates_the_live_slot_at_finish() -> None:
    engine = make_engine(chunked_prefill_size=128, **NO_BUFFER)
    req = Req(1, prompt(300))
    assert engine.admit(req)
    engine.prefill_chunk(req)
    node = req.last_node
    assert node is not None and node.depth == 128 and node.mamba_slot != req.mamba_pool_idx
    assert engine.cache.stats.state_copies == 1
    while req.kv_len < 300:
        engine.prefill_chunk(req)
    engine.decode_step(req)
    live = req.mamba_pool_idx
    engine.finish(req)
    checkpoints = {n.depth: n.mamba_slot for n in engine.cache.tree.nodes() if n.mamba_slot is not None}
    assert checkpoints[301] == live  # the live slot itself, no copy
    assert sorted(checkpoints) == [128, 256, 300, 301]
    assert engine.cache.stats.state_copies == 3
    assert engine.allocator.used == 301


@pytest.mark.parametrize("fields", [EXTRA, {**EXTRA, "disable_overlap_schedule": True}, LAZY])
def test_extra_buffer_donates_the_tracked_slot_without_a_copy(fields: dict) -> None:
    engine = make_engine(**fields)
    req = Req(1, prompt(100))
    assert engine.admit(req)
    engine.prefill_chunk(req)
    ((seq_len, tracked_slot),) = engine.tracked
    assert seq_len == 64 and req.last_node is not None and req.last_node.mamba_slot == tracked_slot
    assert engine.cache.stats.state_copies == 0
    assert tracked_slot not in (req.mamba_ping_pong_track_buffer or [])  # replaced by a fresh slot
    engine.finish(req)


def test_finish_insert_that_finds_an_existing_checkpoint_frees_every_slot() -> None:
    # b tracks at 64 but inserts only at finish (SGLang's decode path); a inserted 64 meanwhile.
    engine = make_engine(**EXTRA)
    a, b = Req(1, prompt(100)), Req(2, prompt(100))
    assert engine.admit(a) and engine.admit(b)
    engine.prefill_chunk(a)
    engine.forward(b, 100, finished=True)  # tracks 64; nothing handed over before finish
    b.output_ids.append(engine.output_token(b))
    engine.finish(b)  # checks conservation: b's tracked slot must not leak
    assert engine.cache.stats.checkpoints_existing == 1
    engine.finish(a)
    assert engine.mamba_pool.used == 1 and engine.allocator.used == 64


# ---------------------------------------------------------------------------------------- degradation
def test_lazy_tracks_in_place_when_no_boundary_slot_is_free() -> None:
    # 3 slots: live + one track slot + the checkpoint at 64 (locked by the request): at the decode
    # boundary 128 nothing can be borrowed (the borrow never evicts), so the state is tracked over the
    # held track slot, and finish inserts it there.
    engine = make_engine(num_slots=3, mamba_track_interval=64, **LAZY)
    req = Req(1, prompt(64))
    assert engine.admit(req)
    engine.prefill_chunk(req)
    held = list(req.mamba_ping_pong_track_buffer or [])
    for _ in range(64):
        engine.decode_step(req)
    assert engine.tracked[-1] == (128, held[req.mamba_next_track_idx])
    assert req.mamba_lazy_is_insert
    engine.finish(req)
    assert engine.cache.stats.lazy_inserts_skipped == 0
    assert sorted(n.depth for n in engine.cache.tree.nodes() if n.mamba_slot is not None) == [64, 128]
    assert engine.allocator.used == 128


def test_lazy_borrows_the_second_slot_at_a_boundary_and_releases_the_old_one() -> None:
    engine = make_engine(num_slots=16, mamba_track_interval=64, **LAZY)
    req = Req(1, prompt(64))
    assert engine.admit(req)
    engine.prefill_chunk(req)
    (old,) = [s for s in req.mamba_ping_pong_track_buffer or [] if s > 0]
    for _ in range(64):
        engine.decode_step(req)
    (new,) = [s for s in req.mamba_ping_pong_track_buffer or [] if s > 0]
    assert new != old and engine.tracked[-1] == (128, new)
    assert not engine.mamba_pool.is_allocated([old])[0]  # released after the boundary
    engine.finish(req)


def test_slot_exhaustion_skips_checkpoints_without_crashing() -> None:
    engine = make_engine(num_slots=2, chunked_prefill_size=64, disable_overlap_schedule=True, **EXTRA)
    engine.run(Req(1, prompt(200)), 2)  # live + one track slot: no slot is ever free for a donation
    assert engine.cache.stats.checkpoints_skipped == 3
    assert engine.allocator.used == 0 and engine.mamba_pool.used == 0


def test_admission_failure_undoes_lock_and_copy_on_write_slot() -> None:
    engine = make_engine(rows=1, **EXTRA)
    engine.run(Req(1, prompt(130)), 2)  # checkpoint at 128
    first = Req(2, prompt(10, 9000))
    assert engine.admit(first)
    second = Req(3, prompt(130))
    slots_before = engine.mamba_pool.used
    assert not engine.admit(second)  # no request row left
    assert second.last_node is None and second.mamba_pool_idx is None and second.cache_protected_len == 0
    assert engine.mamba_pool.used == slots_before
    assert engine.cache.mamba_protected_size() == 0  # the matched checkpoint is not left locked
    engine.finish(first)


def test_disabled_radix_cache_never_hits_and_frees_everything() -> None:
    engine = make_engine(disable_radix_cache=True, chunked_prefill_size=64, **NO_BUFFER)
    assert engine.run(Req(1, prompt(100)), 3) == 0
    assert engine.run(Req(2, prompt(100)), 3) == 0
    assert engine.cache.tree.num_nodes == 1
    assert engine.allocator.used == 0 and engine.mamba_pool.used == 0


# --------------------------------------------------------------------------------------- concurrency
def test_two_requests_prefilling_the_same_prompt_share_one_copy() -> None:
    engine = make_engine(chunked_prefill_size=64, **EXTRA)
    a, b = Req(1, prompt(160)), Req(2, prompt(160))
    assert engine.admit(a) and engine.admit(b)
    while a.kv_len < 160 or b.kv_len < 160:
        for req in (a, b):
            if req.kv_len < 160:
                engine.prefill_chunk(req)
    assert a.last_node is b.last_node  # b's insert found a's checkpoints: its duplicate KV was freed
    row_a = engine.pool.req_to_token[a.req_pool_idx, :128]
    row_b = engine.pool.req_to_token[b.req_pool_idx, :128]
    assert torch.equal(row_a, row_b)
    assert engine.cache.stats.checkpoints_existing == 2
    engine.finish(a)
    engine.finish(b)
    assert engine.allocator.used == 128 and engine.mamba_pool.used == 2


def test_paged_lifecycle_keeps_whole_pages() -> None:
    engine = make_engine(page_size=4, mamba_cache_chunk_size=16, mamba_track_interval=32, **EXTRA)
    assert engine.run(Req(1, prompt(70)), 20) == 0  # tracks at 64 (prefill) and 64 + 32 = 96 (decode)
    assert engine.run(Req(2, prompt(70)), 5) == 64
    third = Req(3, [*prompt(61), 7, 7, 7])  # matches 60 tokens (whole pages) of KV, no state before 64
    assert engine.run(third, 3) == 0
    assert third.mamba_branching_seqlen == 48  # so it checkpoints at 48 ...
    assert engine.run(Req(4, [*prompt(50), 9, 9]), 3) == 48  # ... where the next one hits
    assert engine.allocator.used % 4 == 0


# ------------------------------------------------------------------------------------ random workloads
strategy_fields = st.sampled_from(
    [
        NO_BUFFER,
        EXTRA,
        {**EXTRA, "disable_overlap_schedule": True},
        LAZY,
        {**EXTRA, "page_size": 4},
    ]
)


@given(
    fields=strategy_fields,
    order=st.sampled_from(["leaf_first", "root_first", "mixed"]),
    cap=st.sampled_from([-1, 1, 2]),
    chunk=st.sampled_from([16, 32, 48]),
    num_slots=st.integers(4, 12),
    num_tokens=st.sampled_from([512, 1024]),
    requests=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 3), st.integers(1, 30)),
        min_size=1,
        max_size=6,
    ),
    interleave=st.booleans(),
)
def test_random_workloads_keep_every_invariant(
    fields: dict,
    order: str,
    cap: int,
    chunk: int,
    num_slots: int,
    num_tokens: int,
    requests: list[tuple[int, int, int, int]],
    interleave: bool,
) -> None:
    engine = make_engine(
        num_tokens=num_tokens,
        num_slots=num_slots,
        mamba_cache_chunk_size=8,
        mamba_track_interval=16,
        chunked_prefill_size=chunk,
        mamba_eviction_order=order,
        mamba_max_states_per_path=cap,
        **fields,
    )
    # Prompts share one of four stems, then diverge: hits, splits, branches and tombstones are common.
    reqs = []
    for rid, (stem, stem_len, tail_base, tail_len) in enumerate(requests):
        tokens = prompt(stem_len, 100 * stem) + prompt(tail_len, 10_000 * tail_base + rid)
        reqs.append((Req(rid, tokens or [1]), tail_len))
    if not interleave:
        for req, num_out in reqs:
            engine.run(req, num_out)
    else:
        active = [(req, n) for req, n in reqs if engine.admit(req)]
        while active:
            for req, num_out in list(active):
                if req.kv_len < len(req.origin_input_ids):
                    engine.prefill_chunk(req)
                elif len(req.output_ids) < num_out:
                    engine.decode_step(req)
                else:
                    engine.finish(req)
                    active.remove((req, num_out))
    engine.cache.check_invariants([])
    tree_tokens = sum(len(n.key) for n in engine.cache.tree.nodes())
    assert engine.allocator.used == tree_tokens
    assert engine.mamba_pool.used == len(engine.cache.tree.slot_owner)
