"""The engine loop over the real cache and pools: exact hits per strategy on hand-made traces, the state
stamp check, timed mode, admission limits, determinism, and hit rate never above the ideal."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from small_workloads import SMALL_SYNTHETIC

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.request import Req
from mamba_radix.sim.budget import PoolSizes, pools_for_budget
from mamba_radix.sim.engine import Engine, EngineOptions, StateMismatchError
from mamba_radix.sim.sweep import RunSpec, expand_definition, run_one
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import TraceRequest

STRATEGIES = ["no_buffer", "extra_buffer", "extra_buffer_lazy"]
# A small grid so that hand-made traces exercise every rule: prefill checkpoints every 4 tokens,
# decode checkpoints every 8.
SMALL = {"mamba_cache_chunk_size": 4, "mamba_track_interval": 8}


def pools(kv_tokens: int = 10_000, slots: int = 200) -> PoolSizes:
    return PoolSizes(kv_tokens, slots, 0, 1.0, 0.5, 27_648, 29_039_616, "test")


def run(reqs: list[TraceRequest], pool: PoolSizes | None = None, mode: str = "sequential", **cfg: Any) -> Any:
    config = CacheConfig(**(SMALL | cfg))
    options = EngineOptions(mode=mode, keep_per_request=True, check_invariants_every=1)  # type: ignore[arg-type]
    engine = Engine(config, pool or pools(), max(r.input_len + r.output_len for r in reqs), options)
    metrics = engine.run(reqs, total=len(reqs))
    return engine, metrics


def hits(reqs: list[TraceRequest], **cfg: Any) -> list[int]:
    _, metrics = run(reqs, **cfg)
    return [r["hit"] for r in metrics.per_request]


def req(i: int, inp: list[int], out: list[int], ts: float = 0.0) -> TraceRequest:
    return TraceRequest.from_tokens(i, ts, inp, out)


PROMPT = list(range(1, 11))  # 10 tokens
P, X, Y, Z = list(range(1, 13)), list(range(100, 106)), list(range(200, 206)), list(range(300, 306))


# --------------------------------------------------------------------------------------- exact hits
# (strategy, chunked_prefill_size) -> expected hits. Derivations in the comments of each test.
REPEAT = {
    # no chunking: one checkpoint at 10 (chunk end); input[:-1] = 9 tokens splits that node: 0 (#21158)
    ("no_buffer", -1): [0, 0],
    # chunks of 8: the copy at the first chunk end (8) survives the split
    ("no_buffer", 8): [0, 8],
    # extra_buffer tracks the last grid point of the chunk, floor(10 / 4) * 4 = 8, below the split
    ("extra_buffer", -1): [0, 8],
    ("extra_buffer", 8): [0, 8],
    ("extra_buffer_lazy", -1): [0, 8],
    ("extra_buffer_lazy", 8): [0, 8],
}


@pytest.mark.parametrize(("strategy", "chunk"), sorted(REPEAT))
def test_repeated_prompt_hits(strategy: str, chunk: int) -> None:
    reqs = [req(0, PROMPT, [901, 902, 903]), req(1, PROMPT, [911, 912, 913])]
    assert (
        hits(reqs, mamba_radix_cache_strategy=strategy, chunked_prefill_size=chunk) == REPEAT[strategy, chunk]
    )


BRANCH = {
    # P (12) + X / P + Y / P + Z. no_buffer has no branch checkpoint: only chunk ends (18, or 8 and 18)
    ("no_buffer", -1): [0, 0, 0],
    ("no_buffer", 8): [0, 8, 8],
    # extra_buffer: request 2 matches 12 tokens of KV without a state; its prefill tracks the branch
    # point 12 instead of the chunk's grid end, so request 3 hits 12
    ("extra_buffer", -1): [0, 0, 12],
    ("extra_buffer", 8): [0, 8, 12],
    ("extra_buffer_lazy", -1): [0, 0, 12],
    ("extra_buffer_lazy", 8): [0, 8, 12],
}


@pytest.mark.parametrize(("strategy", "chunk"), sorted(BRANCH))
def test_branch_hits(strategy: str, chunk: int) -> None:
    reqs = [req(0, P + X, [901, 902]), req(1, P + Y, [911, 912]), req(2, P + Z, [921, 922])]
    assert (
        hits(reqs, mamba_radix_cache_strategy=strategy, chunked_prefill_size=chunk) == BRANCH[strategy, chunk]
    )


@pytest.mark.parametrize(
    ("strategy", "interval", "expected"),
    [
        ("no_buffer", 8, [0, 14]),  # the live slot is donated at finish: input + 4 committed outputs
        ("extra_buffer", 8, [0, 8]),  # no decode boundary before 14; the tail past 8 is freed
        ("extra_buffer", 4, [0, 12]),  # a decode checkpoint at 12
        ("extra_buffer_lazy", 4, [0, 12]),
    ],
)
def test_multi_turn_hits(strategy: str, interval: int, expected: list[int]) -> None:
    out = [901, 902, 903, 904, 905]
    reqs = [req(0, PROMPT, out), req(1, PROMPT + out + [50, 51, 52], [911, 912])]
    got = hits(
        reqs, mamba_radix_cache_strategy=strategy, chunked_prefill_size=-1, mamba_track_interval=interval
    )
    assert got == expected


def test_metrics_of_a_hand_made_run() -> None:
    reqs = [req(0, P + X, [901, 902]), req(1, P + Y, [911, 912]), req(2, P + Z, [921, 922])]
    engine, metrics = run(reqs, mamba_radix_cache_strategy="extra_buffer", chunked_prefill_size=-1)
    s = metrics.summary()
    assert s["input_tokens"] == 54 and s["cached_tokens"] == 12 and s["ideal_hit_tokens"] == 24
    assert s["kv_only_matched_tokens"] == 12  # request 2 matched P's KV without a state
    assert s["recomputed_tokens"] == 12 and s["prefill_tokens"] == 42
    stats = engine.cache_stats()
    assert stats["checkpoints_inserted"] >= 3 and stats["state_copies"] == 1  # one copy-on-write
    assert stats["state_copy_bytes"] == 29_039_616
    assert s["peak_running"] == 1 and metrics.samples[-1].finished == 3


# ------------------------------------------------------------------------------------ state checks
def test_a_hit_that_skips_its_copy_is_caught() -> None:
    """The stamp check is real: a copy-on-write that copies nothing leaves a zero live slot."""
    config = CacheConfig(**SMALL, mamba_radix_cache_strategy="extra_buffer")
    engine = Engine(config, pools(), 40, EngineOptions(mode="sequential"))
    engine.mamba_pool.copy_slot = lambda src, dst: None  # type: ignore[method-assign]  # the copy-on-write's copy
    with pytest.raises(StateMismatchError, match="should hold 8 tokens"):
        engine.run([req(0, PROMPT, [1, 2]), req(1, PROMPT, [3, 4])])


def test_synthetic_runs_keep_states_and_invariants() -> None:
    reqs = GENERATORS["tree"](
        seed=5, num_trees=1, depth=2, fanout=2, root_len=100, segment_len=40, output_len=20
    )
    for strategy in STRATEGIES:
        engine, metrics = run(reqs, mamba_radix_cache_strategy=strategy, chunked_prefill_size=64)
        assert metrics.requests == len(reqs) and engine.kv_pool.used == engine.cache.full_evictable_size()


# ------------------------------------------------------------------------------------------ timed mode
def test_timed_mode_queues_by_kv_tokens_and_reports_ttft() -> None:
    reqs = [req(i, [1000 * i + j for j in range(40)], list(range(50)), ts=0.0) for i in range(4)]
    # 100 KV tokens: each request needs 40 + 49 = 89, so only one runs at a time
    _, metrics = run(reqs, pool=pools(kv_tokens=100), mode="timed", mamba_radix_cache_strategy="extra_buffer")
    s = metrics.summary()
    assert s["requests"] == 4 and s["peak_running"] == 1 and s["admission_bound_by"] == "kv_tokens"
    ttfts = sorted(metrics.ttft_s)
    assert ttfts[0] < ttfts[1] < ttfts[2] < ttfts[3]  # each waits for the previous one's decode
    assert max(x.kv_used_tokens for x in metrics.samples) <= 100


def test_timed_mode_runs_requests_concurrently_up_to_the_slot_limit() -> None:
    reqs = [req(i, [1000 * i + j for j in range(40)], list(range(30)), ts=0.0) for i in range(12)]
    config = CacheConfig(**SMALL, mamba_radix_cache_strategy="extra_buffer")  # 5 slots per request
    engine, metrics = run(reqs, pool=pools(slots=20), mode="timed", mamba_radix_cache_strategy="extra_buffer")
    assert engine.max_running == 20 // config.slots_per_request == 4
    assert metrics.summary()["peak_running"] == 4
    assert metrics.summary()["peak_running_bound_by"] == "state_slots"


def test_a_request_larger_than_the_kv_pool_is_rejected_not_hung() -> None:
    reqs = [req(0, list(range(200)), [1, 2]), req(1, list(range(500, 520)), [1, 2])]
    engine, metrics = run(reqs, pool=pools(kv_tokens=100), mode="timed")
    assert engine.rejected == 1 and metrics.requests == 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decode_jumps_equal_token_by_token_decode(strategy: str) -> None:
    """With room in the pools, jumping from event to event gives the same hits, checkpoints and
    simulated time as touching every decoding request at every step."""
    reqs = GENERATORS["chat"](
        seed=2, num_sessions=3, turns=3, system_prompt_len=50, user_len=20, output_len=40
    )
    config = CacheConfig(**SMALL, mamba_radix_cache_strategy=strategy, chunked_prefill_size=64)
    results = []
    for step_events in (False, True):
        options = EngineOptions(mode="timed", keep_per_request=True, decode_step_events=step_events)
        engine = Engine(config, pools(), 1000, options)
        metrics = engine.run(reqs)
        results.append(([r["hit"] for r in metrics.per_request], engine.cache_stats()["checkpoints_inserted"],
                        round(metrics.sim_time_s, 9), metrics.decode_segments))  # fmt: skip
    assert results[0][:3] == results[1][:3]
    assert results[1][3] > 2 * results[0][3]  # the step-by-step run really touched more often


# --------------------------------------------------------------------------------- budget and limits
def test_budget_translation_follows_the_ratio_rule() -> None:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    p = pools_for_budget(config, budget_gib=27.25, mamba_full_memory_ratio=0.5)
    assert p.bytes_per_kv_token == 24 * 576 * 2 and p.bytes_per_state_slot == 69 * (
        12 * 128 * 128 * 2 + 3 * 4608 * 2
    )
    total = int(27.25 * 2**30)
    assert p.state_slots == int(total * 0.5 / 1.5) // p.bytes_per_state_slot
    assert p.kv_tokens == (total - p.state_slots * p.bytes_per_state_slot) // p.bytes_per_kv_token
    assert p.max_running_requests == p.state_slots // 5
    assert pools_for_budget(config, max_mamba_cache_size=80).state_slots == 80
    with pytest.raises(ConfigError, match="ratio"):
        pools_for_budget(config, budget_gib=0.05)


# ------------------------------------------------------------------------------- determinism, ideal
def _summary_without_wall(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != "wall_s"}


def test_same_seed_same_results() -> None:
    reqs_a = GENERATORS["agent"](
        seed=4, num_agents=2, steps=4, context_len=600, observation_len=80, action_len=30
    )
    reqs_b = GENERATORS["agent"](
        seed=4, num_agents=2, steps=4, context_len=600, observation_len=80, action_len=30
    )
    spec = RunSpec(run_id="x", trace="synthetic", config=SMALL | {"mamba_radix_cache_strategy": "extra_buffer"},
                   options={"mode": "timed"}, budget_gib=2.0, max_mamba_cache_size=40)  # fmt: skip
    a, b = run_one(spec, requests=reqs_a), run_one(spec, requests=reqs_b)
    assert _summary_without_wall(a) == _summary_without_wall(b)
    assert a["metrics"]["cached_tokens"] > 0


@pytest.mark.parametrize("generator", sorted(GENERATORS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hits_never_exceed_the_ideal(generator: str, strategy: str) -> None:
    reqs = GENERATORS[generator](seed=7, **SMALL_SYNTHETIC[generator])
    # a tight pool so that eviction happens too
    _, metrics = run(reqs, pool=pools(kv_tokens=700, slots=30), mode="timed",
                     mamba_radix_cache_strategy=strategy, chunked_prefill_size=64)  # fmt: skip
    for row in metrics.per_request:
        assert row["hit"] <= row["ideal"] <= row["input_len"] - 1
    s = metrics.summary()
    assert s["token_hit_rate"] <= s["ideal_hit_rate"] and s["requests"] == len(reqs)


def test_infinite_pools_reach_at_least_the_finite_hits() -> None:
    reqs = GENERATORS["chat"](
        seed=1, num_sessions=3, turns=3, system_prompt_len=100, user_len=30, output_len=30
    )
    base = {"run_id": "r", "trace": "synthetic", "config": {"mamba_radix_cache_strategy": "no_buffer"},
            "options": {"mode": "sequential"}}  # fmt: skip
    tight = run_one(RunSpec(**base, budget_gib=0.2, max_mamba_cache_size=6), requests=reqs)
    inf = run_one(RunSpec(**base, infinite=True), requests=reqs)
    assert (
        tight["metrics"]["token_hit_rate"]
        <= inf["metrics"]["token_hit_rate"]
        <= inf["metrics"]["ideal_hit_rate"]
    )
    assert inf["cache_stats"]["states_evicted"] == 0 and inf["cache_stats"]["tokens_evicted"] == 0


def test_expand_definition_dedups_and_validates() -> None:
    definition = {
        "trace": "t.jsonl",
        "base": {"mode": "sequential"},
        "groups": [
            {"name": "a", "vary": {"mamba_radix_cache_strategy": ["no_buffer", "extra_buffer"]}},
            {
                "name": "b",
                "fixed": {"mamba_radix_cache_strategy": "extra_buffer"},
                "vary": {"budget_gib": [1.0]},
            },
        ],
    }
    specs = expand_definition(definition, base_dir="/tmp")
    assert [s.group for s in specs] == ["a", "a", "b"] and specs[2].budget_gib == 1.0
    with pytest.raises(ConfigError, match="unknown parameter"):
        expand_definition({"trace": "t", "groups": [{"vary": {"bogus": [1]}}]})
    with pytest.raises(ConfigError, match=r"mamba_radix_cache_strategy must be one of .*, got 'fast'"):
        expand_definition({"trace": "t", "groups": [{"vary": {"mamba_radix_cache_strategy": ["fast"]}}]})


# --------------------------------------------------------------------------------- admission probe
def _tree_state(cache: Any) -> tuple[Any, ...]:
    tree = cache.tree
    return (tree.clock, tree.num_nodes, asdict(cache.stats), tree.index.full_keys(), tree.index.mamba_keys(),
            cache.full_evictable_size(), cache.mamba_evictable_size())  # fmt: skip


@pytest.mark.parametrize(
    "key", [P + X[:-1], P + Y + [5], P[:7], P[:12], X, P + Z, []], ids=lambda k: f"{len(k)}tok"
)
def test_peek_prefix_changes_nothing_and_predicts_the_match(key: list[int]) -> None:
    engine, _ = run(
        [req(0, P + X, [901, 902]), req(1, P + Y, [911])], mamba_radix_cache_strategy="extra_buffer"
    )
    cache = engine.cache
    # a "running request" holds P + X: the shared prefix P is locked, Y's branch is not
    held = cache.match_prefix(P + X[:-1]).last_node
    cache.inc_lock_ref(held)
    before = _tree_state(cache)
    peek = cache.peek_prefix(key)
    assert _tree_state(cache) == before  # no tick, split, refresh, count or reordering
    match = cache.match_prefix(key)
    assert (peek.hit_len, peek.full_kv_hit_len, peek.last_node) == (
        match.device_indices.numel(),
        match.full_kv_hit_len,
        match.last_node,
    )
    # what locking the hit takes out of the evictable sizes is what the peek said
    full, states = cache.full_evictable_size(), cache.mamba_evictable_size()
    cache.inc_lock_ref(match.last_node)
    assert full - cache.full_evictable_size() == peek.unlocked_tokens
    assert states - cache.mamba_evictable_size() == int(peek.unlocked_checkpoint)
    cache.dec_lock_ref(match.last_node)


def test_admission_matches_once_per_admitted_request() -> None:
    """Refused admission attempts only peek: the cache counts one match per admitted request."""
    reqs = [req(i, [1000 * i + j for j in range(40)], list(range(50)), ts=0.0) for i in range(4)]
    engine, metrics = run(
        reqs, pool=pools(kv_tokens=100), mode="timed", mamba_radix_cache_strategy="extra_buffer"
    )
    assert metrics.blocked["kv_tokens"] >= 3  # requests really were refused and retried
    assert engine.cache.stats.matches == metrics.requests == 4


def test_a_sweep_uses_the_same_ideal_as_the_engine(tmp_path: Any) -> None:
    """run_one passes the memoised per-trace ideal; it equals what the engine computes on its own."""
    from mamba_radix.sim.sweep import trace_facts
    from mamba_radix.sim.traces import iter_trace, write_token_trace

    reqs = GENERATORS["chat"](
        seed=3, num_sessions=2, turns=3, system_prompt_len=60, user_len=20, output_len=10
    )
    path = tmp_path / "chat.jsonl"
    write_token_trace(reqs, path)
    spec = RunSpec(run_id="x", trace=str(path), config=SMALL | {"mamba_radix_cache_strategy": "extra_buffer"},
                   options={"mode": "sequential"}, budget_gib=2.0, max_mamba_cache_size=40)  # fmt: skip
    rec = run_one(spec)
    engine = Engine(CacheConfig(**spec.config), pools(), 1000, EngineOptions(mode="sequential"))
    alone = engine.run(iter_trace(path)).summary()
    assert rec["metrics"]["ideal_hit_tokens"] == alone["ideal_hit_tokens"] > 0
    assert trace_facts(str(path))[1] is trace_facts(str(path))[1]  # computed once per process


@pytest.mark.parametrize("short_of", ["kv_tokens", "state_slots", "too_long"])
def test_a_refused_admission_leaves_no_trace(short_of: str) -> None:
    """A request that does not fit is refused before anything changes: no tick, split, refresh, count,
    copy-on-write or eviction (an eviction for slots it could not use would cost later hits)."""
    config = CacheConfig(**SMALL, mamba_radix_cache_strategy="extra_buffer")
    engine = Engine(config, pools(kv_tokens=60), 200, EngineOptions(mode="sequential"))
    engine.run([req(0, P + X, [901, 902])])
    cache = engine.cache
    if short_of == "state_slots":
        # every checkpoint locked, and slots held elsewhere (as running requests hold theirs) so that
        # fewer are free than admission takes
        for node in list(cache.tree.nodes()):
            if node.mamba_slot is not None:
                cache.inc_lock_ref(node)
        taken = cache.buffer.admission_slots(Req(rid=None, origin_input_ids=[0]))
        engine.mamba_pool.alloc(engine.mamba_pool.available_size() - taken + 1)
        assert cache.mamba_evictable_size() == 0
        newcomer = req(1, P + Y, [911])
    elif short_of == "kv_tokens":  # the shared prefix hits, the rest does not fit in free + evictable KV
        engine.kv_pool.alloc(20)  # held elsewhere, as a running request holds its KV
        newcomer = req(1, P + list(range(500, 540)), [911])
    else:  # longer than the whole KV pool: it can never run
        newcomer = req(1, P + list(range(500, 560)), [911])
    before = _tree_state(cache), engine.mamba_pool.available_size(), engine.kv_pool.available_size()
    assert engine._try_admit(newcomer, 0.0) == short_of
    assert (_tree_state(cache), engine.mamba_pool.available_size(), engine.kv_pool.available_size()) == before


def test_verification_off_skips_the_stamps_and_changes_no_result() -> None:
    """Without verify_states no fingerprint is computed and no stamp written; every metric, per-request
    row and cache counter is the verified run's."""
    reqs = GENERATORS["tree"](
        seed=3, num_trees=2, depth=2, fanout=2, root_len=60, segment_len=30, output_len=20
    )
    outs = []
    for verify in (True, False):
        config = CacheConfig(**(SMALL | {"mamba_radix_cache_strategy": "extra_buffer"}))
        options = EngineOptions(
            mode="timed", keep_per_request=True, verify_states=verify, check_invariants_every=1
        )
        engine = Engine(config, pools(2_000, 40), max(r.input_len + r.output_len for r in reqs), options)
        metrics = engine.run(reqs, total=len(reqs))
        stamped = any(t.abs().sum() > 0 for t in engine.mamba_pool.tensors)
        outs.append((metrics.summary(), metrics.per_request, engine.cache_stats(), stamped))
    assert outs[0][:3] == outs[1][:3]
    assert outs[0][3] and not outs[1][3]  # the verified run stamped its slots, the other wrote nothing


# ------------------------------------------------------------------------------- quantized checkpoints
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_quantized_checkpoints_hit_as_model_ones_and_count_no_tree_slot(fmt: str, strategy: str) -> None:
    """Under int8 / fp8 e4m3 the hits equal the model format's, every restored live state passes the
    round-trip check, and the pool view counts state slots without subtracting checkpoints (which live
    in the checkpoint pool): 0 in use once every request finished, while the tree holds checkpoints."""
    trace = [req(0, P + X, [1, 2]), req(1, P + X, [3, 4]), req(2, P + Y, [5])]
    cfg = {"mamba_radix_cache_strategy": strategy, "chunked_prefill_size": 8}  # no_buffer: chunk-end copies
    want = hits(trace, **cfg)
    engine, metrics = run(trace, **cfg, checkpoint_format=fmt)
    assert [r["hit"] for r in metrics.per_request] == want and any(want)
    ckpt_pool = engine.cache.checkpoint_pool
    assert ckpt_pool is not None and ckpt_pool.used > 0 and ckpt_pool.loads > 0
    assert engine.mamba_pool.used == 0 and engine._pool_view().mamba_slots == 0
    assert metrics.samples[-1].slots_tree == 0 and metrics.samples[-1].slots_used == 0


def test_a_quantized_restore_of_the_wrong_state_is_caught() -> None:
    """The round-trip check is real: a restore that leaves the live slot as admission found it fails."""
    engine = Engine(
        CacheConfig(**SMALL, checkpoint_format="int8"), pools(), 40, EngineOptions(mode="sequential")
    )
    assert engine.cache.checkpoint_pool is not None
    engine.cache.checkpoint_pool.load_into = lambda *a, **k: None  # type: ignore[method-assign]
    with pytest.raises(StateMismatchError, match="should hold 8 tokens"):
        engine.run([req(0, PROMPT, [1, 2]), req(1, PROMPT, [3, 4])])


def test_the_budgets_checkpoint_slots_size_the_checkpoint_pool() -> None:
    sized = PoolSizes(10_000, 200, 0, 1.0, 0.5, 27_648, 29_039_616, "test", checkpoint_slots=7)
    engine = Engine(CacheConfig(**SMALL, checkpoint_format="fp8_e4m3"), sized, 40, EngineOptions())
    assert engine.cache.checkpoint_pool is not None and engine.cache.checkpoint_pool.size == 7
    own = Engine(
        CacheConfig(**SMALL, checkpoint_format="fp8_e4m3", checkpoint_slots=3), sized, 40, EngineOptions()
    )
    assert own.cache.checkpoint_pool is not None and own.cache.checkpoint_pool.size == 3  # the config's wins
