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

from collections.abc import Callable

import numpy as np

from mamba_radix.sim.traces import TraceRequest

__all__ = ["GENERATORS", "agent_loop", "branching_tree", "multi_turn_chat", "shared_system_prompt"]

_VOCAB = 50_000


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
    """Multi-turn chat: all sessions share one system prompt; turn t's input = history + new message."""
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
    """Single-turn requests, each starting with one of ``num_prompts`` shared system prompts."""
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
    """Agents re-sending a long context that grows by (action + observation) every step."""
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
    """Tree-of-thought: breadth-first over a ``fanout``-ary tree; each node's input = parent's + a segment."""
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
