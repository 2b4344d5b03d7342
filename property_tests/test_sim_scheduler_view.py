"""The scheduler's view of a timed run: SGLang's Decode / Prefill batch lines from the real pools (the
seed's "running requests capped by the state pool" line), bench_serving's client semaphore
(``max_concurrency``) and the run-end serving metrics."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mamba_radix.config import CacheConfig
from mamba_radix.cost_model import CostModel
from mamba_radix.errors import ConfigError
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.metrics import serving_lines
from mamba_radix.sim.traces import TraceRequest

DECODE = re.compile(
    r"^Decode batch, #running-req: (\d+), #full token: (\d+), full token usage: ([0-9.]+), "
    r"mamba num: (\d+), mamba usage: ([0-9.]+), gen throughput \(token/s\): ([0-9.]+), #queue-req: (\d+)$"
)


def pools(kv_tokens: int, slots: int) -> PoolSizes:
    return PoolSizes(kv_tokens, slots, 0, 1.0, 0.5, 27_648, 29_039_616, "test")


def workload(n: int, input_len: int, output_len: int, gap_ms: float = 0.0) -> list[TraceRequest]:
    """``n`` prompts sharing no token (bench_serving's random dataset: no reuse)."""
    return [
        TraceRequest.from_tokens(
            i,
            i * gap_ms,
            list(range(1 + i * input_len, 1 + (i + 1) * input_len)),
            [10**8 + i * output_len + j for j in range(output_len)],
        )
        for i in range(n)
    ]


def run(reqs: list[TraceRequest], pool: PoolSizes, **options: Any) -> tuple[Engine, Any, list[str]]:
    lines: list[str] = []
    opts = EngineOptions(verify_states=False, **({"log": lines.append} | options))
    engine = Engine(CacheConfig(), pool, max(r.input_len + r.output_len for r in reqs), opts)
    return engine, engine.run(reqs, total=len(reqs)), lines


def test_the_seed_line_running_requests_capped_by_the_state_pool() -> None:
    """Seed 001 §4.3, scaled down (prompts 1,600 / 300 instead of 16k / 3k): 80 state slots at 5 per
    request cap running requests at 16 while the KV pool is mostly free and the state pool mostly used."""
    engine, metrics, lines = run(
        workload(48, 1_600, 300), pools(400_000, 80), log_every=20, max_concurrency=32
    )
    assert engine.max_running == 80 // CacheConfig().slots_per_request == 16
    decode = [DECODE.match(line) for line in lines if line.startswith("Decode batch")]
    assert decode and all(decode), lines[:3]
    running = [int(m[1]) for m in decode]  # type: ignore[index]
    assert max(running) == 16
    full = [(int(m[1]), int(m[2]), float(m[3]), int(m[4]), float(m[5])) for m in decode if int(m[1]) == 16]  # type: ignore[index]
    assert any(usage < 0.2 and mamba_usage >= 0.6 for _, _, usage, _, mamba_usage in full)
    for _, tokens, usage, slots, mamba_usage in full:
        assert tokens >= 16 * 1_600  # every running request's prompt, at least
        assert usage == pytest.approx(tokens / 400_000, abs=0.006)
        assert mamba_usage == pytest.approx(slots / 80, abs=0.006)
        assert slots >= 16 * 3  # each holds a live slot and two track slots (extra_buffer, overlap)
    assert metrics.peak_running == 16 and metrics.peak_running_bound_by == "state_slots"
    assert any(line.startswith("Prefill batch, #new-seq: ") for line in lines)


def test_max_concurrency_holds_and_ttft_counts_from_the_send() -> None:
    reqs = workload(12, 200, 40)  # all arrive at 0
    _, metrics, lines = run(reqs, pools(100_000, 400), log_every=1, max_concurrency=3)
    decode = [DECODE.match(line) for line in lines if line.startswith("Decode batch")]
    assert decode and all(decode)
    assert max(int(m[1]) + int(m[7]) for m in decode) <= 3  # type: ignore[index]
    assert max(int(m[1]) for m in decode) == 3  # type: ignore[index]
    assert metrics.peak_running == 3
    # one at a time: each is sent when the previous finishes, so it never queues at the server
    _, one, _ = run(reqs, pools(100_000, 400), max_concurrency=1)
    assert one.peak_running == 1 and max(one.queue_s) == 0.0
    # without the cap every request is sent at 0 and the later ones queue at the server
    _, free, _ = run(reqs, pools(100_000, 400))
    assert free.peak_running == 12 and free.completed == one.completed == 12


def test_the_log_changes_no_result_and_costs_nothing_when_off() -> None:
    reqs = workload(20, 300, 30, gap_ms=50.0)
    _, off, none = run(reqs, pools(20_000, 60))
    _, on, lines = run(reqs, pools(20_000, 60), log_every=5)
    assert not none and lines
    assert off.summary() == on.summary()


def test_queue_counts_arrivals_during_a_decode_jump() -> None:
    """A blocked head: later arrivals reach the engine's queue only at the next event, but the line at
    each step counts every request sent by then."""
    reqs = workload(4, 100, 200, gap_ms=100.0)
    cost = CostModel(decode_step_s=0.01, decode_step_per_req_s=0.0)
    _, _, lines = run(reqs, pools(100_000, 5), log_every=1, cost=cost)  # one request at a time
    queues = [int(m[7]) for m in map(DECODE.match, lines) if m]  # type: ignore[index]
    # request 0 prefills for 7.5 ms, then steps of 10 ms: step k ends at 7.5 + 10 k ms; the others arrive
    # at 100, 200 and 300 ms (the second stops the jump, the next two arrive inside one)
    assert queues[8] == 0 and queues[9] == 1 and queues[18] == 1 and queues[19] == 2
    assert queues[28] == 2 and queues[29] == 3


def test_serving_metrics_follow_bench_serving() -> None:
    cost = CostModel(
        prefill_tokens_per_s=1_000.0,
        prefill_batch_overhead_s=0.0,
        decode_step_s=0.01,
        decode_step_per_req_s=0.0,
    )
    reqs = workload(1, 100, 5)
    _, metrics, _ = run(reqs, pools(10_000, 50), cost=cost)
    s = metrics.summary()
    assert s["completed_requests"] == 1
    assert s["ttft_mean_ms"] == pytest.approx(100.0)  # 100 tokens at 1,000 tokens/s
    assert s["tpot_mean_ms"] == pytest.approx(10.0) == s["itl_mean_ms"]  # 4 decode steps of 10 ms
    assert s["e2e_mean_ms"] == pytest.approx(140.0)
    assert s["duration_s"] == pytest.approx(0.14)
    assert s["output_throughput_tok_s"] == pytest.approx(5 / 0.14)
    assert any(line.startswith("TPOT") for line in serving_lines(s))
    _, seq, _ = run(reqs, pools(10_000, 50), cost=cost, mode="sequential")
    q = seq.summary()
    assert q["duration_s"] is None and q["tpot_mean_ms"] is None and q["completed_requests"] == 1
    assert "n/a" in serving_lines(q)[0]


@pytest.mark.parametrize(("field", "value"), [("max_concurrency", 0), ("log_every", -1), ("log", "stdout")])
def test_options_are_checked(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        EngineOptions(**{field: value})
