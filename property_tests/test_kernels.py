"""The Triton slot-move kernels against their torch reference, bit for bit.

On a CPU machine the kernels run under ``TRITON_INTERPRET=1`` (conftest.py sets it before anything imports
the kernels); on a CUDA machine the same tests run the compiled kernels on the GPU. Every comparison is on
the integer bit patterns of *whole* pools, so a stray write anywhere fails too. Pools are filled with random
bits (NaN payloads, negative zeros and all), since a copy must not touch values.

Launch sizes stay under ~100 programs (kernels.md §1.3: ~0.7 ms per interpreted program).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import mamba_radix_kernels as K
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from mamba_radix_kernels import naive, slot_move

from mamba_radix.errors import InvalidArgument

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not slot_move.triton_usable(DEVICE),
    reason=f"Triton kernels cannot run on {DEVICE} here (triton missing or TRITON_INTERPRET unset)",
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
DTYPE_IDS = ["bf16", "fp16", "fp32", "fp8"]


def make_pool(
    specs: Sequence[tuple[tuple[int, ...], torch.dtype]],
    num_layers: int = 2,
    num_slots: int = 8,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Pool tensors ``[num_layers, num_slots, *inner]`` filled with random bit patterns."""
    g = torch.Generator().manual_seed(seed)
    pool = []
    for inner, dtype in specs:
        t = torch.empty((num_layers, num_slots, *inner), dtype=dtype)
        b = naive.bits_view(t)
        info = torch.iinfo(b.dtype)
        b.copy_(torch.randint(info.min, info.max, b.shape, generator=g, dtype=torch.int64).to(b.dtype))
        pool.append(t.to(DEVICE))
    return pool


def clone_all(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


def assert_bits_equal(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], what: str) -> None:
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape
        gb, wb = naive.bits_view(g), naive.bits_view(w)
        if not torch.equal(gb, wb):
            diff = (gb != wb).nonzero()
            raise AssertionError(
                f"{what}: tensor {j} ({g.dtype}) differs at {diff.shape[0]} elements, first {diff[:3].tolist()}"
            )


def idx(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=DEVICE)


def specs_for(dtype: torch.dtype) -> list[tuple[tuple[int, ...], torch.dtype]]:
    # conv [3, 7] (odd) in bf16 and a temporal [2, 3, 5] (odd) in the dtype under test
    return [((3, 7), torch.bfloat16), ((2, 3, 5), dtype)]


def both(
    kernel: Callable[..., None],
    ref: Callable[..., None],
    pool: list[torch.Tensor],
    *args: object,
    **kw: object,
) -> list[torch.Tensor]:
    """Run the kernel on ``pool`` and the reference on a clone; return the reference result."""
    want = clone_all(pool)
    ref(want, *args)
    kernel(pool, *args, **kw)
    return want


# ---------------------------------------------------------------------------------------- per operation


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_copy_is_bit_exact(dtype: torch.dtype) -> None:
    pool = make_pool(specs_for(dtype))
    want = both(K.copy_slots_triton, naive.copy_slots_ref, pool, idx([1, 2, 2, 7]), idx([3, 4, 6, 5]))
    assert_bits_equal(pool, want, "copy")
    # and the copy really happened (guards against a reference that does nothing)
    assert torch.equal(naive.bits_view(pool[1][:, 6]), naive.bits_view(pool[1][:, 2]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fork_is_bit_exact(dtype: torch.dtype) -> None:
    pool = make_pool(specs_for(dtype))
    want = both(K.fork_slots_triton, naive.fork_slots_ref, pool, 5, idx([1, 7, 2]))
    assert_bits_equal(pool, want, "fork")
    for s in (1, 7, 2):
        assert torch.equal(naive.bits_view(pool[0][:, s]), naive.bits_view(pool[0][:, 5]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_track_honours_mask_and_minus_one(dtype: torch.dtype) -> None:
    pool = make_pool(specs_for(dtype))
    before = clone_all(pool)
    active = idx([1, 2, 3, 4, -1])
    track = idx([5, -1, 6, 7, 0])
    mask = torch.tensor([True, True, False, True, True], device=DEVICE)
    want = both(K.track_slots_triton, naive.track_slots_ref, pool, active, track, mask)
    assert_bits_equal(pool, want, "track")
    # slots 6 (mask clear) and 0 (active -1) untouched; 5 and 7 tracked
    for j in range(2):
        assert torch.equal(naive.bits_view(pool[j][:, 6]), naive.bits_view(before[j][:, 6]))
        assert torch.equal(naive.bits_view(pool[j][:, 0]), naive.bits_view(before[j][:, 0]))
        assert torch.equal(naive.bits_view(pool[j][:, 7]), naive.bits_view(before[j][:, 4]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gather_then_scatter_through_slot_major_buffer(dtype: torch.dtype) -> None:
    pool = make_pool(specs_for(dtype))
    slots = idx([6, 1, 6, 3])  # a repeated slot is fine for a gather
    # slot-major staging buffers [n, L, *inner], handed over as [L, n, *inner] views
    out = [
        torch.zeros((4, t.shape[0], *t.shape[2:]), dtype=t.dtype, device=DEVICE).transpose(0, 1) for t in pool
    ]
    out_ref = [o.clone() for o in out]
    naive.gather_slots_ref(pool, slots, out_ref)
    K.gather_slots_triton(pool, slots, out)
    assert_bits_equal(out, out_ref, "gather")
    assert torch.equal(naive.bits_view(out[1][:, 0]), naive.bits_view(pool[1][:, 6]))

    dest = idx([2, 4, 5, 7])
    want = both(K.scatter_slots_triton, naive.scatter_slots_ref, pool, dest, out)
    assert_bits_equal(pool, want, "scatter")
    assert torch.equal(naive.bits_view(pool[1][:, 4]), naive.bits_view(pool[1][:, 1]))


# ------------------------------------------------------------------------------------ launch structure


class _CountingKernel:
    """Stands in for the jitted kernel: counts launches and forwards them."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
        self.grids.append(grid)
        return self.inner[grid]  # type: ignore[index]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> _CountingKernel:
    counter = _CountingKernel(slot_move._k.slot_move_kernel)
    monkeypatch.setattr(slot_move._k, "slot_move_kernel", counter)
    return counter


def test_one_launch_covers_all_layers_and_tensors(launches: _CountingKernel) -> None:
    pool = make_pool(
        [((3, 7), torch.bfloat16), ((11,), torch.float16), ((2, 3, 5), torch.float32)], num_layers=3
    )
    want = both(K.copy_slots_triton, naive.copy_slots_ref, pool, idx([1, 2]), idx([3, 4]))
    assert_bits_equal(pool, want, "3-tensor copy")
    assert launches.grids == [(2 * 3, 3)]  # pairs x layers, one tile per tensor


def test_more_than_four_tensors_take_one_launch_per_four(launches: _CountingKernel) -> None:
    dts = [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float16, torch.bfloat16]
    pool = make_pool([((j + 2, 3), d) for j, d in enumerate(dts)])
    want = both(K.fork_slots_triton, naive.fork_slots_ref, pool, 1, idx([2, 3]))
    assert_bits_equal(pool, want, "5-tensor fork")
    assert len(launches.grids) == 2


def test_several_tiles_with_a_partial_tail(launches: _CountingKernel) -> None:
    # inner 35 and 3 with BLOCK=16: tiles 3 + 1, the last tile of each partly masked
    pool = make_pool([((5, 7), torch.bfloat16), ((3,), torch.float32)], num_layers=3)
    want = both(K.copy_slots_triton, naive.copy_slots_ref, pool, idx([1, 6]), idx([7, 2]), block=16)
    assert_bits_equal(pool, want, "multi-tile copy")
    assert launches.grids == [(2 * 3, 3 + 1)]


def test_empty_batch_launches_nothing(launches: _CountingKernel) -> None:
    pool = make_pool(specs_for(torch.float32))
    before = clone_all(pool)
    K.copy_slots_triton(pool, idx([]), idx([]))
    K.fork_slots_triton(pool, 1, idx([]))
    K.track_slots_triton(pool, idx([]), idx([]), torch.zeros(0, dtype=torch.bool, device=DEVICE))
    assert launches.grids == []
    assert_bits_equal(pool, before, "empty batch")


def test_negative_indices_skip_the_pair_in_any_mode() -> None:
    pool = make_pool(specs_for(torch.float16))
    want = both(K.copy_slots_triton, naive.copy_slots_ref, pool, idx([-1, 2, 3]), idx([4, -1, 5]))
    assert_bits_equal(pool, want, "copy with -1")
    before = clone_all(pool)
    K.fork_slots_triton(pool, -1, idx([6, 7]))  # a -1 source skips every pair
    assert_bits_equal(pool, before, "fork from -1")


def test_strided_views_into_an_envelope() -> None:
    """Layer and slot strides are free: a pool that is every other slot of every other layer of a bigger one."""
    big = make_pool(specs_for(torch.bfloat16), num_layers=4, num_slots=12)
    pool = [t[::2, 1::2] for t in big]  # [2, 6, ...] views, strides not those of a dense tensor
    want_big = clone_all(big)
    naive.copy_slots_ref([t[::2, 1::2] for t in want_big], idx([1, 2]), idx([4, 5]))
    K.copy_slots_triton(pool, idx([1, 2]), idx([4, 5]))
    assert_bits_equal(big, want_big, "strided copy")


# ------------------------------------------------------------------------------------ property-based


@st.composite
def track_batches(
    draw: st.DrawFn,
) -> tuple[list[tuple[tuple[int, ...], torch.dtype]], list[int], list[int], list[bool]]:
    """A pool spec and a valid track batch: enabled destinations distinct and disjoint from enabled sources."""
    n_tensors = draw(st.integers(1, 3))
    specs = [
        (tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=2))), draw(st.sampled_from(DTYPES)))
        for _ in range(n_tensors)
    ]
    num_slots = 8
    n = draw(st.integers(0, 5))
    active = draw(st.lists(st.integers(-1, num_slots - 1), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    perm = draw(st.permutations(range(num_slots)))
    track = []
    used_src = {a for a, m in zip(active, mask, strict=True) if m and a >= 0}
    free = [s for s in perm if s not in used_src]
    for _ in range(n):
        skip = draw(st.booleans()) or not free
        track.append(-1 if skip else free.pop())
    return specs, active, track, mask


@given(track_batches(), st.integers(0, 2**16))
def test_track_property_bit_exact(batch: tuple, seed: int) -> None:
    specs, active, track, mask = batch
    pool = make_pool(specs, num_layers=2, num_slots=8, seed=seed)
    m = torch.tensor(mask, dtype=torch.bool, device=DEVICE)
    want = both(K.track_slots_triton, naive.track_slots_ref, pool, idx(active), idx(track), m)
    assert_bits_equal(pool, want, f"track {active}->{track} mask {mask}")


# ------------------------------------------------------------------------------------ 64-bit offsets

# _BIG < 2^31, so it is an int32 argument, yet k * _BIG >= 2^31 for k >= 2. A kernel that lost its int64
# widening computes (k * _BIG) mod 2^32 as a signed int32: an offset in [-2^31, 2^31). The views below
# start 2^31 bytes into a 6 GiB byte buffer, so those wrong offsets are still valid addresses: the test
# fails on wrong bytes instead of crashing the process. The buffer is never filled: on the CPU only the
# pages the tests touch are committed (on a GPU it is a real 6 GiB allocation).
_BIG = (2**32 + 1028) // 3
_LEAD = 2**31 + 4096
assert _BIG < 2**31 <= 2 * _BIG


@pytest.fixture(scope="module")
def huge_bytes() -> torch.Tensor:
    """A view that starts 2^31 + 4096 bytes into a buffer ending 4 GiB + 8 KiB after that point."""
    buf = torch.empty(_LEAD + 2**32 + 8192, dtype=torch.uint8, device=DEVICE)
    return buf[_LEAD:]


def _fill_random(view: torch.Tensor, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    view.copy_(torch.randint(0, 256, view.shape, generator=g, dtype=torch.int64).to(torch.uint8))


def test_layer_offsets_past_2_31_elements(huge_bytes: torch.Tensor) -> None:
    # an fp8 pool [4 layers, 3 slots, 64] whose layer stride is _BIG elements: layers 2 and 3 start past 2^31
    pool = [torch.as_strided(huge_bytes, (4, 3, 64), (_BIG, 128, 1)).view(torch.float8_e4m3fn)]
    raw = naive.bits_view(pool[0])
    _fill_random(raw, seed=1)  # as_strided view: touches only the 4 x 3 x 64 bytes
    want = raw[:, 1].clone()
    K.copy_slots_triton(pool, idx([1]), idx([2]))
    for layer in range(4):
        assert torch.equal(raw[layer, 2], want[layer]), (
            f"layer {layer} (offset {layer * _BIG}) copied wrongly"
        )


def test_identity_slot_offsets_past_2_31_elements(huge_bytes: torch.Tensor) -> None:
    # gather 4 slots into a staging buffer whose *slot* stride is _BIG: staging slots 2 and 3 start past 2^31,
    # and their offsets come from the program id (identity index), not from a loaded int64 index
    pool = make_pool([((32,), torch.float8_e4m3fn)], num_layers=1, num_slots=6)
    out = [torch.as_strided(huge_bytes, (1, 4, 32), (32, _BIG, 1)).view(torch.float8_e4m3fn)]
    K.gather_slots_triton(pool, idx([5, 4, 2, 1]), out)
    for i, s in enumerate([5, 4, 2, 1]):
        assert torch.equal(naive.bits_view(out[0][:, i]), naive.bits_view(pool[0][:, s])), f"staging slot {i}"


# ------------------------------------------------------------------------------- sm_90 compile check


def _toolchain_reason() -> str | None:
    """Why an sm_90 compile cannot run here (None when it can)."""
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia import compiler as nv
    except Exception as exc:  # pragma: no cover - depends on the install
        return f"triton's nvidia backend is not importable: {exc!r}"
    try:
        ptxas = nv.get_ptxas(90).path
    except Exception as exc:  # pragma: no cover
        return f"ptxas not found: {exc!r}"
    if not os.access(ptxas, os.X_OK):  # pragma: no cover
        return f"ptxas at {ptxas} is not executable"
    return None


needs_toolchain = pytest.mark.skipif(_toolchain_reason() is not None, reason=str(_toolchain_reason()))


@pytest.fixture(scope="module")
def sm90() -> dict[str, dict]:
    """Every standard case compiled for sm_90 in one child process (the interpreter cannot compile)."""
    from mamba_radix_kernels.compile_check import compile_in_subprocess

    return compile_in_subprocess(arch=90)


@needs_toolchain
@pytest.mark.parametrize(
    "case", ["kimi-bf16-track", "kimi-bf16-copy", "kimi-fp32-track", "kimi-fp32-copy", "kimi-fp8-copy"]
)
def test_sm90_compile_uses_64bit_offsets_and_16_byte_vectors(sm90: dict[str, dict], case: str) -> None:
    from mamba_radix_kernels.compile_check import STANDARD_CASES

    shapes, dtype_names, masked, _, _ = STANDARD_CASES[case]
    r = sm90[case]
    # (layer, slot) x stride, for the source and the destination row, for each tensor: all i64
    assert r["i64_multiplies"] == 4 * len(shapes), r
    # every data access is a 16-byte vector; the only narrow ones are the two index loads and the mask byte
    assert r["v4_loads"] > 0 and r["v4_stores"] == r["v4_loads"], r
    assert sorted(r["narrow_accesses"]) == sorted(
        ["ld.global.b64"] * 2 + (["ld.global.b8"] if masked else [])
    ), r
    # and there are enough of them to cover each tensor's tile: BLOCK elements / 16 bytes per access
    want = sum(
        -(-min(r["block"], math.prod(sh)) * getattr(torch, d).itemsize // (16 * 32 * r["num_warps"]))
        for sh, d in zip(shapes, dtype_names, strict=True)
    )
    assert r["v4_loads"] == want, r


@needs_toolchain
def test_sm90_compile_detects_scalar_fallback_for_odd_sizes(sm90: dict[str, dict]) -> None:
    """The detector itself: an odd inner size (21 bf16) cannot be vectorised, and the check must see that."""
    r = sm90["odd-bf16-copy"]
    assert r["v4_loads"] == 0 and r["i64_multiplies"] == 4
    assert "ld.global.b16" in r["narrow_accesses"] and "st.global.b16" in r["narrow_accesses"]


# ------------------------------------------------------------------------------- launcher refusals
@pytest.mark.parametrize(
    "call",
    [
        lambda p: K.copy_slots_triton(p, idx([1]), idx([99])),  # past the pool: would write outside it
        lambda p: K.copy_slots_triton(p, idx([99]), idx([1])),
        lambda p: K.fork_slots_triton(p, 99, idx([1])),
        lambda p: K.fork_slots_triton(p, "1", idx([1])),
        lambda p: K.gather_slots_triton(p, idx([1, 2]), [torch.zeros_like(t[:, :1]) for t in p]),  # out too short
        lambda p: K.scatter_slots_triton(p, idx([1, 2]), [torch.zeros_like(t[:, :1]) for t in p]),
        lambda p: K.copy_slots_triton(p, [1], [2]),
        lambda p: K.move_slots_triton(p, p, num_pairs="1", src_index=idx([1]), dst_index=idx([2])),
        lambda p: K.move_slots_triton(p, p, num_pairs=1, src_index=idx([1]), dst_index=idx([2]), block=3),
        lambda p: K.track_slots_triton(p, idx([1]), idx([2]), [True]),
    ],
    ids=["dst-past-pool", "src-past-pool", "scalar-past-pool", "scalar-str", "gather-short", "scatter-short",
         "lists", "num-pairs-str", "block-3", "mask-list"],
)  # fmt: skip
def test_launchers_refuse_what_would_touch_memory_outside_the_tensors(call: Callable) -> None:
    """Layout facts (buffer lengths, a scalar source) are checked without a device sync; under the
    interpreter index values too (an out-of-range index corrupted the heap)."""
    if not slot_move.triton_usable("cpu"):
        pytest.skip("needs the Triton interpreter")
    pool = make_pool(specs_for(torch.float16))
    before = clone_all(pool)
    with pytest.raises(InvalidArgument):
        call(pool)
    assert_bits_equal(pool, before, "refused launch")
