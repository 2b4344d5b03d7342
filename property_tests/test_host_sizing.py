"""The host tier's sizing (issue 25): the workload's prefix tree (KV tokens and resumable points), the
planner's split of host bytes against SGLang's ratio split, exact bytes accounting, the simulator's
``host_split`` option, ``plan --host-memory-gb``, the HiCache preset and SGLang's HiCache launch settings.

The coverage is checked against a brute-force trie on Hypothesis-drawn token sequences; a block trace
against the same requests expanded to tokens. The simulator runs the real cache and host pools on the
seeded synthetic chat workload.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix.capacity.host import (
    HOST_SPLITS,
    hicache_size_split,
    length_coverage,
    planned_split,
    ratio_split,
    workload_coverage,
)
from mamba_radix.cli import main
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.launch_config import settings_to_argv
from mamba_radix.peers import PEERS, SGLANG_HICACHE_RATIO, apply_peer, peer_engine_options
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.synthetic import GENERATORS
from mamba_radix.sim.traces import TraceRequest


# ------------------------------------------------------------------------------------------- coverage
def _brute(seqs: list[list[int]]) -> tuple[int, int, int, int]:
    """(KV tokens, sequence ends, branch points, resumable points) of a dict trie over ``seqs``."""
    root: dict[int, Any] = {}
    ends: set[tuple[int, ...]] = set()
    for seq in seqs:
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})
        if seq:
            ends.add(tuple(seq))
    nodes = branch = 0
    branches: set[tuple[int, ...]] = set()
    stack: list[tuple[dict[int, Any], tuple[int, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if path:
            nodes += 1
            if len(node) >= 2:
                branch += 1
                branches.add(path)
        stack.extend((child, (*path, tok)) for tok, child in node.items())
    return nodes, len(ends), branch, len(ends | branches)


def _token_requests(pairs: list[tuple[list[int], list[int]]]) -> list[TraceRequest]:
    return [TraceRequest.from_tokens(i, 0.0, inp, out) for i, (inp, out) in enumerate(pairs)]


_seq = st.lists(st.integers(0, 3), min_size=1, max_size=7)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_seq, st.lists(st.integers(0, 3), min_size=1, max_size=3)), min_size=1, max_size=12)
)
def test_coverage_is_the_tries(pairs: list[tuple[list[int], list[int]]]) -> None:
    """Token requests: KV tokens, sequence ends and branch points are a brute-force trie's over each
    request's input + output[:-1] (what the engine inserts), duplicates and prefixes included."""
    cov = workload_coverage(_token_requests(pairs))
    tokens, ends, branch, points = _brute([inp + out[:-1] for inp, out in pairs])
    assert (cov.kv_tokens, cov.sequence_ends, cov.branch_points, cov.resumable_points) == (
        tokens,
        ends,
        branch,
        points,
    )
    assert cov.requests == len(pairs)
    assert cov.tokens_per_point == tokens / points


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(0, 3), st.integers(1, 4)),
        min_size=1,
        max_size=10,
    )
)
def test_a_block_trace_covers_what_its_tokens_cover(rows: list[tuple[list[int], int, int]]) -> None:
    """Block requests (full blocks, a partial last block of a block id no other request uses, outputs
    unique per request) give the coverage of the same requests expanded to tokens."""
    size = 4
    reqs, tokens = [], []
    for i, (blocks, partial, out_len) in enumerate(rows):
        ids = list(blocks) + ([100 + i] if partial else [])
        req = TraceRequest(i, 0.0, len(blocks) * size + partial, out_len, block_ids=ids, block_size=size)
        reqs.append(req)
        tokens.append(TraceRequest.from_tokens(i, 0.0, req.input_ids, req.output_ids))
    assert workload_coverage(reqs) == workload_coverage(tokens)


def test_chat_coverage_and_refusals() -> None:
    """Multi-turn chat: every turn's end is a resumable point (the next turn resumes there) and the shared
    system prompt is one branch point."""
    chat = GENERATORS["chat"](seed=0)
    cov = workload_coverage(chat)
    assert cov.sequence_ends == len(chat) and cov.branch_points == 1
    assert cov.resumable_points == len(chat) + 1
    with_chunks = workload_coverage(chat, 8192)
    assert with_chunks.chunk_points == len(chat)  # every input fits one chunk: its end, besides the finish
    # resumable copies every resumable point and others into free memory: between the two, geometrically
    assert with_chunks.tokens_per_copy("resumable") == pytest.approx(
        (with_chunks.tokens_per_point * with_chunks.tokens_per_checkpoint) ** 0.5
    )
    assert (
        with_chunks.tokens_per_checkpoint
        < with_chunks.tokens_per_copy("resumable")
        < with_chunks.tokens_per_point
    )
    assert with_chunks.tokens_per_copy("write_back") == cov.kv_tokens / (cov.resumable_points + len(chat))
    with pytest.raises(InvalidArgument, match="no request"):
        workload_coverage([])
    assert length_coverage(10, 100.0, 20.0).tokens_per_point == 119


def test_prefill_chunks_count_from_the_uncached_input() -> None:
    """Chunk checkpoints: one per prefill chunk of the input beyond what an earlier request cached, the
    input's end not counted twice when it is the sequence's end (one output token)."""
    first = list(range(10))
    reqs = _token_requests([(first, [50, 51, 52]), ([*first, 50, 51, 60, 61, 62, 63, 64], [70])])
    # request 0: 10 new tokens in chunks of 4 -> 3; request 1: 12 cached, 5 new -> 2, less its end -> 1
    assert workload_coverage(reqs, 4).chunk_points == 4
    assert workload_coverage(reqs, -1).chunk_points == 1 + 0  # no chunking: one chunk each
    assert workload_coverage(reqs).chunk_points == 0


# ---------------------------------------------------------------------------------------------- splits
@settings(max_examples=300, deadline=None)
@given(
    host=st.integers(1, 10**12),
    bkv=st.integers(1, 200_000),
    bslot=st.integers(1, 50_000_000),
    t=st.floats(1.0, 1e6),
    page=st.sampled_from([1, 16, 64]),
)
def test_planned_bytes_are_exact_and_the_split_is_the_rule(
    host: int, bkv: int, bslot: int, t: float, page: int
) -> None:
    """total_bytes is slots x slot bytes + tokens x token bytes, never above the host bytes and below them
    by under one KV page; the slots are the real optimum host / (t x bkv + bslot) rounded, unless clamped."""
    if host < page * bkv + bslot:
        with pytest.raises(InvalidArgument, match="does not fit one KV page"):
            planned_split(host, bkv, bslot, t, page)
        return
    s = planned_split(host, bkv, bslot, t, page)
    assert s.total_bytes == s.kv_tokens * bkv + s.state_slots * bslot == s.kv_bytes + s.state_bytes
    assert 0 <= host - s.total_bytes < page * bkv
    assert s.kv_tokens % page == 0 and s.kv_tokens >= page and s.state_slots >= 1
    optimum = host / (t * bkv + bslot)
    top = (host - page * bkv) // bslot
    assert s.state_slots == min(max(math.floor(optimum + 0.5), 1), top)


def test_the_ratio_split_is_sglangs_proportion_and_refusals() -> None:
    r = ratio_split(20_980, 17, 4.0, 1, 1_000, 2_000_000)
    assert (r.kv_tokens, r.state_slots, r.rule) == (83_920, 68, "ratio")
    assert ratio_split(1000, 10, 0.001, 64, 1, 1).kv_tokens == 64  # at least one page and one slot
    # --hicache-size: the bytes split as the device pools' bytes, the same proportion as a ratio
    h = hicache_size_split(
        4 * (20_980 * 1_000 + 17 * 2_000_000), 20_980 * 1_000, 17 * 2_000_000, 1, 1_000, 2_000_000
    )
    assert (h.kv_tokens, h.state_slots) == (r.kv_tokens, r.state_slots)
    with pytest.raises(InvalidArgument, match="at least one KV page and one state slot"):
        hicache_size_split(10, 1_000, 1_000, 1, 1_000, 2_000_000)
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(InvalidArgument, match="host ratio"):
            ratio_split(10, 1, bad, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="tokens_per_point"):
        planned_split(10**9, 1, 1, 0.0)
    with pytest.raises(InvalidArgument, match="host_bytes"):
        planned_split(0, 1, 1, 1.0)


def test_issue_39436_under_the_rule() -> None:
    """SGLang #39436's host pools (2.68M host KV tokens, 565 slots: 0/8 host hits) hold the bytes of a
    split with one slot per ~3,650 tokens (734 slots: 8/8) at that KV per slot: the rule gives the slots
    the workload's points need, not the device's proportion."""
    kv_bytes, slot_bytes = 1_000, 3_650_000  # a state slot = 3,650 KV tokens' bytes (as in the issue's 734)
    host = 2_680_000 * kv_bytes + 565 * slot_bytes
    s = planned_split(host, kv_bytes, slot_bytes, 3_650.0)
    assert s.state_slots > 565 and abs(s.kv_tokens / s.state_slots - 3_650) < 10


# ------------------------------------------------------------------------------------------ simulator
def _pools() -> PoolSizes:
    return PoolSizes(
        kv_tokens=20_000,
        state_slots=17,
        max_running_requests=3,
        budget_gib=1.0,
        mamba_full_memory_ratio=0.9,
        bytes_per_kv_token=13_824,
        bytes_per_state_slot=29_000_000,
        model="kimi-k3",
    )


def _engine(options: EngineOptions, workload: list[TraceRequest] | None = None) -> Engine:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    return Engine(config, _pools(), 6_000, options, workload=workload)


def test_planned_split_in_the_engine_same_bytes_either_way() -> None:
    """host_split planned: the host bytes of the ratio split, split by the rule on the run's workload,
    whether the workload is given to the engine or read by run(); the run's metrics record the sizes."""
    chat = GENERATORS["chat"](seed=0)[:40]
    ratio = _engine(EngineOptions(mode="sequential", host_memory_ratio=4))
    given_ = _engine(EngineOptions(mode="sequential", host_memory_ratio=4, host_split="planned"), chat)
    later = _engine(EngineOptions(mode="sequential", host_memory_ratio=4, host_split="planned"))
    bkv, bslot = _pools().bytes_per_kv_token, _pools().bytes_per_state_slot

    def host_bytes(e: Engine) -> int:
        return e.config.host_kv_tokens * bkv + e.config.host_state_slots * bslot

    assert (ratio.config.host_kv_tokens, ratio.config.host_state_slots) == (80_000, 68)
    assert 0 <= host_bytes(ratio) - host_bytes(given_) < bkv
    # write_through copies every checkpoint: one host slot per KV tokens a checkpoint covers, prefill
    # chunks' included (extra_buffer, chunked_prefill_size 8192)
    per_copy = workload_coverage(chat, 8192).tokens_per_checkpoint
    expected = planned_split(host_bytes(ratio), bkv, bslot, per_copy)
    assert (given_.config.host_kv_tokens, given_.config.host_state_slots) == (
        expected.kv_tokens,
        expected.state_slots,
    )
    assert later.config == ratio.config  # not planned until run() reads the workload
    m_later, m_given = later.run(iter(chat)).summary(), given_.run(chat).summary()
    assert later.config == given_.config
    assert m_later["host_tier"]["host_state_slots"] == expected.state_slots
    assert m_later["token_hit_rate"] == m_given["token_hit_rate"]
    later.cache.check_invariants()


def test_host_split_refusals() -> None:
    with pytest.raises(ConfigError, match="host_split must be one of ratio, planned"):
        EngineOptions(host_split="even")
    with pytest.raises(ConfigError, match="host_split='planned' splits the host tier's bytes"):
        _engine(EngineOptions(host_split="planned"))
    assert HOST_SPLITS == ("ratio", "planned")
    from mamba_radix import flags

    assert flags._HOST_SPLIT_NAMES == HOST_SPLITS


# ------------------------------------------------------------------------------------ plan and presets
def test_plan_host_memory_gb(capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).parent.parent / "mamba_radix/data/traces/mooncake_synthetic_trace.jsonl"
    argv = ["plan", "--memory-budget-gb", "27.25", "--trace", str(trace), "--host-memory-gb", "100"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "host tier (100.00 GB" in out and "planned" in out and "sglang --hicache-size" in out
    assert main([*argv, "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["host_tier"]
    planned, every, sglang = h["planned_resumable"], h["planned_every_checkpoint"], h["sglang_hicache_size"]
    assert every["state_slots"] > planned["state_slots"]  # chunk checkpoints cost slots too
    for split in (planned, every, sglang):
        assert split["total_bytes"] <= 100 * (1 << 30)
        assert split["total_bytes"] == (
            split["kv_tokens"] * split["bytes_per_kv_token"]
            + split["state_slots"] * split["bytes_per_state_slot"]
        )
    assert (
        abs(planned["tokens_per_slot"] - h["coverage"]["tokens_per_resumable_copy"])
        / h["coverage"]["tokens_per_resumable_copy"]
        < 0.01
    )
    assert main(["plan", "--memory-budget-gb", "27.25", "--host-memory-gb", "100"]) == 2
    assert "splits host memory for a workload" in capsys.readouterr().err
    assert (
        main(
            [
                "plan",
                "--memory-budget-gb",
                "27.25",
                "--input-len",
                "100",
                "--output-len",
                "10",
                "--host-memory-gb",
                "0.001",
            ]
        )
        == 2
    )
    assert "does not fit one KV page" in capsys.readouterr().err


def test_the_hicache_preset() -> None:
    peer = PEERS["sglang-0.5.23-hicache"]
    config = apply_peer(CacheConfig(host_write_policy="write_back"), peer.name)
    assert config.host_write_policy == "write_through" and config.host_write_through_threshold == 2
    assert config.mamba_slot_headroom == "exact" and config.mamba_kv_only_leaves
    assert "Not equivalent" in peer.description
    assert peer_engine_options(peer.name, {}, config) == {"host_memory_ratio": SGLANG_HICACHE_RATIO}
    assert peer_engine_options(peer.name, {"host_memory_ratio": 4}, config) == {"host_memory_ratio": 4}
    sized = config.replace(host_kv_tokens=64, host_state_slots=2)
    assert peer_engine_options(peer.name, {}, sized) == {}  # explicit host pools: no ratio on top
    assert peer_engine_options("sglang", {"mode": "timed"}, config) == {"mode": "timed"}
    assert peer_engine_options(None, {}, config) == {}


@pytest.mark.parametrize(
    ("settings", "command", "argv"),
    [
        ({"enable_hierarchical_cache": True}, "simulate", ["--host-memory-ratio", "2.0"]),
        (
            {"enable_hierarchical_cache": True, "hicache_ratio": 4, "hicache_write_policy": "write_back"},
            "simulate",
            ["--host-memory-ratio", "4", "--host-write-policy", "write_back"],
        ),
        ({"hicache_ratio": 4, "hicache_write_policy": "write_back"}, "simulate", []),  # no switch: no tier
        ({"enable_hierarchical_cache": False, "hicache_ratio": 4}, "sweep", []),
        ({"enable_hierarchical_cache": True, "hicache_size": 100}, "plan", None),
    ],
)
def test_sglangs_hicache_settings(settings: dict[str, Any], command: str, argv: list[str] | None) -> None:
    got, ignored = settings_to_argv(settings, command)
    if argv is not None:
        assert got == argv
    else:
        assert got[:2] == ["--enable-hierarchical-cache", "true"] and got[2] == "--host-memory-gb"
        assert math.isclose(float(got[3]), 100e9 / (1 << 30))
    if not settings.get("enable_hierarchical_cache"):
        reasons = [x for x in ignored if x != "enable_hierarchical_cache"]
        assert reasons and all("no enable_hierarchical_cache" in x for x in reasons)
        assert len(ignored) == len(settings)  # every key listed once


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"enable_hierarchical_cache": True, "hicache_size": 100}, "give hicache_ratio"),
        ({"enable_hierarchical_cache": True, "hicache_storage_backend": "file"}, "not modelled"),
        (
            {"enable_hierarchical_cache": True, "hicache_write_policy": "write_sometimes"},
            "--host-write-policy",
        ),
        ({"enable_hierarchical_cache": "yes"}, "true or false"),
    ],
)
def test_what_we_cannot_map_is_one_line(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        settings_to_argv(settings, "simulate")
    assert "\n" not in str(err.value)
