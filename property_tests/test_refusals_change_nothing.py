"""Refusals of the SGLang-named calls that used to change something, and the request fields SGLang's
scheduler reads after a hand-over (issue 27, items 1 and 6)."""

from __future__ import annotations

import pytest

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import InvalidArgument

LAZY = CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy", page_size=4, mamba_cache_chunk_size=4)


def state(cache: MambaRadixCache, req: Req) -> tuple:
    return (
        cache.pretty_print(),
        cache.mamba_pool.available_size(),
        cache.token_to_kv_pool_allocator.available_size(),
        str(cache.stats),
        req.kv_len,
        req.cache_protected_len,
        req.mamba_last_track_seqlen,
        req.mamba_next_track_idx,
        tuple(req.mamba_ping_pong_track_buffer or ()),
        req.mamba_pool_idx,
    )


def test_a_refused_lazy_hand_over_after_an_eager_flip_leaks_no_slot() -> None:
    """Under extra_buffer_lazy the engine flips mamba_next_track_idx the eager way (onto the empty
    second entry) and calls cache_unfinished_req: refused before a fresh slot is allocated."""
    cache = MambaRadixCache.build(LAZY, num_tokens=128, num_slots=16)
    req = Req(rid=1, origin_input_ids=list(range(100, 116)))
    assert cache.admit(req, max_new_tokens=1)
    plan = cache.extend(req, 8)
    assert plan is not None and plan.track_len == 8
    # the SGLang call form: the engine advances the request itself, then hands over
    req.kv_len, req.pending_plan, req.mamba_last_track_seqlen = 8, None, 8
    req.mamba_next_track_idx = 1 - req.mamba_next_track_idx  # the eager flip, wrong under lazy
    before = state(cache, req)
    with pytest.raises(InvalidArgument, match="no tracked slot in ping-pong entry"):
        cache.cache_unfinished_req(req)
    assert state(cache, req) == before
    cache.check_invariants([req])


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefix_indices_follow_the_cached_prefix_after_each_hand_over(page_size: int) -> None:
    """SGLang's scheduler reads req.prefix_indices for the next chunk: after cache_unfinished_req it is
    the cached prefix's KV, and len(prefix_indices) == cache_protected_len."""
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", page_size=page_size, mamba_cache_chunk_size=4
    )
    cache = MambaRadixCache.build(config, num_tokens=256, num_slots=16)
    req = Req(rid=1, origin_input_ids=list(range(100, 124)))
    assert cache.admit(req, max_new_tokens=1)
    row = cache.req_to_token_pool.req_to_token[req.req_pool_idx]
    for _ in range(3):
        cache.commit(cache.extend(req, 8))
        assert req.cache_protected_len == req.kv_len
        assert len(req.prefix_indices) == req.cache_protected_len
        assert req.prefix_indices.tolist() == row[: req.cache_protected_len].tolist()
        assert (
            req.prefix_indices.tolist()
            == cache.match_prefix(req.origin_input_ids).device_indices[: req.cache_protected_len].tolist()
        )
    cache.finish(req)
    cache.check_invariants()


def test_a_trace_timestamp_too_large_for_a_float_is_a_typed_error(tmp_path) -> None:
    from mamba_radix.errors import TraceFormatError
    from mamba_radix.sim.traces import iter_block_trace

    path = tmp_path / "huge.jsonl"
    path.write_text(
        '{"timestamp": 1' + "0" * 400 + ', "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
    )
    with pytest.raises(TraceFormatError, match=r"timestamp.*integer of 401 digits"):
        list(iter_block_trace(path))
