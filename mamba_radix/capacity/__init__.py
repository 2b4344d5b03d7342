"""Capacity planner: how to split a GPU's memory between full-attention KV and recurrent-state slots.

- :mod:`~mamba_radix.capacity.models`: model specs and presets (``kimi-k3``, ``qwen3-next-80b-a3b``);
- :mod:`~mamba_radix.capacity.memory`: bytes per KV token, per state slot, per ReplaySSM ring;
- :mod:`~mamba_radix.capacity.sizing`: SGLang's resolution of slots, tokens and ``max_running_requests``;
- :mod:`~mamba_radix.capacity.planner`: workload-aware checkpoints, balanced ratio, TP versus DCP;
- :mod:`~mamba_radix.capacity.official`: SGLang's official ratio calculator and the steps to the planner's;
- :mod:`~mamba_radix.capacity.formats`: checkpoint formats at equal bytes (working and checkpoint slots);
- :mod:`~mamba_radix.capacity.unified`: unified memory's start-up budget against a workload's peak;
- :mod:`~mamba_radix.capacity.options`: static, adaptive and unified, x checkpoint format, at equal bytes;
- :mod:`~mamba_radix.capacity.host`: the host tier's sizing (SGLang's ratio split, the planner's split by the workload's resumable points and checkpoints);
- :mod:`~mamba_radix.capacity.cli`: the ``plan`` subcommand.
"""

from __future__ import annotations

from mamba_radix.capacity.formats import FormatSizing, resolve_checkpoints
from mamba_radix.capacity.memory import (
    GIB,
    KIB,
    MIB,
    KVTokenBytes,
    Parallelism,
    ReplayRingBytes,
    StateSlotBytes,
    check_ring_len,
    kv_pool_bytes,
    kv_token_bytes,
    replay_ring_bytes,
    state_slot_bytes,
)
from mamba_radix.capacity.models import (
    PRESETS,
    GQAAttention,
    LinearAttention,
    Mamba2Mixer,
    MLAAttention,
    ModelSpec,
    load_model,
    model_from_dict,
)
from mamba_radix.capacity.official import Comparison, OfficialAnswer, official_answer, official_ratio
from mamba_radix.capacity.options import MemoryComparison, MemoryOption, compare_memory_options
from mamba_radix.capacity.planner import (
    Balance,
    CheckpointCount,
    DcpOption,
    Plan,
    RequestShape,
    Workload,
    WorkloadCheckpoints,
    balance,
    compare_dcp,
    decode_checkpoint_positions,
    decode_slots_in_use,
    expected_checkpoints,
    expected_workload_checkpoints,
    plan,
    prefill_checkpoint_positions,
)
from mamba_radix.capacity.sizing import (
    MemoryBudget,
    PoolResolution,
    SizingInputs,
    capped_message,
    resolve_pools,
)
from mamba_radix.capacity.unified import UnifiedPlan, unified_plan

__all__ = [
    "GIB",
    "KIB",
    "MIB",
    "PRESETS",
    "Balance",
    "CheckpointCount",
    "Comparison",
    "DcpOption",
    "FormatSizing",
    "GQAAttention",
    "KVTokenBytes",
    "LinearAttention",
    "MLAAttention",
    "Mamba2Mixer",
    "MemoryBudget",
    "MemoryComparison",
    "MemoryOption",
    "ModelSpec",
    "OfficialAnswer",
    "Parallelism",
    "Plan",
    "PoolResolution",
    "ReplayRingBytes",
    "RequestShape",
    "SizingInputs",
    "StateSlotBytes",
    "UnifiedPlan",
    "Workload",
    "WorkloadCheckpoints",
    "balance",
    "capped_message",
    "check_ring_len",
    "compare_dcp",
    "compare_memory_options",
    "decode_checkpoint_positions",
    "decode_slots_in_use",
    "expected_checkpoints",
    "expected_workload_checkpoints",
    "kv_pool_bytes",
    "kv_token_bytes",
    "load_model",
    "model_from_dict",
    "official_answer",
    "official_ratio",
    "plan",
    "prefill_checkpoint_positions",
    "replay_ring_bytes",
    "resolve_checkpoints",
    "resolve_pools",
    "state_slot_bytes",
    "unified_plan",
]
