"""Sessions in a block trace, a fit of their shape, and a seeded generator that reproduces it.

**Sessions, inferred** (:func:`infer_sessions`). The Mooncake conversation trace carries no session ids,
but a conversation's next turn re-sends the whole history, so its block list starts with the earlier
turn's *full* blocks (every block but the last, partial one, whose hash changes once the tail is filled).
A request whose block list extends an earlier request's full blocks, beyond the single block every request
of the trace shares (a 512-token system prompt), continues the session of the latest such request; any
other request starts a new session. The rule uses only earlier requests, so a server could assign the same
ids online. O(blocks**2) per request in tuple look-ups (prompts are at most a few hundred blocks).

**The fit** (:func:`fit_sessions`; numbers in :data:`FITTED`). From the inferred sessions of the whole
bundled trace (12,031 requests, 59 minutes), produced by ``python -m mamba_radix.sim.sessions``:

======================================  ==========================================================
request rate                            3.40 requests/s
sessions / continuations                8,057 sessions; 3,974 requests continue one (33 %)
turns per session                       1: 75.0 %, 2: 15.2 %, 3: 4.9 %, 4: 2.1 %, 5+: 2.8 % (max 43)
chance of one more turn after turn t    0.277, 0.415, 0.562, 0.597, 0.709, 0.726, 0.737; 0.868 (t >= 8)
think time (arrival to next turn)       log-normal, median 146 s, sigma 1.05 (p10 38 s, p90 558 s)
first-turn prompt                       log-normal blocks, median 11.2, sigma 1.21 (512-token blocks)
blocks a turn adds                      log-normal, median 2.4, sigma 0.88
output tokens                           log-normal, median 208, sigma 1.36 (cut at 1,000)
reuse by age (requests between a       0.002 by 25, 0.013 by 50, 0.049 by 100, 0.184 by 200,
prefix and its continuation; CDF)       0.449 by 400, 0.670 by 800, 0.859 by 1,600, 0.955 by 3,200
======================================  ==========================================================

The reuse-by-age curve is S-shaped on a log axis: almost no continuation comes within 50 requests of
its prefix (1.3 %: the think time at 3.4 requests/s), half come after about 430 (the trace's median). Ages are counted in
requests; an age ``a`` seen in a window of ``N`` requests is weighted ``N / (N - a)`` (the share of
windows that can hold it), so the curve does not depend on the trace's length. The curve is the think
time's distribution read in requests: the generator draws think times, not ages, and reproduces it.

**The generator** (:func:`session_chat`, registered as ``sessions`` for experiment definitions) writes
block-format requests the way the trace has them: every prompt starts with the shared block, a first turn
adds log-normal many fresh blocks, a continuation re-sends its parent's full blocks and adds its own, and
the last block is partial. Sessions start as a Poisson process at ``rate / E[turns]`` from ``burn_in_s``
before time 0 (so the trace opens in steady state, as a cut of a running service does: continuations of
sessions that began before it), turns follow the fitted continuation chances and think times, and every
request carries its session id (``TraceRequest.session_id``, ``"s<N>"``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mamba_radix.sim.synthetic import _check_size, _int_arg, _rate_arg
from mamba_radix.sim.traces import DEFAULT_BLOCK_SIZE, TraceRequest

__all__ = [
    "FITTED",
    "REUSE_AGES",
    "SessionFit",
    "fit_sessions",
    "infer_sessions",
    "reuse_by_age",
    "session_chat",
]

# the ages (requests) the reuse-by-age curve is stated at
REUSE_AGES: tuple[int, ...] = (25, 50, 100, 200, 400, 800, 1600, 3200)
# turns past which the continuation chance is one pooled number (the trace has few sessions that long)
MAX_TURN_TABLE = 8


@dataclass(frozen=True)
class SessionFit:
    """The fitted shape of a session trace (see the module docstring). Log-normal parameters are the mean
    and standard deviation of the natural log (``think_log_mu`` of seconds)."""

    request_rate_per_s: float
    continue_by_turn: tuple[float, ...]  # chance of turn t+1 given turn t, t = 1 .. MAX_TURN_TABLE
    think_log_mu: float
    think_log_sigma: float
    first_blocks_log_mu: float
    first_blocks_log_sigma: float
    added_blocks_log_mu: float
    added_blocks_log_sigma: float
    output_log_mu: float
    output_log_sigma: float
    reuse_cdf: tuple[float, ...]  # at REUSE_AGES
    sessions: int = 0
    requests: int = 0

    def mean_turns(self) -> float:
        """E[turns per session] from :attr:`continue_by_turn` (the last chance repeats). O(table)."""
        total, alive = 0.0, 1.0
        for p in self.continue_by_turn[:-1]:
            total += alive
            alive *= p
        last = self.continue_by_turn[-1]
        return total + alive / (1.0 - last)


# Fitted on the whole bundled conversation trace by ``python -m mamba_radix.sim.sessions``.
FITTED = SessionFit(
    request_rate_per_s=3.401,
    continue_by_turn=(0.277, 0.415, 0.562, 0.597, 0.709, 0.726, 0.737, 0.868),
    think_log_mu=math.log(145.5),
    think_log_sigma=1.049,
    first_blocks_log_mu=math.log(11.24),
    first_blocks_log_sigma=1.208,
    added_blocks_log_mu=math.log(2.444),
    added_blocks_log_sigma=0.876,
    output_log_mu=math.log(207.8),
    output_log_sigma=1.358,
    reuse_cdf=(0.002, 0.013, 0.049, 0.184, 0.449, 0.670, 0.859, 0.955),
    sessions=8057,
    requests=12031,
)


# ------------------------------------------------------------------------------------------ inference
def infer_sessions(requests: Sequence[TraceRequest], shared_blocks: int = 1) -> list[int]:
    """The parent of every request (the index of the latest earlier request whose full blocks, more than
    ``shared_blocks`` of them, its block list extends; -1 for none). Requests without block ids have no
    parent. O(blocks**2) tuple look-ups per request; no side effects."""
    latest: dict[tuple[int, ...], int] = {}
    parents: list[int] = []
    for i, r in enumerate(requests):
        blocks = tuple(r.block_ids or ())
        parent = -1
        for k in range(len(blocks) - 1, shared_blocks, -1):
            j = latest.get(blocks[:k])
            if j is not None:
                parent = j
                break
        parents.append(parent)
        if len(blocks) > 1:
            latest[blocks[:-1]] = i
    return parents


def reuse_by_age(parents: Sequence[int], ages: Sequence[int] = REUSE_AGES) -> list[float]:
    """The window-corrected CDF of continuation ages (requests from a parent to its continuation) at
    ``ages``: each age ``a`` weighted ``N / (N - a)`` for a trace of ``N`` requests. O(requests)."""
    n = len(parents)
    seen = np.array([i - p for i, p in enumerate(parents) if p >= 0], dtype=np.float64)
    if not len(seen):
        return [0.0 for _ in ages]
    weight = n / np.maximum(1.0, n - seen)
    total = weight.sum()
    return [float(weight[seen <= a].sum() / total) for a in ages]


def _log_fit(values: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, float]:
    """(mean, standard deviation) of the natural log of ``values``, optionally weighted. O(n)."""
    logs = np.log(np.maximum(np.asarray(values, dtype=np.float64), 1e-9))
    mu = float(np.average(logs, weights=weights))
    return mu, float(math.sqrt(np.average((logs - mu) ** 2, weights=weights)))


def fit_sessions(requests: Sequence[TraceRequest], shared_blocks: int = 1) -> SessionFit:
    """Fit :class:`SessionFit` to a block trace (sessions by :func:`infer_sessions`), corrected for the
    trace's window: think times weighted by how many places of the window fit them, continuation chances
    over the turns whose next turn would fall inside it. O(trace) plus the inference."""
    parents = infer_sessions(requests, shared_blocks)
    session: list[int] = []
    turn: list[int] = []
    sizes: dict[int, int] = {}
    for p in parents:
        s = session[p] if p >= 0 else len(sizes)
        session.append(s)
        sizes[s] = sizes.get(s, 0) + 1
        turn.append(turn[p] + 1 if p >= 0 else 1)
    stamps = np.array([r.timestamp_ms for r in requests], dtype=np.float64) / 1000.0
    span_s = max(1e-9, stamps[-1] - stamps[0])
    think = np.array([stamps[i] - stamps[p] for i, p in enumerate(parents) if p >= 0])
    # a gap g fits in a window of the trace's span T in a share (T - g) / T of its places: weight it back
    think_weight = span_s / np.maximum(1e-9, span_s - think)
    # a turn whose next turn could still come after the trace's end is undecided: the chances count only
    # turns at least the 99th percentile of the think time before the end (right-censoring)
    horizon_s = float(np.quantile(think, 0.99)) if len(think) else 0.0
    has_child = np.zeros(len(requests), dtype=bool)
    has_child[[p for p in parents if p >= 0]] = True
    decided = stamps <= stamps[-1] - horizon_s
    turns = np.minimum(np.array(turn), MAX_TURN_TABLE)
    table = []
    for t in range(1, MAX_TURN_TABLE + 1):
        at = decided & (turns == t)
        table.append(round(float(has_child[at].mean()), 3) if at.any() else 0.0)
    first = [len(r.block_ids or ()) for r, p in zip(requests, parents, strict=True) if p < 0]
    added = [
        len(r.block_ids or ()) - (len(requests[p].block_ids or ()) - 1)
        for r, p in zip(requests, parents, strict=True)
        if p >= 0
    ]
    fits = [
        _log_fit(think, think_weight),
        _log_fit(first),
        _log_fit(added),
        _log_fit([r.output_len for r in requests]),
    ]
    return SessionFit(
        request_rate_per_s=round(len(requests) / span_s, 3),
        continue_by_turn=tuple(table),
        think_log_mu=fits[0][0],
        think_log_sigma=fits[0][1],
        first_blocks_log_mu=fits[1][0],
        first_blocks_log_sigma=fits[1][1],
        added_blocks_log_mu=fits[2][0],
        added_blocks_log_sigma=fits[2][1],
        output_log_mu=fits[3][0],
        output_log_sigma=fits[3][1],
        reuse_cdf=tuple(round(x, 3) for x in reuse_by_age(parents)),
        sessions=len(sizes),
        requests=len(requests),
    )


# ------------------------------------------------------------------------------------------ generator
def session_chat(
    seed: int = 0,
    num_requests: int = 2000,
    block_size: int = DEFAULT_BLOCK_SIZE,
    rate_scale: float = 1.0,
    burn_in_s: float = 3600.0,
    max_blocks: int = 256,
    max_output_len: int = 1000,
    fit: SessionFit = FITTED,
) -> list[TraceRequest]:
    """``num_requests`` block-format requests of multi-turn sessions shaped by ``fit`` (see the module
    docstring), each with its session id. ``rate_scale`` multiplies the request rate (think times are
    kept, so ages in requests scale with it); prompts are cut at ``max_blocks`` blocks. Deterministic for
    a seed. Raises :class:`~mamba_radix.errors.InvalidArgument` for a bad argument or a trace past the
    synthetic size limits, before generating. O(requests * blocks)."""
    _int_arg("seed", seed, 0, None)
    _int_arg("num_requests", num_requests, 1)
    _int_arg("block_size", block_size, 1, 1 << 16)
    _int_arg("max_blocks", max_blocks, 2, 1 << 16)
    _int_arg("max_output_len", max_output_len, 1, 1 << 20)
    rate = _rate_arg("rate_scale", rate_scale, positive=True) * fit.request_rate_per_s
    burn_in_s = _rate_arg("burn_in_s", burn_in_s, positive=False)
    # block requests hold block ids (tokens expand one request at a time): the ids are what memory holds
    _check_size("session_chat", num_requests, num_requests * max_blocks)
    rng = np.random.default_rng(seed)
    session_rate = rate / fit.mean_turns()
    rows: list[tuple[float, int, list[int], int, int, str]] = []
    next_block = 1  # block 0 is the prompt every request shares
    start = -burn_in_s
    sid = 0
    # sessions start until enough requests fall after time 0 (a session's turns all come after its start)
    while True:
        start += rng.exponential(1.0 / session_rate)
        # later sessions only add requests after ``start``: stop once the first num_requests are final
        if sid % 64 == 0 and start > 0:
            stamps = np.fromiter((r[0] for r in rows), dtype=np.float64, count=len(rows))
            if np.count_nonzero((stamps >= 0) & (stamps < start)) >= num_requests:
                break
        n_first = round(math.exp(rng.normal(fit.first_blocks_log_mu, fit.first_blocks_log_sigma)))
        blocks = [0, *range(next_block, next_block + max(1, min(max_blocks - 1, n_first)))]
        next_block += len(blocks) - 1
        ts, t = start, 1
        while True:
            tail = int(rng.integers(1, block_size + 1))  # the last block is partial
            out = round(math.exp(rng.normal(fit.output_log_mu, fit.output_log_sigma)))
            rows.append((ts, len(rows), list(blocks), tail, max(1, min(max_output_len, out)), f"s{sid}"))
            p = fit.continue_by_turn[min(t, len(fit.continue_by_turn)) - 1]
            if rng.random() >= p:
                break
            ts += math.exp(rng.normal(fit.think_log_mu, fit.think_log_sigma))
            n_add = max(1, round(math.exp(rng.normal(fit.added_blocks_log_mu, fit.added_blocks_log_sigma))))
            full = blocks[:-1]  # the partial last block's hash changes once it is filled
            room = max(1, max_blocks - len(full))
            blocks = full + list(range(next_block, next_block + min(n_add, room)))
            next_block += min(n_add, room)
            t += 1
        sid += 1
    kept = sorted((r for r in rows if r[0] >= 0), key=lambda r: (r[0], r[1]))[:num_requests]
    return [
        TraceRequest(
            index=i,
            timestamp_ms=round(ts * 1000.0, 3),
            input_len=(len(blocks) - 1) * block_size + tail,
            output_len=out,
            session_id=session,
            block_ids=blocks,
            block_size=block_size,
        )
        for i, (ts, _, blocks, tail, out, session) in enumerate(kept)
    ]


def main() -> None:
    """Print the fit of the bundled conversation trace (the numbers of :data:`FITTED`). Reads the trace;
    a few seconds."""
    from mamba_radix.data import trace_path
    from mamba_radix.sim.traces import iter_block_trace

    fit = fit_sessions(list(iter_block_trace(trace_path())))
    print(f"requests {fit.requests:,}, sessions {fit.sessions:,}, rate {fit.request_rate_per_s} requests/s")
    print(f"continue by turn {fit.continue_by_turn} (mean turns {fit.mean_turns():.3f})")
    for name in ("think", "first_blocks", "added_blocks", "output"):
        mu, sigma = getattr(fit, f"{name}_log_mu"), getattr(fit, f"{name}_log_sigma")
        print(f"{name}: log-normal median {math.exp(mu):.4g}, sigma {sigma:.3f}")
    print(
        "reuse by age: "
        + ", ".join(f"{c:.3f} by {a}" for a, c in zip(REUSE_AGES, fit.reuse_cdf, strict=True))
    )


if __name__ == "__main__":  # pragma: no cover
    main()
