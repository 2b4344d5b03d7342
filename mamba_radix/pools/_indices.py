"""Argument checks shared by the pools: index tensors, devices, and membership tests.

Every check here is vectorised and costs O(k) in the number of indices checked, never O(pool size).
A failed check raises before the caller has changed anything, so a refused call leaves the pool as it was.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex, check_count

__all__ = [
    "IndexLike",
    "allocate_tensor",
    "as_index_tensor",
    "check_allocated",
    "check_count",
    "check_fits",
    "check_in_range",
    "check_no_duplicates",
    "check_size",
    "check_slot_int",
    "lazy_zeros",
    "resolve_device",
]

IndexLike = torch.Tensor | int | Sequence[int]

_INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def check_size(value: object, what: str) -> int:
    """``value`` as a positive int, or :class:`InvalidArgument` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a positive int, got {value!r}")
    return value


def check_slot_int(value: object, what: str) -> int:
    """``value`` as a plain Python int (``operator.index``: ints, numpy ints; not bools, floats or
    strings), or :class:`InvalidArgument` naming ``what``. O(1)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device` with an explicit index for CUDA (``cuda`` -> ``cuda:N``).

    Raises :class:`InvalidArgument` for a name torch does not know or a CUDA device on a machine without
    one (checked here, so a pool never half-builds its tensors before failing)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"device {device!r} is not a torch device ({exc}); use e.g. 'cpu' or 'cuda:0'"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgument(
                f"device {device!r} asks for CUDA but no CUDA device is available; use 'cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes (physical RAM for the CPU), or None where unknown."""
    try:
        if device.type == "cpu":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).total_memory
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None
    return None


def check_fits(device: torch.device, num_bytes: int, what: str) -> None:
    """Raise :class:`InvalidArgument` if ``num_bytes`` exceed the whole memory of ``device``.

    Checked before a pool allocates: on Linux a too-large CPU tensor can be granted lazily and then kill
    the process while it is zero-filled, so an impossible size must be refused up front. O(1).
    """
    total = _device_memory_bytes(device)
    if total is not None and num_bytes > total:
        raise InvalidArgument(
            f"{what} needs {num_bytes / 2**30:,.1f} GiB but {device} has {total / 2**30:,.1f} GiB in all; "
            "choose smaller pool sizes"
        )


def allocate_tensor(what: str, make, *args, **kwargs) -> torch.Tensor:
    """``make(*args, **kwargs)`` (``torch.zeros``, ``torch.full`` ...), with an allocation failure turned
    into :class:`InvalidArgument` naming ``what`` and the bytes asked for, instead of torch's
    ``RuntimeError`` / ``MemoryError``: a pool sized past the machine is a sizing mistake of the caller."""
    try:
        return make(*args, **kwargs)
    except (RuntimeError, MemoryError) as exc:
        raise InvalidArgument(
            f"cannot allocate {what} ({str(exc).splitlines()[0][:200]}); choose smaller pool sizes"
        ) from None


def lazy_zeros(
    what: str, shape: int | tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zero-filled tensor whose host memory becomes resident only where it is written.

    On the CPU the memory comes from ``np.zeros`` (``calloc``: a large block is fresh pages from the
    kernel, zero without being written) and the tensor is a view of it; ``torch.zeros`` would write every
    byte at once, making a table sized for capacity (a request table of every running request times the
    longest context, a bitmap of every KV index) resident although only the rows and ids in use are ever
    written. Reads of unwritten pages cost no memory either (the kernel's shared zero page). On any other
    device it is ``torch.zeros``. Allocation failures become :class:`InvalidArgument` as in
    :func:`allocate_tensor`. O(1) on the CPU (no pass over the memory), O(size) elsewhere."""
    if device.type != "cpu":
        return allocate_tensor(what, torch.zeros, shape, dtype=dtype, device=device)
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    try:
        return torch.from_numpy(np.zeros(shape, dtype=np_dtype))
    except (ValueError, MemoryError) as exc:
        raise InvalidArgument(
            f"cannot allocate {what} ({str(exc).splitlines()[0][:200]}); choose smaller pool sizes"
        ) from None


def as_index_tensor(values: IndexLike, device: torch.device, what: str) -> torch.Tensor:
    """``values`` as a 1-D int64 tensor on ``device``.

    Python ints and sequences of ints are converted. A tensor must already be on ``device`` (moving it
    silently would hide a host/device mix-up and cost a copy) and have an integer dtype; 0-d tensors are
    taken as one index. Raises :class:`InvalidArgument` naming ``what`` otherwise.

    O(1) for a 1-D int64 tensor on ``device`` (returned as is, the hot path of every free); a conversion
    otherwise.
    """
    if (
        type(values) is torch.Tensor
        and values.dtype is torch.int64
        and values.dim() == 1
        and values.device == device
    ):
        return values
    if isinstance(values, torch.Tensor):
        if values.dtype not in _INTEGER_DTYPES:
            raise InvalidArgument(
                f"{what} must be an integer tensor (int32 or int64), got dtype {values.dtype}"
            )
        if values.device != device:
            raise InvalidArgument(
                f"{what} is on {values.device} but the pool lives on {device}; move it first"
            )
        if values.dim() > 1:
            raise InvalidArgument(f"{what} must be 1-D, got shape {tuple(values.shape)}")
        return values.reshape(-1).to(torch.int64)
    if isinstance(values, bool):
        raise InvalidArgument(f"{what} must be an int, a sequence of ints or a tensor, got {values!r}")
    if isinstance(values, int):
        if not _INT64_MIN <= values <= _INT64_MAX:
            raise InvalidIndex(f"{what} {values} does not fit int64; pass indices this pool handed out")
        return torch.tensor([values], dtype=torch.int64, device=device)
    if isinstance(values, (str, bytes, bytearray, set, frozenset, dict)):
        raise InvalidArgument(
            f"{what} must be an int, a sequence of ints or a tensor, got {type(values).__name__} {values!r:.80}"
        )
    try:
        items = list(values)
    except TypeError as exc:
        raise InvalidArgument(
            f"{what} must be an int, a sequence of ints or a tensor, got {values!r}"
        ) from exc
    ints = []
    for v in items:
        try:
            if isinstance(v, bool):
                raise TypeError
            ints.append(operator.index(v))
        except TypeError as exc:
            raise InvalidArgument(f"{what} must hold ints, got {v!r} in {values!r:.80}") from exc
    try:
        if device.type == "cpu":  # numpy builds a small tensor ~3x faster than torch.tensor does
            return torch.from_numpy(np.array(ints, dtype=np.int64))
        return torch.tensor(ints, dtype=torch.int64, device=device)
    except (OverflowError, RuntimeError, ValueError):  # only reached for an int outside int64
        value = next(v for v in ints if not _INT64_MIN <= v <= _INT64_MAX)
        raise InvalidIndex(f"{what} {value} does not fit int64; pass indices this pool handed out") from None


def check_in_range(indices: torch.Tensor, low: int, high: int, what: str) -> None:
    """Raise :class:`InvalidIndex` unless every index lies in ``[low, high]``; 0 is named as padding."""
    if indices.numel() == 0:
        return
    bad = (indices < low) | (indices > high)
    if bool(bad.any()):
        value = int(indices[bad][0])
        if value == 0 and low == 1:
            raise InvalidIndex(f"{what} 0 is the padding entry and is never allocated or freed")
        raise InvalidIndex(f"{what} {value} is out of range; valid values are {low}..{high}")


def check_allocated(allocated: torch.Tensor, indices: torch.Tensor, what: str) -> None:
    """Raise :class:`InvalidIndex` unless ``allocated[i]`` holds for every index (already range-checked)."""
    if indices.numel() == 0:
        return
    missing = ~allocated[indices]
    if bool(missing.any()):
        value = int(indices[missing][0])
        raise InvalidIndex(
            f"{what} {value} is not allocated (a double free, or an index never handed out); "
            f"pass only values returned by alloc and not freed since"
        )


def check_no_duplicates(
    scratch: torch.Tensor, indices: torch.Tensor, what: str, why: str = "a double free"
) -> None:
    """Raise :class:`InvalidIndex` if an index occurs twice in ``indices``. O(k), no sort.

    ``scratch`` is an int32 tensor as long as the index space, owned by the pool; its contents are
    meaningless between calls. Each position writes its own rank; where two positions carry the same index
    only one write survives, so the other position reads back a rank that is not its own.
    """
    k = indices.numel()
    if k < 2:
        return
    ranks = torch.arange(k, dtype=scratch.dtype, device=indices.device)
    scratch[indices] = ranks
    clash = scratch[indices] != ranks
    if bool(clash.any()):
        value = int(indices[clash][0])
        raise InvalidIndex(f"{what} {value} occurs twice in one call ({why}); pass each value once")
