"""State stamps written as values that a quantized checkpoint format stores exactly.

The suite names the prefix a state summarises by its stamp ``(fingerprint, num_tokens)``
(:mod:`mamba_radix.testing.stamps`). Under ``checkpoint_format="model"`` a checkpoint is a bit copy of a
state slot, and the stamp is raw int64 bytes (:func:`mamba_radix.state_stamp.write_stamp`). Under ``int8``
or ``fp8_e4m3`` a hand-over quantizes the slot and a hit dequantizes it
(:mod:`mamba_radix.checkpoint_format`): raw bytes read as floats become other numbers (or NaN) and do not
come back. So for a quantized format the stamp is written as *values* that ``dequantize(quantize(x))``
returns bit for bit:

- the slot's elements of each state tensor, one layer at a time, are cut into the format's quantization
  rows (``row_len``: the checkpoint store's, :func:`kernels.quant_naive.row_len_for` by default);
- every row starts with ``QMAX`` (127 for int8, 448 for fp8 e4m3), the *scale pin*: the row's absmax is
  then ``QMAX``, so its scale ``absmax / QMAX`` is exactly 1.0, the quantized value of each element is
  the element itself, and dequantizing multiplies by 1.0;
- the rest of the rows' elements carry the stamp's 32 nibbles (the fingerprint's 16, then the token
  count's, least significant first) as the integers 0..15, then zeros. Integers 0..15, 127 and 448 are
  exact in fp32, bf16, int8 (at scale 1) and e4m3 (3 mantissa bits: every integer up to 16), so each
  step of the round trip is exact, in the torch reference and in the Triton kernels alike (both compute
  the spec of :mod:`kernels.quant_naive` bit for bit).

A zeroed slot (a request without a hit) reads as the empty stamp ``(0, 0)``, as under ``model``. As with
raw stamps, every layer of every tensor carries the whole stamp, so a copy or a restore that skips a
tensor or a layer reads back as inconsistent stamps. ``property_tests/test_quantized_stamps.py`` proves
the round trip for both formats, both model dtypes and both kernel backends.

:class:`StateStamps` is the one entry point: it writes and reads stamps in a state pool for a format
(``model``: the raw bytes of :mod:`mamba_radix.state_stamp`), and reads a checkpoint pool's slots through
the format's own dequantization (:meth:`~mamba_radix.pools.checkpoint_pool.CheckpointPool.read`).
Imports torch (this module is for adapters over real state tensors, not the tensor-free suite core).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from mamba_radix_kernels import quant_naive

from mamba_radix.checkpoint_format import check_format
from mamba_radix.errors import InvalidArgument
from mamba_radix.state_stamp import check_slot, check_stamp, read_stamp, state_tensors, write_stamp

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.pools import MambaPool
    from mamba_radix.pools.checkpoint_pool import CheckpointPool

__all__ = ["NIBBLES", "StateStamps", "decode_rows", "encode_rows", "qmax_of_format"]

NIBBLES = 32  # a stamp's two 64-bit words, 4 bits an element
_NIBBLE_SHIFTS = [4 * i for i in range(NIBBLES // 2)]
_SHIFTS = np.array(_NIBBLE_SHIFTS * 2, dtype=np.uint64)  # per nibble of the two words, as decoded
_QMAX = {"int8": quant_naive.INT8_QMAX, "fp8_e4m3": quant_naive.FP8_E4M3_MAX}


def qmax_of_format(fmt: str) -> float:
    """The value a row's absmax maps to in quantized format ``fmt`` (the scale pin): 127 or 448.
    :class:`InvalidArgument` for ``model`` or an unknown name."""
    check_format(fmt)
    if fmt not in _QMAX:
        raise InvalidArgument(f"format {fmt!r} does not quantize; value stamps are for int8 or fp8_e4m3")
    return _QMAX[fmt]


def _capacity(numel: int, row_len: int) -> int:
    """Payload elements of one layer's slot: every row but its pin. O(1)."""
    return (numel // row_len) * (row_len - 1)


def encode_rows(fp: int, num_tokens: int, numel: int, row_len: int, qmax: float) -> torch.Tensor:
    """The ``numel`` float32 values (``[numel // row_len, row_len]``) that stamp one layer's slot with
    ``(fp, num_tokens)``: a pin ``qmax`` at the start of every row, the 32 nibbles after the pins, zeros
    after them. :class:`InvalidArgument` for a stamp outside ``0..2**63-1``, a row length that does not
    divide ``numel``, or rows with fewer than 32 payload elements. Pure. O(numel)."""
    fp, num_tokens = check_stamp(fp, num_tokens)
    if row_len < 1 or numel % row_len:
        raise InvalidArgument(f"row length {row_len} does not divide the {numel} elements of a slot")
    if _capacity(numel, row_len) < NIBBLES:
        raise InvalidArgument(
            f"a slot of {numel} elements in rows of {row_len} holds {_capacity(numel, row_len)} stamp "
            f"elements, a value stamp needs {NIBBLES}; use larger state shapes"
        )
    nibbles = [(word >> s) & 0xF for word in (fp, num_tokens) for s in _NIBBLE_SHIFTS]
    num_rows = numel // row_len
    payload = torch.zeros(num_rows * (row_len - 1), dtype=torch.float32)
    payload[:NIBBLES] = torch.tensor(nibbles, dtype=torch.float32)
    pins = torch.full((num_rows, 1), qmax, dtype=torch.float32)
    return torch.cat([pins, payload.view(num_rows, row_len - 1)], dim=1)


def decode_rows(rows: torch.Tensor, qmax: float) -> tuple[int, int] | None:
    """The stamp held by ``rows`` (one layer's slot as ``[num_rows, row_len]``, any float dtype):
    ``(0, 0)`` for all zeros, ``None`` for anything :func:`encode_rows` does not write (a pin missing, a
    value that is not a nibble, a nonzero past the nibbles). Pure. O(numel)."""
    return _decode_layers(rows.unsqueeze(0), qmax)[0]


def _decode_layers(layers: torch.Tensor, qmax: float) -> list[tuple[int, int] | None]:
    """:func:`decode_rows` of each of ``layers`` (``[L, num_rows, row_len]``), in one vectorised pass
    (the suite reads every checkpoint after every step). O(numel)."""
    v = layers.detach().to("cpu", torch.float32).numpy()
    if v.shape[0] > 1 and bool((v == v[:1]).all()):  # the common case: every layer alike, decoded once
        return _decode_layers(layers[:1], qmax) * v.shape[0]
    num = v.shape[0]
    payload = v[:, :, 1:].reshape(num, -1)
    head = payload[:, :NIBBLES]
    valid = (
        (v[:, :, 0] == qmax).all(axis=1)
        & (head.shape[1] == NIBBLES)
        & ~payload[:, NIBBLES:].any(axis=1)
        & ((head >= 0) & (head <= 15) & (head == np.round(head))).all(axis=1)
    )
    zero = ~v.reshape(num, -1).any(axis=1)
    out: list[tuple[int, int] | None] = []
    for i in range(num):
        if zero[i]:
            out.append((0, 0))
        elif not valid[i]:
            out.append(None)
        else:
            nibbles = head[i].astype(np.uint64) << _SHIFTS
            out.append((int(nibbles[:16].sum()), int(nibbles[16:].sum())))  # disjoint bits: sum is OR
    return out


class StateStamps:
    """Stamps in the state tensors of ``mamba_pool`` for checkpoint format ``fmt``.

    ``model``: the raw int64 bytes of :mod:`mamba_radix.state_stamp` (a checkpoint is a bit copy).
    ``int8`` / ``fp8_e4m3``: value stamps (module docstring) with each tensor's quantization rows of
    ``row_lens`` (default: :func:`kernels.quant_naive.row_len_for` of its inner shape, what a
    :class:`~mamba_radix.pools.checkpoint_pool.CheckpointPool` uses); the pool's shapes must leave 32
    payload elements per layer's slot in every tensor (:class:`InvalidArgument` at construction).
    Writes touch only the slot written; reads have no side effects. O(slot elements) per call.
    """

    def __init__(self, fmt: str, mamba_pool: MambaPool, row_lens: Sequence[int] | None = None) -> None:
        self.fmt = check_format(fmt)
        self.pool = mamba_pool
        self.tensors = state_tensors(mamba_pool)
        if fmt == "model":
            self.qmax = 0.0
            self.row_lens: list[int] = []
            return
        self.qmax = qmax_of_format(fmt)
        lens = (
            [quant_naive.row_len_for(t.shape[2:]) for t in self.tensors]
            if row_lens is None
            else [int(r) for r in row_lens]
        )
        if len(lens) != len(self.tensors):
            raise InvalidArgument(f"got {len(lens)} row lengths for {len(self.tensors)} state tensors")
        for j, (t, row) in enumerate(zip(self.tensors, lens, strict=True)):
            numel = math.prod(t.shape[2:])
            if row < 1 or numel % row or _capacity(numel, row) < NIBBLES:
                raise InvalidArgument(
                    f"state tensor {j} (inner shape {tuple(t.shape[2:])}, rows of {row}) has "
                    f"{_capacity(numel, row) if row >= 1 and not numel % row else 0} stamp elements per "
                    f"layer's slot, a value stamp needs {NIBBLES}; use larger state shapes"
                )
        self.row_lens = lens

    @property
    def quantized(self) -> bool:
        return self.fmt != "model"

    def write(self, slot: int, fp: int, num_tokens: int) -> None:
        """The model left the state of a prefix with stamp ``(fp, num_tokens)`` in state slot ``slot``
        (every layer of every tensor). :class:`InvalidArgument`, nothing written, for a slot outside the
        pool or a stamp outside ``0..2**63-1``."""
        if not self.quantized:
            write_stamp(self.pool, slot, fp, num_tokens)
            return
        slot = check_slot(slot, self.tensors[0].shape[1])
        fp, num_tokens = check_stamp(fp, num_tokens)
        for t, row in zip(self.tensors, self.row_lens, strict=True):
            numel = math.prod(t.shape[2:])
            values = encode_rows(fp, num_tokens, numel, row, self.qmax).view(*t.shape[2:])
            t[:, slot] = values.to(device=t.device, dtype=t.dtype)  # broadcast over the layers

    def read(self, slot: int) -> tuple[int, int]:
        """The stamp state slot ``slot`` holds. :class:`InvalidArgument` if its layers or tensors disagree
        or hold no stamp (a partial copy or restore), or for a slot outside the pool."""
        if not self.quantized:
            return read_stamp(self.pool, slot)
        slot = check_slot(slot, self.tensors[0].shape[1])
        return self._decode(f"state slot {slot}", [t[:, slot] for t in self.tensors])

    def read_checkpoint(self, checkpoint_pool: CheckpointPool, ckpt_slot: int) -> tuple[int, int]:
        """The stamp checkpoint slot ``ckpt_slot`` of ``checkpoint_pool`` restores to: the slot
        dequantized by the format's own arithmetic (:meth:`CheckpointPool.read`), then read as
        :meth:`read` would. :class:`InvalidArgument` as :meth:`read`, or :class:`InvalidIndex` for a slot
        that is not allocated."""
        if not self.quantized:
            raise InvalidArgument("checkpoint_format='model' keeps checkpoints in state slots; use read()")
        restored = checkpoint_pool.read(ckpt_slot, self.tensors)
        return self._decode(f"checkpoint slot {ckpt_slot}", restored)

    def _decode(self, where: str, per_tensor: Sequence[torch.Tensor]) -> tuple[int, int]:
        """One stamp from each layer of each tensor (``[layers, *inner]``), all equal, else
        :class:`InvalidArgument`. O(slot elements)."""
        stamps: set[tuple[int, int] | None] = set()
        for x, row in zip(per_tensor, self.row_lens, strict=True):
            stamps.update(_decode_layers(x.reshape(x.shape[0], -1, row), self.qmax))
        if len(stamps) != 1 or None in stamps:
            shown = sorted(stamps, key=lambda s: (s is None, s or (0, 0)))
            raise InvalidArgument(
                f"{where} holds inconsistent or unreadable value stamps across layers/tensors: {shown}"
            )
        stamp = stamps.pop()
        assert stamp is not None
        return stamp
