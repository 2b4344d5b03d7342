"""The per-request record shared by the pools, the cache and an engine loop.

Field ownership (one writer per field):

- the engine: ``rid``, ``origin_input_ids``, ``output_ids`` (it appends each sampled token),
  ``extra_key``. An engine that drives the SGLang-named low-level calls itself instead of the lifecycle
  also sets ``kv_len`` (tokens whose KV is in the row) and ``mamba_last_track_seqlen``;
- :class:`~mamba_radix.pools.HybridReqToTokenPool`: ``req_pool_idx``, ``mamba_pool_idx`` (the live state
  slot), ``mamba_ping_pong_track_buffer`` and the lazy bookkeeping;
- :class:`~mamba_radix.cache.MambaRadixCache` and its lifecycle (:mod:`mamba_radix.lifecycle`):
  ``prefix_indices``, ``last_node``, ``cache_protected_len``, ``full_kv_hit_len``, ``mamba_branching_seqlen``,
  ``mamba_cow_src_slot``, ``kv_len``, ``mamba_last_track_seqlen`` and ``mamba_next_track_idx`` (through
  :meth:`~mamba_radix.lifecycle.RequestLifecycle.commit`), ``kv_reserved_tokens``, ``prefill_chunks``,
  ``pending_plan``, ``finished``.

The region map of a running request (who owns which positions and slots) is in one place: the
module docstring of :mod:`mamba_radix.lifecycle`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode

__all__ = ["Req"]


def _joined(head: list[int] | array, tail: list[int]) -> list[int]:
    """``head + tail`` as a new list, for a prompt held as a list or as an ``array('q')``. O(len)."""
    return head + tail if type(head) is list else [*head, *tail]


def _empty_indices() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass(eq=False)
class Req:
    """One request. ``eq=False``: requests compare and hash by identity."""

    rid: Any
    origin_input_ids: list[int] | array  # a list (SGLang's type) or an int64 array('q')
    output_ids: list[int] = field(default_factory=list)
    extra_key: str | None = None

    # engine progress
    kv_len: int = 0
    mamba_last_track_seqlen: int | None = None
    finished: bool = False

    # pool bookkeeping
    req_pool_idx: int | None = None
    mamba_pool_idx: int | None = None
    mamba_ping_pong_track_buffer: list[int] | None = None
    mamba_next_track_idx: int = 0
    mamba_lazy_is_insert: bool = True

    # cache bookkeeping
    prefix_indices: torch.Tensor = field(default_factory=_empty_indices)  # the hit's KV, at admission
    last_node: TreeNode | None = None
    cache_protected_len: int = 0
    full_kv_hit_len: int = 0  # KV the admission match found, possibly deeper than the hit
    mamba_branching_seqlen: int | None = None
    mamba_cow_src_slot: int | None = None

    # lifecycle bookkeeping
    kv_reserved_tokens: int = 0  # KV tokens reserved at admission and not yet allocated
    prefill_chunks: int = 0  # prefill forwards committed
    pending_plan: Any = None  # the ForwardPlan extend returned and commit has not taken yet

    @property
    def all_token_ids(self) -> list[int]:
        """Input followed by output tokens (a new list)."""
        return _joined(self.origin_input_ids, self.output_ids)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of input + output: a new list (an ``array('q')`` slice when they lie in a
        prompt held as one). O(end - start)."""
        n_in = len(self.origin_input_ids)
        if end <= n_in:
            return self.origin_input_ids[start:end]
        if start >= n_in:
            return self.output_ids[start - n_in : end - n_in]
        return _joined(self.origin_input_ids[start:], self.output_ids[: end - n_in])

    def token_ids(self, num_tokens: int) -> list[int]:
        """The first ``num_tokens`` tokens of input + output (as :meth:`token_slice`)."""
        n_in = len(self.origin_input_ids)
        if num_tokens <= n_in:
            return self.origin_input_ids[:num_tokens]
        return _joined(self.origin_input_ids, self.output_ids[: num_tokens - n_in])

    def defer_prefix_indices(self, source: Any) -> None:
        """Set ``prefix_indices`` to ``source.device_indices``, read on first access instead of now (the
        cache's admission match: the hit's KV is written into the request row from the tree's chunks,
        and the concatenated tensor, ~10 us on a 12k-token hit, is built only if someone reads it).
        ``source`` must give the same tensor whenever it is read (a match's result does: the tree never
        changes a node's indices in place)."""
        self._prefix_indices = None
        self._prefix_source = source


# Plain attribute stores only (set in the same order by every __init__, never deleted): CPython keeps the
# instance's attributes in its shared-key layout, which the interpreter's attribute caches rely on; a
# deleted or late-added key would slow every attribute read of the request (~10% on extend and commit).
def _get_prefix_indices(self: Req) -> torch.Tensor:
    value = self._prefix_indices
    if value is None:  # deferred: read once, then kept
        value = self._prefix_indices = self._prefix_source.device_indices
        self._prefix_source = None
    return value


def _set_prefix_indices(self: Req, value: torch.Tensor) -> None:
    self._prefix_indices = value
    self._prefix_source = None


# ``prefix_indices`` stays a dataclass field (constructor argument, repr, fields(), replace()); reads and
# writes go through this property so that the cache can defer the value (Req.defer_prefix_indices).
Req.prefix_indices = property(  # type: ignore[assignment]
    _get_prefix_indices,
    _set_prefix_indices,
    doc="The hit's KV indices (int64, [0, cache_protected_len)), set by the admission match.",
)
