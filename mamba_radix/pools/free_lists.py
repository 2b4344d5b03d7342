"""The one place a pool gets its free list: :func:`make_free_list` picks the implementation once, at
construction.

- ``"auto"`` (the default): :class:`~.host_free_list.HostFreeList` on the CPU (numpy views, the cheap calls
  for small arrays), :class:`~.free_list.FreeList` elsewhere (plain torch, no host sync in ``alloc``).
  :class:`~.mamba_pool.MambaPool` asks for ``"fifo"`` on the CPU itself.
- ``"torch"``: the reference :class:`~.free_list.FreeList` on any device (tests run it on the CPU to cover
  the GPU path).
- ``"host"``: :class:`~.host_free_list.HostFreeList`, CPU only.
- ``"fifo"``: :class:`~.fifo_free_list.FifoFreeList`, CPU only and without ``need_sort``.

Every choice hands out the same ids in the same order; only the cost differs.
"""

from __future__ import annotations

import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.pools.fifo_free_list import FifoFreeList
from mamba_radix.pools.free_list import FreeList
from mamba_radix.pools.host_free_list import HostFreeList

__all__ = ["make_free_list"]


def make_free_list(
    num_ids: int, device: torch.device, need_sort: bool, what: str, backend: str = "auto"
) -> FreeList:
    """A free list for ``device``: :class:`HostFreeList` on CPU, :class:`FreeList` elsewhere.

    ``backend="torch"`` forces the device implementation (tests run it on CPU to cover the GPU path);
    ``"host"`` forces the numpy one (CPU only); ``"fifo"`` the queue (CPU, without ``need_sort``; the state
    pool's choice on the CPU, see :class:`FifoFreeList`).
    """
    if backend == "auto":
        backend = "host" if device.type == "cpu" else "torch"
    if backend == "host":
        return HostFreeList(num_ids, device, need_sort, what)
    if backend == "torch":
        return FreeList(num_ids, device, need_sort, what)
    if backend == "fifo":
        if need_sort:
            raise InvalidArgument("backend='fifo' keeps ids in the order they were freed; it cannot sort")
        return FifoFreeList(num_ids, device, what)
    raise InvalidArgument(f"backend must be 'auto', 'host', 'torch' or 'fifo', got {backend!r}")
