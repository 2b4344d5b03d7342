"""The tier-aware optimum (issue 25, item 6), where it is exact: one equal-value demand per request,
sequential replay, KV never binding, loads and backups free.

The two-tier problem is searched exhaustively here: a request hits when its item is on the device or on the
host; after it the item is on the device (loaded back, or computed and admitted, or bypassed); any device
item may be copied to the host (a backup) and any copy dropped, within each tier's capacity. With free moves
the hits depend only on the union of the tiers, so the optimum equals the one-tier optimum at device + host
capacity: the tier-aware oracle is the offline oracle on pools that merge the host's capacity into the
device's (``mamba_radix.sim.engine.EngineOptions.host_merged``). Checked on random sequences, then against the
real cache: the oracle on merged pools reaches the exhaustive two-tier optimum, and the tiered cache under every
write policy stays at or under it.
"""

from __future__ import annotations

import functools
from itertools import combinations

import numpy as np
import pytest

from mamba_radix.config import HOST_WRITE_POLICIES
from mamba_radix.errors import ConfigError
from mamba_radix.policies.future import FutureIndex, demand_hits
from mamba_radix.policies.oracle import Oracle
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.engine import Engine, EngineOptions
from property_tests.test_policies_oracle import CONFIG, PROMPT, optimal_hits, oracle_count, paging_trace


def _subsets(items: frozenset[int], size: int) -> list[frozenset[int]]:
    return [frozenset(c) for k in range(min(size, len(items)) + 1) for c in combinations(sorted(items), k)]


def optimal_two_tier_hits(sequence: list[int], device: int, host: int) -> int:
    """Exhaustive two-tier paging: the most requests that find their item on the device or the host.

    State: the device set and the host set. At step ``t`` the item is served (a hit if in either set) and is
    then on the device. Before the next step the device keeps any subset (of its items and the served one)
    within ``device``, and the host keeps any subset of its own items and the device's items of this step
    (a backup) within ``host``. Exponential; for sequences over a handful of items."""

    @functools.cache
    def best(t: int, on_device: frozenset[int], on_host: frozenset[int]) -> int:
        if t == len(sequence):
            return 0
        item = sequence[t]
        gain = int(item in on_device or item in on_host)
        seen = on_device | {item}
        options = {(d, h) for d in _subsets(seen, device) for h in _subsets(on_host | seen, host)}
        return gain + max(best(t + 1, d, h) for d, h in options)

    return best(0, frozenset(), frozenset())


RANDOM = [[int(x) for x in np.random.default_rng(100 + seed).integers(0, 5, 12)] for seed in range(5)]


@pytest.mark.parametrize("seed", range(len(RANDOM)))
def test_with_free_moves_two_tiers_hit_as_one_tier_of_their_summed_capacity(seed: int) -> None:
    sequence = RANDOM[seed]
    for device, host in ((1, 1), (1, 2), (2, 1)):
        assert optimal_two_tier_hits(sequence, device, host) == optimal_hits(sequence, device + host)
    # a host adds hits over the device alone on some sequence (the check is not vacuous)
    assert any(optimal_two_tier_hits(s, 1, 2) > optimal_hits(s, 1) for s in RANDOM)


def merged_oracle_count(sequence: list[int], slots: int, host_slots: int) -> int:
    """Hits of the offline oracle on a tiered config whose host pools the engine merges into the device's
    (``EngineOptions.host_merged``)."""
    config = CONFIG.replace(host_kv_tokens=100_000, host_state_slots=host_slots)
    reqs = paging_trace(sequence, 5, seed=0)
    policy = Oracle(FutureIndex(reqs, demand_hits(CONFIG, reqs), PROMPT))
    options = EngineOptions(mode="sequential", host_merged=True)
    engine = Engine(config, exact_pools(config, 100_000, slots), 300, options, policy)
    policy.cache = engine.cache
    assert not engine.config.host_tier and engine.pools.state_slots == slots + host_slots
    summary = engine.run(reqs).summary()
    return round(summary["token_hit_rate"] * sum(r.input_len for r in reqs) / PROMPT)


def test_merging_needs_a_host_tier_and_a_flag() -> None:
    with pytest.raises(ConfigError, match="host_merged adds the host pools"):
        Engine(CONFIG, exact_pools(CONFIG, 1000, 3), 300, EngineOptions(host_merged=True))
    with pytest.raises(ConfigError, match="host_merged must be true or false"):
        EngineOptions(host_merged="yes")  # type: ignore[arg-type]
    # a planned split without the workload would rebuild the cache in run(), and a policy serves one cache
    tiered = CONFIG.replace(host_kv_tokens=1000, host_state_slots=2)
    reqs = paging_trace([0, 1], 2, seed=0)
    oracle = Oracle(FutureIndex(reqs, demand_hits(CONFIG, reqs), PROMPT))
    planned = EngineOptions(host_split="planned", host_merged=True)
    with pytest.raises(ConfigError, match="needs the workload up front"):
        Engine(tiered, exact_pools(tiered, 1000, 3), 300, planned, oracle)
    engine = Engine(tiered, exact_pools(tiered, 1000, 3), 300, planned, oracle, workload=reqs)
    assert not engine.config.host_tier


def tiered_count(sequence: list[int], slots: int, host_slots: int, write_policy: str | None) -> int:
    """Hits of the real cache (SGLang 0.5.23's own order) on the paging trace, with the host tier
    (``write_policy``) or without it (None)."""
    config = CONFIG
    if write_policy is not None:
        config = CONFIG.replace(
            host_kv_tokens=100_000, host_state_slots=host_slots, host_write_policy=write_policy
        )
    reqs = paging_trace(sequence, 5, seed=0)
    engine = Engine(config, exact_pools(config, 100_000, slots), 300, EngineOptions(mode="sequential"))
    summary = engine.run(reqs).summary()
    return round(summary["token_hit_rate"] * sum(r.input_len for r in reqs) / PROMPT)


@pytest.mark.parametrize("seed", range(3))
def test_the_union_oracle_is_the_two_tier_optimum_and_no_tiered_cache_beats_it(seed: int) -> None:
    sequence = RANDOM[seed]
    slots, host_slots = 3, 2  # no_buffer: the tree keeps slots - 1 device checkpoints
    best = optimal_two_tier_hits(sequence, slots - 1, host_slots)
    assert oracle_count(sequence, slots + host_slots) == best
    assert merged_oracle_count(sequence, slots, host_slots) == best
    tiered = {policy: tiered_count(sequence, slots, host_slots, policy) for policy in HOST_WRITE_POLICIES}
    assert max(tiered.values()) <= best, tiered
    # the host tier is used: some write policy hits more than the same cache without it
    assert max(tiered.values()) > tiered_count(sequence, slots, 0, None), tiered
