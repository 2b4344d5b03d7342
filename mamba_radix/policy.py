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
- ``host_tier_problem``: why the policy cannot run with the host tier on (one line, the cache's refusal),
  or None.

With the host tier on (``config.host_tier``; ``docs/host-tier.md``) a policy chooses the device victims and
the checkpoint admission exactly as without it; what a victim then becomes (demoted to host-only, backed up,
removed) is the tier's rule, and host eviction keeps its own order. Host-only nodes are no candidates (the
index lists device nodes only), so the pickers never see them; a policy that walks the tree itself counts
device children only (:func:`device_children`, :func:`num_device_children`): a demoted node is gone from the device, as it would be
from a tree without the tier. A demoted checkpoint loaded back later is a new checkpoint to the policy (a new
slot on the node, as after an insert).

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

__all__ = ["CachePolicy", "device_children", "num_device_children"]


def num_device_children(node: TreeNode) -> int:
    """How many of ``node``'s children are device-resident (all of them without the host tier). O(1)."""
    return len(node.children) - node.host_children


def device_children(node: TreeNode) -> list[TreeNode]:
    """``node``'s device-resident children: without the host tier all of them; with it, host-only children
    (demoted, ``value is None``) are left out, so that a policy walking the tree sees the device's shape, as
    a tree without the tier would have it. O(children)."""
    if not node.host_children:
        return list(node.children.values())
    return [child for child in node.children.values() if child.value is not None]


class CachePolicy:
    """The config's own policy; subclass it to change the victim order or the checkpoint admission."""

    name: ClassVar[str] = "config"
    needs_prefix_fingerprints: ClassVar[bool] = False
    # why this policy cannot run with the host tier on, as the one-line refusal's reason; None: it can
    host_tier_problem: ClassVar[str | None] = None

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

    def settle_keys(self) -> None:
        """Apply the re-keys this policy deferred: a policy that learns, while the tree derives a new
        checkpoint's key, that other nodes' keys moved (Sift: the checkpoints a new one supersedes) may note
        them and re-key them before its next pick. The invariant checker calls this before it compares
        every node's key with its listing, so that a deferred key is not reported as stale; its victims are
        unaffected (each pick settles first). Nothing is deferred here. O(deferred nodes * log n)."""

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        """Whether the state of ``req``'s first ``seq_len`` tokens, handed to the tree now, is kept."""
        return True
