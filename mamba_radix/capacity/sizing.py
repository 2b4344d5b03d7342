"""Pool sizing as SGLang resolves it (``kv_cache_configurator.py``; reference §6.4).

From a per-GPU memory budget (SGLang's ``total_rest_memory``: what is left after weights and activations)
and ``--mamba-full-memory-ratio``, or from an explicit ``--max-mamba-cache-size``, :func:`resolve_pools`
derives, in SGLang's order:

1. the state slots: ``budget = rest * r / (1 + r)``, ``max_mamba_cache_size = budget // bytes_per_slot``
   (a slot's bytes include the ReplaySSM rings when they are on; plain speculative decoding also reserves
   ``D`` intermediate states per running request, solved jointly as ``budget // (slot * (1 + D / ratio))``);
2. the KV tokens from what is left: ``(rest - slots * bytes_per_slot) // bytes_per_token``, page-aligned,
   then capped by ``--max-total-tokens``;
3. ``max_running_requests = min(requested or estimate, tokens // 2, slots // slots_per_request)``, where
   the estimate is ``clamp(tokens / context_len * 512, 2048, 4096)`` and ``slots_per_request`` comes from
   :attr:`CacheConfig.slots_per_request`. The state term usually binds; the result says which did.

The allocated pools are one slot and one page larger than the sizes (padding sinks); the GB figures are
those of the allocated pools, as SGLang's logs print them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mamba_radix.capacity.memory import (
    GIB,
    KVTokenBytes,
    Parallelism,
    ReplayRingBytes,
    StateSlotBytes,
    kv_pool_bytes,
    kv_token_bytes,
    replay_ring_bytes,
    state_slot_bytes,
)
from mamba_radix.capacity.models import ModelSpec
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError

__all__ = [
    "Binding",
    "MemoryBudget",
    "PoolResolution",
    "SizingInputs",
    "capped_message",
    "check_checkpoint_format",
    "resolve_pools",
]

Binding = Literal["mamba state cache", "full KV tokens", "--max-running-requests", "context-length estimate"]

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
# Bounds that keep every derived number finite and every loop short; far beyond any real GPU or setting.
MAX_BUDGET_GIB = 1 << 20  # 1 PiB of pool memory on one GPU
MAX_MEMORY_RATIO = 1e6
MAX_COUNT = 2**62  # slots, tokens, requests, context length


def check_checkpoint_format(name: object) -> str:
    """``name`` if it is a checkpoint format (:data:`mamba_radix.checkpoint_format.CHECKPOINT_FORMATS`, the
    one rule), else its one-line error as :class:`ConfigError` (the command line prints it, exit 2). Imports
    torch, through the format module, on the first call."""
    from mamba_radix.checkpoint_format import check_format
    from mamba_radix.errors import InvalidArgument

    try:
        return check_format(name)
    except InvalidArgument as err:
        raise ConfigError(str(err)) from None


def _real(name: str, value: object, *, low: float, high: float, low_inclusive: bool = False) -> float:
    """``value`` as a finite float in the range, or :class:`ConfigError` naming argument ``name``. O(1)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)  # type: ignore[arg-type]
    above_low = v >= low if low_inclusive else v > low
    if not (above_low and v <= high):  # also refuses NaN
        sign = ">=" if low_inclusive else ">"
        raise ConfigError(f"{name} must be {sign} {low:g} and <= {high:g}, got {value!r}")
    return v


@dataclass(frozen=True)
class MemoryBudget:
    """Memory for the KV and state pools on one GPU, in GiB (SGLang's "GB", ``1 << 30`` bytes).

    SGLang profiles it as ``total * mem_fraction_static - weights - ...``; :meth:`from_gpu` is that estimate
    without the profiler (activation and CUDA-graph memory sit in the ``1 - mem_fraction_static`` part).
    """

    rest_gib: float

    def __post_init__(self) -> None:
        ok = isinstance(self.rest_gib, (int, float)) and not isinstance(self.rest_gib, bool)
        if not ok or not self.rest_gib > 0:
            raise ConfigError(f"rest_gib must be > 0 GiB, got {self.rest_gib!r}")
        _real("rest_gib", self.rest_gib, low=0, high=MAX_BUDGET_GIB)

    @property
    def rest_bytes(self) -> int:
        return int(self.rest_gib * GIB)

    @classmethod
    def from_gpu(cls, gpu_memory_gib: float, mem_fraction_static: float, weights_gib: float) -> MemoryBudget:
        for name, value in (
            ("gpu_memory_gib", gpu_memory_gib),
            ("mem_fraction_static", mem_fraction_static),
            ("weights_gib", weights_gib),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if gpu_memory_gib > MAX_BUDGET_GIB:
            raise ConfigError(f"gpu_memory_gib must be <= {MAX_BUDGET_GIB}, got {gpu_memory_gib!r}")
        if not 0 < mem_fraction_static <= 1:
            raise ConfigError(f"mem_fraction_static must be in (0, 1], got {mem_fraction_static!r}")
        if gpu_memory_gib <= 0 or weights_gib < 0:
            raise ConfigError(
                f"gpu_memory_gib must be > 0 and weights_gib >= 0, got {gpu_memory_gib!r} and {weights_gib!r}"
            )
        rest = gpu_memory_gib * mem_fraction_static - weights_gib
        if rest <= 0:
            raise ConfigError(
                f"no memory left for the caches: {gpu_memory_gib} GB x {mem_fraction_static} - {weights_gib} GB "
                "of weights <= 0; raise mem_fraction_static or shard the weights over more GPUs (a larger tp_size)"
            )
        return cls(rest_gib=rest)


@dataclass(frozen=True)
class SizingInputs:
    """Everything SGLang's pool sizing depends on, under SGLang's flag names."""

    model: ModelSpec
    parallelism: Parallelism
    cache: CacheConfig
    kv_cache_dtype: str = "auto"
    mamba_ssm_dtype: str | None = None
    mamba_conv_dtype: str = "bfloat16"
    enable_linear_replayssm_spec: bool = False
    linear_replayssm_cache_len: int = 16
    budget: MemoryBudget | None = None
    mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    # checkpoint storage (mamba_radix.capacity.formats); None: the cache config's field (CacheConfig.
    # checkpoint_format / checkpoint_slots), "model" / None while CacheConfig has no such field
    checkpoint_format: str | None = None
    checkpoint_slots: int | None = None
    # SGLang's host tier (--enable-hierarchical-cache): not modelled, only checked against what it rules out
    enable_hierarchical_cache: bool = False

    def __post_init__(self) -> None:
        for what, value, kind in (
            ("model", self.model, ModelSpec),
            ("parallelism", self.parallelism, Parallelism),
            ("cache", self.cache, CacheConfig),
        ):
            if not isinstance(value, kind):
                raise ConfigError(f"{what} must be a {kind.__name__}, got {type(value).__name__}")
        if self.budget is not None and not isinstance(self.budget, MemoryBudget):
            raise ConfigError(f"budget must be a MemoryBudget or None, got {type(self.budget).__name__}")
        for name, value in (
            ("kv_cache_dtype", self.kv_cache_dtype),
            ("mamba_conv_dtype", self.mamba_conv_dtype),
        ):
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a dtype name, got {value!r}")
        if self.mamba_ssm_dtype is not None and not isinstance(self.mamba_ssm_dtype, str):
            raise ConfigError(
                f"mamba_ssm_dtype must be a dtype name or None (the model's), got {self.mamba_ssm_dtype!r}"
            )
        if not isinstance(self.enable_linear_replayssm_spec, bool):
            raise ConfigError(
                f"enable_linear_replayssm_spec must be True or False, got {self.enable_linear_replayssm_spec!r}"
            )
        ratio = self.mamba_full_memory_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
            raise ConfigError(
                f"mamba_full_memory_ratio must be > 0 (state : full KV bytes), got {self.mamba_full_memory_ratio!r}"
            )
        _real("mamba_full_memory_ratio", ratio, low=0, high=MAX_MEMORY_RATIO)
        for name, value in (
            ("max_mamba_cache_size", self.max_mamba_cache_size),
            ("max_total_tokens", self.max_total_tokens),
            ("max_running_requests", self.max_running_requests),
            ("context_len", self.context_len),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
            if value is not None and value > MAX_COUNT:
                raise ConfigError(f"{name} must be <= 2**62, got {value!r}")
        if isinstance(self.linear_replayssm_cache_len, bool) or not isinstance(
            self.linear_replayssm_cache_len, int
        ):
            raise ConfigError(
                f"linear_replayssm_cache_len must be a positive integer, got {self.linear_replayssm_cache_len!r}"
            )
        slots = self.checkpoint_slots
        if slots is not None and (
            isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_COUNT
        ):
            raise ConfigError(f"checkpoint_slots must be a positive integer or None, got {slots!r}")
        self._resolve_checkpoint_fields()
        if self.checkpoint_slots is not None and self.checkpoint_format == "model":
            raise ConfigError(
                "checkpoint_slots sizes a quantized checkpoint pool; give checkpoint_format int8 or fp8_e4m3, "
                "or drop checkpoint_slots"
            )
        self._check_host_tier_and_unified()
        if self.budget is None and self.max_mamba_cache_size is None:
            raise ConfigError(
                "nothing to size from: give a memory budget (budget, a MemoryBudget of rest_gib, or of "
                "gpu_memory_gib with weights_gib) or max_mamba_cache_size"
            )

    def _resolve_checkpoint_fields(self) -> None:
        """Fill ``checkpoint_format``/``checkpoint_slots`` left None from the cache config, refuse a value that
        contradicts the config's (one deployment, one format; the config's default ``model`` yields), and,
        when CacheConfig has the fields, carry them into ``cache`` through its own checks (the formats'
        names, slots only with a quantized format, no checkpoint pool under unified memory). O(1)."""
        has_fields = hasattr(self.cache, "checkpoint_format")
        for name, fallback in (("checkpoint_format", "model"), ("checkpoint_slots", None)):
            mine, theirs = getattr(self, name), getattr(self.cache, name, None)
            if mine is None:
                object.__setattr__(self, name, fallback if theirs is None else theirs)
            elif (
                theirs is not None
                and theirs != mine
                and not (name == "checkpoint_format" and theirs == "model")
            ):
                raise ConfigError(f"{name}={mine!r} but the cache config has {theirs!r}; give one value")
        if has_fields:
            cache = self.cache.replace(
                checkpoint_format=self.checkpoint_format, checkpoint_slots=self.checkpoint_slots
            )
            object.__setattr__(self, "cache", cache)
        elif self.checkpoint_format != "model":  # "model" needs no check (and no torch import)
            check_checkpoint_format(self.checkpoint_format)

    def _check_host_tier_and_unified(self) -> None:
        """The deployments SGLang refuses that CacheConfig has no field for (its own checks, speculative
        decoding and PD disaggregation under unified memory, ran when the config was built): unified memory
        with the host tier or DCP > 1 (the seeds' list), a quantized checkpoint pool with the host tier
        (SGLang's ``_handle_int8_mamba_checkpoint``). O(1)."""
        if not isinstance(self.enable_hierarchical_cache, bool):
            raise ConfigError(
                f"enable_hierarchical_cache must be True or False, got {self.enable_hierarchical_cache!r}"
            )
        if self.cache.enable_unified_memory:
            if self.enable_hierarchical_cache:
                raise ConfigError(
                    "enable_unified_memory=True does not support the host tier (enable_hierarchical_cache=True); "
                    "disable one of them"
                )
            if self.parallelism.dcp_size > 1:
                raise ConfigError(
                    f"enable_unified_memory=True does not support DCP > 1 (dcp_size={self.parallelism.dcp_size}); "
                    "set dcp_size=1 or disable unified memory"
                )
        if self.enable_hierarchical_cache and self.checkpoint_format != "model":
            raise ConfigError(
                f"checkpoint_format={self.checkpoint_format!r} does not support the host tier "
                "(enable_hierarchical_cache=True; SGLang's offload path is not int8-aware); use "
                "checkpoint_format='model' or disable one of them"
            )

    @property
    def verify_tokens(self) -> int | None:
        n = self.cache.speculative_num_draft_tokens
        return n if n > 0 else None

    @property
    def reserves_intermediate_states(self) -> bool:
        """Plain speculative decoding keeps D intermediate states per running request; ReplaySSM replaces
        them with its rings (it records inputs and replays the accepted prefix instead)."""
        return self.verify_tokens is not None and not self.enable_linear_replayssm_spec


@dataclass(frozen=True)
class PoolResolution:
    """The resolved pools of one GPU and the concurrency they allow."""

    inputs: SizingInputs
    kv: KVTokenBytes
    state: StateSlotBytes
    rings: ReplayRingBytes | None
    num_slots: int  # max_mamba_cache_size (usable slots; one more is allocated)
    num_tokens: int | None  # logical KV tokens (x dcp_size local rows); None without a budget or cap
    intermediate_bytes: int  # speculative intermediate states reserved out of the budget
    max_running_requests: int
    binding: Binding
    limits: dict[str, int]  # each candidate limit of max_running_requests

    @property
    def slots_per_request(self) -> int:
        return self.inputs.cache.slots_per_request

    @property
    def bytes_per_slot(self) -> int:
        """SGLang's ``mamba_cache_per_req``: conv + temporal (+ rings) of one slot on one GPU."""
        return self.state.slot_bytes + (self.rings.slot_bytes if self.rings else 0)

    @property
    def state_pool_bytes(self) -> int:
        return (self.num_slots + 1) * self.bytes_per_slot

    @property
    def rest_bytes(self) -> int | None:
        """Bytes the two pools may use on one GPU: the budget, or, without one, what the resolved pools
        occupy in SGLang's accounting (``slots * bytes_per_slot + rows * row_bytes``)."""
        if self.inputs.budget is not None:
            return self.inputs.budget.rest_bytes
        if self.kv_rows is None:
            return None
        return (
            self.num_slots * self.bytes_per_slot + self.intermediate_bytes + self.kv_rows * self.kv.row_bytes
        )

    @property
    def kv_rows(self) -> int | None:
        if self.num_tokens is None:
            return None
        return self.num_tokens // self.kv.dcp_size

    @property
    def kv_pool_bytes(self) -> int | None:
        rows = self.kv_rows
        return None if rows is None else kv_pool_bytes(self.kv, rows, self.inputs.cache.page_size)

    @property
    def state_capped(self) -> bool:
        return self.binding == "mamba state cache"

    @property
    def message(self) -> str | None:
        """SGLang's warning when the state pool caps concurrency (seed 001 §5.1), else None; its hints are
        only those that would raise the cap here (:func:`capped_message`)."""
        if not self.state_capped:
            return None
        cache = self.inputs.cache
        with_switch = (
            None if cache.skip_decode_lock else cache.replace(skip_decode_lock=True).slots_per_request
        )
        return capped_message(
            self.max_running_requests,
            self.num_slots,
            self.slots_per_request,
            self.state.ssm_dtype,
            slots_per_request_with_skip_lock=with_switch,
        )


def capped_message(
    max_running_requests: int,
    num_slots: int,
    slots_per_request: int,
    ssm_dtype: str,
    *,
    slots_per_request_with_skip_lock: int | None = None,
) -> str:
    """The seed's line: "max_running_requests is capped to 16 by the mamba state cache
    (max_mamba_cache_size=80, 5 state slots per request). To raise it: increase --mamba-full-memory-ratio
    or --max-mamba-cache-size, ...", keeping only the hints that change something. O(1), pure.

    - SGLang's own "or halve the state size with --mamba-ssm-dtype bfloat16" only for an fp32 SSM state
      (a 16-bit state cannot be halved that way);
    - "or set SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 (4 state slots per request instead of 5)" only when
      ``slots_per_request_with_skip_lock`` (the reservation the switch would give; None when it is already
      on) is below ``slots_per_request``: not under no_buffer, nor with the radix cache disabled;
    - neither: the sentence ends after the ratio / size hint.

    With an fp32 state and no switch to suggest, the line is SGLang's word for word.
    """
    head = (
        f"max_running_requests is capped to {max_running_requests} by the mamba state cache "
        f"(max_mamba_cache_size={num_slots}, {slots_per_request} state slots per request)."
    )
    hints = ["increase --mamba-full-memory-ratio or --max-mamba-cache-size"]
    if ssm_dtype == "float32":
        hints.append("halve the state size with --mamba-ssm-dtype bfloat16")
    with_switch = slots_per_request_with_skip_lock
    if with_switch is not None and with_switch < slots_per_request:
        hints.append(
            f"set SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1 ({with_switch} state slots per request "
            f"instead of {slots_per_request})"
        )
    return f"{head} To raise it: {', or '.join(hints)}."


def resolve_pools(inputs: SizingInputs) -> PoolResolution:
    """Resolve slots, tokens and ``max_running_requests`` for one GPU as SGLang does (module docstring)."""
    if not isinstance(inputs, SizingInputs):
        raise ConfigError(f"resolve_pools takes SizingInputs, got {type(inputs).__name__}")
    model, par, cache = inputs.model, inputs.parallelism, inputs.cache
    state = state_slot_bytes(model, par, inputs.mamba_ssm_dtype, inputs.mamba_conv_dtype)
    kv = kv_token_bytes(model, par, inputs.kv_cache_dtype)
    rings = (
        replay_ring_bytes(
            model, par, inputs.linear_replayssm_cache_len, inputs.verify_tokens, inputs.mamba_conv_dtype
        )
        if inputs.enable_linear_replayssm_spec
        else None
    )
    per_slot = state.slot_bytes + (rings.slot_bytes if rings else 0)
    ratio = cache.slots_per_request
    draft = inputs.verify_tokens or 0

    # 1. slots
    rest_bytes = inputs.budget.rest_bytes if inputs.budget else None
    if inputs.max_mamba_cache_size is not None:
        num_slots = inputs.max_mamba_cache_size
    else:
        assert rest_bytes is not None
        r = inputs.mamba_full_memory_ratio
        state_budget = rest_bytes * r / (1 + r)
        if inputs.reserves_intermediate_states:
            num_slots = int(state_budget // (per_slot * (1 + draft / ratio)))
        else:
            num_slots = int(state_budget // per_slot)
    if num_slots <= 0:
        raise ConfigError(
            f"not enough memory for the state cache: {num_slots} state slots "
            f"({per_slot / (1 << 20):.2f} MB per slot); raise budget.rest_gib or mamba_full_memory_ratio, "
            "or use mamba_ssm_dtype='bfloat16'"
        )
    intermediate = 0
    if inputs.reserves_intermediate_states:
        requested = (
            inputs.max_running_requests if inputs.max_running_requests is not None else num_slots // ratio
        )
        intermediate = per_slot * min(requested, num_slots // ratio) * draft

    # 2. tokens
    num_tokens: int | None = None
    if rest_bytes is not None:
        left = rest_bytes - intermediate - num_slots * per_slot
        if left <= 0:
            raise ConfigError(
                f"the state cache ({num_slots} slots) leaves no memory for full KV; lower "
                "max_mamba_cache_size or mamba_full_memory_ratio, or raise budget.rest_gib"
            )
        rows = left // kv.row_bytes
        rows = rows // cache.page_size * cache.page_size
        num_tokens = rows * kv.dcp_size
    if inputs.max_total_tokens is not None:
        num_tokens = (
            inputs.max_total_tokens if num_tokens is None else min(num_tokens, inputs.max_total_tokens)
        )

    # 3. max_running_requests
    limits: dict[str, int] = {}
    if inputs.max_running_requests is not None:
        limits["--max-running-requests"] = inputs.max_running_requests
    elif num_tokens is not None:
        context_len = inputs.context_len or model.context_len
        limits["context-length estimate"] = max(min(int(num_tokens / context_len * 512), 4096), 2048)
    if num_tokens is not None:
        limits["full KV tokens"] = num_tokens // 2
    limits["mamba state cache"] = num_slots // ratio
    # The state pool "caps" concurrency (SGLang's warning) only when its limit is strictly the lowest.
    others = {name: value for name, value in limits.items() if name != "mamba state cache"}
    if not others or limits["mamba state cache"] < min(others.values()):
        binding = "mamba state cache"
    else:
        binding = min(others, key=lambda name: others[name])
    max_running = limits[binding]
    if max_running <= 0:
        raise ConfigError(
            f"the state cache is too small to serve any request: {num_slots} state slots, "
            f"{ratio} slots per request; raise max_mamba_cache_size or mamba_full_memory_ratio"
        )
    return PoolResolution(
        inputs=inputs,
        kv=kv,
        state=state,
        rings=rings,
        num_slots=num_slots,
        num_tokens=num_tokens,
        intermediate_bytes=intermediate,
        max_running_requests=max_running,
        binding=binding,  # type: ignore[arg-type]
        limits=limits,
    )
