"""From a per-rank memory budget to pool sizes: (KV tokens, state slots), the way SGLang sizes them.

The simulator's only contact with the byte math: :func:`pools_for_budget` and :func:`model_bytes` call
:mod:`mamba_radix.capacity` (model presets, bytes per KV token and per state slot, SGLang's
``_handle_max_mamba_cache`` ratio rule: ``r / (1 + r)`` of the budget goes to state slots unless
``--max-mamba-cache-size`` fixes them, the KV pool gets the rest). Everything else (the engine, sweeps,
the CLI) only sees the resulting :class:`PoolSizes`.

Defaults are the seeds' Kimi K3 deployment, one rank of TP8 with a bf16 MLA KV cache and bf16 KDA states
(``--mamba-ssm-dtype bfloat16``): 27,648 B per KV token, 29,039,616 B per state slot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError

__all__ = ["KIMI_K3_PER_RANK_BUDGET_GIB", "ModelBytes", "PoolSizes", "model_bytes", "pools_for_budget"]

# Kimi K3 at TP8 on one rank, as in the seeds: 974,656 bf16 MLA tokens (25.10 GiB) + 80 bf16 state
# slots (2.16 GiB) = 27.26 GiB of KV + state memory left after weights.
KIMI_K3_PER_RANK_BUDGET_GIB = 27.25
DEFAULT_TP_SIZE = 8
DEFAULT_KV_CACHE_DTYPE = "bfloat16"
DEFAULT_MAMBA_SSM_DTYPE = "bfloat16"
DEFAULT_MAMBA_CONV_DTYPE = "bfloat16"


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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _sizing_inputs(
    config: CacheConfig,
    model: str,
    budget_gib: float | None,
    mamba_full_memory_ratio: float,
    max_mamba_cache_size: int | None,
) -> object:
    from mamba_radix.capacity import MemoryBudget, Parallelism, SizingInputs, load_model

    return SizingInputs(
        model=load_model(model),
        parallelism=Parallelism(tp_size=DEFAULT_TP_SIZE),
        cache=config,
        kv_cache_dtype=DEFAULT_KV_CACHE_DTYPE,
        mamba_ssm_dtype=DEFAULT_MAMBA_SSM_DTYPE,
        mamba_conv_dtype=DEFAULT_MAMBA_CONV_DTYPE,
        budget=None if budget_gib is None else MemoryBudget(budget_gib),
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        max_mamba_cache_size=max_mamba_cache_size,
    )


def model_bytes(model: str = "kimi-k3") -> ModelBytes:
    """Per-rank bytes of a model preset (or a model JSON file), at the default TP and dtypes."""
    from mamba_radix.capacity import Parallelism, kv_token_bytes, load_model, state_slot_bytes

    spec, par = load_model(model), Parallelism(tp_size=DEFAULT_TP_SIZE)
    kv = kv_token_bytes(spec, par, DEFAULT_KV_CACHE_DTYPE)
    state = state_slot_bytes(spec, par, DEFAULT_MAMBA_SSM_DTYPE, DEFAULT_MAMBA_CONV_DTYPE)
    return ModelBytes(model, int(kv.bytes_per_token), int(state.slot_bytes))


def pools_for_budget(
    config: CacheConfig,
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB,
    mamba_full_memory_ratio: float = 0.9,
    max_mamba_cache_size: int | None = None,
    model: str = "kimi-k3",
) -> PoolSizes:
    """Split ``budget_gib`` between state slots and KV tokens as SGLang does (via
    :func:`mamba_radix.capacity.resolve_pools`). No side effects.

    Raises :class:`ConfigError` when the budget buys no slot for a running request or no KV token.
    """
    from mamba_radix.capacity import resolve_pools

    if not budget_gib > 0:
        raise ConfigError(f"--memory-budget-gb must be > 0 (GiB), got {budget_gib}")
    res = resolve_pools(
        _sizing_inputs(config, model, budget_gib, mamba_full_memory_ratio, max_mamba_cache_size)  # type: ignore[arg-type]
    )
    slots, tokens = int(res.num_slots), int(res.num_tokens or 0)
    running = config.max_running_requests(slots)
    if running < 1:
        raise ConfigError(
            f"{budget_gib} GiB at --mamba-full-memory-ratio {mamba_full_memory_ratio} buys {slots} state slots, "
            f"fewer than the {config.slots_per_request} one running request reserves; raise the ratio or budget"
        )
    if tokens < 1:
        raise ConfigError(f"{budget_gib} GiB leaves no memory for KV tokens; lower --max-mamba-cache-size")
    return PoolSizes(
        kv_tokens=tokens,
        state_slots=slots,
        max_running_requests=running,
        budget_gib=budget_gib,
        mamba_full_memory_ratio=mamba_full_memory_ratio,
        bytes_per_kv_token=int(res.kv.bytes_per_token),
        bytes_per_state_slot=int(res.bytes_per_slot),
        model=model,
    )
