"""Host copies of pool contents for retraction (``get_cpu_copy`` / ``load_cpu_copy`` of the pools).

When a scheduler retracts a running request it moves the request's KV rows and state slots to host
memory, frees them on the device, and later writes the copy back into whatever indices and slots it
allocates then. The pools implement the two calls; this module holds what they share:

- :class:`MambaCpuCopy` and :class:`HybridCpuCopy`, the copies' shapes (plain tuples underneath, so
  SGLang's ``conv_cpu, temporal_cpu = pool.get_cpu_copy(slots)`` unpacking works);
- :func:`gather_to_host`, the one gather-and-transfer every copy goes through: pinned host memory where
  CUDA is available (so the device-to-host copy is asynchronous and the later load can be too), plain
  host memory otherwise;
- :func:`check_copied_tensor`, the shape and dtype check of a copy before anything is written, so a load
  is refused whole or done whole.

No function here changes a pool; the copies are fresh tensors that never alias a pool's memory.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mamba_radix.errors import InvalidArgument

__all__ = [
    "HybridCpuCopy",
    "MambaCpuCopy",
    "check_copied_tensor",
    "gather_to_host",
    "pin_host_copies",
    "synchronize",
]


class MambaCpuCopy(NamedTuple):
    """The state of some slots on the host, over every layer: ``conv[j]`` is ``[num_layers, k,
    *conv_shapes[j]]`` and ``temporal`` ``[num_layers, k, *temporal_shape]``, in the pool's dtypes, slot
    ``i`` of the copy at position ``i`` of dimension 1."""

    conv: list[torch.Tensor]
    temporal: torch.Tensor


class HybridCpuCopy(NamedTuple):
    """A hybrid pool's copy: ``kv`` the full-attention pool's (its own form) and ``mamba`` the state
    pool's, or ``None`` when no state slots were copied."""

    kv: object
    mamba: MambaCpuCopy | None


def pin_host_copies() -> bool:
    """Whether host copies go to pinned (page-locked) memory: where CUDA is available. O(1)."""
    return torch.cuda.is_available()


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op off CUDA): the asynchronous transfers of a copy
    must be done before the copy is handed out, and before a load's host tensors may be dropped."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gather_to_host(source: torch.Tensor, dim: int, indices: torch.Tensor) -> torch.Tensor:
    """``source.index_select(dim, indices)`` as a fresh host tensor, pinned where CUDA is available.

    The gather runs where ``source`` lives; the transfer is asynchronous from a CUDA source, so call
    :func:`synchronize` on the source's device before reading the result. A CPU source without CUDA
    returns the gather itself (already a fresh copy), saving one pass. O(k * row bytes)."""
    gathered = source.index_select(dim, indices)
    if gathered.device.type == "cpu" and not pin_host_copies():
        return gathered
    host = torch.empty(gathered.shape, dtype=gathered.dtype, device="cpu", pin_memory=pin_host_copies())
    host.copy_(gathered, non_blocking=gathered.is_cuda)
    return host


def check_copied_tensor(value: object, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
    """``value`` if it is a tensor of exactly ``shape`` and ``dtype``, else :class:`InvalidArgument`
    naming ``what`` and the fix. The dtype must match exactly: a cast would not restore the bytes that
    were copied. No side effects. O(1)."""
    if not isinstance(value, torch.Tensor):
        raise InvalidArgument(
            f"{what} must be a tensor, got {type(value).__name__}; pass the copy get_cpu_copy returned"
        )
    if tuple(value.shape) != shape:
        raise InvalidArgument(
            f"{what} has shape {tuple(value.shape)} but this pool needs {shape} here: the copy was made by "
            "a pool of another shape or for another number of indices; load it into a pool built like the "
            "one that made it, at as many indices as it holds"
        )
    if value.dtype != dtype:
        raise InvalidArgument(
            f"{what} is {value.dtype} but this pool stores {dtype}; load the copy into a pool of the dtype "
            "that made it (a cast would not restore the same bytes)"
        )
    return value
