"""The cache contract the request lifecycle (:mod:`mamba_radix.lifecycle`) is written against: the small
public surface of :class:`~mamba_radix.cache.MambaRadixCache` it uses (peek, match, hand over, make room,
release, locks and the size accessors). Declared by its user, below the cache, so that the lifecycle imports
nothing above it; re-exported from :mod:`mamba_radix.lifecycle`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.buffers import BufferStrategy
    from mamba_radix.cache_results import CacheStats, InsertResult, LoadPlan, MatchResult, PrefixPeek
    from mamba_radix.config import CacheConfig
    from mamba_radix.node import TreeNode
    from mamba_radix.policy import CachePolicy
    from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from mamba_radix.pools.checkpoint_pool import CheckpointPool
    from mamba_radix.pools.held import HeldIndices
    from mamba_radix.pools.hybrid_req_to_token import HybridReqToTokenPool
    from mamba_radix.request import Req
    from mamba_radix.tree import RadixKey, TreeInsert, Walk

__all__ = ["LifecycleCache"]


class LifecycleCache(Protocol):
    """The cache contract the lifecycle is written against (:class:`~mamba_radix.cache.MambaRadixCache`
    implements it): its config, buffer strategy, research policy, counters and pools, and these calls."""

    config: CacheConfig
    buffer: BufferStrategy
    policy: CachePolicy
    stats: CacheStats
    device: torch.device
    req_to_token_pool: HybridReqToTokenPool
    token_to_kv_pool_allocator: TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator
    mamba_pool: MambaPool
    # quantized checkpoints' pool (checkpoint_format int8 / fp8_e4m3); None under "model"
    checkpoint_pool: CheckpointPool | None

    def peek_with_walk(self, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]: ...

    def match_prefix(
        self, key: RadixKey, *, cow_mamba: bool = False, req: Req | None = None, walk: Walk | None = None
    ) -> MatchResult: ...

    def insert_below(
        self, node: TreeNode, key: RadixKey, kv_indices: torch.Tensor, mamba_slot: int
    ) -> tuple[InsertResult, TreeInsert]: ...

    def make_room(self, num_tokens: int = 0, num_states: int = 0, *, check: bool = True) -> bool: ...

    def load_back(self, key: RadixKey) -> LoadPlan | None: ...

    def alloc_state_slot(self) -> int | None: ...

    def store_checkpoint(self, src_slot: int) -> int | None: ...

    def free_checkpoint(self, ckpt_slot: int) -> None: ...

    def held_kv(self) -> HeldIndices: ...

    def inc_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> None: ...

    def dec_lock_ref(self, node: TreeNode, *, checkpoint: bool = True) -> None: ...

    def is_attached(self, node: TreeNode) -> bool: ...

    def path_kv(self, node: TreeNode, above: TreeNode) -> torch.Tensor: ...

    def path_kv_chunks(self, node: TreeNode, above: TreeNode | None = None) -> tuple[torch.Tensor, ...]: ...

    def full_evictable_size(self) -> int: ...

    def mamba_evictable_size(self) -> int: ...
