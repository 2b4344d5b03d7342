"""Stand-in modules for the parts of SGLang its prefix cache imports but a CPU replay does not need.

SGLang's cache modules import the package's heavy layers at module level: CUDA and Triton kernels,
distributed process groups, the server-argument registry, Prometheus metrics, KV-event publishing,
the device memory pools. A replay needs none of them. Each ``build_<version>`` function returns a
:class:`StandIns`: the modules to place under SGLang's names (``sglang.srt.runtime_context`` and so on)
and a namespace with the counting pools (:mod:`.pools`) and the run-time settings the stand-ins serve
(:class:`RuntimeSettings`: chunk size, track interval, page size, strategy flags).

What each stand-in provides is the small surface the cache touches, written here from the calls the
cache makes; nothing is copied from SGLang. A name we do not stand in for makes the import fail, and the
loader reports it as :class:`~mamba_radix.testing.sglang.loader.SGLangLoadError`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

from mamba_radix.testing.sglang import pools

__all__ = ["RuntimeSettings", "StandIns", "build_0_5_20", "build_0_5_23"]


@dataclass
class RuntimeSettings:
    """What SGLang reads from its global server arguments at run time. The replay sets these before it
    builds a cache. ``chunk_size`` is SGLang's ``mamba_cache_chunk_size()`` (``max(64, page_size)``)."""

    page_size: int = 1
    chunk_size: int = 64
    track_interval: int = 256
    extra_buffer: bool = True
    lazy: bool = False
    max_states_per_path: int = -1

    def checkpoint_grid(self, tree_page: int | None = None) -> int:
        return math.lcm(self.chunk_size, tree_page or self.page_size)

    def track_grid(self, tree_page: int | None = None) -> int:
        return math.lcm(self.checkpoint_grid(tree_page), self.track_interval)


@dataclass
class StandIns:
    modules: dict[str, ModuleType]
    namespace: ModuleType = field(default_factory=lambda: ModuleType("standins"))


def _module(name: str, package: bool = False, **attrs: Any) -> ModuleType:
    mod = ModuleType(name)
    mod.__dict__.update(attrs)
    if package:
        mod.__path__ = []  # type: ignore[attr-defined]  # a package with no files of its own
    return mod


class _Placeholder:
    """A class SGLang imports only to name in ``isinstance`` checks or annotations; never instantiated
    by a replay (nothing is ever an instance of it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{type(self).__name__} is a stand-in and cannot be built in a replay")


def _placeholder(name: str) -> type:
    return type(name, (_Placeholder,), {})


class _EventRecorder:
    """KV-cache events are off in a replay: every ``record_*`` call does nothing."""

    def __init__(self, enabled: bool = False, page_size: int = 1, **kwargs: Any) -> None:
        self.enabled = False
        self.page_size = page_size

    def __getattr__(self, name: str) -> Any:
        if name.startswith("record"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def take_events(self) -> list[Any]:
        return []


def _split_hashes(hash_value: list[str] | None, split_len: int, page_size: int) -> tuple[Any, Any]:
    """Split a node's per-page hash list where the node splits (``split_len`` tokens)."""
    if hash_value is None:
        return None, None
    pages = split_len // page_size
    return hash_value[:pages], hash_value[pages:]


def _hash_str(token_ids: Any, prior_hash: str | None = None) -> str:
    h = hashlib.sha256()
    if prior_hash:
        h.update(prior_hash.encode())
    for t in token_ids:
        h.update(int(t).to_bytes(8, "little", signed=True))
    return h.hexdigest()


def _eviction_strategy(*args: Any, **kwargs: Any) -> Any:
    return None  # only the plain radix cache's heap eviction uses it; the Mamba caches keep LRU lists


class _BaseAllocator:
    """The base class name SGLang annotates allocators with; our counting allocators stand for it."""


# The counting allocators are the classes the cache asserts its allocator to be.
class TokenToKVPoolAllocator(pools.CountingTokenAllocator, _BaseAllocator):
    pass


class PagedTokenToKVPoolAllocator(pools.CountingPagedAllocator, TokenToKVPoolAllocator):
    pass


def _runtime_context(settings: RuntimeSettings) -> ModuleType:
    parallel = SimpleNamespace(
        tp_rank=0, tp_size=1, dcp_enabled=False, attn_cp_size=1, pp_size=1, dp_size=1, attn_tp_size=1
    )
    observability = SimpleNamespace(extra_metric_labels=None, enable_metrics=False)

    def mamba_exec() -> SimpleNamespace:
        return SimpleNamespace(
            enable_mamba_extra_buffer=settings.extra_buffer,
            enable_mamba_extra_buffer_lazy=settings.lazy,
            mamba_track_interval=settings.track_interval,
            mamba_max_states_per_path=settings.max_states_per_path,
        )

    return _module(
        "sglang.srt.runtime_context",
        get_parallel=lambda: parallel,
        get_observability=lambda: observability,
        get_exec=lambda: SimpleNamespace(mamba=mamba_exec()),
        mamba_cache_chunk_size=lambda: settings.chunk_size,
        mamba_checkpoint_grid=settings.checkpoint_grid,
        mamba_track_grid=settings.track_grid,
    )


def _common_modules(settings: RuntimeSettings) -> dict[str, ModuleType]:
    """Stand-ins both releases' caches import."""
    mem = "sglang.srt.mem_cache."
    allocator = _module(
        mem + "allocator",
        package=True,
        BaseTokenToKVPoolAllocator=_BaseAllocator,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
    )
    return {
        mem + "allocator": allocator,
        mem + "allocator.unified_mamba": _module(
            mem + "allocator.unified_mamba",
            UnifiedMambaTokenToKVPoolAllocator=_placeholder("UnifiedMambaTokenToKVPoolAllocator"),
        ),
        mem + "events": _module(mem + "events", KVCacheEventRecorder=_EventRecorder),
        mem + "memory_pool": _module(
            mem + "memory_pool",
            ReqToTokenPool=pools.HybridRequestPool,
            HybridReqToTokenPool=pools.HybridRequestPool,
            MHATokenToKVPool=_placeholder("MHATokenToKVPool"),
        ),
        mem + "utils": _module(
            mem + "utils",
            split_node_hash_value=_split_hashes,
            get_hash_str=_hash_str,
            get_eviction_strategy=_eviction_strategy,
        ),
        "sglang.srt.runtime_context": _runtime_context(settings),
        "sglang.srt.observability": _module("sglang.srt.observability", package=True),
        "sglang.srt.observability.metrics_collector": _module(
            "sglang.srt.observability.metrics_collector",
            STAT_LOGGER_ROLE_RADIX_CACHE="radix_cache",
            RadixCacheMetricsCollector=_placeholder("RadixCacheMetricsCollector"),
            resolve_collector_class=lambda role, default, *a, **k: default,
        ),
    }


def _namespace(settings: RuntimeSettings) -> ModuleType:
    ns = ModuleType("mamba_radix.testing.sglang.standins.namespace")
    ns.settings = settings  # type: ignore[attr-defined]
    ns.TokenToKVPoolAllocator = TokenToKVPoolAllocator  # type: ignore[attr-defined]
    ns.PagedTokenToKVPoolAllocator = PagedTokenToKVPoolAllocator  # type: ignore[attr-defined]
    ns.HybridReqToTokenPool = pools.HybridRequestPool  # type: ignore[attr-defined]
    return ns


def build_0_5_20() -> StandIns:
    """Stand-ins for ``sglang==0.5.20``'s ``mem_cache/mamba_radix_cache.py`` and what it imports."""
    settings = RuntimeSettings()
    return StandIns(_common_modules(settings), _namespace(settings))


def build_0_5_23() -> StandIns:
    """Stand-ins for ``sglang==0.5.23``'s ``mem_cache/unified_radix_cache.py`` (Python tree core): the
    common ones plus :mod:`.standins_0_5_23`."""
    from mamba_radix.testing.sglang import standins_0_5_23

    settings = RuntimeSettings()
    mods = standins_0_5_23.modules(_common_modules(settings))
    return StandIns(mods, _namespace(settings))
