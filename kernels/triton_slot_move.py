"""The Triton slot-move kernel: one launch moves slot pairs over all layers of up to four tensors.

Import this module only where triton imports (``mamba_radix_kernels.slot_move`` guards it). The launcher
and its preconditions live in :mod:`mamba_radix_kernels.slot_move`; the torch reference that specifies the
result is :func:`mamba_radix_kernels.naive.move_slots_ref`.

Grid: ``(num_pairs * num_layers, sum_k cdiv(n_k, BLOCK))``. Axis 0 is the large one (CUDA allows 2^31 - 1
there but only 65 535 on axes 1 and 2); program ``i_pl`` handles pair ``i_pl // num_layers`` and layer
``i_pl % num_layers``. Axis 1 enumerates the tiles of tensor 0, then those of tensor 1, and so on, so the
conv tensors and the temporal tensor (different dtypes, different inner sizes) share one launch.

Rules this kernel follows (see ``shared/reference/kernels.md`` §1.2 and §1.5):

- the layer and slot indices are widened to int64 *before* they meet a stride, because a Kimi-like pool
  has more than 2^31 elements; only the in-tile offsets stay int32;
- a disabled pair (index -1, or mask bit clear) is folded into the tile bound (``n_eff = 0``), so the grid
  is static: no host sync, no ``nonzero()``, safe to capture in a CUDA graph;
- no arithmetic on the moved values: the launcher passes integer views of the tensors, so every dtype is
  moved bit for bit (the interpreter would compute bf16 on bit patterns anyway);
- no runtime ``range`` loops (the 3.6 interpreter breaks on them with numpy >= 2.4), no block pointers,
  no autotune, no cache-modifier/eviction combinations.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Index modes (constexpr): where a pair's slot index comes from.
INDEX_TENSOR = 0  # loaded from an index tensor: idx_ptr[i]
INDEX_IDENTITY = 1  # the pair number itself: i (the staging-buffer side of gather/scatter)
INDEX_SCALAR = 2  # one runtime scalar for every pair (the source of a fork)


@triton.jit
def _pair_index(idx_ptr, scalar, i_p, MODE: tl.constexpr):
    """The slot index of pair ``i_p`` as an int64 scalar (see the INDEX_* modes)."""
    if MODE == 0:
        idx = tl.load(idx_ptr + i_p).to(tl.int64)
    elif MODE == 1:
        idx = i_p.to(tl.int64)
    else:
        idx = tl.cast(scalar, tl.int64)
    return idx


@triton.jit
def _move_tile(
    src_ptr,
    dst_ptr,
    n_eff,
    i_l,
    i_src,
    i_dst,
    src_layer_stride,
    src_slot_stride,
    dst_layer_stride,
    dst_slot_stride,
    i_t,
    BLOCK: tl.constexpr,
):
    """Copy tile ``i_t`` (``BLOCK`` elements, bounded by ``n_eff``) of one (layer, slot) row.

    ``i_l``, ``i_src`` and ``i_dst`` are int64, so the row offsets are computed in 64 bits; the pointers
    are advanced by the scalar row offset first and the in-tile offsets stay 32-bit (fewer registers).
    """
    src_row = src_ptr + (i_l * src_layer_stride + i_src * src_slot_stride)
    dst_row = dst_ptr + (i_l * dst_layer_stride + i_dst * dst_slot_stride)
    o_e = i_t * BLOCK + tl.arange(0, BLOCK)
    m_e = o_e < n_eff
    b_x = tl.load(src_row + o_e, mask=m_e)
    tl.store(dst_row + o_e, b_x, mask=m_e)


@triton.jit(do_not_specialize=["src_scalar"])
def slot_move_kernel(
    src_idx_ptr,
    dst_idx_ptr,
    mask_ptr,
    src_scalar,
    num_layers,
    # tensor 0
    s0,
    d0,
    n0,
    ssl0,
    sss0,
    dsl0,
    dss0,
    # tensor 1
    s1,
    d1,
    n1,
    ssl1,
    sss1,
    dsl1,
    dss1,
    # tensor 2
    s2,
    d2,
    n2,
    ssl2,
    sss2,
    dsl2,
    dss2,
    # tensor 3
    s3,
    d3,
    n3,
    ssl3,
    sss3,
    dsl3,
    dss3,
    NUM_TENSORS: tl.constexpr,
    SRC_MODE: tl.constexpr,
    DST_MODE: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``d_k[l, dst(i)] = s_k[l, src(i)]`` for the enabled pairs, every layer ``l`` and tensor ``k``.

    Per tensor ``k``: source/destination pointers, the inner element count ``n_k`` and the layer and slot
    strides (in elements) of the source and of the destination. Unused tensor slots (``k >= NUM_TENSORS``)
    are never read. ``mask_ptr`` points at uint8 flags (a bool tensor viewed as uint8) when ``HAS_MASK``.
    """
    i_pl = tl.program_id(0)
    i_t = tl.program_id(1)
    i_p = i_pl // num_layers
    i_l = (i_pl % num_layers).to(tl.int64)

    i_src = _pair_index(src_idx_ptr, src_scalar, i_p, SRC_MODE)
    i_dst = _pair_index(dst_idx_ptr, src_scalar, i_p, DST_MODE)
    ok = (i_src >= 0) & (i_dst >= 0)
    if HAS_MASK:
        ok = ok & (tl.load(mask_ptr + i_p) != 0)

    # Which tensor this tile belongs to: a chain of scalar branches over the cumulative tile counts, so a
    # program touches exactly one tensor and issues no dead memory instructions for the others.
    T0 = tl.cdiv(n0, BLOCK)
    if i_t < T0:
        _move_tile(s0, d0, tl.where(ok, n0, 0), i_l, i_src, i_dst, ssl0, sss0, dsl0, dss0, i_t, BLOCK)
    elif NUM_TENSORS > 1:
        i_t1 = i_t - T0
        T1 = tl.cdiv(n1, BLOCK)
        if i_t1 < T1:
            _move_tile(s1, d1, tl.where(ok, n1, 0), i_l, i_src, i_dst, ssl1, sss1, dsl1, dss1, i_t1, BLOCK)
        elif NUM_TENSORS > 2:
            i_t2 = i_t1 - T1
            T2 = tl.cdiv(n2, BLOCK)
            if i_t2 < T2:
                _move_tile(
                    s2, d2, tl.where(ok, n2, 0), i_l, i_src, i_dst, ssl2, sss2, dsl2, dss2, i_t2, BLOCK
                )
            elif NUM_TENSORS > 3:
                _move_tile(
                    s3, d3, tl.where(ok, n3, 0), i_l, i_src, i_dst, ssl3, sss3, dsl3, dss3, i_t2 - T2, BLOCK
                )
