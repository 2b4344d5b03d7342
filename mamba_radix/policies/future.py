"""The trace pre-pass of the offline policies: who will use which checkpoint, and when (:class:`FutureIndex`).

An offline policy knows the whole trace. What it needs to know about the future is, for a checkpoint at
``depth`` tokens whose prefix has fingerprint ``fp`` (``node.prefix_fp``, see
:mod:`mamba_radix.state_stamp`), the next request after now that would use it. "Use" has two levels:

- an **exact** use by request ``j``: the checkpoint is ``j``'s *demand*, the deepest checkpoint ``j``
  hits when nothing is ever evicted (the hit of ``j`` in an infinite-capacity replay of the same trace
  under the same config, :func:`demand_hits`). Keeping every checkpoint alive from its creation to its
  last exact use reproduces the infinite-capacity hit rate (when KV suffices);
- a **fallback** use by ``j``: the checkpoint lies on ``j``'s matched path below its demand (every
  multiple of the checkpoint grid up to the demand is indexed), so ``j`` would hit it if its demand were
  gone.

Both come from one pass over the requests: per request one vectorised
:class:`~mamba_radix.sim.stamps.PrefixFingerprints` (O(input length)), then O(1) per indexed position.
The index holds one entry per (request, grid position up to its demand): about ``total hit tokens /
grid`` entries (125k for the first 2,000 Mooncake conversation requests). Queries are a dict look-up
plus a bisection, O(log uses).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument
from mamba_radix.sim.traces import TraceRequest
from mamba_radix.state_stamp import PrefixFingerprints

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.request import Req

__all__ = ["NEVER", "FutureIndex", "RequestFingerprints", "demand_hits"]

NEVER = 1 << 62  # "no further use": farther than any request index


def demand_hits(config: CacheConfig, requests: Sequence[TraceRequest], model: str = "kimi-k3") -> list[int]:
    """The hit of every request (tokens, by trace index) in a sequential replay of ``requests`` under
    ``config`` with pools no trace of this size can fill (nothing is ever evicted): each request's demand.

    Side effects: none outside the process. Cost: one simulator run, O(total tokens) plus the cache's work.
    """
    from mamba_radix.sim.budget import infinite_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    if not requests:
        return []
    in_tok = sum(r.input_len for r in requests)
    out_tok = sum(r.output_len for r in requests)
    pools = infinite_pools(config, in_tok, out_tok, len(requests), model)
    max_len = max(r.input_len + r.output_len for r in requests)
    options = EngineOptions(
        mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=8
    )
    engine = Engine(config, pools, max_len, options)
    metrics = engine.run(requests, total=len(requests))
    hits = [0] * (max(r.index for r in requests) + 1)
    for row in metrics.per_request:
        hits[row["index"]] = row["hit"]
    return hits


@dataclass(frozen=True)
class Use:
    """The next use of a checkpoint after some request: its request index (or :data:`NEVER`) and level."""

    at: int
    exact: bool


class FutureIndex:
    """For every (depth, prefix fingerprint) a later request may hit: the requests that would, in order.

    ``requests`` in trace order (``index`` = position); ``hits[i]``: request ``i``'s demand depth
    (:func:`demand_hits`; 0 = none); ``grid``: the spacing of fallback positions indexed below a demand
    (the config's checkpoint grid). Raises :class:`InvalidArgument` if ``hits`` is shorter than the trace
    or ``grid < 1``. O(sum of input lengths + sum(hits) / grid) time and entries.
    """

    def __init__(self, requests: Sequence[TraceRequest], hits: Sequence[int], grid: int) -> None:
        if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
            raise InvalidArgument(f"grid must be an int >= 1 (tokens), got {grid!r}")
        self.grid = grid
        self._exact: dict[tuple[int, int], list[int]] = {}
        self._path: dict[tuple[int, int], list[int]] = {}
        self.requests = {r.index: r for r in requests}
        for req in requests:  # trace order: every list is built sorted
            if req.index >= len(hits):
                raise InvalidArgument(
                    f"hits has {len(hits)} entries but the trace has request index {req.index}; pass "
                    "demand_hits() of the same requests"
                )
            depth = int(hits[req.index])
            if depth <= 0:
                continue
            fps = PrefixFingerprints(req.input_array()[:depth])
            self._exact.setdefault((depth, fps.at(depth)), []).append(req.index)
            for d in range(grid, depth + 1, grid):
                self._path.setdefault((d, fps.at(d)), []).append(req.index)
        self.num_entries = sum(len(v) for v in self._path.values()) + sum(
            len(v) for v in self._exact.values()
        )

    @staticmethod
    def _after(uses: list[int] | None, now: int) -> int:
        if not uses:
            return NEVER
        i = bisect.bisect_right(uses, now)
        return uses[i] if i < len(uses) else NEVER

    def next_exact(self, depth: int, fp: int, now: int) -> int:
        """The first request after ``now`` whose demand is this checkpoint, or :data:`NEVER`. O(log n)."""
        return self._after(self._exact.get((depth, fp)), now)

    def next_path(self, depth: int, fp: int, now: int) -> int:
        """The first request after ``now`` with this checkpoint on its path up to its demand (exact uses
        included when ``depth`` is on the grid), or :data:`NEVER`. O(log n)."""
        return min(self._after(self._path.get((depth, fp)), now), self.next_exact(depth, fp, now))

    def next_use(self, depth: int, fp: int, now: int) -> Use:
        """The next exact use if there is one, else the next fallback use (``exact=False``). O(log n)."""
        exact = self.next_exact(depth, fp, now)
        if exact != NEVER:
            return Use(exact, True)
        return Use(self.next_path(depth, fp, now), False)

    def demanded_after(self, depth: int, fp: int, now: int) -> bool:
        """Whether any request after ``now`` uses this checkpoint, exactly or as a fallback. O(log n)."""
        return self.next_path(depth, fp, now) != NEVER


class RequestFingerprints:
    """Prefix fingerprints of the request being handed over, for policies that look its positions up in a
    pre-pass: built once per request (input then output tokens) and again only when it grew. One vectorised
    pass per build; :meth:`at` is O(1)."""

    def __init__(self) -> None:
        self._rid: object = None
        self._len = -1
        self._fps: PrefixFingerprints | None = None

    def of(self, req: Req, seq_len: int) -> PrefixFingerprints:
        """The fingerprints of ``req``'s tokens, covering at least its first ``seq_len``."""
        if self._fps is None or self._rid != req.rid or self._len < seq_len:
            tokens = np.concatenate(  # the prompt may be a list or an array('q')
                (np.asarray(req.origin_input_ids, dtype=np.int64), np.asarray(req.output_ids, dtype=np.int64))
            )
            self._rid, self._len, self._fps = req.rid, len(tokens), PrefixFingerprints(tokens)
        return self._fps

    def at(self, req: Req, seq_len: int) -> int:
        """The fingerprint of ``req``'s first ``seq_len`` tokens."""
        return self.of(req, seq_len).at(seq_len)
