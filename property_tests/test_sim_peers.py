"""Peers through the simulator: a peer preset changes only the policy of a run (checkpoint admission,
eviction order, refresh), is recorded in the results, and is accepted by experiment definitions (with
the same conflict rule as the command line); synthetic workloads in definitions."""

from __future__ import annotations

from typing import Any

import pytest

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.peers import apply_peer
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.sweep import RunSpec, expand_definition, peer_config, run_one
from mamba_radix.sim.synthetic import branching_tree
from mamba_radix.sim.traces import TraceRequest

# Prefill chunks of 64 tokens on a checkpoint grid of 16: a 300-token prompt is 5 chunks (64 x 4 + 44).
MULTI_CHUNK = {"chunked_prefill_size": 64, "mamba_cache_chunk_size": 16, "mamba_track_interval": 256}


def prompt_run(peer: str | None, reqs: list[TraceRequest], **config: Any) -> dict[str, Any]:
    spec = RunSpec(
        run_id=peer or "none",
        trace="in-memory",
        config=MULTI_CHUNK | {"mamba_radix_cache_strategy": "extra_buffer"} | config,
        options={"mode": "sequential", "check_invariants_every": 1},
        budget_gib=4.0,
        peer=peer,
    )
    return run_one(spec, requests=reqs)


def test_marconi_static_takes_fewer_prefill_checkpoints_than_sglang_on_a_multi_chunk_prompt() -> None:
    """One 300-token prompt, 3 output tokens (no decode boundary): sglang checkpoints every chunk, at
    64, 128, 192, 256 and 288 (the last chunk's last grid point); marconi-static (branch-and-end admission,
    no branch point here) only the input's end, 288. The run goes through the engine's prefill path, which
    must pass input_len (branch_and_end refuses without it)."""
    reqs = [TraceRequest.from_tokens(0, 0.0, list(range(1, 301)), [901, 902, 903])]
    sglang, marconi, default = (prompt_run(p, reqs) for p in ("sglang", "marconi-static", None))
    assert sglang["cache_stats"]["checkpoints_inserted"] == 5
    assert marconi["cache_stats"]["checkpoints_inserted"] == 1
    assert sglang["metrics"]["prefill_chunks"] == marconi["metrics"]["prefill_chunks"] == 5
    # the preset is recorded, with the fields it set
    assert marconi["params"]["peer"] == "marconi-static" and default["params"]["peer"] is None
    assert marconi["params"]["mamba_checkpoint_admission"] == "branch_and_end"
    assert marconi["params"]["mamba_eviction_order"] == "flop_weighted"
    # sglang is our defaults: the same run as no peer
    assert sglang["cache_stats"] == default["cache_stats"] and sglang["metrics"] == default["metrics"]


def test_marconi_static_keeps_the_branch_point_and_the_end_and_hits_them() -> None:
    """Three prompts share 176 tokens (on the grid, inside the third 64-token chunk) and then diverge.
    sglang: request 0 checkpoints every chunk (64, 128, 192, 256, 288), so request 1 hits 128 and its
    chunk [128, 192) checkpoints the branch point 176, which request 2 hits: 128 + 176 cached tokens.
    marconi-static: request 0 keeps only its end (288, past the split), so request 1 hits nothing, but its
    chunk holding the branch point checkpoints 176, which request 2 hits: 176, with fewer checkpoints."""
    shared = list(range(1, 177))
    reqs = [
        TraceRequest.from_tokens(i, 0.0, [*shared, *range(1000 * (i + 1), 1000 * (i + 1) + 124)], [7])
        for i in range(3)
    ]
    sg, mc = (prompt_run(p, reqs) for p in ("sglang", "marconi-static"))
    assert sg["metrics"]["cached_tokens"] == 128 + 176
    assert mc["metrics"]["cached_tokens"] == 176
    assert mc["cache_stats"]["checkpoints_inserted"] < sg["cache_stats"]["checkpoints_inserted"]


def test_peer_config_refuses_a_flag_the_peer_would_change() -> None:
    with pytest.raises(
        ConfigError, match=r"^mamba_eviction_order conflicts with peer='marconi-static'; drop one$"
    ):
        peer_config({"mamba_eviction_order": "leaf_first"}, "marconi-static")
    with pytest.raises(
        ConfigError, match=r"^mamba_eviction_order, mamba_lru_refresh conflict with peer='marconi-static'"
    ):
        peer_config({"mamba_eviction_order": "mixed", "mamba_lru_refresh": "path"}, "marconi-static")
    # the value the peer sets anyway, or a field it does not set, is fine
    same = peer_config(
        {"mamba_eviction_order": "flop_weighted", "mamba_track_interval": 128}, "marconi-static"
    )
    assert same == apply_peer(CacheConfig(mamba_track_interval=128), "marconi-static")
    # marconi-static changes the strategy only when no_buffer is in force: asking for no_buffer conflicts
    with pytest.raises(
        ConfigError, match=r"^mamba_radix_cache_strategy conflicts with peer='marconi-static'"
    ):
        peer_config({"mamba_radix_cache_strategy": "no_buffer"}, "marconi-static")
    assert peer_config({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, "marconi-static").is_lazy
    with pytest.raises(ConfigError, match=r"^peer must be one of sglang, .* \(or None\), got 'vllm'$"):
        peer_config({}, "vllm")
    # the preset's former name is refused, never taken for either Marconi (the message names the new one)
    with pytest.raises(ConfigError, match="marconi-static"):
        peer_config({}, "marconi")


def test_vllm_align_runs_in_the_simulator_on_its_block_grid() -> None:
    """vllm-align sets 16-token pages (the grid here): the simulator runs it on a paged KV pool, every
    checkpoint lands on a block boundary, and a resent prompt hits whole blocks only."""
    grid = {"chunked_prefill_size": 64, "mamba_cache_chunk_size": 16}
    config = RunSpec(run_id="v", trace="t", peer="vllm-align", config=grid).cache_config()
    assert config.page_size == config.mamba_cache_chunk_size == config.mamba_track_interval == 16
    prompt = list(range(1, 301))
    reqs = [
        TraceRequest.from_tokens(0, 0.0, prompt, list(range(901, 941))),
        TraceRequest.from_tokens(1, 0.0, prompt, [7]),
    ]
    options = EngineOptions(mode="sequential", keep_per_request=True, check_invariants_every=1)
    sizes = PoolSizes(10_000, 200, 0, 1.0, 0.5, 27_648, 29_039_616, "test")
    engine = Engine(config, sizes, 400, options)
    hits = [row["hit"] for row in engine.run(reqs).per_request]
    # the repeat matches input[:-1] = 299 tokens, cut to whole blocks: 288 (18 blocks of 16)
    assert hits == [0, 288]
    depths = [n.depth for n in engine.cache.tree.nodes() if n.mamba_slot is not None]
    assert depths and all(d % 16 == 0 for d in depths)


def definition(**group: Any) -> dict[str, Any]:
    return {"trace": "t.jsonl", "base": {"mode": "sequential"}, "groups": [{"name": "g", **group}]}


def test_definitions_take_peer_as_a_parameter() -> None:
    specs = expand_definition(
        definition(fixed={"mamba_track_interval": 128}, vary={"peer": ["sglang", "marconi-static", None]}),
        base_dir="/tmp",
    )
    assert [s.peer for s in specs] == ["sglang", "marconi-static", None]
    params = [s.params() for s in specs]
    assert [p["peer"] for p in params] == ["sglang", "marconi-static", None]
    assert [p["mamba_eviction_order"] for p in params] == ["leaf_first", "flop_weighted", "leaf_first"]
    assert [p["mamba_checkpoint_admission"] for p in params] == ["all", "branch_and_end", "all"]
    assert {p["mamba_track_interval"] for p in params} == {128}  # the caller's field stays
    with pytest.raises(
        ConfigError, match="group 'g': mamba_eviction_order conflicts with peer='marconi-static'"
    ):
        expand_definition(definition(fixed={"mamba_eviction_order": "mixed", "peer": "marconi-static"}))
    with pytest.raises(ConfigError, match="peer must be one of"):
        expand_definition(definition(vary={"peer": ["sglang", "bogus"]}))
    with pytest.raises(ConfigError, match="marconi-static"):
        expand_definition(definition(fixed={"peer": "marconi"}))
    (aligned,) = expand_definition(definition(fixed={"peer": "vllm-align"}))  # pages simulate too
    assert aligned.cache_config().page_size == aligned.cache_config().mamba_checkpoint_grid


def test_a_definition_group_can_replay_a_synthetic_workload() -> None:
    synthetic = {"generator": "tree", "seed": 1, "args": {"num_trees": 1, "depth": 1, "root_len": 300}}
    specs = expand_definition(
        definition(
            synthetic=synthetic, fixed={"budget_gib": 4.0, **MULTI_CHUNK}, vary={"peer": ["marconi-static"]}
        )
        | {"limit": 2}
    )
    (spec,) = specs
    assert spec.trace == "synthetic:tree:seed=1" and spec.limit is None and spec.synthetic == synthetic
    rec = run_one(spec)
    expected = branching_tree(seed=1, num_trees=1, depth=1, root_len=300)
    assert rec["metrics"]["requests"] == len(expected) == 4
    assert rec["params"]["trace"] == "synthetic:tree:seed=1" and rec["params"]["peer"] == "marconi-static"
    # the same workload run directly through an engine gives the same hits
    config = apply_peer(CacheConfig(**MULTI_CHUNK), "marconi-static")
    engine = Engine(config, _pools_of(rec), 10_000, EngineOptions(mode="sequential"))
    assert engine.run(expected).summary()["cached_tokens"] == rec["metrics"]["cached_tokens"]
    with pytest.raises(ConfigError, match="group 'g': synthetic workload"):
        expand_definition(definition(synthetic={"generator": "forest"}))


def _pools_of(rec: dict[str, Any]) -> Any:
    from mamba_radix.sim.budget import PoolSizes

    p = rec["pools"]
    return PoolSizes(
        p["kv_tokens"], p["state_slots"], p["max_running_requests"], p["budget_gib"],
        p["mamba_full_memory_ratio"], p["bytes_per_kv_token"], p["bytes_per_state_slot"], p["model"],
    )  # fmt: skip
