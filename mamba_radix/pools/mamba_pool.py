"""Recurrent-state slots of the linear-attention layers (``reference/sglang-semantics.md`` §6.1).

One slot holds, for every linear layer, each conv window (``conv[j][layer, slot]``, several conv tensors
for models with separate q/k/v convs) and the temporal/SSM state (``temporal[layer, slot]``). Slot 0 is
the padding sink that padded batch entries read and write. Conv and temporal tensors may each have their
own dtype (bf16 conv with fp32 SSM state is typical).

State movement between slots goes through :mod:`mamba_radix.state_ops` (Triton on CUDA, torch
otherwise); this pool validates its slot arguments first, so a refused call writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, overload

import torch

from mamba_radix import state_ops
from mamba_radix.errors import InvalidArgument
from mamba_radix.native import compiled_paths_enabled
from mamba_radix.pools._indices import (
    IndexLike,
    allocate_tensor,
    as_index_tensor,
    check_count,
    check_fits,
    check_size,
    resolve_device,
)
from mamba_radix.pools.cpu_copy import MambaCpuCopy, check_copied_tensor, gather_to_host, synchronize
from mamba_radix.pools.free_lists import make_free_list

__all__ = ["MambaPool", "compiled_copy_row"]

try:  # the compiled slot copy: optional (setup.py builds it where a C compiler is found)
    from mamba_radix._cstate import copy_row as _c_copy_row
except ImportError:  # not built (no compiler at install time) or built for another Python
    _c_copy_row = None

# copy_row(byte_buffers, src_slot, dst_slot) -> bool: True when it copied, False to hand the copy back to
# the reference (a view outside its contract)
CopyRow = Callable[[list[memoryview], int, int], bool]


def compiled_copy_row(compiled: bool | None = None) -> CopyRow | None:
    """The compiled one-slot copy a new pool uses, or None for the reference alone: the compiled copy
    when it was built and ``compiled`` (None: :func:`mamba_radix.native.compiled_paths_enabled`, read
    now). Read at each pool's construction, never on the copy path. O(1)."""
    if compiled is None:
        compiled = compiled_paths_enabled()
    return _c_copy_row if compiled else None


def _check_shape(shape: object, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or not shape:
        raise InvalidArgument(f"{what} must be a non-empty tuple of positive ints, got {shape!r}")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidArgument(f"{what} must be a non-empty tuple of positive ints, got {shape!r}")
    return tuple(shape)


def _check_dtype(dtype: object, what: str) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidArgument(f"{what} must be a floating torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    return dtype


class MambaPool:
    """``size`` state slots (``1..size``) of ``num_layers`` linear layers on ``device``.

    ``conv[j]`` is ``[num_layers, size + 1, *conv_shapes[j]]`` in ``conv_dtypes[j]``; ``temporal`` is
    ``[num_layers, size + 1, *temporal_shape]`` in ``temporal_dtype``. ``bytes_per_slot`` is exact: the
    bytes one slot occupies over all layers, conv and temporal (``conv_bytes_per_slot`` +
    ``temporal_bytes_per_slot``). Slot handling is O(k) per call; the free list never sorts.
    ``backend``: the free list implementation, as for :class:`TokenToKVPoolAllocator`, plus ``"fifo"``
    (:class:`~mamba_radix.pools.fifo_free_list.FifoFreeList`), which ``"auto"`` picks on the CPU.
    ``compiled_copy``: whether :meth:`copy_slot` may use the compiled copy (None: ``MAMBA_RADIX_C``,
    :func:`compiled_copy_row`); chosen once here, so the copy path tests nothing global.
    """

    def __init__(
        self,
        size: int,
        num_layers: int,
        conv_shapes: Sequence[tuple[int, ...]],
        temporal_shape: tuple[int, ...],
        conv_dtypes: torch.dtype | Sequence[torch.dtype] = torch.bfloat16,
        temporal_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        backend: str = "auto",
        *,
        compiled_copy: bool | None = None,
    ) -> None:
        self.size = check_size(size, "size")
        self.num_layers = check_size(num_layers, "num_layers")
        self.device = resolve_device(device)
        if not isinstance(conv_shapes, (list, tuple)) or not conv_shapes:
            raise InvalidArgument(f"conv_shapes must be a non-empty list of shapes, got {conv_shapes!r}")
        self.conv_shapes = [_check_shape(s, f"conv_shapes[{j}]") for j, s in enumerate(conv_shapes)]
        self.temporal_shape = _check_shape(temporal_shape, "temporal_shape")
        if isinstance(conv_dtypes, torch.dtype):
            conv_dtypes = [conv_dtypes] * len(self.conv_shapes)
        if not isinstance(conv_dtypes, (list, tuple)):
            raise InvalidArgument(
                f"conv_dtypes must be a torch.dtype or a list of them, got {type(conv_dtypes).__name__}"
            )
        if len(conv_dtypes) != len(self.conv_shapes):
            raise InvalidArgument(
                f"conv_dtypes has {len(conv_dtypes)} entries but conv_shapes has {len(self.conv_shapes)}; "
                "give one dtype per conv tensor, or a single dtype for all"
            )
        self.conv_dtypes = [_check_dtype(d, f"conv_dtypes[{j}]") for j, d in enumerate(conv_dtypes)]
        self.temporal_dtype = _check_dtype(temporal_dtype, "temporal_dtype")

        rows = self.size + 1  # + the padding sink, slot 0
        item = lambda dtype: torch.empty(0, dtype=dtype).element_size()  # noqa: E731
        total = (
            rows
            * self.num_layers
            * (
                sum(
                    math.prod(sh) * item(dt)
                    for sh, dt in zip(self.conv_shapes, self.conv_dtypes, strict=True)
                )
                + math.prod(self.temporal_shape) * item(self.temporal_dtype)
            )
        )
        check_fits(self.device, total, f"a state pool of {size} slots")
        self._byte_views: list | None = None  # CPU: numpy uint8 views of the tensors (see _host_byte_views)
        self._byte_buffers: list[memoryview] | None = None  # the same views as memoryviews (set together)
        self._copy_row = compiled_copy_row(compiled_copy)  # None: the reference copy only
        self.conv = [
            allocate_tensor(
                "the conv state",
                torch.zeros,
                (self.num_layers, rows, *shape),
                dtype=dtype,
                device=self.device,
            )
            for shape, dtype in zip(self.conv_shapes, self.conv_dtypes, strict=True)
        ]
        self.temporal = allocate_tensor(
            "the temporal state",
            torch.zeros,
            (self.num_layers, rows, *self.temporal_shape),
            dtype=self.temporal_dtype,
            device=self.device,
        )
        self.conv_bytes_per_slot = self.num_layers * sum(
            math.prod(shape) * item(dtype)
            for shape, dtype in zip(self.conv_shapes, self.conv_dtypes, strict=True)
        )
        self.temporal_bytes_per_slot = (
            self.num_layers * math.prod(self.temporal_shape) * item(self.temporal_dtype)
        )
        self.bytes_per_slot = self.conv_bytes_per_slot + self.temporal_bytes_per_slot
        if backend == "auto" and self.device.type == "cpu":
            backend = "fifo"  # the queue: its order is the numpy list's, without its merges
        self._free_list = make_free_list(self.size, self.device, False, "state slot", backend)

    # The state tensors are properties so that replacing one (a pool that reallocates on reset) drops the
    # byte views built over the old ones; ``conv`` is a tuple, so no item can be replaced unseen.
    @property
    def conv(self) -> tuple[torch.Tensor, ...]:
        """The conv state tensors, one per conv shape (a tuple: assign a new sequence to replace them)."""
        return self._conv

    @conv.setter
    def conv(self, tensors: Sequence[torch.Tensor]) -> None:
        self._conv = tuple(tensors)
        self._byte_views = self._byte_buffers = None

    @property
    def temporal(self) -> torch.Tensor:
        """The temporal (SSM) state tensor."""
        return self._temporal

    @temporal.setter
    def temporal(self, tensor: torch.Tensor) -> None:
        self._temporal = tensor
        self._byte_views = self._byte_buffers = None

    def _host_byte_views(self) -> list | None:
        """numpy ``uint8`` views sharing memory with the CPU state tensors, one per tensor: ``[rows,
        bytes]`` for a single layer, else ``[layers, rows, bytes]``, built once per set of tensors (with
        :attr:`_byte_buffers`, the same as memoryviews); ``None`` off the CPU or for a tensor that is not
        dense. A slot copy through them is one memcpy per tensor (~0.4 us) where a torch index copy costs
        ~10 us on these tiny tensors. O(1) once built, O(tensors) to build."""
        if self._byte_views is not None:
            return self._byte_views
        tensors = self.tensors
        if self.device.type != "cpu" or not all(t.is_contiguous() for t in tensors):
            return None
        views = []
        for t in tensors:
            v = t.view(torch.uint8).view(t.shape[0], t.shape[1], -1).numpy()
            views.append(v[0] if t.shape[0] == 1 else v)
        # the same memory as memoryviews, for the compiled copy: exporting a memoryview's buffer is a
        # struct copy in CPython's core, where numpy's export runs numpy code (~2 us more with cold caches)
        self._byte_views, self._byte_buffers = views, [memoryview(v) for v in views]
        return views

    # ----------------------------------------------------------------------------------------- sizes
    @property
    def tensors(self) -> list[torch.Tensor]:
        """``[*conv, temporal]``: the list every :mod:`mamba_radix.state_ops` function takes."""
        return [*self.conv, self.temporal]

    def available_size(self) -> int:
        """Free slots. O(1)."""
        return self._free_list.available

    @property
    def used(self) -> int:
        """Allocated slots."""
        return self.size - self._free_list.available

    @property
    def total_bytes(self) -> int:
        """Bytes of every state tensor, padding slot included."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    # ------------------------------------------------------------------------------------- alloc/free
    @overload
    def alloc(self, num_slots: int) -> torch.Tensor | None: ...
    @overload
    def alloc(self, num_slots: int, *, as_list: Literal[True]) -> list[int] | None: ...
    def alloc(self, num_slots: int, *, as_list: bool = False) -> torch.Tensor | list[int] | None:
        """``num_slots`` free slots (int64 tensor), or ``None`` and nothing taken. Contents are stale:
        clear them if the request starts from an empty state. O(num_slots).

        ``as_list=True``: the same slots as a list of Python ints (the pool's state after is the same;
        :meth:`undo_alloc` takes them as a tensor). On a CPU pool no tensor is built: ~0.5 us for one
        slot where ``alloc(1).tolist()`` costs ~2.5 us. One method for both forms, so that every slot
        allocation passes through this one call (the fault-injection tests wrap it)."""
        if type(num_slots) is not int or num_slots < 0:  # the common case without a call
            check_count(num_slots, "num_slots")
        if as_list:
            return self._free_list.alloc_ints(num_slots)
        return self._free_list.alloc(num_slots)

    def free(self, slots: IndexLike, check: bool = True) -> None:
        """Return slots. Raises :class:`~mamba_radix.errors.InvalidIndex` and frees nothing for slot 0,
        out-of-range, unallocated or repeated slots (one fused check, one host sync on a GPU). O(k).
        ``check=False``: trusted callers freeing exactly what ``alloc`` returned skip the check; a bad
        slot then corrupts the pool silently: a trusted list is taken as Python ints unlooked-at (the
        tree's released checkpoints, one call per eviction)."""
        # no tensor round trip for a list of ints; a trusted one is not scanned for their type
        if type(slots) is list and (not check or all(type(s) is int for s in slots)):
            self._free_list.free_ints(slots, check)
            return
        self._free_list.free(as_index_tensor(slots, self.device, "state slot"), check)

    def check_allocated(self, slots: IndexLike) -> torch.Tensor:
        """``slots`` as an int64 tensor; raises :class:`~mamba_radix.errors.InvalidIndex` unless every
        slot is in range and allocated. O(k)."""
        idx = as_index_tensor(slots, self.device, "state slot")
        self._free_list.check_allocated(idx)
        return idx

    # ---------------------------------------------------------------------------------- state movement
    def copy_from(self, src_slots: IndexLike, dst_slots: IndexLike, check: bool = True) -> None:
        """``state[dst[i]] = state[src[i]]`` over every layer, conv and temporal.

        Both sides must be allocated, of equal length, ``dst`` without repeats. Side effect: overwrites
        the destination slots. O(k * bytes_per_slot). ``check=False`` is for trusted callers (the cache
        copying a checkpoint it holds into a slot it just allocated): no allocation, repeat or range
        checks, no host sync.
        """
        if not check:
            if type(src_slots) is list and type(dst_slots) is list and len(src_slots) == len(dst_slots) == 1:
                # the class's copy_slot, not an override: a subclass counting copy_from's copies counts once
                MambaPool.copy_slot(self, src_slots[0], dst_slots[0])
                return
            src_t = torch.as_tensor(src_slots, dtype=torch.int64, device=self.device)
            dst_t = torch.as_tensor(dst_slots, dtype=torch.int64, device=self.device)
            state_ops.copy_slots(self.tensors, src_t, dst_t, check=False)
            return
        src = self.check_allocated(src_slots)
        dst = self.check_allocated(dst_slots)
        if src.numel() != dst.numel():
            raise InvalidArgument(
                f"copy_from got {src.numel()} source and {dst.numel()} destination slots; pass equal lengths"
            )
        self._free_list.check_unique(dst, "a destination may be written once per copy")
        if dst.numel():
            state_ops.copy_slots(self.tensors, src, dst)

    def copy_slot(self, src_slot: int, dst_slot: int) -> None:
        """``state[dst_slot] = state[src_slot]``, trusted: two host ints, both allocated (the cache copying
        a checkpoint it holds into a slot it just allocated, or the reverse at a hand-over). No checks,
        no host sync: a bad slot corrupts the state silently (use :meth:`copy_from` to have it checked).
        On the CPU one memcpy per tensor and layer in C (``mamba_radix/_cstate.c``); otherwise (not built,
        off the CPU, or switched off when the pool was built: ``compiled_copy=False`` or
        ``MAMBA_RADIX_C=0``) :mod:`~mamba_radix.state_ops`' trusted path, the reference.
        Side effect: overwrites ``dst_slot``. O(bytes_per_slot)."""
        buffers = self._byte_buffers
        if buffers is None and self._host_byte_views() is not None:  # built once per set of tensors
            buffers = self._byte_buffers
        copy_row = self._copy_row
        if buffers is not None and copy_row is not None and copy_row(buffers, src_slot, dst_slot):
            return
        state_ops.copy_slots(
            self.tensors, [src_slot], [dst_slot], check=False, host_views=self._host_byte_views()
        )

    def fork(self, src_slot: int, num_slots: int) -> torch.Tensor | None:
        """Allocate ``num_slots`` slots holding copies of ``src_slot``, or ``None`` and nothing taken.

        ``src_slot`` must be allocated. Side effect: allocates and writes the new slots. Transactional:
        should the copy raise, the slots are given back (:meth:`FreeList.undo_alloc`) before it propagates.
        """
        check_count(num_slots, "num_slots")
        src = self.check_allocated(src_slot)
        if src.numel() != 1:
            raise InvalidArgument(f"fork takes one source slot, got {src.numel()}")
        dst = None if num_slots > self.available_size() else self._free_list.alloc(num_slots)
        if dst is None or num_slots == 0:
            return dst
        try:
            state_ops.fork_slots(self.tensors, int(src[0]), dst)
        except BaseException:
            self._free_list.undo_alloc(dst)
            raise
        return dst

    def clear_slots(self, slots: IndexLike) -> None:
        """Zero every layer's conv windows and temporal state of allocated ``slots``. O(k * bytes)."""
        idx = self.check_allocated(slots)
        if idx.numel() == 0:
            return
        for t in self.tensors:
            t[:, idx] = 0

    def clear(self, slots: IndexLike | None = None) -> None:
        """With ``slots``: zero those slots (see :meth:`clear_slots`). Without: free every slot
        (:meth:`reset`)."""
        if slots is None:
            self.reset()
        else:
            self.clear_slots(slots)

    def reset(self) -> None:
        """Free every slot; the contents stay (a new owner clears or overwrites them). O(size)."""
        self._free_list.clear()

    # ----------------------------------------------------------------------------------- inspection
    def audit(self) -> None:
        """Check the pool's own bookkeeping (:meth:`~mamba_radix.pools.free_list.FreeList.audit`): the
        free count equals the bitmap's, and no slot is both free and allocated. Raises
        :class:`~mamba_radix.errors.InvariantError`. O(size)."""
        self._free_list.audit()

    def is_slot_allocated(self, slot: int) -> bool:
        """Whether the single slot ``slot`` (a Python int) is allocated; False for 0, out-of-range slots
        and non-ints. O(1), builds no tensor: the cheap test for ownership checks."""
        return type(slot) is int and self._free_list.is_id_allocated(slot)

    def undo_alloc(self, slots: torch.Tensor) -> None:
        """Give back the slots the most recent :meth:`alloc` returned as if it had not run (the next
        ``alloc`` returns them again, in order): for a transactional caller whose later step failed.
        O(k). See :meth:`~mamba_radix.pools.free_list.FreeList.undo_alloc`."""
        self._free_list.undo_alloc(as_index_tensor(slots, self.device, "state slot"))

    def is_allocated(self, slots: IndexLike) -> torch.Tensor:
        """Bool mask over ``slots``: allocated or not (0 and out-of-range read as not). O(k)."""
        return self._free_list.is_allocated(as_index_tensor(slots, self.device, "state slot"))

    def allocated_slots(self) -> torch.Tensor:
        """Every allocated slot, ascending. O(size): for conservation checks."""
        return self._free_list.allocated_ids()

    # ------------------------------------------------------------------------------ host copies
    def get_cpu_copy(self, slots: IndexLike) -> MambaCpuCopy:
        """The state of allocated ``slots`` (every layer, each conv tensor and the temporal state) as
        fresh host tensors, for a scheduler that retracts a request (SGLang's call of this name): a
        :class:`~mamba_radix.pools.cpu_copy.MambaCpuCopy` ``(conv, temporal)``, position ``i`` of
        dimension 1 holding ``slots[i]``. Pinned memory where CUDA is available. Raises
        :class:`~mamba_radix.errors.InvalidIndex` for a slot not allocated. The pool is unchanged (free
        the slots afterwards if the request gives them up). Waits for the device. O(k * bytes_per_slot).
        """
        idx = self.check_allocated(slots)
        conv = [gather_to_host(t, 1, idx) for t in self.conv]
        temporal = gather_to_host(self.temporal, 1, idx)
        synchronize(self.device)  # the transfers into pinned memory are asynchronous
        return MambaCpuCopy(conv, temporal)

    def check_cpu_copy(self, copy: object, slots: IndexLike) -> torch.Tensor:
        """Raise what :meth:`load_cpu_copy` would raise for these arguments, else return ``slots`` as an
        index tensor: every slot allocated and none repeated (:class:`~mamba_radix.errors.InvalidIndex`),
        ``copy`` a ``(conv, temporal)`` pair of this pool's conv count, shapes (for ``len(slots)`` slots)
        and exact dtypes (:class:`InvalidArgument`). No side effects. O(k)."""
        idx = self.check_allocated(slots)
        self._free_list.check_unique(idx, "a slot may be loaded once per copy")
        if not isinstance(copy, (tuple, list)) or len(copy) != 2:
            raise InvalidArgument(
                f"a state copy is the (conv, temporal) pair get_cpu_copy returns, got {type(copy).__name__}"
                + (f" of length {len(copy)}" if isinstance(copy, (tuple, list)) else "")
            )
        conv, temporal = copy
        if not isinstance(conv, (tuple, list)) or len(conv) != len(self.conv):
            got = f"{len(conv)} tensors" if isinstance(conv, (tuple, list)) else type(conv).__name__
            raise InvalidArgument(
                f"the copy's conv part must list {len(self.conv)} tensors (one per conv tensor of this "
                f"pool), got {got}; load a copy made by a pool with the same conv tensors"
            )
        k = idx.numel()
        for j, (tensor, shape, dtype) in enumerate(
            zip(conv, self.conv_shapes, self.conv_dtypes, strict=True)
        ):
            check_copied_tensor(tensor, (self.num_layers, k, *shape), dtype, f"conv[{j}] of the copy")
        check_copied_tensor(
            temporal, (self.num_layers, k, *self.temporal_shape), self.temporal_dtype, "temporal of the copy"
        )
        return idx

    def load_cpu_copy(self, copy: MambaCpuCopy | tuple | list, slots: IndexLike) -> None:
        """Write a copy :meth:`get_cpu_copy` made into allocated ``slots`` (position ``i`` of the copy
        into ``slots[i]``; the slots may differ from those copied, and may be of another pool of the same
        layers, shapes and dtypes). Validated whole first (:meth:`check_cpu_copy`): on refusal nothing is
        written. Side effect: overwrites every layer's state of ``slots``; the copy is not changed. Waits
        for the device. O(k * bytes_per_slot)."""
        idx = self.check_cpu_copy(copy, slots)
        if idx.numel() == 0:
            return
        conv, temporal = copy
        for tensor, source in zip(self.conv, conv, strict=True):
            tensor.index_copy_(1, idx, source.to(self.device, non_blocking=True))
        self.temporal.index_copy_(1, idx, temporal.to(self.device, non_blocking=True))
        synchronize(self.device)  # the host tensors may be dropped once this returns
