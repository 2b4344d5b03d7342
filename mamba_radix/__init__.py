"""mamba_radix: a Mamba-aware radix prefix cache for hybrid LLMs (full attention + linear attention/SSM).

Public API: the cache and its results, the request lifecycle's records, the config, the request record,
the pools and the typed errors. The names are resolved lazily (PEP 562), so importing a light submodule
(``mamba_radix.testing``'s suite, ``mamba_radix.errors``) does not pull in torch or the cache.
"""

from __future__ import annotations

import importlib
from typing import Any

# the one place the version lives (pyproject.toml reads it from here; `mamba-radix --version` prints it)
__version__ = "0.1.0"

# public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CacheStats", "EvictResult", "InsertResult", "MambaRadixCache", "MatchResult"), "cache"),
    "CacheConfig": "config",
    **dict.fromkeys(
        (
            "ConfigError",
            "InvalidArgument",
            "InvalidIndex",
            "InvariantError",
            "MambaRadixError",
            "OutOfMemory",
            "OutOfSlots",
            "TraceFormatError",
        ),
        "errors",
    ),
    **dict.fromkeys(("AdmitCheck", "ForwardPlan"), "lifecycle"),
    "CachePolicy": "policy",
    "TreeNode": "node",
    **dict.fromkeys(
        (
            "HybridLinearKVPool",
            "HybridReqToTokenPool",
            "MambaPool",
            "MHATokenToKVPool",
            "MLATokenToKVPool",
            "PagedTokenToKVPoolAllocator",
            "ReqToTokenPool",
            "TokenToKVPoolAllocator",
        ),
        "pools",
    ),
    "Req": "request",
    "RadixKey": "tree",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use (PEP 562); cached in the module."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mamba_radix' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mamba_radix.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
