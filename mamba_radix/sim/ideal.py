"""The infinite-capacity ideal: the most any prefix cache could hit on a trace.

For request ``i`` the ideal hit is the longest common prefix between its input and any sequence an earlier
request left in the cache (its input plus all but the last output token, whose KV is never computed),
capped at ``input_len - 1`` because the scheduler matches ``input[:-1]`` (one token must be computed for the
logits). It ignores checkpoints and memory, so it is an upper bound for every strategy and budget: a pure
KV cache with unlimited memory and a state at every token would reach it.

Two exact implementations, chosen by the trace format:

- :class:`BlockPrefixIdeal` (block traces): a trie over block ids; each node remembers the longest input
  that passed through it. Two expanded inputs agree at position ``p`` exactly when their block chains agree
  up to block ``p // block_size``, so the token LCP is ``min(c * block_size, len_i, len_k)`` for ``c``
  shared blocks. O(blocks) per request, a few bytes per distinct block.
- :class:`TokenPrefixIdeal` (token traces): the sequences in lexicographic order; the longest common prefix
  with any member of a set is reached at one of the two neighbours of the insertion point. Tokens are
  packed as big-endian uint64 bytes so comparisons run in C. O(log n + len) per request, 8 bytes per token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from mamba_radix.sim.traces import TraceRequest

__all__ = ["BlockPrefixIdeal", "IdealHit", "TokenPrefixIdeal", "ideal_for"]


class IdealHit:
    """Interface: ``observe(req) -> ideal hit tokens`` for each request in trace order (then remembers it)."""

    def observe(self, req: TraceRequest) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class BlockPrefixIdeal(IdealHit):
    """Longest-prefix ideal over block chains (outputs of a block trace are never shared)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._child: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node
        self._max_len: list[int] = [0]  # per node: longest input through it; node 0 is the root

    def observe(self, req: TraceRequest) -> int:
        """The ideal hit of ``req``, then ``req`` remembered: one walk down the trie, matching while the
        chain exists and creating nodes from where it ends. O(blocks)."""
        assert req.block_ids is not None, "BlockPrefixIdeal needs block-format requests"
        length = req.input_len
        child, max_len, block_size = self._child, self._max_len, self.block_size
        node, depth, best, matching = 0, 0, 0, True
        for b in req.block_ids:
            key = (node, b)
            nxt = child.get(key)
            if nxt is None:
                matching = False
                nxt = child[key] = len(max_len)
                max_len.append(0)
            elif matching:  # read before this request raises it below
                depth += 1
                best = min(depth * block_size, length, max_len[nxt])
            node = nxt
            if max_len[node] < length:
                max_len[node] = length
        return min(best, length - 1)


def _pack(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype=">u8").tobytes()


def _lcp_tokens(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b)) // 8
    if n == 0:
        return 0
    x = np.frombuffer(a, dtype=">u8", count=n)
    y = np.frombuffer(b, dtype=">u8", count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


class TokenPrefixIdeal(IdealHit):
    """Longest-prefix ideal over token sequences (inputs and generated outputs)."""

    def __init__(self) -> None:
        self._sorted: list[bytes] = []

    def observe(self, req: TraceRequest) -> int:
        key = _pack(req.input_ids)
        pos = bisect.bisect_left(self._sorted, key)
        best = 0
        for j in (pos - 1, pos):
            if 0 <= j < len(self._sorted):
                best = max(best, _lcp_tokens(key, self._sorted[j]))
        hit = min(best, req.input_len - 1)
        cached = req.input_ids + req.output_ids[:-1]
        bisect.insort(self._sorted, _pack(cached))
        return hit


def ideal_for(req: TraceRequest) -> IdealHit:
    """The right ideal for the trace ``req`` (its first request) comes from."""
    if req.block_ids is not None:
        return BlockPrefixIdeal(req.block_size)
    return TokenPrefixIdeal()
