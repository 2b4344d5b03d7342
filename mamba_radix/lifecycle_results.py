"""What the request lifecycle (:mod:`mamba_radix.lifecycle`) hands back to an engine: the admission
verdict (:class:`AdmitCheck`), the plan of one forward (:class:`ForwardPlan`) and a request's deferred
cached prefix (:class:`PrefixKV`). Plain records, re-exported from :mod:`mamba_radix.lifecycle`, where
callers import them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mamba_radix.request import Req

__all__ = ["ADMIT_REASONS", "AdmitCheck", "ForwardPlan", "PrefixKV"]

# Why can_admit says no: a request row, state slots or KV tokens are short now; or the request can never
# fit (longer than a request row or than the whole KV pool).
ADMIT_REASONS: tuple[str, ...] = ("req_rows", "state_slots", "kv_tokens", "too_long")


class AdmitCheck(NamedTuple):
    """What :meth:`~mamba_radix.lifecycle.RequestLifecycle.can_admit` found."""

    ok: bool
    reason: str | None  # one of ADMIT_REASONS when not ok
    hit_len: int  # the usable hit admission would find now
    full_kv_hit_len: int  # KV matched, possibly deeper than the hit
    kv_tokens_needed: int  # KV tokens the request will still allocate (reserved at admission)
    state_slots_needed: int  # slots admission takes (live slot and track buffer)


class ForwardPlan(NamedTuple):
    """One forward the engine must run for ``req``: tokens ``[start, end)`` of ``req.all_token_ids``.

    The model reads the state at ``start`` from ``live_slot`` and leaves the state at ``end`` there;
    writes the tokens' KV at ``kv_indices`` (also in the request's ``req_to_token`` row; the KV of
    ``[0, start)`` is the row's prefix); and, when ``track_slot`` is set, also writes the state at
    ``track_len`` (``start < track_len <= end``) into ``track_slot``.
    """

    req: Req
    start: int
    end: int
    kv_indices: torch.Tensor  # int64, end - start entries
    live_slot: int
    track_slot: int | None
    track_len: int | None
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


class PrefixKV:
    """The KV indices of a request's cached prefix, from its path's node values, concatenated when first
    read (a deferred ``req.prefix_indices``, :meth:`Req.defer_prefix_indices`). The node values never
    change in place, so a late read is exact."""

    __slots__ = ("_chunks", "_device")

    def __init__(self, chunks: tuple[torch.Tensor, ...], device: torch.device) -> None:
        self._chunks = chunks
        self._device = device

    @property
    def device_indices(self) -> torch.Tensor:
        """A new int64 tensor. O(prefix tokens)."""
        if not self._chunks:
            return torch.empty(0, dtype=torch.int64, device=self._device)
        return torch.cat(self._chunks)
