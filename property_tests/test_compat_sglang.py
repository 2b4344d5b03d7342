"""mamba_radix.compat.sglang: SGLang's call forms over the core (issue 27, item 2).

SGLang's request-level sequence (match with copy-on-write, lock, pool alloc, chunks handed over with
cache_unfinished_req, cache_finished_req, row freed; aborts; eviction) through the compat layer gives the
same hits, the same states and the same pool accounting as the lifecycle; the hand-over of a running
request's slot in SGLang's insert form is atomic; refused calls change nothing and raise typed errors.
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from mamba_radix import CacheConfig
from mamba_radix import MambaRadixCache as CoreCache
from mamba_radix import Req as CoreReq
from mamba_radix.compat.sglang import (
    SGLANG_VERSION,
    CacheInitParams,
    DecLockRefParams,
    EvictParams,
    HybridReqToTokenPool,
    InsertParams,
    MambaRadixCache,
    MatchPrefixParams,
    RadixKey,
    Req,
    TokenToKVPoolAllocator,
    available_and_evictable_str,
)
from mamba_radix.compat.sglang_pools import PagedTokenToKVPoolAllocator
from mamba_radix.errors import InvalidArgument, InvalidIndex, MambaRadixError
from mamba_radix.lifecycle import ForwardPlan
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp

KV_TOKENS = 160
SLOTS = 12


def build(
    page_size: int, extra_buffer: bool, kv_tokens: int = KV_TOKENS, slots: int = SLOTS
) -> MambaRadixCache:
    """SGLang's construction order: the pools first, then the cache from CacheInitParams."""
    pool = HybridReqToTokenPool(
        size=4, mamba_size=slots, max_context_len=96, enable_mamba_extra_buffer=extra_buffer
    )
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(size=kv_tokens)
    else:
        allocator = PagedTokenToKVPoolAllocator(size=kv_tokens, page_size=page_size)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        enable_mamba_extra_buffer=extra_buffer,
        chunked_prefill_size=max(8, page_size),  # a chunk ends on a page boundary
    )
    return MambaRadixCache(params, config=CacheConfig(mamba_cache_chunk_size=4))


def lifecycle_twin(cache: MambaRadixCache) -> CoreCache:
    """A core cache of the same config and pool sizes, driven through the lifecycle."""
    core = cache.core
    return CoreCache.build(
        cache.config,
        num_tokens=core.token_to_kv_pool_allocator.size,
        num_slots=core.mamba_pool.size,
        max_running_requests=core.req_to_token_pool.size,
        max_context_len=96,
    )


def stamp(pool, plan: ForwardPlan, tokens: list[int]) -> None:
    """The model: the state at plan.end into the live slot, the state at track_len into the track slot."""
    write_stamp(pool, plan.live_slot, fingerprint(tokens[: plan.end]), plan.end)
    if plan.track_slot is not None:
        write_stamp(pool, plan.track_slot, fingerprint(tokens[: plan.track_len]), plan.track_len)


def accounting(core: CoreCache) -> tuple:
    return (
        core.token_to_kv_pool_allocator.available_size(),
        core.mamba_pool.available_size(),
        core.full_evictable_size(),
        core.mamba_evictable_size(),
        core.full_protected_size(),
        core.mamba_protected_size(),
    )


def serve_lifecycle(core: CoreCache, tokens: list[int], outputs: int, abort: bool) -> int:
    req = CoreReq(rid=len(tokens), origin_input_ids=list(tokens))
    assert core.admit(req, max_new_tokens=outputs + 1)
    hit = req.cache_protected_len
    run_chunks(core, req, outputs, lambda plan, last: core.commit(plan, finished=last))
    core.finish(req, insert=not abort)
    return hit


def serve_sglang(cache: MambaRadixCache, tokens: list[int], outputs: int, abort: bool) -> int:
    """SGLang's scheduler around the cache: match input[:-1] with copy-on-write, lock the hit, evict the
    slots the pool will take, alloc the row and slots, write the hit into the row; each chunk's checkpoint
    with cache_unfinished_req; at the end cache_finished_req and the row freed."""
    core = cache.core
    req = Req(rid=len(tokens), origin_input_text="", origin_input_ids=array("q", tokens))
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:-1]), cow_mamba=True, req=req))
    cache.inc_lock_ref(m.last_device_node)
    take = (req.mamba_pool_idx is None) + cache.config.slot_budget.track_slots_held
    short = take - cache.req_to_token_pool.mamba_allocator.available_size()
    if short > 0:
        cache.evict(EvictParams(mamba_num=short))
    assert cache.req_to_token_pool.alloc([req]) is not None
    hit = req.cache_protected_len
    assert len(req.prefix_indices) == hit
    core.req_to_token_pool.write(req.req_pool_idx, 0, m.device_indices)
    if not hit:
        core.mamba_pool.clear_slots([req.core.mamba_pool_idx])
    req.kv_committed_len = hit

    def forward_done(plan: ForwardPlan, last: bool) -> None:
        # the forward ran; the engine records it and hands prefill checkpoints over in SGLang's call
        core.commit(plan, finished=True)
        if plan.is_prefill and not last:
            cache.cache_unfinished_req(req, chunked=True)
            assert len(req.prefix_indices) == req.cache_protected_len

    run_chunks(core, req.core, outputs, forward_done)
    cache.cache_finished_req(req, is_insert=not abort)
    cache.req_to_token_pool.free(req)
    return hit


def run_chunks(core: CoreCache, req: CoreReq, outputs: int, done) -> None:
    prompt_len = len(req.origin_input_ids)
    while True:
        prefill = req.kv_len < prompt_len
        n = core.prefill_chunk_len(req, max(8, core.config.page_size)) if prefill else 1
        plan = core.extend(req, n)
        assert plan is not None
        stamp(core.mamba_pool, plan, req.all_token_ids)
        last = plan.end == prompt_len + outputs
        done(plan, last)
        if plan.end >= prompt_len:
            if len(req.output_ids) == outputs:
                return
            req.output_ids.append(9)


def workload(seed: int) -> list[tuple[list[int], int, bool]]:
    rng = random.Random(seed)
    bases = [list(range(100 * b, 100 * b + 30)) for b in range(3)]
    out = []
    for _ in range(14):
        base = rng.choice(bases)
        prompt = base[: rng.randint(6, 30)] + [rng.randint(1, 50) for _ in range(rng.randint(0, 6))]
        out.append((prompt, rng.randint(0, 3), rng.random() < 0.15))
    return out


@pytest.mark.parametrize(("page_size", "extra_buffer"), [(1, False), (1, True), (4, True), (16, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_sglang_call_sequence_gives_the_lifecycles_hits_and_accounting(
    page_size: int, extra_buffer: bool, seed: int
) -> None:
    """Small pools (12 slots, 160 KV tokens): admissions and chunks evict. no_buffer needs page 1 (as in
    SGLang)."""
    cache = build(page_size, extra_buffer)
    twin = lifecycle_twin(cache)
    for tokens, outputs, abort in workload(seed):
        hit_sglang = serve_sglang(cache, tokens, outputs, abort)
        hit_lifecycle = serve_lifecycle(twin, tokens, outputs, abort)
        assert hit_sglang == hit_lifecycle
        assert accounting(cache.core) == accounting(twin)
        assert cache.core.pretty_print() == twin.pretty_print()
        cache.sanity_check()
        # every hit restores the state of its own prefix
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
        if m.cache_protected_len:
            assert read_stamp(cache.core.mamba_pool, m.last_device_node.mamba_slot) == (
                fingerprint(tokens[: m.cache_protected_len]),
                m.cache_protected_len,
            )
        twin.match_prefix(RadixKey(tokens))  # the same recency refresh on both sides
    assert cache.core.stats == twin.stats


# --------------------------------------------------------------------------- the insert hand-over
def make_dummy_req(cache: MambaRadixCache, rid: int = 0) -> Req:
    """SGLang's unit-test request: a row and a live slot, no tokens."""
    req = Req(rid=rid, origin_input_text="", origin_input_ids=array("q"))
    assert cache.req_to_token_pool.alloc([req]) is not None
    return req


def check_one_owner_per_slot(cache: MambaRadixCache) -> None:
    """Every allocated state slot is a tree checkpoint or a running request's, never both (the requests
    of SGLang's unit tests hold a row and a slot but no lock, so invariant 7 does not apply to them)."""
    core = cache.core
    tree_slots = [n.mamba_slot for n in core.tree.nodes() if n.mamba_slot is not None]
    held = core.req_to_token_pool.reserved_slots()
    assert len(set(tree_slots)) == len(tree_slots) and not set(tree_slots) & set(held)
    assert sorted(tree_slots + held) == sorted(core.mamba_pool.allocated_slots().tolist())


def snapshot(cache: MambaRadixCache, *reqs: Req) -> tuple:
    core = cache.core
    pool = core.req_to_token_pool
    return (
        core.pretty_print(),
        accounting(core),
        str(core.stats),
        pool.num_reserved_slots(),
        pool.reserved_slots(),
        tuple(
            (
                r.core.mamba_pool_idx,
                r.req_pool_idx,
                r.core.mamba_next_track_idx,
                tuple(r.core.mamba_ping_pong_track_buffer or ()),
            )
            for r in reqs
        ),
    )


def test_insert_hands_a_running_requests_slot_over_in_the_same_call() -> None:
    cache = build(1, extra_buffer=False)
    allocator = cache.token_to_kv_pool_allocator
    req = make_dummy_req(cache)
    slot = int(req.mamba_pool_idx)
    result = cache.insert(
        InsertParams(
            key=RadixKey([1, 2, 3]), value=allocator.alloc(3), mamba_value=req.mamba_pool_idx.unsqueeze(0)
        )
    )
    assert (result.prefix_len, result.mamba_exist) == (0, False)
    assert result.last_device_node.mamba_slot == slot
    assert req.mamba_pool_idx is None  # the request gave it up
    assert not cache.core.req_to_token_pool.is_slot_held(slot)
    check_one_owner_per_slot(cache)
    cache.req_to_token_pool.free(req)  # it holds no slot now: its row can go
    cache.sanity_check()


def test_insert_where_a_checkpoint_exists_leaves_the_slot_with_the_request() -> None:
    cache = build(1, extra_buffer=False)
    allocator = cache.token_to_kv_pool_allocator
    first, second = make_dummy_req(cache, 1), make_dummy_req(cache, 2)
    cache.insert(
        InsertParams(key=RadixKey([1, 2, 3]), value=allocator.alloc(3), mamba_value=first.mamba_pool_idx)
    )
    slot = int(second.mamba_pool_idx)
    kv = allocator.alloc(3)
    result = cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=kv, mamba_value=second.mamba_pool_idx))
    assert (result.prefix_len, result.mamba_exist) == (3, True)
    assert int(second.mamba_pool_idx) == slot
    assert cache.core.req_to_token_pool.slot_holder(slot) is second.core
    check_one_owner_per_slot(cache)


@pytest.mark.parametrize(
    "bad",
    ["kv_not_allocated", "kv_repeats", "kv_of_the_tree", "float_slot", "two_slots", "no_key"],
)
def test_a_refused_hand_over_changes_nothing(bad: str) -> None:
    cache = build(1, extra_buffer=False)
    allocator = cache.token_to_kv_pool_allocator
    other = make_dummy_req(cache, 1)
    tree_kv = allocator.alloc(3)
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=tree_kv, mamba_value=other.mamba_pool_idx))
    req = make_dummy_req(cache, 2)
    kv = allocator.alloc(5)
    key: RadixKey | None = RadixKey([1, 2, 3, 4, 5])
    mamba_value: object = req.mamba_pool_idx.unsqueeze(0)
    if bad == "kv_not_allocated":
        allocator.free(kv[4:])
    elif bad == "kv_repeats":
        kv = torch.cat([kv[:4], kv[:1]])
    elif bad == "kv_of_the_tree":
        kv = torch.cat([kv[:3], tree_kv[:1], kv[4:]])
        key = RadixKey([7, 8, 9, 10, 11])
    elif bad == "float_slot":
        mamba_value = req.mamba_pool_idx.float()
    elif bad == "two_slots":
        mamba_value = torch.tensor([int(req.mamba_pool_idx), 1])
    else:
        key = None
    before = snapshot(cache, req, other)
    with pytest.raises((InvalidArgument, InvalidIndex)):
        cache.insert(InsertParams(key=key, value=kv, mamba_value=mamba_value))
    assert snapshot(cache, req, other) == before
    assert req.mamba_pool_idx is not None
    check_one_owner_per_slot(cache)


def paged_keys(page_size: int) -> list[list[int]]:
    """Page-aligned keys sharing prefixes: a split, a branch, an extension."""
    p = page_size
    return [
        list(range(1, 1 + 2 * p)),
        list(range(1, 1 + p)) + list(range(500, 500 + p)),
        list(range(1, 1 + 3 * p)),
        list(range(900, 900 + p)),
    ]


@pytest.mark.parametrize("page_size", [4, 16])
def test_insert_hands_over_the_live_slot_of_a_request_with_a_track_buffer(page_size: int) -> None:
    """SGLang's unit-test insert under extra_buffer: the request holds a row, a live slot and a ping-pong
    track buffer, and its live slot is inserted. The request gives up the live slot only (its row and
    track buffer stay); the pool counts one reserved slot less; every hit restores its own prefix's
    stamp; once the requests are released, hits and pool accounting equal a twin cache that inserted the
    same keys with slots no request held."""
    cache, twin = build(page_size, extra_buffer=True, slots=24), build(page_size, extra_buffer=True, slots=24)
    core, pool = cache.core, cache.core.req_to_token_pool
    reqs, twin_reqs = [], []
    for i, tokens in enumerate(paged_keys(page_size)):
        req = make_dummy_req(cache, i)
        track, slot = req.mamba_ping_pong_track_buffer.tolist(), int(req.mamba_pool_idx)
        assert len(track) == 2 and -1 not in track
        write_stamp(core.mamba_pool, slot, fingerprint(tokens), len(tokens))
        reserved = pool.num_reserved_slots()
        result = cache.insert(
            InsertParams(
                key=RadixKey(tokens),
                value=cache.token_to_kv_pool_allocator.alloc(len(tokens)),
                mamba_value=req.mamba_pool_idx.unsqueeze(0),
            )
        )
        assert not result.mamba_exist and result.last_device_node.mamba_slot == slot
        assert req.mamba_pool_idx is None and req.mamba_ping_pong_track_buffer.tolist() == track
        assert pool.slot_holder(slot) is None and pool.num_reserved_slots() == reserved - 1
        assert all(pool.slot_holder(t) is req.core for t in track)
        check_one_owner_per_slot(cache)
        cache.sanity_check()
        reqs.append(req)
        # the twin: the same request admitted, the same key inserted with a slot nobody holds
        twin_req = make_dummy_req(twin, i)
        free_slot = twin.core.mamba_pool.alloc(1, as_list=True)[0]
        write_stamp(twin.core.mamba_pool, free_slot, fingerprint(tokens), len(tokens))
        twin.insert(
            InsertParams(
                key=RadixKey(tokens),
                value=twin.token_to_kv_pool_allocator.alloc(len(tokens)),
                mamba_value=free_slot,
            )
        )
        twin_reqs.append(twin_req)
    for req in reqs + twin_reqs:
        owner = cache if req in reqs else twin
        owner.req_to_token_pool.free_mamba_cache(req)  # the track buffer (and the twin's live slot)
        owner.req_to_token_pool.free(req)
    assert accounting(core) == accounting(twin.core)
    assert pool.num_reserved_slots() == 0
    for tokens in paged_keys(page_size):
        probe = RadixKey([*tokens, 7777])
        m, m_twin = (
            cache.match_prefix(MatchPrefixParams(key=probe)),
            twin.match_prefix(MatchPrefixParams(key=probe)),
        )
        assert m.cache_protected_len == m_twin.cache_protected_len == len(tokens)
        assert read_stamp(core.mamba_pool, m.last_device_node.mamba_slot) == (
            fingerprint(tokens),
            len(tokens),
        )
    assert accounting(core) == accounting(twin.core)
    cache.sanity_check()


@pytest.mark.parametrize("page_size", [4, 16])
def test_insert_of_an_existing_checkpoint_leaves_the_live_slot_with_a_tracking_request(
    page_size: int,
) -> None:
    cache = build(page_size, extra_buffer=True)
    tokens = paged_keys(page_size)[0]
    first, second = make_dummy_req(cache, 1), make_dummy_req(cache, 2)
    allocator = cache.token_to_kv_pool_allocator
    cache.insert(
        InsertParams(
            key=RadixKey(tokens), value=allocator.alloc(len(tokens)), mamba_value=first.mamba_pool_idx
        )
    )
    before = snapshot(cache, second)
    kv = allocator.alloc(len(tokens))
    result = cache.insert(InsertParams(key=RadixKey(tokens), value=kv, mamba_value=second.mamba_pool_idx))
    assert (result.prefix_len, result.mamba_exist) == (len(tokens), True)
    assert snapshot(cache, second)[3:] == before[3:]  # the request holds what it held
    check_one_owner_per_slot(cache)
    cache.sanity_check()


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize(
    "bad", ["kv_not_allocated", "kv_repeats", "kv_of_the_tree", "track_slot", "core_raises"]
)
def test_a_refused_hand_over_from_a_tracking_request_changes_nothing(
    page_size: int, bad: str, monkeypatch
) -> None:
    """A refused insert of a tracking request's slot (typed error, or any exception inside the core's
    insert) leaves the request holding its live slot and track buffer, and the tree and pools unchanged."""
    cache = build(page_size, extra_buffer=True)
    allocator = cache.token_to_kv_pool_allocator
    other = make_dummy_req(cache, 1)
    keys = paged_keys(page_size)
    tree_kv = allocator.alloc(len(keys[0]))
    cache.insert(InsertParams(key=RadixKey(keys[0]), value=tree_kv, mamba_value=other.mamba_pool_idx))
    req = make_dummy_req(cache, 2)
    tokens = keys[2]
    kv = allocator.alloc(len(tokens))
    mamba_value: object = req.mamba_pool_idx.unsqueeze(0)
    error: type[BaseException] | tuple[type[BaseException], ...] = (InvalidArgument, InvalidIndex)
    if bad == "kv_not_allocated":
        allocator.free(kv[-page_size:])
    elif bad == "kv_repeats":
        kv = torch.cat([kv[:-1], kv[:1]])
    elif bad == "kv_of_the_tree":
        kv = torch.cat([kv[: 2 * page_size], tree_kv[:page_size]])
        tokens = keys[3] + keys[3] + keys[3]
    elif bad == "track_slot":
        mamba_value = int(req.mamba_ping_pong_track_buffer[0])
    else:

        def fail(*args, **kwargs):
            raise RuntimeError("injected fault inside the core's insert")

        monkeypatch.setattr(cache.core, "insert", fail)
        error = RuntimeError
    before = snapshot(cache, req, other)
    with pytest.raises(error):
        cache.insert(InsertParams(key=RadixKey(tokens), value=kv, mamba_value=mamba_value))
    assert snapshot(cache, req, other) == before
    assert req.mamba_pool_idx is not None
    check_one_owner_per_slot(cache)
    monkeypatch.undo()
    cache.sanity_check()


# ------------------------------------------------------------------------------- typed refusals
def test_typed_refusals_change_nothing() -> None:
    cache = build(1, extra_buffer=False)
    req = make_dummy_req(cache)
    before = snapshot(cache, req)
    pool = cache.req_to_token_pool
    with pytest.raises(InvalidArgument, match="still holds state slots"):
        pool.free(req)  # SGLang leaks the slot here; we refuse (documented)
    with pytest.raises(InvalidArgument, match="pool's field"):
        req.mamba_pool_idx = None
    with pytest.raises(InvalidArgument, match="ping-pong entry"):
        pool.free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=0)
    with pytest.raises(InvalidArgument):
        cache.match_prefix(RadixKey([1, 2]))  # not MatchPrefixParams
    with pytest.raises(InvalidArgument):
        cache.evict(EvictParams(swa_num_tokens=1))
    with pytest.raises(InvalidArgument):
        cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=torch.arange(4), mamba_value=None))
    assert snapshot(cache, req) == before
    with pytest.raises(InvalidArgument, match="enable_session_radix_cache"):
        MambaRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=pool,
                token_to_kv_pool_allocator=cache.token_to_kv_pool_allocator,
                page_size=1,
                enable_session_radix_cache=True,
            )
        )
    assert issubclass(InvalidArgument, MambaRadixError)


def test_pool_in_use_cannot_be_rebound_to_another_config() -> None:
    pool = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=32, enable_mamba_extra_buffer=True)
    allocator = PagedTokenToKVPoolAllocator(size=32, page_size=4)
    pool.alloc([Req(rid=1, origin_input_ids=array("q"))])
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=4,
        enable_mamba_extra_buffer=True,
    )
    with pytest.raises(InvalidArgument, match="in use"):
        MambaRadixCache(params)


def test_accessors_and_strings() -> None:
    cache = build(1, extra_buffer=False)
    req = make_dummy_req(cache)
    kv = cache.token_to_kv_pool_allocator.alloc(4)
    cache.insert(InsertParams(key=RadixKey([5, 6, 7, 8]), value=kv, mamba_value=req.mamba_pool_idx))
    assert cache.evictable_size() == (4, 1)
    assert cache.protected_size() == (0, 0)
    assert cache.total_size() == (4, 1)
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey([5, 6, 7, 8]))).last_device_node
    assert cache.inc_lock_ref(node).delta == 4
    assert cache.protected_size() == (4, 1)
    assert cache.dec_lock_ref(node).delta == 4
    text = available_and_evictable_str(cache)
    assert "full evictable: 4" in text and "mamba evictable: 1" in text
    assert SGLANG_VERSION == "0.5.23"
    cache.sanity_check()


def test_a_token_allocator_given_to_a_paged_cache_pages_while_unused() -> None:
    """SGLang hands its token-granular allocator to a paged cache too; the core takes a paged one."""
    pool = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=32, enable_mamba_extra_buffer=True)
    allocator = TokenToKVPoolAllocator(size=32)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=4,
        enable_mamba_extra_buffer=True,
    )
    cache = MambaRadixCache(params)
    assert allocator.core is cache.core.token_to_kv_pool_allocator
    assert (allocator.page_size, allocator.available_size()) == (4, 32)
    used = TokenToKVPoolAllocator(size=32)
    used.alloc(4)
    pool2 = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=32, enable_mamba_extra_buffer=True)
    with pytest.raises(InvalidArgument, match="in use"):
        MambaRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=pool2,
                token_to_kv_pool_allocator=used,
                page_size=4,
                enable_mamba_extra_buffer=True,
            )
        )
    assert (used.page_size, used.available_size()) == (1, 28)


def test_the_scheduler_writes_its_fields_in_sglangs_form() -> None:
    """SGLang's unit tests set up a request by hand: the row written with (row, slice), the match fields,
    the committed length; then cache_unfinished_req hands the prefix over and releases as SGLang does."""
    cache = build(1, extra_buffer=False)
    pool = cache.req_to_token_pool
    req = make_dummy_req(cache)
    tokens = list(range(40, 48))
    req.origin_input_ids = array("q", tokens)
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    pool.write((req.req_pool_idx, slice(0, len(tokens))), kv)
    req.kv_committed_len = len(tokens)
    req.last_node = cache.root_node
    req.cache_protected_len = 0
    req.extra_key = None
    req.set_extend_range(0, len(tokens))
    cache.cache_unfinished_req(req)
    assert req.cache_protected_len == len(req.prefix_indices) == len(tokens)
    assert req.prefix_indices.tolist() == kv.tolist()
    cache.dec_lock_ref(req.last_node, DecLockRefParams())
    assert req.pop_overallocated_kv_cache() == (len(tokens), len(tokens))
    assert len(cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).device_indices) == len(tokens)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_a_quantized_checkpoint_format_is_refused_with_nothing_changed(fmt: str) -> None:
    """SGLang's call forms read a checkpoint as a state slot; under a quantized format it is a slot of
    another pool, so the compat cache refuses the format at construction, before binding any pool."""
    pool = HybridReqToTokenPool(size=2, mamba_size=4, max_context_len=32, enable_mamba_extra_buffer=True)
    allocator = PagedTokenToKVPoolAllocator(size=32, page_size=4)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=4,
        enable_mamba_extra_buffer=True,
    )
    before = (pool.config, allocator.page_size, allocator.available_size(), pool.mamba_pool.core.used)
    with pytest.raises(InvalidArgument, match=f"checkpoint_format='{fmt}' keeps them in a quantized pool"):
        MambaRadixCache(params, config=CacheConfig(checkpoint_format=fmt))  # type: ignore[arg-type]
    assert (pool.config, allocator.page_size, allocator.available_size(), pool.mamba_pool.core.used) == before
    assert MambaRadixCache(params, config=CacheConfig()).core.checkpoint_pool is None  # "model" is served
