"""Sift2's successor, **Sift3**: one learned value for a checkpoint and for the KV leaf that holds it.

Where KV binds, the loss breakdown of Sift2 on the first 2,000 Mooncake conversation requests is nearly
all KV order (2M KV tokens, 1,024 slots: 0.110 of the 0.162 hit rate below the oracle is ``kv_order``, a
kept checkpoint whose KV leaf was evicted, taking the state with it): Sift2 orders KV leaves by
GreedyDual-Size (the tokens a hit on the leaf's checkpoint saves per KV token of its edge), which says how
much a hit is worth but not how likely it is, so whole useful paths fall out of the window while leaves
holding likely-dead checkpoints stay. Sift3 keeps every mechanism of Sift2 and adds one estimate:

1. **A checkpoint's value** (:meth:`Sift3.value`): the chance that it is hit, learned online per kind (Sift2's
   live-miss ratio, :meth:`Sift2.admission_rate`) and refined per *feature* of the request that handed it
   over (:meth:`Sift3.feature`): the octave of its prompt length, and whether the request continued a
   cached prefix of at least half its prompt. The feature's own counts are shrunk toward the kind's ratio
   with ``feature_prior`` pseudo-checkpoints, so a feature with little evidence is its kind. On the
   conversation trace both features carry signal (requests that continued a cached prefix are reused 35 %
   of the time, others 25 %; by prompt length 15-36 %, issue 31), where the kind alone does not.
2. **The KV order follows it** (``kv_value="prob"``): a leaf's GreedyDual priority is the KV clock as it
   stood at the leaf's last touch plus its checkpoint's value relative to the best kind's ratio, inside
   Sift's KV classes. Only leaves are KV victims (:func:`~mamba_radix.eviction.is_full_candidate`), and a
   leaf's subtree is itself, so "the most valuable checkpoint the KV leads to" is the leaf's own; when it
   goes, its parent becomes a leaf and the tree re-derives the parent's key from the parent's checkpoint
   (a parent without one is KV past the deepest state, evicted first as in Sift). No ancestor walk is
   needed: O(1) more per key than Sift2.
3. **Checkpoint classes from the same estimate** (``live_classes="ckpt"``): a checkpoint's eviction class
   uses the live-miss ratio (never-hit live checkpoints count as misses), as admission does, instead of
   Sift's resolved ratio; the KV classes keep the resolved ratio (with the live one there too, 8M KV /
   1,024 slots fell to 0.63 of the gap).
4. **Evidence first** (``value_evidence``): until that many checkpoints have been handed over, the order is
   Sift2's; then every live KV priority is re-derived on the value scale, once. The synthetic workloads hand
   over at most 213 checkpoints (chat), the conversation trace about 1,700 in 2,000 requests; on those
   small workloads the value order from the first hand-over (``value_evidence=0``) measured worse than Sift
   at 6 of the main job's points (chat at 23,086 KV tokens 0.7776 against Sift's 0.7976 and SGLang's
   0.7964; trees at 4,504 0.7133 against 0.7146; shared system prompts at 6,370 0.382 against Sift's 0.478:
   a kind's ratio there is learned from a few dozen sessions), so below ``value_evidence`` Sift3 is Sift2
   exactly. This is a guard with a measured reason, not evidence that the value order helps on small
   traces.

Measured (first 2,000 conversation requests, sequential, extra_buffer, equal bytes; fraction of the SGLang
0.5.23 -> oracle gap closed; Sift2 in brackets): 8M KV / 1,024 slots 0.71 (0.69), 8M / 256 0.71 (0.65),
2M / 1,024 0.14 (0.05), 2M / 256 0.29 (0.20); on requests 2,000-3,999 0.57 (0.60), 0.64 (0.54), 0.12 (0.11)
and 0.15 (0.21): above SGLang 0.5.23 everywhere, not above Sift2 everywhere. The issue's 0.80 / 0.75 at 8M and
0.25 at 2M / 1,024 are not met; docs/policies.md gives the table, the command and the reasons. Each half
alone (same four points): Sift2's KV order with the live classes (``kv_value="gds"``) 0.69 / 0.71 / 0.05 /
0.22; the value order with Sift's classes (``live_classes="none"``) 0.71 / 0.65 / 0.14 / 0.32: the KV value
carries the KV-bound points, the live classes the slot-bound 8M / 256 (at a cost of 0.03 at 2M / 256).
Tried and not kept (an earlier form: the length feature only, Sift's classes, no gate; each measured at
those four points, in that order): the value times Sift2's GreedyDual-Size value (0.66 / 0.65 / 0.09 /
0.29); the value with Sift's junction frequency bonus (0.67 / 0.65 / 0.10 / 0.28); the value of a checkpoint
already hit as the kind's chance of a second hit (0.65 / 0.65 / 0.11 / 0.28); a checkpoint's GreedyDual gain
times its value (no change at 8M / 256); ``feature_prior`` 4 (0.70 / 0.65 / 0.04 / 0.28) and 64 (0.65 /
0.65 / 0.15 / 0.28); the kind's ratio alone, no feature (chat at 23,086 0.7596, below SGLang); the live ratio
in the KV classes too (0.63 / 0.71 / 0.11 / 0.29); plain LRU inside the KV classes (0.68 / 0.65 / 0.08 /
0.25).

Costs: Sift2's, plus O(1) per key and per hand-over (dictionary counts), and one O(n log n) re-key when the
value order starts. Online: nothing here reads the future.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any, ClassVar

from mamba_radix.errors import InvalidArgument
from mamba_radix.policies.sift2 import Sift2

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode
    from mamba_radix.policies.ours import _Record
    from mamba_radix.request import Req

__all__ = ["KV_VALUES", "LIVE_CLASSES", "Sift3"]

# how a KV leaf's GreedyDual value is set: the learned chance ("prob"), Sift2's GreedyDual-Size ("gds"),
# or 1 for every leaf ("lru": LRU inside a KV class)
KV_VALUES: tuple[str, ...] = ("prob", "gds", "lru")
# which eviction classes use the live-miss ratio: none (Sift's resolved ratio), checkpoints, KV, both
LIVE_CLASSES: tuple[str, ...] = ("none", "ckpt", "kv", "both")


class Sift3(Sift2):
    """Sift2 with one learned value per checkpoint that orders its KV leaf and sets its eviction class (see
    the module docstring). Keywords besides its own go to :class:`Sift2`; raises :class:`InvalidArgument`
    for an unknown ``kv_value`` or ``live_classes``."""

    name: ClassVar[str] = "sift3"

    def __init__(
        self,
        *,
        kv_value: str = "prob",
        live_classes: str = "ckpt",
        length_feature: bool = True,
        continued_feature: bool = True,
        feature_prior: float = 16.0,
        value_evidence: int = 256,
        **sift2_options: Any,
    ) -> None:
        if kv_value not in KV_VALUES:
            raise InvalidArgument(f"kv_value must be one of {', '.join(KV_VALUES)}, got {kv_value!r}")
        if live_classes not in LIVE_CLASSES:
            raise InvalidArgument(
                f"live_classes must be one of {', '.join(LIVE_CLASSES)}, got {live_classes!r}"
            )
        super().__init__(**sift2_options)
        self.kv_value = kv_value
        self.live_classes = live_classes
        self.length_feature = length_feature
        self.continued_feature = continued_feature
        self.feature_prior = feature_prior
        self.value_evidence = value_evidence
        self.handed_over = 0  # checkpoints created so far, every kind
        # per (kind, feature): checkpoints created and hit at least once (live never-hit ones are misses)
        self.f_created: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.f_hits: defaultdict[tuple[str, int], int] = defaultdict(int)
        self._feature: dict[int, tuple[int, int]] = {}  # node id -> (its slot, its request's feature)
        self._pending_feature = 0
        self._keying_kv = False  # a KV key is being derived (the classes may differ from checkpoints')

    # -------------------------------------------------------------------------------------- features
    def feature(self, req: Req) -> int:
        """The request-level feature a checkpoint's value is split by: ``2 * octave + continued``, where
        the octave is ``floor(log2(prompt length))`` (0 without ``length_feature``) and ``continued`` is 1
        if the request's cache hit covered at least half its prompt (0 without ``continued_feature``).
        Read at the request's hand-overs, after its match. O(1)."""
        octave = max(0, int(math.log2(max(1, len(req.origin_input_ids))))) if self.length_feature else 0
        continued = self.continued_feature and 2 * self._request_hit[1] >= len(req.origin_input_ids)
        return 2 * octave + int(continued)

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        """Sift2's admission; an admitted hand-over remembers its request's :meth:`feature`. O(kinds)."""
        admitted = super().admit_checkpoint(req, seq_len)
        if admitted:
            self._pending_feature = self.feature(req)
        return admitted

    def _observe(self, node: TreeNode) -> _Record:
        known = self._rec.get(node.id)
        first_hit = known is not None and known.hit_count == 0
        rec = super()._observe(node)
        if known is not rec:  # a new checkpoint: counted under its request's feature
            self._feature[node.id] = (rec.slot, self._pending_feature)
            self.f_created[(rec.kind, self._pending_feature)] += 1
            self.handed_over += 1
            if self.handed_over == self.value_evidence:
                self._start_value_order()
        elif first_hit and rec.hit_count > 0:
            self.f_hits[(rec.kind, self._feature_of(rec))] += 1
        return rec

    def on_admit(self, req: Req) -> None:
        """Sift's admission hook; when Sift drops the records of evicted checkpoints (every ``rekey_every``
        admissions) their features go too, so memory follows the live checkpoints. O(n) then, else O(1)."""
        super().on_admit(req)
        if self._admissions % self.rekey_every == 0:
            self._feature = {i: f for i, f in self._feature.items() if i in self._rec}

    def _feature_of(self, rec: _Record) -> int:
        entry = self._feature.get(rec.node.id)
        return entry[1] if entry is not None and entry[0] == rec.slot else -1

    # ----------------------------------------------------------------------------------------- value
    def value(self, rec: _Record) -> float:
        """The learned chance that ``rec``'s checkpoint is hit: the ratio of its (kind, feature), hits over
        created with live never-hit ones as misses, shrunk toward the kind's ratio
        (:meth:`Sift2.admission_rate`) by ``feature_prior`` pseudo-checkpoints; the kind's ratio for a
        checkpoint without a known feature. O(1)."""
        kind_rate = self.admission_rate(rec.kind)
        feature = self._feature_of(rec)
        if feature < 0:
            return kind_rate
        key = (rec.kind, feature)
        return (self.f_hits[key] + self.feature_prior * kind_rate) / (
            self.f_created[key] + self.feature_prior
        )

    def value_order(self) -> bool:
        """Whether the learned value orders the KV leaves and sets the classes: once ``value_evidence``
        checkpoints were handed over (Sift2's order before). O(1)."""
        return self.handed_over >= self.value_evidence

    def _start_value_order(self) -> None:
        """Re-derive every live record's KV priority on the value scale (else priorities set on Sift2's
        scale would outrank the new ones for generations). Side effect: queues the re-keys, done at the
        next victim pick or admission. O(n log n), once."""
        for rec in self._rec.values():
            rec.kv_stamp = -1
            if rec.node.mamba_slot == rec.slot:
                self._dirty.append(rec.node)

    def _kv_value(self, rec: _Record) -> float:
        """The KV leaf's GreedyDual value: :meth:`value` relative to the best kind's ratio (``prob``),
        Sift2's (``gds``, and always before :meth:`value_order`), or 1 (``lru``). O(kinds + path)."""
        if self.kv_value == "gds" or not self.value_order():
            return super()._kv_value(rec)
        if self.kv_value == "lru":
            return 1.0
        return self.value(rec) / max(self._best_admission_rate(), 1e-9)

    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        """Sift's KV key, with the classes of ``live_classes`` and the value of :meth:`_kv_value`."""
        self._keying_kv = True
        try:
            return super().full_key(node)
        finally:
            self._keying_kv = False

    def _class(self, rec: _Record) -> int:
        """Sift's class, from the live-miss ratio where ``live_classes`` says so (checkpoint keys with
        ``ckpt``, KV keys with ``kv``, both with ``both``) once :meth:`value_order` holds. O(kinds)."""
        live = self.live_classes == "both" or self.live_classes == ("kv" if self._keying_kv else "ckpt")
        if not live or not self.value_order():
            return super()._class(rec)
        best = self._best_admission_rate()
        if rec.superseded and (best <= 0 or self.superseded_rate() < self.low_ratio * best):
            return 0  # superseded ones go first until they prove to be hit
        if best <= 0:
            return 5
        return 1 if self.admission_rate(rec.kind) < self.low_ratio * best else 5
