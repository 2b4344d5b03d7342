"""Quantized checkpoint formats: Triton kernels vs the torch reference bit for bit, error bounds, refusals.

On a CPU machine the Triton kernels run under ``TRITON_INTERPRET=1`` (conftest.py). Every comparison is
on the integer bit patterns of whole tensors (store, scales, residuals, pool), so a stray write fails too.
Error bounds: the per-element bounds of the formats (kernels/quant_naive.py), and the logit bounds that
``benchmarks/fidelity_quant.py`` measured on the reference engine (docs/checkpoint-formats.md), pinned at
the worst measured value times a margin.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mamba_radix_kernels import quant_naive, slot_move

from mamba_radix import checkpoint_format as cf
from mamba_radix.errors import InvalidArgument

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    not slot_move.triton_usable(DEVICE),
    reason=f"Triton kernels cannot run on {DEVICE} here (triton missing or TRITON_INTERPRET unset)",
)
FORMATS = ("int8", "fp8_e4m3")
MODEL_DTYPES = (torch.float32, torch.bfloat16)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same(got, want, what: str) -> None:
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        if not torch.equal(bits(g), bits(w)):
            n = int((bits(g) != bits(w)).sum())
            raise AssertionError(f"{what}: tensor {j} ({g.dtype}) differs at {n} elements")


def make_pool(inners, dtype, num_layers=2, num_slots=6, seed=0, spread=True):
    """Random states with magnitudes over many binades (subnormal fp8 codes, zero rows, -0.0)."""
    g = torch.Generator().manual_seed(seed)
    pool = []
    for inner in inners:
        x = torch.randn((num_layers, num_slots, *inner), generator=g)
        if spread:
            x = x * torch.exp2(torch.randint(-12, 6, x.shape, generator=g).float())
        x[:, 0] = 0.0  # slot 0: the padding slot, all zero
        x.view(-1)[1] = -0.0
        pool.append(x.to(dtype).to(DEVICE))
    return pool


def clone(ts):
    return [t.clone() for t in ts]


def run_both(fmt, pool, src, dst, feedback, store_slots=4, row_lens=None):
    """Quantize with both backends; return (store, residuals) of each."""
    out = []
    g = torch.Generator().manual_seed(7)
    res0 = [(torch.randn(t.shape, generator=g) * 1e-3).to(DEVICE) for t in pool] if feedback else None
    for backend in ("torch", "triton"):
        store = cf.new_checkpoint_store(fmt, pool, store_slots, row_lens)
        res = clone(res0) if feedback else None
        cf.quantize_slots(pool, src, store, dst, residuals=res, backend=backend)
        out.append((store, res))
    return out


# ------------------------------------------------------------------------------------- bit-exactness
@needs_triton
@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("feedback", [False, True], ids=["plain", "feedback"])
def test_triton_matches_reference(fmt, dtype, feedback):
    pool = make_pool([(3, 7), (2, 4, 16)], dtype)
    (a, ra), (b, rb) = run_both(fmt, pool, [1, 2, 5], [3, 0, 1], feedback)
    assert_same(b.qs, a.qs, "quantized")
    assert_same(b.scales, a.scales, "scales")
    if feedback:
        assert_same(rb, ra, "residuals")
    restored = []
    for backend in ("torch", "triton"):
        p = clone(pool)
        cf.dequantize_slots(a, [0, 1, 3], p, [4, 3, 2], backend=backend)
        restored.append(p)
    assert_same(restored[1], restored[0], "dequantized pool")


@needs_triton
@settings(max_examples=12, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    dtype=st.sampled_from(MODEL_DTYPES),
    inner=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    num_layers=st.integers(1, 3),
    pairs=st.lists(
        st.tuples(st.integers(-1, 5), st.integers(-1, 3)), min_size=1, max_size=4, unique_by=lambda p: p[1]
    ),
    feedback=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_triton_matches_reference_random(fmt, dtype, inner, num_layers, pairs, feedback, seed):
    """Random inner shapes (default rows), layer counts and pairs with -1 skips, bit-exact both ways."""
    pool = make_pool([tuple(inner), (2, 5)], dtype, num_layers=num_layers, seed=seed)
    src = torch.tensor([p[0] for p in pairs])
    dst = torch.tensor([p[1] for p in pairs])
    results = []
    for backend in ("torch", "triton"):
        store = cf.new_checkpoint_store(fmt, pool, 4)
        res = [torch.full(t.shape, 1e-4, device=DEVICE) for t in pool] if feedback else None
        # skips go straight to the kernels (the entry point refuses -1); duplicates of src are excluded
        keep = (src >= 0) & (dst >= 0)
        if feedback and len(set(src[keep].tolist())) != int(keep.sum()):
            return
        fn = quant_naive.quantize_gather_ref if backend == "torch" else _triton().quantize_gather_triton
        fn(pool, src, store.qs, store.scales, dst, res)
        p = clone(pool)
        back = (
            quant_naive.dequantize_scatter_ref if backend == "torch" else _triton().dequantize_scatter_triton
        )
        back(store.qs, store.scales, dst.clamp(max=3), p, src)
        results.append((store, res, p))
    (a, ra, pa), (b, rb, pb) = results
    assert_same(b.qs, a.qs, "quantized")
    assert_same(b.scales, a.scales, "scales")
    assert_same(pb, pa, "restored pool")
    if feedback:
        assert_same(rb, ra, "residuals")


def _triton():
    from mamba_radix_kernels import triton_quant

    return triton_quant


@needs_triton
def test_fp8_every_bf16_value_encodes_like_torch():
    """Every bf16 value in [-448, 448] (subnormals of e4m3, ties, -0.0) through a row whose absmax is
    448 (scale 1): the kernel's integer e4m3 encoder and decoder equal torch's conversions."""
    vals = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    vals = vals[torch.isfinite(vals) & (vals.abs() <= 448)]
    n_rows = math.ceil(vals.numel() / 255)
    rows = torch.zeros(n_rows * 255)
    rows[: vals.numel()] = vals
    x = torch.cat([torch.full((n_rows, 1), 448.0), rows.view(n_rows, 255)], dim=1)
    pool = [x.reshape(1, 1, n_rows * 256).to(DEVICE)]
    (a, _), (b, _) = run_both("fp8_e4m3", pool, [0], [0], False, store_slots=1, row_lens=[256])
    assert bool((a.scales[0] == 1.0).all())
    assert_same(b.qs, a.qs, "fp8 codes")
    restored = []
    for backend in ("torch", "triton"):
        p = [torch.zeros_like(pool[0])]
        cf.dequantize_slots(a, [0], p, [0], backend=backend)
        restored.append(p)
    assert_same(restored[1], restored[0], "fp8 decode")


# ------------------------------------------------------------------------------------- error bounds
@pytest.mark.parametrize("dtype", MODEL_DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_bounds(fmt, dtype):
    """Per element: int8 |x_hat - x| <= absmax(row) / 254; fp8 <= 2^-4 |x| + 2^-10 * scale (normal /
    subnormal range); plus bf16's own rounding (2^-9 relative) when the model dtype is bf16."""
    pool = make_pool([(4, 64), (3, 8, 8)], dtype, spread=True)
    store = cf.new_checkpoint_store(fmt, pool, 5)
    cf.quantize_slots(pool, [1, 2, 3, 4, 5], store, [0, 1, 2, 3, 4], backend="torch")
    out = [torch.zeros_like(t) for t in pool]
    cf.dequantize_slots(store, [0, 1, 2, 3, 4], out, [1, 2, 3, 4, 5], backend="torch")
    for x, y, q, s in zip(pool, out, store.qs, store.scales, strict=True):
        xr = x[:, 1:].float().reshape(q.shape)
        yr = y[:, 1:].float().reshape(q.shape)
        absmax = xr.abs().amax(-1, keepdim=True)
        err = (yr - xr).abs()
        bf16_slack = 2.0**-8 * xr.abs() if dtype == torch.bfloat16 else 0.0
        if fmt == "int8":
            bound = absmax / 254 * (1 + 2.0**-20)
        else:
            bound = 2.0**-4 * xr.abs() + 2.0**-10 * s.unsqueeze(-1) * (1 + 2.0**-20)
        assert bool((err <= bound + bf16_slack).all()), (
            f"max excess {float((err - bound - bf16_slack).max())}"
        )
        assert torch.equal(s, absmax.squeeze(-1) / quant_naive.qmax_of(q.dtype))


def test_zero_rows_round_trip_exactly():
    pool = [torch.zeros(2, 3, 4, 16)]
    for fmt in FORMATS:
        store = cf.new_checkpoint_store(fmt, pool, 2)
        cf.quantize_slots(pool, [1], store, [0], backend="torch")
        assert bool((store.scales[0][:, 0] == 0).all())
        out = [torch.full_like(pool[0], 7.0)]
        cf.dequantize_slots(store, [0], out, [2], backend="torch")
        assert bool((out[0][:, 2] == 0).all()) and bool((out[0][:, 1] == 7).all())


def test_error_feedback_residual_is_what_the_store_lacks():
    """With feedback: residual_new == (x + residual_old) - float32(q) * scale, exactly."""
    pool = make_pool([(2, 64)], torch.float32)
    r0 = torch.randn(pool[0].shape) * 1e-2
    res = [r0.clone()]
    store = cf.new_checkpoint_store("int8", pool, 1)
    cf.quantize_slots(pool, [3], store, [0], residuals=res, backend="torch")
    v = (pool[0][:, 3] + r0[:, 3]).reshape(store.qs[0][:, 0].shape)
    back = store.qs[0][:, 0].float() * store.scales[0][:, 0].unsqueeze(-1)
    assert torch.equal(res[0][:, 3], (v - back).reshape(res[0][:, 3].shape))
    assert torch.equal(res[0][:, 2], r0[:, 2])  # other slots untouched


# ------------------------------------------------------------------------------------------ formats
def test_format_names():
    for name in cf.CHECKPOINT_FORMATS:
        assert cf.check_format(name) == name
    with pytest.raises(
        InvalidArgument, match=r"unknown checkpoint format 'int4'; use one of model, int8, fp8_e4m3"
    ):
        cf.check_format("int4")
    with pytest.raises(InvalidArgument) as e:
        cf.check_format(None)
    assert "\n" not in str(e.value)
    assert cf.storage_dtype("int8", torch.float32) == torch.int8
    assert cf.storage_dtype("model", torch.bfloat16) == torch.bfloat16


def test_bytes_per_slot():
    """Kimi-K3-like TP8 rank: 69 KDA layers, temporal 12x128x128 fp32, conv 3x4608 bf16 (kernels.md §3.1)."""
    shapes = [((3, 4608), torch.bfloat16), ((12, 128, 128), torch.float32)]
    model = cf.bytes_per_slot("model", 69, shapes)
    assert model == 69 * (3 * 4608 * 2 + 12 * 128 * 128 * 4)
    int8 = cf.bytes_per_slot("int8", 69, shapes)
    # conv rows: the last dim (4608 >= 64); temporal rows: 128 -> 12 * 128 scales
    assert int8 == 69 * (3 * 4608 + 3 * 4 + 12 * 128 * 128 + 12 * 128 * 4)
    assert cf.bytes_per_slot("fp8_e4m3", 69, shapes) == int8
    assert 3.5 < model / int8 < 4.0  # slots at equal bytes: ~3.8x more checkpoints
    store = cf.new_checkpoint_store("int8", [torch.zeros(69, 2, 3, 4608, dtype=torch.bfloat16)], 1)
    assert store.nbytes == cf.bytes_per_slot("int8", 69, shapes[:1])


# ----------------------------------------------------------------------------------------- refusals
def _refused(call, match):
    pool = make_pool([(2, 64)], torch.float32)
    store = cf.new_checkpoint_store("int8", pool, 3)
    store.scales[0].fill_(5.0)
    before_q, before_s, before_p = store.qs[0].clone(), store.scales[0].clone(), pool[0].clone()
    with pytest.raises(InvalidArgument, match=match) as e:
        call(pool, store)
    assert "\n" not in str(e.value)
    assert torch.equal(store.qs[0], before_q) and torch.equal(store.scales[0], before_s)
    assert torch.equal(bits(pool[0]), bits(before_p))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p, s: cf.quantize_slots(p, [1, 2], s, [0]), "pass one per pair"),
        (lambda p, s: cf.quantize_slots(p, [9], s, [0]), "outside slots"),
        (lambda p, s: cf.quantize_slots(p, [1], s, [3]), "outside slots"),
        (lambda p, s: cf.quantize_slots(p, [1, 2], s, [0, 0]), "repeats slot 0"),
        (lambda p, s: cf.quantize_slots(p, [-1], s, [0]), "outside slots"),
        (lambda p, s: cf.quantize_slots(p, [1.0], s, [0]), "int slot indices"),
        (lambda p, s: cf.quantize_slots(p, [1], s, [0], backend="cuda"), "not a backend"),
        (
            lambda p, s: cf.quantize_slots(p, [1, 1], s, [0, 1], residuals=[torch.zeros(p[0].shape)]),
            "repeats slot 1",
        ),
        (lambda p, s: cf.quantize_slots(p, [1], s, [0], residuals=[torch.zeros(2)]), "residuals"),
        (lambda p, s: cf.quantize_slots([p[0].half()], [1], s, [0]), "float32 or bfloat16"),
        (lambda p, s: cf.dequantize_slots(s, [0, 1], p, [2, 2]), "repeats slot 2"),
        (lambda p, s: cf.dequantize_slots(s, [5], p, [2]), "outside slots"),
        (
            lambda p, s: cf.dequantize_slots(
                cf.CheckpointStore("int8", s.qs, (s.scales[0][:, :2],)), [0], p, [1]
            ),
            "scales",
        ),
    ],
)
def test_bad_input_refused_nothing_written(call, match):
    _refused(call, match)


def test_non_finite_state_refused():
    def call(pool, store):
        pool[0][1, 2, 0, 5] = float("nan")
        snapshot = pool[0].clone()
        try:
            cf.quantize_slots(pool, [2], store, [1])
        finally:
            pool[0].copy_(snapshot)

    pool = make_pool([(2, 64)], torch.float32)
    store = cf.new_checkpoint_store("int8", pool, 3)
    before = store.scales[0].clone()
    with pytest.raises(InvalidArgument, match="non-finite"):
        call(pool, store)
    assert torch.equal(store.scales[0], before)


def test_store_for_model_format_refused():
    with pytest.raises(InvalidArgument, match="pool's own slots"):
        cf.new_checkpoint_store("model", [torch.zeros(1, 2, 4)], 1)
    with pytest.raises(InvalidArgument, match="unknown checkpoint format"):
        cf.new_checkpoint_store("int4", [torch.zeros(1, 2, 4)], 1)


# ------------------------------------------------------------------------- on real model code
# Max |logit difference| after a restore from a quantized checkpoint, against an uncached fp32 forward:
# the worst value benchmarks/fidelity_quant.py measured over every restore of its multi-turn and branching
# workloads on both tiny models (docs/checkpoint-formats.md), times 2 for other prompts and seeds.
RESTORE_LOGIT_BOUND = {"int8": 7e-3, "fp8_e4m3": 2e-2}  # measured worst: 3.36e-3, 9.54e-3


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_restore_from_quantized_checkpoint_on_model_code(family, fmt):
    """A 40-token prefix run into a slot, its checkpoint stored in ``fmt`` and restored into another slot,
    8 more tokens from there: logits within the measured bound of a from-scratch forward, and further
    than the exact path's tolerance (the format really was applied)."""
    pytest.importorskip("transformers", minversion="5.23")
    from mamba_radix.reference_engine import LOGIT_ATOL, tiny_model

    torch.manual_seed(0)
    model = tiny_model(family, seed=0)
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(3, 128, (48,), generator=g).tolist()
    mamba = model.new_mamba_pool(3)
    a, b = (int(s) for s in mamba.alloc(2))
    kv = model.new_kv_pool(64)
    view = model.pools_view(kv, mamba)
    kv_idx = torch.arange(1, 49)
    model.forward_span(view, seq[:40], 0, kv_idx[:0], kv_idx[:40], a, a)
    store = cf.new_checkpoint_store(fmt, mamba.tensors, 1)
    cf.quantize_slots(mamba.tensors, [a], store, [0])
    cf.dequantize_slots(store, [0], mamba.tensors, [b])
    got = model.forward_span(view, seq[40:], 40, kv_idx[:40], kv_idx[40:], b, b)
    want = model.reference_logits(seq)[40:]
    err = float((got - want).abs().max())
    assert LOGIT_ATOL < err <= RESTORE_LOGIT_BOUND[fmt], err
