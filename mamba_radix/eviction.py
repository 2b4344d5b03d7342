"""Which nodes may be evicted, and in what order: the eviction index (:class:`EvictionIndex`).

Two ordered candidate sets (:mod:`mamba_radix.candidates`), sorted by the keys of
:mod:`mamba_radix.orders` or a research policy's (:class:`CandidateKeys`):

- **full KV**: unlocked leaves (:func:`is_full_candidate`; with the host tier, device leaves: host-only
  nodes are in neither set);
- **checkpoints**: nodes holding a checkpoint that no request mamba-locks (:func:`is_mamba_candidate`).
  Evicting an unlocked leaf's checkpoint deletes the leaf and its KV; a leaf whose KV is locked without its
  checkpoint (a KV-only lock, ``skip_decode_lock``) only loses the checkpoint (the tree decides which,
  :meth:`~mamba_radix.tree.RadixTree.evict`). A leaf locked any other way holds a mamba lock, so it is
  never a candidate (SGLang asserts there instead, issue #21379).

The tree calls :meth:`EvictionIndex.update` after a change of a lock, a checkpoint or the leaf status
(membership and keys are recomputed from the node in O(1), the sets touched only if they differ:
O(log n)), and :meth:`~EvictionIndex.touch` / :meth:`~EvictionIndex.touch_mamba` to stamp recency. Only
this module writes ``full_evict_key`` / ``mamba_evict_key``.

Three forms, one chosen at construction (:func:`make_index`), with the same victims under the same keys
(``property_tests/test_tree_index_fast.py`` and ``test_eviction_lazy.py`` run twin trees):

- :class:`EvictionIndex`, the reference: any keys (a research policy's may read anything), so a stamp
  re-derives the node's membership and keys.
- :class:`OrderIndex`: the order's own keys, so a stamp re-keys the one set whose key reads it (the full
  key reads ``last_access``, and only a leaf has one; the checkpoint key reads ``mamba_last_access``).
- :class:`LazyStampIndex`, the default for the order's own keys: a stamp only writes the node's field.

Each keeps its sets in either form of :mod:`mamba_radix.candidates` (``lazy_removal``, deferred by
default; deferred over a sorted list, or over a heap in :class:`LazyStampIndex`, which only reads the
smallest entry on the eviction path). After a removal the tree tells the index what changed
(:meth:`~EvictionIndex.child_removed`, :meth:`~EvictionIndex.checkpoint_dropped`): the reference
re-derives everything, the order-key indices only what the order's keys can read. The order names, keys
and ``flop_weighted`` scores are :mod:`mamba_radix.orders`' (their names are re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mamba_radix.candidates import COMPACT_MIN_DEAD, KeySet, LazyHeapKeySet, LazyKeySet
from mamba_radix.config import DEFAULT_FLOP_CROSSOVER, DEFAULT_FLOP_WEIGHT
from mamba_radix.errors import InvalidArgument
from mamba_radix.node import ROOT_ID
from mamba_radix.orders import (
    FLOP_SCORE_SCALE,
    CheckpointOrder,
    flop_score,
    full_evict_key,
    mamba_evict_key,
    saved_compute,
)

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import EvictionOrder
    from mamba_radix.node import TreeNode

__all__ = [
    "FLOP_SCORE_SCALE",
    "CandidateKeys",
    "CheckpointOrder",
    "EvictionIndex",
    "LazyStampIndex",
    "OrderIndex",
    "VictimPolicy",
    "flop_score",
    "full_evict_key",
    "is_full_candidate",
    "is_mamba_candidate",
    "make_index",
    "mamba_evict_key",
    "saved_compute",
]

Key = tuple[int, ...]


def is_full_candidate(node: TreeNode) -> bool:
    """An unlocked non-root device leaf: its KV (and checkpoint, if any) may go. With the host tier a
    device leaf is a device-resident node whose children are all host-only (``host_children``, 0 while
    the tier is off, when this is plain ``not node.children``). O(1)."""
    return (
        len(node.children) == node.host_children
        and node.full_lock_ref == 0
        and node.id != ROOT_ID
        and node.value is not None
    )


def is_mamba_candidate(node: TreeNode) -> bool:
    """A checkpoint no request mamba-locks. On a leaf, whose locks are all its own
    (``full_lock_ref == mamba_lock_ref + kv_lock_ref``), that leaves its KV unlocked or KV-only locked:
    either way its checkpoint may go. O(1)."""
    return node.mamba_slot is not None and node.mamba_lock_ref == 0


class CandidateKeys(Protocol):
    """What :class:`EvictionIndex` sorts by: one key function per candidate set (keys end with the id)."""

    def full_key(self, node: TreeNode) -> Key: ...

    def mamba_key(self, node: TreeNode) -> Key: ...


class VictimPolicy(CandidateKeys, Protocol):
    """What a :class:`~mamba_radix.tree.RadixTree` takes from a research policy at construction
    (:class:`mamba_radix.policy.CachePolicy` is the reference implementation): candidate keys, the victim
    pickers, whether it keys and picks by the config's order alone (the index may then stamp lazily, and
    the tree take each checkpoint victim from the index directly: :meth:`OrderIndex.take_mamba`), and
    whether it needs prefix fingerprints. The tree calls :meth:`bind` once, with itself."""

    needs_prefix_fingerprints: bool

    def bind(self, tree: Any) -> None: ...

    def uses_config_keys(self) -> bool: ...

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None: ...

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None: ...


def make_index(
    order: CheckpointOrder,
    keys: CandidateKeys | None = None,
    *,
    lazy_removal: bool = True,
    lazy_stamps: bool = True,
    compact_min_dead: int = COMPACT_MIN_DEAD,
) -> EvictionIndex:
    """The index a tree keeps: over a research policy's ``keys`` the reference :class:`EvictionIndex`;
    over the order's own (``keys=None``) a :class:`LazyStampIndex`, or with ``lazy_stamps=False`` an
    :class:`OrderIndex`. ``lazy_removal`` and ``compact_min_dead`` choose the sets' form
    (:mod:`mamba_radix.candidates`). ``lazy_removal=False, lazy_stamps=False`` is the eager reference."""
    if keys is not None:
        cls: type[EvictionIndex] = EvictionIndex
    else:
        cls = LazyStampIndex if lazy_stamps else OrderIndex
    return cls(order, keys=keys, lazy_removal=lazy_removal, compact_min_dead=compact_min_dead)


def _relisted(candidates: KeySet | LazyKeySet, old: Key | None, new: Key | None) -> Key | None:
    """``new``, after moving a node's entry in ``candidates`` from key ``old`` to key ``new`` (None: not
    listed; nothing if equal). O(log n)."""
    if new != old:
        if old is not None:
            candidates.remove(old)
        if new is not None:
            candidates.add(new)
    return new


class EvictionIndex:
    """The two ordered candidate sets, over any keys: the reference form (see the module docstring).
    Every operation is O(log n) (n = candidates) except iteration.

    ``order`` is a ``mamba_eviction_order`` name (``flop_weight`` / ``flop_crossover`` then give the
    ``flop_weighted`` parameters) or a ready :class:`CheckpointOrder`; :attr:`order` holds the latter.
    ``keys``: a research policy's key functions, or None for the order's own. ``lazy_removal``: whether
    a removal is deferred (:class:`~mamba_radix.candidates.LazyKeySet`, compacted from
    ``compact_min_dead`` dead keys on) or immediate (:class:`~mamba_radix.candidates.KeySet`).
    """

    # whether a listed key may be older than the node's current one (LazyStampIndex)
    lazy_stamps: ClassVar[bool] = False
    # the deferred-removal set's form: a sorted list here, where ordered iteration is O(n)
    lazy_set: ClassVar[type[LazyKeySet]] = LazyKeySet
    # whether this form relies on the order's own keys (a research policy's are refused)
    order_keys_only: ClassVar[bool] = False

    def __init__(
        self,
        order: EvictionOrder | CheckpointOrder = "leaf_first",
        *,
        flop_weight: float = DEFAULT_FLOP_WEIGHT,
        flop_crossover: int = DEFAULT_FLOP_CROSSOVER,
        keys: CandidateKeys | None = None,
        lazy_removal: bool = True,
        compact_min_dead: int = COMPACT_MIN_DEAD,
    ) -> None:
        if keys is not None and self.order_keys_only:
            raise InvalidArgument(
                f"{type(self).__name__} keys by the order alone; index a research policy's keys with "
                "EvictionIndex (make_index chooses)"
            )
        if not isinstance(order, CheckpointOrder):
            order = CheckpointOrder(order, flop_weight, flop_crossover)
        self.order: CheckpointOrder = order
        self._full_key: Callable[[TreeNode], Key] = full_evict_key if keys is None else keys.full_key
        self._mamba_key: Callable[[TreeNode], Key] = order.key_of if keys is None else keys.mamba_key
        self._full = self.lazy_set(compact_min_dead) if lazy_removal else KeySet()
        self._mamba = self.lazy_set(compact_min_dead) if lazy_removal else KeySet()
        self._nodes: dict[int, TreeNode] = {}  # id -> node, for every node in either set

    # ------------------------------------------------------------------------------------------ updates
    def update(self, node: TreeNode) -> None:
        """Re-derive ``node``'s membership and keys from its fields. O(log n); no-op if nothing changed."""
        want_full = self._full_key(node) if is_full_candidate(node) else None
        if want_full != node.full_evict_key:
            node.full_evict_key = _relisted(self._full, node.full_evict_key, want_full)
        want_mamba = self._mamba_key(node) if is_mamba_candidate(node) else None
        if want_mamba != node.mamba_evict_key:
            node.mamba_evict_key = _relisted(self._mamba, node.mamba_evict_key, want_mamba)
        if want_full is None and want_mamba is None:
            if node.id in self._nodes:
                del self._nodes[node.id]
        else:
            self._nodes[node.id] = node

    def touch(self, nodes: Iterable[TreeNode], now: int) -> None:
        """Stamp the full recency (``last_access``) of ``nodes`` with ``now`` and re-key each node whose
        stamp moved. O(nodes * log n)."""
        for node in nodes:
            if node.last_access != now:
                node.last_access = now
                self.update(node)

    def touch_mamba(self, node: TreeNode, now: int) -> None:
        """Stamp the checkpoint recency (``mamba_last_access``) of ``node``, if it holds a checkpoint, and
        re-key it. O(log n)."""
        if node.mamba_slot is not None and node.mamba_last_access != now:
            node.mamba_last_access = now
            self.update(node)

    def child_removed(self, parent: TreeNode) -> None:
        """``parent`` lost a child (it left the tree): re-derive its membership and keys, as
        :meth:`update`. Here any key may read anything, so always that; :class:`OrderIndex` skips a
        parent that is still not a leaf. O(log n)."""
        self.update(parent)

    def checkpoint_dropped(self, node: TreeNode) -> None:
        """``node`` lost its checkpoint (it stays in the tree): re-derive its membership and keys, as
        :meth:`update`. Here any key may read anything, so always that; :class:`OrderIndex` only takes
        the checkpoint entry out. O(log n)."""
        self.update(node)

    def remove(self, node: TreeNode) -> None:
        """Drop ``node`` from both sets (it is leaving the tree). O(log n)."""
        if node.full_evict_key is not None:
            self._full.remove(node.full_evict_key)
            node.full_evict_key = None
        if node.mamba_evict_key is not None:
            self._mamba.remove(node.mamba_evict_key)
            node.mamba_evict_key = None
        self._nodes.pop(node.id, None)

    def is_listed_under(self, node: TreeNode, listed: Key | None, current: Key | None) -> bool:
        """Whether ``listed`` (the key ``node`` is registered under in one set) is consistent with its
        ``current`` key (None: not a member): here, equal. O(1)."""
        return listed == current

    # ------------------------------------------------------------------------------------------ queries
    def first_full(self) -> TreeNode | None:
        """The next full-KV victim (an unlocked leaf), or None. O(log n) amortised."""
        key = self._full.first()
        return None if key is None else self._nodes[key[-1]]

    def first_mamba(self) -> TreeNode | None:
        """The next checkpoint victim, or None. O(log n) amortised."""
        key = self._mamba.first()
        return None if key is None else self._nodes[key[-1]]

    def full_candidates(self) -> Iterator[TreeNode]:
        """Full-KV candidates in eviction order (for tests, the invariant checker and research policies).
        O(n) (O(n log n) with lazy stamps: the current keys are sorted)."""
        return (self._nodes[k[-1]] for k in self.full_keys())

    def mamba_candidates(self) -> Iterator[TreeNode]:
        """Checkpoint candidates in eviction order (as :meth:`full_candidates`)."""
        return (self._nodes[k[-1]] for k in self.mamba_keys())

    def current_keys(self, node: TreeNode) -> tuple[Key | None, Key | None]:
        """The keys ``node`` should be listed under now, ``(full, mamba)`` (``None``: not a candidate of
        that set), by the keys this index sorts by. For the invariant checker. O(1), no side effects."""
        full = self._full_key(node) if is_full_candidate(node) else None
        mamba = self._mamba_key(node) if is_mamba_candidate(node) else None
        return full, mamba

    def full_keys(self) -> list[Key]:
        """The full-KV candidates' current keys in eviction order. O(n). No side effects."""
        return self._full.keys()

    def mamba_keys(self) -> list[Key]:
        """The checkpoint candidates' current keys in eviction order (as :meth:`full_keys`)."""
        return self._mamba.keys()

    def __len__(self) -> int:
        return len(self._nodes)


class OrderIndex(EvictionIndex):
    """The index over the order's own keys: a stamp re-keys only the set whose key reads it. The full key
    reads ``last_access`` and only a leaf is a full candidate; the checkpoint key reads
    ``mamba_last_access`` and no membership reads either stamp. O(log n) per re-keyed node."""

    order_keys_only = True

    def child_removed(self, parent: TreeNode) -> None:
        """As :meth:`EvictionIndex.child_removed`, but a parent that still has a device child is left
        alone: no order's key reads the children, and full membership only changes when the last device
        child goes (:func:`is_full_candidate`), so nothing it is listed under can have changed. The
        eviction path's common case (a victim below a fork): O(1) instead of two key computations."""
        if len(parent.children) != parent.host_children:
            return
        self.update(parent)

    def checkpoint_dropped(self, node: TreeNode) -> None:
        """As :meth:`EvictionIndex.checkpoint_dropped`, but only the checkpoint entry is touched: no
        order's full key and no full membership reads the checkpoint, and a node without one is no
        checkpoint candidate. The entry goes at once when it is the set's front (an eviction's victim).
        O(log n)."""
        key = node.mamba_evict_key
        if key is not None:
            self._mamba.remove(key)
            node.mamba_evict_key = None
            if node.full_evict_key is None:
                del self._nodes[node.id]

    def take_mamba(self) -> TreeNode | None:
        """The next checkpoint victim (:meth:`first_mamba`) with its checkpoint entry already taken out,
        or None: the state eviction's one index call per victim. The caller must then drop the node's
        checkpoint or remove the node (:meth:`checkpoint_dropped` and :meth:`remove` find no checkpoint
        entry left to take). The same victims in the same order as :meth:`first_mamba` followed by
        :meth:`checkpoint_dropped` or :meth:`remove`; the entry, the set's front, is popped at once.
        O(log n) amortised."""
        node = self.first_mamba()
        if node is not None:
            self._mamba.remove(node.mamba_evict_key)  # type: ignore[arg-type]
            node.mamba_evict_key = None
            if node.full_evict_key is None:
                del self._nodes[node.id]
        return node

    def touch(self, nodes: Iterable[TreeNode], now: int) -> None:
        full = self._full
        for node in nodes:
            if node.last_access != now:
                node.last_access = now
                old = node.full_evict_key
                if old is not None:  # a listed leaf (an internal node is never a full candidate)
                    node.full_evict_key = _relisted(full, old, self._full_key(node))

    def touch_mamba(self, node: TreeNode, now: int) -> None:
        if node.mamba_slot is not None and node.mamba_last_access != now:
            node.mamba_last_access = now
            old = node.mamba_evict_key
            if old is not None:
                node.mamba_evict_key = _relisted(self._mamba, old, self._mamba_key(node))


class LazyStampIndex(OrderIndex):
    """The order's own keys, stamped lazily: a touch only writes the node's stamp, and the node stays
    listed under the key it had.

    Why that is exact: every order's key is non-decreasing in the stamps and nothing else in it changes
    without an :meth:`update` (depth and id are fixed; a lock or leaf change calls it), so a listed key is
    at most the node's current one. The smallest listed key whose node still has that key is then the
    smallest current key of all: :meth:`first_full` / :meth:`first_mamba` re-key stale entries as they
    reach the front until one is current. Each re-key follows at least one touch, so the total work is at
    most :class:`OrderIndex`'s, and a match's touches cost an attribute store each instead of a re-key
    (~2-6 us on the admission path). ``node.full_evict_key`` / ``node.mamba_evict_key`` are the keys the
    nodes are *listed* under (:meth:`is_listed_under` states what the invariant checker accepts); the
    queries that report keys and orders compute the current ones.
    """

    lazy_stamps = True
    # a heap: this index only reads the smallest entry (its ordered queries sort the current keys anyway)
    lazy_set = LazyHeapKeySet

    def touch(self, nodes: Iterable[TreeNode], now: int) -> None:
        for node in nodes:
            node.last_access = now

    def touch_mamba(self, node: TreeNode, now: int) -> None:
        if node.mamba_slot is not None:
            node.mamba_last_access = now

    def is_listed_under(self, node: TreeNode, listed: Key | None, current: Key | None) -> bool:
        """Equal keys, or an older key of the same node that is not larger (a stamp moved since it was
        listed). O(1)."""
        if listed == current:
            return True
        return (
            listed is not None
            and current is not None
            and len(listed) == len(current)
            and listed[-1] == current[-1] == node.id
            and listed < current
        )

    def first_full(self) -> TreeNode | None:
        """The next full-KV victim, or None; stale entries met at the front are re-keyed. O(log n)
        amortised."""
        key = self._full.first()
        if key is None:
            return None
        node = self._nodes[key[-1]]
        while (current := self._full_key(node)) != key:  # touched since it was listed: move it back
            self._full.replace_first(current)  # key is the front entry: popped, not marked dead
            node.full_evict_key = current
            key = self._full.first()  # never None: the node itself is listed again
            node = self._nodes[key[-1]]  # type: ignore[index]
        return node

    def first_mamba(self) -> TreeNode | None:
        """The next checkpoint victim, or None (as :meth:`first_full`)."""
        key = self._mamba.first()
        if key is None:
            return None
        node = self._nodes[key[-1]]
        while (current := self._mamba_key(node)) != key:
            self._mamba.replace_first(current)
            node.mamba_evict_key = current
            key = self._mamba.first()
            node = self._nodes[key[-1]]  # type: ignore[index]
        return node

    def take_mamba(self) -> TreeNode | None:
        """As :meth:`OrderIndex.take_mamba`, with :meth:`first_mamba`'s loop inline (one call per victim
        instead of two: this runs once per victim, cold)."""
        mamba = self._mamba
        key = mamba.first()
        if key is None:
            return None
        nodes, key_of = self._nodes, self._mamba_key
        node = nodes[key[-1]]
        while (current := key_of(node)) != key:  # touched since it was listed: move it back
            mamba.replace_first(current)
            node.mamba_evict_key = current
            key = mamba.first()  # never None: the node itself is listed again
            node = nodes[key[-1]]  # type: ignore[index]
        mamba.remove(key)  # the front entry: popped at once
        node.mamba_evict_key = None
        if node.full_evict_key is None:
            del nodes[node.id]
        return node

    def full_keys(self) -> list[Key]:
        """The full-KV candidates' current keys in eviction order. O(n log n). No side effects."""
        return sorted(self._full_key(self._nodes[k[-1]]) for k in self._full)

    def mamba_keys(self) -> list[Key]:
        """The checkpoint candidates' current keys in eviction order (as :meth:`full_keys`)."""
        return sorted(self._mamba_key(self._nodes[k[-1]]) for k in self._mamba)
