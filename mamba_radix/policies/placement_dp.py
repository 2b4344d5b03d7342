"""Exact static checkpoint placement under a budget: a dynamic program over a prefix forest.

The problem
-----------
A static set of prefixes is a forest of candidate checkpoint positions (:class:`PrefixForest`): node ``v``
is a prefix of ``depth[v]`` tokens (a position a state could be stored at), its parent the next shallower
candidate on the same prefix, the root (index ``-1``) the empty prefix. Each node carries a weight
``weight[v] >= 0``: how many requests (or how much probability) have ``v`` as the deepest candidate they may
use. A *placement* is a set ``S`` of at most ``B`` nodes; a request ending at ``v`` resumes from the deepest
node of ``S`` on the root path of ``v`` (``v`` included) and gains that node's depth in tokens (0 if none).
:func:`optimal_placement` maximises ``value(S) = sum_v weight[v] * depth(deepest chosen ancestor-or-self)``.
Adding a node never lowers the value, so "at most ``B``" and "exactly ``min(B, n)``" have the same optimum.

Source. This is the problem of arXiv 2605.05219 (Shirokikh and Nikolenko, "Sparse Prefix Caching for
Hybrid and Recurrent LLM Serving", 2026): checkpoints at a sparse set of positions, a hit resumes from the
deepest stored one, placement under a distribution over overlap depths, solved by an exact ``O(NM)``
dynamic program (``N`` positions, ``M`` checkpoints). Only the paper's abstract was reachable when this was
written; the recurrences below are derived here, not taken from it. Its single retained entry is a chain
(:func:`chain_placement`); a trie of many prefixes is the generalisation (:func:`optimal_placement`).

The chain, ``O(N * B)``
-----------------------
Nodes ``1..N`` on one path with depths ``x_1 < ... < x_N`` and tail weights ``T_j = sum_{k >= j} w_k``. For
``S = {s_1 < ... < s_m}`` the value telescopes: ``value(S) = sum_k (x_{s_k} - x_{s_{k-1}}) * T_{s_k}``
(``x_{s_0} = 0``): every request at or below ``s_k`` gains the extra ``x_{s_k} - x_{s_{k-1}}`` tokens. So
with ``f[m][j]`` the best value of ``m`` checkpoints the deepest of which is ``j``,

    f[m][j] = x_j T_j + max_{i < j} ( f[m-1][i] - x_i T_j ),     f[0][0] = 0 (the root, x_0 = 0).

The inner max is a query at ``T_j`` over lines of slope ``-x_i``; the slopes fall as ``i`` grows and the
queries ``T_j`` never rise as ``j`` grows, so a monotone convex-hull deque answers each in amortised O(1):
``O(N)`` per layer, ``O(N * min(N, B))`` time and ``O(N * min(N, B))`` back-pointers.

The forest, ``O(h * n * min(n, B))``
------------------------------------
On a branching trie the gain of a node depends on the nearest chosen ancestor, so that ancestor is the DP's
state. For node ``v`` and ``a`` one of its proper ancestors (the root included, rows indexed by level),
``dp[v][a][b]`` is the best total over the requests ending in the subtree of ``v`` with at most ``b``
checkpoints there, given that the deepest chosen node above ``v`` is ``a``:

    dp[v][a][b] = max( weight[v] * depth[a] + (max-plus over children c of dp[c][a])[b],       v not chosen
                       weight[v] * depth[v] + (max-plus over children c of dp[c][v])[b - 1] )  v chosen

The max-plus (knapsack) merge of the children is capped at ``min(subtree size, B)`` per table, so merging
all children costs ``O(n * min(n, B))`` per ancestor row (the classic tree-knapsack bound), and each node
has at most ``h`` rows (``h`` = the deepest level): ``O(h * n * min(n, B))`` time, done as numpy row
operations (``O(n * min(n, B))`` Python steps). The tables stay for the reconstruction: memory
``sum_v level(v) * min(size(v), B)`` floats, refused past :data:`MAX_TABLE_ENTRIES`. A subtree under the
root that is a path goes through the chain program instead (a conversation's turns are such chains).
The brute force over all placements (``property_tests/test_policies_dp.py``) checks both.

What it bounds
--------------
The DP is a *static* placement: no time dimension, one set of checkpoints for the whole trace. For a trace
(:func:`forest_from_trace`) a request's deepest usable node is its *demand* (its hit when nothing is ever
evicted: the deepest checkpoint an earlier request created on its path), the other nodes on its path are
the created checkpoints below the demand. Then, at ``K`` checkpoints the tree may hold:

- ``static(K) <= dynamic optimum(K)`` wherever the placement is realisable: keeping one fixed set and
  declining every other hand-over is one schedule among those a dynamic policy may follow.
  :class:`StaticPlacement` runs it in the simulator, at exactly the program's value where checkpoint
  positions do not move (:func:`aligned_trie_trace`); where they move the run can fall short of the
  program's value, so there ``static(K)`` is the optimum of the static model, not of the simulator
  (:func:`forest_from_trace` says why);
- every policy, online or offline, is ``<= dynamic optimum(K)``, and ``static(infinite)`` = the
  infinite-capacity ideal = ``dynamic optimum(infinite)`` (less :func:`forest_from_trace`'s causality
  drops, none on aligned tries);
- between ``static(K)`` and an online policy or the Belady oracle there is no order in general: a dynamic
  policy can beat every static set (a working set that moves), and a static set can beat a heuristic
  dynamic one. Only where the oracle is optimal (one equal-value demand per request, no fallbacks: paging
  with bypass, :mod:`mamba_radix.policies.oracle`) does ``oracle(K) >= static(K)`` follow.

:func:`exhaustive_dynamic_optimum` computes the dynamic optimum of the aligned-trie model by search, for the
small cases the tests cross-check all of these on. ``K`` is the tree's room: ``slots - 1`` under
``no_buffer`` (one live slot per running request), ``slots - slots_per_request`` under extra_buffer in
sequential replay (no placement of that size was ever evicted in ``experiments/dp_check.py``).

Measured (``python experiments/dp_check.py``, 30 random aligned tries of 12 requests, K = 2, 3, 4): the
oracle reaches 0.934 / 0.967 / 0.993 of the dynamic optimum, the static optimum 0.879 / 0.910 / 0.951;
no policy of the registry exceeded the dynamic optimum or the oracle, online policies did beat the static
optimum on the synthetic multi-turn chat (sessions move), and the static optimum beat the oracle in 6 of
the 90 cases (MIN keeps a 64-token exact demand used sooner
over a 128-token fallback used later: ``test_a_static_placement_beats_the_oracle_on_a_trie_with_fallbacks``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from mamba_radix.errors import InvalidArgument
from mamba_radix.policies.future import RequestFingerprints
from mamba_radix.policy import CachePolicy
from mamba_radix.state_stamp import PrefixFingerprints

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.request import Req
    from mamba_radix.sim.traces import TraceRequest

__all__ = [
    "MAX_TABLE_ENTRIES",
    "Placement",
    "PrefixForest",
    "StaticPlacement",
    "aligned_trie_trace",
    "chain_placement",
    "exhaustive_dynamic_optimum",
    "forest_from_trace",
    "optimal_placement",
    "placement_value",
    "static_placement_policy",
]

ROOT = -1
# the forest DP keeps every table for the reconstruction: refuse past this many floats (~0.8 GB)
MAX_TABLE_ENTRIES = 100_000_000
# the exhaustive dynamic search: refuse past this many memoised states
MAX_SEARCH_STATES = 2_000_000


class PrefixForest:
    """Candidate checkpoint positions of a static prefix set, as a forest under the empty prefix.

    ``parent[v]``: the index of the next shallower candidate on ``v``'s prefix, or ``-1`` (the root);
    parents come before children (``parent[v] < v``). ``depth[v]``: tokens, deeper than the parent's
    (the root is 0). ``weight[v] >= 0``: the weight of the requests whose deepest usable candidate is ``v``.
    ``key[v]`` (optional): what identifies the position outside the forest (``(depth, prefix fingerprint)``
    for :class:`StaticPlacement`). Raises :class:`InvalidArgument` if any of that fails; O(n).
    """

    def __init__(
        self,
        parent: Sequence[int],
        depth: Sequence[int],
        weight: Sequence[float],
        key: Sequence[Hashable] | None = None,
    ) -> None:
        n = len(parent)
        if len(depth) != n or len(weight) != n or (key is not None and len(key) != n):
            raise InvalidArgument(
                f"parent, depth, weight (and key) must have one entry per node; got {n}, {len(depth)}, "
                f"{len(weight)}" + ("" if key is None else f", {len(key)}")
            )
        for v in range(n):
            p = parent[v]
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -1 <= p < v:
                raise InvalidArgument(
                    f"parent[{v}] = {p!r}: must be -1 (the root) or an earlier node's index (parents first)"
                )
            d = depth[v]
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
                raise InvalidArgument(f"depth[{v}] = {d!r} must be an int (tokens)")
            above = 0 if p == ROOT else depth[p]
            if d <= above:
                raise InvalidArgument(
                    f"depth[{v}] = {d} must exceed its parent's depth {above}: a child is a longer prefix"
                )
            w = weight[v]
            if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not w >= 0:
                raise InvalidArgument(f"weight[{v}] = {w!r} must be a number >= 0")
        self.parent = tuple(int(p) for p in parent)
        self.depth = tuple(int(d) for d in depth)
        self.weight = tuple(weight)
        self.key = None if key is None else tuple(key)
        self.children: list[list[int]] = [[] for _ in range(n)]
        self.roots: list[int] = []
        for v, p in enumerate(self.parent):
            (self.roots if p == ROOT else self.children[p]).append(v)

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def ideal_value(self) -> float:
        """Every node chosen: each request gains its own depth (the infinite-capacity value). O(n)."""
        return sum(w * d for w, d in zip(self.weight, self.depth, strict=True))


def placement_value(forest: PrefixForest, chosen: Iterable[int]) -> float:
    """``value(S)``: the weight-times-depth of each node's deepest chosen ancestor-or-self. O(n).

    Raises :class:`InvalidArgument` for an index outside the forest."""
    picked = set(chosen)
    for v in picked:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < len(forest):
            raise InvalidArgument(f"chosen node {v!r} is not an index of this {len(forest)}-node forest")
    served = [0] * len(forest)  # depth of the deepest chosen ancestor-or-self
    total: float = 0
    for v in range(len(forest)):  # parents first
        p = forest.parent[v]
        served[v] = forest.depth[v] if v in picked else (0 if p == ROOT else served[p])
        total += forest.weight[v] * served[v]
    return total


@dataclass(frozen=True)
class Placement:
    """An optimal placement: ``values[b]`` the optimum with at most ``b`` checkpoints (``b = 0..budget``;
    nondecreasing), ``chosen`` one optimal set for the full budget, ``value = values[budget]``."""

    value: float
    chosen: frozenset[int]
    values: tuple[float, ...]
    budget: int


def _check_budget(budget: int) -> None:
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise InvalidArgument(f"budget must be an int >= 0 (checkpoints), got {budget!r}")


# ------------------------------------------------------------------------------------------------ chain
def _chain_tables(
    depths: Sequence[int], weights: Sequence[float], budget: int, base: float = 0
) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """The chain program on positions ``0..N-1`` (depths strictly rising, measured from ``base``).

    Returns ``best[m]`` (at most ``m`` checkpoints, m = 0..min(N, budget)), the back-pointers ``prev[m][j]``
    (-1 = root) and the layers ``f[m][j]``. O(N * min(N, budget))."""
    n = len(depths)
    top = min(n, budget)
    tail = [0.0] * (n + 1)
    for j in range(n - 1, -1, -1):
        tail[j] = tail[j + 1] + weights[j]
    x = [d - base for d in depths]
    neg = float("-inf")
    layers: list[list[float]] = [[]]
    prev: list[list[int]] = [[]]
    best = [0.0]
    last: list[float] | None = None  # f[m-1][*]; None for m - 1 = 0 (only the root)
    for _m in range(1, top + 1):
        f = [neg] * n
        back = [-1] * n
        # the hull holds lines (slope -x_i, intercept f[m-1][i], i), slopes falling front to back
        hull: list[tuple[float, float, int]] = []
        head = 0
        if last is None:
            hull.append((0.0, 0.0, -1))
        for j in range(n):
            if last is not None and j >= 1 and last[j - 1] > neg:
                line = (-x[j - 1], last[j - 1], j - 1)
                while len(hull) - head >= 2:
                    (k1, b1, _), (k2, b2, _) = hull[-2], hull[-1]
                    k3, b3, _ = line
                    # the middle line is never the max iff its crossing with the new one is at or
                    # beyond its crossing with the older one (all slopes distinct: depths rise)
                    if (b3 - b2) * (k1 - k2) >= (b2 - b1) * (k2 - k3):
                        hull.pop()
                    else:
                        break
                hull.append(line)
                head = min(head, len(hull) - 1)
            if len(hull) - head == 0:
                continue
            q = tail[j]
            # queries never rise: the optimum only moves towards newer (flatter) lines
            while len(hull) - head >= 2 and hull[head + 1][0] * q + hull[head + 1][1] >= (
                hull[head][0] * q + hull[head][1]
            ):
                head += 1
            k, b, i = hull[head]
            f[j] = x[j] * q + k * q + b
            back[j] = i
        layers.append(f)
        prev.append(back)
        best.append(max(best[-1], max(f)))
        last = f
    return best, prev, layers


def _chain_choice(prev: list[list[int]], layers: list[list[float]], m: int) -> list[int]:
    """Positions of the best placement with at most ``m`` checkpoints (by the back-pointers). O(m + N)."""
    # the best layer with at most m: the smallest one reaching the maximum
    target = max(max(layers[k]) for k in range(1, m + 1)) if m >= 1 else 0.0
    if m == 0 or target <= 0:
        return []
    k = next(k for k in range(1, m + 1) if max(layers[k]) == target)
    j = max(range(len(layers[k])), key=lambda i: layers[k][i])
    out = []
    while j != -1 and k >= 1:
        out.append(j)
        j, k = prev[k][j], k - 1
    return out[::-1]


def chain_placement(depths: Sequence[int], weights: Sequence[float], budget: int) -> Placement:
    """The optimum on one chain of positions (the paper's single retained entry): ``depths`` strictly
    rising (tokens, > 0), ``weights[j]`` the weight of requests whose deepest usable position is ``j``.
    ``chosen`` holds positions' indices. Raises :class:`InvalidArgument` on bad input. O(N * min(N, B))."""
    _check_budget(budget)
    forest = PrefixForest([j - 1 for j in range(len(depths))], list(depths), list(weights))  # validates
    best, prev, layers = _chain_tables(forest.depth, forest.weight, budget)
    values = tuple(best[min(b, len(best) - 1)] for b in range(budget + 1))
    chosen = frozenset(_chain_choice(prev, layers, min(budget, len(depths))))
    return Placement(values[-1], chosen, values, int(budget))


# ----------------------------------------------------------------------------------------------- forest
def _maxplus(x: np.ndarray, y: np.ndarray, cap: int) -> np.ndarray:
    """Row-wise max-plus convolution ``out[r][b] = max_{i+j=b} x[r][i] + y[r][j]`` for ``b <= cap``.
    O(rows * |x| * |y|) numpy work, min(|x|, |y|) Python steps."""
    if x.shape[1] > y.shape[1]:
        x, y = y, x
    width = min(x.shape[1] + y.shape[1] - 1, cap + 1)
    out = np.full((x.shape[0], width), -np.inf)
    for i in range(min(x.shape[1], width)):
        span = min(y.shape[1], width - i)
        np.maximum(out[:, i : i + span], x[:, i : i + 1] + y[:, :span], out=out[:, i : i + span])
    return out


def _subtree_nodes(forest: PrefixForest, top: int) -> list[int]:
    out, stack = [], [top]
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(forest.children[v])
    return out


class _ForestDP:
    """The forest program of the module docstring for one subtree under the root (rows: ancestor levels)."""

    def __init__(self, forest: PrefixForest, top: int, budget: int) -> None:
        self.forest = forest
        self.budget = budget
        nodes = sorted(_subtree_nodes(forest, top))  # parents first
        self.level: dict[int, int] = {}
        self.anc_depth: dict[int, np.ndarray] = {}  # depths of the rows: ancestors, root = row 0
        for v in nodes:
            p = forest.parent[v]
            if p == ROOT:
                self.level[v], self.anc_depth[v] = 1, np.zeros(1)
            else:
                self.level[v] = self.level[p] + 1
                self.anc_depth[v] = np.append(self.anc_depth[p], forest.depth[p])
        size = dict.fromkeys(nodes, 1)
        for v in reversed(nodes):
            if forest.parent[v] != ROOT:
                size[forest.parent[v]] += size[v]
        entries = sum(self.level[v] * (min(size[v], budget) + 1) for v in nodes)
        if entries > MAX_TABLE_ENTRIES:
            raise InvalidArgument(
                f"the placement tables of this subtree would take {entries:,} floats (limit "
                f"{MAX_TABLE_ENTRIES:,}): lower the budget, coarsen the candidate positions, or split the trace"
            )
        self.table: dict[int, np.ndarray] = {}
        for v in reversed(nodes):  # children first
            self.table[v] = self._node(v)
        self.top = top

    def _merged(self, v: int, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The children of ``v`` merged for the given rows of the children's tables, with the prefixes."""
        merged = np.zeros((len(rows), 1))
        prefixes = [merged]
        for c in self.forest.children[v]:
            merged = _maxplus(merged, self.table[c][rows], self.budget)
            prefixes.append(merged)
        return merged, prefixes

    def _node(self, v: int) -> np.ndarray:
        level, w, d = self.level[v], self.forest.weight[v], self.forest.depth[v]
        merged, _ = self._merged(v, np.arange(level + 1))  # rows: v's ancestors, then v itself
        width = min(merged.shape[1] + 1, self.budget + 1)
        out = np.full((level, width), -np.inf)
        out[:, : merged.shape[1]] = w * self.anc_depth[v][:, None] + merged[:level, :width]
        if width > 1:  # v chosen: the children see v as their nearest chosen ancestor
            chosen = w * d + merged[level, : width - 1]
            np.maximum(out[:, 1:], chosen[None, :], out=out[:, 1:])
        np.maximum.accumulate(out, axis=1, out=out)  # "at most b"
        return out

    def choose(self, v: int, row: int, b: int, into: set[int]) -> None:
        """Add to ``into`` an optimal set for the subtree of ``v`` with nearest chosen ancestor ``row`` and
        at most ``b`` checkpoints (recomputes the merges on the way down: O(subtree work) for one row)."""
        stack = [(v, row, b)]
        while stack:
            v, row, b = stack.pop()
            level, w = self.level[v], self.forest.weight[v]
            b = min(b, self.table[v].shape[1] - 1)
            merged, prefixes = self._merged(v, np.array([row, level]))
            skip = w * self.anc_depth[v][row] + merged[0, min(b, merged.shape[1] - 1)]
            take = (
                w * self.forest.depth[v] + merged[1, min(b - 1, merged.shape[1] - 1)] if b >= 1 else -np.inf
            )
            if take > skip:
                into.add(v)
                which, child_row, left = 1, level, b - 1
            else:
                which, child_row, left = 0, row, b
            children = self.forest.children[v]
            for k in range(len(children) - 1, -1, -1):  # split the budget, last child first
                before = prefixes[k][which]
                mine = self.table[children[k]][child_row]
                left = min(left, prefixes[k + 1].shape[1] - 1)
                lo = max(0, left - (len(mine) - 1))
                hi = min(left, len(before) - 1)
                split = max(range(lo, hi + 1), key=lambda i: before[i] + mine[left - i])
                stack.append((children[k], child_row, left - split))
                left = split


def optimal_placement(forest: PrefixForest, budget: int) -> Placement:
    """The best static placement of at most ``budget`` checkpoints on ``forest`` (module docstring).

    Each subtree under the root is solved on its own (the chain program for a path, the forest program
    otherwise) and the results are merged by a knapsack over the subtrees. Raises :class:`InvalidArgument`
    for a negative budget or tables past :data:`MAX_TABLE_ENTRIES`. Side effects: none. Time
    ``O(h * n * min(n, B))`` (chains: ``O(N * min(N, B))``), memory as the module docstring says."""
    _check_budget(budget)
    budget = int(budget)
    parts: list[tuple[np.ndarray, object]] = []
    for top in forest.roots:
        nodes = sorted(_subtree_nodes(forest, top))
        if all(len(forest.children[v]) <= 1 for v in nodes):  # a path: the chain program
            best, prev, layers = _chain_tables(
                [forest.depth[v] for v in nodes], [forest.weight[v] for v in nodes], budget
            )
            parts.append((np.array(best)[None, :], (nodes, prev, layers)))
        else:
            dp = _ForestDP(forest, top, budget)
            parts.append((dp.table[top], dp))
    merged = np.zeros((1, 1))
    prefixes = [merged]
    for table, _ in parts:
        merged = _maxplus(merged, table, budget)
        prefixes.append(merged)
    row = np.maximum.accumulate(merged[0])
    values = tuple(float(row[min(b, len(row) - 1)]) for b in range(budget + 1))
    chosen: set[int] = set()
    left = min(budget, len(row) - 1)
    for k in range(len(parts) - 1, -1, -1):
        table, how = parts[k]
        before, mine = prefixes[k][0], table[0]
        left = min(left, prefixes[k + 1].shape[1] - 1)
        lo, hi = max(0, left - (len(mine) - 1)), min(left, len(before) - 1)
        split = max(range(lo, hi + 1), key=lambda i: before[i] + mine[left - i])
        share = left - split
        if isinstance(how, _ForestDP):
            how.choose(how.top, 0, share, chosen)
        else:
            nodes, prev, layers = how  # type: ignore[misc]
            chosen.update(nodes[j] for j in _chain_choice(prev, layers, min(share, len(nodes))))
        left = split
    return Placement(values[-1], frozenset(chosen), values, budget)


# ---------------------------------------------------------------------------------------- from a trace
def forest_from_trace(
    config: CacheConfig, requests: Sequence[TraceRequest], model: str = "kimi-k3"
) -> PrefixForest:
    """The static prefix set of a trace under ``config``: one sequential replay with pools nothing fills
    records every checkpoint handed to the tree (``(depth, prefix fingerprint)`` and the first request
    that created it) and each request's hit, its *demand*. Nodes: the checkpoints created on each
    demand's path up to it, each kept only if it existed before every request demanding in its subtree
    (causality; a dropped node's children hang from its nearest kept ancestor); weight 1 per request at
    its demand node, or at that node's nearest kept ancestor if it was dropped. ``key[v] = (depth,
    fingerprint)``. ``forest.ideal_value`` is then the infinite-capacity hit tokens less what dropped
    nodes cost (nothing on aligned tries; on the first 2,000 conversation requests 0.2515 of 0.2517).

    Exact for the simulator where checkpoint positions do not depend on the cache (aligned tries,
    :func:`aligned_trie_trace`). Elsewhere the forest is the static problem over the infinite replay's
    positions, which a finite cache may never create: a prefill chunk's positions shift with its hit, and
    under extra_buffer a branch-point checkpoint appears only when an earlier request's KV is still in
    the tree, which SGLang frees at finish past the request's last kept checkpoint. A placement that
    declines the first request of a system prompt therefore never sees that prompt's branch point (on
    the synthetic system-prompt workload the predicted 0.80 runs at 0: ``experiments/dp_check.py``).
    Side effects: none outside the process. Cost: one simulator run plus O(requests x
    candidate depths up to each demand)."""
    from mamba_radix.sim.budget import infinite_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    if not requests:
        return PrefixForest([], [], [])
    recorder = _Recorder()
    pools = infinite_pools(
        config,
        sum(r.input_len for r in requests),
        sum(r.output_len for r in requests),
        len(requests),
        model,
    )
    max_len = max(r.input_len + r.output_len for r in requests)
    # sequential: one request runs at a time, so a few request rows suffice (as demand_hits)
    options = EngineOptions(
        mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=8
    )
    engine = Engine(config, pools, max_len, options, recorder)
    metrics = engine.run(requests, total=len(requests))
    hits = {row["index"]: row["hit"] for row in metrics.per_request}
    created = recorder.created
    depths = sorted({d for d, _ in created})
    # every created checkpoint on a demand's path, parent = the next shallower one on the same prefix
    # (the same for every request through it: they share the prefix)
    index: dict[tuple[int, int], int] = {}
    parent: list[int] = []
    first: list[int] = []
    node_key: list[tuple[int, int]] = []
    demand_node: list[tuple[int, int]] = []  # (request index, node)
    for req in requests:
        demand = int(hits.get(req.index, 0))
        if demand <= 0:
            continue
        fps = PrefixFingerprints(req.input_array()[:demand])
        above = ROOT
        for d in depths:
            if d > demand:
                break
            key = (d, fps.at(d))
            if key not in created:
                continue
            node = index.get(key)
            if node is None:
                node = index[key] = len(parent)
                parent.append(above)
                first.append(created[key])
                node_key.append(key)
            above = node
        if above == ROOT or node_key[above][0] != demand:
            raise InvalidArgument(
                f"request {req.index}: its demand at {demand} tokens is not a checkpoint created on its "
                "path; the replay and the recorder disagree (a fingerprint collision?)"
            )
        if first[above] >= req.index:
            raise InvalidArgument(f"request {req.index}: its demand was created by itself or later")
        demand_node.append((req.index, above))
    # causality: a node serves a request only if it existed before it. Keep a node only if it was
    # created before every request whose demand lies in its subtree (dropping one only lowers the
    # optimum: the forest is then the static problem over the positions kept, and every value it gives
    # is one a placement of those positions reaches)
    n = len(parent)
    earliest = [1 << 62] * n
    for rid, node in demand_node:
        earliest[node] = min(earliest[node], rid)
    for v in range(n - 1, -1, -1):
        if parent[v] != ROOT:
            earliest[parent[v]] = min(earliest[parent[v]], earliest[v])
    keep = [first[v] < earliest[v] for v in range(n)]
    keys_by_node = node_key
    new_id = [ROOT] * n
    out_parent: list[int] = []
    out_depth: list[int] = []
    out_key: list[Hashable] = []
    lifted = [ROOT] * n  # the nearest kept ancestor-or-self, as a new index
    for v in range(n):  # parents first
        up = ROOT if parent[v] == ROOT else lifted[parent[v]]
        if keep[v]:
            new_id[v] = len(out_parent)
            out_parent.append(up)
            out_depth.append(keys_by_node[v][0])
            out_key.append(keys_by_node[v])
            lifted[v] = new_id[v]
        else:
            lifted[v] = up
    out_weight: list[float] = [0] * len(out_parent)
    for _, node in demand_node:
        # a demand node is dropped when an earlier request demands below it before it existed: its
        # own requests then count at its nearest kept ancestor (or not at all), never above their due
        if lifted[node] != ROOT:
            out_weight[lifted[node]] += 1
    return PrefixForest(out_parent, out_depth, out_weight, out_key)


class _Recorder(CachePolicy):
    """Admits every hand-over (the config's behaviour) and records the first request creating each."""

    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.created: dict[tuple[int, int], int] = {}
        self._fps = RequestFingerprints()

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        key = (seq_len, self._fps.at(req, seq_len))
        self.created.setdefault(key, int(req.rid))  # type: ignore[arg-type]
        return True


class StaticPlacement(CachePolicy):
    """Keep exactly the checkpoints of a placement: a hand-over is admitted only if its ``(depth, prefix
    fingerprint)`` is in ``keys`` (e.g. ``{forest.key[v] for v in placement.chosen}``); eviction stays
    the config's. With slots for the whole set nothing is evicted, and where positions do not move the
    run's hit tokens equal the placement's value (``property_tests/test_policies_dp.py`` checks it).
    Where they move it can fall short of it (:func:`forest_from_trace` says why): it keeps no hand-over
    only for the KV it carries, as the oracle does.
    O(1) per hand-over after one O(tokens) fingerprint pass per request."""

    name: ClassVar[str] = "static-placement"
    needs_prefix_fingerprints: ClassVar[bool] = True

    def __init__(self, keys: Iterable[tuple[int, int]]) -> None:
        super().__init__()
        self.keys = frozenset(keys)
        self._fps = RequestFingerprints()

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        return (seq_len, self._fps.at(req, seq_len)) in self.keys


def static_placement_policy(
    config: CacheConfig, requests: Sequence[TraceRequest], state_slots: int, model: str = "kimi-k3"
) -> tuple[StaticPlacement, Placement, PrefixForest]:
    """The static optimum of a trace as a policy, for a sequential run with ``state_slots`` slots: the
    forest of :func:`forest_from_trace`, the optimum at the tree's room ``K`` (``state_slots - 1`` under
    no_buffer, ``state_slots - config.slots_per_request`` otherwise, as the module docstring says), and
    the :class:`StaticPlacement` that keeps it. Raises :class:`InvalidArgument` if the slots admit no
    running request. Cost: one infinite-capacity replay plus the program."""
    live = 1 if config.strategy == "no_buffer" else config.slots_per_request
    if state_slots < config.slots_per_request:
        raise InvalidArgument(
            f"{state_slots} slots admit no running request ({config.slots_per_request} per request under "
            f"{config.strategy}); give at least {config.slots_per_request}"
        )
    room = state_slots - live
    forest = forest_from_trace(config, requests, model)
    placement = optimal_placement(forest, room)
    keys = [forest.key[v] for v in placement.chosen] if forest.key is not None else []
    return StaticPlacement(keys), placement, forest  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- the aligned-trie model
def aligned_trie_trace(paths: Sequence[Sequence[int]], grid: int, seed: int = 0) -> list[TraceRequest]:
    """A trace whose checkpoint positions never move: request ``i``'s input is the blocks of trie path
    ``paths[i]`` (``grid`` tokens per block; a block is named by the path up to it, so equal path prefixes
    are equal token prefixes) plus one token of its own, and one output token.

    Under ``no_buffer`` with ``chunked_prefill_size = mamba_cache_chunk_size = grid`` every hit is a block
    boundary, so every prefill chunk ends on one: a request creates a checkpoint at each boundary of its
    path deeper than its hit (and one at its own last token, which nothing reuses), whatever the cache
    held. That is the model :func:`exhaustive_dynamic_optimum` searches. O(total tokens)."""
    from mamba_radix.sim.traces import TraceRequest

    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise InvalidArgument(f"grid must be an int >= 1 (tokens), got {grid!r}")
    rng = np.random.default_rng(seed)
    blocks: dict[tuple[int, ...], list[int]] = {}
    reqs = []
    for i, path in enumerate(paths):
        tokens: list[int] = []
        for k in range(len(path)):
            name = tuple(path[: k + 1])
            if name not in blocks:  # distinct first tokens: distinct blocks never share a prefix
                blocks[name] = [10_000 + len(blocks), *rng.integers(100_000, 200_000, grid - 1).tolist()]
            tokens += blocks[name]
        reqs.append(TraceRequest.from_tokens(i, float(i), [*tokens, 5_000_000 + i], [6_000_000 + i]))
    return reqs


def exhaustive_dynamic_optimum(paths: Sequence[Sequence[Hashable]], capacity: int, grid: int) -> int:
    """The most hit tokens any schedule reaches in the aligned-trie model with at most ``capacity``
    checkpoints held when a request matches: request ``i`` walks the nodes ``paths[i][:k]`` (node ``k`` at
    depth ``k * grid``), hits the deepest held one, creates every node of its path deeper than that, and
    the cache then keeps any ``capacity`` of what it held and what was created (eviction at will, optional
    admission). A relaxation of the simulator (no locks, no slot timing), hence an upper bound on every
    policy run there with ``capacity + 1`` slots under ``no_buffer``: when a request matches, the tree
    holds at most ``slots - 1`` block-boundary checkpoints (the running request's live slot takes one;
    a request's own-last-token checkpoint can take the last slot, but nothing reuses it), which
    ``property_tests/test_policies_dp.py`` checks.

    Exponential: memoised over (request, held set), refused past :data:`MAX_SEARCH_STATES` states with
    :class:`InvalidArgument`. Only nodes a later request walks are kept (the others never pay)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise InvalidArgument(f"capacity must be an int >= 0 (checkpoints), got {capacity!r}")
    walks = [tuple(tuple(p[: k + 1]) for k in range(len(p))) for p in paths]
    later: list[frozenset[tuple[Hashable, ...]]] = [frozenset()] * (len(walks) + 1)
    for t in range(len(walks) - 1, -1, -1):
        later[t] = later[t + 1] | frozenset(walks[t])
    states = 0

    @functools.cache
    def best(t: int, held: frozenset[tuple[Hashable, ...]]) -> int:
        nonlocal states
        states += 1
        if states > MAX_SEARCH_STATES:
            raise InvalidArgument(
                f"the exhaustive search passed {MAX_SEARCH_STATES:,} states: use fewer requests or nodes"
            )
        if t == len(walks):
            return 0
        walk = walks[t]
        level = max((k + 1 for k, node in enumerate(walk) if node in held), default=0)
        pool = sorted((held | frozenset(walk[level:])) & later[t + 1], key=repr)
        keep = min(capacity, len(pool))
        options = itertools.combinations(pool, keep)
        return level * grid + max(best(t + 1, frozenset(s)) for s in options)

    return best(0, frozenset())
