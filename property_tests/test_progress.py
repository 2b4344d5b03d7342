"""Progress in requests across all runs: totals, rate, ETA, periodic lines off a terminal, and the
sweep's worker processes reporting while their runs go on."""

from __future__ import annotations

import io
from pathlib import Path

from mamba_radix.sim.progress import Progress, format_duration
from mamba_radix.sim.sweep import RunSpec, run_sweep


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_count_requests_across_runs_with_rate_and_eta() -> None:
    clock, out = FakeClock(), io.StringIO()
    p = Progress(1000, 2, "experiment", stream=out, every_s=10, clock=clock)
    clock.t += 5
    p.update("a", 100)
    assert out.getvalue() == ""  # less than every_s since the start: nothing yet
    clock.t += 5
    p.update("b", 150)  # 250 done in 10 s: 25 req/s, 750 left = 30 s
    assert out.getvalue().splitlines() == [
        "experiment: 250/1,000 requests (25.0%), 0/2 runs, 25 req/s, elapsed 10s, ETA 30s"
    ]
    p.update("a", 90)  # a stale, lower count changes nothing
    assert p.done_requests == 250
    clock.t += 30
    p.run_done("a", 500)  # the rest of run a counts at once
    p.run_done("b", 500)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[-1] == "experiment: 1,000/1,000 requests (100.0%), 2/2 runs, 25 req/s, elapsed 40s, ETA 0s"


def test_quiet_writes_nothing_and_no_eta_before_one_percent() -> None:
    out = io.StringIO()
    with Progress(10, 1, "x", quiet=True, stream=out, every_s=0) as p:
        p.update("r", 5)
    assert out.getvalue() == ""
    clock = FakeClock()
    p = Progress(100_000, 1, "x", stream=io.StringIO(), clock=clock)
    clock.t += 5
    p.update("r", 10)
    assert p.line().endswith("ETA ?")


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 42, 185, 3725)] == ["0s", "42s", "3m05s", "1h02m"]


def test_sweep_workers_report_progress_while_running(tmp_path: Path) -> None:
    specs = [
        RunSpec(run_id=str(i), trace="synthetic:chat", synthetic={"generator": "chat", "seed": i}, limit=8,
                options={"mode": "sequential"}, budget_gib=2.0)
        for i in range(2)
    ]  # fmt: skip
    seen: dict[str, list[int]] = {}
    for jobs in (1, 2):
        seen.clear()
        run_sweep(specs, jobs=jobs, on_progress=lambda run_id, n: seen.setdefault(run_id, []).append(n))
        # at least the first finished request of each run is reported from inside the run
        assert set(seen) == {"0", "1"}, jobs
        assert all(ns == sorted(ns) and 1 <= ns[0] <= 8 for ns in seen.values())


def test_on_a_terminal_it_is_one_tqdm_bar_in_requests() -> None:
    import pytest

    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with Progress(40, 2, "sweep", stream=out) as p:
        assert p._bar is not None and p._bar.unit == "req" and p._bar.total == 40
        p.update("a", 10)
        p.run_done("a", 20)
        p.update("b", 5)
        assert p._bar.n == 25 == p.done_requests
    text = out.getvalue()
    assert "sweep" in text and "req" in text and "1/2 runs" in text


def test_slow_rates_keep_their_digits() -> None:
    clock = FakeClock()
    p = Progress(10, 1, "x", stream=io.StringIO(), clock=clock)
    clock.t += 27
    p.update("r", 10)
    assert "0.37 req/s" in p.line()
