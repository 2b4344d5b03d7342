"""Pure-torch reference of the checkpoint quantization kernels: the specification and the CPU path.

A *checkpoint store* holds state slots in a compact format. For each pool tensor ``x`` of shape
``[num_layers, num_slots, *inner]`` (fp32 or bf16, the model's dtype) the store has

- ``q``: ``[num_layers, num_store_slots, num_rows, row_len]`` in ``torch.int8`` or ``torch.float8_e4m3fn``,
  where ``num_rows * row_len == prod(inner)``: the slot's inner elements in row-major order, cut into rows;
- ``scale``: ``[num_layers, num_store_slots, num_rows]`` fp32, one scale per row.

The row length is a property of the store (``q.shape[-1]``); :func:`row_len_for` is the default rule.

**Quantization of one row** ``v`` (fp32; ``v = x`` upcast, or ``x + r`` with error feedback), exactly in
this order, every step an IEEE fp32 operation rounded to nearest-even:

1. ``absmax = max_i |v_i|`` (a max: exact, independent of the reduction order);
2. ``scale = absmax / QMAX`` with ``QMAX = 127`` (int8) or ``448`` (fp8 e4m3, its largest finite value);
3. ``y_i = v_i / d`` with ``d = scale`` if ``scale > 0`` else ``1`` (an all-zero row: y = 0, scale = 0);
4. int8: ``q_i = clamp(round_half_even(y_i), -127, 127)`` (symmetric: -128 is never produced);
   fp8: ``q_i = e4m3(clamp(y_i, -448, 448))``, the round-to-nearest-even conversion to float8_e4m3fn
   (subnormals included). The clamp only catches ``y`` a rounding above ``QMAX``.

**Dequantization**: ``x_hat_i = to_model_dtype(float32(q_i) * scale)`` (one fp32 multiply, then the
round-to-nearest-even conversion to bf16 when the model dtype is bf16).

Error bound (per element, before the bf16 conversion): int8 ``|x_hat - v| <= scale / 2 * (1 + 2^-22)``, i.e.
``absmax / 254``; fp8 relative ``2^-4`` of ``|v|`` for ``|y| >= 2^-6`` (3 mantissa bits), and at most
``2^-10 * scale`` absolute below (subnormal spacing ``2^-9``).

**Error feedback** (optional, per *live* slot): a residual ``r`` (fp32, the pool tensor's shape) is kept for
every live slot. Quantizing live slot ``s`` then uses ``v = float32(x[s]) + r[s]`` and, after the store is
written, sets ``r[s] = v - float32(q) * scale`` (the part of ``v`` the stored checkpoint lacks; one fp32
multiply and one subtract). So the *lineage* of a live slot, the successive checkpoints it hands over while
the same request runs, carries each hand-over's error into the next one (sigma-delta: the sum over the
lineage of the stored values tracks the sum of the true states). Callers zero ``r[s]`` when the slot starts a
new lineage (a request admitted without a hit, or a state restored from a checkpoint, whose own residual
was not stored). Note what this does and does not do: the checkpoint ``k`` of a lineage has error
``r_{k-1} - r_k`` instead of ``-r_k``; it does not shrink the error of one restore.

Preconditions: values are finite (an inf or NaN makes its row's scale non-finite);
:mod:`mamba_radix.checkpoint_format` checks that, and index relations, before calling in here.
Complexity: O(pairs * layers * inner) per tensor, with temporaries of the gathered rows (this is the CPU
path and the oracle, not a fast path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mamba_radix.errors import InvalidArgument

__all__ = [
    "FP8_E4M3_MAX",
    "INT8_QMAX",
    "MIN_ROW_ELEMENTS",
    "MODEL_DTYPES",
    "QUANT_DTYPES",
    "check_quant_layout",
    "dequantize_rows_ref",
    "dequantize_scatter_ref",
    "qmax_of",
    "quantize_gather_ref",
    "quantize_rows_ref",
    "row_len_for",
]

INT8_QMAX = 127.0
FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn
QUANT_DTYPES = (torch.int8, torch.float8_e4m3fn)
# Model dtypes the kernels read and write: fp32 and bf16. fp16 would need a hand-written fp32 -> fp16
# rounding in the kernel (the interpreter truncates dtype conversions); nothing here uses it.
MODEL_DTYPES = (torch.float32, torch.bfloat16)
# The default row merges trailing inner dims until it holds at least this many elements: a 4-byte scale per
# row then costs <= 6.25 % over int8 (and a [conv_dim, kernel=4] conv window does not get a scale per 4 values).
MIN_ROW_ELEMENTS = 64


def qmax_of(qdtype: torch.dtype) -> float:
    """The value a row's absmax maps to: 127 for int8, 448 for float8_e4m3fn."""
    if qdtype == torch.int8:
        return INT8_QMAX
    if qdtype == torch.float8_e4m3fn:
        return FP8_E4M3_MAX
    raise InvalidArgument(f"no quantized format stores {qdtype}; use torch.int8 or torch.float8_e4m3fn")


def row_len_for(inner_shape: Sequence[int]) -> int:
    """The default row length for a tensor with inner shape ``inner_shape``: the last dim, times the dims
    before it while the row is shorter than :data:`MIN_ROW_ELEMENTS` (a ``[heads, dk, dv]`` state with
    ``dv >= 64`` gets one scale per ``(head, k)``; a small state, one per head or per slot). O(len(shape))."""
    shape = [int(d) for d in inner_shape]
    if not shape:
        return 1
    row = shape[-1]
    for d in reversed(shape[:-1]):
        if row >= MIN_ROW_ELEMENTS:
            break
        row *= d
    return max(row, 1)


def quantize_rows_ref(v: torch.Tensor, qdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the rows of ``v`` (``[..., row_len]``, fp32) to ``qdtype``; returns ``(q, scale)`` with
    ``scale`` of shape ``v.shape[:-1]`` fp32. Pure function (module docstring, steps 1-4)."""
    qmax = qmax_of(qdtype)
    v = v.to(torch.float32)
    absmax = v.abs().amax(dim=-1)
    scale = absmax / qmax
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = v / divisor.unsqueeze(-1)
    if qdtype == torch.int8:
        q = torch.round(y).clamp_(-INT8_QMAX, INT8_QMAX).to(torch.int8)  # torch.round: half to even
    else:
        q = y.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_rows_ref(q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``to(out_dtype)(float32(q) * scale[..., None])``: the rows back in the model dtype. Pure function."""
    return (q.to(torch.float32) * scale.unsqueeze(-1)).to(out_dtype)


def _is_tensor_list(x: object) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (torch.Tensor, str, bytes))


def check_quant_layout(
    pool: Sequence[torch.Tensor],
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    residuals: Sequence[torch.Tensor] | None = None,
) -> None:
    """Check that ``qs``/``scales`` form a checkpoint store for the pool tensors ``pool`` (module
    docstring), and ``residuals`` (if given) are fp32 tensors of the pool's shapes. Raises
    :class:`~mamba_radix.errors.InvalidArgument` naming the first mismatch. Reads no values. O(tensors)."""
    for name, seq in (("pool", pool), ("qs", qs), ("scales", scales)):
        if not _is_tensor_list(seq) or not seq:
            raise InvalidArgument(f"{name} must be a non-empty list of tensors, got {type(seq).__name__}")
    if not len(pool) == len(qs) == len(scales):
        raise InvalidArgument(
            f"got {len(pool)} pool tensors, {len(qs)} quantized and {len(scales)} scale tensors; pass one "
            "quantized tensor and one scale tensor per pool tensor"
        )
    if residuals is not None and (not _is_tensor_list(residuals) or len(residuals) != len(pool)):
        raise InvalidArgument("residuals must be a list with one fp32 tensor per pool tensor (or None)")
    qdtype = None
    for j, (x, q, s) in enumerate(zip(pool, qs, scales, strict=True)):
        for name, t in (("pool", x), ("qs", q), ("scales", s)):
            if not isinstance(t, torch.Tensor):
                raise InvalidArgument(f"{name}[{j}] is a {type(t).__name__}, expected a torch.Tensor")
        if x.dtype not in MODEL_DTYPES:
            raise InvalidArgument(
                f"pool[{j}] has dtype {x.dtype}; quantized checkpoints read and write float32 or bfloat16 states"
            )
        if x.dim() < 2:
            raise InvalidArgument(
                f"pool[{j}] has shape {tuple(x.shape)}; expected [num_layers, num_slots, *inner]"
            )
        if q.dtype not in QUANT_DTYPES or (qdtype is not None and q.dtype != qdtype):
            raise InvalidArgument(
                f"qs[{j}] has dtype {q.dtype}; a store holds torch.int8 or torch.float8_e4m3fn, one for all tensors"
            )
        qdtype = q.dtype
        inner = math.prod(x.shape[2:])
        if q.dim() != 4 or q.shape[0] != x.shape[0] or q.shape[2] * q.shape[3] != inner or q.shape[3] < 1:
            raise InvalidArgument(
                f"qs[{j}] has shape {tuple(q.shape)}; expected [{x.shape[0]}, num_store_slots, num_rows, "
                f"row_len] with num_rows * row_len = {inner} (the pool tensor's inner elements)"
            )
        if s.dtype != torch.float32 or tuple(s.shape) != tuple(q.shape[:3]):
            raise InvalidArgument(
                f"scales[{j}] is {s.dtype} {tuple(s.shape)}; expected float32 {tuple(q.shape[:3])}"
            )
        if not (x.device == q.device == s.device):
            raise InvalidArgument(
                f"tensor {j}: pool on {x.device}, qs on {q.device}, scales on {s.device}; use one device"
            )
        if residuals is not None:
            r = residuals[j]
            if not isinstance(r, torch.Tensor) or r.dtype != torch.float32 or r.shape != x.shape:
                got = f"{r.dtype} {tuple(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
                raise InvalidArgument(
                    f"residuals[{j}] is {got}; expected float32 {tuple(x.shape)} (the pool tensor's shape)"
                )
            if r.device != x.device:
                raise InvalidArgument(
                    f"residuals[{j}] is on {r.device}, pool[{j}] on {x.device}; use one device"
                )


def _pairs(
    src: torch.Tensor, dst: torch.Tensor, src_slots: int, dst_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Enabled (both >= 0) pairs as int64 CPU tensors, range-checked. O(k)."""
    for name, t in (("src", src), ("dst", dst)):
        if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise InvalidArgument(f"{name} must be an integer tensor of slot indices")
    s, d = src.reshape(-1).to("cpu", torch.int64), dst.reshape(-1).to("cpu", torch.int64)
    if s.numel() != d.numel():
        raise InvalidArgument(f"src has {s.numel()} entries and dst {d.numel()}; pass one per pair")
    keep = (s >= 0) & (d >= 0)
    s, d = s[keep], d[keep]
    for name, t, n in (("src", s, src_slots), ("dst", d, dst_slots)):
        if t.numel() and int(t.max()) >= n:
            raise InvalidArgument(f"{name} slot {int(t.max())} is outside slots 0..{n - 1}")
    return s, d


def quantize_gather_ref(
    pool: Sequence[torch.Tensor],
    src: torch.Tensor,
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    dst: torch.Tensor,
    residuals: Sequence[torch.Tensor] | None = None,
) -> None:
    """For every enabled pair ``i`` (``src[i] >= 0`` and ``dst[i] >= 0``) and every tensor ``j``: quantize
    slot ``src[i]`` of ``pool[j]`` (all layers) into store slot ``dst[i]`` of ``qs[j]``/``scales[j]``.

    With ``residuals``: error feedback, ``residuals[j][:, src[i]]`` is added before quantizing and then
    replaced by the new residual (module docstring). Side effects: writes the store slots (and residual
    slots). Index relations (duplicate destinations; duplicate sources with residuals) are preconditions.
    """
    check_quant_layout(pool, qs, scales, residuals)
    s, d = _pairs(src, dst, pool[0].shape[1], qs[0].shape[1])
    if s.numel() == 0:
        return
    for j, (x, q, sc) in enumerate(zip(pool, qs, scales, strict=True)):
        dev_s, dev_d = s.to(x.device), d.to(x.device)
        rows = x[:, dev_s].to(torch.float32).reshape(x.shape[0], s.numel(), q.shape[2], q.shape[3])
        if residuals is not None:
            res = residuals[j]
            rows = rows + res[:, dev_s].reshape(rows.shape)
        qq, ss = quantize_rows_ref(rows, q.dtype)
        q[:, dev_d] = qq
        sc[:, dev_d] = ss
        if residuals is not None:
            back = qq.to(torch.float32) * ss.unsqueeze(-1)
            res[:, dev_s] = (rows - back).reshape(res[:, dev_s].shape)


def dequantize_scatter_ref(
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    src: torch.Tensor,
    pool: Sequence[torch.Tensor],
    dst: torch.Tensor,
) -> None:
    """For every enabled pair ``i`` and tensor ``j``: write the dequantized store slot ``src[i]`` into pool
    slot ``dst[i]`` of ``pool[j]`` (all layers, in the pool's dtype). Side effect: writes the pool slots."""
    check_quant_layout(pool, qs, scales)
    s, d = _pairs(src, dst, qs[0].shape[1], pool[0].shape[1])
    if s.numel() == 0:
        return
    for x, q, sc in zip(pool, qs, scales, strict=True):
        dev_s, dev_d = s.to(x.device), d.to(x.device)
        out = dequantize_rows_ref(q[:, dev_s], sc[:, dev_s], x.dtype)
        x[:, dev_d] = out.reshape(x.shape[0], s.numel(), *x.shape[2:])
