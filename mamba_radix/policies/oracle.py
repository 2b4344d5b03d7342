"""The offline reference: Belady's MIN for checkpoints and KV leaves, plus oracle admission (:class:`Oracle`).

With the whole trace known (:class:`~mamba_radix.policies.future.FutureIndex`), every decision looks ahead:

- **checkpoint eviction** takes the candidate whose next use lies farthest ahead (Belady's MIN). Uses come
  in two tiers: a checkpoint that is some later request's *demand* (the checkpoint that request hits
  when nothing is evicted) is kept before one that is only a *fallback* on a later path, which is kept
  before one nobody uses again; within a tier the farthest next use goes first (never-used ones in LRU
  order). Keys ``(tier, -next use, -depth, id)``;
- **KV eviction** (unlocked leaves) first takes leaves without a checkpoint (KV past the deepest state is
  never a hit), then leaves by their checkpoint's key: a leaf's KV is used exactly when its checkpoint is;
- **admission** keeps a hand-over only if a later request uses it, and, when no slot is free, only if it
  is used sooner than the checkpoint eviction would take in its place (Belady with bypass).

Where it is optimal, and where it is only a strong reference
------------------------------------------------------------

It maximises the number of requests that hit their demand, hence the token hit rate, when: requests run
one at a time (``mode="sequential"``); KV never binds; every request has one demand, all demands are worth
the same number of tokens and no fallback exists (e.g. distinct system prompts of one length); and a miss
re-creates the demanded checkpoint (the branch point is still known from KV). That is paging with
uniform-size pages, unit costs and optional admission, where Belady's MIN with bypass is optimal (Belady
1966; Mattson et al. 1970). ``property_tests/test_policies_oracle.py`` checks it against an exhaustive
search on small traces and checks that no online policy beats it there.

Elsewhere it is a strong reference, not a bound: demands are worth different numbers of tokens (MIN
minimises misses, not missed tokens: weighted paging needs a min-cost flow); a missed demand can fall back
to a shallower checkpoint; KV and slots are two coupled pools (a KV eviction can delete a checkpoint);
the demands come from the infinite-capacity replay, while a finite run can place checkpoints elsewhere
(a prefill chunk's positions shift with its hit, a freed KV tail hides a branch point); and in timed mode
several requests run at once, so "next use" is only an order.

Clock: ``now`` is the trace index of the request admitted last (:meth:`on_admit`; the simulator's
``rid``). A key embeds a next-use time, which goes stale when that time passes without the checkpoint
being touched; :meth:`on_admit` re-keys exactly those nodes (each key is filed under its time). O(log n)
per key, O(stale keys * log n) per admission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from mamba_radix.policies.future import NEVER, FutureIndex, RequestFingerprints
from mamba_radix.policy import CachePolicy

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode
    from mamba_radix.request import Req

__all__ = ["Oracle"]

_EXACT, _FALLBACK, _DEAD = 2, 1, 0


class Oracle(CachePolicy):
    """Belady's MIN with oracle admission over a :class:`FutureIndex` (see the module docstring).

    ``admission`` / ``eviction``: switch either half off (ablations: off = the config's behaviour).
    ``knows_order=False``: the *death-only* reference: eviction knows whether a candidate is used again but not
    when (the never-used-again first, then LRU among the rest; admission declines the never-used and
    admits every other hand-over, as LRU would). Its distance to the full oracle is what knowing the order
    of future uses is worth; its distance to an online policy, what predicting which entries are dead is
    worth (``experiments/headroom.py``).
    ``cache``: the :class:`~mamba_radix.cache.MambaRadixCache` it serves (the cache sets it when it is
    built with this policy), for the bypass rule (free slots); without one a used-again hand-over is always
    admitted.
    """

    name: ClassVar[str] = "oracle"
    needs_prefix_fingerprints: ClassVar[bool] = True
    # its next uses come from a replay without the tier, where a device eviction is a loss; with a host tier
    # the evicted checkpoint may come back as a host hit, so its order is no longer Belady's (nor a bound)
    host_tier_problem: ClassVar[str | None] = (
        "its future uses ignore host hits, so it is no optimum there; the tier-aware reference is host_merged"
    )

    def __init__(
        self, future: FutureIndex, *, admission: bool = True, eviction: bool = True, knows_order: bool = True
    ) -> None:
        super().__init__()
        self.future = future
        self.admission = admission
        self.eviction = eviction
        self.knows_order = knows_order
        self.now = -1
        self._swept = -1
        # next-use time -> the nodes whose key embeds it, by id: a node keyed again before that time is filed
        # once (a list collected a copy per re-key, and every copy was re-keyed again when due: under KV
        # pressure the copies grew without bound and the re-keys with them)
        self._due: dict[int, dict[int, TreeNode]] = {}
        self._req_fps = RequestFingerprints()
        # a hand-over kept only because its KV carries a later demand's branch point: node id ->
        # (that demand's depth, its next use); the hand-over being inserted now: (depth, carried)
        self._carry: dict[int, tuple[int, int]] = {}
        self._pending: tuple[int, tuple[int, int]] | None = None
        self._carried_depth = 0

    # ------------------------------------------------------------------------------------------ keys
    def _tier(self, depth: int, fp: int) -> tuple[int, int]:
        use = self.future.next_use(depth, fp, self.now)
        if use.at == NEVER:
            return _DEAD, NEVER
        return (_EXACT if use.exact else _FALLBACK), use.at

    def _carried(self, node: TreeNode) -> int:
        """The next use of a demand whose branch point only ``node``'s edge still carries, or NEVER."""
        pending = self._pending
        if pending is not None and pending[0] == node.depth and node.mamba_slot is not None:
            self._carry[node.id] = pending[1]
            self._pending = None
        carry = self._carry.get(node.id)
        if carry is None:
            return NEVER
        depth, at = carry
        parent = node.parent
        if parent is None or depth <= parent.depth or at <= self.now:  # split there already, or passed
            del self._carry[node.id]
            return NEVER
        return at

    def _key(self, node: TreeNode, stamp: int) -> tuple[int, ...]:
        tier, at = self._tier(node.depth, node.prefix_fp)
        if tier == _DEAD:
            carried = self._carried(node)
            if carried != NEVER:
                tier, at = _FALLBACK, carried
        if tier == _DEAD:
            return (_DEAD, stamp, -node.depth, node.id)
        self._due.setdefault(at, {})[node.id] = node  # alive until ``at``: re-keyed then (it may die)
        if (
            not self.knows_order
        ):  # death only: whether a candidate is used again, not when (LRU among the living)
            return (_FALLBACK, stamp, -node.depth, node.id)
        return (tier, -at, -node.depth, node.id)

    def mamba_key(self, node: TreeNode) -> tuple[int, ...]:
        if not self.eviction:
            return super().mamba_key(node)
        return self._key(node, node.mamba_last_access)

    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        if not self.eviction:
            return super().full_key(node)
        if node.mamba_slot is None:  # a KV-only leaf: no state at its end, never a hit
            return (-1, node.last_access, -node.depth, node.id)
        return self._key(node, node.last_access)

    def on_admit(self, req: Req) -> None:
        """Advance the clock to ``req.rid`` and re-key the nodes whose next use has passed."""
        rid = req.rid
        if not isinstance(rid, int):
            return
        self.now = rid
        stale: dict[int, TreeNode] = {}
        for t in range(self._swept + 1, rid):
            stale.update(self._due.pop(t, {}))
        self._swept = max(self._swept, rid - 1)
        if stale and self.tree is not None:
            self.rekey(list(stale.values()))

    # ------------------------------------------------------------------------------------- admission
    def _carries(self, req: Req, seq_len: int) -> int:
        """The soonest next exact use of a demand at a grid position in ``(cache_protected_len,
        seq_len)`` of ``req``'s own tokens: the KV handed over carries that branch point (a later request
        discovers it by its KV match), or NEVER. Sets ``_carried_depth``. O(positions * log n)."""
        grid = self.future.grid
        fps = self._req_fps.of(req, seq_len)
        best, depth = NEVER, 0
        first = (req.cache_protected_len // grid + 1) * grid
        for g in range(first, seq_len, grid):
            at = self.future.next_exact(g, fps.at(g), self.now)
            if at < best:
                best, depth = at, g
        self._carried_depth = depth
        return best

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        if not self.admission:
            return True
        fp = self._req_fps.at(req, seq_len)
        tier, at = self._tier(seq_len, fp)
        if tier == _DEAD:
            at = self._carries(req, seq_len)
            if at == NEVER:
                return False
            tier = _FALLBACK
            self._pending = (seq_len, (self._carried_depth, at))
        cache = self.cache
        if (
            not self.knows_order
            or cache is None
            or not self.eviction
            or cache.mamba_pool.available_size() > 0
        ):  # type: ignore[attr-defined]
            return True  # (death only: a living hand-over always enters, as under LRU)
        victim = self.tree.index.first_mamba() if self.tree is not None else None
        if victim is None or victim.mamba_evict_key is None:
            return True
        # the new checkpoint would displace the victim: keep it only if it ranks above (is used sooner)
        return (tier, -at, -seq_len, 1 << 62) > victim.mamba_evict_key

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        return index.first_mamba()
