"""What one simulator run measures (DESIGN.md §9), and its JSON-lines form.

:class:`RunMetrics` is filled by the engine while it runs: one call per admitted request
(:meth:`record_admission`), one per first token (:meth:`record_first_token`), one per blocked admission
(:meth:`record_blocked`), and pool samples (:meth:`sample`). :meth:`summary` turns it into plain numbers;
:func:`result_record` wraps a run's config, pools, summary and time series into one JSON-serialisable
dict, the unit of the results files (one JSON object per line, one line per run).

Definitions (token counts are over the trace's true input lengths):

- ``token_hit_rate`` = cached tokens / input tokens, where cached = the usable hit of the admission match
  (KV up to the deepest checkpoint, on ``input[:-1]``).
- ``kv_only_matched_tokens``: KV matched beyond the usable hit (no state there), recomputed anyway.
- ``ideal_hit_rate``: the infinite-capacity longest-prefix ideal (:mod:`mamba_radix.sim.ideal`).
- ``recomputed_tokens``: sum over requests of ``max(0, ideal - hit)``: tokens an earlier request had
  already computed but this one computed again (evicted, or no checkpoint where it was needed).
- ``prefill_tokens``: tokens actually run through prefill (input - hit).

Serving metrics (timed mode; ``bench_serving``'s definitions, times from each request's send; None in
sequential mode, whose clock has no arrivals): ``duration_s`` from the first send to the last finish;
``completed_requests``; ``request_throughput_rps`` = completed / duration; ``input_throughput_tok_s`` and
``output_throughput_tok_s`` = input / output tokens / duration; TTFT, TPOT and end-to-end latency
(``e2e``) mean / median / p99 in ms, TPOT = ``(latency - TTFT) / (output_len - 1)`` over requests with at
least 2 output tokens; ``itl_mean_ms`` = the mean gap between consecutive output tokens over all tokens
(sum of ``latency - TTFT`` / sum of ``output_len - 1``). ITL's median and p99 are not given: they need
every decode step's time per request, which decode jumps do not keep.

Host tier (only when it is on; the summary has no ``host_tier`` key otherwise): the usable hit splits into
``device_hit_tokens`` (already on the device at admission) and ``host_hit_tokens`` (reachable only through a
load-back at admission: hit after - device hit before), and ``miss_tokens`` = input - hit, so the three add
up to the input tokens. Bytes moved are the cache's host counters times the run's bytes per KV token and per
state slot: ``bytes_host_to_device`` (load-backs) and ``bytes_device_to_host`` (backups, which overlap
compute and delay nothing). ``load_s`` is the load-backs' time on the link; the part that fits in the
previous forward's compute time is ``load_overlapped_s`` (and ``load_overlapped_bytes``), the rest,
``load_exposed_s``, is added to the prefill batch that waits for it (its requests' TTFT).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HostTierMetrics",
    "PoolSample",
    "RunMetrics",
    "host_tier_lines",
    "percentile",
    "result_record",
    "serving_lines",
]

SAMPLE_FIELDS = (
    "time_s",
    "finished",
    "running",
    "waiting",
    "kv_used_tokens",
    "kv_tree_tokens",
    "kv_capacity_tokens",
    "slots_used",
    "slots_tree",
    "slots_reserved",
    "slot_capacity",
)


@dataclass(frozen=True)
class PoolSample:
    """Pool usage at one moment. ``kv_used_tokens`` counts allocated KV plus decode KV the engine owes
    but has not allocated yet (decode jumps allocate per segment)."""

    time_s: float
    finished: int
    running: int
    waiting: int
    kv_used_tokens: int
    kv_tree_tokens: int
    kv_capacity_tokens: int
    slots_used: int
    slots_tree: int
    slots_reserved: int
    slot_capacity: int


@dataclass
class HostTierMetrics:
    """The host tier's figures of one run (module docstring): per-request host hits from the engine,
    transfer times from the engine's link model, and the cache's host counters copied at the end."""

    link: str
    link_gb_per_s: float
    host_kv_tokens: int
    host_state_slots: int
    write_policy: str
    host_hit_tokens: int = 0
    host_hit_requests: int = 0
    load_s: float = 0.0
    load_overlapped_s: float = 0.0
    load_overlapped_bytes: int = 0
    load_exposed_s: float = 0.0
    # the cache's counters (HostTierStats), set at the run's end
    load_backs: int = 0
    kv_tokens_loaded: int = 0
    states_loaded: int = 0
    loads_skipped: int = 0
    kv_tokens_backed_up: int = 0
    states_backed_up: int = 0
    backups_skipped: int = 0
    host_tokens_evicted: int = 0
    bytes_host_to_device: int = 0
    bytes_device_to_host: int = 0

    def summary(self, input_tokens: int, cached_tokens: int) -> dict[str, Any]:
        """Plain numbers, with the per-tier split of ``cached_tokens`` over ``input_tokens``. O(1)."""

        def rate(x: int) -> float:
            return x / input_tokens if input_tokens else 0.0

        device = cached_tokens - self.host_hit_tokens
        miss = input_tokens - cached_tokens
        return {
            "device_hit_tokens": device,
            "host_hit_tokens": self.host_hit_tokens,
            "miss_tokens": miss,
            "device_hit_rate": rate(device),
            "host_hit_rate": rate(self.host_hit_tokens),
            "miss_rate": rate(miss),
            "host_hit_requests": self.host_hit_requests,
            "load_backs": self.load_backs,
            "kv_tokens_loaded": self.kv_tokens_loaded,
            "states_loaded": self.states_loaded,
            "loads_skipped": self.loads_skipped,
            "kv_tokens_backed_up": self.kv_tokens_backed_up,
            "states_backed_up": self.states_backed_up,
            "backups_skipped": self.backups_skipped,
            "host_tokens_evicted": self.host_tokens_evicted,
            "bytes_host_to_device": self.bytes_host_to_device,
            "bytes_device_to_host": self.bytes_device_to_host,
            "load_s": self.load_s,
            "load_overlapped_s": self.load_overlapped_s,
            "load_overlapped_bytes": self.load_overlapped_bytes,
            "load_exposed_s": self.load_exposed_s,
            "link": self.link,
            "link_gb_per_s": self.link_gb_per_s,
            "host_kv_tokens": self.host_kv_tokens,
            "host_state_slots": self.host_state_slots,
            "write_policy": self.write_policy,
        }


def host_tier_lines(summary: dict[str, Any]) -> list[str]:
    """The ``simulate`` summary's host-tier lines from a summary's ``host_tier`` dict; none when the tier
    is off (the key is absent). O(1), pure."""
    h = summary.get("host_tier")
    if not h:
        return []
    gib = 2**30
    return [
        f"host tier           {h['host_kv_tokens']:,} KV tokens, {h['host_state_slots']:,} state slots, "
        f"{h['write_policy']}; link {h['link']} ({h['link_gb_per_s']:g} GB/s per direction)",
        f"hits by tier        device {100 * h['device_hit_rate']:.2f}%, host {100 * h['host_hit_rate']:.2f}%, "
        f"miss {100 * h['miss_rate']:.2f}% of input tokens ({h['host_hit_requests']:,} requests hit the host)",
        f"host -> device      {h['load_backs']:,} load-backs, {h['kv_tokens_loaded']:,} KV tokens + "
        f"{h['states_loaded']:,} states = {h['bytes_host_to_device'] / gib:.3f} GiB in {h['load_s']:.3f} s "
        f"({h['load_overlapped_s']:.3f} s overlapped, {h['load_exposed_s']:.3f} s added to prefill); "
        f"{h['loads_skipped']:,} skipped",
        f"device -> host      {h['kv_tokens_backed_up']:,} KV tokens + {h['states_backed_up']:,} states = "
        f"{h['bytes_device_to_host'] / gib:.3f} GiB backed up (overlapped); {h['backups_skipped']:,} skipped, "
        f"{h['host_tokens_evicted']:,} host KV tokens evicted",
    ]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; ``None`` for no values. O(n log n)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class RunMetrics:
    """Counters of one run. ``keep_per_request`` keeps one small dict per request (tests, small traces)."""

    keep_per_request: bool = False
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ideal_hit_tokens: int = 0
    kv_matched_tokens: int = 0
    kv_only_matched_tokens: int = 0
    recomputed_tokens: int = 0
    prefill_tokens: int = 0
    prefill_chunks: int = 0
    decode_segments: int = 0
    decode_boundaries: int = 0
    requests_with_hit: int = 0
    peak_running: int = 0
    peak_running_bound_by: str | None = None
    blocked: Counter[str] = field(default_factory=Counter)
    ttft_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)
    per_request: list[dict[str, Any]] = field(default_factory=list)
    samples: list[PoolSample] = field(default_factory=list)
    sim_time_s: float = 0.0
    # serving metrics (module docstring); duration_s stays None in sequential mode
    completed: int = 0
    duration_s: float | None = None
    e2e_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    decode_s: float = 0.0  # sum over requests of latency - TTFT (ITL's numerator)
    decode_gaps: int = 0  # sum over requests of output_len - 1 (ITL's denominator)
    host_tier: HostTierMetrics | None = None  # None: the host tier is off (no key in the summary)

    def record_admission(
        self, index: int, input_len: int, output_len: int, hit: int, kv_hit: int, ideal: int
    ) -> None:
        """One admitted request: its usable hit, KV match and ideal hit (tokens)."""
        self.requests += 1
        self.input_tokens += input_len
        self.output_tokens += output_len
        self.cached_tokens += hit
        self.kv_matched_tokens += kv_hit
        self.kv_only_matched_tokens += max(0, kv_hit - hit)
        self.ideal_hit_tokens += ideal
        self.recomputed_tokens += max(0, ideal - hit)
        self.prefill_tokens += input_len - hit
        self.requests_with_hit += hit > 0
        if self.keep_per_request:
            self.per_request.append(
                {"index": index, "input_len": input_len, "hit": hit, "kv_hit": kv_hit, "ideal": ideal}
            )

    def record_host_hit(self, index: int, host_hit_tokens: int) -> None:
        """The host tier's share of the hit of the request admitted last (``index``): tokens a load-back
        made a device hit. O(1) (O(1) amortized with ``keep_per_request``)."""
        if self.host_tier is None or host_hit_tokens <= 0:
            return
        self.host_tier.host_hit_tokens += host_hit_tokens
        self.host_tier.host_hit_requests += 1
        if self.keep_per_request and self.per_request and self.per_request[-1]["index"] == index:
            self.per_request[-1]["host_hit"] = host_hit_tokens

    def record_first_token(self, index: int, ttft_s: float, queue_s: float) -> None:
        self.ttft_s.append(ttft_s)
        self.queue_s.append(queue_s)
        if self.keep_per_request:
            for row in reversed(self.per_request):
                if row["index"] == index:
                    row["ttft_s"] = ttft_s
                    break

    def record_finish(self, e2e_s: float, ttft_s: float, output_len: int) -> None:
        """One finished request: its latency and TTFT (seconds from its send) and its output length. O(1)."""
        self.completed += 1
        self.e2e_s.append(e2e_s)
        if output_len > 1:
            self.tpot_s.append((e2e_s - ttft_s) / (output_len - 1))
            self.decode_s += e2e_s - ttft_s
            self.decode_gaps += output_len - 1

    def record_blocked(self, reason: str) -> None:
        """An admission attempt that failed because ``reason`` (kv_tokens, state_slots, req_rows) ran out."""
        self.blocked[reason] += 1

    def record_running(self, running: int, bound_by: str | None) -> None:
        if running > self.peak_running:
            self.peak_running = running
            self.peak_running_bound_by = bound_by
        elif running == self.peak_running and bound_by and not self.peak_running_bound_by:
            self.peak_running_bound_by = bound_by

    def sample(self, s: PoolSample) -> None:
        self.samples.append(s)

    # ------------------------------------------------------------------------------------------ output
    def summary(self) -> dict[str, Any]:
        """Plain numbers (JSON-serialisable). O(n log n) for the percentiles."""

        def rate(x: int) -> float:
            return x / self.input_tokens if self.input_tokens else 0.0

        bound = self.blocked.most_common(1)[0][0] if self.blocked else None
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "token_hit_rate": rate(self.cached_tokens),
            "ideal_hit_tokens": self.ideal_hit_tokens,
            "ideal_hit_rate": rate(self.ideal_hit_tokens),
            "fraction_of_ideal": self.cached_tokens / self.ideal_hit_tokens
            if self.ideal_hit_tokens
            else None,
            "kv_matched_tokens": self.kv_matched_tokens,
            "kv_only_matched_tokens": self.kv_only_matched_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "prefill_tokens": self.prefill_tokens,
            "prefill_chunks": self.prefill_chunks,
            "decode_segments": self.decode_segments,
            "decode_boundaries": self.decode_boundaries,
            "requests_with_hit": self.requests_with_hit,
            "peak_running": self.peak_running,
            "peak_running_bound_by": self.peak_running_bound_by,
            "admission_blocked": dict(self.blocked),
            "admission_bound_by": bound,
            "sim_time_s": self.sim_time_s,
            "ttft_mean_s": sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else None,
            "ttft_p50_s": percentile(self.ttft_s, 50),
            "ttft_p90_s": percentile(self.ttft_s, 90),
            "ttft_p99_s": percentile(self.ttft_s, 99),
            "queue_mean_s": sum(self.queue_s) / len(self.queue_s) if self.queue_s else None,
            **self.serving_summary(),
        } | (
            {}
            if self.host_tier is None
            else {"host_tier": self.host_tier.summary(self.input_tokens, self.cached_tokens)}
        )

    def serving_summary(self) -> dict[str, Any]:
        """bench_serving's run-end metrics (module docstring); every value None but
        ``completed_requests`` in sequential mode. O(n log n)."""
        duration = self.duration_s
        timed = duration is not None
        out: dict[str, Any] = {"completed_requests": self.completed, "duration_s": duration}

        def per_s(x: float) -> float | None:
            return x / duration if timed and duration else None

        out["request_throughput_rps"] = per_s(self.completed)
        out["input_throughput_tok_s"] = per_s(self.input_tokens)
        out["output_throughput_tok_s"] = per_s(self.output_tokens)
        for name, values in (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s)):
            ms = [v * 1000.0 for v in values] if timed else []
            out[f"{name}_mean_ms"] = sum(ms) / len(ms) if ms else None
            out[f"{name}_median_ms"] = percentile(ms, 50)
            out[f"{name}_p99_ms"] = percentile(ms, 99)
        out["itl_mean_ms"] = 1000.0 * self.decode_s / self.decode_gaps if timed and self.decode_gaps else None
        return out

    def timeseries(self) -> dict[str, list[float | int]]:
        """Samples as columns (one list per field)."""
        return {name: [getattr(s, name) for s in self.samples] for name in SAMPLE_FIELDS}


def serving_lines(summary: dict[str, Any]) -> list[str]:
    """The time lines of a :meth:`RunMetrics.summary` for the ``simulate`` summary: TTFT once, with the
    rest of bench_serving's figures around it. Timed mode: the simulated duration, request and token
    throughput, then TTFT (mean, median, p90, p99), TPOT and end-to-end latency in ms, and ITL. Sequential
    mode (no arrivals, not a load test): an "n/a" line for the serving figures, then TTFT's percentiles in
    seconds and the simulated time. A summary without serving figures (a record older than them) gives the
    TTFT line only. O(1), pure."""

    def ms(key: str) -> str:
        value = summary.get(key)
        return "-" if value is None else f"{value:,.1f}"

    def sec(key: str) -> str:
        value = summary.get(key)
        return "-" if value is None else f"{value:.3f} s"

    if summary.get("duration_s") is None:
        ttft = (
            f"TTFT                p50 {sec('ttft_p50_s')}, p90 {sec('ttft_p90_s')}, p99 {sec('ttft_p99_s')}; "
            f"simulated {summary.get('sim_time_s', 0.0):.1f} s"
        )
        if "duration_s" not in summary:
            return [ttft]
        return ["serving metrics     n/a (sequential mode: no arrivals, not a load test)", ttft]
    p90 = summary.get("ttft_p90_s")
    p90_ms = "-" if p90 is None else f"{1000.0 * p90:,.1f}"
    return [
        f"duration            {summary['duration_s']:,.1f} s simulated, {summary['completed_requests']:,} "
        "requests completed",
        f"throughput          {summary['request_throughput_rps']:,.2f} req/s, input "
        f"{summary['input_throughput_tok_s']:,.0f} tok/s, output {summary['output_throughput_tok_s']:,.0f} tok/s",
        f"TTFT                mean {ms('ttft_mean_ms')}, median {ms('ttft_median_ms')}, p90 {p90_ms}, "
        f"p99 {ms('ttft_p99_ms')} ms",
        *(
            f"{label:<20}mean {ms(key + '_mean_ms')}, median {ms(key + '_median_ms')}, p99 {ms(key + '_p99_ms')} ms"
            for label, key in (("TPOT", "tpot"), ("E2E latency", "e2e"))
        ),
        f"ITL                 mean {ms('itl_mean_ms')} ms",
    ]


def result_record(
    run_id: str,
    params: dict[str, Any],
    pools: dict[str, Any],
    summary: dict[str, Any],
    cache_stats: dict[str, Any],
    timeseries: dict[str, list[float | int]] | None,
    wall_s: float,
    per_request: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One results line: everything needed to tabulate and plot a run without re-running it."""
    record: dict[str, Any] = {
        "run_id": run_id,
        "params": params,
        "pools": pools,
        "metrics": summary,
        "cache_stats": cache_stats,
        "wall_s": round(wall_s, 3),
    }
    if timeseries is not None:
        record["timeseries"] = timeseries
    if per_request is not None:
        record["per_request"] = per_request
    return record
