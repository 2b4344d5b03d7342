"""The cache's quantized checkpoints (``config.checkpoint_format`` int8 / fp8_e4m3;
``docs/checkpoint-formats.md``): :class:`QuantizedCheckpointCache`, the part of
:class:`~mamba_radix.cache.MambaRadixCache` that stores a request's state into the checkpoint pool and inserts
it. A mixin over the cache's own state (``checkpoint_pool``, None under the ``model`` format; ``mamba_pool``,
``tree``), set up in ``MambaRadixCache.__init__``; the tree decides, this frees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mamba_radix.errors import InvalidIndex, OutOfSlots
from mamba_radix.pools import MambaPool
from mamba_radix.pools.checkpoint_pool import CheckpointPool
from mamba_radix.radix_key import RadixKey

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.cache_results import InsertResult
    from mamba_radix.tree import RadixTree
    from mamba_radix.tree_results import TreeInsert


class QuantizedCheckpointCache:
    """The quantized-checkpoint methods of :class:`~mamba_radix.cache.MambaRadixCache` (see the module
    docstring)."""

    checkpoint_pool: CheckpointPool | None
    mamba_pool: MambaPool
    tree: RadixTree

    def _insert_quantized(
        self, key: RadixKey, kv_indices: torch.Tensor, mamba_slot: int, prev_prefix_len: int
    ) -> tuple[InsertResult, TreeInsert]:
        """:meth:`insert` under a quantized format, for a caller that follows the ``model`` contract (the
        slot becomes the tree's unless ``mamba_exists``): the state is quantized into a free checkpoint
        slot and the caller's state slot freed, unless ``mamba_exists`` (the caller keeps its slot, the
        fresh checkpoint is freed). Like the ``model`` insert it evicts nothing: with no checkpoint slot
        free it raises :class:`~mamba_radix.errors.OutOfSlots`, nothing changed."""
        pool = self.checkpoint_pool
        assert pool is not None
        if not self.mamba_pool.is_slot_allocated(mamba_slot):  # a wrong type is not left to the tree here
            raise InvalidIndex(
                f"state slot {mamba_slot!r} is not an allocated slot; insert only slots from alloc"
            )
        ckpt = pool.store_from(self.mamba_pool, mamba_slot, check=False)  # the caller's slot (checked)
        if ckpt is None:
            raise OutOfSlots(
                f"all {pool.size} checkpoint slots are in use; evict checkpoints first "
                "(cache.evict(num_states=1)) or raise checkpoint_slots"
            )
        try:
            done = self.tree.insert(key, kv_indices, ckpt, prev_prefix_len)
        except BaseException:
            pool.free([ckpt], check=False)  # a refused insert: the fresh checkpoint goes back
            raise
        result = self._settle_insert(done)
        if done.mamba_exists:
            pool.free([ckpt], check=False)  # the tree has this state already: the fresh copy goes
        else:
            self.mamba_pool.free([mamba_slot], check=False)  # consumed, as under "model"
        return result

    def _checkpoint_slots(self) -> MambaPool | CheckpointPool:
        """The pool the tree's checkpoint slots come from (and go back to). O(1)."""
        return self.mamba_pool if self.checkpoint_pool is None else self.checkpoint_pool

    def store_checkpoint(self, src_slot: int) -> int | None:
        """Quantized formats only: quantize state slot ``src_slot`` (the caller's, allocated: trusted) into
        a fresh checkpoint slot, evicting one checkpoint if none is free (SGLang's
        ``_alloc_int8_ckpt_slot``); returns the slot (the caller's until handed to the tree), or ``None``
        with nothing written when none can be had. O(slot elements + log n)."""
        pool = self.checkpoint_pool
        assert pool is not None, "store_checkpoint is for a quantized checkpoint_format"
        ckpt = pool.store_from(self.mamba_pool, src_slot, check=False)
        if ckpt is None:
            self.evict(num_states=1)
            ckpt = pool.store_from(self.mamba_pool, src_slot, check=False)
        return ckpt

    def free_checkpoint(self, ckpt_slot: int) -> None:
        """Return a checkpoint slot :meth:`store_checkpoint` gave and the tree did not take (its insert
        found the state there already). Trusted. O(1)."""
        self._checkpoint_slots().free([ckpt_slot], check=False)
