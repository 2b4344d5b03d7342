"""Marconi (Pan et al., MLSys'25, arXiv 2411.19379), reimplemented from the paper's description (its code
is CC BY-NC: ideas only, see ``reference/anchors.md`` §1): the policy ``marconi`` of the experiment. Not the
peer preset ``marconi-static`` (:func:`mamba_radix.peers.marconi_static`), which keeps Marconi's admission but
evicts by our static ``flop_weighted`` key.

- **Admission**: at most two prefill checkpoints per prompt, at the branch point its match found and at
  the prompt's end (config ``mamba_checkpoint_admission="branch_and_end"``), a hit refreshing only the
  node it consumed (``mamba_lru_refresh="node"``, Marconi's V2).
- **Eviction** (:class:`Marconi`): candidates are the checkpoints on nodes with at most one child (a
  fork is kept). Each gets a utility ``S = norm(recency) + alpha * norm(flop_efficiency)`` where
  ``recency = 1 / (now - last access)`` and ``flop_efficiency`` = the compute a hit there saves beyond
  the nearest checkpoint above it, ``F(depth) - F(parent depth)`` with ``F(L) = L * (1 + L / c)`` (linear
  work plus attention's quadratic part, :func:`mamba_radix.eviction.saved_compute`), divided by the bytes
  the node pins: one state slot plus the KV of its whole prefix. ``norm`` is min-max over the live
  candidates, recomputed at every eviction; the lowest ``S`` goes. KV victims (unlocked leaves) use the
  same utility, leaves without a checkpoint first.
- **alpha** (:func:`tune_alpha`): Marconi's retrospective grid search, replaying a warm-up prefix of the
  trace once per alpha and keeping the one that saved the most FLOPs (Marconi's criterion; the paper's
  text says hit rate).

What is and is not equivalent: Marconi merges a single-child node into its child when it evicts its state
where we keep a tombstone (the same hits; our KV stays for branch points); its bootstrap window is five
times the requests seen before the first eviction and it tunes online from a snapshot of the tree, where
:func:`tune_alpha` replays a fixed prefix of the trace from an empty cache before the run (the same idea,
offline-equivalent for a stationary trace); our default grid is coarser (five values in [0, 2], Marconi's
is 21), for time; the FLOP model is one crossover length instead of per-layer formulas, and its
checkpoint positions are our grid positions (the branch point rounded down, the prompt's last aligned
position) where Marconi checkpoints the exact split and the last decoded token. Cost: O(candidates) per
victim (numpy over the candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from mamba_radix.config import DEFAULT_FLOP_CROSSOVER, CacheConfig
from mamba_radix.errors import InvalidArgument
from mamba_radix.peers import MARCONI_ADMISSION
from mamba_radix.policy import CachePolicy, num_device_children

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode
    from mamba_radix.sim.budget import PoolSizes
    from mamba_radix.sim.traces import TraceRequest

__all__ = ["ALPHA_GRID", "Marconi", "tune_alpha", "with_marconi_admission"]

ALPHA_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 2.0)


def with_marconi_admission(config: CacheConfig) -> CacheConfig:
    """``config`` with Marconi's admission (branch point and prompt end) and node refresh
    (:data:`mamba_radix.peers.MARCONI_ADMISSION`); its eviction order stays (the policy object evicts).
    O(1)."""
    return config.replace(**MARCONI_ADMISSION)


def _flops(depth: np.ndarray, crossover: int) -> np.ndarray:
    return depth * (1.0 + depth / crossover)


def _min_max(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return np.zeros_like(x) if hi <= lo else (x - lo) / (hi - lo)


class Marconi(CachePolicy):
    """Marconi's renormalised FLOP-aware utility (see the module docstring).

    ``alpha``: the FLOP-efficiency weight (0 = LRU among the candidates); ``bytes_per_kv_token`` /
    ``bytes_per_state_slot``: the model's, for bytes pinned; ``crossover``: tokens at which attention's
    quadratic cost equals the linear cost. Raises :class:`InvalidArgument` for a negative alpha or
    non-positive sizes.
    """

    name: ClassVar[str] = "marconi"

    def __init__(
        self,
        alpha: float,
        bytes_per_kv_token: int,
        bytes_per_state_slot: int,
        crossover: int = DEFAULT_FLOP_CROSSOVER,
    ) -> None:
        super().__init__()
        if not (isinstance(alpha, (int, float)) and alpha >= 0):
            raise InvalidArgument(f"alpha must be a number >= 0, got {alpha!r}")
        if bytes_per_kv_token < 1 or bytes_per_state_slot < 1 or crossover < 1:
            raise InvalidArgument("bytes_per_kv_token, bytes_per_state_slot and crossover must be >= 1")
        self.alpha = float(alpha)
        self.kv_bytes = bytes_per_kv_token
        self.state_bytes = bytes_per_state_slot
        self.crossover = crossover
        self.evictions = 0

    @staticmethod
    def _parent_depth(node: TreeNode) -> int:
        up = node.parent
        while up is not None and not up.is_root:
            if up.mamba_slot is not None:
                return up.depth
            up = up.parent
        return 0

    def utilities(self, nodes: Sequence[TreeNode]) -> np.ndarray:
        """``S`` of every node in ``nodes`` (all holding a checkpoint), normalised over them. O(n)."""
        assert self.tree is not None
        now = self.tree.clock + 1
        last = np.array([n.mamba_last_access for n in nodes], dtype=np.float64)
        depth = np.array([n.depth for n in nodes], dtype=np.float64)
        parent = np.array([self._parent_depth(n) for n in nodes], dtype=np.float64)
        recency = 1.0 / np.maximum(now - last, 1.0)
        saved = _flops(depth, self.crossover) - _flops(parent, self.crossover)
        efficiency = saved / (self.state_bytes + self.kv_bytes * depth)
        return _min_max(recency) + self.alpha * _min_max(efficiency)

    def _lowest(self, nodes: list[TreeNode]) -> TreeNode | None:
        if not nodes:
            return None
        self.evictions += 1
        if len(nodes) == 1:
            return nodes[0]
        scores = self.utilities(nodes)
        return nodes[int(np.argmin(scores))]

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        nodes = [n for n in index.mamba_candidates() if num_device_children(n) <= 1]
        if not nodes:
            return index.first_mamba()
        return self._lowest(nodes)

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None:
        for node in index.full_candidates():  # LRU order: a KV-only leaf (no state) goes first
            if node.mamba_slot is None:
                return node
        return self._lowest(list(index.full_candidates()))


def tune_alpha(
    config: CacheConfig,
    pools: PoolSizes,
    requests: Sequence[TraceRequest],
    grid: Sequence[float] = ALPHA_GRID,
    max_context_len: int | None = None,
) -> tuple[float, dict[float, float]]:
    """Marconi's retrospective search: replay ``requests`` (a warm-up prefix) once per alpha in ``grid``
    under ``config`` and ``pools`` (sequential) and return the alpha that saved the most FLOPs,
    ``sum F(hit)`` over the requests (ties: the smaller alpha), with every alpha's FLOPs. Side effects:
    none. Cost: ``len(grid)`` simulator runs of the prefix."""
    from mamba_radix.sim.engine import Engine, EngineOptions

    if not requests or not grid:
        raise InvalidArgument("tune_alpha needs a non-empty warm-up prefix and alpha grid")
    max_len = max_context_len or max(r.input_len + r.output_len for r in requests)
    crossover = config.mamba_flop_crossover
    saved: dict[float, float] = {}
    for alpha in grid:
        policy = Marconi(alpha, pools.bytes_per_kv_token, pools.bytes_per_state_slot, crossover)
        options = EngineOptions(mode="sequential", keep_per_request=True, verify_states=False)
        engine = Engine(config, pools, max_len, options, policy=policy)
        metrics = engine.run(requests, total=len(requests))
        hits = np.array([row["hit"] for row in metrics.per_request], dtype=np.float64)
        saved[float(alpha)] = float(_flops(hits, crossover).sum())
    best = max(saved, key=lambda a: (saved[a], -a))
    return best, saved
