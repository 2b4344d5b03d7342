"""The key a tree is walked with (:class:`RadixKey`): token ids plus an optional namespace.

Validation lives here, once, at the public boundary: a key that reaches the tree holds int64 token ids in
one C buffer (:class:`~mamba_radix.token_ids.TokenIds`), so the walk compares edges with ``memcmp`` and never
checks a token again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.token_ids import TokenIds, as_token_ids

__all__ = ["RadixKey"]


@dataclass(frozen=True)
class RadixKey:
    """Token ids plus an optional namespace (``extra_key``: LoRA id, cache salt).

    Keys in different namespaces never share a node. ``token_ids`` is normalised to a fresh
    :class:`~mamba_radix.token_ids.TokenIds` (int64 in one C buffer; it compares equal to a tuple or list of
    the same ints): a list, tuple, ``array('q')``, numpy array or 1-D tensor is accepted. An int64 array
    or tensor is copied with one ``memcpy``; a list of Python ints costs one C-level conversion per token,
    which is also the check. Not hashable (the ids are an array). O(len).
    """

    token_ids: TokenIds | Sequence[int]
    extra_key: str | None = None

    def __post_init__(self) -> None:
        ids = self.token_ids
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            if ids.ndim != 1:
                raise InvalidArgument(f"token_ids must be 1-D, got shape {tuple(ids.shape)}")
            ids = _int64_buffer(ids)
        elif isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Sequence):
            raise InvalidArgument(f"token_ids must be a sequence of ints, got {type(ids).__name__}")
        try:  # one C-speed pass: floats, None, strings and ints beyond int64 are refused
            object.__setattr__(self, "token_ids", as_token_ids(ids))
        except (TypeError, OverflowError, ValueError) as exc:
            raise InvalidArgument(f"token_ids must be int token ids in int64 range: {exc}") from None
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise InvalidArgument(
                f"extra_key must be a str or None, got {self.extra_key!r}; convert it with str()"
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def trusted(cls, token_ids: Sequence[int], extra_key: str | None) -> RadixKey:
        """A key from tokens the caller already validated (the lifecycle's, checked at admission): no
        check, one conversion (:func:`~mamba_radix.token_ids.as_token_ids`: a ``memcpy`` from an int64 array,
        one C-level step per token from a list). O(len)."""
        key = object.__new__(cls)
        object.__setattr__(key, "token_ids", as_token_ids(token_ids))
        object.__setattr__(key, "extra_key", extra_key)
        return key


def _int64_buffer(ids: torch.Tensor | np.ndarray) -> np.ndarray | list[int]:
    """A 1-D tensor or numpy array as a contiguous int64 numpy array when its dtype converts exactly
    (signed ints, unsigned up to 32 bits), else as a list of Python items for the checked conversion
    (floats and bools keep their refusal or acceptance; uint64 beyond int64 overflows there). O(len)."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else ids
    kind, size = arr.dtype.kind, arr.dtype.itemsize
    if kind == "i" or (kind == "u" and size <= 4):
        return np.ascontiguousarray(arr, dtype=np.int64)
    return arr.tolist()
