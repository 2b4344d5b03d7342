"""The peers (mamba_radix.policies: coverage thinning, vLLM sparse retention, Marconi) and our Sift, each on
a hand-worked example from its PR or paper, through the real cache and lifecycle."""

from __future__ import annotations

import numpy as np
import pytest
from lifecycle_helpers import serve_prompt

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.policies.marconi import Marconi, with_marconi_admission
from mamba_radix.policies.ours import Sift, checkpoint_kind
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.policies.thinning import CoverageThinning, merged_gap
from mamba_radix.policies.vllm_sparse import SparseRetention
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.state_stamp import PrefixFingerprints, fingerprint, write_stamp

NO_BUFFER = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
EXTRA = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=64, chunked_prefill_size=64
)
CHAIN = list(range(1, 513))


def insert(cache: MambaRadixCache, tokens: list[int]) -> None:
    kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    slot = int(cache.mamba_pool.alloc(1)[0])
    write_stamp(cache.mamba_pool, slot, fingerprint(tokens), len(tokens))
    if cache.insert(tokens, kv, slot).mamba_exists:
        cache.mamba_pool.free([slot])


def checkpoint_depths(cache: MambaRadixCache) -> list[int]:
    return sorted(n.depth for n in cache.tree.nodes() if n.mamba_slot is not None)


# ------------------------------------------------------------------------------------ coverage thinning
def test_thinning_drops_the_checkpoint_of_the_smallest_merged_gap() -> None:
    # PR #38000's "minimal merged gap": survivors at 64, 128, 448 and the tail at 512; dropping 64 merges
    # [0, 128) (128 tokens), dropping 128 or 448 merges 384 tokens: 64 goes, not the LRU-oldest shallow one
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=1024, num_slots=16, policy=CoverageThinning())
    for depth in (448, 128, 64, 512):  # 448 is the oldest: LRU would take it first
        insert(cache, CHAIN[:depth])
    gaps = {n.depth: merged_gap(n) for n in cache.tree.nodes() if n.mamba_slot is not None and n.children}
    assert gaps == {64: 128, 128: 384, 448: 384}
    cache.evict(num_states=1)
    assert checkpoint_depths(cache) == [128, 448, 512]
    cache.check_invariants([])


def test_thinning_leaves_alternating_survivors_on_an_even_chain() -> None:
    # PR #38000's "alternating survivors": an evenly spaced chain thins every other checkpoint, keeping
    # the tail, instead of losing its whole shallow half
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=1024, num_slots=16, policy=CoverageThinning())
    for depth in range(64, 513, 64):
        insert(cache, CHAIN[:depth])
    cache.evict(num_states=3)
    assert checkpoint_depths(cache) == [128, 256, 384, 448, 512]
    lru = MambaRadixCache.build(NO_BUFFER, num_tokens=1024, num_slots=16)
    for depth in range(64, 513, 64):
        insert(lru, CHAIN[:depth])
    lru.evict(num_states=3)
    assert checkpoint_depths(lru) == [256, 320, 384, 448, 512]


def test_thinning_keeps_forks_and_reused_checkpoints() -> None:
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=2048, num_slots=16, policy=CoverageThinning())
    for depth in (64, 128, 192, 256):
        insert(cache, CHAIN[:depth])
    insert(cache, [*CHAIN[:128], 9999])  # 128 becomes a fork
    cache.match_prefix([*CHAIN[:192], 1])  # 192 is reused
    cache.evict(
        num_states=1
    )  # 64 is the only thinnable one (128 forks, 192 was reused, 256 and 129 are tails)
    assert checkpoint_depths(cache) == [128, 129, 192, 256]
    cache.evict(num_states=1)  # nothing thinnable is left: the LRU order (the oldest, 128) as without the PR
    assert checkpoint_depths(cache) == [129, 192, 256]


# -------------------------------------------------------------------------------- vLLM sparse retention
def test_sparse_retention_keeps_prompt_ends_and_junctions_only() -> None:
    cache = MambaRadixCache.build(EXTRA, num_tokens=4096, num_slots=32, policy=SparseRetention())
    first = list(range(1, 201))
    serve_prompt(cache, first, rid=0)  # chunks hand over 64, 128, 192: only the prompt's end (192) is kept
    assert checkpoint_depths(cache) == [192]
    assert cache.stats.checkpoints_declined == 2
    # a request sharing 100 tokens: its KV match ends at 100, so the junction 64 is its branch point
    serve_prompt(cache, [*first[:100], *range(5000, 5100)], rid=1)
    assert checkpoint_depths(cache) == [64, 192, 192]
    cache.check_invariants([])


# ---------------------------------------------------------------------------------------------- Marconi
def test_marconi_utility_is_renormalised_recency_plus_alpha_flop_efficiency() -> None:
    # three candidates, oldest first: A (256 tokens), A+B (320, its parent checkpoint is A), C (64 tokens,
    # unrelated). With a crossover of 64 tokens attention dominates: A saves the most compute per byte
    kv_bytes, state_bytes, crossover = 1000, 64_000, 64
    chosen = {}
    for alpha in (0.0, 10.0):
        policy = Marconi(alpha, kv_bytes, state_bytes, crossover)
        cache = MambaRadixCache.build(NO_BUFFER, num_tokens=2048, num_slots=16, policy=policy)
        insert(cache, CHAIN[:256])
        insert(cache, CHAIN[:320])
        insert(cache, list(range(2000, 2064)))
        nodes = [n for n in cache.tree.nodes() if n.mamba_slot is not None]
        nodes.sort(key=lambda n: n.mamba_last_access)
        assert [n.depth for n in nodes] == [256, 320, 64]
        now = cache.tree.clock + 1
        # by hand: recency 1 / (now - stamp); efficiency (F(d) - F(parent)) / (state + d * kv bytes)
        f = lambda d: d * (1 + d / crossover)  # noqa: E731
        eff = np.array(
            [
                f(256) / (state_bytes + 256 * kv_bytes),
                (f(320) - f(256)) / (state_bytes + 320 * kv_bytes),
                f(64) / (state_bytes + 64 * kv_bytes),
            ]
        )
        rec = np.array([1 / (now - n.mamba_last_access) for n in nodes])
        norm = lambda x: (x - x.min()) / (x.max() - x.min())  # noqa: E731
        assert np.allclose(policy.utilities(nodes), norm(rec) + alpha * norm(eff))
        cache.evict(num_states=1)
        chosen[alpha] = checkpoint_depths(cache)
    assert chosen[0.0] == [64, 320]  # alpha 0 is LRU among the candidates: A goes
    assert chosen[10.0] == [256, 320]  # FLOP-heavy: C saves the least per byte, it goes though newest


def test_marconi_policy_config_is_branch_and_end_admission() -> None:
    config = with_marconi_admission(EXTRA)
    assert config.mamba_checkpoint_admission == "branch_and_end"
    assert config.mamba_lru_refresh == "node"


# ------------------------------------------------------------------------------------------------- Sift
def test_sift_kinds() -> None:
    req = Req(rid=0, origin_input_ids=list(range(300)))
    assert checkpoint_kind(req, 256, 64) == "end"
    assert checkpoint_kind(req, 128, 64) == "mid"
    assert checkpoint_kind(req, 512, 64) == "decode"
    req.mamba_branching_seqlen = 128
    assert checkpoint_kind(req, 128, 64) == "branch"


def test_sift_demotes_superseded_checkpoints() -> None:
    policy = Sift()
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=2048, num_slots=16, policy=policy)
    insert(cache, CHAIN[:64])
    insert(cache, list(range(3000, 3064)))  # an unrelated, older-than-what-follows checkpoint
    insert(cache, CHAIN[:128])  # lands below 64 on a fork-free path: 64 is superseded
    cache.evict(num_states=1)
    assert checkpoint_depths(cache) == [64, 128]  # not LRU (which takes 64): the superseded one went
    assert [n.depth for n in cache.tree.nodes() if n.mamba_slot is not None and n.depth == 64] == [64]


@pytest.mark.parametrize("greedy_dual", [True, False])
def test_sift_greedy_dual_keeps_the_checkpoint_that_saves_more_until_it_ages_out(greedy_dual: bool) -> None:
    # A saves 640 tokens over its fallback (the root), each later prompt 64. LRU evicts A first; GreedyDual
    # evicts the 64-token ones first, each victim raising the clock by 64, so A (priority 640) goes once the
    # clock has reached 640 - 64: at the 10th eviction, not the 1st, and not never.
    policy = Sift(supersede=False, learn_admission=False, greedy_dual=greedy_dual)
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=4096, num_slots=16, policy=policy)
    insert(cache, list(range(10_000, 10_640)))
    evicted_at = None
    for i in range(12):
        insert(cache, list(range(20_000 + 100 * i, 20_064 + 100 * i)))
        cache.evict(num_states=1)
        if evicted_at is None and 640 not in checkpoint_depths(cache):
            evicted_at = i + 1
    assert evicted_at == (10 if greedy_dual else 1)


@pytest.mark.parametrize("relative", [False, True])
def test_sift_learns_to_decline_a_kind_that_is_never_hit(relative: bool) -> None:
    policy = Sift(min_evidence=4, min_rate=0.2, explore_every=1000, relative_decline=relative)
    cache = MambaRadixCache.build(EXTRA, num_tokens=8192, num_slots=12, policy=policy)
    for i in range(20):  # 20 unrelated prompts: every 'end' checkpoint is evicted unhit
        serve_prompt(cache, list(range(10_000 * (i + 1), 10_000 * (i + 1) + 70)), rid=i)
    assert policy.evicted_unhit["end"] >= 4
    assert cache.stats.checkpoints_declined == policy.declined["end"]
    # absolute: below min_rate is enough; relative: 'end' is the best kind there is, so it stays
    assert (policy.declined["end"] > 0) is not relative


@pytest.mark.parametrize("workload", ["chat", "system-prompt", "agent", "tree"])
def test_sift_is_never_below_sglang_on_the_synthetic_workloads(workload: str) -> None:
    reqs = GENERATORS[workload](seed=0)
    base = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    for slots in (8, 16):
        pools = exact_pools(base, 1_000_000, slots)
        ours = run_policy("sift", base, PolicyContext(reqs, pools))["token_hit_rate"]
        sglang = run_policy("sglang-0.5.23", base, PolicyContext(reqs, pools))["token_hit_rate"]
        assert ours >= sglang, (workload, slots, ours, sglang)


def test_registry_names_families() -> None:
    assert {s.family for s in POLICIES.values()} == {"sglang", "peer", "ours", "offline"}
    assert POLICIES["sift"].family == "ours"
    with pytest.raises(Exception, match="unknown policy"):
        run_policy("nope", EXTRA, PolicyContext([], exact_pools(EXTRA, 100, 8)))


def _cached(cache: MambaRadixCache, first_token: int) -> bool:
    return any(len(n.key) and int(n.key[0]) == first_token for n in cache.tree.nodes() if n.depth)


def _leaves_evicted_until_gone(cache: MambaRadixCache, first_token: int, others: int) -> int | None:
    """Insert ``others`` unrelated 64-token prompts one at a time, evicting 64 KV tokens after each; the
    1-based eviction at which the prompt starting with ``first_token`` leaves the cache (None: never)."""
    for i in range(others):
        insert(cache, list(range(20_000 + 100 * i, 20_064 + 100 * i)))
        cache.evict(num_tokens=64)
        if not _cached(cache, first_token):
            return i + 1
    return None


@pytest.mark.parametrize(
    ("kv_greedy_dual", "frequency", "expected"), [(True, True, 64), (False, True, 1), (True, False, 1)]
)
def test_sift_kv_greedy_dual_keeps_a_shared_junction_for_scale_generations(
    kv_greedy_dual: bool, frequency: bool, expected: int
) -> None:
    # A is a ``branch`` checkpoint (a shared junction), every later leaf is not; each saves 64 tokens over
    # the root per 64 KV tokens (gain / size 1). A's value is 1 * kv_branch_scale (64) * (1 + 0 hits) = 64,
    # each newcomer's 1: a newcomer gets the clock + 1 and is the next victim, each victim lifting the clock
    # by 1, so A goes at the 64th eviction (its tie with the newcomer then breaks by age). LRU, or no
    # frequency weight (A's value 1, older): A goes first.
    policy = Sift(
        supersede=False,
        learn_admission=False,
        kv_greedy_dual=kv_greedy_dual,
        kv_branch_frequency=frequency,
        kv_branch_scale=64,
    )
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=4096, num_slots=16, policy=policy)
    policy._pending = (64, "branch")  # the kind a branch hand-over gets in admit_checkpoint
    insert(cache, list(range(10_000, 10_064)))
    assert policy._rec[next(n.id for n in cache.tree.nodes() if n.depth == 64)].kind == "branch"
    assert _leaves_evicted_until_gone(cache, 10_000, 80) == expected


def test_sift_kv_greedy_dual_starts_a_new_leaf_from_the_clock_of_its_last_touch() -> None:
    # P (64 tokens) and its child Q (128) are branch checkpoints, each worth 64 (gain / size 1, scale 64,
    # no hits); a fork Q' under P (worth 1) touches P last, while P is internal and the clock is 0. The
    # unrelated newcomers (worth 1 each) age the clock to Q's 64 (126 rounds); then P becomes a leaf. Its
    # priority is the clock *as of its last touch* plus 64 = 64, below a newcomer's 64 + 1: it is the very
    # next victim. Restarted from the current clock (64 + 64) it would outlive many more newcomers.
    policy = Sift(supersede=False, learn_admission=False, kv_branch_scale=64)
    cache = MambaRadixCache.build(NO_BUFFER, num_tokens=4096, num_slots=16, policy=policy)
    policy._pending = (64, "branch")
    insert(cache, CHAIN[:64])
    policy._pending = (128, "branch")
    insert(cache, CHAIN[:128])
    insert(cache, CHAIN[:64] + list(range(40_000, 40_064)))  # Q': P touched as a fork, internal
    gone: dict[str, int] = {}
    for i in range(200):
        insert(cache, list(range(50_000 + 100 * i, 50_064 + 100 * i)))
        cache.evict(num_tokens=64)
        depths = checkpoint_depths(cache)
        if 128 not in depths:
            gone.setdefault("Q", i)
        if not _cached(cache, CHAIN[0]):
            gone.setdefault("P", i)
            break
    assert gone["Q"] > 60 and gone["P"] == gone["Q"] + 1, gone


@pytest.mark.parametrize("once", [True, False])
def test_sift_ghost_turns_one_eviction_into_at_most_one_hit(once: bool) -> None:
    policy = Sift(ghost_once=once)
    cache = MambaRadixCache.build(EXTRA, num_tokens=8192, num_slots=12, policy=policy)
    assert cache.tree is not None
    prompt = CHAIN[:130]
    fps = PrefixFingerprints(np.asarray(prompt[:-1], dtype=np.int64))
    policy._ghost[(128, fps.at(128))] = "end"  # an 'end' checkpoint at 128 was evicted unhit
    policy.evicted_unhit["end"] = 1
    for rid in range(2):  # two requests pass the ghost, each with no real hit
        req = Req(rid=rid, origin_input_ids=prompt)
        policy._probe_ghosts(req)
        policy._resolve_ghost(rid, 0)
    assert policy.hits["end"] == (1 if once else 2)
    assert policy.rate("end") <= 1 or not once  # twice: 3 / 1, a ratio past 1
