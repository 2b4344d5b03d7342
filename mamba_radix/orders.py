"""The eviction orders: the sort key of each kind of candidate (:class:`CheckpointOrder`,
:func:`full_evict_key`). Every key is a tuple ending with the node id, so every order is total and
deterministic and no wall-clock time is involved; smallest goes first. Which nodes are candidates, and
how the sets are kept, is :mod:`mamba_radix.eviction`'s.

- **full KV** (unlocked leaves): ``(last_access, -depth, id)``: least recently used first, the deeper of
  two equally old leaves first.
- **checkpoints**: ``(class, stamp, depth rank, id)`` by ``mamba_eviction_order``:

  - ``leaf_first``: ``(0, mamba_last_access, -depth, id)``, LRU with the deepest of a tie first;
  - ``root_first``: ``(0, mamba_last_access, depth, id)``, LRU with the shallowest of a tie first;
  - ``mixed``: first class 0, the checkpoints a running request left behind on its own locked KV path
    (``full_lock_ref > 0``: the KV is locked, the superseded checkpoint is not), shallowest first
    whatever their age: ``(0, 0, depth, id)``; then class 1, everything else, LRU with leaf-first ties:
    ``(1, mamba_last_access, -depth, id)``;
  - ``flop_weighted``: ``(0, score, -depth, id)``, lowest score first, where
    ``score = mamba_last_access + w * log2(F(depth))`` (held as an integer in 1/1024 ticks).

``flop_weighted`` (the idea is Marconi's, MLSys'25, reference/anchors.md §1.2, in our own words and
code): prefer keeping the checkpoints that save more compute per byte. Every checkpoint costs the same
bytes (one state slot; its KV is evicted separately, leaf-first LRU), so per byte is per checkpoint.
A hit on a checkpoint at depth ``L`` tokens spares recomputing that prefix: linear work (SSM, MLP,
projections) grows with ``L``, attention's with ``L^2``, so in units of one token's linear cost
``F(L) = L * (1 + L / c)``, ``c`` being ``mamba_flop_crossover``, the length at which the two are equal.
The exchange rate ``w = mamba_flop_weight`` is a half-life: if a checkpoint last used ``age`` ticks ago
is reused with probability proportional to ``2^(-age / w)``, its expected saving is
``F(L) * 2^(-(now - stamp) / w)``, and ranking by that is ranking by ``stamp + w * log2 F(L)`` (take
``log2``, multiply by ``w``, drop the common ``now``). So the key is static, exact under that model, and
one doubling of saved compute buys ``w`` ticks of life; ``w = 0`` is LRU with leaf-first ties.

What it is not: Marconi scores ``a * norm(FLOP efficiency) + norm(1 / age)`` with both terms min-max
normalised over the live candidates at every eviction (an O(n) rebuild per victim), measures the saving
relative to the nearest checkpointed ancestor and per byte of the whole prefix's KV plus state, and tunes
``a`` online by replaying a bootstrap window. Ours is a static approximation of that: an absolute
saving (versus a miss, so a key never depends on other nodes), a fixed exchange rate, and O(log n) per
update like every other order.

``depth`` is in tokens and never changes for an existing node (a split keeps the child's end), and every
key is non-decreasing in the node's stamps: so a key only changes when a stamp, a lock or the leaf status
changes, and never goes down with a stamp (the index's lazy stamps rely on it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from mamba_radix.config import DEFAULT_FLOP_CROSSOVER, DEFAULT_FLOP_WEIGHT, EVICTION_ORDERS
from mamba_radix.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig, EvictionOrder
    from mamba_radix.node import TreeNode

__all__ = [
    "FLOP_SCORE_SCALE",
    "CheckpointOrder",
    "flop_score",
    "full_evict_key",
    "mamba_evict_key",
    "saved_compute",
]

FLOP_SCORE_SCALE = 1024  # flop_weighted scores are integers in 1/1024 of a clock tick


@dataclass(frozen=True)
class CheckpointOrder:
    """The checkpoint victim order in force: ``mamba_eviction_order`` and, for ``flop_weighted``, its
    exchange rate (``mamba_flop_weight``) and attention crossover length (``mamba_flop_crossover``)."""

    name: EvictionOrder = "leaf_first"
    flop_weight: float = DEFAULT_FLOP_WEIGHT
    flop_crossover: int = DEFAULT_FLOP_CROSSOVER

    def __post_init__(self) -> None:
        if self.name not in EVICTION_ORDERS:
            raise ConfigError(
                f"eviction order must be one of {', '.join(EVICTION_ORDERS)}, got {self.name!r}"
            )
        weight = self.flop_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
            raise ConfigError(f"flop_weight must be a finite number >= 0, got {weight!r}")
        crossover = self.flop_crossover
        if isinstance(crossover, bool) or not isinstance(crossover, int) or crossover < 1:
            raise ConfigError(f"flop_crossover must be an integer >= 1, got {crossover!r}")
        # the order's key function, chosen once: an update computes keys tens of thousands of times
        object.__setattr__(self, "key_of", _order_key(self))

    key_of: Callable[[TreeNode], tuple[int, ...]] = field(init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: CacheConfig) -> CheckpointOrder:
        return cls(config.mamba_eviction_order, config.mamba_flop_weight, config.mamba_flop_crossover)


def full_evict_key(node: TreeNode) -> tuple[int, ...]:
    return (node.last_access, -node.depth, node.id)


def saved_compute(depth: int, crossover: int) -> float:
    """Compute a hit at ``depth`` tokens spares, in units of one token's linear cost:
    ``depth * (1 + depth / crossover)`` (linear part plus the quadratic attention part). O(1)."""
    return depth * (1 + depth / crossover)


def flop_score(stamp: int, depth: int, weight: float, crossover: int) -> int:
    """``flop_weighted``'s static score in 1/:data:`FLOP_SCORE_SCALE` ticks:
    ``stamp + weight * log2(saved_compute(depth, crossover))``, rounded. Lowest goes first. O(1)."""
    log_saving = math.log2(max(depth, 1)) + math.log2(1 + max(depth, 1) / crossover)
    return stamp * FLOP_SCORE_SCALE + round(weight * log_saving * FLOP_SCORE_SCALE)


def mamba_evict_key(order: EvictionOrder | CheckpointOrder, node: TreeNode) -> tuple[int, ...]:
    """The key ``node``'s checkpoint is ordered by (``order``: a name, with default ``flop_weighted``
    parameters, or a :class:`CheckpointOrder`). O(1)."""
    spec = order if isinstance(order, CheckpointOrder) else CheckpointOrder(order)
    return spec.key_of(node)


def _leaf_first_key(node: TreeNode) -> tuple[int, ...]:
    return (0, node.mamba_last_access, -node.depth, node.id)


def _root_first_key(node: TreeNode) -> tuple[int, ...]:
    return (0, node.mamba_last_access, node.depth, node.id)


def _flop_weighted_key(weight: float, crossover: int, node: TreeNode) -> tuple[int, ...]:
    score = flop_score(node.mamba_last_access, node.depth, weight, crossover)
    return (0, score, -node.depth, node.id)


def _mixed_key(node: TreeNode) -> tuple[int, ...]:
    if node.full_lock_ref > 0:  # class 0: a running request's superseded checkpoint
        return (0, 0, node.depth, node.id)
    return (1, node.mamba_last_access, -node.depth, node.id)


def _order_key(spec: CheckpointOrder) -> Callable[[TreeNode], tuple[int, ...]]:
    """The key function of ``spec``'s order (module-level functions: a spec stays picklable)."""
    if spec.name == "leaf_first":
        return _leaf_first_key
    if spec.name == "root_first":
        return _root_first_key
    if spec.name == "flop_weighted":
        return partial(_flop_weighted_key, spec.flop_weight, spec.flop_crossover)
    return _mixed_key
