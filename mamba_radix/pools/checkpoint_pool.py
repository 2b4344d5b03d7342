"""The checkpoint pool: the tree's checkpoints in a quantized storage format, apart from the state pool.

Under ``checkpoint_format="int8"`` or ``"fp8_e4m3"`` (:class:`~mamba_radix.config.CacheConfig`) a running
request's live and track slots stay in the :class:`~mamba_radix.pools.mamba_pool.MambaPool`, in the model's
dtype, and every checkpoint the tree holds is a slot of this pool instead (SGLang's
``MambaCheckpointPool``): :meth:`CheckpointPool.store_from` quantizes a state-pool slot into a checkpoint
slot when a request hands a state to the tree, :meth:`CheckpointPool.load_into` dequantizes one into a
request's slot when a hit restores it. Both go through :mod:`mamba_radix.checkpoint_format` (Triton on
CUDA, the torch reference elsewhere, bit-exact to each other).

Slots are ``1..num_slots`` (slot 0 is reserved, as in the state pool and SGLang's pool), handed out by the
package's free list (:func:`~mamba_radix.pools.free_lists.make_free_list`). Every call validates first: a
refused call raises :class:`~mamba_radix.errors.InvalidIndex` / :class:`~mamba_radix.errors.InvalidArgument`
and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, overload

import torch
from mamba_radix_kernels import quant_naive

from mamba_radix import checkpoint_format
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools._indices import IndexLike, as_index_tensor, check_count, check_fits, check_size
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.mamba_pool import MambaPool

__all__ = ["CheckpointPool", "default_checkpoint_slots"]

# SGLang's default --int8-mamba-ckpt-size: twice the active (state) pool's slots
DEFAULT_SLOTS_PER_STATE_SLOT = 2


def default_checkpoint_slots(state_slots: int) -> int:
    """Checkpoint slots when ``CacheConfig.checkpoint_slots`` is None: ``2 * state_slots`` (SGLang). O(1)."""
    return DEFAULT_SLOTS_PER_STATE_SLOT * state_slots


class CheckpointPool:
    """``num_slots`` checkpoints (slots ``1..num_slots``) of ``mamba_pool``'s layout in format ``fmt``.

    :attr:`storage` is a :class:`~mamba_radix.checkpoint_format.CheckpointStore` of ``num_slots + 1`` slots on
    the state pool's device (row 0 unused); :attr:`total_bytes` is all of it, :attr:`bytes_per_slot` one
    slot's share (``checkpoint_format.bytes_per_slot``). ``backend``: the free list implementation, as for
    :class:`MambaPool` (``"auto"``: the queue on the CPU). ``quant_backend``: the quantize / dequantize
    backend (``None``: :func:`mamba_radix.state_ops.get_backend`). Counters: :attr:`stores`, :attr:`loads`.
    Building it allocates the store: O(num_slots * bytes_per_slot).
    """

    def __init__(
        self,
        mamba_pool: MambaPool,
        fmt: str,
        num_slots: int,
        *,
        backend: str = "auto",
        quant_backend: str | None = None,
    ) -> None:
        checkpoint_format.check_format(fmt)
        if fmt == "model":
            raise InvalidArgument(
                "checkpoint format 'model' keeps checkpoints in the state pool; build a CheckpointPool "
                "only for int8 or fp8_e4m3"
            )
        if not isinstance(mamba_pool, MambaPool):
            raise InvalidArgument(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        self.size = check_size(num_slots, "num_slots")
        self.fmt = fmt
        self.device = mamba_pool.device
        self.quant_backend = quant_backend
        tensors = mamba_pool.tensors
        shapes = [(tuple(t.shape[2:]), t.dtype) for t in tensors]
        self.bytes_per_slot = checkpoint_format.bytes_per_slot(fmt, mamba_pool.num_layers, shapes)
        check_fits(
            self.device, (self.size + 1) * self.bytes_per_slot, f"a checkpoint pool of {num_slots} slots"
        )
        self.storage = checkpoint_format.new_checkpoint_store(fmt, tensors, self.size + 1)
        # the layout is checked once here (dtypes the kernels read, shapes), so that a pool of a layout the
        # formats cannot hold is refused at construction, not at the first hand-over
        quant_naive.check_quant_layout(tensors, self.storage.qs, self.storage.scales)
        self._layout = [(tuple(t.shape), t.dtype) for t in tensors]
        if backend == "auto" and self.device.type == "cpu":
            backend = "fifo"
        self._free_list = make_free_list(self.size, self.device, False, "checkpoint slot", backend)
        self.stores = 0  # checkpoints quantized into this pool
        self.loads = 0  # checkpoints dequantized out of it

    # ------------------------------------------------------------------------------------------ sizes
    def available_size(self) -> int:
        """Free checkpoint slots. O(1)."""
        return self._free_list.available

    @property
    def used(self) -> int:
        """Allocated checkpoint slots."""
        return self.size - self._free_list.available

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole store (quantized values and scales, reserved slot 0 included)."""
        return self.storage.nbytes

    # ------------------------------------------------------------------------------------- alloc/free
    @overload
    def alloc(self, num_slots: int) -> torch.Tensor | None: ...
    @overload
    def alloc(self, num_slots: int, *, as_list: Literal[True]) -> list[int] | None: ...
    def alloc(self, num_slots: int, *, as_list: bool = False) -> torch.Tensor | list[int] | None:
        """``num_slots`` free checkpoint slots, or ``None`` and nothing taken. Contents are stale until a
        :meth:`store`. ``as_list``: as Python ints. O(num_slots)."""
        if type(num_slots) is not int or num_slots < 0:
            check_count(num_slots, "num_slots")
        if as_list:
            return self._free_list.alloc_ints(num_slots)
        return self._free_list.alloc(num_slots)

    def free(self, slots: IndexLike, check: bool = True) -> None:
        """Return checkpoint slots. Raises :class:`InvalidIndex` and frees nothing for slot 0, out-of-range,
        unallocated (a double free) or repeated slots. ``check=False``: trusted callers freeing exactly
        what they allocated (the cache freeing what the tree released); a trusted list is taken as Python
        ints unlooked-at. O(k)."""
        if type(slots) is list and (not check or all(type(s) is int for s in slots)):
            self._free_list.free_ints(slots, check)
            return
        self._free_list.free(as_index_tensor(slots, self.device, "checkpoint slot"), check)

    def undo_alloc(self, slots: torch.Tensor) -> None:
        """Give back the slots the latest :meth:`alloc` returned as if it had not run. O(k)."""
        self._free_list.undo_alloc(as_index_tensor(slots, self.device, "checkpoint slot"))

    def check_allocated(self, slots: IndexLike) -> torch.Tensor:
        """``slots`` as an int64 tensor; raises :class:`InvalidIndex` unless every one is allocated. O(k)."""
        idx = as_index_tensor(slots, self.device, "checkpoint slot")
        self._free_list.check_allocated(idx)
        return idx

    def is_slot_allocated(self, slot: int) -> bool:
        """Whether the single slot ``slot`` is allocated (False for 0, out of range, non-ints). O(1)."""
        return type(slot) is int and self._free_list.is_id_allocated(slot)

    def allocated_slots(self) -> torch.Tensor:
        """Every allocated checkpoint slot, ascending. O(size): for conservation checks."""
        return self._free_list.allocated_ids()

    def audit(self) -> None:
        """The free list's own bookkeeping (free count equals its bitmap's, nothing both free and
        allocated); raises :class:`~mamba_radix.errors.InvariantError`. O(size)."""
        self._free_list.audit()

    def reset(self) -> None:
        """Free every checkpoint slot; the contents stay (the next store overwrites them). O(size)."""
        self._free_list.clear()

    # ------------------------------------------------------------------------------ state movement
    def _check_layout(self, mamba_pool: MambaPool) -> list[torch.Tensor]:
        tensors = mamba_pool.tensors
        if [(tuple(t.shape), t.dtype) for t in tensors] != self._layout:
            raise InvalidArgument(
                "the state pool's tensors differ in shape or dtype from the pool this checkpoint pool was "
                "built for; pass that state pool"
            )
        return tensors

    def store(
        self, mamba_pool: MambaPool, src_slots: IndexLike, ckpt_slots: IndexLike, *, check: bool = True
    ) -> None:
        """Hand-over: quantize state-pool slots ``src_slots`` into checkpoint slots ``ckpt_slots``
        (pairwise). With ``check``: both allocated, equal lengths, no repeated checkpoint slot, the state
        finite; else :class:`InvalidIndex` / :class:`InvalidArgument` and nothing written. ``check=False``:
        the cache's trusted path (its own fresh slot, the request's slot). Side effect: writes the
        checkpoint slots. O(k * slot elements)."""
        tensors = self._check_layout(mamba_pool) if check else mamba_pool.tensors
        if check:
            src = mamba_pool.check_allocated(src_slots)
            dst = self.check_allocated(ckpt_slots)
        else:
            src = torch.as_tensor(src_slots, dtype=torch.int64)
            dst = torch.as_tensor(ckpt_slots, dtype=torch.int64)
        checkpoint_format.quantize_slots(
            tensors, src.view(-1), self.storage, dst.view(-1), check=check, backend=self.quant_backend
        )
        self.stores += dst.numel()

    def load_into(
        self, mamba_pool: MambaPool, ckpt_slots: IndexLike, dst_slots: IndexLike, *, check: bool = True
    ) -> None:
        """Restore: dequantize checkpoint slots ``ckpt_slots`` into state-pool slots ``dst_slots`` in the
        model's dtype (pairwise). With ``check``: both allocated, equal lengths, no repeated destination;
        else a typed error and nothing written. Side effect: overwrites the destination slots.
        O(k * slot elements)."""
        tensors = self._check_layout(mamba_pool) if check else mamba_pool.tensors
        if check:
            src = self.check_allocated(ckpt_slots)
            dst = mamba_pool.check_allocated(dst_slots)
        else:
            src = torch.as_tensor(ckpt_slots, dtype=torch.int64)
            dst = torch.as_tensor(dst_slots, dtype=torch.int64)
        checkpoint_format.dequantize_slots(
            self.storage, src.view(-1), tensors, dst.view(-1), check=check, backend=self.quant_backend
        )
        self.loads += dst.numel()

    def store_from(self, mamba_pool: MambaPool, src_slot: int, *, check: bool = True) -> int | None:
        """Allocate one checkpoint slot and quantize state-pool slot ``src_slot`` into it; returns the
        slot, or ``None`` (nothing taken) when the pool is full (the cache evicts and asks again). A refused
        store gives the slot back. O(slot elements)."""
        if check:
            self._check_layout(mamba_pool)
            if not mamba_pool.is_slot_allocated(src_slot):
                raise InvalidIndex(f"state slot {src_slot!r} is not allocated; store only a slot from alloc")
        slots = self.alloc(1, as_list=True)
        if slots is None:
            return None
        try:
            self.store(mamba_pool, [src_slot], slots, check=check)
        except BaseException:
            self.undo_alloc(torch.tensor(slots, dtype=torch.int64))
            raise
        return slots[0]

    def read(self, ckpt_slot: int, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Checkpoint slot ``ckpt_slot`` dequantized into fresh tensors shaped like one slot of each of
        ``like`` (a state pool's tensors, ``[L, rows, *inner]``), for tests and audits. Read-only. O(slot)."""
        self.check_allocated([ckpt_slot])
        out = []
        for q, s, t in zip(self.storage.qs, self.storage.scales, like, strict=True):
            rows = quant_naive.dequantize_rows_ref(q[:, ckpt_slot], s[:, ckpt_slot], t.dtype)
            out.append(rows.reshape(t.shape[0], *t.shape[2:]))
        return out
