"""What :class:`~mamba_radix.cache.MambaRadixCache` refuses at its public edge, checked before anything
changes: pools built for another config, and an insert of KV indices or a state slot the caller does not
own. Each function raises :class:`~mamba_radix.errors.InvalidArgument` or
:class:`~mamba_radix.errors.InvalidIndex` with a message that says how to fix the call; none has a side
effect. The tree's own argument checks (lengths, pages, a slot the tree holds) are
:mod:`mamba_radix.tree_checks`'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import HybridReqToTokenPool

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from mamba_radix.pools.held import HeldIndices

__all__ = ["check_cache_pools", "check_caller_owns", "check_not_tree_kv"]


def check_cache_pools(
    config: object,
    req_to_token_pool: object,
    token_to_kv_pool_allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator,
) -> None:
    """A cache's config and pools fit together: a :class:`CacheConfig`, a :class:`HybridReqToTokenPool`
    built from that very config, a token allocator of its page size. O(1)."""
    if not isinstance(config, CacheConfig):
        raise InvalidArgument(f"config must be a CacheConfig, got {type(config).__name__}")
    if not isinstance(req_to_token_pool, HybridReqToTokenPool):
        raise InvalidArgument(
            f"req_to_token_pool must be a HybridReqToTokenPool, got {type(req_to_token_pool).__name__}"
        )
    if req_to_token_pool.config != config:
        raise InvalidArgument(
            "req_to_token_pool was built with another CacheConfig; build the pool and the cache from "
            "the same config"
        )
    if token_to_kv_pool_allocator.page_size != config.page_size:
        raise InvalidArgument(
            f"the token allocator has page_size={token_to_kv_pool_allocator.page_size} but the config "
            f"says page_size={config.page_size}; build both with the same page size"
        )


def check_caller_owns(
    kv_indices: torch.Tensor,
    mamba_slot: int,
    prev_prefix_len: int,
    allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator,
    mamba_pool: MambaPool,
    req_to_token_pool: HybridReqToTokenPool,
) -> None:
    """An insert hands over KV ``[prev_prefix_len, L)`` and the slot: both must be allocated (the positions
    below ``prev_prefix_len`` are the tree's already), the KV int64 on the allocator's device without
    repeats, the slot no running request's. Arguments of the wrong type are left to the tree's checks.
    O(L - prev_prefix_len)."""
    if isinstance(kv_indices, torch.Tensor) and kv_indices.dim() == 1 and kv_indices.numel():
        if kv_indices.device != allocator.device:
            raise InvalidArgument(
                f"kv indices are on {kv_indices.device} but the token pool lives on {allocator.device}"
            )
        if kv_indices.dtype != torch.int64:
            raise InvalidArgument(f"kv indices must be int64, got {kv_indices.dtype}")
        start = max(prev_prefix_len, 0) if isinstance(prev_prefix_len, int) else 0
        handed_over = kv_indices[start:]
        if not allocator.all_allocated(handed_over):
            allocated = allocator.is_allocated(handed_over)
            bad = int(handed_over[~allocated][0])
            raise InvalidIndex(f"KV index {bad} is not allocated; insert only indices from alloc")
        # O(L) without a sort when every index is known to be in range (all handed over: allocated)
        repeats = (
            allocator.has_repeats(kv_indices)
            if start == 0
            else torch.unique(kv_indices).numel() != kv_indices.numel()
        )
        if repeats:
            raise InvalidIndex("kv indices repeat within one insert; give every token its own KV index")
    valid_id = isinstance(mamba_slot, int) and not isinstance(mamba_slot, bool) and mamba_slot >= 1
    if valid_id and not mamba_pool.is_slot_allocated(mamba_slot):
        raise InvalidIndex(f"state slot {mamba_slot} is not allocated; insert only slots from alloc")
    if valid_id and req_to_token_pool.is_slot_held(mamba_slot):
        raise InvalidIndex(
            f"state slot {mamba_slot} is a running request's (live or track slot); copy its state into "
            "a fresh slot and insert that one"
        )


def check_not_tree_kv(
    kv_indices: torch.Tensor, prev_prefix_len: int, held_kv: Callable[[], HeldIndices]
) -> None:
    """The caller hands over KV ``[prev_prefix_len, L)``: duplicates of the tree's KV (freed) and the new
    leaf's (kept). None of it may be the tree's own already: freed, it would be freed under the tree;
    kept, one index would have two owners. ``held_kv``: the cache's held-KV flags (built on first use).
    One gather of the flags (after :func:`check_caller_owns`: every index is allocated, so in range).
    O(L - prev_prefix_len)."""
    if (
        not isinstance(kv_indices, torch.Tensor)
        or kv_indices.dim() != 1
        or not isinstance(prev_prefix_len, int)
    ):
        return  # the tree's own argument checks report these
    start = max(prev_prefix_len, 0)
    handed_over = kv_indices[start:]
    if not handed_over.numel():
        return
    held = held_kv()
    if held.any_held(handed_over):
        at = start + (held.first_held(handed_over) or 0)
        raise InvalidArgument(
            f"KV index {int(kv_indices[at])} at position {at} is already the tree's (positions from "
            f"prev_prefix_len={prev_prefix_len} are handed over); pass prev_prefix_len = the length of the "
            "prefix the tree holds, or fresh indices"
        )
