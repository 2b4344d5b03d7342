"""SGLang's parameter and result objects of the prefix cache, with SGLang's field names (0.5.23's
``base_prefix_cache`` and ``cache_init_params``; the legacy tree's ``MatchResult.device_indices`` too).

Only the fields a hybrid (full attention + Mamba) cache reads are honoured; the others are accepted so that
SGLang's constructors run unchanged, and :meth:`CacheInitParams.unsupported` names any that is set to a value
the core cannot honour (the compat cache refuses those with :class:`~mamba_radix.errors.InvalidArgument`
instead of silently ignoring them). Plain records: no side effects, O(1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

__all__ = [
    "CacheInitParams",
    "DecLockRefParams",
    "DecLockRefResult",
    "EvictParams",
    "EvictResult",
    "IncLockRefResult",
    "InsertParams",
    "InsertResult",
    "MatchPrefixParams",
    "MatchResult",
]


@dataclasses.dataclass
class CacheInitParams:
    """What SGLang's cache constructor takes. Honoured: ``disable`` (no prefix caching),
    ``req_to_token_pool``, ``token_to_kv_pool_allocator``, ``page_size``, ``enable_mamba_extra_buffer``,
    ``enable_mamba_extra_buffer_lazy``, ``chunked_prefill_size``, ``enable_kv_cache_events`` (the cache
    records events for ``take_events``: :mod:`mamba_radix.events`) and ``strip_thinking_cache`` (SGLang's
    server argument of that name, here per cache: see :mod:`mamba_radix.compat.strip_thinking`)."""

    disable: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    page_size: int
    is_eagle: bool = False
    tp_cache_group: Any = None
    attn_cp_cache_group: Any = None
    attn_tp_cache_group: Any = None
    pp_cache_group: Any = None
    eviction_policy: str = "lru"
    eviction_policy_config: dict[str, Any] | None = None
    enable_metrics: bool = False
    enable_kv_cache_events: bool = False
    enable_session_radix_cache: bool = False
    enable_mamba_extra_buffer: bool = False
    enable_mamba_extra_buffer_lazy: bool = False
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    chunked_prefill_size: int | None = None
    sliding_window_size: int | None = None
    tree_components: tuple[Any, ...] | None = None  # the unified cache's; this layer is FULL + MAMBA
    strip_thinking_cache: bool = False

    def unsupported(self) -> list[str]:
        """The fields set to something the core cannot honour, as ``name=value`` (empty: all honoured)."""
        wanted = {
            "is_eagle": False,
            "eviction_policy": "lru",
            "enable_session_radix_cache": False,
            "pp_size": 1,
            "attn_cp_size": 1,
            "sliding_window_size": None,
        }
        bad = [f"{k}={getattr(self, k)!r}" for k, v in wanted.items() if getattr(self, k) != v]
        if self.tree_components is not None:
            names = sorted(str(getattr(c, "name", c)).upper() for c in self.tree_components)
            if names != ["FULL", "MAMBA"]:
                bad.append(f"tree_components={names} (only FULL + MAMBA)")
        return bad


@dataclasses.dataclass
class MatchPrefixParams:
    """``key``: a :class:`~mamba_radix.RadixKey` (or anything with ``token_ids`` and ``extra_key``);
    ``cow_mamba``: copy the matched checkpoint into ``req``'s live slot; ``req``: the SGLang-shaped
    request (:class:`mamba_radix.compat.sglang_req.Req`) whose cache fields the match sets."""

    key: Any
    cow_mamba: bool = False
    req: Any = None


@dataclasses.dataclass
class InsertParams:
    """``key`` and ``value`` (its KV indices), ``mamba_value`` (the checkpoint slot: a one-element tensor,
    as SGLang passes ``req.mamba_pool_idx.unsqueeze(0)``, or an int), ``prev_prefix_len`` (positions below
    it are the tree's already: never freed). The other fields are accepted and must keep their defaults."""

    key: Any = None
    value: torch.Tensor | None = None
    mamba_value: torch.Tensor | int | None = None
    prev_prefix_len: int = 0
    chunked: bool = False
    priority: int = 0


class InsertResult(NamedTuple):
    prefix_len: int  # tokens the tree held already
    mamba_exist: bool  # the end node had a checkpoint: the slot stayed the caller's
    last_device_node: Any = None  # the node holding the checkpoint at the key's end


@dataclasses.dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


class EvictResult(NamedTuple):
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


class MatchResult(NamedTuple):
    """SGLang's match result. ``device_indices``: the usable hit's KV (``[0, hit)``); ``last_device_node``
    (= ``last_host_node`` = ``best_match_node``: no host tier here): the deepest checkpoint node on the
    path, the root if none; ``cache_protected_len``: the hit length; ``full_kv_hit_length``: KV matched,
    possibly deeper; ``mamba_branching_seqlen``: that rounded down to the checkpoint grid when deeper than
    the hit. The host counters are always 0."""

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: int | None = None
    cache_protected_len: int | None = None
    full_kv_hit_length: int = 0

    @property
    def device_prefix_len(self) -> int:
        """0.5.23's name for ``len(device_indices)``."""
        return int(self.device_indices.numel())


class IncLockRefResult(NamedTuple):
    delta: int = 0  # KV tokens that the lock took out of the evictable size


@dataclasses.dataclass
class DecLockRefParams:
    """SGLang's lock-release receipt; the fields name other components' locks (SWA), none here."""

    swa_uuid_for_lock: Any = None


class DecLockRefResult(NamedTuple):
    delta: int = 0  # KV tokens that the release made evictable again
