"""Research policies with the host tier on (issue 25): the policy picks the device victims and admits the
checkpoints as without the tier; what a victim becomes (demoted, backed up, removed) is the tier's rule.

- :class:`HostPolicyMachine`: the host-tier state machine of ``test_host_tier.py`` with each registered
  research policy that needs no trace pre-pass in the cache, the invariants (both tiers) after every step,
  and every victim a policy picks checked to be a device candidate of the index (never a host-only node).
- The device order: on a scenario where the host never binds (and nothing is loaded back), the device
  victims with the tier on are the ones the same policy picks without it, victim by victim.
- The simulator: every registered policy but the oracle (marconi and sift2-sessions need the workload)
  runs in the ``Engine`` at ``host_memory_ratio=4`` on a small synthetic trace, with the invariants checked
  after every request, and reports host hits; the oracle is refused with its one-line reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize
from test_host_tier import STRATEGIES, HostEngine, HostTierMachine, prompt
from test_host_tier import make_engine as host_engine

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.eviction import is_full_candidate, is_mamba_candidate
from mamba_radix.policies.future import FutureIndex
from mamba_radix.policies.marconi import Marconi
from mamba_radix.policies.oracle import Oracle
from mamba_radix.policies.registry import POLICIES, VARIANTS
from mamba_radix.policy import CachePolicy
from mamba_radix.sim.sweep import RunSpec, policy_problem, run_one

# the research policies a cache takes without the trace (the registry's makers read it only for these)
ONLINE: dict[str, Callable[[], CachePolicy]] = {
    name: (lambda spec=spec: spec.make(CacheConfig(), None))  # type: ignore[arg-type,misc]
    for name, spec in POLICIES.items()
    if name in ("thinning", "vllm-sparse", "sift", "sift2", "sift3")
}
ONLINE["marconi"] = lambda: Marconi(1.0, 64, 4096)  # the registry tunes alpha on the trace; any alpha here
TRACE_POLICIES = sorted(n for n in [*POLICIES, *VARIANTS] if n not in ("oracle",))


def recording(policy: CachePolicy, victims: list[tuple[str, tuple[int, ...], bool]]) -> CachePolicy:
    """``policy`` with its pickers recording each victim as ``(kind, prefix tokens, holds a checkpoint)``
    and asserting it is a device candidate of the index (its class swapped, as ``loss_probe.probe``)."""
    cls = type(policy)

    def path(node: Any) -> tuple[int, ...]:
        tree = policy.tree
        assert tree is not None
        return tuple(t for x in reversed(list(tree.path_to_root(node))) for t in x.key)

    def pick_full_victim(self: CachePolicy, index: Any) -> Any:
        victim = cls.pick_full_victim(self, index)
        if victim is not None:
            assert victim.value is not None and is_full_candidate(victim), "a host-only node offered"
            victims.append(("kv", path(victim), victim.mamba_slot is not None))
        return victim

    def pick_mamba_victim(self: CachePolicy, index: Any) -> Any:
        victim = cls.pick_mamba_victim(self, index)
        if victim is not None:
            assert victim.value is not None and is_mamba_candidate(victim), "a host-only node offered"
            victims.append(("state", path(victim), True))
        return victim

    policy.__class__ = type(
        f"Recording{cls.__name__}",
        (cls,),
        {"pick_full_victim": pick_full_victim, "pick_mamba_victim": pick_mamba_victim},
    )
    return policy


def make_engine(
    policy: CachePolicy,
    *,
    num_tokens: int = 768,
    num_slots: int = 40,
    host_kv: int = 384,
    host_slots: int = 6,
    **fields: Any,
) -> HostEngine:
    """:func:`test_host_tier.make_engine`'s engine whose cache runs ``policy``, on SGLang 0.5.23's rules (the
    registry's base for every research policy: KV-only leaves kept)."""
    return host_engine(
        num_tokens=num_tokens,
        num_slots=num_slots,
        host_kv=host_kv,
        host_slots=host_slots,
        policy=policy,
        peer="sglang-0.5.23",
        **fields,
    )


# ------------------------------------------------------------------------------------ state machine
class HostPolicyMachine(HostTierMachine):
    """:class:`HostTierMachine` with a research policy in the cache: every step checks the invariants over
    both tiers, the stamps and the KV bytes, and every victim the policy picks is a device candidate."""

    policy_name = "sift"

    @initialize(cap=st.sampled_from([-1, 2]), cap_mode=st.sampled_from(["keep", "drop"]))
    def build(self, cap: int, cap_mode: str) -> None:
        self.victims: list[tuple[str, tuple[int, ...], bool]] = []
        self.engine = make_engine(
            recording(ONLINE[self.policy_name](), self.victims),
            host_write_policy=self.policy,
            mamba_cache_chunk_size=16,
            chunked_prefill_size=32,
            mamba_track_interval=8,
            mamba_max_states_per_path=cap,
            host_path_cap=cap_mode,
            **STRATEGIES[self.strategy],
        )


@pytest.mark.parametrize("write_policy", ["write_through", "write_back", "resumable"])
@pytest.mark.parametrize("name", sorted(ONLINE))
def test_state_machine_with_each_policy(name: str, write_policy: str) -> None:
    machine = type(
        f"HostPolicy_{name}_{write_policy}",
        (HostPolicyMachine,),
        {"strategy": "extra_buffer", "policy": write_policy, "policy_name": name},
    )
    machine.TestCase.settings = settings(
        max_examples=8,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()


# ------------------------------------------------------------------------------------- device order
def _victims_of(name: str, host_tier: bool) -> tuple[list[tuple[str, tuple[int, ...], bool]], HostEngine]:
    """The victims ``name`` picks on a fixed scenario: shared prefixes and forks, then evictions one at a
    time interleaved with fresh requests (nothing evicted is asked for again, so nothing is loaded back);
    the host (write_back, 4x the device) never binds."""
    victims: list[tuple[str, tuple[int, ...], bool]] = []
    host = {"host_kv": 4096, "host_slots": 256} if host_tier else {"host_kv": 0, "host_slots": 0}
    engine = make_engine(
        recording(ONLINE[name](), victims),
        num_tokens=1024,
        num_slots=48,
        host_write_policy="write_back",
        mamba_cache_chunk_size=16,
        chunked_prefill_size=32,
        mamba_track_interval=16,
        **STRATEGIES["extra_buffer"],
        **host,
    )
    rid = 0
    for base in (0, 50_000, 90_000):
        for tail in range(3):  # a shared 96-token prefix, three branches below it
            rid += 1
            engine.run(Req(rid, prompt(96, base) + [base + 1000 + 100 * tail + i for i in range(40)]))
    cache = engine.cache
    for step in range(24):
        if step % 2:
            cache.evict(num_states=1)
        else:
            cache.evict(num_tokens=1)
        engine.check()
        if step % 6 == 5:  # a fresh request: new nodes, no match with anything evicted
            rid += 1
            engine.run(Req(rid, prompt(120, 200_000 + 1000 * rid)))
    cache.evict(num_tokens=100_000)
    engine.check()
    return victims, engine


@pytest.mark.parametrize("name", sorted(ONLINE))
def test_the_tier_does_not_change_the_device_order(name: str) -> None:
    without, _ = _victims_of(name, host_tier=False)
    with_tier, engine = _victims_of(name, host_tier=True)
    stats = engine.cache.host_stats
    assert stats is not None and stats.host_hits == 0 and stats.host_tokens_evicted == 0  # host never binds
    assert engine.cache.tree.host_only_nodes, "victims were demoted, not removed"
    assert len(without) >= 15
    assert with_tier == without


def test_a_policy_walking_the_tree_sees_demoted_children_as_gone() -> None:
    """Coverage thinning walks a chain down to its next checkpoint or tail: a demoted child ends the chain
    on the device, as a removed one would without the tier."""
    from mamba_radix.policies.thinning import merged_gap

    engine = make_engine(
        ONLINE["thinning"](),
        host_write_policy="write_back",
        host_kv=4096,
        host_slots=256,
        mamba_track_interval=16,
        chunked_prefill_size=32,
        mamba_cache_chunk_size=16,
        **STRATEGIES["extra_buffer"],
    )
    engine.run(Req(1, prompt(130)))
    tree = engine.cache.tree
    engine.cache.evict(num_tokens=1)  # the deepest leaf is demoted
    engine.check()
    demoted = [n for n in tree.host_only_nodes.values()]
    assert demoted
    parent = demoted[0].parent
    assert parent is not None and parent.value is not None
    holder = parent
    while holder.mamba_slot is None:
        holder = holder.parent  # type: ignore[assignment]
    assert merged_gap(holder) <= parent.depth  # the chain ends on the device, not at the demoted node


# ---------------------------------------------------------------------------------------- refusals
def test_the_cache_takes_research_policies_with_the_tier_and_refuses_the_oracle() -> None:
    config = CacheConfig(host_kv_tokens=64, host_state_slots=4)
    for make in ONLINE.values():
        cache = MambaRadixCache.build(config, num_tokens=128, num_slots=16, policy=make())
        assert cache.host_stats is not None
    oracle = Oracle(FutureIndex([], [], config.mamba_checkpoint_grid))
    with pytest.raises(
        InvalidArgument, match="cannot run with the host tier: its future uses ignore host hits"
    ):
        MambaRadixCache.build(config, num_tokens=128, num_slots=16, policy=oracle)
    # without the tier the oracle runs as before
    MambaRadixCache.build(CacheConfig(), num_tokens=128, num_slots=16, policy=oracle)


def _spec(policy: str, **options: Any) -> RunSpec:
    return RunSpec(
        run_id=policy,
        trace="synthetic:chat:seed=0",
        synthetic={"generator": "chat", "seed": 0, "args": {"num_sessions": 6, "turns": 4}},
        config={"mamba_radix_cache_strategy": "extra_buffer", "host_write_policy": "resumable"},
        model="kimi-k3",
        deployment={"tp_size": 8},
        budget_gib=0.5,
        policy=policy,
        options={"mode": "timed", "host_memory_ratio": 4, "check_invariants_every": 1} | options,
    )


def test_the_sweep_refuses_only_the_oracle_with_the_tier() -> None:
    for name in TRACE_POLICIES:
        assert policy_problem(_spec(name)) is None, name
    for name in ("oracle", "oracle-death"):
        line = policy_problem(_spec(name))
        assert line is not None and line.startswith(f"research policy {name!r} cannot run with the host tier")
        assert "\n" not in line
        assert policy_problem(_spec(name, host_merged=True)) is None  # the tier-aware reference
        with pytest.raises(ConfigError, match="cannot run with the host tier"):
            _spec(name).validate()


@pytest.mark.parametrize("name", TRACE_POLICIES)
def test_engine_runs_each_policy_with_the_tier_and_reports_host_hits(name: str) -> None:
    record = run_one(_spec(name))
    host = record["metrics"]["host_tier"]
    assert host["host_hit_requests"] > 0 and host["host_hit_tokens"] > 0 and host["load_backs"] > 0
    assert host["write_policy"] == "resumable"
