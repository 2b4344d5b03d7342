"""The capacity planner's predictions against what the simulator measures on the same workload.

The planner (:mod:`mamba_radix.capacity.planner`) predicts from request lengths alone; the simulator
(:mod:`mamba_radix.sim.engine`) replays the same requests through the real cache and pools. Three
predictions are checked, none against a hard-coded number:

1. checkpoints: per request, :func:`expected_checkpoints` given the hit length the simulator measured
   equals the checkpoints the cache was asked to store for that request (inserted + already there +
   skipped for want of a slot). Sequential mode, one request at a time, so the per-request difference
   of the cache's counters is exact; slots to spare, so nothing is skipped or evicted.
2. slots held per decoding request: :func:`decode_slots_in_use` equals what the pools show while
   requests decode (slots reserved by running requests + checkpoints they lock).
3. admission: for a memory budget, the ``max_running_requests`` / binding pool the planner resolves
   (with the workload's KV limit) equal the simulator's peak running requests and the resource that
   refused the next admission, in a burst where every request arrives at once.

A decode boundary in the step that samples the last token is recorded by both: SGLang's
``_mamba_prefix_cache_update`` runs before ``check_finished``, the planner counts that state, and the
simulator tracks it before finishing (``test_checkpoint_at_the_last_decode_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from mamba_radix.capacity import (
    MemoryBudget,
    Parallelism,
    RequestShape,
    SizingInputs,
    Workload,
    decode_slots_in_use,
    expected_checkpoints,
    load_model,
    plan,
)
from mamba_radix.config import CacheConfig
from mamba_radix.sim import budget as sim_budget
from mamba_radix.sim.budget import PoolSizes, pools_for_budget
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.synthetic import agent_loop, branching_tree, multi_turn_chat, shared_system_prompt
from mamba_radix.sim.traces import TraceRequest

STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
# Small grids, so that short synthetic requests cross many checkpoint positions.
CHUNK_GRID = 16

# The planner names the pool that binds; the simulator names the resource that refused an admission.
SIM_REASON = {"mamba state cache": "state_slots", "full KV tokens": "kv_tokens"}


# ------------------------------------------------------------------------------------------- workloads
def unique_requests(lengths: list[tuple[int, int]], start_token: int = 1) -> list[TraceRequest]:
    """Requests sharing no token, so none hits another: every checkpoint and every KV token is new."""
    out, next_id = [], start_token
    for i, (n_in, n_out) in enumerate(lengths):
        inp = list(range(next_id, next_id + n_in))
        outp = list(range(next_id + n_in, next_id + n_in + n_out))
        next_id += n_in + n_out
        out.append(TraceRequest.from_tokens(i, 0.0, inp, outp))
    return out


def varied_lengths(seed: int, n: int) -> list[tuple[int, int]]:
    """Deterministic, uneven lengths (a small LCG: no dependency on numpy's stream)."""
    lengths, x = [], seed
    for _ in range(n):
        x = (1103515245 * x + 12345) % (1 << 31)
        lengths.append((1 + x % 700, 1 + (x >> 10) % 300))
    return lengths


# Each workload: a name and a generator of its requests (kept small: ~30 requests, a few thousand tokens).
WORKLOADS: dict[str, Callable[[], list[TraceRequest]]] = {
    "fixed": lambda: unique_requests([(500, 100)] * 6),
    "varied": lambda: unique_requests(varied_lengths(7, 12)),
    "chat": lambda: multi_turn_chat(seed=3, num_sessions=3, turns=4, system_prompt_len=200, output_len=80),
    "system-prompt": lambda: shared_system_prompt(seed=4, num_requests=12, prompt_len=400, output_len=60),
    "tree": lambda: branching_tree(seed=5, num_trees=1, depth=2, fanout=3, root_len=300, segment_len=90),
    "agent": lambda: agent_loop(seed=6, num_agents=2, steps=4, context_len=600, observation_len=120),
}

# (chunked_prefill_size, mamba_track_interval, mamba_max_states_per_path): no chunking, chunks longer
# and shorter than the requests, a chunk that is not a multiple of the grid; intervals on and off the
# grid; with and without the per-path cap.
KNOBS = [(-1, 64, -1), (512, 128, 2), (100, 48, -1), (37, 80, 3)]


def make_config(strategy: str, chunk: int, interval: int, cap: int) -> CacheConfig:
    return CacheConfig(
        mamba_radix_cache_strategy=strategy,  # type: ignore[arg-type]
        chunked_prefill_size=chunk,
        mamba_track_interval=interval,
        mamba_cache_chunk_size=CHUNK_GRID,
        mamba_max_states_per_path=cap,
    )


def roomy_pools(reqs: list[TraceRequest]) -> PoolSizes:
    """Pools nothing in ``reqs`` can fill: every token, and a slot for every position a checkpoint could
    take, so no checkpoint is skipped and none is evicted (the byte fields are unused here)."""
    tokens = sum(r.input_len + r.output_len for r in reqs)
    return PoolSizes(tokens + 1, tokens + 64, 0, 1.0, 0.5, 1, 1, "test")


def taken(stats: Any) -> int:
    """Checkpoints the cache was asked to store: new, already there, or skipped for want of a slot."""
    return stats.checkpoints_inserted + stats.checkpoints_existing + stats.checkpoints_skipped


# -------------------------------------------------------------------------------------- 1. checkpoints
@dataclass
class SequentialRun:
    engine: Engine
    hits: list[int]
    per_request_taken: list[int]


def run_sequential(config: CacheConfig, reqs: list[TraceRequest]) -> SequentialRun:
    """Replay ``reqs`` one at a time; record each request's hit and the checkpoints it made the cache take."""
    options = EngineOptions(mode="sequential", keep_per_request=True)
    engine = Engine(config, roomy_pools(reqs), max(r.input_len + r.output_len for r in reqs), options)
    per_request: list[int] = []
    seen = [0]

    def on_finish(_: int) -> None:  # sequential: exactly one request ran since the previous call
        now = taken(engine.cache.stats)
        per_request.append(now - seen[0])
        seen[0] = now

    metrics = engine.run(reqs, total=len(reqs), on_finish=on_finish)
    assert metrics.requests == len(reqs) == len(per_request)
    return SequentialRun(engine, [row["hit"] for row in metrics.per_request], per_request)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "chunk{}-interval{}-cap{}".format(*k))
def test_checkpoints_per_request_match_the_planner(strategy: str, knobs: tuple[int, int, int]) -> None:
    config = make_config(strategy, *knobs)
    hit_requests = 0
    for name, make in WORKLOADS.items():
        reqs = make()
        run = run_sequential(config, reqs)
        stats = run.engine.cache.stats
        # slots to spare: nothing skipped, nothing evicted, so "taken" is what the strategy asks for
        assert stats.checkpoints_skipped == stats.states_evicted == 0
        predicted = [
            expected_checkpoints(config, r.input_len, r.output_len, hit).taken
            for r, hit in zip(reqs, run.hits, strict=True)
        ]
        assert predicted == run.per_request_taken, name
        hit_requests += sum(hit > 0 for hit in run.hits)
    # the predictions were also checked after a hit (chunks counted from a cached prefix); which
    # workloads hit depends on the strategy and the cap (a cap of 3 drops a shared prompt's checkpoints)
    assert hit_requests > 0


@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
def test_checkpoint_at_the_last_decode_step(strategy: str) -> None:
    """A decode boundary in the step that samples the last token: SGLang keeps that state (its
    prefix-cache update runs before the finish check), the planner counts it, and so does the simulator,
    which tracks it before finishing so that ``cache_finished_req`` inserts it."""
    config = make_config(strategy, -1, 64, -1)
    shape = RequestShape(100, 29)  # last KV length 100 + 29 - 1 = 128, a multiple of 64
    assert shape.peak_kv_len == 128 and shape.peak_kv_len % config.mamba_track_interval == 0
    run = run_sequential(config, unique_requests([(100, 29)]))
    # prefill at 96 (100 // 16 * 16), decode at 128 (the last step)
    assert run.per_request_taken == [expected_checkpoints(config, 100, 29, run.hits[0]).taken] == [2]
    # and the state at 128 is in the tree: the same prompt + output, resent, hits all of it
    resend = unique_requests([(100, 29)])[0]
    again = TraceRequest.from_tokens(1, 0.0, resend.input_ids + resend.output_ids[:28] + [99_999], [7])
    assert run_sequential(config, [resend, again]).hits == [0, 128]


# ------------------------------------------------------------------------- 2 and 3. budget and burst
def planner_inputs(config: CacheConfig, budget_gib: float, ratio: float) -> SizingInputs:
    """The planner's inputs for the deployment the simulator's budget module assumes (Kimi K3, one rank
    of TP8, bf16 KV and states), so both sides size the same memory."""
    return SizingInputs(
        model=load_model("kimi-k3"),
        parallelism=Parallelism(tp_size=sim_budget.DEFAULT_TP_SIZE),
        cache=config,
        kv_cache_dtype=sim_budget.DEFAULT_KV_CACHE_DTYPE,
        mamba_ssm_dtype=sim_budget.DEFAULT_MAMBA_SSM_DTYPE,
        mamba_conv_dtype=sim_budget.DEFAULT_MAMBA_CONV_DTYPE,
        budget=MemoryBudget(budget_gib),
        mamba_full_memory_ratio=ratio,
    )


# (budget GiB, ratio, input, output): at 2 GiB a Kimi rank holds ~60-70k KV tokens or ~70 slots, so
# ratio 0.3 leaves the state pool binding and ratio 3 the KV pool, for 3,000-token requests.
BURSTS = [(2.0, 0.3, 3000, 40), (2.0, 3.0, 3000, 40), (2.0, 1.0, 1500, 200)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("burst", BURSTS, ids=lambda b: f"{b[0]}GiB-ratio{b[1]}-in{b[2]}-out{b[3]}")
def test_admission_and_decode_slots_match_the_planner(
    strategy: str, burst: tuple[float, float, int, int]
) -> None:
    budget_gib, ratio, n_in, n_out = burst
    config = make_config(strategy, 1024, 64, -1)
    p = plan(planner_inputs(config, budget_gib, ratio), Workload.fixed(n_in, n_out))
    r = p.resolution
    assert p.workload_kv_limit is not None and p.workload_binding is not None
    # the simulator's pools for the same budget are the planner's (the same resolve_pools)
    pools = pools_for_budget(config, budget_gib, ratio)
    assert (pools.state_slots, pools.kv_tokens) == (r.num_slots, r.num_tokens)

    # every request arrives at once and more arrive than can run: admission stops at a limit
    predicted_running = min(r.max_running_requests, p.workload_kv_limit)
    reqs = unique_requests([(n_in, n_out)] * (predicted_running + 3))
    engine = Engine(config, pools, n_in + n_out, EngineOptions(mode="timed"))
    assert engine.max_running == r.limits["mamba state cache"]

    held: list[tuple[int, int]] = []  # (decoding requests, slots they hold) at each finish

    def on_finish(_: int) -> None:
        # only while every running request decodes (a request still in prefill holds no decode layout)
        if engine.decoding and not engine.prefilling:
            slots = engine.req_pool.num_reserved_slots() + engine.cache.mamba_protected_size()
            held.append((len(engine.decoding), slots))

    metrics = engine.run(reqs, total=len(reqs), on_finish=on_finish)
    assert metrics.requests == len(reqs)
    assert metrics.peak_running == predicted_running
    assert metrics.peak_running_bound_by == SIM_REASON[p.workload_binding]
    # live + track slots reserved by running requests + the checkpoint each one locks (every request
    # here has a prefill checkpoint to lock: its prompt is longer than the grid)
    assert held, "no finish while other requests decode"
    for decoding, slots in held:
        assert slots == decoding * decode_slots_in_use(config)


def test_bursts_cover_both_bindings() -> None:
    """The burst cases above must exercise both pools binding, or the binding check proves little."""
    bindings = {
        plan(
            planner_inputs(make_config("extra_buffer", 1024, 64, -1), b, r), Workload.fixed(i, o)
        ).workload_binding
        for b, r, i, o in BURSTS
    }
    assert bindings == set(SIM_REASON)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kv_limit_is_exact_to_the_token(strategy: str) -> None:
    """Requests sized from the resolved KV pool so that ``k`` of them fit with no token to spare: one
    token more per request and only ``k - 1`` would. Pins the planner's peak (input + output - 1) to the
    simulator's admission rule exactly, not just within rounding."""
    config = make_config(strategy, 1024, 64, -1)
    k, n_out = 5, 40
    tokens = pools_for_budget(config, 2.0, 3.0).kv_tokens
    n_in = tokens // k - (n_out - 1)  # peak KV per request = tokens // k
    p = plan(planner_inputs(config, 2.0, 3.0), Workload.fixed(n_in, n_out))
    assert p.workload_kv_limit == k and p.workload_binding == "full KV tokens"
    engine = Engine(config, pools_for_budget(config, 2.0, 3.0), n_in + n_out, EngineOptions(mode="timed"))
    metrics = engine.run(unique_requests([(n_in, n_out)] * (k + 1)))
    assert (metrics.peak_running, metrics.peak_running_bound_by) == (k, "kv_tokens")
