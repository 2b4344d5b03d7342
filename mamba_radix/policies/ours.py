"""Our online policy, **Sift**: learn which kinds of checkpoints get hit, demote the superseded ones.

SGLang keeps every checkpoint a request hands over and evicts them in LRU order. On real traces most of
them are never hit again (of 6,471 checkpoints the first 2,000 Mooncake conversation requests create,
314 are ever the end of a later hit), and LRU gives them the same lifetime as the useful ones. Sift
changes what is kept and in which order:

1. **Kinds, learned online.** Each hand-over gets a kind from where it lands: ``branch`` (the branch
   point a KV match found), ``end`` (the prompt's last aligned position), ``mid`` (an earlier prefill
   chunk) or ``decode`` (a decode boundary, handed over at finish). For every kind Sift counts the
   checkpoints *resolved*: hit at least once (a hit re-stamps the node; the policy sees the new stamp
   when its key is re-derived) or evicted unhit. An evicted unhit checkpoint leaves a *ghost* entry
   (its depth and prefix fingerprint, the newest ``ghost_size`` kept); a later request whose prompt
   passes a ghost deeper than its real hit turns that eviction into a hit of its kind, so the ratio
   measures reuse beyond the cache's own horizon, not only before eviction (ARC's ghost lists, for
   kinds). The learned value of a kind is ``(hits + 1) / (resolved + 2)``. Admission declines a kind
   whose ratio is below ``min_rate`` and below ``low_ratio`` of the best kind's after ``min_evidence``
   resolved checkpoints (``relative_decline``: under extreme KV pressure every kind's ratio is low, and
   declining the best of them loses hits: shared system prompts at 3,185 KV tokens, 0.035 without the
   relative test, 0.079 with it, as SGLang), except every
   ``explore_every``-th one, so that the estimate can recover. On the Mooncake block traces ``decode``
   checkpoints are never hit (outputs are fresh tokens) and are soon declined; on multi-turn chat
   (replies re-sent) they are the most useful kind and stay.
2. **Supersession (an adaptive per-path cap).** When a new checkpoint lands below an older one on a
   path without a fork in between, the older ones are *superseded*: a later request sharing the path hits
   the newer, deeper one, so the older is useful only to a request that branches in between. A
   superseded checkpoint is evicted before any other (LRU among them), and a hit on it (it turned out to
   be a branch point) lifts it back. Unlike SGLang's per-path cap (PR #31230) nothing is dropped while
   slots are free: the cap adapts to the pressure. A kind of lower value never supersedes one of higher
   value (a ``decode`` checkpoint below an ``end`` one on a block trace).

3. **GreedyDual inside a class.** Checkpoints of one class are not evicted in LRU order but by a
   GreedyDual priority (Young's GreedyDual; Cao and Irani's GreedyDual-Size for web caches): a checkpoint
   gets ``L[class] + gain`` when it is handed over and again at every hit, where ``gain`` is the tokens a
   hit on it saves over the nearest checkpoint above it on its path (its depth minus that checkpoint's
   depth, the marginal value of keeping it), and ``L[class]`` is the priority of the class's last victim.
   So a checkpoint that saves 8,192 tokens over its fallback outlives one that saves 64 for as long as
   8,192 tokens of evictions take to age it, and an untouched one still ages out. Slots all cost the same,
   so this is the value-aware generalisation of LRU (with every gain equal it is LRU). Measured on the
   first 2,000 conversation requests at 8M KV tokens, with superseded checkpoints first from the start:
   1024 slots 0.2145 (LRU inside a class: 0.2082), 256 slots 0.1582 (0.1629); where slots bind on the
   synthetic workloads, as a fraction of the oracle: chat 0.93 (0.88), agent loops 1.00 (0.99), trees
   0.93 (0.89), shared system prompts 1.00 (0.98).

4. **GreedyDual for KV leaves, frequency at shared junctions.** Where KV binds, a leaf's KV is not
   evicted in LRU order but by a GreedyDual priority per KV class: the class's KV clock *as it stood when
   the leaf was last touched* (a node that becomes a leaf long after its last touch starts from the old
   clock, as in LRU; restarting it from today's clock kept dead chains alive: chat at 23,086 KV tokens
   0.7588 against LRU's 0.7964) plus a value: ``gain / size``, the tokens a hit on its checkpoint saves
   over the one above per KV token its edge holds (GreedyDual-Size: a leaf below a fork without a
   checkpoint between is worth more than its edge), and for a ``branch`` checkpoint (a shared prefix
   junction: a system prompt, a tree fork) times ``kv_branch_scale * (1 + hits)``, so a junction hit
   many times survives that many generations of victims (GreedyDual-Size-Frequency). Ties in LRU order.
   With equal values this is LRU. Measured (main job points, as a fraction of the oracle, KV binds):
   shared system prompts 0.846 -> 0.976 (3,185 KV tokens: 0.0794 -> 0.1132, the oracle's; 6,370: 0.2863
   -> 0.4776, Marconi 0.4472), trees 0.963 -> 0.965, chat 0.907 -> 0.908 (5,771 KV tokens: 0.4795, 0.0012
   below SGLang's 0.4807), agent loops 0.965 (=), conversation 0.630 -> 0.634 (1.76M KV tokens 0.0840 ->
   0.0932, 7.04M 0.2232 -> 0.2158). On seeds 1 and 2 of the synthetic workloads (nothing was tuned on
   them), same points: shared system prompts at 6,370 KV tokens 0.4845 and 0.3622 (SGLang 0.3513 and
   0.2052, Marconi 0.3827 and 0.2709, LRU inside the class 0.3030 and 0.1624); but trees fall below SGLang
   at 9,008 and 18,016 KV tokens (seed 1: 0.7679 against 0.7828, 0.8014 against 0.8212; seed 2 at 18,016:
   0.7891 against 0.7965: junction and size values keep dead forks of a finished level), and chat by at
   most 0.0024 at three points. What was tried and lost: frequency on every kind (chat sessions'
   hit chains stay after the session ends: chat at 23,086 0.7832), value = gain without the size
   (chat 2,885: 0.3748, below SGLang), LRU instead of ``gain / size`` outside junctions (trees 9,008:
   0.7580), ``kv_branch_scale`` 1 or 4 (system prompts 6,370: 0.31-0.32; 16: trees below SGLang; 48 to
   256: the numbers above), the bonus only for hit junctions, ``1 + scale * hits`` (conversation 7.04M
   0.2240 but 1.76M 0.0849, system prompts 0.947, trees below SGLang), values rounded to powers of two
   (trees below SGLang), each kind's value weighted by its learned ratio (chat at 23,086 0.7852),
   ignoring the kind classes for KV (conversation 8M KV tokens / 1,024 slots 0.2193 but 1.76M 0.0825),
   ``kv_only_first=False`` (conversation 8M / 1,024 0.2076), a junction bonus lasting twice its mean
   gap between hits instead of ``64 * (1 + hits)`` (system prompts seed 2 at 6,370: 0.1567), no bonus
   once a checkpoint below the junction was hit (no change: a tree's last-level forks, whose children
   are never continued, look like system prompts). On the conversation trace the KV order
   barely matters at the target points (8M KV tokens: 1,024 slots 0.2159, 256 slots 0.1614 with or
   without it): its ``end`` checkpoints sit in the prompt's last partial 512-token block, which a
   continuation never shares (the block hashes differ): 913 of 1,866 are declined, 41 of the 953 kept
   are hit; the hits are at ``mid`` checkpoints (148) and at the ``branch`` checkpoints (88, ratio 0.98)
   that the continuations' KV matches create.

Tried and not kept: **lineages** (a checkpoint's kind at its request's *generation*: one more than that of the
request whose deepest recorded hand-over its prompt passes, so turn t of a chat session, level t of a tree and step
t of an agent loop each get their own learned ratio) and **exhaustion** (the chance of one more hit given the hits
so far, per lineage), a leaf of a dead lineage evicted before the living. The death-only oracle
(``experiments/headroom.py``) says that knowing which entries die is most of the oracle's lead where KV binds (chat
at 5,771 KV tokens 0.547 of the oracle's 0.616, SGLang 0.481; trees at 4,504: 0.797 of 0.800, SGLang 0.715), and
lineages do find the dead ones (trees: last-level ``end`` checkpoints hit 0 of 31 times, the levels above 0.84-0.88;
chat: last-turn ``decode`` 0 of 13), but on these 40-120-request workloads they are learned too late and cost
elsewhere: chat 5,771 0.4795 -> 0.5275, but 11,543 0.6625 -> 0.6565 and trees 4,504 0.7183 -> 0.7114, both below
SGLang; conversation 1.76M 0.0932 -> 0.1100 but 7.04M 0.2158 -> 0.1954 (absolute threshold 0.11 after 8 resolved);
exhaustion changed nothing measurable.

Ghosts count once (``ghost_once``): a ghost turns one eviction into one hit and is then dropped (it could
be passed again by every later request sharing its prefix, which drove a kind's ratio past 1: ``branch``
on shared system prompts at 6,370 KV tokens, 36 hits of 18 checkpoints). Chat where slots bind 0.909 ->
0.915 of the oracle, conversation where slots bind 0.809 -> 0.808.

Eviction keys ``(class, priority, -depth, id)``: class 0 superseded, 1 a kind worth less than
``low_ratio`` of the best kind's ratio, 5 the rest (``fine_classes``: 1-5 by halvings of that ratio);
priority the GreedyDual one (``greedy_dual=False``: the checkpoint's LRU stamp). KV leaves: a
leaf without a checkpoint first when ``kv_only_first`` (KV past the deepest state is never a hit; the
price is the branch points such KV shows), then leaves by their checkpoint's class, ``(1 + class, KV
priority, last access, -depth, id)`` inside (``kv_greedy_dual=False``: LRU, ``(1 + class, last access,
-depth, id)``).

Ablation switches (off by default, each measured worse on the synthetic workloads): ``continuation``
(kinds split by whether the request continued half its prompt from the cache), ``fine_classes``;
``relative_decline=False``, ``supersede=False``, ``ghost_size=0``, ``greedy_dual=False``,
``kv_greedy_dual=False``, ``kv_size_aware=False``, ``kv_branch_frequency=False`` and ``ghost_once=False``
switch the mechanisms off (first 600
conversation requests, 8M KV, 256 slots: 0.0999 with supersession, 0.0775 without).

Costs: O(1) per key plus O(path) per new or hit checkpoint or touched leaf (the supersession walk, the
gain's walk up), O(log victims) per KV priority (the clock's history, one entry per rise), one vectorised fingerprint
pass over each prompt and O(prompt / grid) ghost look-ups per admission; every ``rekey_every``
admissions the keys of every checkpoint are re-derived (the learned ratios moved), O(n log n).
Online: nothing here looks at the future; ``req.rid`` is only used to count admissions.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from mamba_radix.policy import CachePolicy, num_device_children
from mamba_radix.state_stamp import PrefixFingerprints

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.eviction import EvictionIndex
    from mamba_radix.node import TreeNode
    from mamba_radix.request import Req

__all__ = ["KINDS", "Sift", "checkpoint_kind"]

KINDS: tuple[str, ...] = ("branch", "end", "mid", "decode", "other")


def checkpoint_kind(req: Req, seq_len: int, grid: int) -> str:
    """Where a hand-over of ``req`` at ``seq_len`` lands: ``decode`` (past the prompt), ``branch`` (at the
    branch point its match found), ``end`` (within ``grid`` tokens of the prompt's end) or ``mid``. O(1)."""
    input_len = len(req.origin_input_ids)
    if seq_len > input_len:
        return "decode"
    if req.mamba_branching_seqlen == seq_len:
        return "branch"
    if input_len - seq_len < grid:
        return "end"
    return "mid"


@dataclass
class _Record:
    node: TreeNode
    slot: int
    kind: str
    stamp: int
    hit: bool = False
    superseded: bool = False
    priority: float = 0.0  # GreedyDual: L[class] + gain, set at hand-over and at every hit
    priority_class: int = -1  # the class the priority was set in (a class change restarts it)
    priority_stamp: int = -1  # the stamp it was set at (a hit re-stamps the node and restarts it)
    hit_count: int = 0  # hits on the checkpoint (re-stamps after its hand-over)
    kv_priority: float = 0.0  # GreedyDual for its leaf's KV: L_kv[class] + (1 + hits) * gain / size
    kv_class: int = -1
    kv_stamp: int = -1  # the leaf's last_access the KV priority was set at


class Sift(CachePolicy):
    """Learned kind-aware admission, supersession, GreedyDual for checkpoints and for KV leaves (see the
    module docstring)."""

    name: ClassVar[str] = "sift"
    needs_prefix_fingerprints: ClassVar[bool] = True  # ghost entries are (depth, prefix fingerprint)

    def __init__(
        self,
        *,
        min_rate: float = 0.05,
        min_evidence: int = 16,
        explore_every: int = 32,
        low_ratio: float = 0.25,
        rekey_every: int = 128,
        kv_only_first: bool = True,
        supersede: bool = True,
        learn_admission: bool = True,
        continuation: bool = False,
        ghost_size: int = 4096,
        fine_classes: bool = False,
        relative_decline: bool = True,
        greedy_dual: bool = True,
        kv_greedy_dual: bool = True,
        kv_size_aware: bool = True,
        kv_branch_frequency: bool = True,
        kv_branch_scale: float = 64.0,
        ghost_once: bool = True,
    ) -> None:
        super().__init__()
        self.min_rate = min_rate
        self.min_evidence = min_evidence
        self.explore_every = explore_every
        self.low_ratio = low_ratio
        self.rekey_every = rekey_every
        self.kv_only_first = kv_only_first
        self.supersede = supersede
        self.learn_admission = learn_admission
        self.continuation = continuation
        self.ghost_size = ghost_size
        self.fine_classes = fine_classes
        self.relative_decline = relative_decline
        self.greedy_dual = greedy_dual
        self.kv_greedy_dual = kv_greedy_dual
        self.kv_size_aware = kv_size_aware
        self.kv_branch_frequency = kv_branch_frequency
        self.kv_branch_scale = kv_branch_scale
        self.ghost_once = ghost_once
        # per KV class: the tree ticks at which its clock rose and the values it rose to (ascending)
        self._kv_clock_ticks: defaultdict[int, list[int]] = defaultdict(list)
        self._kv_clock_values: defaultdict[int, list[float]] = defaultdict(list)
        # GreedyDual: per class, the priority of its last victim (the clock new priorities start from)
        self._clock: defaultdict[int, float] = defaultdict(float)
        # evicted, never-hit checkpoints: (depth, prefix fingerprint) -> kind, oldest first
        self._ghost: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._ghost_probe: tuple[object, int, str | None] = (None, 0, None)  # (rid, depth, kind)
        self._ghost_key: tuple[int, int] = (0, 0)  # the probed ghost's entry
        self.ghost_hits: defaultdict[str, int] = defaultdict(int)
        self.created: defaultdict[str, int] = defaultdict(int)
        self.hits: defaultdict[str, int] = defaultdict(int)
        self.evicted_unhit: defaultdict[str, int] = defaultdict(int)
        # supersession, learned the same way: superseded checkpoints later hit / evicted unhit
        self.superseded_hits = 0
        self.superseded_evicted = 0
        self.declined: defaultdict[str, int] = defaultdict(int)
        self._request_hit: tuple[object, int] = (None, 0)  # (rid, its hit at admission)
        self._rec: dict[int, _Record] = {}
        self._pending: tuple[int, str] | None = None
        self._dirty: list[TreeNode] = []
        self._admissions = 0

    # -------------------------------------------------------------------------------------- learning
    def resolved(self, kind: str) -> int:
        """Checkpoints of ``kind`` whose fate is known: hit at least once, or evicted unhit. O(1)."""
        return self.hits[kind] + self.evicted_unhit[kind]

    def rate(self, kind: str) -> float:
        """The learned hit ratio of ``kind``: (hit + 1) / (resolved + 2), the chance that a checkpoint of
        this kind is hit before it is evicted under the current pressure (Laplace-smoothed). O(1)."""
        return (self.hits[kind] + 1) / (self.resolved(kind) + 2)

    def superseded_rate(self) -> float:
        """The same ratio for superseded checkpoints (hit again / evicted while superseded). O(1)."""
        return (self.superseded_hits + 1) / (self.superseded_hits + self.superseded_evicted + 2)

    def _best_rate(self) -> float:
        rates = [self.rate(k) for k in list(self.created) if self.resolved(k) >= self.min_evidence]
        return max(rates, default=0.0)

    def _evicted(self, node: TreeNode | None) -> None:
        """``node`` is the next victim (its checkpoint goes): count it unhit if it was never hit."""
        if node is None or node.mamba_slot is None:
            return
        rec = self._rec.pop(node.id, None)
        if rec is None or rec.slot != node.mamba_slot:
            return
        if rec.superseded:
            self.superseded_evicted += 1
        if not rec.hit:
            self.evicted_unhit[rec.kind] += 1
            if self.ghost_size:
                self._ghost[(node.depth, node.prefix_fp)] = rec.kind
                if len(self._ghost) > self.ghost_size:
                    self._ghost.popitem(last=False)

    def _probe_ghosts(self, req: Req) -> None:
        """Remember the deepest ghost on ``req``'s prompt (resolved at its first hand-over, when its real
        hit is known). O(prompt / grid) look-ups plus one vectorised fingerprint pass."""
        self._ghost_probe = (req.rid, 0, None)
        if not self._ghost or self.tree is None:
            return
        tokens = req.origin_input_ids
        grid = self.tree.config.mamba_checkpoint_grid
        fps = PrefixFingerprints(np.asarray(tokens[:-1], dtype=np.int64))
        for depth in range((len(tokens) - 1) // grid * grid, 0, -grid):
            key = (depth, fps.at(depth))
            kind = self._ghost.get(key)
            if kind is not None:
                self._ghost_probe = (req.rid, depth, kind)
                self._ghost_key = key
                return

    def _resolve_ghost(self, rid: object, hit: int) -> None:
        """A ghost deeper than the real hit: that eviction cost a hit; count its kind as hit."""
        probe_rid, depth, kind = self._ghost_probe
        self._ghost_probe = (None, 0, None)
        if probe_rid != rid or kind is None or depth <= hit:
            return
        if self.ghost_once:  # one eviction turns into at most one hit (else the ratio can pass 1)
            self._ghost.pop(self._ghost_key, None)
        self.evicted_unhit[kind] -= 1
        self.hits[kind] += 1
        self.ghost_hits[kind] += 1

    def _observe(self, node: TreeNode) -> _Record:
        """Bring ``node``'s record up to date: a new checkpoint (counted, supersedes its ancestor) or a
        re-stamped one (a hit). O(1), O(path) for a new checkpoint."""
        rec = self._rec.get(node.id)
        slot = node.mamba_slot
        assert slot is not None
        if rec is None or rec.slot != slot:
            pending = self._pending
            kind = pending[1] if pending is not None and pending[0] == node.depth else "other"
            self._pending = None
            rec = _Record(node, slot, kind, node.mamba_last_access)
            self._rec[node.id] = rec
            self.created[kind] += 1
            if self.supersede:
                self._supersede_above(node, kind)
        elif node.mamba_last_access != rec.stamp:
            rec.stamp = node.mamba_last_access
            if not rec.hit:
                rec.hit = True
                self.hits[rec.kind] += 1
            rec.hit_count += 1
            if rec.superseded:
                self.superseded_hits += 1
            rec.superseded = False
        return rec

    def _supersede_above(self, node: TreeNode, kind: str) -> None:
        x = node.parent
        while x is not None and not x.is_root:
            if num_device_children(x) > 1:
                return  # a fork: the checkpoints above serve several branches (on the device)
            if x.mamba_slot is not None:
                rec = self._rec.get(x.id)
                if rec is not None and rec.slot == x.mamba_slot and not rec.superseded:
                    if self.rate(kind) < self.rate(rec.kind):
                        return  # a more valuable kind: it, and what it shields above, stay
                    rec.superseded = True
                    self._dirty.append(x)
            x = x.parent

    def _class(self, rec: _Record) -> int:
        """0 for a superseded checkpoint (unless superseded ones prove valuable), else 1 + how many
        halvings of the best kind's ratio its kind is above 1/16 of it (1..5). O(kinds)."""
        best = self._best_rate()
        if rec.superseded and (best <= 0 or self.superseded_rate() < self.low_ratio * best):
            return 0  # superseded ones go first until they prove to be hit
        if best <= 0:
            return 5
        ratio = self.rate(rec.kind) / best
        if not self.fine_classes:
            return 1 if ratio < self.low_ratio else 5
        return 1 + max(0, min(4, 4 + math.floor(math.log2(max(ratio, 1e-9)))))

    def _gain(self, node: TreeNode) -> int:
        """Tokens a hit on ``node``'s checkpoint saves over the nearest checkpoint above it. O(path)."""
        x = node.parent
        while x is not None and not x.is_root and x.mamba_slot is None:
            x = x.parent
        above = 0 if x is None or x.is_root else x.depth
        return node.depth - above

    def _priority(self, rec: _Record, cls: int) -> float:
        """The GreedyDual priority of ``rec``'s checkpoint in class ``cls``: restarted from the class's
        clock when it was handed over or hit (a new stamp) or changed class, kept otherwise. O(path)
        when restarted, else O(1)."""
        stamp = rec.node.mamba_last_access
        if rec.priority_stamp != stamp or rec.priority_class != cls:
            rec.priority = self._clock[cls] + self._gain(rec.node)
            rec.priority_class, rec.priority_stamp = cls, stamp
        return rec.priority

    # ------------------------------------------------------------------------------------------ keys
    def mamba_key(self, node: TreeNode) -> tuple[int, ...]:
        rec = self._observe(node)
        cls = self._class(rec)
        if not self.greedy_dual:
            return (cls, node.mamba_last_access, -node.depth, node.id)
        return (cls, self._priority(rec, cls), -node.depth, node.id)  # type: ignore[return-value]

    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        if node.mamba_slot is None:
            first = 0 if self.kv_only_first else 7
            return (first, node.last_access, -node.depth, node.id)
        rec = self._observe(node)
        cls = 1 + self._class(rec)
        if not self.kv_greedy_dual:
            return (cls, node.last_access, -node.depth, node.id)
        # ties (equal values touched in one clock generation) in LRU order, not deepest first
        return (cls, self._kv_priority(rec, cls), node.last_access, -node.depth, node.id)  # type: ignore[return-value]

    def _kv_clock_at(self, cls: int, tick: int) -> float:
        """The KV clock of class ``cls`` as it stood at tree time ``tick``. O(log victims)."""
        i = bisect.bisect_right(self._kv_clock_ticks[cls], tick)
        return self._kv_clock_values[cls][i - 1] if i else 0.0

    def _kv_value(self, rec: _Record) -> float:
        """What keeping the KV of ``rec``'s leaf is worth per clock generation: ``gain / size`` (tokens a
        hit on its checkpoint saves over the one above, per KV token the leaf's edge holds; 1 for every
        leaf with ``kv_size_aware=False``: LRU), times ``kv_branch_scale * (1 + hits)`` for a ``branch``
        checkpoint (a shared prefix junction: its past hits predict more). O(path)."""
        node = rec.node
        per_token = self._gain(node) / max(1, len(node.key))
        if self.kv_branch_frequency and rec.kind == "branch":
            return per_token * self.kv_branch_scale * (1 + rec.hit_count)
        return per_token if self.kv_size_aware else 1.0

    def _kv_priority(self, rec: _Record, cls: int) -> float:
        """GreedyDual priority of the KV of ``rec``'s leaf in KV class ``cls``: the class's KV clock as it
        stood when the leaf was last touched, plus :meth:`_kv_value`. Set when the leaf's stamp or class
        changes, kept otherwise (a node that becomes a leaf long after its last touch starts from the old
        clock, as in LRU, not from today's). O(path + log victims) when set, else O(1)."""
        node = rec.node
        if rec.kv_stamp != node.last_access or rec.kv_class != cls:
            rec.kv_priority = self._kv_clock_at(cls, node.last_access) + self._kv_value(rec)
            rec.kv_class, rec.kv_stamp = cls, node.last_access
        return rec.kv_priority

    def settle_keys(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._dirty:
            dirty, self._dirty = self._dirty, []
            self.rekey(dirty)

    def pick_mamba_victim(self, index: EvictionIndex) -> TreeNode | None:
        self._flush()
        victim = index.first_mamba()
        if victim is not None and self.greedy_dual and victim.mamba_evict_key is not None:
            cls, priority = victim.mamba_evict_key[0], victim.mamba_evict_key[1]
            self._clock[cls] = max(self._clock[cls], priority)  # the class ages to its victim
        self._evicted(victim)
        return victim

    def pick_full_victim(self, index: EvictionIndex) -> TreeNode | None:
        self._flush()
        victim = index.first_full()
        if victim is not None and self.kv_greedy_dual and victim.full_evict_key is not None:
            cls, priority = victim.full_evict_key[0], victim.full_evict_key[1]
            values = self._kv_clock_values[cls]
            if victim.mamba_slot is not None and (not values or priority > values[-1]):
                assert self.tree is not None
                ticks = self._kv_clock_ticks[cls]
                if ticks and ticks[-1] == self.tree.clock:
                    values[-1] = priority
                else:
                    ticks.append(self.tree.clock)
                    values.append(priority)
        self._evicted(victim)
        return victim

    # ------------------------------------------------------------------------------------- admission
    def on_admit(self, req: Req) -> None:
        self._flush()
        self._probe_ghosts(req)
        self._admissions += 1
        if self._admissions % self.rekey_every == 0 and self.tree is not None:
            live = [r.node for r in self._rec.values() if r.node.mamba_slot == r.slot]
            self._rec = {r.node.id: r for r in self._rec.values() if r.node.mamba_slot == r.slot}
            self.rekey(live)

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        assert self.tree is not None
        if self._request_hit[0] != req.rid:  # its first hand-over: cache_protected_len is still its hit
            self._request_hit = (req.rid, req.cache_protected_len)
            self._resolve_ghost(req.rid, req.cache_protected_len)
        kind = checkpoint_kind(req, seq_len, self.tree.config.mamba_checkpoint_grid)
        if self.continuation and 2 * self._request_hit[1] >= len(req.origin_input_ids):
            kind += "+"  # the request continued a cached prefix of at least half its prompt
        if (
            self.learn_admission
            and self.resolved(kind) >= self.min_evidence
            and self.rate(kind) < self.min_rate
            and (not self.relative_decline or self.rate(kind) < self.low_ratio * self._best_rate())
        ):
            self.declined[kind] += 1
            if self.declined[kind] % self.explore_every:
                return False
        self._pending = (seq_len, kind)
        return True
