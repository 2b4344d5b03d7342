"""State movement between slots of a MambaPool, one function per operation.

Each function takes the pool's tensor list ``[*conv, temporal]`` (each ``[num_layers, num_slots + 1,
*inner]``, inner dims contiguous, layer/slot strides free) and integer slot indices, validates them, and
dispatches:

- CUDA tensors -> the Triton kernels of :mod:`mamba_radix_kernels` (one launch over all layers and all
  tensors, bits moved unchanged, 64-bit offsets);
- anything else -> the torch reference :mod:`mamba_radix_kernels.naive` (the specification).

The backend can be forced, per call (``backend="triton"``), for a block (:func:`use_backend`) or for the
process (:func:`set_backend`, or ``MAMBA_RADIX_STATE_OPS_BACKEND=auto|torch|triton``). Forcing ``triton``
on CPU tensors needs ``TRITON_INTERPRET=1`` set before the kernels are first used (the tests do this).

Validation: a bad argument raises :class:`~mamba_radix.errors.InvalidArgument` naming the value and the fix,
before anything is written (a refused call changes nothing). Index *values* are checked (range, duplicate
destinations, a slot that is both read and written: the kernels move all pairs at once, so such a batch
would race on the GPU). Reading index values from a CUDA tensor synchronises the stream; ``copy``, ``fork``,
``gather`` and ``scatter`` accept that by default (``check=False`` skips it), while ``track`` is on the
per-step path and by default checks values only when its indices live on the CPU.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from mamba_radix_kernels import naive

from mamba_radix.errors import InvalidArgument

__all__ = [
    "bytes_moved",
    "copy_slots",
    "fork_slots",
    "gather_slots",
    "get_backend",
    "scatter_slots",
    "set_backend",
    "track_slots",
    "use_backend",
]

_BACKENDS = ("auto", "torch", "triton")
_ENV = "MAMBA_RADIX_STATE_OPS_BACKEND"


def _env_backend() -> str:
    name = os.environ.get(_ENV, "auto")
    if name not in _BACKENDS:
        raise InvalidArgument(f"{_ENV}={name!r} is not a backend; use one of {', '.join(_BACKENDS)}")
    return name


_backend = _env_backend()


def get_backend() -> str:
    """The process-wide default backend: ``auto`` (CUDA -> triton, else torch), ``torch`` or ``triton``."""
    return _backend


def set_backend(name: str) -> str:
    """Set the process-wide default backend; returns the previous one. Side effect: global state."""
    global _backend
    if name not in _BACKENDS:
        raise InvalidArgument(f"backend={name!r} is not a backend; use one of {', '.join(_BACKENDS)}")
    previous, _backend = _backend, name
    return previous


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Use backend ``name`` inside the ``with`` block (process-wide, restored on exit)."""
    previous = set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


# ----------------------------------------------------------------------------------------------- checks


def _pool_layout(tensors: Sequence[torch.Tensor], what: str = "tensors") -> tuple[torch.device, int, int]:
    """Check the pool tensors; return (device, num_layers, num_slots incl. slot 0). O(number of tensors)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence) or len(tensors) == 0:
        raise InvalidArgument(
            f"{what} must be a non-empty list of tensors [*conv, temporal], got {type(tensors).__name__}"
        )
    first = tensors[0]
    for j, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"{what}[{j}] is a {type(t).__name__}, expected a torch.Tensor")
        if t.element_size() not in naive.MOVABLE_ELEMENT_SIZES:
            raise InvalidArgument(
                f"{what}[{j}] has dtype {t.dtype} ({t.element_size()} bytes an element); state tensors move "
                "as 1-, 2-, 4- or 8-byte words: use a real dtype (bf16, fp16, fp32, fp8 ...)"
            )
        if t.dim() < 2:
            raise InvalidArgument(
                f"{what}[{j}] has shape {tuple(t.shape)}; expected [num_layers, num_slots + 1, *inner]"
            )
        if t.device != first.device:
            raise InvalidArgument(
                f"{what}[{j}] is on {t.device}, {what}[0] on {first.device}; use one device"
            )
        if t.shape[:2] != first.shape[:2]:
            raise InvalidArgument(
                f"{what}[{j}] has (layers, slots) = {tuple(t.shape[:2])}, {what}[0] has "
                f"{tuple(first.shape[:2])}; all tensors of a pool share both"
            )
        if not naive.inner_contiguous(t):
            raise InvalidArgument(
                f"{what}[{j}] has inner strides {tuple(t.stride()[2:])} for inner shape {tuple(t.shape[2:])}; "
                "the dims after (layer, slot) must be contiguous: pass the pool tensor or a slot/layer view"
            )
    return first.device, first.shape[0], first.shape[1]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _check_flag(check: object) -> None:
    if check is not None and not isinstance(check, bool):
        raise InvalidArgument(f"check must be True or False, got {check!r}")


def _host_ints(x: Sequence[object], name: str) -> list[int]:
    """A list/tuple of slot indices as Python ints (``operator.index``: ints and numpy ints, not bools or
    floats), each within int64; :class:`InvalidArgument` otherwise. O(len)."""
    out = []
    for i, v in enumerate(x):
        if isinstance(v, bool):
            raise InvalidArgument(f"{name}[{i}] is {v!r}; pass int slot indices")
        try:
            iv = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgument(
                f"{name}[{i}] is a {type(v).__name__} ({v!r}); pass int slot indices"
            ) from None
        if not _INT64_MIN <= iv <= _INT64_MAX:
            raise InvalidArgument(f"{name}[{i}] = {iv} does not fit int64; pass slot indices of this pool")
        out.append(iv)
    return out


def _index(x: object, name: str, device: torch.device) -> torch.Tensor:
    """``x`` (integer tensor, or list/tuple of ints) as a 1-D int64 tensor on ``device``."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.dtype.is_floating_point or x.dtype.is_complex:
            raise InvalidArgument(
                f"{name} has dtype {x.dtype}; pass an integer (int64) tensor of slot indices"
            )
        if x.dim() > 1:
            raise InvalidArgument(f"{name} has shape {tuple(x.shape)}; pass a 1-D tensor of slot indices")
        t = x.reshape(-1)
    elif isinstance(x, (list, tuple)):
        t = torch.tensor(_host_ints(x, name), dtype=torch.int64)
    else:
        raise InvalidArgument(f"{name} is a {type(x).__name__}; pass an int64 tensor (or a list of ints)")
    if t.dtype != torch.int64:
        t = t.to(torch.int64)
    if t.device != device:
        t = t.to(device, non_blocking=True)
    return t


def _host(t: torch.Tensor) -> list[int]:
    """Index values on the host (synchronises a CUDA stream)."""
    return t.cpu().tolist()


def _check_range(values: list[int], name: str, num_slots: int, allow_skip: bool) -> None:
    low = -1 if allow_skip else 0
    for i, v in enumerate(values):
        if not low <= v < num_slots:
            extra = " or -1 (skip)" if allow_skip else ""
            raise InvalidArgument(
                f"{name}[{i}] = {v} is outside the pool's slots 0..{num_slots - 1}{extra}; "
                "pass slot indices of this pool"
            )


def _check_unique(values: list[int], name: str) -> None:
    seen: dict[int, int] = {}
    for i, v in enumerate(values):
        if v in seen:
            raise InvalidArgument(
                f"duplicate destination slot {v} in {name} (entries {seen[v]} and {i}): each destination "
                "may be written once per call; drop the duplicate or split the call"
            )
        seen[v] = i


def _check_disjoint(reads: list[int], writes: list[int], read_name: str, write_name: str) -> None:
    both = sorted(set(reads) & set(writes))
    if both:
        raise InvalidArgument(
            f"slot {both[0]} is both read ({read_name}) and written ({write_name}); "
            f"{len(both)} slot(s) overlap. Sources and destinations must be disjoint because all pairs move "
            "at once: copy through a free slot, or split the call"
        )


def _same_length(a: torch.Tensor, b: torch.Tensor, na: str, nb: str) -> None:
    if a.numel() != b.numel():
        raise InvalidArgument(f"{na} has {a.numel()} entries and {nb} {b.numel()}; pass one {na} per {nb}")


def _buffers(
    buffers: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor], n: int, what: str
) -> torch.device | None:
    """Check the staging/host buffers of gather/scatter: ``[L, n, *inner]`` per pool tensor, same dtype."""
    if isinstance(buffers, torch.Tensor) or not isinstance(buffers, Sequence) or len(buffers) != len(tensors):
        got = (
            len(buffers)
            if isinstance(buffers, Sequence) and not isinstance(buffers, torch.Tensor)
            else "not a list"
        )
        raise InvalidArgument(
            f"{what} must be a list of {len(tensors)} tensors (one per pool tensor), got {got}"
        )
    device = None
    for j, (b, t) in enumerate(zip(buffers, tensors, strict=True)):
        want = (t.shape[0], n, *t.shape[2:])
        if not isinstance(b, torch.Tensor):
            raise InvalidArgument(f"{what}[{j}] is a {type(b).__name__}, expected a tensor of shape {want}")
        if tuple(b.shape) != want or b.dtype != t.dtype:
            raise InvalidArgument(
                f"{what}[{j}] is {b.dtype} {tuple(b.shape)}; expected {t.dtype} {want} "
                "([num_layers, len(slots), *inner] of the pool tensor)"
            )
        if not naive.inner_contiguous(b):
            raise InvalidArgument(f"{what}[{j}] has non-contiguous inner dims {tuple(b.stride()[2:])}")
        if device is not None and b.device != device:
            raise InvalidArgument(f"{what}[{j}] is on {b.device}, {what}[0] on {device}; use one device")
        device = b.device
    return device


# --------------------------------------------------------------------------------------------- dispatch


def _use_triton(device: torch.device, backend: str | None) -> bool:
    name = backend if backend is not None else _backend
    if name not in _BACKENDS:
        raise InvalidArgument(f"backend={name!r} is not a backend; use one of {', '.join(_BACKENDS)}")
    if name == "torch":
        return False
    if name == "auto" and device.type != "cuda":
        return False
    from mamba_radix_kernels import slot_move

    if slot_move.triton_usable(device):
        return True
    if name == "auto":  # CUDA without a usable triton: the reference still works
        return False
    raise InvalidArgument(
        f"backend='triton' cannot run on {device} tensors (triton importable: {slot_move.HAS_TRITON}, "
        f"interpreter: {slot_move.INTERPRETED}); use CUDA tensors, or set TRITON_INTERPRET=1 before the "
        "kernels are first imported, or use backend='torch'"
    )


def _triton():
    from mamba_radix_kernels import slot_move

    return slot_move


# ------------------------------------------------------------------------------------------- operations


def copy_slots(
    tensors: Sequence[torch.Tensor],
    src: torch.Tensor | Sequence[int],
    dst: torch.Tensor | Sequence[int],
    *,
    check: bool = True,
    backend: str | None = None,
    host_views: Sequence[Any] | None = None,
) -> None:
    """``t[:, dst[i]] = t[:, src[i]]`` for every pool tensor ``t`` (copy-on-write of a matched checkpoint).

    Refused (``InvalidArgument``, nothing written): lengths differ, a slot out of range, a destination
    repeated, or a slot that is both a source and a destination. Sources may repeat.
    Side effects: writes the destination slots (all layers, all tensors). Cost: O(n * bytes_per_slot) on
    the device in one launch; with ``check`` the O(n) index check reads the indices on the host (a stream
    sync for CUDA indices).

    ``check=False`` with one source and one destination given as Python ints in lists (a trusted
    copy-on-write) takes :func:`naive.copy_slot_ints`: no index tensor, no sync, one copy per tensor;
    ``host_views`` are numpy byte views of CPU ``tensors`` for it (one memcpy per tensor).
    """
    if (
        check is False
        and backend is None
        and type(src) is list
        and type(dst) is list
        and len(src) == len(dst) == 1
        and type(src[0]) is int
        and type(dst[0]) is int
    ):
        naive.copy_slot_ints(tensors, src[0], dst[0], host_views)
        return
    _check_flag(check)
    device, _, num_slots = _pool_layout(tensors)
    s, d = _index(src, "src", device), _index(dst, "dst", device)
    _same_length(s, d, "src", "dst")
    if check:
        hs, hd = _host(s), _host(d)
        _check_range(hs, "src", num_slots, allow_skip=False)
        _check_range(hd, "dst", num_slots, allow_skip=False)
        _check_unique(hd, "dst")
        _check_disjoint(hs, hd, "src", "dst")
    if d.numel() == 0:
        return
    if _use_triton(device, backend):
        _triton().copy_slots_triton(list(tensors), s, d)
    elif check:
        naive.copy_slots_ref(tensors, s, d)
    else:  # trusted caller: the reference's own re-checks would repeat the ones it made
        naive.copy_slots_trusted(tensors, s, d)


def fork_slots(
    tensors: Sequence[torch.Tensor],
    src: int | torch.Tensor,
    dst: torch.Tensor | Sequence[int],
    *,
    check: bool = True,
    backend: str | None = None,
) -> None:
    """Copy slot ``src`` into every slot of ``dst`` (one checkpoint into k request slots).

    Refused: ``src`` or a destination out of range, a destination repeated, or ``src`` among the
    destinations. Side effects: writes the destination slots. Cost: O(k * bytes_per_slot), one launch.
    """
    _check_flag(check)
    device, _, num_slots = _pool_layout(tensors)
    if isinstance(src, torch.Tensor):
        if src.numel() != 1 or src.dtype.is_floating_point or src.dtype.is_complex or src.dtype == torch.bool:
            raise InvalidArgument(f"src must be one integer slot, got a {src.dtype} tensor of {src.numel()}")
        src = int(src.item())
    if isinstance(src, bool):
        raise InvalidArgument(f"src must be an int slot index, got {src!r}")
    try:
        src = operator.index(src)  # ints and numpy ints
    except TypeError:
        raise InvalidArgument(f"src must be an int slot index, got {type(src).__name__}") from None
    d = _index(dst, "dst", device)
    if not 0 <= src < num_slots:
        raise InvalidArgument(
            f"src = {src} is outside the pool's slots 0..{num_slots - 1}; pass a slot index of this pool"
        )
    if check:
        hd = _host(d)
        _check_range(hd, "dst", num_slots, allow_skip=False)
        _check_unique(hd, "dst")
        _check_disjoint([src], hd, "src", "dst")
    if d.numel() == 0:
        return
    if _use_triton(device, backend):
        _triton().fork_slots_triton(list(tensors), src, d)
    else:
        naive.fork_slots_ref(tensors, src, d)


def track_slots(
    tensors: Sequence[torch.Tensor],
    active: torch.Tensor,
    track: torch.Tensor,
    mask: torch.Tensor,
    *,
    check: bool | None = None,
    backend: str | None = None,
) -> None:
    """``t[:, track[i]] = t[:, active[i]]`` where ``mask[i]`` and ``track[i] >= 0`` (and ``active[i] >= 0``).

    The per-step checkpoint copy (live state -> ping-pong track slot). On the Triton path it never
    synchronises with the host and its grid depends only on ``len(active)``: pad a batch with ``-1`` or a
    clear mask bit and the launch can be captured in a CUDA graph.

    ``check``: validate index values (range, ``-1`` as the only negative, enabled destinations unique and
    disjoint from enabled sources). Default: only when the indices are on the CPU (CPU tensors, or lists),
    since reading CUDA indices would synchronise; those are then a precondition. Shapes and dtypes are always checked.
    Side effects: writes the enabled track slots. Cost: O(enabled * bytes_per_slot), one launch.
    """
    _check_flag(check)
    device, _, num_slots = _pool_layout(tensors)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise InvalidArgument(
            f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}; "
            "pass e.g. seq_lens % interval == 0"
        )
    # Index lists are host values by nature: checking them costs no device sync, so they are always checked
    # by default (an unchecked out-of-range index would write outside the pool).
    on_host = mask.device.type == "cpu" and all(
        isinstance(x, (list, tuple)) or (isinstance(x, torch.Tensor) and x.device.type == "cpu")
        for x in (active, track)
    )
    a, t = _index(active, "active", device), _index(track, "track", device)
    m = mask.reshape(-1)
    _same_length(a, t, "active", "track")
    _same_length(m, t, "mask", "track")
    if check if check is not None else on_host:
        ha, ht, hm = _host(a), _host(t), m.cpu().tolist()
        _check_range(ha, "active", num_slots, allow_skip=True)
        _check_range(ht, "track", num_slots, allow_skip=True)
        on = [i for i in range(len(ht)) if hm[i] and ht[i] >= 0 and ha[i] >= 0]
        _check_unique([ht[i] for i in on], "track (enabled entries)")
        _check_disjoint([ha[i] for i in on], [ht[i] for i in on], "active", "track")
    if t.numel() == 0:
        return
    if m.device != device:
        m = m.to(device, non_blocking=True)
    if _use_triton(device, backend):
        _triton().track_slots_triton(list(tensors), a, t, m)
    else:
        naive.track_slots_ref(tensors, a, t, m)


def gather_slots(
    tensors: Sequence[torch.Tensor],
    slots: torch.Tensor | Sequence[int],
    out: Sequence[torch.Tensor],
    *,
    check: bool = True,
    backend: str | None = None,
) -> None:
    """``out[j][l, i] = tensors[j][l, slots[i]]``: pool slots into a staging or host buffer (offload).

    ``out[j]`` is ``[num_layers, len(slots), *inner_j]`` with the pool tensor's dtype and any layer/slot
    strides (a slot-major ``[n, L, ...]`` buffer permuted to ``[L, n, ...]`` works). Slots may repeat.
    When ``out`` is on another device (pinned host memory, say), the slots are first gathered into a
    device staging buffer in one launch, then copied with ``copy_(non_blocking=True)``: synchronise the
    stream before reading a pinned ``out``. Side effects: writes ``out``. Cost: O(n * bytes_per_slot).
    """
    _check_flag(check)
    device, _, num_slots = _pool_layout(tensors)
    s = _index(slots, "slots", device)
    out_device = _buffers(out, tensors, s.numel(), "out")
    if check:
        _check_range(_host(s), "slots", num_slots, allow_skip=False)
    if s.numel() == 0:
        return
    use_triton = _use_triton(device, backend)
    direct = out_device == device
    targets = (
        list(out)
        if direct
        else [
            torch.empty((x.shape[0], s.numel(), *x.shape[2:]), dtype=x.dtype, device=device) for x in tensors
        ]
    )
    if use_triton:
        _triton().gather_slots_triton(list(tensors), s, targets)
    else:
        naive.gather_slots_ref(tensors, s, targets)
    if not direct:
        for o, staged in zip(out, targets, strict=True):
            o.copy_(staged, non_blocking=True)


def scatter_slots(
    tensors: Sequence[torch.Tensor],
    slots: torch.Tensor | Sequence[int],
    src: Sequence[torch.Tensor],
    *,
    check: bool = True,
    backend: str | None = None,
) -> None:
    """``tensors[j][l, slots[i]] = src[j][l, i]``: a staging or host buffer back into pool slots.

    ``src[j]`` is ``[num_layers, len(slots), *inner_j]`` with the pool tensor's dtype; on another device it
    is first copied to the pool's device (``non_blocking=True``). Refused: a slot out of range or repeated.
    Side effects: writes the slots. Cost: O(n * bytes_per_slot), one launch (plus the copy from the host).
    """
    _check_flag(check)
    device, _, num_slots = _pool_layout(tensors)
    s = _index(slots, "slots", device)
    src_device = _buffers(src, tensors, s.numel(), "src")
    if check:
        hs = _host(s)
        _check_range(hs, "slots", num_slots, allow_skip=False)
        _check_unique(hs, "slots")
    if s.numel() == 0:
        return
    staged = list(src) if src_device == device else [x.to(device, non_blocking=True) for x in src]
    if _use_triton(device, backend):
        _triton().scatter_slots_triton(list(tensors), s, staged)
    else:
        naive.scatter_slots_ref(tensors, s, staged)


def bytes_moved(tensors: Sequence[torch.Tensor], num_pairs: int) -> int:
    """Bytes read plus bytes written by moving ``num_pairs`` slots of the pool (for bandwidth figures)."""
    _pool_layout(tensors)
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, int) or num_pairs < 0:
        raise InvalidArgument(f"num_pairs must be a non-negative int, got {num_pairs!r}")
    per_slot = sum(t.shape[0] * math.prod(t.shape[2:]) * t.element_size() for t in tensors)
    return 2 * num_pairs * per_slot
