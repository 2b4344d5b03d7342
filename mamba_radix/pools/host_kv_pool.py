"""Host copies of full-attention KV: the KV half of the host tier (issue 25; SGLang's ``HostKVCache``).

A :class:`HostKVPool` holds ``num_tokens`` host KV rows with their own index space (``1..num_tokens``, 0 is
never handed out, as on the device) and free list. With a device KV storage
(:class:`~mamba_radix.pools.MHATokenToKVPool`, :class:`~mamba_radix.pools.MLATokenToKVPool` or a
:class:`~mamba_radix.pools.HybridLinearKVPool`'s full pool) it mirrors every layer's buffers in host memory
(pinned where CUDA is available) and moves the bytes; without one (``storage=None``: a cache on counting
pools, the simulator's) it keeps only the indices, so the tier's accounting is the same either way.

- :meth:`backup` takes host indices and copies device rows into them (device -> host);
- :meth:`load` copies host rows into device rows the caller allocated (host -> device), the host rows
  keeping their copy;
- :meth:`free` returns host indices, exactly once each.

Like the device storage it decides nothing (the host tier's placement does) and validates every argument
before it takes or writes anything.
"""

from __future__ import annotations

import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex, OutOfMemory
from mamba_radix.pools._indices import IndexLike, allocate_tensor, as_index_tensor, check_size
from mamba_radix.pools.cpu_copy import pin_host_copies
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.kv_storage import HybridLinearKVPool, MHATokenToKVPool, MLATokenToKVPool

__all__ = ["HostKVPool"]

KVStorage = MHATokenToKVPool | MLATokenToKVPool | HybridLinearKVPool


def _layer_buffers(storage: KVStorage) -> list[torch.Tensor]:
    """Every per-layer row buffer of a device KV storage (rows on dimension 0)."""
    if isinstance(storage, HybridLinearKVPool):
        storage = storage.full_kv_pool
    if isinstance(storage, MHATokenToKVPool):
        return [*storage.k_buffer, *storage.v_buffer]
    if isinstance(storage, MLATokenToKVPool):
        return list(storage.kv_buffer)
    raise InvalidArgument(
        f"storage must be an MHA, MLA or hybrid KV pool (or None for indices only), got {type(storage).__name__}"
    )


class HostKVPool:
    """``num_tokens`` host KV rows mirroring ``storage`` (see the module docstring).

    Raises :class:`InvalidArgument` for a size that is not a positive int, an unknown storage type, or host
    memory the machine cannot allocate."""

    def __init__(
        self, num_tokens: int, storage: KVStorage | None = None, *, pin_memory: bool | None = None
    ) -> None:
        self.size = check_size(num_tokens, "host KV tokens")
        self.storage = storage
        self.pinned = pin_host_copies() if pin_memory is None else bool(pin_memory)
        device_buffers = [] if storage is None else _layer_buffers(storage)
        self._device_buffers = device_buffers
        # row 0 is never handed out (the free list's ids are 1..size): the buffers have size + 1 rows
        self._buffers = [
            allocate_tensor(
                "a host KV buffer",
                torch.zeros,
                (self.size + 1, *b.shape[1:]),
                dtype=b.dtype,
                device="cpu",
                pin_memory=self.pinned,
            )
            for b in device_buffers
        ]
        self.bytes_per_token = sum(b[0].numel() * b.element_size() for b in self._buffers)
        self._free_list = make_free_list(self.size, torch.device("cpu"), False, "host KV index")

    # ----------------------------------------------------------------------------------------- sizes
    def available_size(self) -> int:
        """Free host KV rows. O(1)."""
        return self._free_list.available

    @property
    def used(self) -> int:
        """Host KV rows holding a backup."""
        return self.size - self._free_list.available

    @property
    def total_bytes(self) -> int:
        """Host bytes of every buffer (0 for an index-only pool)."""
        return sum(b.numel() * b.element_size() for b in self._buffers)

    def is_allocated(self, host_indices: IndexLike) -> torch.Tensor:
        """Bool mask over ``host_indices``: holding a backup or not. O(k)."""
        return self._free_list.is_allocated(self._host_index(host_indices))

    def allocated_indices(self) -> torch.Tensor:
        """Every host index holding a backup, ascending. O(size): for conservation checks."""
        return self._free_list.allocated_ids()

    # -------------------------------------------------------------------------------------- transfers
    @staticmethod
    def _host_index(indices: IndexLike) -> torch.Tensor:
        return as_index_tensor(indices, torch.device("cpu"), "host KV index")

    def _device_rows(self, indices: IndexLike, *, load: bool) -> torch.Tensor:
        """``indices`` as device rows (checked against the storage's rows; distinct for a load)."""
        if self.storage is None:
            idx = as_index_tensor(indices, torch.device("cpu"), "KV index")
            if load and idx.numel() > 1 and torch.unique(idx).numel() != idx.numel():
                raise InvalidIndex("a KV index occurs twice in one load; pass each index once")
            return idx
        return self.storage._copy_indices(indices, load)

    def backup(self, device_indices: IndexLike) -> torch.Tensor:
        """Copy the device KV rows ``device_indices`` into newly taken host rows; the host indices, host row
        ``i`` holding device row ``i``. The copy is complete when this returns (a device-to-host copy into
        pinned memory is synchronised), so the device rows may be freed right after.

        Raises :class:`OutOfMemory` when fewer host rows are free than asked for, :class:`InvalidIndex` for a
        device index outside the storage's rows; then nothing is taken or written. O(n * bytes_per_token)."""
        src = self._device_rows(device_indices, load=False)
        n = src.numel()
        if n > self._free_list.available:
            raise OutOfMemory(
                f"backup of {n} KV tokens needs {n} free host KV rows, {self._free_list.available} are free; "
                "free host backups first or size the host KV pool larger"
            )
        dst = self._free_list.alloc(n)
        for host, dev in zip(self._buffers, self._device_buffers, strict=True):
            host.index_copy_(0, dst, dev.index_select(0, src.to(dev.device)).to("cpu"))
        return dst

    def load(self, host_indices: IndexLike, device_indices: IndexLike) -> None:
        """Copy host rows into the device rows ``device_indices`` (allocated by the caller, pairwise). The
        host rows keep their copy (free them with :meth:`free`). On CUDA the copy is queued on the current
        stream (the forward that reads the rows runs after it on that stream).

        Raises :class:`InvalidIndex` for a host index holding no backup, a device index outside the rows or
        given twice; :class:`InvalidArgument` for lists of different lengths; then nothing is written.
        O(n * bytes_per_token)."""
        src = self._host_index(host_indices)
        self._free_list.check_allocated(src)
        dst = self._device_rows(device_indices, load=True)
        if src.numel() != dst.numel():
            raise InvalidArgument(
                f"load pairs {src.numel()} host KV rows with {dst.numel()} device rows; pass one device index "
                "per host index"
            )
        for host, dev in zip(self._buffers, self._device_buffers, strict=True):
            rows = host.index_select(0, src)
            dev.index_copy_(0, dst.to(dev.device), rows.to(dev.device, non_blocking=self.pinned))

    def free(self, host_indices: IndexLike) -> None:
        """Return host rows. Raises :class:`InvalidIndex` and frees nothing for an index that holds no backup
        (a host copy freed twice), out of range or repeated. O(k)."""
        self._free_list.free(self._host_index(host_indices), True)

    def audit(self) -> None:
        """Check the host free list's own consistency. O(size)."""
        self._free_list.audit()
