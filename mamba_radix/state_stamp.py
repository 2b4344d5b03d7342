"""Recognisable state contents for tests and the simulator (a stand-in for the model's forward).

A recurrent state is valid only at the exact position where it was saved. To check that the cache hands
back the *right* state, not just *a* state, the simulator and the property tests write into a slot a stamp
of the token prefix the state summarises: ``(fingerprint(tokens[:n]), n)``. A hit must return a slot whose
stamp equals the stamp of the matched prefix; a prefill must start from a live slot stamped at its prefix
length.

The fingerprint is a polynomial hash over two 31-bit prime moduli, so it extends chunk by chunk
(``fingerprint_extend(fingerprint(a), b) == fingerprint(a + b)``) and is computed with numpy in O(len).
The stamp occupies the first 16 bytes of every layer's row of every state tensor (conv and temporal) that
has at least 16 bytes per slot, so a copy that forgets one tensor or one layer is caught by
:func:`read_stamp`.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument

__all__ = [
    "EMPTY_FINGERPRINT",
    "as_token_array",
    "check_slot",
    "check_stamp",
    "fingerprint",
    "fingerprint_extend",
    "read_stamp",
    "write_stamp",
]

_MODULI = (2_147_483_647, 2_147_483_629)  # two primes below 2**31: products of residues fit in int64
_BASES = (1_000_003, 999_983)
_STAMP_BYTES = 16
EMPTY_FINGERPRINT = 0
_INT63 = 2**63  # stamps are two int64 words; token ids, fingerprints and lengths are below this


class _StateTensors(Protocol):
    conv: list[torch.Tensor]
    temporal: torch.Tensor


class _Powers:
    """``base**j mod p`` for j = 0..n-1, grown on demand (amortised O(1) per token)."""

    def __init__(self, base: int, modulus: int) -> None:
        self.base, self.modulus = base, modulus
        self.table = np.ones(1, dtype=np.int64)

    def upto(self, n: int) -> np.ndarray:
        while len(self.table) < n:
            grow = len(self.table)
            step = pow(self.base, grow, self.modulus)
            self.table = np.concatenate([self.table, self.table * step % self.modulus])
        return self.table[:n]


_POWERS = [_Powers(b, m) for b, m in zip(_BASES, _MODULI, strict=True)]


def as_token_array(tokens: object, what: str = "tokens") -> np.ndarray:
    """``tokens`` (a sequence of ints or a 1-D integer array) as a 1-D int64 array of ids in ``0..2**63-1``.

    Raises :class:`InvalidArgument` for floats, bools, nesting, negative ids or ids beyond int64: a float
    silently truncated to an int would stamp the wrong prefix. O(len(tokens)).
    """
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise InvalidArgument(f"{what} must be a sequence of int token ids, got {type(tokens).__name__}")
    try:
        arr = np.asarray(tokens)
    except (OverflowError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"{what} must be int token ids in 0..2**63-1 ({exc})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iuO":
        raise InvalidArgument(
            f"{what} must be a flat sequence of int token ids, got dtype {arr.dtype} and shape {arr.shape}"
        )
    if arr.dtype.kind == "O":  # Python ints beyond int64, or mixed objects
        bad = next(
            (v for v in arr.tolist() if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _INT63),
            None,
        )
        raise InvalidArgument(f"{what} must be int token ids in 0..2**63-1, got {bad!r}")
    if arr.dtype == np.uint64 and bool((arr >= np.uint64(_INT63)).any()):
        raise InvalidArgument(f"{what} must be int token ids in 0..2**63-1, got {int(arr.max())}")
    arr = arr.astype(np.int64, copy=False)
    if bool((arr < 0).any()):
        raise InvalidArgument(f"{what} must be int token ids in 0..2**63-1, got {int(arr.min())}")
    return arr


def check_stamp(fp: object, num_tokens: object) -> tuple[int, int]:
    """``(fp, num_tokens)`` as ints in ``0..2**63-1`` (what a stamp's two int64 words hold), or
    :class:`InvalidArgument`. O(1)."""
    out = []
    for name, v in (("fingerprint", fp), ("num_tokens", num_tokens)):
        if isinstance(v, bool):
            raise InvalidArgument(f"{name} must be an int, got {v!r}")
        try:
            iv = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgument(f"{name} must be an int, got {type(v).__name__} {v!r}") from None
        if not 0 <= iv < _INT63:
            raise InvalidArgument(f"{name} must be in 0..2**63-1, got {iv}")
        out.append(iv)
    return out[0], out[1]


def fingerprint_extend(fp: int, tokens: Sequence[int] | np.ndarray) -> int:
    """The fingerprint of ``prefix + tokens`` given ``fp = fingerprint(prefix)``. O(len(tokens)).

    Raises :class:`InvalidArgument` for a token list :func:`as_token_array` refuses or an ``fp`` outside
    ``0..2**63-1``."""
    fp, _ = check_stamp(fp, 0)
    arr = as_token_array(tokens)
    n = len(arr)
    if n == 0:
        return fp
    top_id = int(arr.max()) == _INT63 - 1
    parts = []
    for i, (powers, modulus) in enumerate(zip(_POWERS, _MODULI, strict=True)):
        h = (fp >> (32 * i)) & 0xFFFFFFFF
        pw = powers.upto(n + 1)
        # sum_j a_j * B^(n-1-j) with a_j = t_j + 1 (+1: a leading token 0 must change the hash), reduced
        # first so that t_j = 2**63 - 1 cannot overflow; every product of residues is < 2**62
        a = (arr % modulus + 1) if top_id else (arr + 1)
        terms = a % modulus * pw[n - 1 :: -1][:n] % modulus
        h = (h * int(pw[n]) + int(terms.sum() % modulus)) % modulus
        parts.append(h)
    return parts[0] | (parts[1] << 32)


def fingerprint(tokens: Sequence[int] | np.ndarray) -> int:
    """The fingerprint of a whole token sequence."""
    return fingerprint_extend(EMPTY_FINGERPRINT, tokens)


def _stamped_tensors(pool: _StateTensors) -> list[torch.Tensor]:
    conv, temporal = getattr(pool, "conv", None), getattr(pool, "temporal", None)
    if not isinstance(conv, (list, tuple)) or not isinstance(temporal, torch.Tensor):
        raise InvalidArgument(
            f"pool must have a sequence of conv tensors and a temporal tensor (a MambaPool), got {type(pool).__name__}"
        )
    tensors = [t for t in [*conv, temporal] if t[0, 0].numel() * t.element_size() >= _STAMP_BYTES]
    if not tensors:
        raise InvalidArgument("no state tensor has the 16 bytes per slot a stamp needs; use larger shapes")
    return tensors


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).view(t.shape[0], t.shape[1], -1)


def check_slot(slot: object, num_slots: int) -> int:
    """``slot`` as an int in ``0..num_slots-1`` (slot 0, the padding sink, included), or
    :class:`InvalidArgument`: a negative slot would silently wrap to the last one. O(1)."""
    if isinstance(slot, bool):
        raise InvalidArgument(f"slot must be an int, got {slot!r}")
    try:
        s = operator.index(slot)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(f"slot must be an int, got {type(slot).__name__} {slot!r}") from None
    if not 0 <= s < num_slots:
        raise InvalidArgument(f"slot {s} is outside the pool's slots 0..{num_slots - 1}")
    return s


def write_stamp(pool: _StateTensors, slot: int, fp: int, num_tokens: int) -> None:
    """Write the stamp ``(fp, num_tokens)`` into every layer of every state tensor of ``slot``.

    Raises :class:`InvalidArgument` (nothing written) for a slot outside the pool or values outside
    ``0..2**63-1``."""
    tensors = _stamped_tensors(pool)
    slot = check_slot(slot, tensors[0].shape[1])
    fp, num_tokens = check_stamp(fp, num_tokens)
    payload = torch.tensor([fp, num_tokens], dtype=torch.int64).view(torch.uint8)
    for t in tensors:
        _byte_view(t)[:, slot, :_STAMP_BYTES] = payload.to(t.device)


def read_stamp(pool: _StateTensors, slot: int) -> tuple[int, int]:
    """The stamp ``(fp, num_tokens)`` held by ``slot``.

    Raises :class:`InvalidArgument` if the layers or tensors of the slot disagree (a partial copy), or
    for a slot outside the pool.
    """
    tensors = _stamped_tensors(pool)
    slot = check_slot(slot, tensors[0].shape[1])
    stamps = {
        tuple(row.contiguous().view(torch.int64).tolist())
        for t in tensors
        for row in _byte_view(t)[:, slot, :_STAMP_BYTES].cpu()
    }
    if len(stamps) != 1:
        raise InvalidArgument(
            f"slot {slot} holds inconsistent stamps across layers/tensors: {sorted(stamps)}"
        )
    fp, num_tokens = stamps.pop()
    return fp, num_tokens
