"""Seeded synthetic workloads in the token format, one per reuse pattern a hybrid cache must handle.

- :func:`multi_turn_chat`: sessions whose every turn re-sends the whole history (system prompt, earlier
  user messages and the model's earlier replies) plus a new message: input-and-output reuse.
- :func:`shared_system_prompt`: single-turn requests that start with one of a few long system prompts:
  purely-input reuse, where a checkpoint must land at the branch point to be useful.
- :func:`agent_loop`: agents that re-send a long, growing context every step (tool call + observation
  appended): long repeated context, the Kimi-K3 "agentic turns share >95% of their context" case.
- :func:`branching_tree`: tree-of-thought: one root prompt, every node extends its parent by a segment and
  is sent as a request; siblings diverge in the middle of what the cache stored for the parent.

Everything comes from ``numpy.random.default_rng(seed)``: the same arguments give the same trace. Token ids
are drawn from ``[0, vocab)``; arrivals are Poisson session starts plus a think time between turns, and
every generator returns its requests sorted by timestamp (ties keep generation order).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from mamba_radix.errors import InvalidArgument
from mamba_radix.sim.traces import MAX_TOKEN_ID, TraceRequest

__all__ = [
    "GENERATORS",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "agent_loop",
    "branching_tree",
    "multi_turn_chat",
    "shared_system_prompt",
]

_VOCAB = 50_000
# Bounds checked before any generation, so a mistyped size is refused at once instead of running for
# hours or exhausting memory: requests per trace, and an upper bound of the input + output token ids the
# trace holds (every length at 3/2 of its mean, the largest _length draws). 10**8 ids are ~4 GB of lists.
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 100_000_000


def _int_arg(name: str, value: object, minimum: int, maximum: int | None = MAX_TOKEN_ID) -> int:
    bad = isinstance(value, bool) or not isinstance(value, int) or value < minimum
    if bad or (maximum is not None and value > maximum):  # type: ignore[operator]
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidArgument(f"{name} must be an int {bound}, got {value!r}")
    return value  # type: ignore[return-value]


def _rate_arg(name: str, value: object, *, positive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise InvalidArgument(
            f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return float(value)


def _check_size(what: str, requests: int, tokens: int) -> None:
    if requests > MAX_REQUESTS:
        raise InvalidArgument(
            f"{what}: {requests:,} requests exceed the limit of {MAX_REQUESTS:,}; shrink it"
        )
    if tokens > MAX_TOKENS:
        raise InvalidArgument(
            f"{what}: up to {tokens:,} token ids exceed the limit of {MAX_TOKENS:,}; use shorter lengths or fewer requests"
        )


def _check_common(seed: object, vocab: object) -> None:
    _int_arg("seed", seed, 0, None)  # numpy takes any non-negative int
    _int_arg("vocab", vocab, 1)


def _hi(mean: int) -> int:
    """The largest length :func:`_length` draws around ``mean``."""
    return max(1, mean + mean // 2)


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(0, vocab, size=int(n)).tolist()


def _length(rng: np.random.Generator, mean: int) -> int:
    """A length around ``mean`` (uniform in [mean/2, 3*mean/2]), at least 1."""
    return max(1, int(rng.integers(max(1, mean // 2), mean + mean // 2 + 1)))


def _finish(rows: list[tuple[float, int, list[int], list[int], object]]) -> list[TraceRequest]:
    rows.sort(key=lambda r: (r[0], r[1]))
    return [
        TraceRequest.from_tokens(i, round(ts, 3), inp, out, session_id=sid)
        for i, (ts, _, inp, out, sid) in enumerate(rows)
    ]


def multi_turn_chat(
    seed: int = 0,
    num_sessions: int = 20,
    turns: int = 6,
    system_prompt_len: int = 400,
    user_len: int = 120,
    output_len: int = 200,
    session_rate_per_s: float = 1.0,
    think_time_s: float = 5.0,
    vocab: int = _VOCAB,
) -> list[TraceRequest]:
    """Multi-turn chat: all sessions share one system prompt; turn t's input = history + new message.
    Raises :class:`InvalidArgument` for a bad argument or a trace past :data:`MAX_REQUESTS` /
    :data:`MAX_TOKENS`, before generating anything."""
    _check_common(seed, vocab)
    for name, v in (
        ("num_sessions", num_sessions),
        ("turns", turns),
        ("system_prompt_len", system_prompt_len),
        ("user_len", user_len),
        ("output_len", output_len),
    ):
        _int_arg(name, v, 0)
    _rate_arg("session_rate_per_s", session_rate_per_s, positive=True)
    _rate_arg("think_time_s", think_time_s, positive=False)
    turn = _hi(user_len) + _hi(output_len)
    per_session = turns * system_prompt_len + turn * turns * (turns + 1) // 2 + turns * turn
    _check_size("multi_turn_chat", num_sessions * turns, num_sessions * per_session)
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_prompt_len, vocab)
    rows: list[tuple[float, int, list[int], list[int], object]] = []
    start = 0.0
    for s in range(num_sessions):
        start += rng.exponential(1000.0 / session_rate_per_s)
        ts, history = start, list(system)
        for _ in range(turns):
            inp = history + _tokens(rng, _length(rng, user_len), vocab)
            out = _tokens(rng, _length(rng, output_len), vocab)
            rows.append((ts, len(rows), inp, out, f"chat-{s}"))
            history = inp + out
            ts += rng.exponential(1000.0 * think_time_s)
    return _finish(rows)


def shared_system_prompt(
    seed: int = 0,
    num_requests: int = 100,
    num_prompts: int = 4,
    prompt_len: int = 2000,
    user_len: int = 200,
    output_len: int = 100,
    rate_per_s: float = 4.0,
    vocab: int = _VOCAB,
) -> list[TraceRequest]:
    """Single-turn requests, each starting with one of ``num_prompts`` shared system prompts.
    Argument checks as :func:`multi_turn_chat`."""
    _check_common(seed, vocab)
    _int_arg("num_prompts", num_prompts, 1)
    for name, v in (
        ("num_requests", num_requests),
        ("prompt_len", prompt_len),
        ("user_len", user_len),
        ("output_len", output_len),
    ):
        _int_arg(name, v, 0)
    _rate_arg("rate_per_s", rate_per_s, positive=True)
    per_request = _hi(prompt_len) + _hi(user_len) + _hi(output_len)
    _check_size("shared_system_prompt", num_requests + num_prompts, num_requests * per_request)
    rng = np.random.default_rng(seed)
    prompts = [_tokens(rng, _length(rng, prompt_len), vocab) for _ in range(num_prompts)]
    rows: list[tuple[float, int, list[int], list[int], object]] = []
    ts = 0.0
    for i in range(num_requests):
        ts += rng.exponential(1000.0 / rate_per_s)
        p = int(rng.integers(0, num_prompts))
        inp = prompts[p] + _tokens(rng, _length(rng, user_len), vocab)
        rows.append((ts, i, inp, _tokens(rng, _length(rng, output_len), vocab), f"prompt-{p}"))
    return _finish(rows)


def agent_loop(
    seed: int = 0,
    num_agents: int = 4,
    steps: int = 10,
    context_len: int = 8000,
    observation_len: int = 400,
    action_len: int = 80,
    agent_rate_per_s: float = 0.5,
    step_gap_s: float = 2.0,
    vocab: int = _VOCAB,
) -> list[TraceRequest]:
    """Agents re-sending a long context that grows by (action + observation) every step.
    Argument checks as :func:`multi_turn_chat`."""
    _check_common(seed, vocab)
    for name, v in (
        ("num_agents", num_agents),
        ("steps", steps),
        ("context_len", context_len),
        ("observation_len", observation_len),
        ("action_len", action_len),
    ):
        _int_arg(name, v, 0)
    _rate_arg("agent_rate_per_s", agent_rate_per_s, positive=True)
    _rate_arg("step_gap_s", step_gap_s, positive=False)
    grow = _hi(action_len) + _hi(observation_len)
    per_agent = steps * (_hi(context_len) + _hi(action_len)) + grow * steps * (steps - 1) // 2
    _check_size("agent_loop", num_agents * steps, num_agents * per_agent)
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, list[int], list[int], object]] = []
    start = 0.0
    for a in range(num_agents):
        start += rng.exponential(1000.0 / agent_rate_per_s)
        ts, context = start, _tokens(rng, _length(rng, context_len), vocab)
        for _ in range(steps):
            action = _tokens(rng, _length(rng, action_len), vocab)
            rows.append((ts, len(rows), list(context), action, f"agent-{a}"))
            context = context + action + _tokens(rng, _length(rng, observation_len), vocab)
            ts += rng.exponential(1000.0 * step_gap_s)
    return _finish(rows)


def branching_tree(
    seed: int = 0,
    num_trees: int = 2,
    depth: int = 3,
    fanout: int = 3,
    root_len: int = 1000,
    segment_len: int = 300,
    output_len: int = 50,
    gap_s: float = 0.5,
    vocab: int = _VOCAB,
) -> list[TraceRequest]:
    """Tree-of-thought: breadth-first over a ``fanout``-ary tree; each node's input = parent's + a segment.
    Argument checks as :func:`multi_turn_chat` (the node count grows as ``fanout ** depth``)."""
    _check_common(seed, vocab)
    for name, v in (
        ("num_trees", num_trees),
        ("root_len", root_len),
        ("segment_len", segment_len),
        ("output_len", output_len),
    ):
        _int_arg(name, v, 0)
    _int_arg("depth", depth, 0, 64)
    _int_arg("fanout", fanout, 0, MAX_REQUESTS)
    _rate_arg("gap_s", gap_s, positive=False)
    nodes = tokens = 0
    for d in range(depth + 2):  # the loop below also builds the prompts one level past the last
        level_nodes = fanout**d
        nodes += level_nodes if d <= depth else 0
        tokens += level_nodes * (_hi(root_len) + d * _hi(segment_len) + _hi(output_len))
        if level_nodes * num_trees > MAX_REQUESTS:
            nodes = max(nodes, level_nodes)
            break
    _check_size("branching_tree", num_trees * nodes, num_trees * tokens)
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, list[int], list[int], object]] = []
    ts = 0.0
    for t in range(num_trees):
        level = [_tokens(rng, _length(rng, root_len), vocab)]
        for _ in range(depth + 1):
            nxt: list[list[int]] = []
            for prompt in level:
                ts += rng.exponential(1000.0 * gap_s)
                rows.append(
                    (ts, len(rows), prompt, _tokens(rng, _length(rng, output_len), vocab), f"tree-{t}")
                )
                nxt.extend(prompt + _tokens(rng, _length(rng, segment_len), vocab) for _ in range(fanout))
            level = nxt
    return _finish(rows)


GENERATORS: dict[str, Callable[..., list[TraceRequest]]] = {
    "chat": multi_turn_chat,
    "system-prompt": shared_system_prompt,
    "agent": agent_loop,
    "tree": branching_tree,
}
