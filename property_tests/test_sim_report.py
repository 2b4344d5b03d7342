"""The report's generated statements: eviction orders that coincide or differ are named from the results."""

from __future__ import annotations

import copy
from typing import Any

from mamba_radix.sim.report import order_comparisons


def _record(run_id: str, order: str, hit_tokens: int, evicted: int, refresh: str = "path") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "params": {
            "group": "eviction",
            "strategy": "extra_buffer",
            "mamba_eviction_order": order,
            "mamba_lru_refresh": refresh,
            "mamba_full_memory_ratio": 0.15,
            "budget_gib": 27.25,
        },
        "metrics": {
            "cached_tokens": hit_tokens,
            "kv_matched_tokens": hit_tokens + 5,
            "prefill_tokens": 1000 - hit_tokens,
            "peak_running": 4,
            "sim_time_s": 12.5,
            "token_hit_rate": hit_tokens / 1000,
        },
        "cache_stats": {
            "states_evicted": evicted,
            "tokens_evicted": 300,
            "checkpoints_inserted": 40,
            "checkpoints_capped": 0,
        },
    }


def test_identical_outcomes_are_reported_as_coinciding() -> None:
    lines = order_comparisons([_record("001", "leaf_first", 100, 9), _record("002", "root_first", 100, 9)])
    assert len(lines) == 1 and "coincide" in lines[0] and "run 001" in lines[0] and "run 002" in lines[0]


def test_different_outcomes_are_reported_with_the_difference() -> None:
    lines = order_comparisons([_record("001", "leaf_first", 100, 9), _record("002", "root_first", 120, 9)])
    assert len(lines) == 1 and "differ" in lines[0] and "+2.00 points" in lines[0]
    # the same hits but other evictions: not "coincide"
    lines = order_comparisons([_record("001", "leaf_first", 100, 9), _record("002", "root_first", 100, 8)])
    assert "differ" in lines[0]


def test_runs_that_differ_in_more_than_the_order_are_not_compared() -> None:
    other = _record("002", "root_first", 100, 9, refresh="node")
    assert order_comparisons([_record("001", "leaf_first", 100, 9), other]) == []
    failed = copy.deepcopy(other) | {"error": "boom"}
    assert order_comparisons([_record("001", "leaf_first", 100, 9), failed]) == []
