"""A :class:`~mamba_radix.cost_model.CostModel` fitted from a user's own SGLang server log.

SGLang's scheduler logs ``Decode batch, #running-req: B, ..., gen throughput (token/s): G, ...`` every
``decode_log_interval`` decode steps and ``Prefill batch, ..., #new-token: T, ..., input throughput
(token/s): R`` per prefill batch (:mod:`mamba_radix.sim.scheduler_view` writes the same lines). Each
decode line gives one step time ``B / G`` seconds at batch ``B``; each prefill line one batch time
``T / R`` seconds for ``T`` tokens. Least squares then fits ``decode_step_s + decode_step_per_req_s * B``
and ``prefill_batch_overhead_s + T / prefill_tokens_per_s``.

Both throughputs divide by the wall time since the previous line of their kind, which includes whatever
else ran (prefill batches between decode lines, decode steps and idle time between prefill lines), so
some lines overstate their time. The fit is therefore trimmed once: fit all, drop the points more than 50%
above the fitted line (interruptions only ever make a point slower), fit again. With a single batch size
(or token count) the intercept cannot be told from the slope: the per-request (per-token) term is then
taken as 0 (or the overhead as 0) and the fit is the mean time at that size. Lines are found anywhere in
a log line (timestamps and rank prefixes are skipped); fields the parser does not need are ignored.
No side effects; O(lines).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mamba_radix.cost_model import CostModel
from mamba_radix.errors import ConfigError

__all__ = ["CostFitError", "fit_cost_model", "parse_log"]

MIN_LINES = 2  # usable lines of each kind the fit needs

_DECODE = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+),.*?gen throughput \(token/s\): (?P<rate>[0-9.]+)"
)
_PREFILL = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: \d+, #new-token: (?P<tokens>\d+),.*?"
    r"input throughput \(token/s\): (?P<rate>[0-9.]+)"
)


class CostFitError(ConfigError):
    """Too few usable lines in the log to fit a cost model."""


def parse_log(lines: Iterable[str]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """``(decode, prefill)`` points: ``(batch size, seconds per step)`` from each Decode batch line and
    ``(new tokens, seconds)`` from each Prefill batch line; lines with a zero count or throughput are
    skipped (SGLang's first line after start has no gap to divide by). O(lines)."""
    decode: list[tuple[int, float]] = []
    prefill: list[tuple[int, float]] = []
    for line in lines:
        if (m := _DECODE.search(line)) is not None:
            running, rate = int(m["running"]), float(m["rate"])
            if running > 0 and rate > 0:
                decode.append((running, running / rate))
        elif (m := _PREFILL.search(line)) is not None:
            tokens, rate = int(m["tokens"]), float(m["rate"])
            if tokens > 0 and rate > 0:
                prefill.append((tokens, tokens / rate))
    return decode, prefill


def _line_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` (``b`` = 0 when every ``x`` is the same). O(n)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return mean_y, 0.0
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - b * mean_x, b


def _trimmed_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Fit, drop the points more than 50% above the line, fit again (module docstring). O(n)."""
    a, b = _line_fit(points)
    kept = [(x, y) for x, y in points if y <= 1.5 * (a + b * x)]
    return _line_fit(kept) if len(kept) >= MIN_LINES else (a, b)


def fit_cost_model(lines: Iterable[str]) -> CostModel:
    """A :class:`CostModel` from SGLang ``Decode batch`` / ``Prefill batch`` log lines (module docstring).
    Raises :class:`CostFitError` when fewer than two usable lines of either kind are found. O(lines)."""
    decode, prefill = parse_log(lines)
    if len(decode) < MIN_LINES or len(prefill) < MIN_LINES:
        raise CostFitError(
            f"cost fit: need >= {MIN_LINES} usable Decode batch and Prefill batch lines (with a throughput), "
            f"got {len(decode)} and {len(prefill)}"
        )
    step_s, per_req_s = _trimmed_fit(decode)
    overhead_s, s_per_token = _trimmed_fit(prefill)
    if s_per_token <= 0:  # one batch size (or noise): all of the time goes to the tokens
        overhead_s, s_per_token = 0.0, sum(y for _, y in prefill) / sum(x for x, _ in prefill)
    return CostModel(
        prefill_tokens_per_s=1.0 / s_per_token,
        prefill_batch_overhead_s=max(0.0, overhead_s),
        decode_step_s=max(0.0, step_s),
        decode_step_per_req_s=max(0.0, per_req_s),
    )
