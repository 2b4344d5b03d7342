"""The extension point for research policies: victim order and checkpoint admission (:class:`CachePolicy`).

The config's knobs (``mamba_eviction_order``, ``mamba_lru_refresh``, ``mamba_checkpoint_admission``, ...)
cover the policies SGLang and its peers ship. A policy that needs more (future knowledge for an offline
optimum, an O(n) renormalised utility, frequencies, session structure) subclasses :class:`CachePolicy`
and is handed to the cache (``MambaRadixCache(..., policy=...)``, ``MambaRadixCache.build(...,
policy=...)``, the simulator's ``Engine(..., policy=...)``). The tree and the lifecycle call its hooks;
the base class is the config's behaviour, so a subclass overrides only what it changes:

- :meth:`full_key` / :meth:`mamba_key`: the sort key of an eviction candidate (a tuple ending with the
  node id, smallest evicted first). The tree re-derives a node's key whenever one of its fields changes
  (a stamp, a lock, the leaf status), so a key must be a function of the node's fields and of state the
  policy changes only in :meth:`on_admit` (then call :meth:`rekey` for nodes whose keys moved).
- :meth:`pick_full_victim` / :meth:`pick_mamba_victim`: the next victim among the candidates, for
  policies that cannot keep a static key (a utility renormalised over the live candidates); O(log n) by
  default, whatever the override costs otherwise.
- :meth:`admit_checkpoint`: whether a state a request hands to the tree at ``seq_len`` is kept (a declined
  one is counted in ``stats.checkpoints_declined``; its KV stays the request's, and past the last kept
  checkpoint it is freed at finish, as always).
- :meth:`on_admit` / :meth:`on_hit`: a request is being admitted (the simulator's requests carry their
  trace index as ``rid``) / its admission match is done. ``policy.cache`` is the cache (its pools, stats).
- ``needs_prefix_fingerprints``: the tree then keeps ``node.prefix_fp``, the
  :func:`~mamba_radix.state_stamp.fingerprint` of the whole prefix ending at the node (O(edge) per new
  node), so a policy can look a node up in a pre-pass over a trace.

A policy object serves one cache (:meth:`bind` is called once, by the tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from mamba_radix.errors import InvalidArgument
from mamba_radix.eviction import CheckpointOrder, full_evict_key, mamba_evict_key

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode
    from mamba_radix.request import Req
    from mamba_radix.tree import RadixTree

__all__ = ["CachePolicy"]


class CachePolicy:
    """The config's own policy; subclass it to change the victim order or the checkpoint admission."""

    name: ClassVar[str] = "config"
    needs_prefix_fingerprints: ClassVar[bool] = False

    def __init__(self) -> None:
        self.tree: RadixTree | None = None
        # the MambaRadixCache built over the tree (pools, stats), set by it; typed loosely so that this
        # module, which the cache imports, does not import the cache back
        self.cache: Any = None
        self.order: CheckpointOrder | None = None

    def bind(self, tree: RadixTree) -> None:
        """Attach to ``tree`` (once). Raises :class:`InvalidArgument` if already bound to another tree."""
        if self.tree is not None and self.tree is not tree:
            raise InvalidArgument(f"policy {self.name!r} already serves another cache; make one per cache")
        self.tree = tree
        self.order = CheckpointOrder.from_config(tree.config)

    def uses_config_keys(self) -> bool:
        """Whether this policy's keys are exactly the config's order (the base class, not a subclass):
        the tree's index may then stamp lazily and re-key only leaves. A subclass's keys may read
        anything, so they are re-derived at every change. O(1)."""
        return type(self) is CachePolicy

    # ---------------------------------------------------------------------------------------- eviction
    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        """Sort key of a full-KV candidate (an unlocked leaf): LRU, deeper first on ties. O(1)."""
        return full_evict_key(node)

    def mamba_key(self, node: TreeNode) -> tuple[int, ...]:
        """Sort key of a checkpoint candidate, by ``mamba_eviction_order``. O(1)."""
        assert self.order is not None, "bind the policy to a tree first"
        return mamba_evict_key(self.order, node)

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None:
        """The next full-KV victim, or None. O(log n)."""
        return index.first_full()

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        """The next checkpoint victim, or None. O(log n)."""
        return index.first_mamba()

    def rekey(self, nodes: list[TreeNode]) -> None:
        """Re-derive the keys of ``nodes`` after the policy's own state changed. O(len * log n)."""
        assert self.tree is not None, "bind the policy to a tree first"
        for node in nodes:
            if self.tree.is_attached(node):
                self.tree.index.update(node)

    # --------------------------------------------------------------------------------------- admission
    def on_admit(self, req: Req) -> None:
        """``req`` is being admitted (its resources were checked; its match comes next)."""

    def on_hit(self, req: Req) -> None:
        """``req``'s admission match is done: ``req.last_node`` (locked next), ``req.cache_protected_len``
        (the hit), ``req.full_kv_hit_len``."""

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        """Whether the state of ``req``'s first ``seq_len`` tokens, handed to the tree now, is kept."""
        return True
