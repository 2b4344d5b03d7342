"""Cost models fitted from SGLang logs: a round trip from a known model, SGLang's real line format, the
engine's own log, too few lines; and the presets' provenance."""

from __future__ import annotations

import pytest

from mamba_radix.config import CacheConfig
from mamba_radix.cost_model import COST_PRESET_PROVENANCE, COST_PRESETS, CostModel
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.cost_fit import CostFitError, fit_cost_model, parse_log
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.scheduler_view import PoolView, decode_batch_line, prefill_batch_line
from mamba_radix.sim.traces import TraceRequest

TRUE = CostModel(
    prefill_tokens_per_s=30_000.0,
    prefill_batch_overhead_s=0.01,
    decode_step_s=0.02,
    decode_step_per_req_s=0.0004,
)
VIEW = PoolView(1_000, 10_000, 8, 80)


def test_round_trip_from_a_known_cost_model() -> None:
    lines = [decode_batch_line(b, VIEW, b / TRUE.decode_step_time_s(b), 0) for b in (1, 4, 8, 16, 32, 64)]
    lines += [
        prefill_batch_line(1, t, 0, VIEW, 3, 0, t / TRUE.prefill_s(t)) for t in (512, 2_048, 8_192, 16_384)
    ]
    fit = fit_cost_model(lines)
    for name in (
        "prefill_tokens_per_s",
        "prefill_batch_overhead_s",
        "decode_step_s",
        "decode_step_per_req_s",
    ):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=2e-3), name


SGLANG_LOG = """\
[2026-11-02 10:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, full token usage: 0.01, mamba usage: 0.06, #running-req: 0, #queue-req: 31, #pending-token: 0, cuda graph: False, input throughput (token/s): 40960.00
[2026-11-02 10:00:01 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 128, full token usage: 0.02, mamba usage: 0.12, #running-req: 1, #queue-req: 30, #pending-token: 0, cuda graph: False, input throughput (token/s): 27306.67
[2026-11-02 10:00:02 TP0] Decode batch, #running-req: 16, #full token: 206080, full token usage: 0.11, mamba num: 64, mamba usage: 0.80, cuda graph: True, gen throughput (token/s): 640.00, #queue-req: 16
[2026-11-02 10:00:03 TP0] Decode batch, #running-req: 8, #full token: 103040, full token usage: 0.05, mamba num: 32, mamba usage: 0.40, cuda graph: True, gen throughput (token/s): 380.95, #queue-req: 0
some other line
"""


def test_sglang_real_format() -> None:
    decode, prefill = parse_log(SGLANG_LOG.splitlines())
    assert [b for b, _ in decode] == [16, 8] and [t for t, _ in prefill] == [8192, 4096]
    assert decode[0][1] == pytest.approx(16 / 640) and prefill[0][1] == pytest.approx(8192 / 40960)
    fit = fit_cost_model(SGLANG_LOG.splitlines())
    assert fit.decode_step_time_s(16) == pytest.approx(0.025, rel=1e-3)
    assert fit.decode_step_time_s(8) == pytest.approx(8 / 380.95, rel=1e-3)
    assert fit.prefill_s(8192) == pytest.approx(0.2, rel=1e-3) and fit.prefill_s(4096) == pytest.approx(
        0.15, rel=1e-3
    )


def test_too_few_lines_is_a_typed_one_line_error() -> None:
    with pytest.raises(CostFitError, match="got 2 and 0") as err:
        fit_cost_model(SGLANG_LOG.splitlines()[2:])
    assert "\n" not in str(err.value)


def test_round_trip_through_the_engine_log() -> None:
    """The engine's own lines (throughputs over whatever ran between lines, as SGLang's) fit back to the
    model that timed the run, within the trim's tolerance."""
    reqs = [
        TraceRequest.from_tokens(
            i,
            i * 40.0,
            list(range(1 + i * 3_000, 1 + i * 3_000 + 600 + 97 * (i % 7))),
            [10**8 + i * 500 + j for j in range(60 + 37 * (i % 5))],
        )
        for i in range(40)
    ]
    lines: list[str] = []
    options = EngineOptions(cost=TRUE, verify_states=False, log_every=4, log=lines.append)
    engine = Engine(
        CacheConfig(), PoolSizes(200_000, 200, 0, 1.0, 0.5, 27_648, 29_039_616, "t"), 2_000, options
    )
    engine.run(reqs, total=len(reqs))
    fit = fit_cost_model(lines)
    for batch in (4, 16, 32):
        assert fit.decode_step_time_s(batch) == pytest.approx(TRUE.decode_step_time_s(batch), rel=0.1)
    for tokens in (800, 1_200):
        assert fit.prefill_s(tokens) == pytest.approx(TRUE.prefill_s(tokens), rel=0.25)


@pytest.mark.parametrize("name", ["kimi-k3-8xh200", "qwen3-next-1xh200"])
def test_presets_say_where_their_numbers_come_from(name: str) -> None:
    cost = COST_PRESETS[name]
    assert cost.prefill_tokens_per_s > 0 and cost.decode_step_time_s(16) > 0
    assert "derived" in COST_PRESET_PROVENANCE[name] and "H200" in COST_PRESET_PROVENANCE[name]
    EngineOptions(cost=cost)  # within the engine's bounds
