"""Stand-ins specific to ``sglang==0.5.23``'s ``UnifiedRadixCache`` (see :mod:`.standins`).

0.5.23's cache modules import the HiCache controller, buffer-mode storage, streaming sessions, the
distributed tags and more at module level. A sequential replay with the device tier only uses none of
them, so most are *permissive* stand-ins: any name imported from them is a placeholder class that accepts
any arguments, whose instances answer every method call with ``None`` (so "is this a streaming-session
request?" reads as no) and which, called with a function, returns it (a decorator that changes nothing).
``msgspec`` (a dependency SGLang declares, not ours) gets a stand-in whose ``Struct`` is a dataclass.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from types import ModuleType
from typing import Any

__all__ = ["PERMISSIVE", "modules"]

# Modules whose names 0.5.23's cache imports but a device-only sequential replay never exercises.
PERMISSIVE = (
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.distributed.communication_tags",
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.allocator.page_interleave",
    "sglang.srt.mem_cache.buffer_mode.pipeline",
    "sglang.srt.mem_cache.buffer_mode.storage_existence_cache",
    "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
    "sglang.srt.mem_cache.storage_prefetch",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.session.streaming_session",
    "sglang.srt.utils",
    "sglang.srt.utils.common",
    "sglang.srt.utils.poll_timer",
    "sglang.srt.utils.rank_consensus_checker",
)


class _Anything:
    """A placeholder instance: every attribute is another placeholder; calling one does nothing and
    returns ``None``; it is empty and false (no sessions, no pending work, nothing stored)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, item: Any) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) else None

    def __bool__(self) -> bool:
        return False


class _AnyMeta(type):
    """Class attributes of a placeholder class are their own names (enough for enum-like tags such as
    a storage tier that is only recorded, never compared with anything real)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


class _PermissiveModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _AnyMeta(name, (_Anything,), {})
        setattr(self, name, cls)
        return cls


def _permissive(name: str) -> ModuleType:
    mod = _PermissiveModule(name)
    mod.__path__ = []  # type: ignore[attr-defined]  # may be a package of other stand-ins
    return mod


def _msgspec() -> ModuleType:
    """``msgspec.Struct`` as a dataclass (mutable defaults copied per instance, as msgspec does)."""
    try:
        import msgspec  # type: ignore[import-not-found]

        return msgspec
    except ImportError:
        pass

    def field(
        default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING, name: Any = None
    ) -> Any:
        if default_factory is not dataclasses.MISSING:
            return dataclasses.field(default_factory=default_factory)
        return dataclasses.field(default=default)

    class Struct:
        def __init_subclass__(cls, frozen: bool = False, kw_only: bool = False, **kwargs: Any) -> None:
            super().__init_subclass__()
            for attr in inspect.get_annotations(cls):
                value = cls.__dict__.get(attr, dataclasses.MISSING)
                if isinstance(value, (list, dict, set)):
                    setattr(cls, attr, dataclasses.field(default_factory=lambda v=value: copy.copy(v)))
            dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(cls)

    mod = ModuleType("msgspec")
    mod.Struct = Struct  # type: ignore[attr-defined]
    mod.field = field  # type: ignore[attr-defined]
    return mod


def _lru_strategy(eviction_policy: str = "lru", config: dict[str, Any] | None = None) -> Any:
    """SGLang's own LRU strategy (``mem_cache/evict_policy.py``, loaded from the wheel); the replay runs
    the default policy only."""
    import importlib

    if eviction_policy.lower() != "lru":
        raise ValueError(f"the replay runs eviction policy 'lru' only, not {eviction_policy!r}")
    policy = importlib.import_module("sglang.srt.mem_cache.evict_policy")
    return policy.LRUStrategy(**(config or {}))


def _coalesce_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Join half-open ranges that touch, so a page split between two of them is freed once."""
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _free_row_segments(allocator: Any, segments: list[tuple[Any, int]], **kwargs: Any) -> None:
    """Free ``(kv_indices, start_pos)`` pieces of a request's row (no sliding-window layers here)."""
    for kv_indices, start_pos in segments:
        if kv_indices.numel():
            allocator.free_segment(kv_indices, start_pos=start_pos)


def modules(common: dict[str, ModuleType]) -> dict[str, ModuleType]:
    """The 0.5.23 stand-ins: ``common`` (the stand-ins both releases import, built by
    :func:`.standins.build_0_5_23` with the run-time settings already in them) made permissive (0.5.23
    imports more names from them; the names the replay relies on keep their stand-in values), plus
    :data:`PERMISSIVE` and ``msgspec``. Imports nothing from :mod:`.standins`, which calls it."""
    out: dict[str, ModuleType] = {}
    for name, mod in common.items():
        widened = _permissive(name)
        widened.__dict__.update({k: v for k, v in vars(mod).items() if not k.startswith("__")})
        if not hasattr(mod, "__path__"):
            del widened.__path__
        out[name] = widened
    for name in PERMISSIVE:
        out.setdefault(name, _permissive(name))
    # values the cache computes with (a placeholder would not compare or add)
    out["sglang.srt.mem_cache.allocator.page_interleave"].page_interleave_shard_size = lambda allocator: 1  # type: ignore[attr-defined]
    out["sglang.srt.utils.common"].ceil_align = lambda x, a: -(-x // a) * a  # type: ignore[attr-defined]
    out["sglang.srt.mem_cache.utils"].get_eviction_strategy = _lru_strategy  # type: ignore[attr-defined]
    common_mod = out["sglang.srt.mem_cache.common"]
    common_mod.coalesce_ranges = _coalesce_ranges  # type: ignore[attr-defined]
    common_mod.free_kv_row_segments = _free_row_segments  # type: ignore[attr-defined]
    out["msgspec"] = _msgspec()
    return out
