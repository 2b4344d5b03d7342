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

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument

__all__ = ["EMPTY_FINGERPRINT", "fingerprint", "fingerprint_extend", "read_stamp", "write_stamp"]

_MODULI = (2_147_483_647, 2_147_483_629)  # two primes below 2**31: products of residues fit in int64
_BASES = (1_000_003, 999_983)
_STAMP_BYTES = 16
EMPTY_FINGERPRINT = 0


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


def fingerprint_extend(fp: int, tokens: Sequence[int] | np.ndarray) -> int:
    """The fingerprint of ``prefix + tokens`` given ``fp = fingerprint(prefix)``. O(len(tokens))."""
    n = len(tokens)
    if n == 0:
        return fp
    arr = np.asarray(tokens, dtype=np.int64) + 1  # +1: a leading token 0 must change the hash
    parts = []
    for i, (powers, modulus) in enumerate(zip(_POWERS, _MODULI, strict=True)):
        h = (fp >> (32 * i)) & 0xFFFFFFFF
        pw = powers.upto(n + 1)
        # sum_j t_j * B^(n-1-j): every product of residues is < 2**62; reduce before summing
        terms = (arr % modulus) * pw[n - 1 :: -1][:n] % modulus
        h = (h * int(pw[n]) + int(terms.sum() % modulus)) % modulus
        parts.append(h)
    return parts[0] | (parts[1] << 32)


def fingerprint(tokens: Sequence[int] | np.ndarray) -> int:
    """The fingerprint of a whole token sequence."""
    return fingerprint_extend(EMPTY_FINGERPRINT, tokens)


def _stamped_tensors(pool: _StateTensors) -> list[torch.Tensor]:
    tensors = [t for t in [*pool.conv, pool.temporal] if t[0, 0].numel() * t.element_size() >= _STAMP_BYTES]
    if not tensors:
        raise InvalidArgument("no state tensor has the 16 bytes per slot a stamp needs; use larger shapes")
    return tensors


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).view(t.shape[0], t.shape[1], -1)


def write_stamp(pool: _StateTensors, slot: int, fp: int, num_tokens: int) -> None:
    """Write the stamp ``(fp, num_tokens)`` into every layer of every state tensor of ``slot``."""
    payload = torch.tensor([fp, num_tokens], dtype=torch.int64).view(torch.uint8)
    for t in _stamped_tensors(pool):
        _byte_view(t)[:, slot, :_STAMP_BYTES] = payload.to(t.device)


def read_stamp(pool: _StateTensors, slot: int) -> tuple[int, int]:
    """The stamp ``(fp, num_tokens)`` held by ``slot``.

    Raises :class:`InvalidArgument` if the layers or tensors of the slot disagree (a partial copy).
    """
    stamps = {
        tuple(row.contiguous().view(torch.int64).tolist())
        for t in _stamped_tensors(pool)
        for row in _byte_view(t)[:, slot, :_STAMP_BYTES].cpu()
    }
    if len(stamps) != 1:
        raise InvalidArgument(
            f"slot {slot} holds inconsistent stamps across layers/tensors: {sorted(stamps)}"
        )
    fp, num_tokens = stamps.pop()
    return fp, num_tokens
