"""Memory pools: the request table, KV index allocators, KV storage, the recurrent-state pool, the
quantized checkpoint pool (:mod:`~mamba_radix.pools.checkpoint_pool`), and the unified memory pool (KV
and states in one byte buffer, :mod:`~mamba_radix.pools.unified`).

Semantics follow SGLang's ``mem_cache`` pools (seed 003, ``reference/sglang-semantics.md`` §6); the
contracts are in ``docs/architecture.md``. Every pool works on a chosen torch device, reports
``available_size()`` / ``used`` / ``size``, returns ``None`` on over-allocation, and raises a typed error
(:class:`~mamba_radix.errors.InvalidIndex`, :class:`~mamba_radix.errors.InvalidArgument`) without changing
anything on misuse.
"""

import torch

from mamba_radix.pools.checkpoint_pool import CheckpointPool
from mamba_radix.pools.hybrid_req_to_token import HybridReqToTokenPool
from mamba_radix.pools.kv_storage import (
    HybridLinearKVPool,
    LinearLayerCache,
    MHATokenToKVPool,
    MLATokenToKVPool,
)
from mamba_radix.pools.mamba_pool import MambaPool
from mamba_radix.pools.paged_allocator import PagedTokenToKVPoolAllocator, get_last_loc
from mamba_radix.pools.req_to_token import ReqToTokenPool
from mamba_radix.pools.token_allocator import TokenToKVPoolAllocator
from mamba_radix.pools.unified import GIVE_WAY_RULES, UnifiedMemoryPool
from mamba_radix.pools.unified_checks import check_unified
from mamba_radix.pools.unified_layout import KVLayout, StateLayout

__all__ = [
    "GIVE_WAY_RULES",
    "CheckpointPool",
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "KVAllocator",
    "KVLayout",
    "LinearLayerCache",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "MambaPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "StateLayout",
    "TokenToKVPoolAllocator",
    "UnifiedMemoryPool",
    "check_unified",
    "get_last_loc",
    "make_kv_allocator",
]

KVAllocator = TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator


def make_kv_allocator(
    num_tokens: int, page_size: int, device: str | torch.device = "cpu", *, backend: str = "auto"
) -> KVAllocator:
    """The KV index allocator for ``page_size`` (the one rule: token-granular at 1, paged above), over
    ``num_tokens`` indices (paged: a multiple of ``page_size``, else :class:`InvalidArgument`).
    O(num_tokens) to build the free list on a device; O(1) on the CPU, whose free list and bitmaps
    become resident only as far as indices are handed out (:class:`~.host_free_list.HostFreeList`)."""
    if page_size == 1:
        return TokenToKVPoolAllocator(num_tokens, device, backend=backend)
    return PagedTokenToKVPoolAllocator(num_tokens, page_size, device, backend=backend)
