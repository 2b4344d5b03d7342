"""What the request lifecycle refuses, checked at its public edge before anything changes.

Each function validates one thing about a call to :class:`~mamba_radix.lifecycle.RequestLifecycle` and
raises :class:`~mamba_radix.errors.InvalidArgument` (or :class:`~mamba_radix.errors.InvalidIndex` for a
pool index) with a message that says how to fix the call. None has a side effect; each is O(1) unless
stated. The token lists themselves are checked by :mod:`mamba_radix.token_checks`.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex, check_count
from mamba_radix.request import Req

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode
    from mamba_radix.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from mamba_radix.pools.held import HeldIndices
    from mamba_radix.pools.hybrid_req_to_token import HybridReqToTokenPool
    from mamba_radix.token_checks import TokenCheck

__all__ = [
    "check_checkpoint_len",
    "check_extend",
    "check_new_request",
    "check_no_pending_insert",
    "check_request_kv",
    "check_running",
    "is_prefill_chunk_end",
]


def check_new_request(req: Req, max_new_tokens: int | None, check_tokens: TokenCheck) -> array:
    """Validate a request for admission (a fresh :class:`Req`, a non-empty prompt of int token ids); return
    its tokens (input, then output) as a checked ``array('q')``, made by ``check_tokens``. O(L)."""
    if not isinstance(req, Req):
        raise InvalidArgument(f"admission takes a Req, got {type(req).__name__}")
    ids = check_tokens(req.origin_input_ids, f"request {req.rid!r}: origin_input_ids")
    outputs = check_tokens(req.output_ids, f"request {req.rid!r}: output_ids")
    if not req.origin_input_ids:
        raise InvalidArgument(f"request {req.rid!r} has an empty prompt; give it at least one token")
    if max_new_tokens is not None:
        check_count(max_new_tokens, "max_new_tokens", 1)
    if (
        req.last_node is not None
        or req.req_pool_idx is not None
        or req.mamba_pool_idx is not None
        or req.mamba_ping_pong_track_buffer is not None
        or req.kv_len
    ):
        raise InvalidArgument(
            f"request {req.rid!r} is already admitted or carries pool fields (row, slots, lock or "
            "kv_len); admit each request once, as a fresh Req"
        )
    if type(req.mamba_next_track_idx) is not int:  # the pool's admission takes the request trusted
        raise InvalidArgument(
            f"request {req.rid!r} has mamba_next_track_idx {req.mamba_next_track_idx!r}; it must be an int"
        )
    if outputs:
        ids.extend(outputs)
    return ids


def check_running(
    req: Req, verb: str, pool: HybridReqToTokenPool, is_attached: Callable[[TreeNode], bool]
) -> torch.Tensor:
    """Validate ``req``'s bookkeeping as a running request of this cache (``is_attached``: the cache's
    test of its lock node); return its ``req_to_token`` row."""
    if not isinstance(req, Req):
        raise InvalidArgument(f"{verb} takes a Req, got {type(req).__name__}")
    if req.req_pool_idx is None or not pool.is_row_allocated(req.req_pool_idx):
        raise InvalidArgument(f"{verb}: request {req.rid!r} holds no request row; admit it first")
    node = req.last_node
    if node is None or not is_attached(node):
        raise InvalidArgument(
            f"{verb}: request {req.rid!r} holds no lock in this cache (never admitted here, or finished twice)"
        )
    if node.depth != req.cache_protected_len:
        raise InvalidArgument(
            f"{verb}: request {req.rid!r} has cache_protected_len={req.cache_protected_len} but its "
            f"last_node ends at {node.depth}; do not edit the cache's request fields"
        )
    row = pool.req_to_token[req.req_pool_idx]
    kv_len = req.kv_len
    if isinstance(kv_len, bool) or not isinstance(kv_len, int):
        raise InvalidArgument(f"{verb}: request {req.rid!r} has kv_len={kv_len!r}; it must be an int")
    if not req.cache_protected_len <= kv_len <= min(req.seq_len, row.numel()):
        raise InvalidArgument(
            f"{verb}: request {req.rid!r} has kv_len={kv_len}, outside "
            f"[cache_protected_len={req.cache_protected_len}, seq_len={req.seq_len}]"
        )
    return row


def is_prefill_chunk_end(end: int, input_len: int, page_size: int) -> bool:
    """The one rule for where a prefill chunk may end: at the prompt's end, or on a page boundary.
    Why: a chunk's checkpoint sits on the state grid counted from the chunk's start (SGLang), and the
    grid is a page multiple, so it lands on a page only if the chunk starts on one."""
    return end == input_len or end % page_size == 0


def check_extend(
    req: Req,
    row: torch.Tensor,
    num_tokens: int,
    page_size: int,
    prefill_chunk_len: Callable[[Req, int], int],
) -> None:
    """An extend of running ``req`` (its ``row``, checked by :func:`check_running`) by ``num_tokens``: no
    uncommitted plan; tokens known and within the row; a prefill extend ends at the prompt's end or,
    before it, on a page boundary (:func:`is_prefill_chunk_end`; the message gives the cut
    ``prefill_chunk_len`` would make). The decode boundary is the buffer strategy's, checked by the
    caller."""
    check_count(num_tokens, "num_tokens", 1)
    if req.pending_plan is not None:
        raise InvalidArgument(
            f"extend: request {req.rid!r} has an uncommitted plan for [{req.pending_plan.start}, "
            f"{req.pending_plan.end}); commit it first (or finish(req, insert=False) to abort)"
        )
    start, end = req.kv_len, req.kv_len + num_tokens
    input_len = len(req.origin_input_ids)
    is_prefill = start < input_len
    if end > req.seq_len:
        raise InvalidArgument(
            f"extend: request {req.rid!r} knows {req.seq_len} tokens but the extend ends at {end}; "
            "append the sampled token to req.output_ids before extending over it"
        )
    if end > row.numel():
        raise InvalidArgument(
            f"extend: request {req.rid!r} would reach {end} tokens, past the request row's "
            f"{row.numel()} (max_context_len)"
        )
    if is_prefill and end > input_len:
        raise InvalidArgument(
            f"extend: a prefill extend ends at the prompt's end ({input_len}); got [{start}, {end})"
        )
    if is_prefill and not is_prefill_chunk_end(end, input_len, page_size):
        raise InvalidArgument(
            f"extend: a prefill chunk must end on a page boundary (page_size={page_size}) "
            f"or at the prompt's end ({input_len}); [{start}, {end}) ends inside a page, so the next "
            "chunk's checkpoint could not land on a page. Cut chunks with "
            f"cache.prefill_chunk_len(req, budget) (here {prefill_chunk_len(req, num_tokens)} "
            "tokens), as SGLang's scheduler does"
        )


def check_checkpoint_len(req: Req, cache_len: object, kv_len: int, page_size: int, verb: str) -> int:
    """The length of the state ``req`` hands to the tree (the buffer strategy's answer) must be an int,
    a multiple of ``page_size``, in ``[cache_protected_len, kv_len]``; returns it."""
    if (
        isinstance(cache_len, bool)
        or not isinstance(cache_len, int)
        or not req.cache_protected_len <= cache_len <= kv_len
        or cache_len % page_size
    ):
        raise InvalidArgument(
            f"{verb}: request {req.rid!r} checkpoints at {cache_len!r}, which must be a multiple of "
            f"page_size={page_size} in [cache_protected_len={req.cache_protected_len}, "
            f"kv_len={kv_len}]; set mamba_last_track_seqlen to the tracked length"
        )
    return cache_len


def check_request_kv(
    req: Req,
    kv: torch.Tensor,
    verb: str,
    allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator,
    held_kv: Callable[[], HeldIndices],
) -> None:
    """The request's own KV ``kv`` (a span of its row past ``cache_protected_len``, int32 as stored) must
    be allocated and not the tree's (the insert would give a tree index a second owner, the free past the
    checkpoint would free it under the tree). ``held_kv``: the cache's held-KV flags, built from the tree
    by the first such check. O(len): one fused pass over the row's memory and one gather of the flags."""
    if not allocator.all_allocated(kv):
        kv = kv.to(torch.int64)
        bad = int(kv[~allocator.is_allocated(kv)][0])
        raise InvalidIndex(
            f"{verb}: request {req.rid!r} has KV index {bad} in its row that is not allocated; write "
            "only indices from the allocator into req_to_token"
        )
    held = held_kv()
    if kv.numel() and held.any_held(kv):
        at = held.first_held(kv) or 0
        raise InvalidIndex(
            f"{verb}: request {req.rid!r} has KV index {int(kv[at])} at row position "
            f"{req.cache_protected_len + at} (past cache_protected_len) that is the tree's; only the "
            "matched prefix below cache_protected_len may hold tree indices"
        )


def check_no_pending_insert(req: Req, insert: bool, verb: str) -> None:
    """An insert at finish must not follow an uncommitted plan: the model may have overwritten the state
    it would insert."""
    plan = req.pending_plan
    if plan is not None and insert:
        raise InvalidArgument(
            f"{verb}: request {req.rid!r} has an uncommitted plan for [{plan.start}, {plan.end}); "
            "commit it first, or finish(req, insert=False) to abort"
        )
