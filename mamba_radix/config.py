"""One frozen, validated configuration for the cache (:class:`CacheConfig`).

Option names follow SGLang's server arguments (``--mamba-radix-cache-strategy`` becomes
``mamba_radix_cache_strategy``), so a config can be read straight off an engine's flags. Validation runs
once, in ``__post_init__``; an invalid combination raises :class:`~mamba_radix.errors.ConfigError` whose
message names the field (the Python argument: ``page_size=16``), the value and the fix; the CLI shows
the same message in flag names (:func:`mamba_radix.flags.flag_message`). Derived values (the resolved
strategy, the ping-pong size, the slots reserved per running request) are properties, computed from the
fields and never stored twice.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Literal

from mamba_radix.errors import ConfigError

__all__ = [
    "CHECKPOINT_ADMISSIONS",
    "CHECKPOINT_FORMATS",
    "EVICTION_ORDERS",
    "FIELD_CHOICES",
    "HOST_PATH_CAP_MODES",
    "HOST_WRITE_POLICIES",
    "LRU_REFRESH_MODES",
    "SLOT_HEADROOM_MODES",
    "STRATEGIES",
    "UNIFIED_GIVE_WAY_RULES",
    "CacheConfig",
    "CheckpointAdmission",
    "CheckpointFormat",
    "EvictionOrder",
    "HostPathCap",
    "HostWritePolicy",
    "LruRefresh",
    "ResolvedStrategy",
    "SlotBudget",
    "SlotHeadroom",
    "Strategy",
    "UnifiedGiveWay",
]

Strategy = Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]
ResolvedStrategy = Literal["no_buffer", "extra_buffer", "extra_buffer_lazy"]
EvictionOrder = Literal["leaf_first", "root_first", "mixed", "flop_weighted"]
LruRefresh = Literal["node", "path"]
CheckpointAdmission = Literal["all", "branch_and_end"]
SlotHeadroom = Literal["exact", "per_chunk"]
UnifiedGiveWay = Literal["sglang", "older_victim", "floor"]
CheckpointFormat = Literal["model", "int8", "fp8_e4m3"]
HostWritePolicy = Literal["write_through", "write_through_selective", "write_back", "resumable"]
HostPathCap = Literal["keep", "drop"]

STRATEGIES: tuple[str, ...] = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
EVICTION_ORDERS: tuple[str, ...] = ("leaf_first", "root_first", "mixed", "flop_weighted")
LRU_REFRESH_MODES: tuple[str, ...] = ("node", "path")
CHECKPOINT_ADMISSIONS: tuple[str, ...] = ("all", "branch_and_end")
SLOT_HEADROOM_MODES: tuple[str, ...] = ("exact", "per_chunk")

# SGLang 0.5.20 (per_chunk headroom) evicts checkpoints before every prefill chunk until this many slots
# per request of the batch are free (its MAMBA_STATE_PER_REQ_PREFIX_CACHE; the lazy strategy uses 2).
PER_CHUNK_HEADROOM_SLOTS = 3
PER_CHUNK_HEADROOM_SLOTS_LAZY = 2

# Slots every running request holds (SGLang PR #37943): its live state, the admission-locked matched
# checkpoint, and a spare for a donation or a copy-on-write. Ping-pong track slots come on top.
BASE_SLOTS_PER_REQUEST = 3
BASE_SLOTS_PER_REQUEST_SKIP_DECODE_LOCK = 2

# flop_weighted defaults (see mamba_radix.eviction): a doubling of saved compute is worth 32 ticks of
# recency; attention's quadratic cost equals the linear cost at 2^16 tokens (≈ Qwen3-Next-80B-A3B).
DEFAULT_FLOP_WEIGHT = 32.0
DEFAULT_FLOP_CROSSOVER = 65536


DISAGGREGATION_MODES: tuple[str, ...] = ("null", "prefill", "decode")
# who gives way when the unified pool's two sides meet (mamba_radix.pools.unified re-exports it as
# GIVE_WAY_RULES and states each rule)
UNIFIED_GIVE_WAY_RULES: tuple[str, ...] = ("sglang", "older_victim", "floor")
# how the tree's checkpoints are stored (mamba_radix.checkpoint_format re-exports it and defines each);
# here, so that a config is validated without importing torch
CHECKPOINT_FORMATS: tuple[str, ...] = ("model", "int8", "fp8_e4m3")
# when a node's KV and checkpoint get their host copy (SGLang's --hicache-write-policy; docs/host-tier.md):
# at insert, after N hits, or at device eviction; and ours, resumable: at device eviction, first the checkpoints
# a later request can resume from (sequence ends, the checkpoint a fork resumes from), others into free host memory
HOST_WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_through_selective", "write_back", "resumable")
# what the per-path cap (mamba_max_states_per_path) does to a dropped checkpoint's host copy: keep it (SGLang
# #31230) or free it too, host-only checkpoints counting against the cap (SGLang #39853's flag)
HOST_PATH_CAP_MODES: tuple[str, ...] = ("keep", "drop")
# SGLang's write-through threshold: a node is backed up at its first hit under write_through, its second
# under write_through_selective (HiRadixCache.write_through_threshold)
DEFAULT_HOST_WRITE_THROUGH_THRESHOLD = 2

# Fields that take one of a fixed set of names, and the names (the CLI's choices read it too).
FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    "mamba_radix_cache_strategy": STRATEGIES,
    "mamba_eviction_order": EVICTION_ORDERS,
    "mamba_checkpoint_admission": CHECKPOINT_ADMISSIONS,
    "mamba_lru_refresh": LRU_REFRESH_MODES,
    "mamba_slot_headroom": SLOT_HEADROOM_MODES,
    "disaggregation_mode": DISAGGREGATION_MODES,
    "unified_memory_give_way": UNIFIED_GIVE_WAY_RULES,
    "checkpoint_format": CHECKPOINT_FORMATS,
    "host_write_policy": HOST_WRITE_POLICIES,
    "host_path_cap": HOST_PATH_CAP_MODES,
}


def _asked(asked: str, strategy: str) -> str:
    """The strategy as the caller gave it, for a message (``auto`` says what it resolved to)."""
    return f"mamba_radix_cache_strategy={asked!r}" + (
        "" if asked == strategy else f" (resolved to {strategy})"
    )


@dataclass(frozen=True)
class SlotBudget:
    """The state slots one running request needs, derived once from a :class:`CacheConfig`
    (:attr:`CacheConfig.slot_budget`): the one home of these rules, read by the buffer strategies, the
    request pool, the position rules, the planner and the invariant suite's parameters.

    - ``ping_pong_entries``: entries of a request's track buffer: 0 (no_buffer, disabled), 1 (eager
      without overlap), 2 (eager with overlap; lazy, whose second entry is -1 except around a boundary);
    - ``track_slots_held``: track slots a request holds from admission (lazy: 1; eager: every entry);
    - ``reserved_per_request``: slots SGLang reserves per running request (``_calculate_mamba_ratio``):
      3 (2 with ``skip_decode_lock``) plus the track slots, 3 under no_buffer, 1 with the radix cache off;
    - ``decode_slots_in_use``: slots a decoding request actually occupies: its live slot, the track slots
      it holds and the checkpoint it continues from, locked (not under ``skip_decode_lock``);
    - ``per_chunk_headroom``: free slots ``mamba_slot_headroom="per_chunk"`` wants before a prefill chunk
      (SGLang 0.5.20; 0 with ``exact``).
    """

    ping_pong_entries: int
    track_slots_held: int
    reserved_per_request: int
    decode_slots_in_use: int
    per_chunk_headroom: int

    @classmethod
    def of(cls, config: CacheConfig) -> SlotBudget:
        """Derive the budget from ``config`` (validated). O(1)."""
        if not config.uses_extra_buffer:
            entries = held = 0
        else:
            entries = 2 if config.is_lazy or config.overlap else 1
            held = 1 if config.is_lazy else entries
        if config.strategy == "no_buffer":
            reserved = BASE_SLOTS_PER_REQUEST
        else:
            base = (
                BASE_SLOTS_PER_REQUEST_SKIP_DECODE_LOCK if config.skip_decode_lock else BASE_SLOTS_PER_REQUEST
            )
            reserved = base + held
        in_use = 1 + held + (0 if config.skip_decode_lock else 1)
        headroom = 0
        if config.mamba_slot_headroom == "per_chunk":
            headroom = PER_CHUNK_HEADROOM_SLOTS_LAZY if config.is_lazy else PER_CHUNK_HEADROOM_SLOTS
        if config.disable_radix_cache:  # one live slot is reserved; the track buffer is still built
            reserved = in_use = 1
            headroom = 0
        return cls(entries, held, reserved, in_use, headroom)

    def admission_slots(self, has_live_slot: bool, has_track_buffer: bool) -> int:
        """Slots admitting a request takes: a live slot unless it has one (a copy-on-write hit gave it
        one), plus its track slots unless it has a track buffer. O(1)."""
        return (0 if has_live_slot else 1) + (0 if has_track_buffer else self.track_slots_held)


@dataclass(frozen=True)
class CacheConfig:
    """Everything the cache, the pools' slot accounting and the scheduler rules depend on.

    Fields (SGLang server-argument names; defaults as in SGLang):

    - ``page_size``: tokens per KV page (1 = token-granular).
    - ``mamba_radix_cache_strategy``: ``auto``, ``no_buffer``, ``extra_buffer`` or ``extra_buffer_lazy``.
    - ``disable_overlap_schedule``: overlap scheduling is on by default, as in SGLang. It decides the
      ping-pong size ``P`` (2 with overlap, 1 without) and what ``auto`` resolves to.
    - ``mamba_track_interval``: decode checkpoints land where ``seq_len % interval == 0``.
    - ``mamba_cache_chunk_size``: prefill checkpoints land on multiples of it, counted from the request's
      prefix start; the effective grid is ``lcm(chunk, page_size)``.
    - ``mamba_max_states_per_path``: soft cap on checkpoints per root-to-leaf path; -1 = unlimited.
    - ``mamba_eviction_order``: checkpoint victim order among equally old candidates: ``leaf_first``
      (deepest first), ``root_first`` (shallowest first) or ``mixed`` (a running request's superseded
      checkpoints first, shallowest first, then the rest leaf-first); or ``flop_weighted`` (Marconi's
      idea: LRU with a bonus for the compute a checkpoint saves, see :mod:`mamba_radix.eviction`).
    - ``mamba_lru_refresh``: on a hit refresh only the consumed checkpoint (``node``, SGLang after
      PR #31643) or every checkpoint of the matched path (``path``, the older behaviour).
    - ``chunked_prefill_size``: tokens per prefill chunk; -1 disables chunking.
    - ``speculative_num_draft_tokens``: 0 without speculative decoding.
    - ``skip_decode_lock``: SGLang's ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``: a hand-over's lock is KV-only, so
      the checkpoint stays evictable while its request runs (``stats.checkpoints_evicted_while_decoding``),
      and the base reservation is one slot lower.
    - ``disaggregation_mode``: ``null``, ``prefill`` or ``decode`` (lazy buffers are not allowed with PD).
    - ``model_supports_extra_buffer``: whether the architecture has the FLA kernels extra_buffer needs.
    - ``disable_radix_cache``: no prefix caching at all (one slot per request).

    Peers as policies (DESIGN.md §9; our flags, not SGLang's; presets in :mod:`mamba_radix.peers`):

    - ``mamba_checkpoint_admission``: which prefill chunks checkpoint (extra_buffer only): ``all`` (every
      chunk, as SGLang) or ``branch_and_end`` (Marconi's admission: only the chunk holding the branch
      point and the chunk holding the input's last aligned position; see
      :func:`mamba_radix.strategies.prefill_track_len`). Decode checkpoints are the same under both.
    - ``mamba_flop_weight``: ``flop_weighted`` only: clock ticks of recency that one doubling of a
      checkpoint's saved compute is worth, i.e. the half-life (in ticks) of its reuse probability;
      0 makes ``flop_weighted`` plain LRU with leaf-first ties.
    - ``mamba_flop_crossover``: ``flop_weighted`` only: the prefix length (tokens) at which the
      quadratic attention cost of recomputing a prefix equals its linear cost (SSM, MLP, projections).
      The default, 2^16, is close to Qwen3-Next-80B-A3B's (≈ 6 GFLOP per token linear, ≈ 0.2 MFLOP per
      token pair over its 12 attention layers, half of the pairs causal: ≈ 61k tokens).

    SGLang release rules (DESIGN.md §6.1; each one a switch, presets ``sglang-0.5.20`` and
    ``sglang-0.5.23`` in :mod:`mamba_radix.peers`; the defaults follow the current release, 0.5.23):

    - ``mamba_slot_headroom``: ``exact`` (0.5.23: a request evicts exactly the slots it takes, when it
      takes them) or ``per_chunk`` (0.5.20: before admission and before every later prefill chunk,
      checkpoints are evicted until ``PER_CHUNK_HEADROOM_SLOTS`` slots are free).
    - ``mamba_kv_only_leaves``: when a leaf is deleted, its ancestors without a checkpoint keep their KV
      as KV-only leaves (0.5.23; they leave through KV eviction) instead of being deleted with it (0.5.20).
    - ``mamba_decode_insert``: hand each decode checkpoint to the tree at once (``cache_unfinished_req``
      at every decode boundary: not SGLang, which only tracks during decode and inserts the newest tracked
      state at finish; an opt-in policy).

    Unified memory (SGLang's ``--enable-unified-memory``; :mod:`mamba_radix.pools.unified`):

    - ``enable_unified_memory``: KV and states share one byte budget, states growing up and KV down until
      they meet; the start-up ratio only fixes the budget. Refused with speculative decoding and PD
      disaggregation (the seeds' incompatibilities; the host tier and DCP > 1 have no field here).
    - ``unified_memory_give_way``: who gives way when the sides meet: ``sglang`` (the requester evicts its
      own, a state shortfall then evicts KV), ``older_victim`` or ``floor``.

    Quantized checkpoints (SGLang's ``--enable-int8-mamba-checkpoint``; ``docs/checkpoint-formats.md``):

    - ``checkpoint_format``: ``model`` (checkpoints are state-pool slots in the model's dtype, as always),
      ``int8`` or ``fp8_e4m3``: the tree's checkpoints live in a separate checkpoint pool
      (:class:`~mamba_radix.pools.checkpoint_pool.CheckpointPool`), quantized at a hand-over and
      dequantized into the request's own slot at a hit. Refused with unified memory.
    - ``checkpoint_slots``: slots of that pool (SGLang's ``--int8-mamba-ckpt-size``); ``None``: twice the
      state pool's slots, as SGLang. Only with a quantized format.

    The host tier (SGLang's HiCache for hybrid models; ``docs/host-tier.md``), off by default:

    - ``host_kv_tokens`` / ``host_state_slots``: rows of the host KV pool and slots of the host state pool.
      Both 0: no host tier. SGLang always sizes both pools together from one ``--hicache-size`` /
      ``--hicache-ratio``, so one without the other is refused. Refused with a quantized
      ``checkpoint_format`` (SGLang refuses its int8 checkpoints with HiCache) and with unified memory (the
      seeds list the host tier as incompatible with it).
    - ``host_write_policy``: when a node gets its host copy: ``write_through`` (at its first hit, an insert
      counting as one: SGLang's default), ``write_through_selective`` (at its
      ``host_write_through_threshold``-th hit), ``write_back`` (when the device evicts it) or
      ``resumable`` (ours: copied when the device evicts them, checkpoints a later request can resume
      from, a sequence's end or the checkpoint a fork resumes from, even if host copies must go for
      them, any other checkpoint only into free host memory; host eviction takes stale host checkpoints
      first).
    - ``host_write_through_threshold``: the hit count of ``write_through_selective`` (SGLang's: 2).
    - ``host_path_cap``: what the per-path cap (``mamba_max_states_per_path``) does to the host copy of a
      checkpoint it drops: ``keep`` (SGLang #31230: the host copy stays) or ``drop`` (host-only
      checkpoints count against the cap too, and a dropped checkpoint loses both copies: SGLang #39853).
      No effect without a cap or without the host tier.
    """

    page_size: int = 1
    mamba_radix_cache_strategy: Strategy = "auto"
    disable_overlap_schedule: bool = False
    mamba_track_interval: int = 256
    mamba_cache_chunk_size: int = 64
    mamba_max_states_per_path: int = -1
    mamba_eviction_order: EvictionOrder = "leaf_first"
    mamba_lru_refresh: LruRefresh = "node"
    chunked_prefill_size: int = 8192
    speculative_num_draft_tokens: int = 0
    skip_decode_lock: bool = False
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    model_supports_extra_buffer: bool = True
    disable_radix_cache: bool = False
    # peers as policies (DESIGN.md §9); last, so positional construction keeps working
    mamba_checkpoint_admission: CheckpointAdmission = "all"
    mamba_flop_weight: float = DEFAULT_FLOP_WEIGHT
    mamba_flop_crossover: int = DEFAULT_FLOP_CROSSOVER
    # SGLang release rules (DESIGN.md §6.1)
    mamba_slot_headroom: SlotHeadroom = "exact"
    mamba_kv_only_leaves: bool = True
    mamba_decode_insert: bool = False
    # unified memory (SGLang's --enable-unified-memory)
    enable_unified_memory: bool = False
    unified_memory_give_way: UnifiedGiveWay = "sglang"
    # quantized checkpoints (SGLang's --enable-int8-mamba-checkpoint / --int8-mamba-ckpt-size)
    checkpoint_format: CheckpointFormat = "model"
    checkpoint_slots: int | None = None
    # the host tier (SGLang's HiCache); both 0: off
    host_kv_tokens: int = 0
    host_state_slots: int = 0
    host_write_policy: HostWritePolicy = "write_through"
    host_write_through_threshold: int = DEFAULT_HOST_WRITE_THROUGH_THRESHOLD
    host_path_cap: HostPathCap = "keep"

    def __post_init__(self) -> None:
        self._check_types()
        self._check_choices()
        self._check_ranges()
        self._check_strategy()
        self._check_unified_memory()
        self._check_checkpoint_format()
        self._check_host_tier()

    # ----------------------------------------------------------------------------------------- validation
    def _check_types(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int",) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
            if f.type in ("bool",) and not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be True or False, got {value!r}")
            if f.type in ("float",) and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            ):
                raise ConfigError(f"{f.name} must be a finite number, got {value!r}")

    def _check_choices(self) -> None:
        for name, choices in FIELD_CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                close = difflib.get_close_matches(str(value), choices, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}{hint}")

    def _check_ranges(self) -> None:
        if self.page_size < 1:
            raise ConfigError(f"page_size must be >= 1, got {self.page_size}")
        if self.mamba_track_interval < 1:
            raise ConfigError(f"mamba_track_interval must be >= 1, got {self.mamba_track_interval}")
        if self.mamba_cache_chunk_size < 1:
            raise ConfigError(f"mamba_cache_chunk_size must be >= 1, got {self.mamba_cache_chunk_size}")
        if self.mamba_max_states_per_path == 0 or self.mamba_max_states_per_path < -1:
            raise ConfigError(
                f"mamba_max_states_per_path must be -1 (unlimited) or a positive count, "
                f"got {self.mamba_max_states_per_path}"
            )
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ConfigError(
                f"chunked_prefill_size must be -1 (no chunking) or a positive token count, "
                f"got {self.chunked_prefill_size}"
            )
        if 0 < self.chunked_prefill_size < self.page_size:
            raise ConfigError(
                f"chunked_prefill_size={self.chunked_prefill_size} is below page_size={self.page_size}: a "
                "prefill chunk ends on a page boundary (or at the prompt's end), so no chunk could start; "
                f"use at least {self.page_size}"
            )
        if self.speculative_num_draft_tokens < 0:
            raise ConfigError(
                f"speculative_num_draft_tokens must be >= 0, got {self.speculative_num_draft_tokens}"
            )
        if self.mamba_flop_weight < 0:
            raise ConfigError(
                f"mamba_flop_weight must be >= 0 (ticks per doubling of saved compute; 0 = plain LRU), "
                f"got {self.mamba_flop_weight}"
            )
        if self.mamba_flop_crossover < 1:
            raise ConfigError(f"mamba_flop_crossover must be >= 1 (tokens), got {self.mamba_flop_crossover}")

    def _check_strategy(self) -> None:
        asked = self.mamba_radix_cache_strategy
        strategy = self.strategy
        if strategy == "no_buffer" and self.page_size != 1:
            hint = "" if asked == "auto" else " or use mamba_radix_cache_strategy='extra_buffer'"
            raise ConfigError(
                f"{_asked(asked, strategy)} needs page_size=1 (got {self.page_size}); set page_size=1{hint}"
            )
        if strategy == "no_buffer" and self.mamba_checkpoint_admission != "all":
            hint = (
                "set mamba_radix_cache_strategy='extra_buffer'"
                if self.model_supports_extra_buffer
                else "the model has no extra-buffer support"
            )
            raise ConfigError(
                f"mamba_checkpoint_admission={self.mamba_checkpoint_admission!r} needs extra_buffer or "
                f"extra_buffer_lazy (no_buffer copies the live state at every chunk end; the strategy in "
                f"force is no_buffer); {hint}, or use mamba_checkpoint_admission='all'"
            )
        if strategy in ("extra_buffer", "extra_buffer_lazy"):
            if not self.model_supports_extra_buffer:
                raise ConfigError(
                    f"{_asked(asked, strategy)} needs a model with extra-buffer support "
                    "(model_supports_extra_buffer=True); "
                    "use mamba_radix_cache_strategy='no_buffer' (or auto)"
                )
            if self.mamba_track_interval < self.speculative_num_draft_tokens:
                raise ConfigError(
                    f"mamba_track_interval={self.mamba_track_interval} must be >= "
                    f"speculative_num_draft_tokens={self.speculative_num_draft_tokens}; "
                    "raise the interval"
                )
            if self.mamba_track_interval % self.page_size != 0:
                raise ConfigError(
                    f"mamba_track_interval={self.mamba_track_interval} must be a multiple of "
                    f"page_size={self.page_size}; pick an interval that page_size divides"
                )
            if self.disable_radix_cache and self.speculative_num_draft_tokens == 0:
                raise ConfigError(
                    f"{_asked(asked, strategy)} is useless with disable_radix_cache=True and no "
                    "speculative decoding; "
                    "use mamba_radix_cache_strategy='no_buffer' or enable the radix cache"
                )
        if strategy == "extra_buffer_lazy":
            if self.disable_overlap_schedule:
                raise ConfigError(
                    "mamba_radix_cache_strategy='extra_buffer_lazy' requires overlap scheduling; "
                    "set disable_overlap_schedule=False or use mamba_radix_cache_strategy='extra_buffer'"
                )
            if self.disaggregation_mode != "null":
                raise ConfigError(
                    "mamba_radix_cache_strategy='extra_buffer_lazy' is not supported with PD disaggregation "
                    f"(disaggregation_mode={self.disaggregation_mode!r}); "
                    "use mamba_radix_cache_strategy='extra_buffer'"
                )

    def _check_unified_memory(self) -> None:
        if not self.enable_unified_memory:
            return
        if self.speculative_num_draft_tokens > 0:
            raise ConfigError(
                f"enable_unified_memory=True does not support speculative decoding (speculative_num_draft_tokens="
                f"{self.speculative_num_draft_tokens}); set speculative_num_draft_tokens=0 or disable unified memory"
            )
        if self.disaggregation_mode != "null":
            raise ConfigError(
                f"enable_unified_memory=True does not support PD disaggregation (disaggregation_mode="
                f"{self.disaggregation_mode!r}); set disaggregation_mode='null' or disable unified memory"
            )

    def _check_checkpoint_format(self) -> None:
        fmt = self.checkpoint_format  # a known name already (_check_choices)
        slots = self.checkpoint_slots
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
            raise ConfigError(
                f"checkpoint_slots must be a positive int or None (twice the state pool's slots), got {slots!r}"
            )
        if fmt == "model":
            if slots is not None:
                raise ConfigError(
                    f"checkpoint_slots={slots} sizes a quantized checkpoint pool, which checkpoint_format='model' "
                    "does not have; set checkpoint_format='int8' or 'fp8_e4m3', or leave checkpoint_slots=None"
                )
            return
        if self.enable_unified_memory:
            raise ConfigError(
                f"checkpoint_format={fmt!r} does not compose with enable_unified_memory=True (the unified byte "
                "budget holds no checkpoint pool; SGLang drops its int8 pool there); use checkpoint_format='model' "
                "or disable unified memory"
            )

    def _check_host_tier(self) -> None:
        kv, slots = self.host_kv_tokens, self.host_state_slots
        if kv < 0 or slots < 0:
            raise ConfigError(
                f"host_kv_tokens and host_state_slots must be >= 0 (0: no host tier), got {kv} and {slots}"
            )
        if self.host_write_through_threshold < 1:
            raise ConfigError(
                f"host_write_through_threshold must be >= 1 (hits before a backup), got "
                f"{self.host_write_through_threshold}"
            )
        if (kv == 0) != (slots == 0):
            raise ConfigError(
                f"host_kv_tokens={kv} with host_state_slots={slots}: the host tier needs both pools (SGLang sizes "
                "them together); set both > 0, or both 0 for no host tier"
            )
        if kv % self.page_size:
            raise ConfigError(
                f"host_kv_tokens={kv} must be a multiple of page_size={self.page_size} (host copies hold whole pages)"
            )
        if not kv:
            return
        if self.checkpoint_format != "model":
            raise ConfigError(
                f"checkpoint_format={self.checkpoint_format!r} does not compose with the host tier (SGLang refuses "
                "its int8 checkpoints with HiCache); use checkpoint_format='model' or host_kv_tokens=0"
            )
        if self.disable_radix_cache:
            raise ConfigError(
                "disable_radix_cache=True leaves nothing to back up to the host tier; enable the radix cache or "
                "set host_kv_tokens=host_state_slots=0"
            )
        if self.enable_unified_memory:
            raise ConfigError(
                "enable_unified_memory=True does not compose with the host tier (host_kv_tokens > 0); "
                "disable unified memory or set host_kv_tokens=host_state_slots=0"
            )

    @property
    def host_tier(self) -> bool:
        """Whether the host tier is on (``host_kv_tokens > 0``; the state pool then too)."""
        return self.host_kv_tokens > 0

    # -------------------------------------------------------------------------------------- derived values
    @property
    def strategy(self) -> ResolvedStrategy:
        """The strategy in force: ``auto`` resolved as SGLang does; never ``auto``, never lazy by choice."""
        asked = self.mamba_radix_cache_strategy
        if asked != "auto":
            return asked  # type: ignore[return-value]
        if (self.overlap_requested or self.page_size > 1) and self.model_supports_extra_buffer:
            return "extra_buffer"
        return "no_buffer"

    @property
    def overlap_requested(self) -> bool:
        return not self.disable_overlap_schedule

    @property
    def overlap(self) -> bool:
        """Whether overlap scheduling is in force: ``no_buffer`` always runs without it."""
        return self.overlap_requested and self.strategy != "no_buffer"

    @property
    def uses_extra_buffer(self) -> bool:
        return self.strategy in ("extra_buffer", "extra_buffer_lazy")

    @property
    def is_lazy(self) -> bool:
        return self.strategy == "extra_buffer_lazy"

    @cached_property
    def slot_budget(self) -> SlotBudget:
        """The state slots one running request needs (:class:`SlotBudget`), derived once."""
        return SlotBudget.of(self)

    @property
    def ping_pong_size(self) -> int:
        """Entries of a request's track buffer (:attr:`SlotBudget.ping_pong_entries`)."""
        return self.slot_budget.ping_pong_entries

    @property
    def slots_per_request(self) -> int:
        """State slots reserved per running request (:attr:`SlotBudget.reserved_per_request`)."""
        return self.slot_budget.reserved_per_request

    @property
    def mamba_checkpoint_grid(self) -> int:
        """Prefill checkpoints land on multiples of this many tokens: ``lcm(chunk, page_size)``."""
        return math.lcm(self.mamba_cache_chunk_size, self.page_size)

    @property
    def per_chunk_headroom_slots(self) -> int:
        """Free slots ``per_chunk`` headroom wants before a prefill chunk (:attr:`SlotBudget.per_chunk_headroom`)."""
        return self.slot_budget.per_chunk_headroom

    def max_running_requests(self, num_slots: int) -> int:
        """Requests the state pool admits at once: ``num_slots // slots_per_request``."""
        return num_slots // self.slots_per_request

    def replace(self, **changes: object) -> CacheConfig:
        """A validated copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]
