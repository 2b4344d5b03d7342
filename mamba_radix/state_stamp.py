"""State stamps: the one fingerprint of a token prefix, and where a stamp lives in a state slot.

A recurrent state is valid only at the exact position where it was saved. To check that the cache hands
back the *right* state, not just *a* state, the simulator, the invariant suite
(:mod:`mamba_radix.testing.stamps`) and the property tests write into a slot a stamp of the token prefix
the state summarises: ``(fingerprint(tokens[:n]), n)``. A hit must return a slot whose stamp equals the
stamp of the matched prefix; a prefill must start from a live slot stamped at its prefix length. The tree
keys research policies' records by the same fingerprint (``node.prefix_fp``).

**The fingerprint** (this module is its only implementation). ``a_j = t_j + 1`` (so a leading token 0
changes the hash); per prime ``p`` of two primes below ``2**31`` with base ``B``, ``H_p(n) = sum_{j<n}
a_j B^(n-1-j) mod p``; the fingerprint is ``H_p1 | H_p2 << 32`` (below ``2**63``), ``0``
(:data:`EMPTY_FINGERPRINT`) for no tokens. Token ids are ints in ``0..2**63-1`` (anything else is
:class:`~mamba_radix.errors.InvalidArgument`). Three ways to compute it, equal by contract (the tests
check it):

- :func:`fingerprint` of a whole sequence, O(len);
- :func:`fingerprint_extend`: it extends chunk by chunk, ``fingerprint_extend(fingerprint(a), b) ==
  fingerprint(a + b)``, O(len(b));
- :class:`PrefixFingerprints`: every prefix of one sequence at once (vectorised, O(len)), then each
  prefix's fingerprint in O(1): the simulator's and the research policies' hot path.

**The layout.** The stamp is ``int64[fingerprint, num_tokens]``, the first :data:`STAMP_BYTES` bytes of
every layer's row of every state tensor (conv and temporal, :func:`state_tensors`) that has at least that
many bytes per slot (:func:`stamp_rows`), so a copy that forgets one tensor or one layer is caught by
:func:`read_stamp`. :func:`write_stamp` and :func:`read_stamp` are the reference (any device);
:class:`mamba_radix.sim.stamps.StampIO` writes the same bytes faster on CPU pools.

Imports: numpy; torch only when a stamp is read or written, so the torch-free invariant suite shares the
fingerprint.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from mamba_radix.errors import InvalidArgument, InvalidPosition

if TYPE_CHECKING:
    import torch

__all__ = [
    "EMPTY_FINGERPRINT",
    "STAMP_BYTES",
    "PrefixFingerprints",
    "as_token_array",
    "check_slot",
    "check_stamp",
    "fingerprint",
    "fingerprint_extend",
    "read_stamp",
    "stamp_rows",
    "state_tensors",
    "write_stamp",
]

_MODULI = (2_147_483_647, 2_147_483_629)  # two primes below 2**31: products of residues fit in int64
_BASES = (1_000_003, 999_983)
STAMP_BYTES = 16  # a stamp's bytes at the start of every stamped row: int64[fingerprint, num_tokens]
EMPTY_FINGERPRINT = 0  # the fingerprint of no tokens (a zeroed slot holds the stamp of the empty prefix)
_INT63 = 2**63  # stamps are two int64 words; token ids, fingerprints and lengths are below this


class _StateTensors(Protocol):
    conv: list[torch.Tensor]
    temporal: torch.Tensor


class _PowerTable:
    """``x**j mod p`` for j = 0..n-1 as int64, grown by doubling on demand (amortised O(1) per entry), and
    on request the same powers split at bit 16 (``low = x**j & 0xFFFF``, ``high = x**j >> 16``) for the
    reduction-free prefix sums of :class:`PrefixFingerprints`."""

    def __init__(self, x: int, modulus: int) -> None:
        self.x, self.modulus = x, modulus
        self.table = np.ones(1, dtype=np.int64)
        self._split: tuple[np.ndarray, np.ndarray] | None = None  # (low, high) of the whole table

    def upto(self, n: int) -> np.ndarray:
        while len(self.table) < n:
            step = pow(self.x, len(self.table), self.modulus)
            # residues < 2**31: every product fits in int64
            self.table = np.concatenate([self.table, self.table * step % self.modulus])
        return self.table[:n]

    def split_upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` halves of the first ``n`` powers (``power = high * 2**16 + low``)."""
        self.upto(n)
        if self._split is None or len(self._split[0]) != len(self.table):
            self._split = (self.table & 0xFFFF, self.table >> 16)
        low, high = self._split
        return low[:n], high[:n]


# per modulus: powers of the base B and of its inverse C (Fermat: C = B^(p-2) mod p, p prime)
_TABLES = [
    (_PowerTable(b, m), _PowerTable(pow(b, m - 2, m), m), m) for b, m in zip(_BASES, _MODULI, strict=True)
]
# PrefixFingerprints' prefix sums run in chunks of this many tokens: a residue (< 2**31) times a 16-bit
# half-power (< 2**16) is < 2**47, and 2**15 of them plus a reduced carry stay below 2**63, so no per-token
# reduction is needed.
_CHUNK = 1 << 15


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
    for i, (powers, _, modulus) in enumerate(_TABLES):
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
    """The fingerprint of a whole token sequence. O(len(tokens)); :class:`InvalidArgument` as
    :func:`as_token_array`."""
    return fingerprint_extend(EMPTY_FINGERPRINT, tokens)


class PrefixFingerprints:
    """The fingerprint of every prefix of one token sequence.

    Construction is O(len) vectorised numpy work and keeps, per modulus, two int64 arrays of ``len``
    entries (32 bytes a token in all); :meth:`at` is O(1). ``at(n) == fingerprint(tokens[:n])`` for
    0 <= n <= len. Tokens: as :func:`fingerprint` (:class:`InvalidArgument` otherwise).

    How: with ``C = B^-1 mod p``, ``H(n) = sum_{j<n} a_j B^(n-1-j) = B^(n-1) * sum_{j<n} a_j C^j mod p``, a
    prefix sum. Each power ``C^j`` is split into 16-bit halves, ``C^j = h_j 2^16 + l_j``, and the two
    prefix sums ``sum a_j l_j`` and ``sum a_j h_j`` are kept unreduced (in chunks of 2**15 tokens with a
    reduced carry, so they never overflow): per token and modulus two multiplies and two cumulative sums,
    without the integer division a per-token ``% p`` costs. Tokens are reduced modulo ``p`` only where
    they reach ``p - 1`` (output ids, tails), in place.
    """

    __slots__ = ("_high", "_low", "_pow_base", "length")

    def __init__(self, tokens: Sequence[int] | np.ndarray) -> None:
        # int64 arrays (the engine's case) skip the conversion; anything else is validated by
        # as_token_array (ints in 0..2**63-1, flat), InvalidArgument otherwise.
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
        plus_one = arr + 1 if top < _INT63 - 1 else None
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
        """The fingerprint of the first ``n`` tokens. O(1). :class:`InvalidPosition` unless ``n`` is an
        int in ``0..length``."""
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


# -------------------------------------------------------------------------------------------- the layout
def state_tensors(pool: _StateTensors) -> list[torch.Tensor]:
    """``[*pool.conv, pool.temporal]``: every state tensor of a :class:`~mamba_radix.pools.MambaPool` (or
    anything with a sequence of ``conv`` tensors and a ``temporal`` tensor, each ``[layers, slots, ...]``).
    Raises :class:`InvalidArgument` for anything else. O(tensors)."""
    import torch

    conv, temporal = getattr(pool, "conv", None), getattr(pool, "temporal", None)
    if not isinstance(conv, (list, tuple)) or not isinstance(temporal, torch.Tensor):
        raise InvalidArgument(
            f"pool must have a sequence of conv tensors and a temporal tensor (a MambaPool), got {type(pool).__name__}"
        )
    return [*conv, temporal]


def stamp_rows(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The rows a stamp goes into: a ``uint8`` view ``[layers, slots, bytes per row]`` (sharing memory) of
    each of ``tensors`` with at least :data:`STAMP_BYTES` bytes per slot row; the stamp is the first
    :data:`STAMP_BYTES` of every row. Raises :class:`InvalidArgument` if no tensor is that large. O(tensors)."""
    import torch

    rows = [
        t.view(torch.uint8).view(t.shape[0], t.shape[1], -1)
        for t in tensors
        if t[0, 0].numel() * t.element_size() >= STAMP_BYTES
    ]
    if not rows:
        raise InvalidArgument("no state tensor has the 16 bytes per slot a stamp needs; use larger shapes")
    return rows


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
    import torch

    rows = stamp_rows(state_tensors(pool))
    slot = check_slot(slot, rows[0].shape[1])
    fp, num_tokens = check_stamp(fp, num_tokens)
    payload = torch.tensor([fp, num_tokens], dtype=torch.int64).view(torch.uint8)
    for r in rows:
        r[:, slot, :STAMP_BYTES] = payload.to(r.device)


def read_stamp(pool: _StateTensors, slot: int) -> tuple[int, int]:
    """The stamp ``(fp, num_tokens)`` held by ``slot``.

    Raises :class:`InvalidArgument` if the layers or tensors of the slot disagree (a partial copy), or
    for a slot outside the pool.
    """
    import torch

    rows = stamp_rows(state_tensors(pool))
    slot = check_slot(slot, rows[0].shape[1])
    stamps = {
        tuple(row.contiguous().view(torch.int64).tolist())
        for r in rows
        for row in r[:, slot, :STAMP_BYTES].cpu()
    }
    if len(stamps) != 1:
        raise InvalidArgument(
            f"slot {slot} holds inconsistent stamps across layers/tensors: {sorted(stamps)}"
        )
    fp, num_tokens = stamps.pop()
    return fp, num_tokens
