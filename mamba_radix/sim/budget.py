"""The one home of the simulator's pool sizing: (KV tokens, state slots, request rows) for a run.

Three ways to size a run's pools, chosen by :func:`pools_for_run` (sweeps, ``simulate``) or called
directly (the policy experiment's points, the demand pass):

- :func:`pools_for_budget`: a per-rank memory budget split the way SGLang splits it;
- :func:`exact_pools`: given KV tokens and state slots;
- :func:`infinite_pools`: pools no trace of a given size can fill.

The engine reads two more rules from here: :func:`request_rows` (how many requests run at once) and
:meth:`PoolSizes.allocator_kv_tokens` (the allocator's size at a page size).

The simulator's only contact with the byte math: :func:`pools_for_budget`, :func:`sizing_inputs` (the
planner's inputs for the same deployment, for a script that compares the two) and :func:`model_bytes` call
:mod:`mamba_radix.capacity` (model presets, bytes per KV token and per state slot, SGLang's
``_handle_max_mamba_cache`` ratio rule: ``r / (1 + r)`` of the budget goes to state slots unless
``--max-mamba-cache-size`` fixes them, the KV pool gets the rest). Everything else (the engine, sweeps,
the CLI) only sees the resulting :class:`PoolSizes`.

Bytes follow the model's deployment defaults (:mod:`mamba_radix.defaults`, shared with ``plan``); Kimi K3 is
the seeds' one TP8 rank, bf16 MLA KV and bf16 KDA states: 27,648 B per KV token, 29,039,616 B per state slot.

Speculative decoding is a sizing input only (it is not simulated): ``enable_linear_replayssm_spec`` and
``linear_replayssm_cache_len`` add ReplaySSM's ring buffers to every state slot's bytes, and the config's
``speculative_num_draft_tokens`` (the verify window) checks the ring length, or, without ReplaySSM, reserves
the intermediate states SGLang keeps per running request out of the budget, all by the planner's rule
(:func:`mamba_radix.capacity.resolve_pools`). Seed 001's Kimi K3 settings (fp8 KV, bf16 SSM, rings L=16, 8
verify tokens, ratio 0.15, 28.76 GiB) buy 81 slots, as ``plan`` prints, not the 138 they buy without rings.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from mamba_radix.config import CacheConfig
from mamba_radix.defaults import Deployment, deployment_for
from mamba_radix.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.capacity import SizingInputs

__all__ = [
    "KIMI_K3_PER_RANK_BUDGET_GIB",
    "MAX_SIM_KV_TOKENS",
    "MAX_SIM_STATE_SLOTS",
    "ModelBytes",
    "PoolSizes",
    "check_sim_memory",
    "exact_pools",
    "infinite_pools",
    "model_bytes",
    "pools_for_budget",
    "pools_for_run",
    "request_rows",
    "sizing_inputs",
    "unified_pools",
    "unified_pools_for_budget",
]

# Kimi K3 at TP8 on one rank, as in the seeds: 974,656 bf16 MLA tokens (25.10 GiB) + 80 bf16 state
# slots (2.16 GiB) = 27.26 GiB of KV + state memory left after weights.
KIMI_K3_PER_RANK_BUDGET_GIB = deployment_for("kimi-k3").memory_budget_gib
# the default model's deployment, by name (callers that size pools the simulator's way)
DEFAULT_TP_SIZE = deployment_for("kimi-k3").tp_size
DEFAULT_KV_CACHE_DTYPE = deployment_for("kimi-k3").kv_cache_dtype
DEFAULT_MAMBA_SSM_DTYPE = deployment_for("kimi-k3").mamba_ssm_dtype
DEFAULT_MAMBA_CONV_DTYPE = deployment_for("kimi-k3").mamba_conv_dtype
# What one simulated run may allocate on the host: every KV token is an int64 in the allocator's free
# list, every request row a max_context_len int32 row. 2^28 tokens (2 GiB of free list) is ~300x the
# seeds' pool; past that a run is refused before it allocates anything (``--infinite`` sizes pools to
# the trace instead).
MAX_SIM_KV_TOKENS = 1 << 28
MAX_SIM_STATE_SLOTS = 1 << 22
# host memory one run's pools may take (GiB); MAMBA_RADIX_SIM_MEMORY_GIB raises it
DEFAULT_SIM_MEMORY_GIB = 16.0
GIB = 1 << 30


@dataclass(frozen=True)
class ModelBytes:
    """Bytes one KV token and one state slot take on one rank for a model."""

    model: str
    bytes_per_kv_token: int
    bytes_per_state_slot: int


@dataclass(frozen=True)
class PoolSizes:
    """What a budget buys: pool sizes for the simulator plus the bytes behind them (for metrics)."""

    kv_tokens: int
    state_slots: int
    max_running_requests: int
    budget_gib: float
    mamba_full_memory_ratio: float
    bytes_per_kv_token: int
    bytes_per_state_slot: int
    model: str
    # a quantized checkpoint format (CacheConfig.checkpoint_format): the checkpoint pool the budget's state
    # bytes leave beside ``state_slots`` working slots, and one checkpoint's bytes; None for "model"
    checkpoint_slots: int | None = None
    bytes_per_checkpoint_slot: int | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def allocator_kv_tokens(self, page_size: int) -> int:
        """The KV allocator's size at ``page_size``: whole pages only, so a paged capacity rounds down to
        a page multiple (at least one page). O(1)."""
        if page_size == 1:
            return self.kv_tokens
        return max(self.kv_tokens // page_size, 1) * page_size


def request_rows(config: CacheConfig, state_slots: int, cap: int | None) -> tuple[int, str]:
    """How many requests may run at once on ``state_slots`` slots: the slots' bound
    (``config.max_running_requests``), lowered to ``cap`` (``max_running_requests``, None: no cap) when
    that is smaller; with which bound binds (``"state_slots"`` or ``"req_rows"``, an admission's refusal
    reason). O(1)."""
    rows = config.max_running_requests(state_slots)
    if cap is not None and cap < rows:
        return cap, "req_rows"
    return rows, "state_slots"


def sizing_inputs(
    config: CacheConfig,
    model: str,
    budget_gib: float | None,
    mamba_full_memory_ratio: float,
    max_mamba_cache_size: int | None = None,
    deployment: Deployment | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> SizingInputs:
    """The planner's inputs (:class:`mamba_radix.capacity.SizingInputs`) for ``model`` at
    ``deployment`` (default: the model's, :func:`mamba_radix.defaults.deployment_for`): what
    :func:`pools_for_budget` sizes, for a caller that plans the same deployment. The ReplaySSM settings
    (SGLang's flag names) and ``config.speculative_num_draft_tokens`` go to the planner as they are: sizing
    only, speculative decoding is not simulated. No side effects; raises :class:`ConfigError` as
    :class:`~mamba_radix.capacity.SizingInputs` does (a ring length that is not an integer, ...)."""
    from mamba_radix.capacity import MemoryBudget, Parallelism, SizingInputs, load_model

    deployment = deployment or deployment_for(model)
    return SizingInputs(
        model=load_model(model),
        parallelism=Parallelism(tp_size=deployment.tp_size),
        cache=config,
        kv_cache_dtype=deployment.kv_cache_dtype,
        mamba_ssm_dtype=deployment.mamba_ssm_dtype,
        mamba_conv_dtype=deployment.mamba_conv_dtype,
        enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        linear_replayssm_cache_len=linear_replayssm_cache_len,
        budget=None if budget_gib is None else MemoryBudget(budget_gib),
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        max_mamba_cache_size=max_mamba_cache_size,
    )


def model_bytes(
    model: str = "kimi-k3",
    deployment: Deployment | None = None,
    config: CacheConfig | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> ModelBytes:
    """Per-rank bytes of a model preset (or a model JSON file), at its deployment's TP and dtypes
    (:func:`mamba_radix.defaults.deployment_for`, the same defaults ``plan`` uses). With
    ``enable_linear_replayssm_spec`` a slot's bytes are the planner's (state plus ReplaySSM rings, the ring
    length checked against ``config``'s verify window; ``config`` default: ``CacheConfig()``). No side
    effects; raises :class:`ConfigError` for a bad model, TP size, dtype or ring length."""
    from mamba_radix.capacity import Parallelism, kv_token_bytes, load_model, resolve_pools, state_slot_bytes

    dep = deployment or deployment_for(model)
    if enable_linear_replayssm_spec:  # the planner's slot (rings included), sized for one request's slots
        cfg = config if config is not None else CacheConfig()
        res = resolve_pools(
            sizing_inputs(
                cfg,
                model,
                None,
                0.9,
                cfg.slots_per_request,
                dep,
                enable_linear_replayssm_spec=True,
                linear_replayssm_cache_len=linear_replayssm_cache_len,
            )
        )
        return ModelBytes(model, int(res.kv.bytes_per_token), int(res.bytes_per_slot))
    spec, par = load_model(model), Parallelism(tp_size=dep.tp_size)
    kv = kv_token_bytes(spec, par, dep.kv_cache_dtype)
    state = state_slot_bytes(spec, par, dep.mamba_ssm_dtype, dep.mamba_conv_dtype)
    return ModelBytes(model, int(kv.bytes_per_token), int(state.slot_bytes))


def _check_pool_limits(kv_tokens: int, state_slots: int, what: str) -> None:
    if kv_tokens > MAX_SIM_KV_TOKENS:
        raise ConfigError(
            f"{what} gives {kv_tokens:,} KV tokens, more than the simulator's limit of {MAX_SIM_KV_TOKENS:,}; "
            "lower it (or use infinite pools, sized to the trace)"
        )
    if state_slots > MAX_SIM_STATE_SLOTS:
        raise ConfigError(
            f"{what} gives {state_slots:,} state slots, more than the simulator's limit of "
            f"{MAX_SIM_STATE_SLOTS:,}; lower it"
        )


def pools_for_budget(
    config: CacheConfig,
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB,
    mamba_full_memory_ratio: float = 0.9,
    max_mamba_cache_size: int | None = None,
    model: str = "kimi-k3",
    deployment: Deployment | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> PoolSizes:
    """Split ``budget_gib`` between state slots and KV tokens as SGLang does (via
    :func:`mamba_radix.capacity.resolve_pools`), at ``deployment`` (default: the model's), with the
    speculative sizing inputs (module docstring: ReplaySSM rings per slot, or the intermediate states of
    ``config.speculative_num_draft_tokens``). No side effects.

    Raises :class:`ConfigError` when the budget buys no slot for a running request or no KV token, or
    more than the simulator can hold (:data:`MAX_SIM_KV_TOKENS`, :data:`MAX_SIM_STATE_SLOTS`).
    """
    from mamba_radix.capacity import resolve_pools
    from mamba_radix.capacity.formats import resolve_checkpoints

    if not (isinstance(budget_gib, (int, float)) and 0 < budget_gib < math.inf):
        raise ConfigError(f"budget_gib must be a finite number > 0 (GiB), got {budget_gib!r}")
    dep = deployment or deployment_for(model)
    mb = model_bytes(model, dep)
    # refuse before the planner sizes anything: a budget that buys more tokens than a run can hold
    rough_tokens = int(budget_gib * GIB / max(1, mb.bytes_per_kv_token))
    if rough_tokens > 4 * MAX_SIM_KV_TOKENS:
        _check_pool_limits(rough_tokens, 0, f"budget_gib {budget_gib:g}")
    res = resolve_pools(
        sizing_inputs(
            config,
            model,
            budget_gib,
            mamba_full_memory_ratio,
            max_mamba_cache_size,
            dep,
            enable_linear_replayssm_spec=enable_linear_replayssm_spec,
            linear_replayssm_cache_len=linear_replayssm_cache_len,
        )
    )
    # a quantized checkpoint format divides the same state bytes into working slots (model dtype) and
    # checkpoint slots, by the planner's rule; with checkpoint_slots None the cache's checkpoint pool gets
    # twice the working slots, which is what this split leaves it (capacity.formats.split_state_bytes)
    formats = resolve_checkpoints(res)
    slots, tokens = int(formats.working_slots), int(res.num_tokens or 0)
    running = config.max_running_requests(slots)
    if running < 1:
        raise ConfigError(
            f"{budget_gib} GiB at mamba_full_memory_ratio {mamba_full_memory_ratio} buys {slots} state slots, "
            f"fewer than the {config.slots_per_request} one running request reserves; raise the ratio or budget"
        )
    if tokens < 1:
        raise ConfigError(f"{budget_gib} GiB leaves no memory for KV tokens; lower max_mamba_cache_size")
    _check_pool_limits(tokens, slots, f"budget_gib {budget_gib:g}")
    return PoolSizes(
        kv_tokens=tokens,
        state_slots=slots,
        max_running_requests=running,
        budget_gib=budget_gib,
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        bytes_per_kv_token=int(res.kv.bytes_per_token),
        bytes_per_state_slot=int(res.bytes_per_slot),
        model=model,
        checkpoint_slots=formats.checkpoint_slots,
        bytes_per_checkpoint_slot=formats.checkpoint_slot_bytes if formats.separate_pool else None,
    )


def unified_pools_for_budget(
    config: CacheConfig,
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB,
    mamba_full_memory_ratio: float = 0.9,
    model: str = "kimi-k3",
    deployment: Deployment | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> tuple[PoolSizes, int]:
    """Pools for ``enable_unified_memory``: ``(sizes, shared_bytes)``. Both pools are sized physically
    for the whole budget (every byte may become KV tokens or state slots) and draw on ``shared_bytes``
    together (:class:`~mamba_radix.sim.capacity_limit.SharedByteBudget`); the ratio only fixes the
    start-up split, hence the running-request bound (:func:`pools_for_budget`'s), as in SGLang. No side
    effects. Raises :class:`ConfigError` as :func:`pools_for_budget` does, and when the budget cannot hold
    the slots one running request reserves next to one KV token."""
    split = pools_for_budget(
        config,
        budget_gib,
        mamba_full_memory_ratio,
        None,
        model,
        deployment,
        enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        linear_replayssm_cache_len=linear_replayssm_cache_len,
    )
    total = int(budget_gib * GIB)
    need = config.slots_per_request * split.bytes_per_state_slot + split.bytes_per_kv_token
    if total < need:
        raise ConfigError(
            f"{budget_gib:g} GiB cannot hold the {config.slots_per_request} state slots one running request "
            f"reserves and one KV token ({need:,} B); raise the budget"
        )
    tokens, slots = total // split.bytes_per_kv_token, total // split.bytes_per_state_slot
    _check_pool_limits(tokens, slots, f"budget_gib {budget_gib:g} (unified)")
    sizes = PoolSizes(
        kv_tokens=tokens,
        state_slots=slots,
        max_running_requests=split.max_running_requests,
        budget_gib=budget_gib,
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        bytes_per_kv_token=split.bytes_per_kv_token,
        bytes_per_state_slot=split.bytes_per_state_slot,
        model=model,
    )
    return sizes, total


def unified_pools(split: PoolSizes) -> tuple[PoolSizes, int]:
    """The engine's unified memory for a run sized ``split`` (any of this module's sizings):
    ``(physical, shared_bytes)``. ``shared_bytes`` is what the split's two pools take together
    (``kv_tokens * bytes_per_kv_token + state_slots * bytes_per_state_slot``: the bytes a static or an
    adaptive run of the same sizes has, so the three compare at equal bytes), ``physical`` both pools sized
    for all of it (every byte may become KV tokens or state slots). No side effects. Raises
    :class:`ConfigError` past the simulator's limits. O(1)."""
    total = split.kv_tokens * split.bytes_per_kv_token + split.state_slots * split.bytes_per_state_slot
    tokens, slots = total // split.bytes_per_kv_token, total // split.bytes_per_state_slot
    _check_pool_limits(tokens, slots, "the unified budget")
    return replace(split, kv_tokens=tokens, state_slots=slots), total


def exact_pools(
    config: CacheConfig,
    kv_tokens: int,
    state_slots: int,
    model: str = "kimi-k3",
    deployment: Deployment | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> PoolSizes:
    """Pools of exactly ``kv_tokens`` KV tokens and ``state_slots`` state slots (no budget split); the
    budget and ratio recorded are what they take at the model's bytes (:func:`model_bytes`, rings
    included when on). No side effects.

    Raises :class:`ConfigError` for sizes below 1, not integers, or beyond the simulator's limits, and
    when the slots admit no running request."""
    for name, value in (("kv_tokens", kv_tokens), ("state_slots", state_slots)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    _check_pool_limits(kv_tokens, state_slots, f"kv_tokens {kv_tokens:,} / state_slots {state_slots:,}")
    running = config.max_running_requests(state_slots)
    if running < 1:
        raise ConfigError(
            f"state_slots {state_slots} admit no running request ({config.slots_per_request} per request "
            f"with strategy {config.strategy}); give at least {config.slots_per_request}"
        )
    mb = model_bytes(
        model,
        deployment,
        config,
        enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        linear_replayssm_cache_len=linear_replayssm_cache_len,
    )
    kv_bytes, state_bytes = kv_tokens * mb.bytes_per_kv_token, state_slots * mb.bytes_per_state_slot
    return PoolSizes(
        kv_tokens=kv_tokens,
        state_slots=state_slots,
        max_running_requests=running,
        budget_gib=(kv_bytes + state_bytes) / GIB,
        mamba_full_memory_ratio=state_bytes / kv_bytes,
        bytes_per_kv_token=mb.bytes_per_kv_token,
        bytes_per_state_slot=mb.bytes_per_state_slot,
        model=model,
    )


def infinite_pools(
    config: CacheConfig,
    input_tokens: int,
    output_tokens: int,
    num_requests: int,
    model: str,
    deployment: Deployment | None = None,
    *,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> PoolSizes:
    """Pools no trace of this size can fill: every token and every checkpoint it could ever create
    (bytes per slot as :func:`model_bytes`). No side effects. O(1)."""
    mb = model_bytes(
        model,
        deployment,
        config,
        enable_linear_replayssm_spec=enable_linear_replayssm_spec,
        linear_replayssm_cache_len=linear_replayssm_cache_len,
    )
    interval = max(1, config.mamba_track_interval)
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else 1 << 30
    checkpoints = num_requests * 3 + input_tokens // min(chunk, 64) + output_tokens // interval
    running = 256
    slots = checkpoints + running * config.slots_per_request
    return PoolSizes(
        kv_tokens=input_tokens + output_tokens + 1,
        state_slots=slots,
        max_running_requests=config.max_running_requests(slots),
        budget_gib=float("inf"),
        mamba_full_memory_ratio=float("nan"),
        bytes_per_kv_token=mb.bytes_per_kv_token,
        bytes_per_state_slot=mb.bytes_per_state_slot,
        model=model,
    )


def pools_for_run(
    config: CacheConfig,
    *,
    model: str,
    deployment: Deployment | None = None,
    infinite: bool = False,
    kv_tokens: int | None = None,
    state_slots: int | None = None,
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB,
    mamba_full_memory_ratio: float = 0.9,
    max_mamba_cache_size: int | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    num_requests: int = 0,
    enable_linear_replayssm_spec: bool = False,
    linear_replayssm_cache_len: int = 16,
) -> PoolSizes:
    """The pools of a run: :func:`infinite_pools` (sized to the trace's ``input_tokens``,
    ``output_tokens`` and ``num_requests``), :func:`exact_pools` (``kv_tokens`` and ``state_slots``)
    or :func:`pools_for_budget`, each with the ReplaySSM sizing inputs (module docstring). No side
    effects; raises :class:`ConfigError` as those do."""
    rings = {
        "enable_linear_replayssm_spec": enable_linear_replayssm_spec,
        "linear_replayssm_cache_len": linear_replayssm_cache_len,
    }
    if infinite:
        return infinite_pools(config, input_tokens, output_tokens, num_requests, model, deployment, **rings)
    if kv_tokens is not None and state_slots is not None:
        return exact_pools(config, kv_tokens, state_slots, model, deployment, **rings)
    return pools_for_budget(
        config, budget_gib, mamba_full_memory_ratio, max_mamba_cache_size, model, deployment, **rings
    )


def sim_memory_bytes(
    pools: PoolSizes, config: CacheConfig, max_context_len: int, max_rows: int | None
) -> int:
    """Host bytes the simulator's pools take for one run, roughly: the KV free list (8 B per token) and
    the request table (rows x (max_context_len + 1) int32). O(1)."""
    rows = request_rows(config, pools.state_slots, max_rows)[0]
    return 8 * pools.kv_tokens + 4 * rows * (max_context_len + 1)


def check_sim_memory(
    pools: PoolSizes, config: CacheConfig, max_context_len: int, max_rows: int | None = None
) -> None:
    """Refuse (:class:`ConfigError`) a run whose pools would take more host memory than
    ``MAMBA_RADIX_SIM_MEMORY_GIB`` (default 16 GiB), before anything is allocated. O(1)."""
    limit_gib = float(os.environ.get("MAMBA_RADIX_SIM_MEMORY_GIB", DEFAULT_SIM_MEMORY_GIB))
    need = sim_memory_bytes(pools, config, max_context_len, max_rows)
    if need > limit_gib * GIB:
        rows = config.max_running_requests(pools.state_slots)
        raise ConfigError(
            f"this run's pools would take {need / GIB:,.1f} GiB of host memory ({pools.kv_tokens:,} KV tokens, "
            f"{rows:,} request rows x {max_context_len + 1:,} tokens), more than the {limit_gib:g} GiB limit; "
            "lower the budget, max_running_requests or the trace's longest request "
            "(or raise MAMBA_RADIX_SIM_MEMORY_GIB)"
        )
