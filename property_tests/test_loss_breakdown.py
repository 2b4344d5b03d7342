"""The loss probe (:mod:`mamba_radix.policies.loss_probe`): no decision changes, the split adds up, the
oracle loses nothing where it is optimal, and the experiment report's table."""

from __future__ import annotations

import pytest

from mamba_radix import experiment as ex
from mamba_radix import experiment_report as rep
from mamba_radix.policies.future import demand_hits
from mamba_radix.policies.registry import PolicyContext, run_policy
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.sessions import session_chat

POLICIES = ("sglang-0.5.23", "sift2", "sift2-sessions", "oracle")


@pytest.fixture(scope="module")
def small() -> tuple[list, list[int]]:
    reqs = session_chat(seed=0, num_requests=200, block_size=64)
    return reqs, demand_hits(ex.base_config(), reqs, "kimi-k3")


@pytest.mark.parametrize("bind", ["slots", "kv"])
def test_the_probe_changes_no_hit_and_its_split_adds_up(small: tuple[list, list[int]], bind: str) -> None:
    reqs, demands = small
    config = ex.base_config()
    tokens = ex.workload_tokens(reqs)
    pools = (
        exact_pools(config, tokens + 1, 16, "kimi-k3")
        if bind == "slots"
        else exact_pools(config, tokens // 8, 600, "kimi-k3")
    )
    for p in POLICIES:
        plain = run_policy(p, config, PolicyContext(reqs, pools, demands={config: demands}))
        probed = run_policy(
            p, config, PolicyContext(reqs, pools, demands={config: demands}), loss_demands=demands
        )
        assert probed["token_hit_rate"] == plain["token_hit_rate"], p
        loss = probed["loss"]
        assert sum(loss["by_cause"].values()) == loss["lost_tokens"] == sum(loss["by_kind"].values())
        assert 0 <= loss["admitted_dead"] <= loss["admitted"]
        hits = probed["token_hit_rate"] * sum(r.input_len for r in reqs)
        assert loss["lost_tokens"] >= sum(demands) - hits - 1e-6  # every token below the demand is split
        if p == "oracle" and bind == "slots":
            assert loss["lost_tokens"] == 0  # optimal where KV does not bind: it misses no demand


def test_the_report_splits_each_policys_loss_against_the_oracle() -> None:
    def row(policy: str, hit: float, cause: dict[str, int]) -> dict:
        return {
            "workload": "w", "regime": "slots bind", "point": 0, "policy": policy, "token_hit_rate": hit, "state_slots": 8,
            "input_tokens": 1000,
            "loss": {"lost_tokens": sum(cause.values()), "by_cause": cause, "by_kind": {"end-block": sum(cause.values())},
                     "admitted": 10, "admitted_dead": 4, "dead_by_kind": {}},
        }  # fmt: skip

    rows = [row("oracle", 0.5, {"evicted": 10}), row("sift2", 0.4, {"evicted": 60, "kv_order": 50})]
    lines = rep.loss_lines(rows, ["sift2", "oracle"])
    assert any(line.startswith("## Where the remaining loss is") for line in lines)
    cells = [c.strip() for c in lines[-1].strip("|").split("|")]
    # 10 points lost: 5 evicted, 5 KV order, nothing left over
    assert cells[3:11] == ["sift2", "10.00", "0.00", "5.00", "5.00", "0.00", "0.00", "0.00"]
    assert cells[-1] == "0.40 of 10"
    assert rep.loss_lines([{k: v for k, v in r.items() if k != "loss"} for r in rows], ["sift2"]) == []


def test_the_bundled_sessions_definition_loads_with_the_variant_and_the_breakdown() -> None:
    from mamba_radix.data import definition_path

    e = ex.load_policy_definition(definition_path("sessions"))
    assert e.loss_breakdown and "sift2-sessions" in e.policies and e.workloads[0].synthetic == "sessions"
    reqs = ex.load_requests(e.with_limit(50).workloads[0])
    assert len(reqs) == 50 and all(r.session_id is not None for r in reqs)
