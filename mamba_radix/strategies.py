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

Under extra_buffer(_lazy), ``mamba_checkpoint_admission="branch_and_end"`` (Marconi's admission) keeps
only the prefill checkpoints at the branch point and at the input's end (:func:`prefill_track_len`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mamba_radix.errors import InvalidArgument, check_count

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.request import Req

__all__ = [
    "admission_slots",
    "is_decode_boundary",
    "max_checkpoints_per_request",
    "prefill_track_len",
]


def prefill_track_len(
    config: CacheConfig,
    chunk_start: int,
    extend_len: int,
    branching_seqlen: int | None,
    *,
    input_len: int | None = None,
) -> int | None:
    """The absolute sequence length at which a prefill chunk ``[chunk_start, chunk_start + extend_len)``
    checkpoints its state into the ping-pong track slot, or ``None`` for no checkpoint.

    ``input_len`` is the request's prompt length (prefill runs to it). Only ``branch_and_end`` admission
    needs it (it raises :class:`InvalidArgument` without it); with ``all`` it is only checked.

    Every chunk shorter than the grid (``grid = config.mamba_checkpoint_grid``) gets ``None``: SGLang never
    tracks such a chunk (PR #30938). Positions are counted on the grid from the chunk's own start, as
    SGLang counts them from the request's prefix start. no_buffer: always ``None`` (it copies the live slot
    at chunk ends, whatever the admission). Then, by ``config.mamba_checkpoint_admission``:

    - ``all`` (SGLang's extra_buffer): every chunk checkpoints, at
      ``chunk_start + floor(extend_len / grid) * grid``; at the branch point instead when
      ``chunk_start < branching_seqlen < chunk_start + extend_len`` and
      ``(branching_seqlen - chunk_start) % grid == 0`` (so the next request sharing this prefix up to
      the branch finds a checkpoint there).
    - ``branch_and_end`` (Marconi's admission, reference/anchors.md §1.1, in our terms): a prompt keeps
      at most two prefill checkpoints, one at the branch point and one at its end; the per-chunk ones in
      between are skipped. (1) The chunk holding the branch point (``chunk_start < branching_seqlen <=
      chunk_start + extend_len``) checkpoints at the last grid position not past it,
      ``chunk_start + floor((branching_seqlen - chunk_start) / grid) * grid``, when that is inside the
      chunk (a checkpoint past the branch would sit in this request's own suffix, useless to the
      siblings the branch point is for). (2) Otherwise the chunk holding the input's last aligned
      position, i.e. the chunk after which fewer than ``grid`` prompt tokens remain
      (``input_len - chunk_end < grid``: the last chunk, or the one before a tail too short to track),
      checkpoints at its aligned end, as ``all`` does. A chunk holding both keeps the branch point, as
      ``all`` does; the end state then comes from the decode checkpoints and the finish.

    Decode checkpoints (:func:`is_decode_boundary`) are the same under both admissions. O(1).
    """
    check_count(chunk_start, "chunk_start")
    check_count(extend_len, "extend_len")
    if branching_seqlen is not None:
        check_count(branching_seqlen, "branching_seqlen")
    end = chunk_start + extend_len
    if input_len is not None:
        check_count(input_len, "input_len")
        if input_len < end:
            raise InvalidArgument(
                f"input_len={input_len} ends before the chunk [{chunk_start}, {end}); pass the prompt length"
            )
    if not config.uses_extra_buffer:
        return None
    grid = config.mamba_checkpoint_grid
    if extend_len < grid:
        return None
    if config.mamba_checkpoint_admission == "branch_and_end":
        return _branch_and_end_track_len(grid, chunk_start, end, branching_seqlen, input_len)
    if (
        branching_seqlen is not None
        and chunk_start < branching_seqlen < end
        and (branching_seqlen - chunk_start) % grid == 0
    ):
        return branching_seqlen
    return chunk_start + extend_len // grid * grid


def _branch_and_end_track_len(
    grid: int, chunk_start: int, end: int, branching_seqlen: int | None, input_len: int | None
) -> int | None:
    if input_len is None:
        raise InvalidArgument(
            "prefill_track_len needs input_len (the prompt length) under "
            "mamba_checkpoint_admission='branch_and_end', to know whether a chunk holds the input's end; "
            "pass input_len="
        )
    if branching_seqlen is not None and chunk_start < branching_seqlen <= end:
        at_branch = chunk_start + (branching_seqlen - chunk_start) // grid * grid
        if at_branch > chunk_start:
            return at_branch
    if input_len - end < grid:
        return chunk_start + (end - chunk_start) // grid * grid
    return None


def is_decode_boundary(config: CacheConfig, seq_len: int) -> bool:
    """Whether decode checkpoints the state at ``seq_len`` (tokens whose KV is committed):
    ``seq_len % mamba_track_interval == 0`` under extra_buffer(_lazy). Always ``False`` under no_buffer,
    which takes no decode checkpoints (its live slot goes to the tree at finish). O(1)."""
    check_count(seq_len, "seq_len")
    if not config.uses_extra_buffer or seq_len == 0:
        return False
    return seq_len % config.mamba_track_interval == 0


def admission_slots(config: CacheConfig, req: Req) -> int:
    """State slots :meth:`HybridReqToTokenPool.alloc` takes to admit ``req``: a live slot unless it has
    one (a copy-on-write hit gave it one), plus its track buffer unless it has one (``P`` eager, 1 lazy).
    O(1)."""
    return config.slot_budget.admission_slots(
        req.mamba_pool_idx is not None, req.mamba_ping_pong_track_buffer is not None
    )


def max_checkpoints_per_request(config: CacheConfig, input_len: int) -> int:
    """Checkpoints one request can add, as the seeds count them: one per finished prefill chunk plus the
    last decode one, ``input_len // chunked_prefill_size + 2`` (2 without chunking). O(1)."""
    check_count(input_len, "input_len")
    if config.chunked_prefill_size < 0:
        return 2
    return input_len // config.chunked_prefill_size + 2
