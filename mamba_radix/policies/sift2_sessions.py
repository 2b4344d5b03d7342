"""**Sift2-sessions**: Sift2 that also knows each request's session id, and evicts the checkpoints and
KV of sessions that have gone quiet first.

A conversation's next turn hits the checkpoint its previous turn left, hundreds of requests later (the
reuse-by-age curve of :mod:`mamba_radix.sim.sessions`: 1 % within 50 requests, half after about 430). Sift2
cannot tell a checkpoint whose session is still thinking from one whose session has ended; a session id
can, given the think time. Sift2-sessions learns, online, the gap in requests between a session's
consecutive turns; a session idle for longer than the ``alive_quantile`` of those gaps (once
``min_gaps`` are seen) is *dead*. A checkpoint belongs to the session of the request that handed it over,
and to that of the last request that hit it (a shared prefix lives as long as its latest user). Then:

- a dead session's checkpoints are evicted first (class 0, with Sift's superseded ones);
- a dead session's KV leaves are evicted first (with the KV past the deepest state);
- admission, supersession and everything else are Sift2's.

Requests without a session id (``TraceRequest.session_id`` is ``None``: the bundled Mooncake traces) make
it Sift2 exactly. The ids are read per request at admission (``req.rid`` is the trace index): nothing
here reads the future. Costs: Sift2's, plus O(1) per admission and key, O(log gaps) per admission for the
quantile (a sorted list of the gaps).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from mamba_radix.policies.sift2 import Sift2

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode
    from mamba_radix.policies.ours import _Record
    from mamba_radix.request import Req

__all__ = ["Sift2Sessions"]


class Sift2Sessions(Sift2):
    """Sift2 with dead sessions' checkpoints and KV evicted first (see the module docstring).
    ``session_ids[rid]``: the session of trace request ``rid`` (``None``: unknown)."""

    name: ClassVar[str] = "sift2-sessions"

    def __init__(
        self,
        session_ids: Sequence[Any] = (),
        *,
        alive_quantile: float = 0.95,
        min_gaps: int = 16,
        **sift2_options: Any,
    ) -> None:
        super().__init__(**sift2_options)
        self.session_ids = list(session_ids)
        self.alive_quantile = alive_quantile
        self.min_gaps = min_gaps
        self.now = 0  # admissions so far: the clock think gaps are counted in
        self.last_seen: dict[Any, int] = {}  # session -> the admission count of its latest request
        self._gaps: list[int] = []  # gaps between a session's consecutive turns, sorted
        self._owner: dict[int, tuple[int, Any]] = {}  # node id -> (its slot, its session)
        self._handing: Any = None  # the session of the request whose hand-over is pending

    # -------------------------------------------------------------------------------------- sessions
    def _session(self, rid: object) -> Any:
        if isinstance(rid, int) and 0 <= rid < len(self.session_ids):
            return self.session_ids[rid]
        return None

    def horizon(self) -> float:
        """Idle requests past which a session counts as dead: the ``alive_quantile`` of the learned gaps
        (infinite until ``min_gaps`` are seen). O(1)."""
        if len(self._gaps) < self.min_gaps:
            return float("inf")
        return self._gaps[min(len(self._gaps) - 1, int(self.alive_quantile * len(self._gaps)))]

    def is_dead(self, session: Any) -> bool:
        """Whether ``session`` has been idle longer than :meth:`horizon`. O(1)."""
        if session is None:
            return False
        seen = self.last_seen.get(session)
        return seen is not None and self.now - seen > self.horizon()

    def _dead_node(self, node: TreeNode) -> bool:
        owner = self._owner.get(node.id)
        return owner is not None and owner[0] == node.mamba_slot and self.is_dead(owner[1])

    # ------------------------------------------------------------------------------------------ hooks
    def on_admit(self, req: Req) -> None:
        """Count the request's turn: the gap since its session's last one is learned. O(log gaps)."""
        self.now += 1
        session = self._session(req.rid)
        if session is not None:
            seen = self.last_seen.get(session)
            if seen is not None:
                bisect.insort(self._gaps, self.now - seen)
            self.last_seen[session] = self.now
        super().on_admit(req)

    def on_hit(self, req: Req) -> None:
        """The checkpoint the request hit now belongs to its session too. O(1)."""
        super().on_hit(req)
        session = self._session(req.rid)
        node = req.last_node
        if session is not None and node is not None and node.mamba_slot is not None:
            self._owner[node.id] = (node.mamba_slot, session)

    def admit_checkpoint(self, req: Req, seq_len: int) -> bool:
        admitted = super().admit_checkpoint(req, seq_len)
        if admitted:
            self._handing = self._session(req.rid)
        return admitted

    def _observe(self, node: TreeNode) -> _Record:
        known = self._rec.get(node.id)
        rec = super()._observe(node)
        if known is not rec and self._handing is not None:  # a new checkpoint: its hand-over's session
            self._owner[node.id] = (rec.slot, self._handing)
        return rec

    def _class(self, rec: _Record) -> int:
        if self._dead_node(rec.node):
            return 0
        return super()._class(rec)

    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        if node.mamba_slot is not None and self._dead_node(node):
            return (0, node.last_access, -node.depth, node.id)
        return super().full_key(node)
