"""strip_thinking_cache for hybrids (issue 27, item 4): a finished request whose output the next turn
drops from its prompt leaves its prompt cached with a state that belongs to it, never the state taken
after the output (SGLang's placement, shown here to restore a state that does not match its prefix)."""

from __future__ import annotations

from array import array

import pytest

from mamba_radix import CacheConfig, MambaRadixCache, RadixKey, Req
from mamba_radix.compat.sglang import (
    CacheInitParams,
    HybridReqToTokenPool,
    MatchPrefixParams,
    TokenToKVPoolAllocator,
)
from mamba_radix.compat.sglang import MambaRadixCache as SGLangCache
from mamba_radix.compat.sglang import Req as SGLangReq
from mamba_radix.compat.strip_thinking import finish_stripping_output, insert_keeps_prompt_state
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp

PROMPT = list(range(200, 222))  # 22 tokens: its end is off the 4-token checkpoint grid
OUTPUT = [7, 8, 9, 10, 11, 12, 13, 14, 15]  # the reasoning and the answer, dropped next turn
NEXT_TURN = [*PROMPT, 300, 301, 302]


def config(strategy: str) -> CacheConfig:
    return CacheConfig(
        mamba_radix_cache_strategy=strategy,
        mamba_cache_chunk_size=4,
        mamba_track_interval=4,
        chunked_prefill_size=8,
    )


def run(cache: MambaRadixCache, req: Req, outputs: list[int]) -> None:
    """Prefill and decode ``req`` through the lifecycle, stamping every state the model would write."""
    pool = cache.mamba_pool
    while True:
        prefill = req.kv_len < len(req.origin_input_ids)
        n = cache.prefill_chunk_len(req, 8) if prefill else 1
        plan = cache.extend(req, n)
        assert plan is not None
        tokens = req.all_token_ids
        write_stamp(pool, plan.live_slot, fingerprint(tokens[: plan.end]), plan.end)
        if plan.track_slot is not None:
            write_stamp(pool, plan.track_slot, fingerprint(tokens[: plan.track_len]), plan.track_len)
        last = plan.end == len(req.origin_input_ids) + len(outputs) - 1
        cache.commit(plan, finished=last)
        if plan.end >= len(req.origin_input_ids):
            req.output_ids.append(outputs[len(req.output_ids)])
            if last:
                return


def restored(cache: MambaRadixCache, key: list[int]) -> tuple[int, tuple[int, int] | None]:
    m = cache.match_prefix(RadixKey(key))
    hit = len(m.device_indices)
    return hit, (read_stamp(cache.mamba_pool, m.mamba_slot) if hit else None)


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_stripped_finish_caches_the_prompt_with_a_state_of_its_own(strategy: str) -> None:
    cache = MambaRadixCache.build(config(strategy), num_tokens=256, num_slots=16)
    req = Req(rid=1, origin_input_ids=list(PROMPT))
    assert cache.admit(req, max_new_tokens=len(OUTPUT))
    run(cache, req, OUTPUT)
    assert not insert_keeps_prompt_state(cache, req)  # its newest state is past the prompt
    finish_stripping_output(cache, req)
    cache.check_invariants()
    hit, state = restored(cache, NEXT_TURN)
    assert 0 < hit <= len(PROMPT)
    assert state == (fingerprint(NEXT_TURN[:hit]), hit)
    # nothing of the output is cached
    assert cache.match_prefix(RadixKey(PROMPT + OUTPUT)).full_kv_hit_len <= len(PROMPT)


def test_sglangs_placement_restores_a_state_that_does_not_match_its_prefix() -> None:
    """The wrong placement, emulated: the state after the output on the prompt-length node (extra_buffer:
    the prefill checkpointed at 20, on the grid, so the node at 22 has no state of its own)."""
    cache = MambaRadixCache.build(config("extra_buffer"), num_tokens=256, num_slots=16)
    req = Req(rid=1, origin_input_ids=list(PROMPT))
    assert cache.admit(req, max_new_tokens=len(OUTPUT))
    run(cache, req, OUTPUT)
    after_output = cache.mamba_pool.alloc(1, as_list=True)[0]
    cache.mamba_pool.copy_slot(req.mamba_pool_idx, after_output)  # the request's newest state
    cache.finish(req, insert=False)
    kv = cache.token_to_kv_pool_allocator.alloc(len(PROMPT))
    done = cache.insert(RadixKey(PROMPT), kv, after_output)  # prompt-length key, post-output state
    assert not done.mamba_exists
    hit, state = restored(cache, NEXT_TURN)
    assert hit == len(PROMPT)
    assert state is not None and state[0] != fingerprint(NEXT_TURN[:hit])  # a state of other tokens
    assert state == (fingerprint(PROMPT + OUTPUT[:-1]), len(PROMPT) + len(OUTPUT) - 1)


def test_a_checkpoint_within_the_prompt_is_still_inserted() -> None:
    """No output past the prompt (one token, never computed): the prompt's end state is inserted."""
    cache = MambaRadixCache.build(config("no_buffer"), num_tokens=256, num_slots=16)
    prompt = PROMPT[:20]
    req = Req(rid=1, origin_input_ids=list(prompt))
    assert cache.admit(req, max_new_tokens=1)
    run(cache, req, [7])
    assert insert_keeps_prompt_state(cache, req)
    finish_stripping_output(cache, req)
    hit, state = restored(cache, [*prompt, 1])
    assert (hit, state) == (20, (fingerprint(prompt), 20))


def test_the_sglang_form_strips_requests_with_reasoning_tokens() -> None:
    pool = HybridReqToTokenPool(size=2, mamba_size=16, max_context_len=64)
    cache = SGLangCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=pool,
            token_to_kv_pool_allocator=TokenToKVPoolAllocator(size=256),
            page_size=1,
            strip_thinking_cache=True,
        ),
        config=config("no_buffer"),
    )
    req = SGLangReq(rid=1, origin_input_ids=array("q", PROMPT))
    core = cache.core
    assert core.admit(req.core, max_new_tokens=len(OUTPUT))
    run(core, req.core, OUTPUT)
    req.reasoning_tokens = len(OUTPUT) - 2
    cache.cache_finished_req(req)
    pool.free(req)
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(NEXT_TURN)))
    hit = m.cache_protected_len
    assert 0 < hit <= len(PROMPT)
    assert read_stamp(core.mamba_pool, m.last_device_node.mamba_slot) == (fingerprint(NEXT_TURN[:hit]), hit)
    cache.sanity_check()
