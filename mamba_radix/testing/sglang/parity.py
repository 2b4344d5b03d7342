"""The same requests through our simulator and through SGLang's real cache: a per-request comparison.

:func:`compare` runs :class:`mamba_radix.sim.engine.Engine` in sequential mode (one request at a time,
as the SGLang replay) with the given :class:`~mamba_radix.config.CacheConfig` and pool sizes, replays
the same requests through SGLang ``version`` (:func:`.replay.replay`), and reports how many requests got
the same cached-token count, the first that did not (both values), and each side's totals.

Use::

    traces = list(iter_block_trace(path, limit=300))
    res = compare(traces, CacheConfig(mamba_radix_cache_strategy="extra_buffer"), kv_tokens=8_000_000,
                  state_slots=1024, version="0.5.20")
    res.identical, res.total, res.first_diff
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.testing.sglang.loader import load_sglang
from mamba_radix.testing.sglang.replay import (
    INFINITE,
    ReplayConfig,
    ReplayResult,
    replay,
    requests_from_trace,
)

__all__ = ["Diff", "ParityResult", "compare", "preset_for", "replay_config_for", "run_ours"]


@dataclass(frozen=True)
class Diff:
    """The first request whose hit differs: its index, input length, and both sides' hit and KV match."""

    index: int
    input_len: int
    ours_hit: int
    sglang_hit: int
    ours_kv_match: int
    sglang_kv_match: int


@dataclass
class ParityResult:
    version: str
    strategy: str
    page_size: int
    kv_tokens: int | None  # None = infinite
    state_slots: int | None
    total: int
    identical: int
    kv_identical: int  # requests whose KV-match length also agrees
    ours_hit_rate: float
    sglang_hit_rate: float
    ours_kv_match_rate: float
    sglang_kv_match_rate: float
    sglang_mamba_evicted: int  # SGLang's own count (EvictResult), states freed by KV eviction excluded
    sglang_states_evicted: int  # every state the tree gave up by eviction (comparable with ours)
    sglang_kv_evicted: int
    ours_stats: dict[str, Any] = field(default_factory=dict)
    first_diff: Diff | None = None
    peer: str | None = None  # the preset our side ran with, when one was applied

    @property
    def all_identical(self) -> bool:
        return self.identical == self.total

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["all_identical"] = self.all_identical
        return out


def preset_for(version: str) -> str | None:
    """Our preset that models SGLang ``version`` (``sglang-<version>``), or None when there is none."""
    from mamba_radix.peers import PEERS

    name = f"sglang-{version}"
    return name if name in PEERS else None


def replay_config_for(config: CacheConfig, kv_tokens: int | None, state_slots: int | None) -> ReplayConfig:
    """The SGLang replay settings that match our ``config`` (``None`` pools are infinite)."""
    if config.strategy not in ("no_buffer", "extra_buffer"):
        raise ConfigError(f"the SGLang replay runs no_buffer and extra_buffer, not {config.strategy}")
    return ReplayConfig(
        strategy=config.strategy,  # type: ignore[arg-type]
        kv_tokens=INFINITE if kv_tokens is None else kv_tokens,
        state_slots=INFINITE if state_slots is None else state_slots,
        page_size=config.page_size,
        chunked_prefill_size=config.chunked_prefill_size,
        track_interval=config.mamba_track_interval,
        chunk_size=max(config.mamba_cache_chunk_size, config.page_size),
        overlap=config.overlap,
    )


def run_ours(
    traces: Sequence[Any], config: CacheConfig, kv_tokens: int | None, state_slots: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Our simulator, sequential, one row per request (``index``, ``hit``, ``kv_hit``) plus its cache
    stats. ``None`` pools are sized so the trace cannot fill them."""
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions
    from mamba_radix.sim.sweep import infinite_pools

    inputs = sum(t.input_len for t in traces)
    outputs = sum(t.output_len for t in traces)
    inf = infinite_pools(config, inputs, outputs, len(traces), "kimi-k3")
    kv = inf.kv_tokens if kv_tokens is None else kv_tokens
    slots = inf.state_slots if state_slots is None else state_slots
    pools = exact_pools(config, kv, slots, "kimi-k3")
    max_len = max(t.input_len + t.output_len for t in traces)
    engine = Engine(
        config,
        pools,
        max_len,
        EngineOptions(mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=4),
    )
    metrics = engine.run(traces, total=len(traces))
    return list(metrics.per_request), engine.cache_stats()


def compare(
    traces: Sequence[Any],
    config: CacheConfig,
    kv_tokens: int | None,
    state_slots: int | None,
    version: str = "0.5.20",
    peer: str | None = None,
    on_request: Callable[[int], None] | None = None,
) -> ParityResult:
    """Replay ``traces`` (:class:`~mamba_radix.sim.traces.TraceRequest`, in order) through our simulator
    with ``config`` and through SGLang ``version``; compare per request. ``peer`` names a preset of
    :mod:`mamba_radix.peers` applied to ``config`` for our side (``"auto"``: ``sglang-<version>`` when
    that preset exists, else none). ``on_request`` ticks once per SGLang request.

    Raises what the loader raises when SGLang cannot be fetched; ``ReplayError`` when a request does not
    fit. Cost: both replays, dominated by the caches' work.
    """
    traces = list(traces)
    peer = preset_for(version) if peer == "auto" else peer
    if peer is not None:
        from mamba_radix.peers import apply_peer

        config = apply_peer(config, peer)
    ours, stats = run_ours(traces, config, kv_tokens, state_slots)
    sg = load_sglang(version)
    theirs: ReplayResult = replay(
        sg, requests_from_trace(traces), replay_config_for(config, kv_tokens, state_slots), on_request
    )
    by_index = {row["index"]: row for row in ours}
    identical = kv_identical = 0
    first: Diff | None = None
    ours_kv = 0
    for row in theirs.rows:
        mine = by_index.get(row.index)
        if mine is None:
            raise AssertionError(f"our simulator has no row for request {row.index}")
        ours_kv += mine["kv_hit"]
        if mine["hit"] == row.hit:
            identical += 1
        elif first is None:
            first = Diff(row.index, row.input_len, mine["hit"], row.hit, mine["kv_hit"], row.kv_match)
        kv_identical += int(mine["kv_hit"] == row.kv_match)
    total_in = sum(r.input_len for r in theirs.rows) or 1
    return ParityResult(
        version=version,
        strategy=config.strategy,
        page_size=config.page_size,
        kv_tokens=kv_tokens,
        state_slots=state_slots,
        total=len(theirs.rows),
        identical=identical,
        kv_identical=kv_identical,
        ours_hit_rate=sum(r["hit"] for r in ours) / total_in,
        sglang_hit_rate=theirs.hit_rate,
        ours_kv_match_rate=ours_kv / total_in,
        sglang_kv_match_rate=sum(r.kv_match for r in theirs.rows) / total_in,
        sglang_mamba_evicted=theirs.mamba_evicted,
        sglang_states_evicted=theirs.states_evicted,
        sglang_kv_evicted=theirs.kv_evicted,
        ours_stats={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        first_diff=first,
        peer=peer,
    )
