"""Checkpoint storage formats of the state pool: names, bytes per slot, and the quantize / dequantize entry
points (validated, then dispatched like :mod:`mamba_radix.state_ops`).

A running request's live state stays in the model's dtype. A checkpoint handed to the tree may be stored
in a compact format and is restored into a live slot in the model's dtype:

============  ===========================================  ==========================================
format        storage per pool tensor                       restore error (per element)
============  ===========================================  ==========================================
``model``     the pool tensor's own dtype (no quantization)  none (a bit copy, :mod:`.state_ops`)
``int8``      int8 + one fp32 scale per row (absmax / 127)   <= absmax(row) / 254
``fp8_e4m3``  float8_e4m3fn + one fp32 scale (absmax / 448)  <= 2^-4 relative (3 mantissa bits)
============  ===========================================  ==========================================

The arithmetic, the row layout and error feedback are specified in :mod:`mamba_radix_kernels.quant_naive`.
Dispatch: CUDA tensors -> the Triton kernels (:mod:`mamba_radix_kernels.triton_quant`), anything else ->
the torch reference; ``backend=`` per call, or the process default of :func:`state_ops.get_backend`.
Bad arguments raise :class:`~mamba_radix.errors.InvalidArgument` before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from mamba_radix_kernels import quant_naive

from mamba_radix import state_ops
from mamba_radix.config import CHECKPOINT_FORMATS
from mamba_radix.errors import InvalidArgument, check_count

__all__ = [
    "CHECKPOINT_FORMATS",
    "CheckpointStore",
    "bytes_per_slot",
    "check_format",
    "dequantize_slots",
    "new_checkpoint_store",
    "quantize_slots",
    "storage_dtype",
]

_QDTYPE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
_SCALE_BYTES = 4  # one fp32 scale per row


def check_format(name: object) -> str:
    """Return ``name`` if it is a checkpoint format; else raise a one-line :class:`InvalidArgument`."""
    if not isinstance(name, str) or name not in CHECKPOINT_FORMATS:
        raise InvalidArgument(
            f"unknown checkpoint format {name!r}; use one of {', '.join(CHECKPOINT_FORMATS)}"
        )
    return name


def storage_dtype(fmt: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element dtype a checkpoint of format ``fmt`` is stored in (``model``: ``model_dtype``)."""
    check_format(fmt)
    return model_dtype if fmt == "model" else _QDTYPE[fmt]


def bytes_per_slot(
    fmt: str,
    num_layers: int,
    state_shapes: Sequence[tuple[Sequence[int], torch.dtype]],
    row_lens: Sequence[int] | None = None,
) -> int:
    """Bytes one checkpoint slot takes in format ``fmt``, over all layers of the pool tensors described by
    ``state_shapes`` (``[(inner_shape, model_dtype), ...]``, e.g. the conv tensors then the temporal one).

    ``model``: ``layers * sum(numel * itemsize)``; ``int8``/``fp8_e4m3``: ``layers * sum(numel + 4 *
    numel / row_len)`` with the default rows (:func:`~mamba_radix_kernels.quant_naive.row_len_for`) unless
    ``row_lens`` are given. Slots at equal bytes: ``budget // bytes_per_slot(fmt, ...)``. Pure, O(tensors).
    """
    check_format(fmt)
    check_count(num_layers, "num_layers")
    if row_lens is not None and len(row_lens) != len(state_shapes):
        raise InvalidArgument(f"row_lens has {len(row_lens)} entries for {len(state_shapes)} state tensors")
    total = 0
    for j, (shape, dtype) in enumerate(state_shapes):
        numel = math.prod(int(d) for d in shape)
        if fmt == "model":
            total += numel * torch.empty((), dtype=dtype).element_size()
            continue
        row = quant_naive.row_len_for(shape) if row_lens is None else int(row_lens[j])
        if row < 1 or numel % row:
            raise InvalidArgument(
                f"row length {row} does not divide the {numel} elements of state tensor {j}"
            )
        total += numel + _SCALE_BYTES * (numel // row)
    return num_layers * total


@dataclass(frozen=True)
class CheckpointStore:
    """Quantized checkpoint storage for a pool: per pool tensor ``qs[j]`` ``[L, num_slots, rows, row_len]``
    and ``scales[j]`` ``[L, num_slots, rows]`` fp32 (see :mod:`mamba_radix_kernels.quant_naive`)."""

    fmt: str
    qs: tuple[torch.Tensor, ...]
    scales: tuple[torch.Tensor, ...]

    @property
    def num_slots(self) -> int:
        return self.qs[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.qs, *self.scales))


def new_checkpoint_store(
    fmt: str, pool: Sequence[torch.Tensor], num_slots: int, row_lens: Sequence[int] | None = None
) -> CheckpointStore:
    """Zeroed storage for ``num_slots`` checkpoints of the pool tensors ``pool`` in format ``fmt``
    (``int8`` or ``fp8_e4m3``; ``model`` checkpoints live in the pool itself). Allocates on the pool's device."""
    check_format(fmt)
    if fmt == "model":
        raise InvalidArgument("format 'model' stores checkpoints in the pool's own slots; no store to build")
    check_count(num_slots, "num_slots")
    qs, scales = [], []
    for j, x in enumerate(pool):
        inner = x.shape[2:]
        numel = math.prod(inner)
        row = quant_naive.row_len_for(inner) if row_lens is None else int(row_lens[j])
        if row < 1 or numel % row:
            raise InvalidArgument(f"row length {row} does not divide the {numel} elements of pool[{j}]")
        shape = (x.shape[0], num_slots, numel // row, row)
        qs.append(torch.zeros(shape, dtype=_QDTYPE[fmt], device=x.device))
        scales.append(torch.zeros(shape[:3], dtype=torch.float32, device=x.device))
    return CheckpointStore(fmt, tuple(qs), tuple(scales))


# ------------------------------------------------------------------------------------------- dispatch


def _use_triton(device: torch.device, backend: str | None) -> bool:
    name = backend if backend is not None else state_ops.get_backend()
    if name not in ("auto", "torch", "triton"):
        raise InvalidArgument(f"backend={name!r} is not a backend; use one of auto, torch, triton")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return False
    from mamba_radix_kernels import slot_move

    if slot_move.triton_usable(device):
        return True
    if name == "auto":
        return False
    raise InvalidArgument(
        f"backend='triton' cannot run on {device} tensors; use CUDA tensors, set TRITON_INTERPRET=1 before "
        "the kernels are first imported, or use backend='torch'"
    )


def _index(x: object, name: str) -> torch.Tensor:
    if isinstance(x, (list, tuple)):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in x):
            raise InvalidArgument(f"{name} must hold int slot indices, got {list(x)!r}")
        return torch.tensor(list(x), dtype=torch.int64)
    if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool or x.dim() > 1:
        raise InvalidArgument(f"{name} must be a 1-D integer tensor (or list) of slot indices")
    return x.to(torch.int64)


def _check_indices(values: list[int], name: str, num_slots: int, unique: bool) -> None:
    seen: set[int] = set()
    for i, v in enumerate(values):
        if not 0 <= v < num_slots:
            raise InvalidArgument(f"{name}[{i}] = {v} is outside slots 0..{num_slots - 1}")
        if unique and v in seen:
            raise InvalidArgument(f"{name} repeats slot {v}; each slot may be written once per call")
        seen.add(v)


def quantize_slots(
    pool: Sequence[torch.Tensor],
    slots: torch.Tensor | Sequence[int],
    store: CheckpointStore,
    store_slots: torch.Tensor | Sequence[int],
    *,
    residuals: Sequence[torch.Tensor] | None = None,
    check: bool = True,
    backend: str | None = None,
) -> None:
    """Hand-over: quantize pool slots ``slots`` into ``store`` slots ``store_slots`` (pairwise).

    ``residuals``: error feedback (fp32 tensors of the pool's shapes, indexed by pool slot; read and
    updated). Refused before anything is written: a bad layout, lengths differ, a slot out of range, a
    repeated store slot (or pool slot, with residuals), and with ``check`` a non-finite value in a source
    slot (a host read: synchronises a CUDA stream; ``check=False`` makes these preconditions).
    Side effects: writes the store slots (and residuals). Cost: O(n * slot elements), one launch per tensor.
    """
    quant_naive.check_quant_layout(pool, store.qs, store.scales, residuals)
    s, d = _index(slots, "slots"), _index(store_slots, "store_slots")
    if s.numel() != d.numel():
        raise InvalidArgument(f"slots has {s.numel()} entries and store_slots {d.numel()}; pass one per pair")
    if check:
        _check_indices(s.tolist(), "slots", pool[0].shape[1], unique=residuals is not None)
        _check_indices(d.tolist(), "store_slots", store.num_slots, unique=True)
        if s.numel():
            for j, x in enumerate(pool):
                if not bool(torch.isfinite(x[:, s.to(x.device)]).all()):
                    raise InvalidArgument(
                        f"pool[{j}] holds a non-finite value in slots {s.tolist()}; a checkpoint must be finite"
                    )
    if s.numel() == 0:
        return
    device = pool[0].device
    s, d = s.to(device), d.to(device)
    if _use_triton(device, backend):
        from mamba_radix_kernels import triton_quant

        triton_quant.quantize_gather_triton(pool, s, store.qs, store.scales, d, residuals)
    else:
        quant_naive.quantize_gather_ref(pool, s, store.qs, store.scales, d, residuals)


def dequantize_slots(
    store: CheckpointStore,
    store_slots: torch.Tensor | Sequence[int],
    pool: Sequence[torch.Tensor],
    slots: torch.Tensor | Sequence[int],
    *,
    check: bool = True,
    backend: str | None = None,
) -> None:
    """Restore: write store slots ``store_slots`` into pool slots ``slots`` in the pool's dtype.

    Refused before anything is written: a bad layout, lengths differ, a slot out of range, a repeated
    pool slot. Side effects: writes the pool slots. Cost: O(n * slot elements), one launch per tensor.
    """
    quant_naive.check_quant_layout(pool, store.qs, store.scales)
    s, d = _index(store_slots, "store_slots"), _index(slots, "slots")
    if s.numel() != d.numel():
        raise InvalidArgument(f"store_slots has {s.numel()} entries and slots {d.numel()}; pass one per pair")
    if check:
        _check_indices(s.tolist(), "store_slots", store.num_slots, unique=False)
        _check_indices(d.tolist(), "slots", pool[0].shape[1], unique=True)
    if s.numel() == 0:
        return
    device = pool[0].device
    s, d = s.to(device), d.to(device)
    if _use_triton(device, backend):
        from mamba_radix_kernels import triton_quant

        triton_quant.dequantize_scatter_triton(store.qs, store.scales, s, pool, d)
    else:
        quant_naive.dequantize_scatter_ref(store.qs, store.scales, s, pool, d)
