"""Sift's successor, **Sift2**: finer checkpoint kinds, the block size learned online, and an admission
estimate that counts live never-hit checkpoints as misses.

Sift (:mod:`mamba_radix.policies.ours`) learns a hit ratio per checkpoint kind and declines the kinds that
are never hit. Its four kinds lump useful and useless hand-overs together on block traces: in an
infinite-capacity replay of the first 2,000 Mooncake conversation requests (issue 31) the chance that a
later request uses a checkpoint is 0.176 for the chunk end just before the prompt's last chunk but 0.008
for earlier chunk ends (both ``mid`` to Sift), and 0.235 for a prompt end on the trace's block boundary but
0.007 off it (both ``end``). Sift2 keeps every mechanism of Sift (supersession, GreedyDual for checkpoints
and for KV leaves, ghosts) and changes three things:

1. **Seven kinds** (:meth:`Sift2.kind`): ``decode`` (past the prompt); ``branch`` (the branch point a KV
   match found, in the prompt's last chunk: what a sibling continuation shares) and ``branch-early`` (in
   an earlier chunk); ``end-block`` (within one grid step of the prompt's end, on a block boundary) and
   ``end`` (off it); ``mid-last`` (a chunk end after which at most one chunk of the prompt remains: the
   deepest state a continuation that shares the prompt's full blocks can reach) and ``mid`` (earlier
   chunk ends). The chunk is the config's ``chunked_prefill_size``; the block is learned (2.).
2. **The block size, learned online from KV-match lengths** (:meth:`Sift2.on_hit`): a block trace matches
   whole blocks only (the last partial block of a prompt hashes differently from the full block a
   continuation holds there), so the largest power of two that divides at least ``block_share`` of the
   non-zero KV-match lengths is the block (512 on the conversation trace; 1 on real-token chat, where
   matches end anywhere: then every end is ``end-block`` and the kind is Sift's ``end``). Until
   ``block_evidence`` matches are seen every end counts as on a block (Sift's kind). No trace constant.
3. **Live never-hit checkpoints count as misses in the admission estimate**
   (:meth:`Sift2.admission_rate`: ``(hits + 1) / (created + 2)`` instead of ``(hits + 1) / (resolved +
   2)``), and a kind's evidence is its created checkpoints (``min_evidence`` of them): a useful checkpoint
   is hit once, hundreds of requests after its hand-over, so while slots are ample almost nothing is
   resolved and Sift's ratio of the few resolved ones said 0.985 for ``branch``; Sift2 declines a useless
   kind after ``min_evidence`` hand-overs instead of ``min_evidence`` evictions. Eviction classes and
   supersession keep Sift's resolved ratio (the live-miss ratio there cost the synthetic chat and agent
   workloads: agent loops at 8 slots 0.8228 against 0.8576).

Measured (first 2,000 conversation requests, sequential, extra_buffer, equal bytes; fraction of the
SGLang 0.5.23 -> oracle gap): 8M KV tokens / 1,024 slots 0.69 (Sift 0.58), 8M / 256 0.65 (Sift 0.57);
requests 2,000-3,999 at the same points 0.60 and 0.54 (Sift 0.54, 0.47); on the synthetic workloads at the main
job's points the same hit rates as Sift. Where KV binds it is below Sift (2M KV / 256 slots 0.20 against 0.24,
1.76M KV with ample slots 0.10 against 0.16): declining the off-block prompt ends also frees the KV of the
prompt's last chunk, where a continuation finds its branch point, and that use is credited to the ``branch``
kind the continuation creates, not to the ``end`` that kept the KV. Hence a successor, not a change to Sift. Tried and not kept (each an
ablation switch or noted): ``ckpt_weighted`` (a checkpoint's GreedyDual gain times its kind's ratio:
conversation 8M / 256 0.66, but chat at 8 slots 0.4052 against Sift's 0.4240 and trees at 8 slots
0.6626 against 0.6932); the live-miss ratio and created-count evidence also in the eviction classes
(conversation 0.73 / 0.70, but chat at 8 slots 0.3736, below SGLang's 0.3780); the KV value times the
kind's ratio (conversation 8M / 1,024 0.65); crediting a branch found in a leaf's KV to the checkpoint that
kept that KV (the first checkpoint below the KV match on a fork-free chain counted as hit): 8M / 256 0.70 and
2M / 1,024 0.105 (Sift 0.055), but 8M / 1,024 0.56 and 2M / 256 0.21 (Sift 0.24).

Costs: Sift's, plus O(log2 of the match) per admission match. Online: nothing here reads the future.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from mamba_radix.policies.ours import Sift

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.policies.ours import _Record
    from mamba_radix.request import Req

__all__ = ["SIFT2_KINDS", "Sift2"]

SIFT2_KINDS: tuple[str, ...] = (
    "decode",
    "branch",
    "branch-early",
    "end-block",
    "end",
    "mid-last",
    "mid",
    "other",
)
# the largest block tried is 2**MAX_BLOCK_EXP tokens (a KV-match length is at most a prompt)
MAX_BLOCK_EXP = 20


class Sift2(Sift):
    """Sift with seven kinds, the block learned from KV matches and live never-hit checkpoints counted as
    misses at admission (see the module docstring). Keywords besides its own go to :class:`Sift`."""

    name: ClassVar[str] = "sift2"

    def __init__(
        self,
        *,
        block_share: float = 0.75,
        block_evidence: int = 16,
        live_misses: bool = True,
        ckpt_weighted: bool = False,
        **sift_options: Any,
    ) -> None:
        super().__init__(**sift_options)
        self.block_share = block_share
        self.block_evidence = block_evidence
        self.live_misses = live_misses
        self.ckpt_weighted = ckpt_weighted
        self.kv_matches = 0  # non-zero KV-match lengths seen
        self._divisible = [0] * (MAX_BLOCK_EXP + 1)  # of them, how many 2**e divides
        self.block: int | None = None  # learned; None until block_evidence matches

    # -------------------------------------------------------------------------------------- learning
    def on_hit(self, req: Req) -> None:
        """Count ``req``'s KV-match length towards the block size. O(MAX_BLOCK_EXP)."""
        n = req.full_kv_hit_len
        if n <= 0:
            return
        self.kv_matches += 1
        e = 0
        while e <= MAX_BLOCK_EXP and n % (1 << e) == 0:
            self._divisible[e] += 1
            e += 1
        if self.kv_matches >= self.block_evidence:
            need = self.block_share * self.kv_matches
            self.block = 1 << max(e for e in range(MAX_BLOCK_EXP + 1) if self._divisible[e] >= need)

    def admission_rate(self, kind: str) -> float:
        """The chance that a checkpoint of ``kind`` is ever hit, live never-hit ones counted as misses:
        ``(hits + 1) / (created + 2)`` (Sift's resolved ratio with ``live_misses=False``). O(1)."""
        if not self.live_misses:
            return self.rate(kind)
        return (self.hits[kind] + 1) / (self.created[kind] + 2)

    def evidence(self, kind: str) -> int:
        """Checkpoints of ``kind`` the admission estimate rests on: created (resolved without
        ``live_misses``). O(1)."""
        return self.created[kind] if self.live_misses else self.resolved(kind)

    def _best_admission_rate(self) -> float:
        rates = [self.admission_rate(k) for k in list(self.created) if self.evidence(k) >= self.min_evidence]
        return max(rates, default=0.0)

    # ------------------------------------------------------------------------------------------ keys
    def _priority(self, rec: _Record, cls: int) -> float:
        """Sift's GreedyDual priority; with ``ckpt_weighted`` the gain is times the kind's ratio."""
        if not self.ckpt_weighted:
            return super()._priority(rec, cls)
        stamp = rec.node.mamba_last_access
        if rec.priority_stamp != stamp or rec.priority_class != cls:
            rec.priority = self._clock[cls] + self._gain(rec.node) * self.rate(rec.kind)
            rec.priority_class, rec.priority_stamp = cls, stamp
        return rec.priority

    def _kv_value(self, rec: _Record) -> float:
        """Sift's KV value, the junction bonus for both branch kinds (Sift's ``branch`` is both). O(path)."""
        node = rec.node
        per_token = self._gain(node) / max(1, len(node.key))
        if self.kv_branch_frequency and rec.kind in ("branch", "branch-early"):
            return per_token * self.kv_branch_scale * (1 + rec.hit_count)
        return per_token if self.kv_size_aware else 1.0

    # ------------------------------------------------------------------------------------- admission
    def kind(self, req: Req, seq_len: int) -> str:
        """The kind of ``req``'s hand-over at ``seq_len`` (one of :data:`SIFT2_KINDS`). O(1)."""
        assert self.tree is not None
        config = self.tree.config
        input_len = len(req.origin_input_ids)
        if seq_len > input_len:
            return "decode"
        chunk = config.chunked_prefill_size
        last_chunk = chunk <= 0 or input_len - seq_len <= chunk  # at most one chunk of the prompt left
        if req.mamba_branching_seqlen == seq_len:
            return "branch" if last_chunk else "branch-early"
        if input_len - seq_len < config.mamba_checkpoint_grid:
            block = self.block or 1  # until the evidence says otherwise, every end is on a block
            return "end-block" if seq_len % block == 0 else "end"
        return "mid-last" if last_chunk else "mid"

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        """Sift's admission on :meth:`kind` and :meth:`admission_rate`: decline a kind with at least
        ``min_evidence`` created checkpoints whose ratio is below ``min_rate`` and below ``low_ratio`` of
        the best kind's, except every ``explore_every``-th. Side effect: counts a declined one. O(kinds)."""
        if self._request_hit[0] != req.rid:  # its first hand-over: cache_protected_len is still its hit
            self._request_hit = (req.rid, req.cache_protected_len)
            self._resolve_ghost(req.rid, req.cache_protected_len)
        kind = self.kind(req, seq_len)
        rate = self.admission_rate(kind)
        if (
            self.learn_admission
            and self.evidence(kind) >= self.min_evidence
            and rate < self.min_rate
            and (not self.relative_decline or rate < self.low_ratio * self._best_admission_rate())
        ):
            self.declined[kind] += 1
            if self.declined[kind] % self.explore_every:
                return False
        self._pending = (seq_len, kind)
        return True
