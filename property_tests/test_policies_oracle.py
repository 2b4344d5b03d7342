"""The offline oracle (mamba_radix.policies.oracle) where it is optimal: one equal-value demand per
request, sequential replay, KV never binding. There the hit count must equal the exact optimum of the
abstract paging problem (found here by exhaustive search), and no online policy of the registry may exceed
it."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mamba_radix import CacheConfig
from mamba_radix.policies.future import NEVER, FutureIndex, demand_hits
from mamba_radix.policies.oracle import Oracle
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.traces import TraceRequest

PROMPT = 64  # one chunk: the chunk's checkpoint lands exactly at the prompt's end
# no_buffer: a running request holds one live slot, so the tree keeps at most slots - 1 checkpoints at
# the time a request matches (the copy-on-write target takes one)
CONFIG = CacheConfig(
    mamba_radix_cache_strategy="no_buffer",
    disable_overlap_schedule=True,
    chunked_prefill_size=PROMPT,
    mamba_cache_chunk_size=PROMPT,
)


def paging_trace(sequence: list[int], num_prompts: int, seed: int) -> list[TraceRequest]:
    """Request i = prompt ``sequence[i]`` (64 tokens, distinct first tokens) + a unique suffix."""
    rng = np.random.default_rng(seed)
    prompts = [[p * 1000 + 1, *rng.integers(10_000, 20_000, PROMPT - 1).tolist()] for p in range(num_prompts)]
    reqs = []
    for i, p in enumerate(sequence):
        suffix = (100_000 + i * 1000 + np.arange(70)).tolist()
        reqs.append(TraceRequest.from_tokens(i, float(i), prompts[p] + suffix, [7_000_000 + i]))
    return reqs


def optimal_hits(sequence: list[int], capacity: int) -> int:
    """Paging with optional admission, exhaustively: the most requests that find their item cached."""

    @functools.cache
    def best(t: int, cached: frozenset[int]) -> int:
        if t == len(sequence):
            return 0
        item = sequence[t]
        gain = int(item in cached)
        pool = cached | {item}
        options = [cached]  # keep the cache as it is (a hit, or a miss not admitted: bypass)
        if item not in cached:
            if len(pool) <= capacity:
                options.append(pool)
            else:
                options += [pool - {victim} for victim in cached]
        return gain + max(best(t + 1, option) for option in options)

    return best(0, frozenset())


def oracle_hits(reqs: list[TraceRequest], slots: int) -> float:
    ctx = PolicyContext(reqs, exact_pools(CONFIG, 100_000, slots))
    return run_policy("oracle", CONFIG, ctx, verify_states=True)["token_hit_rate"]


SEQUENCES = [
    [0, 1, 2, 0, 3, 1, 0, 2, 4, 1, 0, 3, 2, 1],
    [0, 1, 0, 2, 1, 3, 0, 2, 1, 3, 0, 4, 2, 0],
    [4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 0, 1, 2, 3],
]


@pytest.mark.parametrize("slots", [3, 4])
@pytest.mark.parametrize("case", range(len(SEQUENCES)))
def test_oracle_reaches_the_exact_optimum_and_no_online_policy_beats_it(case: int, slots: int) -> None:
    sequence = SEQUENCES[case]
    reqs = paging_trace(sequence, 5, seed=case)
    input_tokens = sum(r.input_len for r in reqs)
    best = optimal_hits(sequence, capacity=slots - 1)
    oracle = oracle_hits(reqs, slots)
    assert round(oracle * input_tokens) == best * PROMPT, (oracle * input_tokens / PROMPT, best)
    ctx_hits: dict[CacheConfig, list[int]] = {}
    for name, spec in POLICIES.items():
        if spec.family == "offline":
            continue
        config = CONFIG if name != "marconi" else CONFIG.replace(mamba_radix_cache_strategy="extra_buffer")
        if (
            name == "marconi"
        ):  # Marconi's admission needs extra_buffer: more slots per request, same tree room
            pools = exact_pools(config, 100_000, slots + 4)
        else:
            pools = exact_pools(config, 100_000, slots)
        got = run_policy(name, config, PolicyContext(reqs, pools, demands=ctx_hits))["token_hit_rate"]
        assert got <= oracle + 1e-12, (name, got, oracle)


RANDOM_SEQUENCES = [[int(x) for x in np.random.default_rng(seed).integers(0, 5, 16)] for seed in range(6)]


def oracle_count(sequence: list[int], slots: int, **halves: bool) -> int:
    reqs = paging_trace(sequence, 5, seed=0)
    future = FutureIndex(reqs, demand_hits(CONFIG, reqs), PROMPT)
    policy = Oracle(future, **halves)
    from mamba_radix.sim.engine import Engine, EngineOptions

    engine = Engine(
        CONFIG, exact_pools(CONFIG, 100_000, slots), 300, EngineOptions(mode="sequential"), policy
    )
    policy.cache = engine.cache
    rate = engine.run(reqs).summary()["token_hit_rate"]
    return round(rate * sum(r.input_len for r in reqs) / PROMPT)


@pytest.mark.parametrize("seed", range(len(RANDOM_SEQUENCES)))
def test_oracle_is_optimal_on_random_paging_traces_and_each_half_matters(seed: int) -> None:
    sequence = RANDOM_SEQUENCES[seed]
    for slots in (3, 4):
        best = optimal_hits(sequence, slots - 1)
        assert oracle_count(sequence, slots) == best
        assert oracle_count(sequence, slots, admission=False) <= best
    # over these traces, Belady's order is what reaches the optimum (LRU with oracle admission does not)
    if seed == 0:
        missed = sum(oracle_count(s, 3, eviction=False) < optimal_hits(s, 2) for s in RANDOM_SEQUENCES[:4])
        assert missed >= 2


def test_the_exhaustive_optimum_is_beladys_on_a_textbook_case() -> None:
    # capacity 2, a b c a b c a b c: with bypass, skip c at t=2 (hit a, b at 3, 4), take c at 5 over b
    # (hit a at 6), skip b at 7, hit c at 8: 4 hits; without bypass MIN gets 3 (t = 3, 5, 7)
    assert optimal_hits([0, 1, 2, 0, 1, 2, 0, 1, 2], 2) == 4
    assert optimal_hits([0, 0, 0], 1) == 2


def test_future_index_orders_exact_and_fallback_uses() -> None:
    reqs = paging_trace([0, 1, 0, 0], 2, seed=0)
    hits = demand_hits(CONFIG, reqs)
    assert hits == [0, 0, PROMPT, PROMPT]
    future = FutureIndex(reqs, hits, grid=PROMPT)
    from mamba_radix.state_stamp import PrefixFingerprints

    fp = PrefixFingerprints(reqs[0].input_array()).at(PROMPT)
    assert future.next_exact(PROMPT, fp, 0) == 2
    assert future.next_exact(PROMPT, fp, 2) == 3
    assert future.next_exact(PROMPT, fp, 3) == NEVER
    other = PrefixFingerprints(reqs[1].input_array()).at(PROMPT)
    assert not future.demanded_after(PROMPT, other, 1)


def test_oracle_declines_checkpoints_nobody_uses() -> None:
    reqs = paging_trace([0, 1, 0, 0], 2, seed=0)
    ctx = PolicyContext(reqs, exact_pools(CONFIG, 100_000, 8))
    result = run_policy("oracle", CONFIG, ctx)
    # prompt 1's checkpoint, every suffix checkpoint and every finish are declined; prompt 0's kept
    assert result["stats"]["checkpoints_inserted"] == 1
    assert result["token_hit_rate"] * sum(r.input_len for r in reqs) == 2 * PROMPT


def test_oracle_ablations_are_the_config_halves() -> None:
    reqs = paging_trace([0, 1], 2, seed=0)
    future = FutureIndex(reqs, demand_hits(CONFIG, reqs), PROMPT)
    assert Oracle(future, admission=False).admit_checkpoint(object(), 64)  # type: ignore[arg-type]


def death_only_hits(sequence: list[int], capacity: int) -> int:
    """Paging where only death is known: an item enters if it is used again; a full cache evicts a dead
    item (least recently used first), else the least recently used living one."""
    cached: dict[int, int] = {}  # item -> last use
    hits = 0
    for t, item in enumerate(sequence):
        if item in cached:
            hits += 1
        elif item in sequence[t + 1 :]:
            if len(cached) >= capacity:
                dead = [c for c in cached if c not in sequence[t + 1 :]]
                victim = min(dead or cached, key=cached.__getitem__)
                del cached[victim]
        else:
            continue
        cached[item] = t
    return hits


@pytest.mark.parametrize("seed", range(len(RANDOM_SEQUENCES)))
def test_the_death_only_oracle_is_lru_that_knows_which_items_die(seed: int) -> None:
    sequence = RANDOM_SEQUENCES[seed]
    for slots in (3, 4):
        got = oracle_count(sequence, slots, knows_order=False)
        assert got == death_only_hits(sequence, slots - 1), (sequence, slots)
        assert got <= optimal_hits(sequence, slots - 1)


def test_knowing_the_order_beats_knowing_only_death_on_a_loop() -> None:
    # capacity 2 over a loop of three items: LRU among the living evicts exactly the item needed next,
    # so it hits only in the last round (when items start to die: 2 hits); Belady keeps one item of the
    # loop fixed and hits every other request (6)
    loop = [0, 1, 2] * 4
    assert death_only_hits(loop, 2) == 2
    assert oracle_count(loop, 3, knows_order=False) == 2
    assert oracle_count(loop, 3) == optimal_hits(loop, 2) == 6
