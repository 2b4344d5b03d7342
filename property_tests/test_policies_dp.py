"""The exact static placement program (mamba_radix.policies.placement_dp) against brute force, the
simulator and the offline oracle.

- the forest and the chain programs reach the brute-force optimum of every budget on random forests;
- a placement run in the simulator (StaticPlacement) hits exactly the tokens the program says, on aligned
  tries where checkpoint positions cannot move;
- there, every bound holds: static(K) <= dynamic optimum(K) (exhaustive search), every policy of the
  registry <= dynamic optimum(K); where the oracle is optimal (paging) oracle(K) = dynamic optimum(K)
  >= static(K); and on a trie with fallbacks a static placement beats the oracle (MIN counts misses, not
  missed tokens), which the test pins with the decision that loses.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix import CacheConfig
from mamba_radix.errors import InvalidArgument, MambaRadixError
from mamba_radix.policies.placement_dp import (
    PrefixForest,
    StaticPlacement,
    aligned_trie_trace,
    chain_placement,
    exhaustive_dynamic_optimum,
    forest_from_trace,
    optimal_placement,
    placement_value,
    static_placement_policy,
)
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.policy import CachePolicy
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.traces import TraceRequest

GRID = 64
# no_buffer with one chunk per block: checkpoints at every block boundary past the hit, whatever the cache
# held, and the tree holds at most slots - 1 checkpoints when a request matches (one live slot)
CONFIG = CacheConfig(
    mamba_radix_cache_strategy="no_buffer",
    disable_overlap_schedule=True,
    chunked_prefill_size=GRID,
    mamba_cache_chunk_size=GRID,
)
KV = 100_000  # never binds on these traces


def brute_force(forest: PrefixForest, budget: int) -> float:
    return max(
        placement_value(forest, chosen)
        for k in range(min(budget, len(forest)) + 1)
        for chosen in itertools.combinations(range(len(forest)), k)
    )


@st.composite
def forests(draw: st.DrawFn, max_nodes: int = 9) -> PrefixForest:
    n = draw(st.integers(0, max_nodes))
    parent: list[int] = []
    depth: list[int] = []
    for v in range(n):
        p = draw(st.integers(-1, v - 1))
        parent.append(p)
        depth.append((0 if p == -1 else depth[p]) + draw(st.integers(1, 4)) * GRID)
    weight = [draw(st.sampled_from([0, 0, 1, 2, 3, 0.5])) for _ in range(n)]
    return PrefixForest(parent, depth, weight)


@settings(max_examples=150)
@given(forests(), st.integers(0, 5))
def test_forest_program_reaches_the_brute_force_optimum_of_every_budget(
    forest: PrefixForest, budget: int
) -> None:
    result = optimal_placement(forest, budget)
    assert len(result.values) == budget + 1
    for b in range(budget + 1):
        assert result.values[b] == pytest.approx(brute_force(forest, b)), b
    assert len(result.chosen) <= budget
    assert placement_value(forest, result.chosen) == pytest.approx(result.value)
    if budget >= len(forest):
        assert result.value == pytest.approx(forest.ideal_value)


@settings(max_examples=100)
@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=9, unique=True),
    st.data(),
    st.integers(0, 6),
)
def test_chain_program_matches_brute_force(points: list[int], data: st.DataObject, budget: int) -> None:
    depths = sorted(points)
    weights = data.draw(st.lists(st.sampled_from([0, 1, 2, 5]), min_size=len(depths), max_size=len(depths)))
    result = chain_placement(depths, weights, budget)
    chain = PrefixForest([j - 1 for j in range(len(depths))], depths, weights)
    assert result.value == brute_force(chain, budget)
    assert placement_value(chain, result.chosen) == result.value
    assert len(result.chosen) <= budget


def test_chain_hand_worked_overlap_distribution() -> None:
    # one retained 256-token entry; requests overlap it to 64 (1), 192 (3) and 256 (1) tokens
    depths, weights = [64, 128, 192, 256], [1, 0, 3, 1]
    result = chain_placement(depths, weights, 3)
    # 1 checkpoint: at 192 every request from 192 on gains 192: 4 x 192 = 768 (64: 5 x 64; 256: 256)
    # 2: {64, 192} = 64 + 4 x 192 = {192, 256} = 3 x 192 + 256 = 832; 3: every demand served = 896
    assert result.values == (0, 768, 832, 896)
    assert chain_placement(depths, weights, 1).chosen == {2}
    # the forest program agrees on the same chain, and on two such chains under one root shares the budget
    twin = PrefixForest([-1, 0, 1, 2, -1, 4, 5, 6], depths * 2, weights * 2)
    assert optimal_placement(twin, 2).value == 2 * 768
    assert optimal_placement(twin, 3).value == 768 + 832


def test_branching_hand_worked_example() -> None:
    # a shared 192-token prefix (node 0), two branches to 256 (nodes 1, 2), each demanded twice
    forest = PrefixForest([-1, 0, 0], [192, 256, 256], [0, 2, 2])
    # one checkpoint: the shared prefix serves all four (4 x 192) where a branch serves two (2 x 256)
    assert optimal_placement(forest, 1).value == 768
    assert optimal_placement(forest, 1).chosen == {0}
    # two: both branches (4 x 256) beat the shared prefix and one branch (2 x 192 + 2 x 256)
    assert optimal_placement(forest, 2).value == 1024
    assert optimal_placement(forest, 2).chosen == {1, 2}


@pytest.mark.parametrize(
    ("parent", "depth", "weight", "budget"),
    [
        ([0], [64], [1], 1),  # its own parent
        ([-1, 1], [64, 128], [1, 1], 1),  # parent after the child
        ([-1, 0], [64, 64], [1, 1], 1),  # not deeper than its parent
        ([-1], [64], [-1], 1),  # negative weight
        ([-1], [64.5], [1], 1),  # depth not an int
        ([-1], [64], [1], -1),  # negative budget
        ([-1, 0], [64], [1, 1], 1),  # lengths differ
    ],
)
def test_bad_forests_and_budgets_are_refused(
    parent: list[int], depth: list[float], weight: list[float], budget: int
) -> None:
    with pytest.raises(InvalidArgument) as err:
        optimal_placement(PrefixForest(parent, depth, weight), budget)  # type: ignore[arg-type]
    assert isinstance(err.value, MambaRadixError)
    with pytest.raises(InvalidArgument):
        placement_value(PrefixForest([-1], [64], [1]), [1])


# ------------------------------------------------------------------------------------ the simulator
def random_paths(seed: int, n: int = 12) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 2, int(rng.integers(1, 4))).tolist()) for _ in range(n)]


def hit_tokens(reqs: list, policy: StaticPlacement, slots: int) -> tuple[int, int]:
    engine = Engine(CONFIG, exact_pools(CONFIG, KV, slots), 400, EngineOptions(mode="sequential"), policy)
    engine.run(reqs)
    stats = engine.cache_stats()
    return stats["hit_tokens"], stats["states_evicted"]


def test_forest_of_an_aligned_trace_is_its_demand_trie() -> None:
    paths = [(0, 1), (0, 1), (0, 2, 3), (0, 2, 3), (0,), (4,)]
    forest = forest_from_trace(CONFIG, aligned_trie_trace(paths, GRID))
    # request 1 demands "01" (128), requests 2 and 4 "0" (64), request 3 "023" (192); 0 and 5 miss
    by_depth = sorted(zip(forest.depth, forest.weight, strict=True))
    assert by_depth == [(64, 2), (128, 0), (128, 1), (192, 1)]  # "0", "02", "01", "023"
    assert forest.ideal_value == 128 + 64 + 192 + 64
    assert optimal_placement(forest, 1).value == 4 * 64  # "0" serves all four


@pytest.mark.parametrize("seed", [0, 4])
def test_static_placement_runs_at_the_value_the_program_gives(seed: int) -> None:
    paths = random_paths(seed)
    reqs = aligned_trie_trace(paths, GRID, seed)
    forest = forest_from_trace(CONFIG, reqs)
    for budget in (2, 3):
        result = optimal_placement(forest, budget)
        keys = {forest.key[v] for v in result.chosen}  # type: ignore[index]
        hits, evicted = hit_tokens(reqs, StaticPlacement(keys), budget + 1)
        assert (hits, evicted) == (result.value, 0)
    assert hit_tokens(reqs, StaticPlacement(forest.key or ()), len(forest) + 1)[0] == forest.ideal_value
    # the factory sizes the placement to the tree's room: slots - 1 under no_buffer
    policy, placement, _ = static_placement_policy(CONFIG, reqs, 4)
    assert placement.budget == 3
    assert hit_tokens(reqs, policy, 4) == (placement.value, 0)
    with pytest.raises(InvalidArgument, match="admit no running request"):
        static_placement_policy(CONFIG, reqs, 2)


def run_all(reqs: list, slots: int) -> dict[str, int]:
    tokens = sum(r.input_len for r in reqs)
    out = {}
    demands: dict[CacheConfig, list[int]] = {}
    for name, spec in POLICIES.items():
        if name == "marconi":  # its admission needs extra_buffer: another slot accounting than this model's
            continue
        ctx = PolicyContext(reqs, exact_pools(CONFIG, KV, slots), demands=demands)
        out[name] = round(run_policy(name, CONFIG, ctx)["token_hit_rate"] * tokens)
        assert spec.configure(CONFIG).strategy == "no_buffer"
    return out


@pytest.mark.parametrize("seed", [2, 4])
def test_on_aligned_tries_no_policy_and_no_placement_exceeds_the_dynamic_optimum(seed: int) -> None:
    paths = random_paths(seed)
    reqs = aligned_trie_trace(paths, GRID, seed)
    forest = forest_from_trace(CONFIG, reqs)
    for capacity in (2, 3):
        best = exhaustive_dynamic_optimum(paths, capacity, GRID)
        static = optimal_placement(forest, capacity).value
        assert static <= best
        for name, got in run_all(reqs, capacity + 1).items():
            assert got <= best, (name, got, best)
    assert exhaustive_dynamic_optimum(paths, len(forest), GRID) == forest.ideal_value


def test_a_static_placement_beats_the_oracle_on_a_trie_with_fallbacks() -> None:
    # seed 4: paths 111 110 10 11 01 010 001 01 110 111 00 01, two checkpoints. The oracle at request 4
    # (path 01) admits "0" (64 tokens, request 6's exact demand) over "11" (128 tokens, only a fallback
    # of requests 8 and 9): MIN saves the nearer miss and loses 128 + 64 tokens later. Keeping "11" and
    # "01" all along gets 896; the oracle 832; the best schedule 960.
    paths = random_paths(4)
    assert paths[4] == (0, 1) and paths[8] == (1, 1, 0)
    reqs = aligned_trie_trace(paths, GRID, 4)
    forest = forest_from_trace(CONFIG, reqs)
    static = optimal_placement(forest, 2)
    got = run_all(reqs, 3)
    assert (static.value, got["oracle"], exhaustive_dynamic_optimum(paths, 2, GRID)) == (896, 832, 960)
    assert sorted(forest.depth[v] for v in static.chosen) == [128, 128]


@settings(max_examples=60)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=14), st.integers(1, 3))
def test_on_paging_traces_static_is_the_top_counts_and_below_the_dynamic_optimum(
    sequence: list[int], capacity: int
) -> None:
    # distinct one-block prompts: each request's only usable checkpoint is its prompt's, created by its
    # first occurrence. A static set of K prompts gains (count - 1) blocks per prompt kept.
    demand_count = Counter(sequence)
    nodes = sorted(demand_count)
    forest = PrefixForest([-1] * len(nodes), [GRID] * len(nodes), [demand_count[p] - 1 for p in nodes])
    static = optimal_placement(forest, capacity).value
    top = sorted((c - 1 for c in demand_count.values()), reverse=True)[:capacity]
    assert static == GRID * sum(top)
    assert static <= exhaustive_dynamic_optimum([(p,) for p in sequence], capacity, GRID)


@pytest.mark.parametrize("sequence", [[0, 1, 2, 0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1, 0, 1, 0, 2, 2]])
def test_where_the_oracle_is_optimal_it_equals_the_dynamic_optimum_and_bounds_the_static_one(
    sequence: list[int],
) -> None:
    paths = [(p,) for p in sequence]
    reqs = aligned_trie_trace(paths, GRID)
    forest = forest_from_trace(CONFIG, reqs)
    for capacity in (2, 3):
        best = exhaustive_dynamic_optimum(paths, capacity, GRID)
        ctx = PolicyContext(reqs, exact_pools(CONFIG, KV, capacity + 1))
        oracle = round(run_policy("oracle", CONFIG, ctx)["token_hit_rate"] * sum(r.input_len for r in reqs))
        assert oracle == best >= optimal_placement(forest, capacity).value
    # a cyclic trace is where static placement is already optimal (a b c a b c a b c at capacity 2: 4 hits)
    if sequence[:3] == [0, 1, 2]:
        assert optimal_placement(forest, 2).value == exhaustive_dynamic_optimum(paths, 2, GRID) == 4 * GRID


def test_a_checkpoint_created_after_a_request_never_serves_it() -> None:
    # extra_buffer, one chunk: request 0 (A) checkpoints at 256; request 1 (A again) demands it; request 2
    # (A's first 128 tokens, then its own) checkpoints its branch point at 128, an ancestor of 256 that
    # did not exist when request 1 ran. Keeping it would let a placement at 128 serve request 1.
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    rng = np.random.default_rng(0)
    a = rng.integers(1_000, 9_000, 300).tolist()
    b = a[:128] + rng.integers(10_000, 19_000, 172).tolist()
    reqs = [TraceRequest.from_tokens(i, float(i), t, [50_000 + i]) for i, t in enumerate([a, a, b, a])]
    forest = forest_from_trace(config, reqs)
    assert (forest.parent, forest.depth, forest.weight) == ((-1,), (256,), (2,))


def test_a_demand_node_created_after_an_earlier_demand_below_it_is_dropped_not_misplaced() -> None:
    # as above, then request 3 (A's first 128 tokens, then its own) demands the branch point at 128,
    # which did not exist for request 1 (demanding 256 below it): the node is dropped, and request 3's
    # demand, with no kept node above it, counts nowhere (never on another node)
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    rng = np.random.default_rng(0)
    a = rng.integers(1_000, 9_000, 300).tolist()
    b = a[:128] + rng.integers(10_000, 19_000, 172).tolist()
    c = a[:128] + rng.integers(20_000, 29_000, 172).tolist()
    reqs = [TraceRequest.from_tokens(i, float(i), t, [50_000 + i]) for i, t in enumerate([a, a, b, c, a])]
    forest = forest_from_trace(config, reqs)
    assert (forest.parent, forest.depth, forest.weight) == ((-1,), (256,), (2,))


def test_tables_past_the_limit_are_refused_before_they_are_built() -> None:
    # a comb: a 1,000-node spine with a leaf on every spine node; ~n^3 / 3 table entries at a full budget
    parent, depth = [], []
    for i in range(1000):
        spine = len(parent)
        parent.append(spine - 2 if i else -1)
        depth.append((i + 1) * GRID)
        parent.append(spine)
        depth.append((i + 1) * GRID + 1)
    comb = PrefixForest(parent, depth, [1] * len(parent))
    with pytest.raises(InvalidArgument, match="lower the budget"):
        optimal_placement(comb, 2000)
    assert optimal_placement(comb, 2).value > 0  # a small budget fits


class _RoomAtMatch(CachePolicy):
    """Counts the block-boundary checkpoints in the tree each time a request matches."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def on_hit(self, req: object) -> None:
        assert self.tree is not None
        held = sum(
            1 for n in self.tree.nodes() if n.mamba_slot is not None and n.depth % GRID == 0 and n.depth
        )
        self.most = max(self.most, held)


@pytest.mark.parametrize("slots", [3, 4])
def test_the_tree_holds_at_most_slots_minus_one_reusable_checkpoints_when_a_request_matches(
    slots: int,
) -> None:
    # the premise of exhaustive_dynamic_optimum's bound: the running request's live slot takes one (a
    # request's own-last-token checkpoint may take the last slot, but nothing reuses it)
    most = 0
    for seed in range(4):
        policy = _RoomAtMatch()
        engine = Engine(CONFIG, exact_pools(CONFIG, KV, slots), 400, EngineOptions(mode="sequential"), policy)
        engine.run(aligned_trie_trace(random_paths(seed), GRID, seed))
        most = max(most, policy.most)
    assert most == slots - 1
