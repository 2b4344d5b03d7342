"""Full-attention KV storage, indexed by the KV indices the token allocators hand out (seed 003 §2, §8.4).

- :class:`MHATokenToKVPool`: per layer a key and a value buffer ``[size + page_size, head_num, head_dim]``.
- :class:`MLATokenToKVPool`: per layer one latent buffer ``[size + page_size, 1, kv_lora_rank +
  qk_rope_head_dim]`` (the compressed KV and the rope key, as MLA stores them).
- :class:`HybridLinearKVPool`: a hybrid model's view: global layer ids of full-attention layers map to the
  full KV pool, those of linear layers to the :class:`~mamba_radix.pools.MambaPool`.

Row 0 (page 0 when paged) is padding: writes of a padded batch land there, so ``loc`` may contain 0.
Buffers are allocated once; writes are O(tokens written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools._indices import (
    IndexLike,
    allocate_tensor,
    as_index_tensor,
    check_fits,
    check_in_range,
    check_size,
    resolve_device,
)
from mamba_radix.pools.cpu_copy import (
    HybridCpuCopy,
    check_copied_tensor,
    gather_to_host,
    synchronize,
)
from mamba_radix.pools.mamba_pool import MambaPool

__all__ = ["HybridLinearKVPool", "LinearLayerCache", "MHATokenToKVPool", "MLATokenToKVPool"]


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


class _TokenKVStorage:
    """Shared sizing, layer lookup and write validation of the per-layer KV buffers."""

    def __init__(
        self, size: int, page_size: int, dtype: torch.dtype, layer_num: int, device: str | torch.device
    ) -> None:
        self.size = check_size(size, "size")
        self.page_size = check_size(page_size, "page_size")
        self.layer_num = check_size(layer_num, "layer_num")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InvalidArgument(
                f"dtype must be a floating torch.dtype (e.g. torch.bfloat16), got {dtype!r}"
            )
        self.dtype = dtype
        self.device = resolve_device(device)
        self.num_rows = size + page_size  # + the padding row / page

    def _layer(self, layer_id: int) -> int:
        if isinstance(layer_id, bool) or not isinstance(layer_id, int) or not 0 <= layer_id < self.layer_num:
            raise InvalidArgument(
                f"layer_id {layer_id!r} is out of range; this pool has layers 0..{self.layer_num - 1}"
            )
        return layer_id

    def _loc(self, loc: IndexLike) -> torch.Tensor:
        idx = as_index_tensor(loc, self.device, "loc")
        bad = (idx < 0) | (idx >= self.num_rows)
        if idx.numel() and bool(bad.any()):
            raise InvalidArgument(f"loc {int(idx[bad][0])} is out of range; rows are 0..{self.num_rows - 1}")
        return idx

    def _values(
        self, values: torch.Tensor, num_tokens: int, row_shape: tuple[int, ...], what: str
    ) -> torch.Tensor:
        if not isinstance(values, torch.Tensor) or not values.dtype.is_floating_point:
            raise InvalidArgument(
                f"{what} must be a floating tensor, got {getattr(values, 'dtype', type(values))}"
            )
        if tuple(values.shape) != (num_tokens, *row_shape):
            raise InvalidArgument(
                f"{what} must have shape {(num_tokens, *row_shape)}, got {tuple(values.shape)}"
            )
        if values.device != self.device:
            raise InvalidArgument(f"{what} is on {values.device} but the pool lives on {self.device}")
        return values.to(self.dtype)

    # ------------------------------------------------------------------------------ host copies
    # Tokens per chunk of a host copy (SGLang's name and default): a copy moves at most this many rows of
    # one layer at a time, which bounds the device memory one gather takes. A copy is cut by the chunk
    # size of the pool that made it; load it into a pool with the same chunk size.
    cpu_offloading_chunk_size: int = 8192

    def _copy_indices(self, indices: IndexLike, load: bool) -> torch.Tensor:
        """``indices`` as an index tensor of rows outside the padding (``page_size..num_rows - 1``),
        without repeats when ``load`` (a row may be written once per copy), else
        :class:`~mamba_radix.errors.InvalidIndex`. O(k) (O(k log k) with the repeat check)."""
        idx = as_index_tensor(indices, self.device, "KV index")
        check_in_range(idx, self.page_size, self.num_rows - 1, "KV index")
        if load and idx.numel() > 1 and torch.unique(idx).numel() != idx.numel():
            raise InvalidIndex(
                "a KV index occurs twice in one load (a row may be written once per copy); "
                "pass each index once"
            )
        return idx

    def _chunk_bounds(self, num_tokens: int) -> list[tuple[int, int]]:
        """``[start, end)`` of each chunk of a copy of ``num_tokens`` tokens. O(chunks)."""
        step = check_size(self.cpu_offloading_chunk_size, "cpu_offloading_chunk_size")
        return [(start, min(start + step, num_tokens)) for start in range(0, num_tokens, step)]

    def _copy_layers(self, copy: object, num_chunks: int) -> list:
        """The copy's per-layer chunk lists after checking their counts (one list per layer, ``num_chunks``
        chunks each), else :class:`InvalidArgument`. O(layers)."""
        if not isinstance(copy, (list, tuple)) or len(copy) != self.layer_num:
            got = f"{len(copy)} layers" if isinstance(copy, (list, tuple)) else type(copy).__name__
            raise InvalidArgument(
                f"a KV copy lists one entry per layer ({self.layer_num} here), got {got}; load a copy made "
                "by get_cpu_copy of a pool with the same layers"
            )
        for layer, chunks in enumerate(copy):
            if not isinstance(chunks, (list, tuple)) or len(chunks) != num_chunks:
                got = f"{len(chunks)} chunks" if isinstance(chunks, (list, tuple)) else type(chunks).__name__
                raise InvalidArgument(
                    f"layer {layer} of the KV copy has {got}, but this pool cuts the indices given into "
                    f"{num_chunks} (cpu_offloading_chunk_size={self.cpu_offloading_chunk_size}); pass as many "
                    "indices as were copied, to a pool with the chunk size of the one that made the copy"
                )
        return list(copy)


class MHATokenToKVPool(_TokenKVStorage):
    """Keys and values of ``layer_num`` full-attention layers: ``k_buffer[l]`` and ``v_buffer[l]`` are
    ``[size + page_size, head_num, head_dim]`` in ``dtype``."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, device)
        self.head_num = check_size(head_num, "head_num")
        self.head_dim = check_size(head_dim, "head_dim")
        shape = (self.num_rows, head_num, head_dim)
        check_fits(
            self.device,
            2 * layer_num * self.num_rows * head_num * head_dim * _element_size(dtype),
            "the KV buffers",
        )
        self.k_buffer = [
            allocate_tensor("the key buffer", torch.zeros, shape, dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]
        self.v_buffer = [
            allocate_tensor("the value buffer", torch.zeros, shape, dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        """Exact bytes one token occupies over all layers, keys and values."""
        return self.layer_num * 2 * self.head_num * self.head_dim * _element_size(self.dtype)

    def get_kv_size_bytes(self) -> int:
        """Bytes of every buffer, padding rows included."""
        return sum(t.numel() * t.element_size() for t in [*self.k_buffer, *self.v_buffer])

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[self._layer(layer_id)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[self._layer(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer_id: int, loc: IndexLike, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """``k_buffer[layer][loc] = cache_k`` and the same for values (cast to the pool dtype).
        ``cache_k`` / ``cache_v``: ``[len(loc), head_num, head_dim]``. Validates before writing."""
        layer = self._layer(layer_id)
        idx = self._loc(loc)
        row = (self.head_num, self.head_dim)
        k = self._values(cache_k, idx.numel(), row, "cache_k")
        v = self._values(cache_v, idx.numel(), row, "cache_v")
        self.k_buffer[layer][idx] = k
        self.v_buffer[layer][idx] = v

    def get_cpu_copy(self, indices: IndexLike) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Keys and values at KV ``indices``, every layer, as fresh host tensors (pinned where CUDA is
        available), for a scheduler that retracts a request (SGLang's call and form):
        ``copy[layer][chunk] = (k, v)``, each ``[chunk tokens, head_num, head_dim]``, the indices cut in
        order into chunks of :attr:`cpu_offloading_chunk_size`. Raises
        :class:`~mamba_radix.errors.InvalidIndex` for a padding or out-of-range index (which rows are
        allocated is the allocator's to check). No side effects; waits for the device.
        O(k * bytes_per_token)."""
        idx = self._copy_indices(indices, load=False)
        bounds = self._chunk_bounds(idx.numel())
        copy = [
            [
                (gather_to_host(k_buf, 0, idx[start:end]), gather_to_host(v_buf, 0, idx[start:end]))
                for start, end in bounds
            ]
            for k_buf, v_buf in zip(self.k_buffer, self.v_buffer, strict=True)
        ]
        synchronize(self.device)  # the transfers into pinned memory are asynchronous
        return copy

    def check_cpu_copy(self, copy: object, indices: IndexLike) -> torch.Tensor:
        """Raise what :meth:`load_cpu_copy` would raise, else return ``indices`` as an index tensor:
        indices outside the padding and without repeats (:class:`~mamba_radix.errors.InvalidIndex`), a
        copy of this pool's layer count, chunking, row shape and exact dtype for that many indices
        (:class:`InvalidArgument`). No side effects. O(k + layers * chunks)."""
        idx = self._copy_indices(indices, load=True)
        bounds = self._chunk_bounds(idx.numel())
        row = (self.head_num, self.head_dim)
        for layer, chunks in enumerate(self._copy_layers(copy, len(bounds))):
            for c, ((start, end), chunk) in enumerate(zip(bounds, chunks, strict=True)):
                if not isinstance(chunk, (list, tuple)) or len(chunk) != 2:
                    raise InvalidArgument(
                        f"chunk {c} of layer {layer} of the KV copy must be a (k, v) pair, got "
                        f"{type(chunk).__name__}; pass the copy get_cpu_copy returned"
                    )
                for part, name in zip(chunk, ("k", "v"), strict=True):
                    check_copied_tensor(
                        part,
                        (end - start, *row),
                        self.dtype,
                        f"{name} of layer {layer} chunk {c} of the copy",
                    )
        return idx

    def load_cpu_copy(self, copy: list[list[tuple[torch.Tensor, torch.Tensor]]], indices: IndexLike) -> None:
        """Write a copy :meth:`get_cpu_copy` made into KV ``indices`` (token ``i`` of the copy into
        ``indices[i]``; they may differ from the indices copied). Validated whole first
        (:meth:`check_cpu_copy`): on refusal nothing is written. Side effect: overwrites those rows of
        every layer; the copy is not changed. Waits for the device. O(k * bytes_per_token)."""
        idx = self.check_cpu_copy(copy, indices)
        bounds = self._chunk_bounds(idx.numel())
        for k_buf, v_buf, chunks in zip(self.k_buffer, self.v_buffer, copy, strict=True):
            for (start, end), (k, v) in zip(bounds, chunks, strict=True):
                k_buf.index_copy_(0, idx[start:end], k.to(self.device, non_blocking=True))
                v_buf.index_copy_(0, idx[start:end], v.to(self.device, non_blocking=True))
        synchronize(self.device)  # the host tensors may be dropped once this returns


class MLATokenToKVPool(_TokenKVStorage):
    """Latent KV of ``layer_num`` MLA layers: ``kv_buffer[l]`` is ``[size + page_size, 1, kv_lora_rank +
    qk_rope_head_dim]``; the first ``kv_lora_rank`` channels are the compressed KV (also the values),
    the rest the rope part of the key."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, device)
        self.kv_lora_rank = check_size(kv_lora_rank, "kv_lora_rank")
        self.qk_rope_head_dim = check_size(qk_rope_head_dim, "qk_rope_head_dim")
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        shape = (self.num_rows, 1, self.kv_cache_dim)
        check_fits(
            self.device,
            layer_num * self.num_rows * self.kv_cache_dim * _element_size(dtype),
            "the KV buffers",
        )
        self.kv_buffer = [
            allocate_tensor("the latent KV buffer", torch.zeros, shape, dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]

    @property
    def bytes_per_token(self) -> int:
        """Exact bytes one token occupies over all layers."""
        return self.layer_num * self.kv_cache_dim * _element_size(self.dtype)

    def get_kv_size_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_buffer)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[self._layer(layer_id)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """A view of the compressed-KV channels (values share storage with keys)."""
        return self.kv_buffer[self._layer(layer_id)][..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self, layer_id: int, loc: IndexLike, cache_k: torch.Tensor, cache_v: torch.Tensor | None = None
    ) -> None:
        """``kv_buffer[layer][loc] = cache_k`` (``[len(loc), 1, kv_lora_rank + qk_rope_head_dim]``);
        ``cache_v`` is ignored: MLA values are the first channels of the latent."""
        layer = self._layer(layer_id)
        idx = self._loc(loc)
        self.kv_buffer[layer][idx] = self._values(cache_k, idx.numel(), (1, self.kv_cache_dim), "cache_k")

    def set_mla_kv_buffer(
        self, layer_id: int, loc: IndexLike, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
    ) -> None:
        """Write the compressed KV (``[n, 1, kv_lora_rank]``) and rope key (``[n, 1, qk_rope_head_dim]``)."""
        layer = self._layer(layer_id)
        idx = self._loc(loc)
        nope = self._values(cache_k_nope, idx.numel(), (1, self.kv_lora_rank), "cache_k_nope")
        rope = self._values(cache_k_rope, idx.numel(), (1, self.qk_rope_head_dim), "cache_k_rope")
        self.kv_buffer[layer][idx] = torch.cat([nope, rope], dim=-1)

    def get_cpu_copy(self, indices: IndexLike) -> list[list[torch.Tensor]]:
        """The latent KV at ``indices``, every layer, as fresh host tensors (pinned where CUDA is
        available), SGLang's form: ``copy[layer][chunk]`` is ``[chunk tokens, 1, kv_lora_rank +
        qk_rope_head_dim]``, chunks of :attr:`cpu_offloading_chunk_size`. Raises
        :class:`~mamba_radix.errors.InvalidIndex` for a padding or out-of-range index. No side effects;
        waits for the device. O(k * bytes_per_token)."""
        idx = self._copy_indices(indices, load=False)
        bounds = self._chunk_bounds(idx.numel())
        copy = [[gather_to_host(buf, 0, idx[start:end]) for start, end in bounds] for buf in self.kv_buffer]
        synchronize(self.device)  # the transfers into pinned memory are asynchronous
        return copy

    def check_cpu_copy(self, copy: object, indices: IndexLike) -> torch.Tensor:
        """Raise what :meth:`load_cpu_copy` would raise, else return ``indices`` as an index tensor (see
        :meth:`MHATokenToKVPool.check_cpu_copy`; a chunk is one latent tensor). No side effects.
        O(k + layers * chunks)."""
        idx = self._copy_indices(indices, load=True)
        bounds = self._chunk_bounds(idx.numel())
        for layer, chunks in enumerate(self._copy_layers(copy, len(bounds))):
            for c, ((start, end), chunk) in enumerate(zip(bounds, chunks, strict=True)):
                check_copied_tensor(
                    chunk,
                    (end - start, 1, self.kv_cache_dim),
                    self.dtype,
                    f"layer {layer} chunk {c} of the copy",
                )
        return idx

    def load_cpu_copy(self, copy: list[list[torch.Tensor]], indices: IndexLike) -> None:
        """Write a copy :meth:`get_cpu_copy` made into ``indices`` (which may differ from those copied),
        validated whole first: on refusal nothing is written. Side effect: overwrites those rows of every
        layer. Waits for the device. O(k * bytes_per_token)."""
        idx = self.check_cpu_copy(copy, indices)
        bounds = self._chunk_bounds(idx.numel())
        for buf, chunks in zip(self.kv_buffer, copy, strict=True):
            for (start, end), chunk in zip(bounds, chunks, strict=True):
                buf.index_copy_(0, idx[start:end], chunk.to(self.device, non_blocking=True))
        synchronize(self.device)  # the host tensors may be dropped once this returns


class LinearLayerCache(NamedTuple):
    """One linear layer's state tensors: each conv ``[num_slots + 1, *conv_shape]`` and the temporal
    ``[num_slots + 1, *temporal_shape]`` (views into the MambaPool, indexed by state slot)."""

    conv: list[torch.Tensor]
    temporal: torch.Tensor


class HybridLinearKVPool:
    """A hybrid model's KV storage by global layer id: full-attention layers read and write
    ``full_kv_pool`` (layer ``full_attention_layer_ids[i]`` is its layer ``i``), linear layers read the
    ``mamba_pool`` (layer ``linear_layer_ids[j]`` is its layer ``j``). Asking a layer of the wrong kind
    raises :class:`InvalidArgument`."""

    def __init__(
        self,
        full_kv_pool: MHATokenToKVPool | MLATokenToKVPool,
        full_attention_layer_ids: Sequence[int],
        mamba_pool: MambaPool,
        linear_layer_ids: Sequence[int],
    ) -> None:
        if not isinstance(full_kv_pool, (MHATokenToKVPool, MLATokenToKVPool)):
            raise InvalidArgument(
                f"full_kv_pool must be an MHA/MLA token pool, got {type(full_kv_pool).__name__}"
            )
        if not isinstance(mamba_pool, MambaPool):
            raise InvalidArgument(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        ids = []
        for what, given in (
            ("full_attention_layer_ids", full_attention_layer_ids),
            ("linear_layer_ids", linear_layer_ids),
        ):
            if not isinstance(given, (list, tuple, range)) or any(
                isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in given
            ):
                raise InvalidArgument(
                    f"{what} must be a list of non-negative int layer ids, got {given!r:.80}"
                )
            ids.append(list(given))
        full_ids, linear_ids = ids
        if len(full_ids) != full_kv_pool.layer_num:
            raise InvalidArgument(
                f"{len(full_ids)} full-attention layer ids for a KV pool of {full_kv_pool.layer_num} layers"
            )
        if len(linear_ids) != mamba_pool.num_layers:
            raise InvalidArgument(
                f"{len(linear_ids)} linear layer ids for a MambaPool of {mamba_pool.num_layers} layers"
            )
        both = set(full_ids) & set(linear_ids)
        if both or len(set(full_ids)) != len(full_ids) or len(set(linear_ids)) != len(linear_ids):
            raise InvalidArgument(
                f"layer ids must be distinct and each either full or linear; shared or repeated: "
                f"{sorted(both) or 'repeats within one list'}"
            )
        if full_kv_pool.device != mamba_pool.device:
            raise InvalidArgument(f"full KV pool on {full_kv_pool.device}, MambaPool on {mamba_pool.device}")
        self.full_kv_pool = full_kv_pool
        self.mamba_pool = mamba_pool
        self.full_attention_layer_id_mapping = {g: i for i, g in enumerate(full_ids)}
        self.linear_layer_id_mapping = {g: j for j, g in enumerate(linear_ids)}
        self.size = full_kv_pool.size
        self.page_size = full_kv_pool.page_size
        self.device = full_kv_pool.device

    @property
    def bytes_per_token(self) -> int:
        """Full-attention bytes per token (linear layers cost per slot, see ``mamba_pool.bytes_per_slot``)."""
        return self.full_kv_pool.bytes_per_token

    def get_kv_size_bytes(self) -> int:
        return self.full_kv_pool.get_kv_size_bytes()

    def _full_layer(self, layer_id: int) -> int:
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise InvalidArgument(f"layer_id must be an int, got {type(layer_id).__name__} {layer_id!r}")
        if layer_id in self.full_attention_layer_id_mapping:
            return self.full_attention_layer_id_mapping[layer_id]
        if layer_id in self.linear_layer_id_mapping:
            raise InvalidArgument(
                f"layer {layer_id} is a linear layer; read its state with mamba2_layer_cache"
            )
        raise InvalidArgument(
            f"layer {layer_id!r} is neither a full-attention nor a linear layer of this model"
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool.get_key_buffer(self._full_layer(layer_id))

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool.get_value_buffer(self._full_layer(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.full_kv_pool.get_kv_buffer(self._full_layer(layer_id))

    def set_kv_buffer(
        self, layer_id: int, loc: IndexLike, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        self.full_kv_pool.set_kv_buffer(self._full_layer(layer_id), loc, cache_k, cache_v)

    def mamba2_layer_cache(self, layer_id: int) -> LinearLayerCache:
        """The state tensors of linear layer ``layer_id`` (views, indexed by state slot)."""
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise InvalidArgument(f"layer_id must be an int, got {type(layer_id).__name__} {layer_id!r}")
        if layer_id not in self.linear_layer_id_mapping:
            kind = "a full-attention layer" if layer_id in self.full_attention_layer_id_mapping else "unknown"
            raise InvalidArgument(f"layer {layer_id!r} is {kind}, not a linear layer; use get_kv_buffer")
        j = self.linear_layer_id_mapping[layer_id]
        return LinearLayerCache([c[j] for c in self.mamba_pool.conv], self.mamba_pool.temporal[j])

    def get_cpu_copy(self, indices: IndexLike, mamba_indices: IndexLike | None = None) -> HybridCpuCopy:
        """Host copies of the full-attention KV at ``indices`` and, with ``mamba_indices``, of those
        state slots: ``HybridCpuCopy(kv, mamba)`` (SGLang's ``(kv_cpu, mamba_cpu)``; ``mamba`` is None
        without ``mamba_indices``). See :meth:`MHATokenToKVPool.get_cpu_copy` and
        :meth:`MambaPool.get_cpu_copy`. No side effects. O(k * bytes_per_token + s * bytes_per_slot)."""
        # the state slots first: a slot not allocated is refused before the larger KV copy is made
        mamba = None if mamba_indices is None else self.mamba_pool.get_cpu_copy(mamba_indices)
        return HybridCpuCopy(self.full_kv_pool.get_cpu_copy(indices), mamba)

    def check_cpu_copy(
        self, copy: object, indices: IndexLike, mamba_indices: IndexLike | None = None
    ) -> None:
        """Raise what :meth:`load_cpu_copy` would raise (both parts checked). No side effects."""
        if not isinstance(copy, (tuple, list)) or len(copy) != 2:
            raise InvalidArgument(
                f"a hybrid copy is the (kv, mamba) pair get_cpu_copy returns, got {type(copy).__name__}"
            )
        kv, mamba = copy
        self.full_kv_pool.check_cpu_copy(kv, indices)
        if mamba_indices is not None:
            if mamba is None:
                raise InvalidArgument(
                    "the copy holds no state (it was made without mamba_indices); pass mamba_indices=None, "
                    "or copy with mamba_indices"
                )
            self.mamba_pool.check_cpu_copy(mamba, mamba_indices)

    def load_cpu_copy(
        self, copy: HybridCpuCopy | tuple | list, indices: IndexLike, mamba_indices: IndexLike | None = None
    ) -> None:
        """Write a :meth:`get_cpu_copy` copy back: the KV part into ``indices`` and, with
        ``mamba_indices``, the state part into those slots (either may differ from those copied; without
        ``mamba_indices`` a copied state is not loaded, as in SGLang). Both parts are validated before
        either is written: on refusal nothing is. Side effect: overwrites those rows and slots.
        O(k * bytes_per_token + s * bytes_per_slot)."""
        self.check_cpu_copy(copy, indices, mamba_indices)
        kv, mamba = copy
        self.full_kv_pool.load_cpu_copy(kv, indices)
        if mamba_indices is not None:
            self.mamba_pool.load_cpu_copy(mamba, mamba_indices)
