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

from mamba_radix.errors import InvalidArgument
from mamba_radix.pools._indices import (
    IndexLike,
    allocate_tensor,
    as_index_tensor,
    check_fits,
    check_size,
    resolve_device,
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
