"""Host copies of state slots: the state half of the host tier (issue 25; SGLang's ``MambaPoolHost``).

A :class:`HostStatePool` mirrors one device :class:`~mamba_radix.pools.MambaPool` in host memory with its
own slot count: the same conv and temporal tensors, shaped ``[num_layers, host_slots + 1, *inner]`` in the
device pool's dtypes, in pinned memory where CUDA is available (so both directions can be asynchronous)
and plain CPU memory otherwise, and its own free list. It moves bytes and owns host slots; it decides
nothing: which checkpoint is backed up, kept or dropped is the host tier's placement policy, above it.

- :meth:`backup` copies device slots into newly taken host slots (device -> host, a demotion or a
  write-through), :meth:`load` copies host slots into device slots the caller allocated (host -> device, a
  host hit's load-back), :meth:`free` returns host slots, exactly once each.
- Every copy goes through :func:`~mamba_radix.state_ops.gather_slots` and
  :func:`~mamba_radix.state_ops.scatter_slots` (Triton on CUDA, the torch reference elsewhere), through a
  contiguous staging buffer in between: host slots are scattered, and a gather to another device needs
  the ``[L, n, ...]`` block form.
- On CUDA, a copy may run on a side stream (``stream=``); the call returns the event recorded after it, so
  the engine waits on that event before the forward that reads the slots. Without CUDA everything is
  synchronous and the event is ``None``.

Every call validates all of its arguments before anything is taken or written: a refused call changes
nothing in either pool.
"""

from __future__ import annotations

import contextlib

import torch

from mamba_radix import state_ops
from mamba_radix.errors import InvalidArgument, OutOfSlots
from mamba_radix.pools._indices import IndexLike, as_index_tensor, check_size
from mamba_radix.pools.cpu_copy import pin_host_copies
from mamba_radix.pools.mamba_pool import MambaPool

__all__ = ["HostStatePool"]


class HostStatePool:
    """``num_slots`` host slots shaped like ``device_pool``'s (see the module docstring).

    Raises :class:`InvalidArgument` for a slot count that is not a positive int, or for host memory the
    machine cannot allocate (the message gives the bytes asked for)."""

    def __init__(self, device_pool: MambaPool, num_slots: int, *, pin_memory: bool | None = None) -> None:
        if not isinstance(device_pool, MambaPool):
            raise InvalidArgument(
                f"device_pool must be a MambaPool, got {type(device_pool).__name__}; pass the cache's state pool"
            )
        self.device_pool = device_pool
        self.size = check_size(num_slots, "host state slots")
        self.pinned = pin_host_copies() if pin_memory is None else bool(pin_memory)
        # A CPU MambaPool holds the host tensors and the free list: one definition of a slot's layout and of
        # the slot bookkeeping. Its FIFO free list makes freed host slots the last reused, like the device's.
        self._host = MambaPool(
            num_slots,
            device_pool.num_layers,
            device_pool.conv_shapes,
            device_pool.temporal_shape,
            device_pool.conv_dtypes,
            device_pool.temporal_dtype,
            device="cpu",
        )
        if self.pinned:  # page-locked, so a copy to or from the GPU can be asynchronous
            self._host.conv = [t.pin_memory() for t in self._host.conv]
            self._host.temporal = self._host.temporal.pin_memory()
        self.bytes_per_slot = self._host.bytes_per_slot

    # ----------------------------------------------------------------------------------------- sizes
    @property
    def tensors(self) -> list[torch.Tensor]:
        """The host tensors ``[*conv, temporal]`` (read them only after the copy's event)."""
        return self._host.tensors

    def available_size(self) -> int:
        """Free host slots. O(1)."""
        return self._host.available_size()

    @property
    def used(self) -> int:
        """Host slots holding a backup."""
        return self._host.used

    @property
    def total_bytes(self) -> int:
        """Host bytes of every state tensor, the padding slot included."""
        return self._host.total_bytes

    def is_allocated(self, host_slots: IndexLike) -> torch.Tensor:
        """Bool mask over ``host_slots``: holding a backup or not. O(k)."""
        return self._host.is_allocated(host_slots)

    def allocated_slots(self) -> torch.Tensor:
        """Every host slot holding a backup, ascending. O(size): for conservation checks."""
        return self._host.allocated_slots()

    # -------------------------------------------------------------------------------------- transfers
    def _device_slots(self, slots: IndexLike, what: str) -> torch.Tensor:
        """``slots`` checked as allocated, distinct slots of the device pool (else :class:`InvalidIndex`)."""
        idx = self.device_pool.check_allocated(slots)
        if idx.numel() > 1 and torch.unique(idx).numel() != idx.numel():
            raise InvalidArgument(f"{what} repeats a device slot; pass each slot once")
        return idx

    def backup(self, device_slots: IndexLike, *, stream: object = None) -> tuple[torch.Tensor, object]:
        """Copy ``device_slots`` into newly taken host slots; ``(host_slots, event)``, host slot ``i`` holding
        device slot ``i``'s state. ``event`` is the CUDA event recorded after the copy on ``stream`` (None
        off CUDA or without a stream): the device slots may be freed or overwritten only after it.

        Raises :class:`OutOfSlots` when fewer host slots are free than asked for (the placement policy
        frees host slots first), :class:`InvalidIndex` for a device slot that is not allocated or repeated;
        then nothing is taken or written. O(n * bytes_per_slot)."""
        src = self._device_slots(device_slots, "backup")
        n = src.numel()
        if n > self._host.available_size():
            raise OutOfSlots(
                f"backup of {n} state slots needs {n} free host slots, {self._host.available_size()} are free; "
                "free host backups first or size the host state pool larger"
            )
        host_slots = self._host.alloc(n)
        if n == 0:
            return host_slots, None
        with _on_stream(stream):
            staging = _staging(self._host.tensors, n, pinned=self.pinned)
            state_ops.gather_slots(self.device_pool.tensors, src, staging, check=False)
            if src.is_cuda:  # the pinned staging is written asynchronously: wait before reading it here
                torch.cuda.current_stream(src.device).synchronize()
            state_ops.scatter_slots(self._host.tensors, host_slots, staging, check=False)
            event = _record(stream)
        return host_slots, event

    def load(self, host_slots: IndexLike, device_slots: IndexLike, *, stream: object = None) -> object:
        """Copy host slots into ``device_slots`` (allocated by the caller, pairwise); the CUDA event recorded
        after the copy on ``stream`` (None off CUDA or without a stream): wait on it before the forward
        that reads the slots. The host slots keep their backup (free them with :meth:`free`).

        Raises :class:`InvalidIndex` for a host slot not holding a backup, a device slot not allocated, or
        a device slot given twice; :class:`InvalidArgument` for lists of different lengths; then nothing is
        written. O(n * bytes_per_slot)."""
        src = self._host.check_allocated(host_slots)
        dst = self._device_slots(device_slots, "load")
        if src.numel() != dst.numel():
            raise InvalidArgument(
                f"load pairs {src.numel()} host slots with {dst.numel()} device slots; pass one device slot "
                "per host slot"
            )
        if src.numel() == 0:
            return None
        with _on_stream(stream):
            staging = _staging(self._host.tensors, src.numel(), pinned=self.pinned)
            state_ops.gather_slots(self._host.tensors, src, staging, check=False)
            state_ops.scatter_slots(self.device_pool.tensors, dst, staging, check=False)
            return _record(stream)

    def free(self, host_slots: IndexLike) -> None:
        """Return host slots. Raises :class:`InvalidIndex` and frees nothing for a slot that holds no backup
        (a host copy freed twice), out of range or repeated. O(k)."""
        self._host.free(as_index_tensor(host_slots, torch.device("cpu"), "host state slot"))

    def audit(self) -> None:
        """Check the host free list's own consistency (:meth:`MambaPool.audit`). O(size)."""
        self._host.audit()


def _staging(like: list[torch.Tensor], n: int, *, pinned: bool) -> list[torch.Tensor]:
    """Contiguous host blocks ``[L, n, *inner]`` in the dtypes of ``like`` (pinned when asked)."""
    return [
        torch.empty((x.shape[0], n, *x.shape[2:]), dtype=x.dtype, device="cpu", pin_memory=pinned)
        for x in like
    ]


def _on_stream(stream: object) -> contextlib.AbstractContextManager:
    """``torch.cuda.stream(stream)`` for a CUDA stream, a no-op context otherwise."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _record(stream: object) -> object:
    """An event recorded on ``stream`` now (None without one)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event
