"""The two paged-lifecycle defects of issue 32, as an engine would meet them, and the allocator audit that
catches a double free at the next invariant check.

1. A prefill chunk that ends inside a page made the next chunk's checkpoint land inside a page, and the
   commit refused it only after it had moved ``kv_len``, the ping-pong index and the chunk count. Now
   ``extend`` refuses such a chunk with nothing changed (SGLang's scheduler never cuts one: a chunk ends
   on a page boundary or at the prompt's end), ``prefill_chunk_len`` gives the length that does, and
   ``commit`` validates its hand-over before it changes anything.
2. Aborting with an uncommitted plan that continued the request's last partial page freed that page
   twice (once as the plan's KV, once as the request's). Now the request's KV and the plan's are freed
   in one call, each page once.
"""

from __future__ import annotations

import pytest

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import InvalidArgument, InvariantError
from mamba_radix.state_stamp import fingerprint, write_stamp

PAGED = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", page_size=4, chunked_prefill_size=6, mamba_cache_chunk_size=4
)


def request_fields(req: Req) -> tuple:
    return (
        req.kv_len,
        req.pending_plan,
        req.prefill_chunks,
        req.mamba_next_track_idx,
        req.mamba_last_track_seqlen,
        req.cache_protected_len,
        req.kv_reserved_tokens,
        req.mamba_pool_idx,
        tuple(req.mamba_ping_pong_track_buffer or ()),
    )


def pool_state(cache: MambaRadixCache) -> tuple:
    return (
        cache.token_to_kv_pool_allocator.available_size(),
        cache.mamba_pool.available_size(),
        cache.reserved_kv_tokens,
        cache.full_evictable_size(),
        cache.mamba_evictable_size(),
        cache.pretty_print(),
    )


def test_an_unaligned_prefill_chunk_is_refused_by_extend_with_nothing_changed() -> None:
    cache = MambaRadixCache.build(PAGED, num_tokens=256, num_slots=32)
    req = Req(rid=1, origin_input_ids=list(range(100, 120)))
    assert cache.admit(req, max_new_tokens=2)
    before, pools = request_fields(req), pool_state(cache)
    with pytest.raises(InvalidArgument, match=r"must end on a page boundary .*prefill_chunk_len"):
        cache.extend(req, 6)  # [0, 6) ends inside page [4, 8)
    assert request_fields(req) == before and pool_state(cache) == pools
    cache.check_invariants([req])


def test_the_readme_loop_with_prefill_chunk_len_commits_every_chunk_the_cache_plans() -> None:
    """chunked_prefill_size=6 at page_size=4: chunks of 4 tokens (the page-aligned cut), every tracked
    checkpoint on a page, and the request finishes with its checkpoints in the tree."""
    cache = MambaRadixCache.build(PAGED, num_tokens=256, num_slots=32)
    prompt = list(range(100, 122))  # 22 tokens: the last chunk ends at the prompt's end, inside a page
    req = Req(rid=1, origin_input_ids=prompt)
    assert cache.admit(req, max_new_tokens=3)
    spans = []
    while req.kv_len < len(prompt):
        n = cache.prefill_chunk_len(req, PAGED.chunked_prefill_size)
        plan = cache.extend(req, n)
        assert plan is not None
        spans.append((plan.start, plan.end, plan.track_len))
        write_stamp(cache.mamba_pool, plan.live_slot, fingerprint(prompt[: plan.end]), plan.end)
        if plan.track_slot is not None:
            write_stamp(
                cache.mamba_pool, plan.track_slot, fingerprint(prompt[: plan.track_len]), plan.track_len
            )
        cache.commit(plan)
        cache.check_invariants([req])
    assert spans == [(0, 4, 4), (4, 8, 8), (8, 12, 12), (12, 16, 16), (16, 22, 20)]
    for token in (7, 8):
        req.output_ids.append(token)
        cache.commit(cache.extend(req, 1))
    cache.finish(req)
    cache.check_invariants()
    assert cache.match_prefix(prompt).device_indices.numel() == 20


def test_prefill_chunk_len_is_sglangs_page_cut() -> None:
    cache = MambaRadixCache.build(PAGED, num_tokens=256, num_slots=32)
    req = Req(rid=1, origin_input_ids=list(range(30)))
    assert cache.admit(req, max_new_tokens=1)
    assert [cache.prefill_chunk_len(req, b) for b in (0, 3, 4, 6, 8, 29, 30, 100)] == [
        0,
        0,
        4,
        4,
        8,
        28,
        30,
        30,
    ]
    with pytest.raises(InvalidArgument, match="budget"):
        cache.prefill_chunk_len(req, -1)


def test_commit_validates_its_hand_over_before_changing_anything() -> None:
    """A hand-over the commit must refuse (here a tracked length edited past the page grid) leaves the
    request, its plan and the pools exactly as they were."""
    cache = MambaRadixCache.build(PAGED, num_tokens=256, num_slots=32)
    req = Req(rid=1, origin_input_ids=list(range(100, 120)))
    assert cache.admit(req, max_new_tokens=2)
    plan = cache.extend(req, 8)
    assert plan is not None and plan.track_len == 8
    cache.commit(plan)
    plan = cache.extend(req, 4)
    assert plan is not None
    plan = plan._replace(track_len=None, track_slot=None)  # a plan without a tracked state...
    req.pending_plan = plan
    req.mamba_last_track_seqlen = 10  # ...and a stale tracked length off the page grid
    before, pools = request_fields(req), pool_state(cache)
    with pytest.raises(InvalidArgument, match="checkpoints at 10, which must be a multiple of page_size=4"):
        cache.commit(plan)
    assert request_fields(req) == before and pool_state(cache) == pools


@pytest.mark.parametrize("decode_steps", [1, 2, 3])
def test_an_abort_with_a_plan_continuing_a_partial_page_frees_each_page_once(decode_steps: int) -> None:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer", page_size=4, mamba_cache_chunk_size=4)
    cache = MambaRadixCache.build(config, num_tokens=64, num_slots=32)
    req = Req(rid=2, origin_input_ids=list(range(10)))  # the prompt ends inside page [8, 12)
    assert cache.admit(req, max_new_tokens=8)
    cache.commit(cache.extend(req, 10))
    for step in range(decode_steps - 1):
        req.output_ids.append(50 + step)
        cache.commit(cache.extend(req, 1))
    req.output_ids.append(99)
    plan = cache.extend(req, 1)  # continues the request's last page
    assert plan is not None
    cache.check_invariants([req])  # a pending plan's KV is the request's
    cache.finish(req, insert=False)  # abort before the commit
    cache.check_invariants()
    allocator = cache.token_to_kv_pool_allocator
    assert allocator.available_size() + allocator.used == allocator.size
    assert allocator.available_size() == allocator.size - cache.full_evictable_size()
    # the next request gets distinct pages, none of them the tree's
    nxt = Req(rid=3, origin_input_ids=list(range(200, 207)))
    assert cache.admit(nxt, max_new_tokens=1)
    kv = cache.extend(nxt, 7).kv_indices
    assert len(set((kv // 4).tolist())) == 2 and len(set(kv.tolist())) == 7
    cache.check_invariants([nxt])


def test_finish_with_insert_and_a_pending_plan_is_refused_with_nothing_changed() -> None:
    cache = MambaRadixCache.build(PAGED, num_tokens=256, num_slots=32)
    req = Req(rid=1, origin_input_ids=list(range(100, 110)))
    assert cache.admit(req, max_new_tokens=2)
    plan = cache.extend(req, 8)
    before, pools = request_fields(req), pool_state(cache)
    for call in (lambda: cache.finish(req), lambda: cache.cache_finished_req(req)):
        with pytest.raises(InvalidArgument, match="uncommitted plan"):
            call()
        assert request_fields(req) == before and pool_state(cache) == pools
    assert req.pending_plan is plan


@pytest.mark.parametrize("page_size", [1, 4])
def test_check_invariants_catches_a_trusted_double_free_at_once(page_size: int) -> None:
    """A double free through a trusted path (``check=False``) breaks the allocator's own bookkeeping;
    the next invariant check names it, before any allocation hands the index out twice."""
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", page_size=page_size, mamba_cache_chunk_size=4
    )
    cache = MambaRadixCache.build(config, num_tokens=64, num_slots=16)
    allocator = cache.token_to_kv_pool_allocator
    kv = allocator.alloc(page_size)
    allocator.free(kv, check=False)
    cache.check_invariants()
    allocator.free(kv, check=False)
    with pytest.raises(InvariantError, match="double free"):
        cache.check_invariants()


def test_check_invariants_catches_a_state_slot_or_row_double_free() -> None:
    cache = MambaRadixCache.build(PAGED, num_tokens=64, num_slots=16)
    slot = cache.mamba_pool.alloc(1)
    cache.mamba_pool.free(slot, check=False)
    cache.mamba_pool.free(slot, check=False)
    with pytest.raises(InvariantError, match="state slot"):
        cache.check_invariants()
    cache = MambaRadixCache.build(PAGED, num_tokens=64, num_slots=16)
    pool = cache.req_to_token_pool
    row = pool._take_rows(1)
    pool._release_rows(row)
    pool._release_rows(row)  # the trusted release, twice
    with pytest.raises(InvariantError, match="request rows"):
        cache.check_invariants()


def test_an_id_both_free_and_allocated_is_caught_even_when_the_counts_agree() -> None:
    cache = MambaRadixCache.build(PAGED, num_tokens=64, num_slots=16)
    free_list = cache.token_to_kv_pool_allocator._free_list
    taken = int(cache.token_to_kv_pool_allocator.alloc(4)[0]) // 4
    listed = int(free_list.listed_free_ids()[0])
    cache.check_invariants()
    free_list.allocated[taken], free_list.allocated[listed] = False, True  # swapped: the count still agrees
    with pytest.raises(
        InvariantError, match=f"KV page {listed} is both on the free list and marked allocated"
    ):
        cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_request_past_its_reservation_cannot_take_another_requests(page_size: int) -> None:
    """A declared too few output tokens; B reserved all of its own. A's decode past its reservation gets
    None as soon as it would eat into B's, and B still runs to its declared end."""
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", page_size=page_size, mamba_cache_chunk_size=4
    )
    cache = MambaRadixCache.build(config, num_tokens=48, num_slots=32)
    a = Req(rid="a", origin_input_ids=list(range(100, 108)))
    b = Req(rid="b", origin_input_ids=list(range(200, 208)))
    assert cache.admit(a, max_new_tokens=1) and cache.admit(b, max_new_tokens=25)
    for req in (a, b):
        cache.commit(cache.extend(req, 8), finished=True)
    refused_at = None
    for step in range(40):
        a.output_ids.append(step)
        plan = cache.extend(a, 1)
        if plan is None:
            a.output_ids.pop()
            refused_at = a.kv_len
            break
        cache.commit(plan)
    assert refused_at is not None and refused_at < 8 + 40
    for step in range(24):  # B's declared decode, every token of it, with A still running
        b.output_ids.append(step)
        plan = cache.extend(b, 1)
        assert plan is not None, f"B ran out of its reserved KV at {b.kv_len}"
        cache.commit(plan)
    cache.finish(a, insert=False)  # A is retracted
    cache.finish(b)
    cache.check_invariants()
