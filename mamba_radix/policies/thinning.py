"""SGLang's coverage thinning (open PR #38000, issue #36935), reimplemented from its description.

Problem it addresses: since PR #31643 only the consumed checkpoint is refreshed, and chunked prefill
inserts a path's shallow checkpoints first, so LRU takes a cold path's checkpoints shallowest first; a
later request forking in the middle of the chain then finds nothing to resume from (repeats of 32k-token
chains went from 16k-28k cached tokens to 0). The PR chooses victims by **coverage** instead: it drops the
checkpoint whose removal leaves the smallest gap between the survivors of its chain, so a chain thins out
evenly (every other checkpoint survives when they are evenly spaced) and any fork point stays within a
short recompute of a state.

This reimplementation (:class:`CoverageThinning`):

- *thinnable* checkpoints: unlocked, internal, exactly one child (a fork serves several branches), not
  reused since they were created (a re-stamped checkpoint served another request) and not a leaf (the
  device-leaf tail of a chain); these are the PR's fixed boundaries, with locks, forks, reuse and the
  tail;
- the *merged gap* of a thinnable checkpoint at depth ``d`` is ``next - prev``: ``prev`` the depth of the
  nearest checkpoint above it (0 at the root), ``next`` the depth of the nearest checkpoint, fork or leaf
  end below it on its single-child chain;
- the victim is the thinnable checkpoint of smallest merged gap, ties to the least recently used, then
  the shallowest; when nothing is thinnable, the config's LRU victim (as SGLang without the PR).

What is and is not equivalent: the PR's session-pinned states have no counterpart here (no sessions); we
thin globally over all chains where the PR, as described, thins the chain it is evicting from; and the
PR reports no effect once demand exceeds about twice the free slots, which this version does not model
specially. Cost: O(candidates * chain) per victim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from mamba_radix.policy import CachePolicy, device_children, num_device_children

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode

__all__ = ["CoverageThinning", "merged_gap"]


def merged_gap(node: TreeNode) -> int:
    """``next - prev`` around ``node``'s checkpoint (see the module docstring). O(chain)."""
    up = node.parent
    prev = 0
    while up is not None and not up.is_root:
        if up.mamba_slot is not None:
            prev = up.depth
            break
        up = up.parent
    down = node
    while True:  # down the device chain: host-only children are gone from the device (policy.py)
        children = device_children(down)
        if len(children) != 1:
            nxt = down.depth
            break
        down = children[0]
        if down.mamba_slot is not None or num_device_children(down) != 1:
            nxt = down.depth
            break
    return nxt - prev


class CoverageThinning(CachePolicy):
    """Victims by coverage (PR #38000), LRU for what cannot be thinned."""

    name: ClassVar[str] = "thinning"

    def __init__(self) -> None:
        super().__init__()
        self._created: dict[int, tuple[int, int]] = {}  # node id -> (slot, stamp when set)

    def mamba_key(self, node: TreeNode) -> tuple[int, ...]:
        slot = node.mamba_slot
        seen = self._created.get(node.id)
        if seen is None or seen[0] != slot:
            self._created[node.id] = (slot, node.mamba_last_access)  # type: ignore[assignment]
        return super().mamba_key(node)

    def thinnable(self, node: TreeNode) -> bool:
        """Not a fixed boundary: internal with one child, unlocked (a candidate), never reused. O(1)."""
        if num_device_children(node) != 1:
            return False
        seen = self._created.get(node.id)
        return seen is not None and seen[0] == node.mamba_slot and seen[1] == node.mamba_last_access

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        best: TreeNode | None = None
        best_key: tuple[int, int, int] | None = None
        for node in index.mamba_candidates():
            if not self.thinnable(node):
                continue
            key = (merged_gap(node), node.mamba_last_access, node.depth)
            if best_key is None or key < best_key:
                best, best_key = node, key
        return best if best is not None else index.first_mamba()
