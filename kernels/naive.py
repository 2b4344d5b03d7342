"""Pure-torch reference of every state-movement kernel: the specification and the CPU path.

Every operation is a *slot move*: for each pair ``i`` that is enabled, and for each tensor ``j``, all layers
of slot ``src_index[i]`` of ``srcs[j]`` are written into slot ``dst_index[i]`` of ``dsts[j]``::

    dsts[j][l, dst_index[i], ...] = srcs[j][l, src_index[i], ...]      for every layer l

A pair is enabled when both indices are ``>= 0`` and, if a mask is given, ``mask[i]`` is set; a disabled
pair writes nothing. Tensors are ``[num_layers, num_slots, *inner]`` (any layer and slot strides, inner
dims contiguous for the kernels; the reference does not care).

Values are moved as raw bits: each tensor is viewed as the integer dtype of the same size, so NaN payloads,
negative zeros and float8 values survive unchanged, and dtypes without index kernels on CPU (float8) work.
Nothing here validates indices: duplicate destinations or a slot that is both read and written give an
order-dependent result. :mod:`mamba_radix.state_ops` validates before it calls in here.

Complexity: O(pairs * layers * inner) element moves per tensor, plus an O(pairs) gather into a temporary
(torch advanced indexing reads into a temporary and then scatters it), so about 2x the minimum traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "bits_view",
    "copy_slots_ref",
    "fork_slots_ref",
    "gather_slots_ref",
    "inner_contiguous",
    "move_slots_ref",
    "scatter_slots_ref",
    "track_slots_ref",
]

_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` viewed as the integer dtype of the same element size (no copy, any strides)."""
    want = _BITS_DTYPE.get(t.element_size())
    if want is None:
        raise ValueError(f"no integer view for element size {t.element_size()} (dtype {t.dtype})")
    return t if t.dtype == want else t.view(want)


def move_slots_ref(
    srcs: Sequence[torch.Tensor],
    dsts: Sequence[torch.Tensor],
    src_index: torch.Tensor,
    dst_index: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> None:
    """The generic slot move (see the module docstring). Side effect: writes the enabled destination slots.

    ``src_index``/``dst_index`` are 1-D integer tensors of the same length, on the tensors' device (or CPU);
    ``mask`` is an optional bool tensor of that length. Uses boolean indexing to drop disabled pairs, which
    synchronises a CUDA stream: this reference is the CPU path and the test oracle, not a GPU fast path.
    """
    src_index = src_index.reshape(-1).to(torch.int64)
    dst_index = dst_index.reshape(-1).to(torch.int64)
    keep = (src_index >= 0) & (dst_index >= 0)
    if mask is not None:
        keep &= mask.reshape(-1).to(torch.bool)
    s = src_index[keep]
    d = dst_index[keep]
    if s.numel() == 0:
        return
    for src, dst in zip(srcs, dsts, strict=True):
        sb, db = bits_view(src), bits_view(dst)
        db[:, d.to(db.device)] = sb[:, s.to(sb.device)].to(db.device)


def copy_slots_ref(tensors: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``t[:, dst[i]] = t[:, src[i]]`` for every tensor ``t`` (copy-on-write of a matched checkpoint)."""
    move_slots_ref(tensors, tensors, src, dst)


def fork_slots_ref(tensors: Sequence[torch.Tensor], src: int, dst: torch.Tensor) -> None:
    """``t[:, dst[i]] = t[:, src]`` for every ``i`` and every tensor ``t`` (one slot into k slots)."""
    dst = dst.reshape(-1)
    move_slots_ref(tensors, tensors, torch.full_like(dst, int(src), dtype=torch.int64), dst)


def track_slots_ref(
    tensors: Sequence[torch.Tensor], active: torch.Tensor, track: torch.Tensor, mask: torch.Tensor
) -> None:
    """``t[:, track[i]] = t[:, active[i]]`` where ``mask[i]`` and ``track[i] >= 0`` (and ``active[i] >= 0``)."""
    move_slots_ref(tensors, tensors, active, track, mask)


def gather_slots_ref(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, out: Sequence[torch.Tensor]
) -> None:
    """``out[j][l, i] = tensors[j][l, slots[i]]``: pool slots into a ``[L, n, *inner]`` buffer (offload)."""
    slots = slots.reshape(-1)
    move_slots_ref(tensors, out, slots, torch.arange(slots.numel(), device=slots.device))


def scatter_slots_ref(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, src: Sequence[torch.Tensor]
) -> None:
    """``tensors[j][l, slots[i]] = src[j][l, i]``: a ``[L, n, *inner]`` buffer back into pool slots."""
    slots = slots.reshape(-1)
    move_slots_ref(src, tensors, torch.arange(slots.numel(), device=slots.device), slots)


def inner_contiguous(t: torch.Tensor) -> bool:
    """Whether the dims after (layer, slot) form one dense row (size-1 dims may have any stride)."""
    expected = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
