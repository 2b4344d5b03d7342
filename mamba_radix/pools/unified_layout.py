"""Byte layouts of the unified memory pool's two kinds of entries, and typed views over a byte buffer.

A state slot is one envelope holding, for every linear layer, each conv window and the temporal state
(section-major: ``[conv0 of every layer][conv1 of every layer]...[temporal of every layer]``); a KV token is
one envelope holding every full-attention layer's row (MHA: K then V per layer; MLA: the latent row per
layer), and a KV page is ``page_size`` consecutive token envelopes. Envelopes, not per-layer tensors, so
that a freed slot or page frees one contiguous byte range the other side can grow into.

Each section starts at a multiple of its dtype's size and an envelope's size is a multiple of the largest
dtype size, so every view is a plain strided view (:func:`strided_view`: ``Tensor.view(dtype)`` then
``as_strided``) with contiguous inner dims: :mod:`mamba_radix.state_ops` takes the state views as they are.
Padding appears only where a section's bytes are not already aligned (``padding_bytes``; 0 for usual shapes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from mamba_radix.errors import InvalidArgument

__all__ = ["KVLayout", "StateLayout", "strided_view"]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def strided_view(
    raw: torch.Tensor,
    dtype: torch.dtype,
    offset_bytes: int,
    outer: tuple[tuple[int, int], ...],
    inner: tuple[int, ...],
) -> torch.Tensor:
    """A ``dtype`` view of the ``uint8`` buffer ``raw``: outer dims given as (size, stride in bytes), inner
    dims contiguous, starting ``offset_bytes`` in. Raises :class:`InvalidArgument` for a misaligned offset or
    stride, or a view reaching past the buffer. No copy, no side effects. O(1)."""
    item = _itemsize(dtype)
    if offset_bytes % item or any(stride % item for _, stride in outer):
        raise InvalidArgument(f"a {dtype} view needs offsets and strides that are multiples of {item} B")
    last = offset_bytes + sum((n - 1) * s for n, s in outer) + math.prod(inner) * item
    if last > raw.numel():
        raise InvalidArgument(f"a view reaching byte {last} is past the {raw.numel()} B buffer")
    typed = raw[: raw.numel() // item * item].view(dtype)
    size = tuple(n for n, _ in outer) + inner
    stride = tuple(s // item for _, s in outer) + _contiguous_strides(inner)
    return typed.as_strided(size, stride, offset_bytes // item)


@dataclass(frozen=True)
class StateLayout:
    """One state slot's envelope: ``num_layers`` layers of each ``conv_shapes[j]`` in ``conv_dtypes[j]``
    and ``temporal_shape`` in ``temporal_dtype`` (MambaPool's arguments, one dtype per conv tensor)."""

    num_layers: int
    conv_shapes: tuple[tuple[int, ...], ...]
    temporal_shape: tuple[int, ...]
    conv_dtypes: tuple[torch.dtype, ...]
    temporal_dtype: torch.dtype = torch.float32
    section_offsets: tuple[int, ...] = field(init=False)  # conv sections, then temporal
    slot_bytes: int = field(init=False)
    padding_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise InvalidArgument(f"num_layers must be a positive int, got {self.num_layers!r}")
        if not self.conv_shapes or len(self.conv_shapes) != len(self.conv_dtypes):
            raise InvalidArgument(
                f"give one conv dtype per conv shape (got {len(self.conv_dtypes)} dtypes for "
                f"{len(self.conv_shapes)} shapes), at least one"
            )
        offsets, at, exact = [], 0, 0
        for shape, dtype in self.sections:
            item = _itemsize(dtype)
            at = _align(at, item)
            offsets.append(at)
            size = self.num_layers * math.prod(shape) * item
            at += size
            exact += size
        widest = max(_itemsize(d) for _, d in self.sections)
        object.__setattr__(self, "section_offsets", tuple(offsets))
        object.__setattr__(self, "slot_bytes", _align(at, widest))
        object.__setattr__(self, "padding_bytes", self.slot_bytes - exact)

    @property
    def sections(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [
            *zip(self.conv_shapes, self.conv_dtypes, strict=True),
            (self.temporal_shape, self.temporal_dtype),
        ]

    def views(self, raw: torch.Tensor, rows: int) -> list[torch.Tensor]:
        """``[*conv, temporal]`` over ``raw``, each ``[num_layers, rows, *shape]`` (slot ``s`` at byte
        ``s * slot_bytes``): :attr:`MambaPool.tensors`' shapes and dtypes. O(sections)."""
        out = []
        for (shape, dtype), offset in zip(self.sections, self.section_offsets, strict=True):
            row = math.prod(shape) * _itemsize(dtype)
            out.append(
                strided_view(raw, dtype, offset, ((self.num_layers, row), (rows, self.slot_bytes)), shape)
            )
        return out


@dataclass(frozen=True)
class KVLayout:
    """One KV token's envelope over ``num_layers`` full-attention layers: ``mha`` (K of ``head_num x
    head_dim`` then V of ``head_num x v_head_dim`` per layer) or ``mla`` (one latent row of
    ``kv_cache_dim`` per layer), in ``dtype``."""

    kind: Literal["mha", "mla"]
    num_layers: int
    dtype: torch.dtype = torch.bfloat16
    head_num: int = 1
    head_dim: int = 0
    v_head_dim: int = 0
    kv_cache_dim: int = 0
    token_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in ("mha", "mla"):
            raise InvalidArgument(f"kind must be 'mha' or 'mla', got {self.kind!r}")
        dims = (self.num_layers, self.head_num, self.head_dim, self.v_head_dim or self.head_dim)
        if self.kind == "mla":
            dims = (self.num_layers, self.kv_cache_dim)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
            raise InvalidArgument(f"a {self.kind} layout needs positive int dims, got {dims}")
        object.__setattr__(self, "token_bytes", self.num_layers * self.layer_bytes)

    @property
    def layer_bytes(self) -> int:
        item = _itemsize(self.dtype)
        if self.kind == "mla":
            return self.kv_cache_dim * item
        return self.head_num * (self.head_dim + (self.v_head_dim or self.head_dim)) * item

    def views(self, raw: torch.Tensor, num_tokens: int) -> list[tuple[torch.Tensor, ...]]:
        """Per layer: ``(k, v)`` of ``[num_tokens, head_num, dim]`` (mha) or ``(latent,)`` of
        ``[num_tokens, 1, kv_cache_dim]`` (mla), token ``t`` at byte ``t * token_bytes``. O(layers)."""
        item, out = _itemsize(self.dtype), []
        outer = ((num_tokens, self.token_bytes),)
        for layer in range(self.num_layers):
            base = layer * self.layer_bytes
            if self.kind == "mla":
                out.append((strided_view(raw, self.dtype, base, outer, (1, self.kv_cache_dim)),))
                continue
            k_bytes = self.head_num * self.head_dim * item
            k = strided_view(raw, self.dtype, base, outer, (self.head_num, self.head_dim))
            v = strided_view(
                raw, self.dtype, base + k_bytes, outer, (self.head_num, self.v_head_dim or self.head_dim)
            )
            out.append((k, v))
        return out
