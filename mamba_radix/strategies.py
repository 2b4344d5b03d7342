"""Checkpoint positions and slot accounting per buffer strategy (DESIGN.md §6, sglang-semantics §7).

Pure functions of a :class:`~mamba_radix.config.CacheConfig`; the engine loop (``mamba_radix.sim``) and
the property tests ask them *where* a checkpoint is taken, the cache (:mod:`mamba_radix.cache`) decides
what happens to it.

=====================  ==========================  ================================================
strategy               slots per running request   checkpoints
=====================  ==========================  ================================================
``no_buffer``          3                           the live slot is copied at every chunk end; the
                                                   live slot itself goes to the tree at finish
``extra_buffer``       3 + P (P = 2 with overlap)  one per prefill chunk at its last grid-aligned
                                                   position (or the branch point), one per decode
                                                   boundary; the ping-pong slot is donated, no copy
``extra_buffer_lazy``  3 + 1                       as extra_buffer; the second ping-pong slot is
                                                   borrowed only at a decode boundary
=====================  ==========================  ================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mamba_radix.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.request import Req

__all__ = [
    "admission_slots",
    "is_decode_boundary",
    "max_checkpoints_per_request",
    "prefill_track_len",
]


def _check_len(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{what} must be an int >= 0, got {value!r}")
    return value


def prefill_track_len(
    config: CacheConfig, chunk_start: int, extend_len: int, branching_seqlen: int | None
) -> int | None:
    """The absolute sequence length at which a prefill chunk ``[chunk_start, chunk_start + extend_len)``
    checkpoints its state into the ping-pong track slot, or ``None`` for no checkpoint.

    extra_buffer(_lazy): ``chunk_start + floor(extend_len / grid) * grid`` with
    ``grid = config.mamba_checkpoint_grid`` (positions counted from the chunk's own start, as SGLang counts
    them from the request's prefix start); the branch point instead when
    ``chunk_start < branching_seqlen < chunk_start + extend_len`` and
    ``(branching_seqlen - chunk_start) % grid == 0`` (so the next request sharing this prefix up to the
    branch finds a checkpoint there); ``None`` when ``extend_len < grid`` (SGLang never tracks such a
    short chunk, PR #30938). no_buffer: always ``None`` (it copies the live slot at chunk ends). O(1).
    """
    _check_len(chunk_start, "chunk_start")
    _check_len(extend_len, "extend_len")
    if branching_seqlen is not None:
        _check_len(branching_seqlen, "branching_seqlen")
    if not config.uses_extra_buffer:
        return None
    grid = config.mamba_checkpoint_grid
    if extend_len < grid:
        return None
    end = chunk_start + extend_len
    if (
        branching_seqlen is not None
        and chunk_start < branching_seqlen < end
        and (branching_seqlen - chunk_start) % grid == 0
    ):
        return branching_seqlen
    return chunk_start + extend_len // grid * grid


def is_decode_boundary(config: CacheConfig, seq_len: int) -> bool:
    """Whether decode checkpoints the state at ``seq_len`` (tokens whose KV is committed):
    ``seq_len % mamba_track_interval == 0`` under extra_buffer(_lazy). Always ``False`` under no_buffer,
    which takes no decode checkpoints (its live slot goes to the tree at finish). O(1)."""
    _check_len(seq_len, "seq_len")
    if not config.uses_extra_buffer or seq_len == 0:
        return False
    return seq_len % config.mamba_track_interval == 0


def admission_slots(config: CacheConfig, req: Req) -> int:
    """State slots :meth:`HybridReqToTokenPool.alloc` takes to admit ``req``: a live slot unless it has
    one (a copy-on-write hit gave it one), plus its track buffer unless it has one (``P`` eager, 1 lazy).
    O(1)."""
    live = 1 if req.mamba_pool_idx is None else 0
    if config.ping_pong_size == 0 or req.mamba_ping_pong_track_buffer is not None:
        return live
    return live + (1 if config.is_lazy else config.ping_pong_size)


def max_checkpoints_per_request(config: CacheConfig, input_len: int) -> int:
    """Checkpoints one request can add, as the seeds count them: one per finished prefill chunk plus the
    last decode one, ``input_len // chunked_prefill_size + 2`` (2 without chunking). O(1)."""
    _check_len(input_len, "input_len")
    if config.chunked_prefill_size < 0:
        return 2
    return input_len // config.chunked_prefill_size + 2
