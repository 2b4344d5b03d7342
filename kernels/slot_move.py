"""Launchers for the Triton slot-move kernel: copy, fork, track, gather and scatter.

Each launcher issues **one** kernel launch for all layers and for all (up to four) tensors of a pool, e.g.
``[*conv, temporal]`` with different dtypes; more than four tensors take one launch per group of four.
Nothing here synchronises with the host, the grid depends only on the batch length and the shapes (so a
launch can be captured in a CUDA graph), and all slot offsets are 64-bit inside the kernel.

These launchers check the *layout* (devices, layer counts, dtypes, inner contiguity, buffers long enough for
``num_pairs``, a scalar source inside the pool), which is what memory safety needs without reading index
values. On CUDA they do **not** read the indices: out-of-range slots, duplicate destinations and a slot
that is both read and written are preconditions, checked by :mod:`mamba_radix.state_ops` (which is the
public entry point). Under the interpreter (CPU tensors) reading indices costs no device sync, so their
range is checked there too: an out-of-range index would otherwise write outside the tensor's memory. The result of every launcher is specified by
the torch function of the same name in :mod:`mamba_radix_kernels.naive`.

Triton is optional: without it (or without a usable backend) :data:`HAS_TRITON` is False, the launchers
raise, and callers use the reference. On CPU the kernels run under ``TRITON_INTERPRET=1`` (set it before
this package is imported: Triton reads it when a kernel is decorated).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from typing import Any

import torch

from mamba_radix.errors import InvalidArgument

from .naive import bits_view, inner_contiguous

try:  # triton is an optional dependency; a broken install must not break `import mamba_radix_kernels`.
    from . import triton_slot_move as _k

    HAS_TRITON = True
    TRITON_IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # ImportError, or triton failing to initialise
    _k = None  # type: ignore[assignment]
    HAS_TRITON = False
    TRITON_IMPORT_ERROR = exc

# Recorded at import because Triton decides interpreter-or-compiled when the kernel is decorated.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_NUM_WARPS",
    "HAS_TRITON",
    "INTERPRETED",
    "MAX_TENSORS_PER_LAUNCH",
    "copy_slots_triton",
    "fork_slots_triton",
    "gather_slots_triton",
    "move_slots_triton",
    "scatter_slots_triton",
    "track_slots_triton",
    "triton_usable",
]

MAX_TENSORS_PER_LAUNCH = 4
# Elements per program. 4096 bf16 = 8 KiB per program: one Kimi-like slot is 69 x (48 + 4) programs, enough
# to fill 132 SMs at one pair (kernels.md §3.2). Small tensors get the next power of two of their size.
DEFAULT_BLOCK = 4096
DEFAULT_NUM_WARPS = 4
_MAX_GRID_Y = 65_535


def triton_usable(device: torch.device | str) -> bool:
    """True when the Triton kernels can run on tensors of ``device``.

    CUDA: triton imported. Any other device: only under the interpreter (``TRITON_INTERPRET=1`` at import),
    which runs the kernels on the CPU one program at a time (slow; for tests).
    """
    if not HAS_TRITON:
        return False
    return torch.device(device).type == "cuda" or INTERPRETED


def _inner_numel(t: torch.Tensor) -> int:
    return math.prod(t.shape[2:])


def _check_pair(j: int, src: torch.Tensor, dst: torch.Tensor, device: torch.device, num_layers: int) -> None:
    for role, t in (("source", src), ("destination", dst)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"tensor {j} ({role}) is a {type(t).__name__}, expected a torch.Tensor")
        if t.dim() < 2:
            raise InvalidArgument(
                f"tensor {j} ({role}) has shape {tuple(t.shape)}; expected [num_layers, num_slots, *inner]"
            )
        if t.device != device:
            raise InvalidArgument(
                f"tensor {j} ({role}) is on {t.device}, the others on {device}; move it to {device} first"
            )
        if t.shape[0] != num_layers:
            raise InvalidArgument(
                f"tensor {j} ({role}) has {t.shape[0]} layers, the first tensor {num_layers}; "
                "all tensors of one launch must have the same layer count"
            )
        if not inner_contiguous(t):
            raise InvalidArgument(
                f"tensor {j} ({role}) has inner strides {tuple(t.stride()[2:])} for inner shape "
                f"{tuple(t.shape[2:])}; the dims after (layer, slot) must be contiguous (layer and slot "
                "strides may be anything): pass a view with a dense inner row"
            )
    if src.dtype.itemsize != dst.dtype.itemsize or src.shape[2:] != dst.shape[2:]:
        raise InvalidArgument(
            f"tensor {j}: source {src.dtype} {tuple(src.shape[2:])} and destination {dst.dtype} "
            f"{tuple(dst.shape[2:])} differ in element size or inner shape; they must match"
        )


def _as_device_index(x: torch.Tensor, name: str, device: torch.device) -> torch.Tensor:
    if (
        not isinstance(x, torch.Tensor)
        or x.dtype.is_floating_point
        or x.dtype.is_complex
        or x.dtype == torch.bool
    ):
        raise InvalidArgument(
            f"{name} must be an integer tensor, got {type(x).__name__} {getattr(x, 'dtype', '')}"
        )
    x = x.reshape(-1)
    if x.device != device:
        x = x.to(device, non_blocking=True)
    return x.contiguous()


def move_slots_triton(
    srcs: Sequence[torch.Tensor],
    dsts: Sequence[torch.Tensor],
    *,
    num_pairs: int,
    src_index: torch.Tensor | None = None,
    dst_index: torch.Tensor | None = None,
    src_scalar: int | None = None,
    mask: torch.Tensor | None = None,
    block: int | None = None,
    num_warps: int | None = None,
) -> None:
    """The generic slot move on the GPU (specified by :func:`mamba_radix_kernels.naive.move_slots_ref`).

    Pair ``i`` (``0 <= i < num_pairs``) reads slot ``src_index[i]`` (or ``src_scalar``, or ``i`` when both
    are None) of every ``srcs[j]`` and writes slot ``dst_index[i]`` (or ``i`` when None) of ``dsts[j]``,
    over all layers; a negative index or a clear ``mask[i]`` skips the pair.

    Side effects: writes the destination slots; enqueues ``ceil(len(srcs) / 4)`` launches on the current
    stream and returns without waiting. Cost: O(num_pairs * layers * inner) bytes moved once each way; no
    host synchronisation (index tensors on another device are copied with ``non_blocking=True``).
    ``block``/``num_warps`` override the tile size (a power of two) and warps, for tests and tuning.
    """
    if not HAS_TRITON:
        raise InvalidArgument(
            f"triton is not importable ({TRITON_IMPORT_ERROR!r}); use the torch reference "
            "(mamba_radix_kernels.naive) or install triton"
        )
    for name, seq in (("srcs", srcs), ("dsts", dsts)):
        if isinstance(seq, (torch.Tensor, str, bytes)) or not isinstance(seq, Sequence):
            raise InvalidArgument(f"{name} must be a list of tensors, got {type(seq).__name__}")
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, int):
        raise InvalidArgument(f"num_pairs must be an int, got {type(num_pairs).__name__} {num_pairs!r}")
    for name, value in (("block", block), ("num_warps", num_warps)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1)
        ):
            raise InvalidArgument(f"{name} must be a power-of-two int, got {value!r}")
    if src_scalar is not None:
        try:
            if isinstance(src_scalar, bool):
                raise TypeError
            src_scalar = operator.index(src_scalar)  # ints and numpy ints; not floats, strings, bools
        except TypeError:
            raise InvalidArgument(
                f"src_scalar must be an int slot, got {type(src_scalar).__name__} {src_scalar!r}"
            ) from None
    if len(srcs) != len(dsts) or len(srcs) == 0:
        raise InvalidArgument(
            f"got {len(srcs)} source and {len(dsts)} destination tensors; pass one destination per source"
        )
    device = srcs[0].device
    num_layers = srcs[0].shape[0] if srcs[0].dim() >= 2 else -1
    for j, (s, d) in enumerate(zip(srcs, dsts, strict=True)):
        _check_pair(j, s, d, device, num_layers)
    if not triton_usable(device):
        raise InvalidArgument(
            f"the Triton kernels cannot run on {device} tensors: use CUDA tensors, or set "
            "TRITON_INTERPRET=1 before importing mamba_radix_kernels to run them on the CPU"
        )
    if num_pairs < 0:
        raise InvalidArgument(f"num_pairs={num_pairs} is negative")
    if num_pairs == 0 or num_layers == 0:
        return
    # Layout facts known on the host (no sync): identity-indexed sides must hold num_pairs slots, and a
    # scalar source must be a slot of every source tensor.
    src_slots = min(t.shape[1] for t in srcs)
    dst_slots = min(t.shape[1] for t in dsts)
    if src_index is None and src_scalar is None and src_slots < num_pairs:
        raise InvalidArgument(f"the source buffers hold {src_slots} slots but num_pairs is {num_pairs}")
    if dst_index is None and dst_slots < num_pairs:
        raise InvalidArgument(f"the destination buffers hold {dst_slots} slots but num_pairs is {num_pairs}")
    if src_scalar is not None and src_scalar >= src_slots:  # negative: the documented "skip every pair"
        raise InvalidArgument(f"src_scalar {src_scalar} is outside the source slots 0..{src_slots - 1}")

    # Integer views: the kernel moves bits, so bf16/fp16 share one specialisation and fp8 needs no support.
    srcs_b = [bits_view(s) for s in srcs]
    dsts_b = [bits_view(d) for d in dsts]
    inner = [_inner_numel(s) for s in srcs_b]

    if src_index is not None:
        src_index = _as_device_index(src_index, "src_index", device)
        src_mode = _k.INDEX_TENSOR
    elif src_scalar is not None:
        src_mode = _k.INDEX_SCALAR
    else:
        src_mode = _k.INDEX_IDENTITY
    if dst_index is not None:
        dst_index = _as_device_index(dst_index, "dst_index", device)
        dst_mode = _k.INDEX_TENSOR
    else:
        dst_mode = _k.INDEX_IDENTITY
    for name, idx, slots in (("src_index", src_index, src_slots), ("dst_index", dst_index, dst_slots)):
        if idx is not None and idx.numel() != num_pairs:
            raise InvalidArgument(f"{name} has {idx.numel()} entries, expected num_pairs={num_pairs}")
        if idx is not None and device.type != "cuda" and bool((idx >= slots).any()):
            # the interpreter: a host read, no sync; negative entries are the documented "skip"
            raise InvalidArgument(f"{name} {int(idx.max())} is outside the tensors' slots 0..{slots - 1}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.numel() != num_pairs:
            raise InvalidArgument(
                f"mask must be a bool tensor of {num_pairs} entries, got {getattr(mask, 'dtype', type(mask).__name__)}"
            )
        mask = mask.reshape(-1).to(device, non_blocking=True).contiguous().view(torch.uint8)

    if num_pairs * num_layers > 2**31 - 1:
        raise InvalidArgument(
            f"num_pairs * num_layers = {num_pairs * num_layers} exceeds the grid limit 2^31 - 1; split the batch"
        )
    warps = num_warps or DEFAULT_NUM_WARPS
    # A placeholder pointer for unused index/mask arguments: never dereferenced (constexpr modes).
    any_ptr = srcs_b[0]
    for g in range(0, len(srcs_b), MAX_TENSORS_PER_LAUNCH):
        group = list(range(g, min(g + MAX_TENSORS_PER_LAUNCH, len(srcs_b))))
        max_inner = max(inner[j] for j in group)
        if max_inner == 0:
            continue
        blk = block or min(DEFAULT_BLOCK, max(16, triton_next_pow2(max_inner)))
        if blk & (blk - 1):
            raise InvalidArgument(f"block={blk} is not a power of two")
        # Keep grid axis 1 within CUDA's limit by growing the tile if a tensor is enormous.
        while sum(-(-inner[j] // blk) for j in group) > _MAX_GRID_Y:
            blk *= 2
        tiles = sum(-(-inner[j] // blk) for j in group)
        args: list[Any] = [
            src_index if src_index is not None else any_ptr,
            dst_index if dst_index is not None else any_ptr,
            mask if mask is not None else any_ptr,
            int(src_scalar) if src_scalar is not None else 0,
            num_layers,
        ]
        for k in range(MAX_TENSORS_PER_LAUNCH):
            if k < len(group):
                s, d = srcs_b[group[k]], dsts_b[group[k]]
                args += [s, d, inner[group[k]], s.stride(0), s.stride(1), d.stride(0), d.stride(1)]
            else:  # unused tensor slot: pruned by the NUM_TENSORS constexpr
                args += [any_ptr, any_ptr, 0, 0, 0, 0, 0]
        grid = (num_pairs * num_layers, tiles)
        _k.slot_move_kernel[grid](
            *args,
            NUM_TENSORS=len(group),
            SRC_MODE=src_mode,
            DST_MODE=dst_mode,
            HAS_MASK=mask is not None,
            BLOCK=blk,
            num_warps=warps,
        )


def triton_next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (``n >= 1``)."""
    return 1 << (max(1, n) - 1).bit_length()


def _num_pairs(index: object, name: str) -> int:
    """``index.numel()`` for the launchers' index arguments, which must be integer tensors."""
    if not isinstance(index, torch.Tensor):
        raise InvalidArgument(f"{name} must be an integer tensor of slot indices, got {type(index).__name__}")
    return index.numel()


def copy_slots_triton(
    tensors: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor, **kw: Any
) -> None:
    """``t[:, dst[i]] = t[:, src[i]]`` for every tensor, one launch. Preconditions: see the module docstring."""
    move_slots_triton(tensors, tensors, num_pairs=_num_pairs(dst, "dst"), src_index=src, dst_index=dst, **kw)


def fork_slots_triton(tensors: Sequence[torch.Tensor], src: int, dst: torch.Tensor, **kw: Any) -> None:
    """``t[:, dst[i]] = t[:, src]`` for every tensor, one launch; ``src`` is a host int (no index tensor)."""
    move_slots_triton(tensors, tensors, num_pairs=_num_pairs(dst, "dst"), src_scalar=src, dst_index=dst, **kw)


def track_slots_triton(
    tensors: Sequence[torch.Tensor], active: torch.Tensor, track: torch.Tensor, mask: torch.Tensor, **kw: Any
) -> None:
    """``t[:, track[i]] = t[:, active[i]]`` where ``mask[i]`` and both indices ``>= 0``; static grid, no sync."""
    move_slots_triton(
        tensors,
        tensors,
        num_pairs=_num_pairs(track, "track"),
        src_index=active,
        dst_index=track,
        mask=mask,
        **kw,
    )


def gather_slots_triton(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, out: Sequence[torch.Tensor], **kw: Any
) -> None:
    """``out[j][l, i] = tensors[j][l, slots[i]]``; ``out`` on the pool's device, any layer/slot strides."""
    move_slots_triton(tensors, out, num_pairs=_num_pairs(slots, "slots"), src_index=slots, **kw)


def scatter_slots_triton(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, src: Sequence[torch.Tensor], **kw: Any
) -> None:
    """``tensors[j][l, slots[i]] = src[j][l, i]``; ``src`` on the pool's device, any layer/slot strides."""
    move_slots_triton(src, tensors, num_pairs=_num_pairs(slots, "slots"), dst_index=slots, **kw)
