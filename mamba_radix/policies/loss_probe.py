"""Where a policy's hits go: a probe that follows every checkpoint a run hands over and says, for every
request, why the run missed the hit an infinite cache would have had.

:func:`probe` wraps a policy (the config's own when ``None``) in a subclass that adds bookkeeping to the
policy hooks and changes no decision: every hook calls the policy's own and returns its answer (a test
checks that hit rates are identical with and without it). It records, per checkpoint (its depth and the
fingerprint of its prefix, as Sift's ghosts key them):

- its **kind**, in Sift2's seven kinds (:meth:`~mamba_radix.policies.sift2.Sift2.kind`; for a policy that is
  not Sift2 a private Sift2 classifier learns the block size from the same KV matches);
- its **fate**: declined at admission, live, evicted from the state pool (a checkpoint victim), or evicted
  with its KV (a KV leaf victim that held it);
- whether any request **hit** it.

For request ``i`` with the infinite-capacity hit ``d_i`` (the demand pass,
:func:`mamba_radix.policies.future.demand_hits`) above its real hit ``h_i``, the lost ``d_i - h_i`` tokens
go to the fate of the checkpoint at depth ``d_i`` on its prompt as it stands when it arrives: ``declined``
(admission), ``evicted`` (evicted-then-needed: the state pool's victim), ``kv_order`` (the checkpoint was
there for it but its KV was evicted, taking the state with it), ``not_handed_over`` (this run never created
a checkpoint there: its branch points fell elsewhere) or ``other`` (the checkpoint is live but the hit
stopped short: a lock or a chunk boundary). The same tokens are also split by the checkpoint's kind.
``admitted_dead`` counts the admitted checkpoints never hit before their eviction or the end of the run:
the slots they held are the pressure that evicted the useful ones (a count, not tokens: which eviction a
dead checkpoint caused is not observable).

Loss against the oracle is the difference of two such splits (the policy's and the oracle's, each against
the infinite cache), computed by the report. Costs: one vectorised fingerprint pass over a request's tokens
per admission and per hand-over request, O(1) dictionary work per hook; the tree keeps prefix fingerprints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from mamba_radix.policies.sift2 import Sift2
from mamba_radix.policy import CachePolicy
from mamba_radix.state_stamp import PrefixFingerprints

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode
    from mamba_radix.request import Req

__all__ = ["CAUSES", "LossProbe", "probe"]

CAUSES: tuple[str, ...] = ("declined", "evicted", "kv_order", "not_handed_over", "other")


class LossProbe:
    """The bookkeeping mixed into a probed policy (see the module docstring); :meth:`loss_summary` gives
    the split."""

    needs_prefix_fingerprints: ClassVar[bool] = True

    def _probe_init(self, demands: Sequence[int], config_keys: bool) -> None:
        self._demands = list(demands)
        self._config_keys = config_keys
        self._classifier: Sift2 | None = None if isinstance(self, Sift2) else Sift2()
        self._fps: tuple[object, int, PrefixFingerprints | None] = (None, -1, None)
        # (depth, prefix fingerprint) -> [kind, fate, hit]
        self.fates: dict[tuple[int, int], list[Any]] = {}
        self.lost_by_cause: Counter[str] = Counter()
        self.lost_by_kind: Counter[str] = Counter()
        self.lost_tokens = 0

    # ------------------------------------------------------------------------------------- helpers
    def uses_config_keys(self) -> bool:
        return self._config_keys

    def _fp(self, req: Req, depth: int) -> int:
        """The fingerprint of ``req``'s first ``depth`` tokens (input, then output). O(tokens) once per
        request and length, O(1) after."""
        rid, n, fps = self._fps
        if rid != req.rid or n < depth or fps is None:
            tokens = np.asarray(req.all_token_ids, dtype=np.int64)
            fps = PrefixFingerprints(tokens)
            self._fps = (req.rid, len(tokens), fps)
        return fps.at(depth)

    def _kind(self, req: Req, seq_len: int) -> str:
        if self._classifier is None:
            return self.kind(req, seq_len)  # type: ignore[attr-defined]
        if self._classifier.tree is None:
            self._classifier.tree = self.tree  # type: ignore[attr-defined]
        return self._classifier.kind(req, seq_len)

    # --------------------------------------------------------------------------------------- hooks
    def on_hit(self, req: Req) -> None:
        super().on_hit(req)  # type: ignore[misc]
        if self._classifier is not None:
            self._classifier.on_hit(req)
        hit = req.cache_protected_len
        if hit > 0:
            fate = self.fates.get((hit, self._fp(req, hit)))
            if fate is not None:
                fate[2] = True
        rid = req.rid
        demand = self._demands[rid] if isinstance(rid, int) and 0 <= rid < len(self._demands) else 0
        if demand <= hit:
            return
        fate = self.fates.get((demand, self._fp(req, demand)))
        if fate is None:
            cause, kind = "not_handed_over", "none"
        else:
            kind = fate[0]
            cause = {"declined": "declined", "evicted": "evicted", "kv": "kv_order"}.get(fate[1], "other")
        self.lost_tokens += demand - hit
        self.lost_by_cause[cause] += demand - hit
        self.lost_by_kind[kind] += demand - hit

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        admitted = super().admit_checkpoint(req, seq_len)  # type: ignore[misc]
        key = (seq_len, self._fp(req, seq_len))
        fate = self.fates.get(key)
        if admitted:
            self.fates[key] = [self._kind(req, seq_len), "live", fate is not None and fate[2]]
        elif fate is None or fate[1] != "live":
            self.fates[key] = [self._kind(req, seq_len), "declined", fate is not None and fate[2]]
        return admitted

    def _gone(self, node: TreeNode | None, fate_name: str) -> None:
        if node is None or node.mamba_slot is None:
            return
        fate = self.fates.get((node.depth, node.prefix_fp))
        if fate is not None:
            fate[1] = fate_name

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        victim = super().pick_mamba_victim(index)  # type: ignore[misc]
        self._gone(victim, "evicted")
        return victim

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None:
        victim = super().pick_full_victim(index)  # type: ignore[misc]
        self._gone(victim, "kv")
        return victim

    # ------------------------------------------------------------------------------------- results
    def loss_summary(self) -> dict[str, Any]:
        """The split so far: ``lost_tokens`` (against the infinite cache), ``by_cause`` (:data:`CAUSES`),
        ``by_kind``, ``admitted`` and ``admitted_dead`` (never hit), ``dead_by_kind``. O(checkpoints)."""
        admitted = [f for f in self.fates.values() if f[1] != "declined"]
        dead = Counter(f[0] for f in admitted if not f[2])
        return {
            "lost_tokens": self.lost_tokens,
            "by_cause": {c: self.lost_by_cause.get(c, 0) for c in CAUSES},
            "by_kind": dict(self.lost_by_kind),
            "admitted": len(admitted),
            "admitted_dead": sum(dead.values()),
            "dead_by_kind": dict(dead),
        }


def probe(policy: CachePolicy | None, demands: Sequence[int]) -> CachePolicy:
    """``policy`` (the config's own when ``None``) with :class:`LossProbe` mixed in: the same object,
    its class swapped for a subclass, or a new one. ``demands[i]``: request ``i``'s infinite-capacity
    hit. Changes no decision. O(1)."""
    base = policy if policy is not None else CachePolicy()
    config_keys = base.uses_config_keys()
    cls = type(base)
    base.__class__ = type(f"Probed{cls.__name__}", (LossProbe, cls), {})
    base._probe_init(demands, config_keys)  # type: ignore[attr-defined]
    return base
