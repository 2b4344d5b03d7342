"""Sift2 (mamba_radix.policies.sift2): its seven kinds, the block size it learns from KV-match lengths, its
admission estimate that counts live never-hit checkpoints as misses, and never below SGLang 0.5.23 on the
synthetic workloads. That no online policy (Sift2 included: it is registered) beats the oracle where the
oracle is optimal is checked for every registered policy in test_policies_oracle.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from lifecycle_helpers import serve_prompt

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.policies.ours import Sift
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.policies.sift2 import SIFT2_KINDS, Sift2
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.synthetic import GENERATORS

EXTRA = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=64, chunked_prefill_size=64
)


def bound_sift2(chunk: int = 256, **options: object) -> Sift2:
    policy = Sift2(**options)  # type: ignore[arg-type]
    config = EXTRA.replace(chunked_prefill_size=chunk)
    MambaRadixCache.build(config, num_tokens=4096, num_slots=16, policy=policy)
    return policy


def test_sift2_kinds() -> None:
    policy = bound_sift2(chunk=256)  # grid 64, chunks of 256 tokens
    req = Req(rid=0, origin_input_ids=list(range(1000)))
    assert policy.kind(req, 1100) == "decode"
    assert policy.kind(req, 960) == "end-block"  # no block learned yet: every end counts as on a block
    policy.block = 128
    assert policy.kind(req, 960) == "end"  # 960 is not a multiple of 128
    assert policy.kind(req, 768) == "mid-last"  # 232 prompt tokens left: the last chunk follows
    assert policy.kind(req, 704) == "mid"  # 296 left: more than one chunk
    req.mamba_branching_seqlen = 768
    assert policy.kind(req, 768) == "branch"
    req.mamba_branching_seqlen = 512
    assert policy.kind(req, 512) == "branch-early"
    whole = Req(rid=1, origin_input_ids=list(range(1024)))
    assert policy.kind(whole, 1024) == "end-block"
    assert {"decode", "end", "end-block", "mid", "mid-last", "branch", "branch-early"} <= set(SIFT2_KINDS)


def test_sift2_learns_the_block_from_kv_match_lengths() -> None:
    rng = np.random.default_rng(0)
    blocks = bound_sift2()
    for i in range(16):  # block-hashed: whole 512-token blocks, a few matches off the grid
        n = 512 * int(rng.integers(1, 40)) + (7 if i % 8 == 0 else 0)
        blocks.on_hit(SimpleNamespace(full_kv_hit_len=n))  # type: ignore[arg-type]
        assert (blocks.block is None) == (i < 15)  # learned at block_evidence matches, not before
    assert blocks.block == 512
    tokens = bound_sift2()
    for _ in range(64):  # real tokens: matches end anywhere
        tokens.on_hit(SimpleNamespace(full_kv_hit_len=int(rng.integers(1, 100_000))))  # type: ignore[arg-type]
    assert tokens.block is not None and tokens.block <= 2
    tokens.on_hit(SimpleNamespace(full_kv_hit_len=0))  # type: ignore[arg-type]
    assert tokens.kv_matches == 64  # an empty match says nothing


@pytest.mark.parametrize("live_misses", [True, False])
def test_sift2_declines_a_never_hit_kind_before_anything_is_evicted(live_misses: bool) -> None:
    # 40 unrelated prompts, slots to spare: nothing is evicted, so Sift's resolved ratio has no evidence and
    # keeps every 'end' checkpoint; Sift2 counts the live never-hit ones as misses and declines the kind
    options = {"min_rate": 0.2, "relative_decline": False, "explore_every": 1000}
    policy = Sift2(live_misses=live_misses, **options)  # type: ignore[arg-type]
    sift = Sift(**options)  # type: ignore[arg-type]
    for p in (policy, sift):
        cache = MambaRadixCache.build(EXTRA, num_tokens=8192, num_slots=200, policy=p)
        for i in range(40):
            serve_prompt(cache, list(range(10_000 * (i + 1), 10_000 * (i + 1) + 70)), rid=i)
        assert cache.stats.checkpoints_declined == sum(p.declined.values())
    assert sum(sift.declined.values()) == 0
    assert policy.evidence("end-block") == (policy.created["end-block"] if live_misses else 0)
    assert (policy.declined["end-block"] > 0) is live_misses


@pytest.mark.parametrize("workload", ["chat", "system-prompt", "agent", "tree"])
def test_sift2_is_never_below_sglang_on_the_synthetic_workloads(workload: str) -> None:
    reqs = GENERATORS[workload](seed=0)
    base = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    for slots in (8, 16):
        pools = exact_pools(base, 1_000_000, slots)
        ours = run_policy("sift2", base, PolicyContext(reqs, pools))["token_hit_rate"]
        sglang = run_policy("sglang-0.5.23", base, PolicyContext(reqs, pools))["token_hit_rate"]
        assert ours >= sglang, (workload, slots, ours, sglang)


def test_sift2_is_registered_as_ours() -> None:
    assert POLICIES["sift2"].family == "ours"
    assert POLICIES["sift"].family == "ours"  # Sift stays: Sift2 is a successor, not a replacement
