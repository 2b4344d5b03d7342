"""Pure-torch reference of every state-movement kernel: the specification and the CPU path.

Every operation is a *slot move*: for each pair ``i`` that is enabled, and for each tensor ``j``, all layers
of slot ``src_index[i]`` of ``srcs[j]`` are written into slot ``dst_index[i]`` of ``dsts[j]``::

    dsts[j][l, dst_index[i], ...] = srcs[j][l, src_index[i], ...]      for every layer l

A pair is enabled when both indices are ``>= 0`` and, if a mask is given, ``mask[i]`` is set; a disabled
pair writes nothing. Tensors are ``[num_layers, num_slots, *inner]`` (any layer and slot strides, inner
dims contiguous for the kernels; the reference does not care).

Values are moved as raw bits: each tensor is viewed as the integer dtype of the same size, so NaN payloads,
negative zeros and float8 values survive unchanged, and dtypes without index kernels on CPU (float8) work.
The arguments' form is checked (integer index tensors of equal length, indices inside the slot range of
the tensors they index, matching tensor lists; :class:`~mamba_radix.errors.InvalidArgument` otherwise,
nothing written), so a wrong call is refused rather than failing half-way with a torch ``IndexError``.
Index *relations* are not checked: duplicate destinations or a slot that is both read and written give an
order-dependent result. :mod:`mamba_radix.state_ops` validates those before it calls in here.

Complexity: O(pairs * layers * inner) element moves per tensor, plus an O(pairs) gather into a temporary
(torch advanced indexing reads into a temporary and then scatters it), so about 2x the minimum traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mamba_radix.errors import InvalidArgument

__all__ = [
    "MOVABLE_ELEMENT_SIZES",
    "bits_view",
    "copy_slot_ints",
    "copy_slots_ref",
    "copy_slots_trusted",
    "fork_slots_ref",
    "gather_slots_ref",
    "inner_contiguous",
    "move_slots_ref",
    "scatter_slots_ref",
    "track_slots_ref",
]

_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MOVABLE_ELEMENT_SIZES = frozenset(_BITS_DTYPE)  # element sizes (bytes) a slot move can carry as raw bits


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` viewed as the integer dtype of the same element size (no copy, any strides).

    Raises :class:`~mamba_radix.errors.InvalidArgument` for a non-tensor or an element size without an
    integer dtype (complex128)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"expected a torch.Tensor, got {type(t).__name__}")
    want = _BITS_DTYPE.get(t.element_size())
    if want is None:
        raise InvalidArgument(
            f"no integer view for element size {t.element_size()} (dtype {t.dtype}); slot moves carry 1-, 2-, "
            "4- or 8-byte elements"
        )
    return t if t.dtype == want else t.view(want)


def _as_index(x: object, name: str) -> torch.Tensor:
    if (
        not isinstance(x, torch.Tensor)
        or x.dtype.is_floating_point
        or x.dtype.is_complex
        or x.dtype == torch.bool
    ):
        got = f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise InvalidArgument(f"{name} must be an integer tensor of slot indices, got a {got}")
    return x.reshape(-1).to(torch.int64)


def _check_tensors(tensors: object, name: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or not tensors:
        raise InvalidArgument(f"{name} must be a non-empty list of tensors, got {type(tensors).__name__}")
    for j, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise InvalidArgument(f"{name}[{j}] must be a [num_layers, num_slots, *inner] tensor, got {got}")
    return list(tensors)


def _check_in_slots(idx: torch.Tensor, tensors: list[torch.Tensor], name: str) -> None:
    """Every enabled (>= 0) index must be a slot of every tensor it indexes. O(k), one host read."""
    if idx.numel() == 0:
        return
    num_slots = min(t.shape[1] for t in tensors)
    if bool((idx >= num_slots).any()):
        value = int(idx[idx >= num_slots][0])
        raise InvalidArgument(f"{name} {value} is outside the tensors' slots 0..{num_slots - 1}")


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
    srcs, dsts = _check_tensors(srcs, "srcs"), _check_tensors(dsts, "dsts")
    if len(srcs) != len(dsts):
        raise InvalidArgument(
            f"got {len(srcs)} source and {len(dsts)} destination tensors; pass one per source"
        )
    for j, (a, b) in enumerate(zip(srcs, dsts, strict=True)):
        if a.element_size() != b.element_size() or a.shape[0] != b.shape[0] or a.shape[2:] != b.shape[2:]:
            raise InvalidArgument(
                f"tensor {j}: source {a.dtype} {tuple(a.shape)} and destination {b.dtype} {tuple(b.shape)} "
                "differ in element size, layers or inner shape"
            )
    src_index = _as_index(src_index, "src_index")
    dst_index = _as_index(dst_index, "dst_index")
    if src_index.numel() != dst_index.numel():
        raise InvalidArgument(
            f"src_index has {src_index.numel()} entries and dst_index {dst_index.numel()}; pass one per pair"
        )
    keep = (src_index >= 0) & (dst_index >= 0)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.numel() != src_index.numel():
            raise InvalidArgument(f"mask must be a tensor of {src_index.numel()} entries, one per pair")
        keep &= mask.reshape(-1).to(device=keep.device, dtype=torch.bool)
    s = src_index[keep]
    d = dst_index[keep]
    if s.numel() == 0:
        return
    _check_in_slots(s, srcs, "source slot")
    _check_in_slots(d, dsts, "destination slot")
    for src, dst in zip(srcs, dsts, strict=True):
        sb, db = bits_view(src), bits_view(dst)
        db[:, d.to(db.device)] = sb[:, s.to(sb.device)].to(db.device)


def copy_slots_ref(tensors: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """``t[:, dst[i]] = t[:, src[i]]`` for every tensor ``t`` (copy-on-write of a matched checkpoint)."""
    move_slots_ref(tensors, tensors, src, dst)


def copy_slots_trusted(tensors: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """:func:`copy_slots_ref` without any check, for callers that validated (``state_ops`` with
    ``check=False``): same-device int64 index tensors, in range, no skips, ``dst`` disjoint from ``src``.
    One index copy per tensor. Side effect: writes the destination slots."""
    for t in tensors:
        bits = bits_view(t)
        bits[:, dst] = bits[:, src]


def copy_slot_ints(
    tensors: Sequence[torch.Tensor], src: int, dst: int, host_views: Sequence[Any] | None = None
) -> None:
    """``t[:, dst] = t[:, src]`` for every tensor ``t``, for two Python int slots the caller validated
    (in range, distinct): no index tensor is built, so no host-to-device copy and no sync. With
    ``host_views`` (numpy byte views of CPU ``tensors``, ``[rows, bytes]`` for one layer or ``[layers,
    rows, bytes]``, as :class:`~mamba_radix.pools.MambaPool` caches them) one memcpy per tensor; else one
    torch copy per tensor (a kernel launch each on a device). Side effect: writes slot ``dst``."""
    if host_views is not None:
        for v in host_views:
            if v.ndim == 2:
                v[dst] = v[src]
            else:
                v[:, dst] = v[:, src]
        return
    for t in tensors:
        t[:, dst] = t[:, src]


def fork_slots_ref(tensors: Sequence[torch.Tensor], src: int, dst: torch.Tensor) -> None:
    """``t[:, dst[i]] = t[:, src]`` for every ``i`` and every tensor ``t`` (one slot into k slots)."""
    dst = _as_index(dst, "dst")
    if isinstance(src, bool) or not isinstance(src, int):  # negative: every pair skipped, as the kernel
        raise InvalidArgument(f"src must be an int slot, got {src!r}")
    move_slots_ref(tensors, tensors, torch.full_like(dst, src, dtype=torch.int64), dst)


def track_slots_ref(
    tensors: Sequence[torch.Tensor], active: torch.Tensor, track: torch.Tensor, mask: torch.Tensor
) -> None:
    """``t[:, track[i]] = t[:, active[i]]`` where ``mask[i]`` and ``track[i] >= 0`` (and ``active[i] >= 0``)."""
    move_slots_ref(tensors, tensors, active, track, mask)


def gather_slots_ref(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, out: Sequence[torch.Tensor]
) -> None:
    """``out[j][l, i] = tensors[j][l, slots[i]]``: pool slots into a ``[L, n, *inner]`` buffer (offload)."""
    slots = _as_index(slots, "slots")
    move_slots_ref(tensors, out, slots, torch.arange(slots.numel(), device=slots.device))


def scatter_slots_ref(
    tensors: Sequence[torch.Tensor], slots: torch.Tensor, src: Sequence[torch.Tensor]
) -> None:
    """``tensors[j][l, slots[i]] = src[j][l, i]``: a ``[L, n, *inner]`` buffer back into pool slots."""
    slots = _as_index(slots, "slots")
    move_slots_ref(src, tensors, torch.arange(slots.numel(), device=slots.device), slots)


def inner_contiguous(t: torch.Tensor) -> bool:
    """Whether the dims after (layer, slot) form one dense row (size-1 dims may have any stride)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"expected a torch.Tensor, got {type(t).__name__}")
    expected = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
