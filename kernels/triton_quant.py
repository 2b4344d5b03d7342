"""Triton kernels for checkpoint quantization: quantize-gather (pool -> store) and dequantize-scatter
(store -> pool), bit-exact to :mod:`mamba_radix_kernels.quant_naive`.

Import this module only where triton imports (:mod:`mamba_radix.checkpoint_format` does so lazily, after
checking :func:`mamba_radix_kernels.slot_move.triton_usable`). Layout, formats and the exact arithmetic are
specified in :mod:`.quant_naive`; the launchers check the layout with the same
:func:`~.quant_naive.check_quant_layout` and leave index relations to the caller.

Grid per pool tensor: ``(num_pairs * num_layers, cdiv(num_rows, ROWS))``; one program quantizes (or
restores) ``ROWS`` rows of one (pair, layer), a ``[ROWS, BLOCK_C]`` tile with ``BLOCK_C >= row_len``, so a
row's absmax is one in-register reduction. One launch per pool tensor covers every layer and every pair.

How bit-exactness with torch is obtained (the interpreter computes with numpy on the host, the GPU with
PTX; both must equal torch's CPU results):

- every value op is fp32, and bf16 is never computed on: a bf16 input is loaded as int16 bits and widened
  by a shift (exact), a bf16 output is rounded to nearest-even by integer arithmetic on the fp32 bits
  (the interpreter's ``.to(tl.bfloat16)`` truncates; kernels.md §1.2);
- the division is ``tl.math.div_rn`` (correctly rounded on the GPU; a plain ``/`` is an approximate
  ``div.full.f32`` there); the absmax is a max (exact in any order);
- round-half-to-even to an integer is ``(y + 1.5 * 2^23) - 1.5 * 2^23``, exact RNE for ``|y| < 2^22``;
- fp8 e4m3 is encoded and decoded with integer bit arithmetic (no reliance on the backend's fp8
  conversions, which differ between the interpreter and the GPU: triton#8322);
- launches pass ``enable_fp_fusion=False``: a fused multiply-add would skip the rounding of
  ``q * scale`` in the error-feedback residual ``v - q * scale``.

Offsets: layer and slot indices are int64 before they meet a stride; in-tile offsets stay int32. A ``-1``
index skips its pair (the row bound is folded to 0), so the grid is static and nothing syncs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from mamba_radix.errors import InvalidArgument

from .quant_naive import check_quant_layout, qmax_of

__all__ = ["dequantize_scatter_triton", "quantize_gather_triton"]

FMT_INT8 = 0
FMT_FP8 = 1
_TILE_ELEMENTS = 4096  # ROWS * BLOCK_C per program
_MAX_BLOCK_C = 16384  # longest row one program reduces


@triton.jit
def _load_f32(ptr, offs, mask, IS_BF16: tl.constexpr):
    """fp32 values at ``ptr + offs`` (bf16 storage is passed as int16 and widened exactly)."""
    if IS_BF16:
        b = tl.load(ptr + offs, mask=mask, other=0).to(tl.int32) & 0xFFFF
        v = (b << 16).to(tl.float32, bitcast=True)
    else:
        v = tl.load(ptr + offs, mask=mask, other=0.0)
    return v


@triton.jit
def _store_from_f32(ptr, offs, v, mask, IS_BF16: tl.constexpr):
    """Store fp32 ``v``; as bf16 bits rounded to nearest-even (NaN -> 0x7FC0) when ``IS_BF16``."""
    if IS_BF16:
        bits = v.to(tl.int32, bitcast=True)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
        rounded = tl.where(v != v, 0x7FC0, rounded)
        tl.store(ptr + offs, rounded.to(tl.int16), mask=mask)
    else:
        tl.store(ptr + offs, v, mask=mask)


@triton.jit
def _rne_int(y):
    """Round fp32 ``y`` (``|y| < 2^22``) to the nearest integer, ties to even, as fp32."""
    return (y + 12582912.0) - 12582912.0


@triton.jit
def _fp8_encode(y):
    """float8_e4m3fn bits (int32 in 0..255) of fp32 ``y`` with ``|y| <= 448``, round to nearest even."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag_bits = bits & 0x7FFFFFFF
    a = mag_bits.to(tl.float32, bitcast=True)
    # below 2^-6 the format is fixed-point with step 2^-9; 8 * 2^-9 is the smallest normal (code 0x08)
    sub = _rne_int(a * 512.0).to(tl.int32)
    r = mag_bits + 0x7FFFF + ((mag_bits >> 20) & 1)  # round the mantissa to 3 bits, carry into the exponent
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)  # exponent rebiased from 127 to 7
    return sign | tl.where(a < 0.015625, sub, normal)


@triton.jit
def _fp8_decode(b):
    """fp32 value of float8_e4m3fn bits ``b`` (int32 in 0..255; NaN codes are never stored)."""
    sign = b & 0x80
    e = (b >> 3) & 15
    m = b & 7
    normal = ((sign << 24) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    # the sign is OR-ed into the bits: a negation would give +0.0 for the code 0x80 under the interpreter
    sub = ((m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True) | (sign << 24)).to(
        tl.float32, bitcast=True
    )
    return tl.where(e == 0, sub, normal)


@triton.jit
def _pair_tile(
    src_idx_ptr, dst_idx_ptr, num_layers, num_rows, row_len, ROWS: tl.constexpr, BLOCK_C: tl.constexpr
):
    """This program's share of the work, the same for both kernels: program axis 0 is (pair, layer), axis 1 a
    block of ``ROWS`` rows. Returns the layer, the source and destination slots (int64: offsets past 2^31
    must not wrap), the block's row offsets and row mask (all rows masked for a disabled pair, an index
    < 0), and its element offsets and mask."""
    i_pl = tl.program_id(0)
    i_rb = tl.program_id(1)
    i_p = i_pl // num_layers
    i_l = (i_pl % num_layers).to(tl.int64)
    i_src = tl.load(src_idx_ptr + i_p).to(tl.int64)
    i_dst = tl.load(dst_idx_ptr + i_p).to(tl.int64)
    rows_eff = tl.where((i_src >= 0) & (i_dst >= 0), num_rows, 0)
    o_r = i_rb * ROWS + tl.arange(0, ROWS)
    o_c = tl.arange(0, BLOCK_C)
    m_r = o_r < rows_eff
    m = m_r[:, None] & (o_c[None, :] < row_len)
    o_e = o_r[:, None] * row_len + o_c[None, :]
    return i_l, i_src, i_dst, o_r, m_r, o_e, m


@triton.jit
def quantize_gather_kernel(
    x_ptr,
    src_idx_ptr,
    x_sl,
    x_ss,
    q_ptr,
    s_ptr,
    dst_idx_ptr,
    q_sl,
    q_ss,
    s_sl,
    s_ss,
    r_ptr,
    r_sl,
    r_ss,
    num_layers,
    num_rows,
    row_len,
    QMAX: tl.constexpr,
    FMT: tl.constexpr,
    IS_BF16: tl.constexpr,
    HAS_RES: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Quantize rows ``[i_r * ROWS, +ROWS)`` of slot ``src[p]``, layer ``l`` into store slot ``dst[p]``."""
    i_l, i_src, i_dst, o_r, m_r, o_e, m = _pair_tile(
        src_idx_ptr, dst_idx_ptr, num_layers, num_rows, row_len, ROWS, BLOCK_C
    )

    v = _load_f32(x_ptr + (i_l * x_sl + i_src * x_ss), o_e, m, IS_BF16)
    if HAS_RES:
        r_row = r_ptr + (i_l * r_sl + i_src * r_ss)
        v = v + tl.load(r_row + o_e, mask=m, other=0.0)
    absmax = tl.max(tl.where(m, tl.abs(v), 0.0), axis=1)
    scale = tl.math.div_rn(absmax, QMAX)
    divisor = tl.where(scale > 0.0, scale, 1.0)
    y = tl.math.div_rn(v, divisor[:, None])
    if FMT == 0:
        qf = tl.minimum(tl.maximum(_rne_int(y), -QMAX), QMAX)
        tl.store(q_ptr + (i_l * q_sl + i_dst * q_ss) + o_e, qf.to(tl.int8), mask=m)
    else:
        code = _fp8_encode(tl.minimum(tl.maximum(y, -QMAX), QMAX))
        tl.store(q_ptr + (i_l * q_sl + i_dst * q_ss) + o_e, code.to(tl.uint8), mask=m)
        qf = _fp8_decode(code)
    tl.store(s_ptr + (i_l * s_sl + i_dst * s_ss) + o_r, scale, mask=m_r)
    if HAS_RES:
        tl.store(r_row + o_e, v - qf * scale[:, None], mask=m)


@triton.jit
def dequantize_scatter_kernel(
    q_ptr,
    s_ptr,
    src_idx_ptr,
    q_sl,
    q_ss,
    s_sl,
    s_ss,
    x_ptr,
    dst_idx_ptr,
    x_sl,
    x_ss,
    num_layers,
    num_rows,
    row_len,
    FMT: tl.constexpr,
    IS_BF16: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Write the dequantized rows of store slot ``src[p]``, layer ``l`` into pool slot ``dst[p]``."""
    i_l, i_src, i_dst, o_r, m_r, o_e, m = _pair_tile(
        src_idx_ptr, dst_idx_ptr, num_layers, num_rows, row_len, ROWS, BLOCK_C
    )

    raw = tl.load(q_ptr + (i_l * q_sl + i_src * q_ss) + o_e, mask=m, other=0)
    if FMT == 0:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
        qf = raw.to(tl.float32)
    else:
        qf = _fp8_decode(raw.to(tl.int32) & 0xFF)
    scale = tl.load(s_ptr + (i_l * s_sl + i_src * s_ss) + o_r, mask=m_r, other=0.0)
    _store_from_f32(x_ptr + (i_l * x_sl + i_dst * x_ss), o_e, qf * scale[:, None], m, IS_BF16)


# ------------------------------------------------------------------------------------------ launchers


def _next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _tile(row_len: int) -> tuple[int, int]:
    block_c = _next_pow2(row_len)
    if block_c > _MAX_BLOCK_C:
        raise InvalidArgument(
            f"row_len {row_len} exceeds {_MAX_BLOCK_C}, the longest row one program reduces; use shorter rows"
        )
    return max(1, _TILE_ELEMENTS // block_c), block_c


def _index(x: torch.Tensor, name: str, n: int, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool:
        raise InvalidArgument(f"{name} must be an integer tensor of slot indices")
    x = x.reshape(-1)
    if x.numel() != n:
        raise InvalidArgument(f"{name} has {x.numel()} entries, expected {n}")
    return x.to(device, torch.int64, non_blocking=True).contiguous()


def _check_inner(t: torch.Tensor, what: str) -> None:
    expected = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:]), strict=True):
        if size != 1 and stride != expected:
            raise InvalidArgument(f"{what} has non-contiguous inner dims (strides {tuple(t.stride())})")
        expected *= size


def _check_host_range(idx: torch.Tensor, slots: int, name: str) -> None:
    # The interpreter has no bounds checks (kernels.md §1.2); reading CPU indices costs no device sync.
    if idx.device.type != "cuda" and idx.numel() and int(idx.max()) >= slots:
        raise InvalidArgument(f"{name} {int(idx.max())} is outside slots 0..{slots - 1}")


def _bits_in(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16) if x.dtype == torch.bfloat16 else x


def _tensor_tiles(
    pool: Sequence[torch.Tensor],
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    src: torch.Tensor,
    dst: torch.Tensor,
    src_slots: int,
    dst_slots: int,
) -> list[
    tuple[
        int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int], int, int
    ]
]:
    """What both launchers do before a launch: the pair indices checked (against ``src_slots`` /
    ``dst_slots``) and moved to the device once, then per pool tensor with work to do ``(j, x, q, scale,
    src_idx, dst_idx, grid, rows, block_c)``. Everything is checked before the first launch, so a refused
    call writes nothing. Empty for no pairs. O(pairs + tensors)."""
    device = pool[0].device
    n = src.numel() if isinstance(src, torch.Tensor) else -1
    s_idx, d_idx = _index(src, "src", n, device), _index(dst, "dst", n, device)
    if n == 0:
        return []
    _check_host_range(s_idx, src_slots, "src")
    _check_host_range(d_idx, dst_slots, "dst")
    out = []
    for j, (x, q, sc) in enumerate(zip(pool, qs, scales, strict=True)):
        _check_inner(x, f"pool[{j}]")
        _check_inner(q, f"qs[{j}]")
        num_layers, num_rows, row_len = x.shape[0], q.shape[2], q.shape[3]
        if num_layers == 0 or num_rows == 0:
            continue
        rows, block_c = _tile(row_len)
        out.append((j, x, q, sc, s_idx, d_idx, (n * num_layers, math.ceil(num_rows / rows)), rows, block_c))
    return out


def quantize_gather_triton(
    pool: Sequence[torch.Tensor],
    src: torch.Tensor,
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    dst: torch.Tensor,
    residuals: Sequence[torch.Tensor] | None = None,
) -> None:
    """The Triton version of :func:`~.quant_naive.quantize_gather_ref` (same arguments and result).

    Side effects: writes the store slots (and residual slots); enqueues one launch per pool tensor on the
    current stream and returns without waiting. Cost: O(pairs * layers * inner) reads and writes.
    """
    check_quant_layout(pool, qs, scales, residuals)
    tiles = _tensor_tiles(pool, qs, scales, src, dst, pool[0].shape[1], qs[0].shape[1])
    for j, x, q, sc, s_idx, d_idx, grid, rows, block_c in tiles:
        num_layers, num_rows, row_len = x.shape[0], q.shape[2], q.shape[3]
        r = residuals[j] if residuals is not None else None
        if r is not None:
            _check_inner(r, f"residuals[{j}]")
        qb = q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q
        quantize_gather_kernel[grid](
            _bits_in(x),
            s_idx,
            x.stride(0),
            x.stride(1),
            qb,
            sc,
            d_idx,
            q.stride(0),
            q.stride(1),
            sc.stride(0),
            sc.stride(1),
            r if r is not None else sc,
            r.stride(0) if r is not None else 0,
            r.stride(1) if r is not None else 0,
            num_layers,
            num_rows,
            row_len,
            QMAX=qmax_of(q.dtype),
            FMT=FMT_INT8 if q.dtype == torch.int8 else FMT_FP8,
            IS_BF16=x.dtype == torch.bfloat16,
            HAS_RES=r is not None,
            ROWS=rows,
            BLOCK_C=block_c,
            enable_fp_fusion=False,
        )


def dequantize_scatter_triton(
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    src: torch.Tensor,
    pool: Sequence[torch.Tensor],
    dst: torch.Tensor,
) -> None:
    """The Triton version of :func:`~.quant_naive.dequantize_scatter_ref` (same arguments and result).

    Side effects: writes the pool slots; one launch per pool tensor, no host synchronisation on CUDA.
    """
    check_quant_layout(pool, qs, scales)
    for _j, x, q, sc, s_idx, d_idx, grid, rows, block_c in _tensor_tiles(
        pool, qs, scales, src, dst, qs[0].shape[1], pool[0].shape[1]
    ):
        num_layers, num_rows, row_len = x.shape[0], q.shape[2], q.shape[3]
        qb = q.view(torch.uint8) if q.dtype == torch.float8_e4m3fn else q
        dequantize_scatter_kernel[grid](
            qb,
            sc,
            s_idx,
            q.stride(0),
            q.stride(1),
            sc.stride(0),
            sc.stride(1),
            _bits_in(x),
            d_idx,
            x.stride(0),
            x.stride(1),
            num_layers,
            num_rows,
            row_len,
            FMT=FMT_INT8 if q.dtype == torch.int8 else FMT_FP8,
            IS_BF16=x.dtype == torch.bfloat16,
            ROWS=rows,
            BLOCK_C=block_c,
            enable_fp_fusion=False,
        )
