"""The request as SGLang's scheduler and cache see it (``schedule_batch.Req``'s cache fields), over the
core's :class:`mamba_radix.Req`.

SGLang keeps slot ids in tensors (``req.mamba_pool_idx`` is a 0-d int64 tensor, the ping-pong buffer a
1-d one); the core keeps plain ints, which its pools check and index in O(1). This record holds a core
request (:attr:`Req.core`, the one the compat pools and cache hand to the core) and shows its fields under
SGLang's names and types. One writer per field, as in :mod:`mamba_radix.request`: the engine writes
``output_ids``, ``kv_committed_len``, ``mamba_last_track_seqlen``, ``mamba_next_track_idx`` and
``reasoning_tokens``, and SGLang's scheduler the match's fields after an admission match
(``prefix_indices``, ``last_node``, ``cache_protected_len``, ``mamba_branching_seqlen``: the core's
``match_prefix(req=...)`` sets the same values, and the lifecycle checks them at its next call); the pool
writes the slots, and a write to them from outside is refused (:class:`~mamba_radix.errors.InvalidArgument`)
because it would make the pool's ownership record stale. Every access is O(1) but the tensor-valued ones, which build a small tensor.
"""

from __future__ import annotations

from array import array
from typing import Any, NamedTuple

import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.request import Req as CoreReq

__all__ = ["Req", "as_core_req"]


def as_core_req(req: object) -> CoreReq:
    """The core request behind ``req`` (an SGLang-shaped :class:`Req` or a core request). O(1)."""
    if isinstance(req, Req):
        return req.core
    if isinstance(req, CoreReq):
        return req
    raise InvalidArgument(f"expected a request (compat Req or mamba_radix.Req), got {type(req).__name__}")


class ExtendRange(NamedTuple):
    start: int
    end: int


class Req:
    """SGLang's request constructor form: ``Req(rid, origin_input_text, origin_input_ids,
    sampling_params)``. ``origin_input_text`` and ``sampling_params`` are kept for the caller and not read.
    ``origin_input_ids``: a list or an ``array('q')`` (SGLang's type; it may be empty for a request that
    only takes pool slots)."""

    def __init__(
        self,
        rid: Any,
        origin_input_text: str = "",
        origin_input_ids: list[int] | array | None = None,
        sampling_params: Any = None,
        *,
        extra_key: str | None = None,
    ) -> None:
        ids = array("q") if origin_input_ids is None else origin_input_ids
        self.core = CoreReq(rid=rid, origin_input_ids=ids, extra_key=extra_key)
        self.origin_input_text = origin_input_text
        self.sampling_params = sampling_params
        self.reasoning_tokens = (
            0  # output tokens that were reasoning (SGLang's counter; strip_thinking_cache)
        )

    def __repr__(self) -> str:
        return f"compat.sglang.Req(rid={self.rid!r}, core={self.core!r})"

    # ------------------------------------------------------------------------------- engine's fields
    @property
    def rid(self) -> Any:
        return self.core.rid

    @property
    def origin_input_ids(self) -> list[int] | array:
        return self.core.origin_input_ids

    @origin_input_ids.setter
    def origin_input_ids(self, value: list[int] | array) -> None:
        self.core.origin_input_ids = value

    @property
    def output_ids(self) -> list[int]:
        return self.core.output_ids

    @output_ids.setter
    def output_ids(self, value: list[int]) -> None:
        self.core.output_ids = value

    @property
    def extra_key(self) -> str | None:
        return self.core.extra_key

    @extra_key.setter
    def extra_key(self, value: str | None) -> None:
        self.core.extra_key = value

    @property
    def fill_ids(self) -> list[int]:
        """Input then output tokens (a new list)."""
        return self.core.all_token_ids

    @property
    def kv_committed_len(self) -> int:
        """Tokens whose KV is in the request row (the core's ``kv_len``)."""
        return self.core.kv_len

    @kv_committed_len.setter
    def kv_committed_len(self, value: int) -> None:
        self.core.kv_len = value

    @property
    def mamba_last_track_seqlen(self) -> int | None:
        return self.core.mamba_last_track_seqlen

    @mamba_last_track_seqlen.setter
    def mamba_last_track_seqlen(self, value: int | None) -> None:
        self.core.mamba_last_track_seqlen = value

    @property
    def mamba_next_track_idx(self) -> int:
        return self.core.mamba_next_track_idx

    @mamba_next_track_idx.setter
    def mamba_next_track_idx(self, value: int) -> None:
        self.core.mamba_next_track_idx = value

    def finished(self) -> bool:
        return self.core.finished

    def set_extend_range(self, start: int, end: int) -> None:
        """The scheduler's next forward span (kept for the caller; the cache does not read it)."""
        self.extend_range = ExtendRange(start, end)

    def pop_overallocated_kv_cache(self) -> tuple[int, int]:
        """SGLang's KV the scheduler frees after a finish (past the committed length). The core's
        ``cache_finished_req`` frees every index of the request past the inserted checkpoint itself, so
        nothing is left to the caller: an empty span at ``kv_committed_len``. O(1)."""
        return self.kv_committed_len, self.kv_committed_len

    # ------------------------------------------------------------------------- pool's and cache's fields
    @property
    def req_pool_idx(self) -> int | None:
        return self.core.req_pool_idx

    @property
    def mamba_pool_idx(self) -> torch.Tensor | None:
        """The live state slot as SGLang's 0-d int64 tensor (``None``: none held). A new tensor each read."""
        slot = self.core.mamba_pool_idx
        return None if slot is None else torch.tensor(slot, dtype=torch.int64)

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: object) -> None:
        current = self.core.mamba_pool_idx
        if value is None and current is None:
            return
        raise InvalidArgument(
            f"request {self.rid!r}: mamba_pool_idx is the pool's field (it holds slot {current}); release the "
            "slot with req_to_token_pool.free_mamba_cache(req) or hand it to the tree with insert / "
            "cache_finished_req instead of overwriting it"
        )

    @property
    def mamba_ping_pong_track_buffer(self) -> torch.Tensor | None:
        buffer = self.core.mamba_ping_pong_track_buffer
        return None if buffer is None else torch.tensor(buffer, dtype=torch.int64)

    @property
    def prefix_indices(self) -> torch.Tensor:
        """The cached prefix's KV indices, ``len == cache_protected_len``."""
        return self.core.prefix_indices

    @prefix_indices.setter
    def prefix_indices(self, value: torch.Tensor) -> None:
        self.core.prefix_indices = value

    @property
    def last_node(self) -> Any:
        return self.core.last_node

    @last_node.setter
    def last_node(self, value: Any) -> None:
        self.core.last_node = value

    @property
    def cache_protected_len(self) -> int:
        return self.core.cache_protected_len

    @cache_protected_len.setter
    def cache_protected_len(self, value: int) -> None:
        self.core.cache_protected_len = value

    @property
    def mamba_branching_seqlen(self) -> int | None:
        return self.core.mamba_branching_seqlen

    @mamba_branching_seqlen.setter
    def mamba_branching_seqlen(self, value: int | None) -> None:
        self.core.mamba_branching_seqlen = value

    @property
    def full_kv_hit_len(self) -> int:
        return self.core.full_kv_hit_len
