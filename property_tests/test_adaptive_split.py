"""The adaptive KV/state split (issue 16, deliverable 4): pool capacities below the physical size, the
controller's direction on hand-made traces, and the byte budget, the pools' counts and every cache
invariant held at every decision of random runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_workloads import SMALL_SYNTHETIC

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.pools import MambaPool, TokenToKVPoolAllocator
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.capacity_limit import LimitedKVAllocator, LimitedMambaPool
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.split import AdaptiveSplit, SplitOptions
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import TraceRequest

KV_BYTES, SLOT_BYTES = 100, 1_000  # one slot costs ten KV tokens
CONFIG = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=4, mamba_track_interval=8
)


def pools(kv_tokens: int, slots: int) -> PoolSizes:
    return PoolSizes(kv_tokens, slots, 0, 1.0, 0.5, KV_BYTES, SLOT_BYTES, "test")


# ----------------------------------------------------------------------------------- pool capacity
def test_a_lowered_capacity_limits_available_size_and_alloc() -> None:
    kv = LimitedKVAllocator(10)
    kv.set_capacity(6)
    assert (kv.capacity, kv.available_size()) == (6, 6)
    taken = kv.alloc(4)
    assert taken is not None and kv.available_size() == 2
    assert kv.alloc(3) is None and kv.available_size() == 2  # refused, nothing taken
    kv.set_capacity(10)
    assert kv.alloc(6) is not None and kv.available_size() == 0


def test_a_state_pool_capacity_covers_alloc_as_list_and_fork() -> None:
    pool = LimitedMambaPool(8, 1, [(2,)], (2,))
    pool.set_capacity(3)
    assert pool.alloc(2, as_list=True) is not None
    src = pool.alloc(1)
    assert src is not None and pool.available_size() == 0
    assert pool.alloc(1, as_list=True) is None and pool.alloc(1) is None
    assert pool.fork(int(src[0]), 1) is None and pool.used == 3


def test_the_core_pools_carry_no_capacity_hook() -> None:
    """The capacity limit is the simulator's (``mamba_radix.sim.capacity_limit``): the core pools have no
    ``set_capacity``, and a run without a split builds plain core pools (``MambaRadixCache.build``)."""
    assert not hasattr(TokenToKVPoolAllocator(4), "set_capacity")
    assert not hasattr(MambaPool(4, 1, [(2,)], (2,)), "withheld")
    engine = Engine(CONFIG, pools(400, 20), 64)
    assert type(engine.kv_pool) is TokenToKVPoolAllocator and type(engine.mamba_pool) is MambaPool
    assert (engine.kv_pool.size, engine.mamba_pool.size) == (400, 20)


def test_limited_pools_at_full_capacity_hand_out_what_the_core_pools_do() -> None:
    kv, core_kv = LimitedKVAllocator(16), TokenToKVPoolAllocator(16)
    states, core_states = LimitedMambaPool(6, 1, [(2,)], (2,)), MambaPool(6, 1, [(2,)], (2,))
    for n in (3, 5, 0, 8):
        a, b = kv.alloc(n), core_kv.alloc(n)
        assert (a is None and b is None) or (a is not None and b is not None and a.equal(b))
    kv.free(torch.tensor([2, 3]))
    core_kv.free(torch.tensor([2, 3]))
    assert kv.available_size() == core_kv.available_size() and kv.alloc(2).equal(core_kv.alloc(2))  # type: ignore[union-attr]
    assert states.alloc(2, as_list=True) == core_states.alloc(2, as_list=True)
    assert states.alloc(5) is None and core_states.alloc(5) is None
    assert states.available_size() == core_states.available_size() == 4


@pytest.mark.parametrize("capacity", [-1, 11, 2, True])
def test_an_impossible_capacity_is_refused_and_changes_nothing(capacity: Any) -> None:
    kv = LimitedKVAllocator(10)
    kv.alloc(3)
    with pytest.raises(InvalidArgument):
        kv.set_capacity(capacity)  # below the 3 in use, past the size, or not a count
    assert (kv.capacity, kv.available_size()) == (10, 7)


def test_split_options_are_validated() -> None:
    for bad in (
        {"every": 0},
        {"step_fraction": 0.0},
        {"step_fraction": 1.5},
        {"tolerance": 1.0},
        {"min_slots": 0},
    ):
        with pytest.raises(ConfigError):
            SplitOptions(**bad)
    with pytest.raises(ConfigError, match="over the budget"):
        AdaptiveSplit(SplitOptions(), 1_000, KV_BYTES, SLOT_BYTES, 10, 1)


# ------------------------------------------------------------------------------------- direction
def trace(num_prefixes: int, rounds: int, prefix_len: int, output_len: int = 4) -> list[TraceRequest]:
    """``rounds`` passes over ``num_prefixes`` distinct prompts (each round appends one new token), so
    reuse distance is ``num_prefixes`` requests."""
    reqs = []
    for r in range(rounds):
        for p in range(num_prefixes):
            prompt = [10_000 * (p + 1) + j for j in range(prefix_len)] + [r]
            reqs.append(TraceRequest.from_tokens(len(reqs), 0.0, prompt, list(range(output_len))))
    return reqs


def run(reqs: list[TraceRequest], pool: PoolSizes, split: SplitOptions | None) -> tuple[Engine, float]:
    options = EngineOptions(mode="sequential", check_invariants_every=1, split=split)
    engine = Engine(CONFIG, pool, max(r.input_len + r.output_len for r in reqs), options)
    return engine, engine.run(reqs).summary()["token_hit_rate"]


@pytest.mark.parametrize(
    ("kv_tokens", "slots", "grows"),
    [
        # 12 prompts of 40 tokens reused every 12 requests: KV for all of them, 8 state slots (3 per
        # running request: too few to keep 12 checkpoints), so bytes go to the state pool
        (4_000, 8, "states"),
        # 300 KV tokens hold about 6 of the prompts, 60 slots are ample: bytes go to the KV pool
        (300, 60, "kv"),
    ],
)
def test_bytes_move_to_the_pool_that_binds(kv_tokens: int, slots: int, grows: str) -> None:
    reqs = trace(12, 6, 40)
    _, static = run(reqs, pools(kv_tokens, slots), None)
    engine, adaptive = run(reqs, pools(kv_tokens, slots), SplitOptions(every=4, min_slots=4))
    assert engine.split is not None
    if grows == "states":
        assert engine.split.state_slots > slots and engine.split.kv_tokens < kv_tokens
    else:
        assert engine.split.kv_tokens > kv_tokens and engine.split.state_slots < slots
    assert adaptive > static


class CheckedSplit(AdaptiveSplit):
    """Checks the budget, the pools and the cache's invariants after every decision."""

    running: Any = None

    def after_finish(self, cache: Any) -> Any:
        step = super().after_finish(cache)
        assert self.kv_tokens * self.bytes_per_kv_token + self.state_slots * self.bytes_per_state_slot <= (
            self.budget_bytes
        )
        kv, states = cache.token_to_kv_pool_allocator, cache.mamba_pool
        assert (kv.capacity, states.capacity) == (self.kv_tokens, self.state_slots)
        # running requests' reserved decode KV still fits (the admission's rule), nothing allocated past it
        assert kv.available_size() + cache.full_evictable_size() >= cache.reserved_kv_tokens
        assert kv.used <= kv.capacity and states.used <= states.capacity
        assert self.state_slots >= self.options.min_slots and self.kv_tokens >= self.options.min_kv_tokens
        cache.check_invariants(self.running())
        return step


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    generator=st.sampled_from(sorted(GENERATORS)),
    seed=st.integers(0, 50),
    kv_tokens=st.integers(300, 3_000),
    slots=st.integers(12, 60),
    every=st.integers(1, 6),
    step_fraction=st.sampled_from([0.125, 0.5, 1.0]),
    tolerance=st.sampled_from([0.0, 0.25, 0.75]),
    mode=st.sampled_from(["sequential", "timed"]),
)
def test_every_decision_keeps_the_budget_and_the_invariants(
    generator: str,
    seed: int,
    kv_tokens: int,
    slots: int,
    every: int,
    step_fraction: float,
    tolerance: float,
    mode: str,
) -> None:
    reqs = GENERATORS[generator](seed=seed, **SMALL_SYNTHETIC[generator])
    longest = max(r.input_len + r.output_len for r in reqs)
    kv_tokens = max(kv_tokens, longest + 1)
    options = SplitOptions(every=every, step_fraction=step_fraction, tolerance=tolerance, min_slots=6)
    engine = Engine(CONFIG, pools(kv_tokens, slots), longest, EngineOptions(mode=mode, split=options))  # type: ignore[arg-type]
    assert engine.split is not None
    engine.split.__class__ = CheckedSplit  # the same controller, checked after each decision
    assert isinstance(engine.split, CheckedSplit)
    engine.split.running = lambda: [s.req for s in engine.prefilling] + [s.req for s in engine.decoding]
    metrics = engine.run(reqs)
    summary = metrics.summary()
    assert summary["requests"] == len(reqs) and summary["token_hit_rate"] <= summary["ideal_hit_rate"]
    assert len(engine.split.history) == len(reqs) // every


def test_state_tensors_follow_the_physical_size() -> None:
    engine = Engine(CONFIG, pools(400, 20), 64, EngineOptions(split=SplitOptions()))
    # the budget is 400 * 100 + 20 * 1000 = 60,000 bytes: 600 KV tokens or 60 slots physically
    assert (engine.kv_pool.size, engine.mamba_pool.size) == (600, 60)
    assert (engine.kv_pool.capacity, engine.mamba_pool.capacity) == (400, 20)
    assert engine.mamba_pool.temporal.shape[1] == 61 and engine.mamba_pool.temporal.dtype == torch.float32


# ------------------------------------------------------------------------------ options and the CLI
def test_split_options_come_from_json_as_a_dict() -> None:
    assert EngineOptions(split={"every": 4}).split == SplitOptions(every=4)
    with pytest.raises(ConfigError, match="known: every"):
        EngineOptions(split={"evry": 4})


def test_the_cli_runs_an_adaptive_split_and_says_where_it_ended(capsys: pytest.CaptureFixture[str]) -> None:
    from mamba_radix.cli import main

    common = ["simulate", "--limit", "200", "--kv-tokens", "2000000", "--state-slots", "64", "--quiet"]
    assert main([*common, "--mode", "sequential", "--no-verify-states", "--adaptive-split"]) == 0
    out = capsys.readouterr().out
    assert "adaptive split      ended at" in out and "pools               2,000,000 KV tokens, 64" in out
    assert main([*common, "--infinite", "--adaptive-split"]) == 2
    assert "drop --infinite" in capsys.readouterr().err


def test_the_experiment_runs_end_to_end(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`experiments/adaptive_split.py` on 40 requests per workload: every table row and the plot."""
    import sys
    from pathlib import Path

    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    try:
        import adaptive_split
    finally:
        sys.path.pop(0)
    out, png = tmp_path / "split.md", tmp_path / "split.png"
    assert adaptive_split.main(["--limit", "40", "--quiet", "--out", str(out), "--plot", str(png)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    assert sum(line.startswith(("| 8M KV", "| 2M KV")) for line in text.splitlines()) == 6
    assert (
        sum(line.startswith(("| chat", "| system-prompt", "| agent", "| tree")) for line in text.splitlines())
        == 8
    )
    assert png.stat().st_size > 10_000
