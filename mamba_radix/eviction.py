"""Eviction orders: which nodes may be evicted and in what order (:class:`EvictionIndex`).

Two ordered candidate sets, each a ``sortedcontainers.SortedList`` of tuple keys that end with the node
id, so every order is total and deterministic and no wall-clock time is involved (a removal is deferred:
the key is marked dead and leaves the list at the front or at a compaction, see :class:`_KeySet`):

- **full KV**: unlocked leaves (``full_lock_ref == 0``, no children), keyed
  ``(last_access, -depth, id)``: least recently used first, the deeper of two equally old leaves first.
- **checkpoints**: nodes holding a checkpoint that no request locks (``mamba_lock_ref == 0``); a leaf
  also needs ``full_lock_ref == 0``, because evicting a leaf's checkpoint deletes the leaf and its KV
  (SGLang asserts there instead, issue #21379). Keyed ``(class, stamp, depth rank, id)`` by
  ``mamba_eviction_order``:

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

``depth`` is in tokens and never changes for an existing node (a split keeps the child's end), so a key
only changes when a stamp, a lock or the leaf status changes. The tree calls :meth:`EvictionIndex.update`
after each such change; membership and key are recomputed from the node in O(1) and the sets are touched
only if they differ: O(log n) per change. Only this module writes ``full_evict_key`` / ``mamba_evict_key``.
A research policy (:class:`mamba_radix.policy.CachePolicy`) may supply its own key functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from sortedcontainers import SortedList

from mamba_radix.config import DEFAULT_FLOP_CROSSOVER, DEFAULT_FLOP_WEIGHT, EVICTION_ORDERS
from mamba_radix.errors import ConfigError
from mamba_radix.node import ROOT_ID

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig, EvictionOrder
    from mamba_radix.node import TreeNode

__all__ = [
    "FLOP_SCORE_SCALE",
    "CandidateKeys",
    "CheckpointOrder",
    "EvictionIndex",
    "flop_score",
    "full_evict_key",
    "is_full_candidate",
    "is_mamba_candidate",
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


def is_full_candidate(node: TreeNode) -> bool:
    """An unlocked non-root leaf: its KV (and checkpoint, if any) may go."""
    return not node.is_root and not node.children and node.full_lock_ref == 0


def is_mamba_candidate(node: TreeNode) -> bool:
    """A checkpoint no request locks; on a leaf, the leaf's KV must be unlocked too."""
    if node.mamba_slot is None or node.mamba_lock_ref != 0:
        return False
    return bool(node.children) or node.full_lock_ref == 0


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


class CandidateKeys(Protocol):
    """What :class:`EvictionIndex` sorts by: one key function per candidate set (keys end with the id)."""

    def full_key(self, node: TreeNode) -> tuple[int, ...]: ...

    def mamba_key(self, node: TreeNode) -> tuple[int, ...]: ...


class VictimPolicy(CandidateKeys, Protocol):
    """What a :class:`~mamba_radix.tree.RadixTree` takes from a research policy at construction
    (:class:`mamba_radix.policy.CachePolicy` is the reference implementation): candidate keys, the victim
    pickers, whether it keys by the config's order alone (the index may then stamp lazily), and whether it
    needs prefix fingerprints. The tree calls :meth:`bind` once, with itself."""

    needs_prefix_fingerprints: bool

    def bind(self, tree: Any) -> None: ...

    def uses_config_keys(self) -> bool: ...

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None: ...

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None: ...


# Whether an EvictionIndex built without an explicit ``lazy_removal`` defers removals (_KeySet). The
# eager form is the reference a property test checks the lazy one against.
LAZY_REMOVAL = True
# Whether an EvictionIndex over the order's own keys (no research policy's) defers a stamp's re-key to
# the moment its key reaches the front (see EvictionIndex). The eager form is the reference a property
# test checks the lazy one against.
LAZY_STAMPS = True
# A lazy set compacts once it holds more than this many dead keys and more dead keys than live ones
# (module constant: the property test shrinks it to reach compaction in a few operations).
COMPACT_MIN_DEAD = 4096


def _rekeyed(candidates: _KeySet, old: tuple, new: tuple) -> tuple:
    """``new``, after moving a candidate from key ``old`` to ``new`` in ``candidates`` (nothing if equal)."""
    if new != old:
        candidates.remove(old)
        candidates.add(new)
    return new


class _KeySet:
    """One candidate set: unique keys in sorted order, with removal deferred (``lazy``) or immediate.

    Why deferred: on a large tree a ``SortedList.remove`` costs 8-10 us (two bisections whose tuple
    compares miss the cache, then a ``del`` inside a sublist), while an ``add`` at the end, where a fresh
    stamp always lands, costs about 1 us. A touch is a remove then an add, so a lazy set marks the old key
    dead (a set insertion, ~0.1 us) and leaves it in the list; :meth:`first` drops dead keys when they
    reach the front, iteration skips them, and the list is rebuilt without them once they outnumber the
    live ones (O(n) every n removals: amortised O(1)). Keys are unique (they end with the node id), so a
    dead key added again is the same entry made live, never a second one. The order of the live keys is
    exactly the eager set's.
    """

    __slots__ = ("_dead", "_lazy", "_sorted")

    def __init__(self, lazy: bool) -> None:
        self._sorted = SortedList()
        self._dead: set[tuple[int, ...]] = set()  # keys still in _sorted but no longer members
        self._lazy = lazy

    def add(self, key: tuple[int, ...]) -> None:
        """Make ``key`` a member (it must not be one). O(log n)."""
        dead = self._dead
        if dead and key in dead:
            dead.remove(key)  # still in the list: the same entry is live again
        else:
            self._sorted.add(key)

    def remove(self, key: tuple[int, ...]) -> None:
        """Drop member ``key``: O(1) amortised when lazy (marked dead, compacted later), O(log n) eager."""
        if not self._lazy:
            self._sorted.remove(key)
            return
        dead = self._dead
        dead.add(key)
        if len(dead) > COMPACT_MIN_DEAD and 2 * len(dead) > len(self._sorted):
            self._compact()

    def replace(self, old: tuple[int, ...] | None, new: tuple[int, ...] | None) -> None:
        """Replace ``old`` by ``new`` (None = absent). O(log n)."""
        if old is not None:
            self.remove(old)
        if new is not None:
            self.add(new)

    def first(self) -> tuple[int, ...] | None:
        """The smallest member, or None. Side effect: dead keys in front of it leave the list.
        O(log n) amortised (each dead key is dropped once)."""
        ordered, dead = self._sorted, self._dead
        while ordered:
            key = ordered[0]
            if not dead or key not in dead:
                return key
            dead.remove(key)
            ordered.pop(0)
        return None

    def _compact(self) -> None:
        """Rebuild the list from its live keys (already sorted: one linear pass). O(n)."""
        dead = self._dead
        live = [key for key in self._sorted if key not in dead]
        self._sorted.clear()
        self._sorted.update(live)
        dead.clear()

    def keys(self) -> list[tuple[int, ...]]:
        """The members in order. O(n)."""
        dead = self._dead
        if not dead:
            return list(self._sorted)
        return [key for key in self._sorted if key not in dead]

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        dead = self._dead
        if not dead:
            return iter(self._sorted)
        return (key for key in self._sorted if key not in dead)

    def __len__(self) -> int:
        return len(self._sorted) - len(self._dead)

    def __bool__(self) -> bool:
        return len(self._sorted) > len(self._dead)


class EvictionIndex:
    """The two ordered candidate sets. Every operation is O(log n) (n = candidates) except iteration.

    ``order`` is a ``mamba_eviction_order`` name (``flop_weight`` / ``flop_crossover`` then give the
    ``flop_weighted`` parameters) or a ready :class:`CheckpointOrder`; :attr:`order` holds the latter.
    ``lazy_removal`` (default :data:`LAZY_REMOVAL`): whether a removal is deferred (see :class:`_KeySet`;
    the same candidates, order and keys either way, a removal O(1) amortised instead of O(log n)).

    ``lazy_stamps`` (default :data:`LAZY_STAMPS`; only with the order's own keys, never a research
    policy's): a touch only writes the node's stamp, and the node stays listed under the key it had.
    Why that is exact: every order's key is non-decreasing in the stamps and nothing else in it changes
    without an :meth:`update` (depth and id are fixed; a lock or leaf change calls it), so a listed key
    is at most the node's current one. The smallest listed key whose node still has that key is then the
    smallest current key of all: :meth:`first_full` / :meth:`first_mamba` re-key stale entries as they
    reach the front until one is current. Each re-key follows at least one touch, so the total work is at
    most the eager form's, and a match's touches cost an attribute store each instead of a re-key
    (~2-6 us on the admission path). ``node.full_evict_key`` / ``node.mamba_evict_key`` are then the keys
    the nodes are *listed* under (:meth:`is_listed_under` states what the invariant checker accepts); the
    queries that report keys and orders compute the current ones.
    """

    def __init__(
        self,
        order: EvictionOrder | CheckpointOrder = "leaf_first",
        *,
        flop_weight: float = DEFAULT_FLOP_WEIGHT,
        flop_crossover: int = DEFAULT_FLOP_CROSSOVER,
        keys: CandidateKeys | None = None,
        lazy_removal: bool | None = None,
        lazy_stamps: bool | None = None,
    ) -> None:
        if not isinstance(order, CheckpointOrder):
            order = CheckpointOrder(order, flop_weight, flop_crossover)
        self.order: CheckpointOrder = order
        # a research policy's keys (mamba_radix.policy.CachePolicy), or the order's own
        self._full_key: Callable[[TreeNode], tuple[int, ...]] = full_evict_key
        self._mamba_key: Callable[[TreeNode], tuple[int, ...]] = order.key_of
        if keys is not None:
            self._full_key, self._mamba_key = keys.full_key, keys.mamba_key
        lazy = LAZY_REMOVAL if lazy_removal is None else lazy_removal
        # a research policy's keys may read anything, so they are re-keyed at every change
        self.lazy_stamps: bool = keys is None and (LAZY_STAMPS if lazy_stamps is None else lazy_stamps)
        self._full = _KeySet(lazy)
        self._mamba = _KeySet(lazy)
        self._nodes: dict[int, TreeNode] = {}  # id -> node, for every node in either set

    # ------------------------------------------------------------------------------------------ updates
    def update(self, node: TreeNode) -> None:
        """Re-derive ``node``'s membership and keys from its fields. O(log n); no-op if nothing changed.

        The membership tests are :func:`is_full_candidate` and :func:`is_mamba_candidate` written out
        inline (this runs on every stamp and lock change: tens of thousands of times per replay)."""
        children = node.children
        unlocked = node.full_lock_ref == 0
        want_full = self._full_key(node) if unlocked and not children and node.id != ROOT_ID else None
        if want_full != node.full_evict_key:
            self._full.replace(node.full_evict_key, want_full)
            node.full_evict_key = want_full
        if node.mamba_slot is not None and node.mamba_lock_ref == 0 and (children or unlocked):
            want_mamba = self._mamba_key(node)
        else:
            want_mamba = None
        if want_mamba != node.mamba_evict_key:
            self._mamba.replace(node.mamba_evict_key, want_mamba)
            node.mamba_evict_key = want_mamba
        if want_full is None and want_mamba is None:
            if node.id in self._nodes:
                del self._nodes[node.id]
        else:
            self._nodes[node.id] = node

    def update_full_stamp(self, node: TreeNode) -> None:
        """:meth:`update` after a change of ``node.last_access`` alone, for keys whose checkpoint key and
        memberships do not read it (the order's own keys, not a research policy's): only the full-KV key
        is re-derived. The tree calls it on a touch. O(log n); no-op if the key did not change."""
        old = node.full_evict_key
        if old is not None:  # a full candidate stays one: a stamp changes no membership
            node.full_evict_key = _rekeyed(self._full, old, self._full_key(node))

    def update_mamba_stamp(self, node: TreeNode) -> None:
        """:meth:`update` after a change of ``node.mamba_last_access`` alone, for the order's own keys (the
        full-KV key and both memberships do not read it): only the checkpoint key is re-derived.
        O(log n); no-op if the key did not change."""
        old = node.mamba_evict_key
        if old is not None:
            node.mamba_evict_key = _rekeyed(self._mamba, old, self._mamba_key(node))

    def remove(self, node: TreeNode) -> None:
        """Drop ``node`` from both sets (it is leaving the tree). O(log n)."""
        if node.full_evict_key is not None:
            self._full.remove(node.full_evict_key)
            node.full_evict_key = None
        if node.mamba_evict_key is not None:
            self._mamba.remove(node.mamba_evict_key)
            node.mamba_evict_key = None
        self._nodes.pop(node.id, None)

    def is_listed_under(
        self, node: TreeNode, listed: tuple[int, ...] | None, current: tuple[int, ...] | None
    ) -> bool:
        """Whether ``listed`` (the key ``node`` is registered under in one set) is consistent with its
        ``current`` key (None: not a member): equal, or with :attr:`lazy_stamps` an older key of the same
        node that is not larger (a stamp moved since it was listed). O(1)."""
        if listed == current:
            return True
        return (
            self.lazy_stamps
            and listed is not None
            and current is not None
            and len(listed) == len(current)
            and listed[-1] == current[-1] == node.id
            and listed < current
        )

    # ------------------------------------------------------------------------------------------ queries
    def first_full(self) -> TreeNode | None:
        """The next full-KV victim (an unlocked leaf), or None. O(log n) amortised (it may drop dead keys
        from the front of the set, and with :attr:`lazy_stamps` re-key the stale ones it meets there)."""
        key = self._full.first()
        if key is None:
            return None
        node = self._nodes[key[-1]]
        if self.lazy_stamps:
            while (current := self._full_key(node)) != key:  # touched since it was listed: move it back
                node.full_evict_key = _rekeyed(self._full, key, current)
                key = self._full.first()  # never None: the node itself is listed again
                node = self._nodes[key[-1]]  # type: ignore[index]
        return node

    def first_mamba(self) -> TreeNode | None:
        """The next checkpoint victim, or None. O(log n) amortised (as :meth:`first_full`)."""
        key = self._mamba.first()
        if key is None:
            return None
        node = self._nodes[key[-1]]
        if self.lazy_stamps:
            while (current := self._mamba_key(node)) != key:
                node.mamba_evict_key = _rekeyed(self._mamba, key, current)
                key = self._mamba.first()
                node = self._nodes[key[-1]]  # type: ignore[index]
        return node

    def full_candidates(self) -> Iterator[TreeNode]:
        """Full-KV candidates in eviction order (for tests, the invariant checker and research policies).
        O(n), and O(n log n) with :attr:`lazy_stamps` (the current keys are sorted)."""
        return (self._nodes[k[-1]] for k in self.full_keys())

    def mamba_candidates(self) -> Iterator[TreeNode]:
        """Checkpoint candidates in eviction order (as :meth:`full_candidates`)."""
        return (self._nodes[k[-1]] for k in self.mamba_keys())

    def current_keys(self, node: TreeNode) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """The keys ``node`` should be listed under now, ``(full, mamba)`` (``None``: not a candidate of
        that set), by the keys this index sorts by. For the invariant checker. O(1), no side effects."""
        full = self._full_key(node) if is_full_candidate(node) else None
        mamba = self._mamba_key(node) if is_mamba_candidate(node) else None
        return full, mamba

    def full_keys(self) -> list[tuple[int, ...]]:
        """The full-KV candidates' current keys in eviction order. O(n); O(n log n) with
        :attr:`lazy_stamps`. No side effects."""
        if self.lazy_stamps:
            return sorted(self._full_key(self._nodes[k[-1]]) for k in self._full)
        return self._full.keys()

    def mamba_keys(self) -> list[tuple[int, ...]]:
        """The checkpoint candidates' current keys in eviction order (as :meth:`full_keys`)."""
        if self.lazy_stamps:
            return sorted(self._mamba_key(self._nodes[k[-1]]) for k in self._mamba)
        return self._mamba.keys()

    def __len__(self) -> int:
        return len(self._nodes)
