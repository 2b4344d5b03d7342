"""mamba_radix: a Mamba-aware radix prefix cache for hybrid LLMs (full attention + linear attention/SSM).

Public API: the cache and its results, the config, the request record, the pools and the typed errors.
"""

# the one place the version lives (pyproject.toml reads it from here; `mamba-radix --version` prints it)
__version__ = "0.1.0"

from mamba_radix.cache import CacheStats, EvictResult, InsertResult, MambaRadixCache, MatchResult
from mamba_radix.config import CacheConfig
from mamba_radix.errors import (
    ConfigError,
    InvalidArgument,
    InvalidIndex,
    InvariantError,
    MambaRadixError,
    OutOfMemory,
    OutOfSlots,
    TraceFormatError,
)
from mamba_radix.node import TreeNode
from mamba_radix.pools import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MambaPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from mamba_radix.request import Req
from mamba_radix.tree import RadixKey

__all__ = [
    "CacheConfig",
    "CacheStats",
    "ConfigError",
    "EvictResult",
    "HybridLinearKVPool",
    "HybridReqToTokenPool",
    "InsertResult",
    "InvalidArgument",
    "InvalidIndex",
    "InvariantError",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "MambaPool",
    "MambaRadixCache",
    "MambaRadixError",
    "MatchResult",
    "OutOfMemory",
    "OutOfSlots",
    "PagedTokenToKVPoolAllocator",
    "RadixKey",
    "Req",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "TraceFormatError",
    "TreeNode",
]
