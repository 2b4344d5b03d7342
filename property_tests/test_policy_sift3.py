"""Sift3 (mamba_radix.policies.sift3): its KV keys follow the learned value of the checkpoint a leaf holds,
it never beats the oracle where the oracle is optimal, it is deterministic, and it is never below SGLang
0.5.23 where slots bind on the synthetic workloads."""

from __future__ import annotations

import pytest
from lifecycle_helpers import serve_prompt
from test_policies_oracle import CONFIG, RANDOM_SEQUENCES, SEQUENCES, oracle_hits, paging_trace

from mamba_radix import CacheConfig, MambaRadixCache
from mamba_radix.policies.registry import POLICIES, VARIANTS, PolicyContext, run_policy
from mamba_radix.policies.sift3 import Sift3
from mamba_radix.sim.budget import PoolSizes, exact_pools
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import TraceRequest

EXTRA = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=64, chunked_prefill_size=64
)


def leaf_order(kv_value: str, value_evidence: int = 0) -> list[int]:
    """Serve a short prompt (70 tokens: octave 6, feature 12) and then a long one (140 tokens: octave 7,
    feature 14; neither continued a cached prefix), each leaving an ``end-block`` checkpoint on its leaf,
    with the learned counts saying that short prompts' prompt ends are hit and long ones' are not; return
    the leaves' depths in KV eviction order."""
    policy = Sift3(kv_value=kv_value, value_evidence=value_evidence)
    policy.f_created[("end-block", 12)] = policy.f_hits[("end-block", 12)] = 64
    policy.f_created[("end-block", 14)] = 64  # never hit
    cache = MambaRadixCache.build(EXTRA, num_tokens=4096, num_slots=16, policy=policy)
    serve_prompt(cache, list(range(1_000, 1_070)), rid=0)  # touched first: LRU's victim
    serve_prompt(cache, list(range(5_000, 5_140)), rid=1)
    leaves = list(cache.tree.index.full_candidates())
    assert all(leaf.mamba_slot is not None for leaf in leaves)
    return [leaf.depth for leaf in leaves]


def test_sift3_kv_keys_follow_the_checkpoint_value() -> None:
    # the older leaf holds the valuable checkpoint: Sift3 evicts the newer, dead one first
    assert leaf_order("prob") == [128, 64]
    # with the value boost removed the order is LRU again (the check that the boost is what moves it)
    assert leaf_order("lru") == [64, 128]
    # before value_evidence hand-overs it is Sift2's order (equal GreedyDual-Size values here: LRU)
    assert leaf_order("prob", value_evidence=1_000) == [64, 128]


def test_sift3_value_is_the_features_ratio_shrunk_toward_the_kinds() -> None:
    policy = Sift3(feature_prior=16.0)
    MambaRadixCache.build(EXTRA, num_tokens=4096, num_slots=16, policy=policy)
    rec = type("Rec", (), {"kind": "end-block", "slot": 3, "node": type("N", (), {"id": 9})()})()
    policy._feature[9] = (3, 7)
    policy.created["end-block"], policy.hits["end-block"] = 98, 48  # the kind's live-miss ratio: 0.49
    policy.f_created[("end-block", 7)], policy.f_hits[("end-block", 7)] = 16, 0
    assert policy.value(rec) == pytest.approx(16 * 0.49 / 32)  # half the kind's ratio: 16 misses, prior 16
    policy._feature[9] = (4, 7)  # the slot was reused by another checkpoint: no feature, the kind's ratio
    assert policy.value(rec) == pytest.approx(0.49 * 16 / 16)


def run_value_order(config: CacheConfig, reqs: list[TraceRequest], pools: PoolSizes) -> tuple[float, dict]:
    """Replay ``reqs`` under Sift3 with the value order on from the first hand-over (``value_evidence=0``:
    the registered policy is Sift2 on traces this small); the hit rate and the cache's counters."""
    policy = Sift3(value_evidence=0)
    max_len = max(r.input_len + r.output_len for r in reqs)
    engine = Engine(config, pools, max_len, EngineOptions(mode="sequential"), policy=policy)
    rate = engine.run(reqs, total=len(reqs)).summary()["token_hit_rate"]
    assert policy.value_order()
    return rate, engine.cache_stats()


@pytest.mark.parametrize("slots", [3, 4])
@pytest.mark.parametrize("sequence", SEQUENCES + RANDOM_SEQUENCES[:3])
def test_sift3_never_beats_the_oracle_where_it_is_optimal(sequence: list[int], slots: int) -> None:
    reqs = paging_trace(sequence, 5, seed=len(sequence) + slots)
    oracle = oracle_hits(reqs, slots)
    pools = exact_pools(CONFIG, 100_000, slots)
    got = run_policy("sift3", CONFIG, PolicyContext(reqs, pools))["token_hit_rate"]
    assert got <= oracle + 1e-12, (got, oracle)
    valued, _ = run_value_order(CONFIG, reqs, pools)
    assert valued <= oracle + 1e-12, (valued, oracle)


def test_sift3_is_deterministic() -> None:
    reqs = GENERATORS["chat"](seed=1)
    base = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    pools = exact_pools(base, 6_000, 64)
    runs = [run_value_order(base, reqs, pools) for _ in range(2)]
    assert runs[0] == runs[1]
    named = [run_policy("sift3", base, PolicyContext(reqs, pools)) for _ in range(2)]
    assert named[0]["token_hit_rate"] == named[1]["token_hit_rate"]
    assert named[0]["stats"] == named[1]["stats"]


@pytest.mark.parametrize("workload", ["chat", "system-prompt", "agent", "tree"])
def test_sift3_is_never_below_sglang_where_slots_bind(workload: str) -> None:
    reqs = GENERATORS[workload](seed=0)
    base = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    for slots in (8, 16):
        pools = exact_pools(base, 1_000_000, slots)
        ours = run_policy("sift3", base, PolicyContext(reqs, pools))["token_hit_rate"]
        sglang = run_policy("sglang-0.5.23", base, PolicyContext(reqs, pools))["token_hit_rate"]
        assert ours >= sglang, (workload, slots, ours, sglang)


def test_sift3_is_ours_and_in_the_main_job() -> None:
    assert POLICIES["sift3"].family == "ours"
    assert "sift3" not in VARIANTS  # one registry entry: the main job's "all" compares it
