"""Checkpoint formats at equal bytes: how a state budget divides into working slots and checkpoint slots.

With ``checkpoint_format="model"`` (today's cache) one pool holds both the running requests' states and the
tree's checkpoints, every slot in the model's dtype. With ``int8`` or ``fp8_e4m3`` (``CacheConfig.
checkpoint_format``) a running request's states stay in the model's dtype in the state pool (the *working*
slots: live state, track buffers, ReplaySSM rings) and the tree's checkpoints live quantized in their own
pool (the *checkpoint* slots, ``CacheConfig.checkpoint_slots``). At equal bytes the state budget SGLang's
ratio gives (``max_mamba_cache_size x bytes_per_slot``) is split between the two, and the KV pool is
untouched:

- ``checkpoint_slots`` given: the working slots take what it leaves, ``W = (B - C x c) // w``;
- ``working_slots`` given (the planner's recommendation: running requests x slots per request): the
  checkpoints take the rest, ``C = (B - W x w) // c``;
- neither: SGLang's default proportion, ``C = 2 W`` (``--int8-mamba-ckpt-size`` defaults to twice the
  active pool), at equal bytes: ``W = B // (w + 2 c)``.

``w`` is :attr:`PoolResolution.bytes_per_slot` (conv + temporal + rings, model dtype), ``c`` is
:func:`mamba_radix.checkpoint_format.bytes_per_slot` of the conv and temporal tensors (a checkpoint has no
rings; for ``model`` a checkpoint *is* a pool slot, ``c = w``).

SGLang's own sizing differs (``mem_cache/mamba_checkpoint_pool.py``): its int8 pool is *added* to the active
pool, ``int8_mamba_ckpt_size`` or ``2 x max_mamba_cache_size`` slots (plus the padding slot) of int8 SSM
state, one scale per (head, k-channel) in the SSM dtype and the conv window at its own dtype, taken from the
``--mem-fraction-static`` headroom and not subtracted from the KV budget. :func:`sglang_int8_pool` gives those
bytes (the "sglang" view); SGLang has no fp8 checkpoint pool (#40706 is open).

Pure functions on integers; ``torch`` is imported only to name dtypes for
:func:`~mamba_radix.checkpoint_format.bytes_per_slot` (on the first call, not on import).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mamba_radix.capacity.memory import CONV_DTYPES, SSM_DTYPES, StateSlotBytes
from mamba_radix.capacity.sizing import PoolResolution, check_checkpoint_format
from mamba_radix.errors import ConfigError

__all__ = [
    "CHECKPOINT_FORMAT_NAMES",
    "DEFAULT_CHECKPOINT_SLOTS_PER_WORKING_SLOT",
    "FormatSizing",
    "SglangInt8Pool",
    "check_checkpoint_format",
    "checkpoint_slot_bytes",
    "resolve_checkpoints",
    "sglang_int8_pool",
    "split_state_bytes",
]

try:  # the config's list (one rule, no torch); written out while the config has no checkpoint fields
    from mamba_radix.config import CHECKPOINT_FORMATS as CHECKPOINT_FORMAT_NAMES
except ImportError:  # pragma: no cover - a checkout without CacheConfig.checkpoint_format
    CHECKPOINT_FORMAT_NAMES = ("model", "int8", "fp8_e4m3")
# SGLang's default ``--int8-mamba-ckpt-size``: twice the active pool's slots
DEFAULT_CHECKPOINT_SLOTS_PER_WORKING_SLOT = 2
_TORCH_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def checkpoint_slot_bytes(state: StateSlotBytes, fmt: str, working_slot_bytes: int | None = None) -> int:
    """Bytes one checkpoint takes in format ``fmt``: ``model``: a pool slot (``working_slot_bytes`` when
    given, rings included, else ``state.slot_bytes``); ``int8``/``fp8_e4m3``:
    :func:`mamba_radix.checkpoint_format.bytes_per_slot` of the conv ``[*conv_shape]`` and temporal
    ``[*temporal_shape]`` tensors of every linear layer. O(1)."""
    if fmt == "model":  # needs no check, so no torch import
        return state.slot_bytes if working_slot_bytes is None else working_slot_bytes
    fmt = check_checkpoint_format(fmt)
    import torch

    from mamba_radix.checkpoint_format import bytes_per_slot

    shapes = [
        (state.conv_shape, getattr(torch, _TORCH_DTYPE_NAMES[state.conv_dtype])),
        (state.temporal_shape, getattr(torch, _TORCH_DTYPE_NAMES[state.ssm_dtype])),
    ]
    return bytes_per_slot(fmt, state.num_linear_layers, shapes)


def split_state_bytes(
    state_bytes: int,
    working_slot_bytes: int,
    checkpoint_slot_bytes: int,
    *,
    working_slots: int | None = None,
    checkpoint_slots: int | None = None,
) -> tuple[int, int]:
    """``(working slots, checkpoint slots)`` that ``state_bytes`` buys (module docstring's three rules).
    Raises :class:`ConfigError` when the fixed side alone exceeds the bytes, or both are fixed. O(1)."""
    b, w, c = state_bytes, working_slot_bytes, checkpoint_slot_bytes
    for name, value in (("state_bytes", b), ("working_slot_bytes", w), ("checkpoint_slot_bytes", c)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (0 if name == "state_bytes" else 1)
        ):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if working_slots is not None and checkpoint_slots is not None:
        raise ConfigError("give working_slots or checkpoint_slots, not both: the other takes the rest")
    if checkpoint_slots is not None:
        if checkpoint_slots * c > b:
            raise ConfigError(
                f"checkpoint_slots={checkpoint_slots} take {checkpoint_slots * c:,} B, more than the "
                f"{b:,} B state budget; lower checkpoint_slots or raise the memory ratio"
            )
        return (b - checkpoint_slots * c) // w, checkpoint_slots
    if working_slots is not None:
        if working_slots * w > b:
            raise ConfigError(
                f"{working_slots} working slots take {working_slots * w:,} B, more than the {b:,} B state "
                "budget; lower the concurrency or raise the memory ratio"
            )
        return working_slots, (b - working_slots * w) // c
    k = DEFAULT_CHECKPOINT_SLOTS_PER_WORKING_SLOT
    working = b // (w + k * c)
    return working, k * working


@dataclass(frozen=True)
class SglangInt8Pool:
    """SGLang's int8 checkpoint pool for the same deployment (``estimate_mem_usage_bytes``): ``slots``
    usable (one more allocated), int8 SSM ``qdata``, per-(head, k-channel) ``scale`` in the SSM dtype, conv
    windows at their dtype; all of it *beyond* the KV + state budget."""

    slots: int
    qdata_bytes: int
    scale_bytes: int
    conv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.qdata_bytes + self.scale_bytes + self.conv_bytes

    @property
    def bytes_per_slot(self) -> int:
        return self.total_bytes // (self.slots + 1)


def sglang_int8_pool(
    state: StateSlotBytes, active_slots: int, ckpt_size: int | None = None
) -> SglangInt8Pool:
    """The int8 pool SGLang allocates next to an active pool of ``active_slots`` (``ckpt_size``:
    ``--int8-mamba-ckpt-size``, default twice the active pool). Needs a ``[H, d_v, d_k]`` temporal state
    (KDA / GDN). O(1)."""
    if len(state.temporal_shape) != 3:
        raise ConfigError(
            f"SGLang's int8 checkpoint pool needs a [heads, d_v, d_k] temporal state, got {list(state.temporal_shape)}"
        )
    slots = ckpt_size if ckpt_size is not None else DEFAULT_CHECKPOINT_SLOTS_PER_WORKING_SLOT * active_slots
    allocated = slots + 1  # slot 0 reserved, as in its MambaSlotAllocator
    heads, d_v, d_k = state.temporal_shape
    layers = state.num_linear_layers
    conv_numel = 1
    for d in state.conv_shape:
        conv_numel *= d
    return SglangInt8Pool(
        slots=slots,
        qdata_bytes=layers * allocated * heads * d_v * d_k,
        scale_bytes=layers * allocated * heads * d_k * SSM_DTYPES[state.ssm_dtype],
        conv_bytes=layers * allocated * conv_numel * CONV_DTYPES[state.conv_dtype],
    )


@dataclass(frozen=True)
class FormatSizing:
    """A resolved deployment's state budget under a checkpoint format, at equal bytes (module docstring).

    ``working_slots`` hold the running requests' states (model dtype, rings included);
    ``checkpoint_slots`` the tree's checkpoints (``None`` for ``model``: they share the working pool).
    ``max_running_requests``/``binding``/``limits`` are SGLang's resolution with the state limit taken on
    the working slots. ``sglang``: SGLang's int8 pool for the same deployment (int8 only), None otherwise.
    """

    fmt: str
    state_bytes: int
    working_slot_bytes: int
    checkpoint_slot_bytes: int
    working_slots: int
    checkpoint_slots: int | None
    slots_per_request: int
    max_running_requests: int
    binding: str
    limits: dict[str, int]
    sglang: SglangInt8Pool | None

    @property
    def separate_pool(self) -> bool:
        return self.checkpoint_slots is not None

    @property
    def checkpoint_pool_bytes(self) -> int:
        return 0 if self.checkpoint_slots is None else self.checkpoint_slots * self.checkpoint_slot_bytes

    @property
    def working_pool_bytes(self) -> int:
        return self.working_slots * self.working_slot_bytes

    def cached_prefixes(self, running: int) -> int:
        """Checkpoints the tree can hold while ``running`` requests hold their working slots. O(1)."""
        if self.checkpoint_slots is not None:
            return self.checkpoint_slots
        return max(0, self.working_slots - running * self.slots_per_request)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_format": self.fmt,
            "state_bytes": self.state_bytes,
            "working_slot_bytes": self.working_slot_bytes,
            "checkpoint_slot_bytes": self.checkpoint_slot_bytes,
            "working_slots": self.working_slots,
            "checkpoint_slots": self.checkpoint_slots,
            "max_running_requests": self.max_running_requests,
            "binding": self.binding,
            "limits": dict(self.limits),
            "sglang_int8_pool": (
                None
                if self.sglang is None
                else {
                    "slots": self.sglang.slots,
                    "total_bytes": self.sglang.total_bytes,
                    "bytes_per_slot": self.sglang.bytes_per_slot,
                    "beyond_budget": True,
                }
            ),
        }


def resolve_checkpoints(
    resolution: PoolResolution,
    fmt: str | None = None,
    *,
    checkpoint_slots: int | None = None,
    working_slots: int | None = None,
) -> FormatSizing:
    """Divide ``resolution``'s state budget (``num_slots x bytes_per_slot``) under format ``fmt`` (default:
    the inputs' ``checkpoint_format``) at equal bytes; ``checkpoint_slots`` default: the inputs'. The KV
    pool and the other concurrency limits are ``resolution``'s. Raises :class:`ConfigError` for an unknown
    format, a split that leaves a running request fewer slots than it reserves, or a fixed side larger
    than the budget. O(1)."""
    if not isinstance(resolution, PoolResolution):
        raise ConfigError(f"resolution must be a PoolResolution, got {type(resolution).__name__}")
    inputs = resolution.inputs
    fmt = inputs.checkpoint_format if fmt is None else fmt
    if fmt != "model":
        fmt = check_checkpoint_format(fmt)
    if checkpoint_slots is None and working_slots is None:
        checkpoint_slots = inputs.checkpoint_slots
    w = resolution.bytes_per_slot
    c = checkpoint_slot_bytes(resolution.state, fmt, w)
    budget = resolution.num_slots * w
    spr = resolution.slots_per_request
    sglang = (
        sglang_int8_pool(resolution.state, resolution.num_slots, checkpoint_slots) if fmt == "int8" else None
    )
    if fmt == "model":
        if checkpoint_slots is not None:
            raise ConfigError(
                "checkpoint_slots sizes a quantized checkpoint pool; give checkpoint_format int8 or "
                "fp8_e4m3, or drop checkpoint_slots"
            )
        working, ckpts = resolution.num_slots, None
    else:
        working, ckpts = split_state_bytes(
            budget, w, c, working_slots=working_slots, checkpoint_slots=checkpoint_slots
        )
    if working < spr:
        raise ConfigError(
            f"checkpoint_format={fmt!r} leaves {working} working state slots, fewer than the {spr} one running "
            "request reserves; lower checkpoint_slots or raise the memory ratio"
        )
    limits = dict(resolution.limits)
    limits["mamba state cache"] = working // spr
    others = {k: v for k, v in limits.items() if k != "mamba state cache"}
    if not others or limits["mamba state cache"] < min(others.values()):
        binding = "mamba state cache"
    else:
        binding = min(others, key=lambda k: others[k])
    return FormatSizing(
        fmt=fmt,
        state_bytes=budget,
        working_slot_bytes=w,
        checkpoint_slot_bytes=c,
        working_slots=working,
        checkpoint_slots=ckpts,
        slots_per_request=spr,
        max_running_requests=limits[binding],
        binding=binding,
        limits=limits,
        sglang=sglang,
    )
