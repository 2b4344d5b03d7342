"""Fast state stamps for the engine: the same bytes as :mod:`mamba_radix.state_stamp`, at a fraction of the
cost on the simulator's hot path.

The engine stamps a slot at every prefill chunk end, track point and decode event, and checks the live
slot before each chunk and event. :mod:`mamba_radix.state_stamp` computes each fingerprint by hashing the
tokens since the previous one (O(new tokens) with a Python-list-to-numpy conversion per call) and writes
through a chain of torch views (tens of microseconds per call). Here:

- :class:`PrefixFingerprints` hashes a request's whole token sequence once, vectorised, so the fingerprint
  of any prefix is an O(1) lookup. The polynomial hash is ``H(n) = sum_{j<n} a_j B^(n-1-j) mod p`` with
  ``a_j = t_j + 1``; with ``C = B^-1 mod p`` that is ``B^(n-1) * sum_{j<n} a_j C^j``, a prefix sum.
  Values are identical to :func:`mamba_radix.state_stamp.fingerprint` (the tests check it).
- :class:`StampIO` writes and checks stamps through numpy views of the pool's CPU tensors (a few
  microseconds), byte for byte what :func:`~mamba_radix.state_stamp.write_stamp` writes, so
  :func:`~mamba_radix.state_stamp.read_stamp` reads them back. If the pool replaces a tensor, the views are
  rebuilt (identity check on every call).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mamba_radix.errors import InvalidArgument, InvalidPosition
from mamba_radix.state_stamp import (
    _BASES,
    _MODULI,
    _STAMP_BYTES,
    EMPTY_FINGERPRINT,
    as_token_array,
    check_slot,
    check_stamp,
)

__all__ = ["PrefixFingerprints", "StampIO"]


class _PowerTable:
    """``x**j mod p`` for j = 0..n-1 as int64, grown by doubling on demand (amortised O(1) per entry), and
    the same powers split at bit 16 (``low = x**j & 0xFFFF``, ``high = x**j >> 16``) for the
    reduction-free prefix sums of :class:`PrefixFingerprints`."""

    def __init__(self, x: int, modulus: int) -> None:
        self.x, self.modulus = x, modulus
        self.table = np.ones(1, dtype=np.int64)
        self._low = self.table & 0xFFFF
        self._high = self.table >> 16

    def upto(self, n: int) -> np.ndarray:
        while len(self.table) < n:
            step = pow(self.x, len(self.table), self.modulus)
            # residues < 2**31: every product fits in int64
            self.table = np.concatenate([self.table, self.table * step % self.modulus])
        if len(self._low) != len(self.table):
            self._low, self._high = self.table & 0xFFFF, self.table >> 16
        return self.table[:n]

    def split_upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` halves of the first ``n`` powers (``power = high * 2**16 + low``)."""
        self.upto(n)
        return self._low[:n], self._high[:n]


# per modulus: powers of the base B and of its inverse C (Fermat: C = B^(p-2) mod p, p prime)
_TABLES = [
    (_PowerTable(b, m), _PowerTable(pow(b, m - 2, m), m), m) for b, m in zip(_BASES, _MODULI, strict=True)
]
# Prefix sums run in chunks of this many tokens: a residue (< 2**31) times a 16-bit half-power (< 2**16)
# is < 2**47, and 2**15 of them plus a reduced carry stay below 2**63, so no per-token reduction is needed.
_CHUNK = 1 << 15


class PrefixFingerprints:
    """The fingerprint of every prefix of one token sequence.

    Construction is O(len) vectorised numpy work and keeps, per modulus, two int64 arrays of ``len``
    entries (32 bytes a token in all); :meth:`at` is O(1). ``at(n) == state_stamp.fingerprint(tokens[:n])``
    for 0 <= n <= len.

    How: ``H(n) = B^(n-1) * sum_{j<n} a_j C^j mod p``. Each power ``C^j`` is split into 16-bit halves,
    ``C^j = h_j 2^16 + l_j``, and the two prefix sums ``sum a_j l_j`` and ``sum a_j h_j`` are kept
    unreduced (in chunks of 2**15 tokens with a reduced carry, so they never overflow): per token and
    modulus two multiplies and two cumulative sums, without the integer division a per-token ``% p``
    costs (the dominant cost before). Tokens are reduced modulo ``p`` only where they reach ``p - 1``
    (output ids, tails), in place.
    """

    __slots__ = ("_high", "_low", "_pow_base", "length")

    def __init__(self, tokens: np.ndarray) -> None:
        # int64 arrays (the engine's case) skip the conversion; anything else is validated like
        # state_stamp.fingerprint's input (ints in 0..2**63-1, flat), InvalidArgument otherwise.
        arr = (
            tokens
            if isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.ndim == 1
            else None
        )
        if arr is None or (arr.size and int(arr.min()) < 0):
            arr = as_token_array(tokens)
        self.length = n = int(arr.shape[0])
        self._low: list[np.ndarray] = []
        self._high: list[np.ndarray] = []
        self._pow_base: list[np.ndarray] = []
        if n == 0:
            return
        top = int(arr.max())
        # a_j = (t_j + 1) mod p; t + 1 overflows int64 only at t = 2**63 - 1, where it is reduced first
        plus_one = arr + 1 if top < 2**63 - 1 else None
        for base_pows, inv_pows, modulus in _TABLES:
            if plus_one is None:
                a = arr % modulus + 1
            elif top + 1 >= modulus:
                a = plus_one.copy() if len(_TABLES) > 1 else plus_one
                np.remainder(a, modulus, out=a, where=a >= modulus)
            else:
                a = plus_one
            low_pows, high_pows = inv_pows.split_upto(n)
            self._low.append(self._prefix_sums(a * low_pows, modulus))
            self._high.append(self._prefix_sums(a * high_pows, modulus))
            self._pow_base.append(base_pows.upto(n))

    @staticmethod
    def _prefix_sums(terms: np.ndarray, modulus: int) -> np.ndarray:
        """Prefix sums of ``terms`` (each < 2**47), congruent modulo ``modulus``, in place. O(len)."""
        np.cumsum(terms[:_CHUNK], out=terms[:_CHUNK])
        for start in range(_CHUNK, len(terms), _CHUNK):
            chunk = terms[start : start + _CHUNK]
            chunk[0] += int(terms[start - 1]) % modulus  # the carry, reduced: the bound holds again
            np.cumsum(chunk, out=chunk)
        return terms

    def at(self, n: int) -> int:
        """The fingerprint of the first ``n`` tokens. O(1)."""
        if n == 0:
            return EMPTY_FINGERPRINT
        if type(n) is not int or not 0 < n <= self.length:
            raise InvalidPosition(f"prefix length {n!r} outside 0..{self.length}")
        out = 0
        j = n - 1
        for i, (_, _, modulus) in enumerate(_TABLES):
            total = int(self._low[i][j]) + (int(self._high[i][j]) << 16)
            out |= int(self._pow_base[i][j]) * (total % modulus) % modulus << (32 * i)
        return out


class StampIO:
    """Write and check state stamps in a CPU :class:`~mamba_radix.pools.MambaPool` (or anything with
    ``conv`` and ``temporal`` tensors), in the layout of :mod:`mamba_radix.state_stamp`: the first 16
    bytes of every layer's row of every state tensor with at least 16 bytes per slot hold
    ``int64[fingerprint, num_tokens]``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._sources: list[torch.Tensor] = []
        self._views: list[np.ndarray] = []
        self._refresh()

    def _refresh(self) -> None:
        """Rebuild the byte views if the pool's tensors are not the ones they were made from. O(tensors)."""
        conv, temporal = getattr(self.pool, "conv", None), getattr(self.pool, "temporal", None)
        if not isinstance(conv, (list, tuple)) or not isinstance(temporal, torch.Tensor):
            raise InvalidArgument(
                f"StampIO needs a pool with conv tensors and a temporal tensor, got {type(self.pool).__name__}"
            )
        sources = [*conv, temporal]
        if len(sources) == len(self._sources) and all(
            a is b for a, b in zip(sources, self._sources, strict=True)
        ):
            return
        views = []
        for t in sources:
            if t.device.type != "cpu":
                raise InvalidArgument("StampIO works on CPU pools; use mamba_radix.state_stamp on a device")
            if t[0, 0].numel() * t.element_size() < _STAMP_BYTES:
                continue
            # uint8 view of [layers, slots, bytes per row], sharing memory with the tensor
            views.append(t.view(torch.uint8).view(t.shape[0], t.shape[1], -1).numpy())
        if not views:
            raise InvalidArgument(
                "no state tensor has the 16 bytes per slot a stamp needs; use larger shapes"
            )
        self._sources, self._views = sources, views
        self._num_slots = int(temporal.shape[1])

    @staticmethod
    def _payload(fp: int, num_tokens: int) -> np.ndarray:
        return np.array([fp, num_tokens], dtype=np.int64).view(np.uint8)

    def _checked(self, slot: int, fp: int, num_tokens: int) -> tuple[int, np.ndarray]:
        """Validate the arguments (InvalidArgument, nothing written) and build the payload. O(1).
        The fast path (a Python int slot in range, values in int64) costs two comparisons."""
        self._refresh()
        if not (type(slot) is int and 0 <= slot < self._num_slots):
            slot = check_slot(slot, self._num_slots)
        if not (type(fp) is int and type(num_tokens) is int and 0 <= fp < 2**63 and 0 <= num_tokens < 2**63):
            fp, num_tokens = check_stamp(fp, num_tokens)
        return slot, self._payload(fp, num_tokens)

    def write(self, slot: int, fp: int, num_tokens: int) -> None:
        """Stamp ``slot`` with ``(fp, num_tokens)`` in every layer of every stamped tensor. O(layers).
        Raises :class:`InvalidArgument` (nothing written) for a slot outside the pool or values outside
        ``0..2**63-1``."""
        slot, payload = self._checked(slot, fp, num_tokens)
        for view in self._views:
            view[:, slot, :_STAMP_BYTES] = payload

    def holds(self, slot: int, fp: int, num_tokens: int) -> bool:
        """Whether every layer of every stamped tensor of ``slot`` holds ``(fp, num_tokens)``. O(layers)."""
        slot, payload = self._checked(slot, fp, num_tokens)
        return all(bool((view[:, slot, :_STAMP_BYTES] == payload).all()) for view in self._views)
