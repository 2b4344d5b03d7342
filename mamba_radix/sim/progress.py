"""Progress of one or many runs, counted in finished requests across all of them.

:class:`Progress` takes ``(run_id, finished)`` reports (from :func:`mamba_radix.sim.sweep.run_sweep`'s
``on_progress``) and whole-run completions, and shows one total: requests done of all requests, the rate
(requests per second since the start) and the time left at that rate. On a terminal it is a tqdm bar
(when the ``[experiments]`` extra is installed); otherwise, in CI logs or when tqdm is missing, one line
every ``every_s`` seconds and one at the end. ``quiet`` shows nothing.

Side effects: writes to ``stream`` (stderr by default). Each update is O(1).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """One progress display over ``total_requests`` requests in ``total_runs`` runs."""

    def __init__(
        self,
        total_requests: int,
        total_runs: int,
        desc: str,
        quiet: bool = False,
        stream: TextIO | None = None,
        every_s: float = 30.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.total_requests = max(0, total_requests)
        self.total_runs = total_runs
        self.desc = desc
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self._last_line = self.start
        self._per_run: dict[str, int] = {}
        self._runs_done = 0
        self.done_requests = 0
        self._bar: Any = None
        if not quiet and _isatty(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:  # no [experiments] extra: periodic lines instead
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=self.total_requests,
                    desc=desc,
                    unit="req",
                    file=self.stream,
                    dynamic_ncols=True,
                    leave=False,
                    smoothing=0.05,
                )
                self._bar.set_postfix_str(self._runs_text(), refresh=False)

    def _runs_text(self) -> str:
        return f"{self._runs_done}/{self.total_runs} runs"

    def update(self, run_id: str, finished: int) -> None:
        """Run ``run_id`` has finished ``finished`` requests so far (a running count, never decreasing)."""
        before = self._per_run.get(run_id, 0)
        if finished <= before:
            return
        self._per_run[run_id] = finished
        self._advance(finished - before)

    def run_done(self, run_id: str, requests: int) -> None:
        """Run ``run_id`` ended after ``requests`` requests (counts the rest of it, even when it failed)."""
        self._runs_done += 1
        self.update(run_id, requests)
        if self._bar is not None:
            self._bar.set_postfix_str(self._runs_text())
        else:
            self._maybe_line()

    def _advance(self, n: int) -> None:
        self.done_requests += n
        if self._bar is not None:
            self._bar.update(n)
        else:
            self._maybe_line()

    def line(self) -> str:
        """The one-line status: done/total requests, runs, rate, ETA."""
        elapsed = self.clock() - self.start
        rate = self.done_requests / elapsed if elapsed > 0 else 0.0
        pct = 100.0 * self.done_requests / self.total_requests if self.total_requests else 100.0
        left = self.total_requests - self.done_requests
        # the first requests of a run include its set-up: no ETA until 1% is done
        settled = self.done_requests >= max(1, self.total_requests // 100)
        eta = "0s" if left <= 0 else (format_duration(left / rate) if rate > 0 and settled else "?")
        return (
            f"{self.desc}: {self.done_requests:,}/{self.total_requests:,} requests ({pct:.1f}%), "
            f"{self._runs_text()}, {_rate(rate)} req/s, elapsed {format_duration(elapsed)}, ETA {eta}"
        )

    def _maybe_line(self) -> None:
        if self.quiet:
            return
        now = self.clock()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self, final_line: bool = True) -> None:
        """End the display: close the bar, or write the final line (not when quiet or not
        ``final_line``)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif not self.quiet and final_line:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(final_line=exc_type is None)  # an error says what happened, not a progress line


def _rate(rate: float) -> str:
    """``287``, ``5.5``, ``0.37``: whole numbers from 10 up, two significant digits below."""
    return f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
