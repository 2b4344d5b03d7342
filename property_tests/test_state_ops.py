"""mamba_radix.state_ops: semantics, validation, dispatch.

The oracle here is a plain per-slot Python loop (independent of the torch reference's advanced indexing).
Both backends are checked against it: ``torch`` always, ``triton`` where it can run (under the interpreter
on CPU, compiled on CUDA). Refused calls must raise InvalidArgument naming the bad value and leave the
pool bit-for-bit unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from mamba_radix_kernels import naive, slot_move

from mamba_radix import state_ops
from mamba_radix.errors import InvalidArgument

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_OK = slot_move.triton_usable(DEVICE)
BACKENDS = [
    "torch",
    pytest.param("triton", marks=pytest.mark.skipif(not TRITON_OK, reason="triton unusable")),
]
L, S = 2, 8  # layers, slots incl. the padding slot 0


def make_pool(seed: int = 0, device: torch.device = DEVICE) -> list[torch.Tensor]:
    """A small pool ``[*conv, temporal]``: conv [3, 5] bf16 and [4] fp8, temporal [2, 3, 3] fp32."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for inner, dtype in (((3, 5), torch.bfloat16), ((4,), torch.float8_e4m3fn), ((2, 3, 3), torch.float32)):
        t = torch.empty((L, S, *inner), dtype=dtype)
        b = naive.bits_view(t)
        info = torch.iinfo(b.dtype)
        b.copy_(torch.randint(info.min, info.max, b.shape, generator=g).to(b.dtype))
        out.append(t.to(device))
    return out


def bits(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [naive.bits_view(t).cpu().clone() for t in ts]


def assert_same(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], what: str) -> None:
    for j, (g, w) in enumerate(zip(bits(got), bits(want), strict=True)):
        assert torch.equal(g, w), f"{what}: tensor {j} differs"


def loop_move(tensors: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """Oracle: a copy of ``tensors`` with slot ``d`` := slot ``s`` (as of before) for each pair, one by one."""
    src = bits(tensors)
    out = [t.clone() for t in src]
    for s, d in pairs:
        for o, t in zip(out, src, strict=True):
            for layer in range(t.shape[0]):
                o[layer, d] = t[layer, s]
    return out


def i64(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=DEVICE)


# ------------------------------------------------------------------------------------------ semantics


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy(backend: str) -> None:
    pool = make_pool()
    want = loop_move(pool, [(1, 4), (2, 5), (1, 6)])
    state_ops.copy_slots(pool, i64([1, 2, 1]), i64([4, 5, 6]), backend=backend)
    assert_same(pool, want, "copy")


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_accepts_lists(backend: str) -> None:
    pool = make_pool()
    want = loop_move(pool, [(3, 7)])
    state_ops.copy_slots(pool, [3], [7], backend=backend)
    assert_same(pool, want, "copy from lists")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork(backend: str) -> None:
    pool = make_pool()
    want = loop_move(pool, [(3, 1), (3, 2), (3, 7)])
    state_ops.fork_slots(pool, 3, i64([1, 2, 7]), backend=backend)
    assert_same(pool, want, "fork")


@pytest.mark.parametrize("backend", BACKENDS)
def test_track(backend: str) -> None:
    pool = make_pool()
    active, track = i64([1, 2, 3, -1, 4]), i64([5, 6, -1, 7, 0])
    mask = torch.tensor([True, False, True, True, True], device=DEVICE)
    want = loop_move(pool, [(1, 5), (4, 0)])  # 2: mask clear; 3: track -1; 7: active -1
    state_ops.track_slots(pool, active, track, mask, backend=backend)
    assert_same(pool, want, "track")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_and_scatter(backend: str) -> None:
    pool = make_pool()
    slots = [6, 2, 6]
    out = [torch.zeros((L, 3, *t.shape[2:]), dtype=t.dtype, device=DEVICE) for t in pool]
    state_ops.gather_slots(pool, i64(slots), out, backend=backend)
    for j, t in enumerate(pool):
        for i, s in enumerate(slots):
            assert torch.equal(naive.bits_view(out[j][:, i]), naive.bits_view(t[:, s])), (j, i)
    # scatter staging entries 0 and 1 (old slots 6 and 2) into slots 1 and 3
    want = loop_move(pool, [(6, 1), (2, 3)])
    state_ops.scatter_slots(pool, i64([1, 3]), [o[:, :2] for o in out], backend=backend)
    assert_same(pool, want, "scatter")


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batches_are_no_ops(backend: str) -> None:
    pool = make_pool()
    before = bits(pool)
    state_ops.copy_slots(pool, i64([]), i64([]), backend=backend)
    state_ops.fork_slots(pool, 2, i64([]), backend=backend)
    state_ops.track_slots(
        pool, i64([]), i64([]), torch.zeros(0, dtype=torch.bool, device=DEVICE), backend=backend
    )
    empty = [torch.empty((L, 0, *t.shape[2:]), dtype=t.dtype, device=DEVICE) for t in pool]
    state_ops.gather_slots(pool, i64([]), empty, backend=backend)
    state_ops.scatter_slots(pool, i64([]), empty, backend=backend)
    assert_same(pool, before, "empty batches")


@st.composite
def copy_batches(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Valid copy batches: destinations distinct and disjoint from the (possibly repeated) sources."""
    n = draw(st.integers(0, 4))
    slots = draw(st.permutations(range(S)))
    dst = slots[:n]
    src = draw(st.lists(st.sampled_from(slots[n:]), min_size=n, max_size=n))
    return src, dst


@given(copy_batches(), st.sampled_from(["torch", "triton"] if TRITON_OK else ["torch"]))
def test_copy_property(batch: tuple[list[int], list[int]], backend: str) -> None:
    src, dst = batch
    pool = make_pool(seed=len(src))
    want = loop_move(pool, list(zip(src, dst, strict=True)))
    state_ops.copy_slots(pool, i64(src), i64(dst), backend=backend)
    assert_same(pool, want, f"copy {src}->{dst} ({backend})")


# ------------------------------------------------------------------------------------------ validation

Call = Callable[[list[torch.Tensor]], None]
_MASK3 = torch.tensor([True, True, True], device=DEVICE)


def _buffers(pool: Sequence[torch.Tensor], n: int) -> list[torch.Tensor]:
    return [torch.zeros((L, n, *t.shape[2:]), dtype=t.dtype, device=DEVICE) for t in pool]


REFUSED: dict[str, tuple[Call, str]] = {
    "copy-duplicate-dst": (
        lambda p: state_ops.copy_slots(p, i64([1, 2]), i64([5, 5])),
        "duplicate destination slot 5",
    ),
    "copy-overlap": (lambda p: state_ops.copy_slots(p, i64([1, 2]), i64([2, 3])), "slot 2 is both read"),
    "copy-out-of-range": (lambda p: state_ops.copy_slots(p, i64([1]), i64([S])), f"dst[0] = {S} is outside"),
    "copy-negative": (lambda p: state_ops.copy_slots(p, i64([-1]), i64([3])), "src[0] = -1 is outside"),
    "copy-lengths": (lambda p: state_ops.copy_slots(p, i64([1, 2]), i64([3])), "src has 2 entries and dst 1"),
    "copy-float-index": (
        lambda p: state_ops.copy_slots(p, torch.tensor([1.0]), i64([3])),
        "dtype torch.float32",
    ),
    "copy-2d-index": (lambda p: state_ops.copy_slots(p, i64([1, 2]).view(1, 2), i64([3, 4])), "shape (1, 2)"),
    "fork-src-in-dst": (lambda p: state_ops.fork_slots(p, 3, i64([4, 3])), "slot 3 is both read"),
    "fork-duplicate": (lambda p: state_ops.fork_slots(p, 3, i64([4, 4])), "duplicate destination slot 4"),
    "fork-src-range": (lambda p: state_ops.fork_slots(p, 99, i64([4])), "src = 99 is outside"),
    "track-duplicate": (
        lambda p: state_ops.track_slots(p, i64([1, 2, 3]), i64([5, 5, -1]), _MASK3),
        "duplicate destination slot 5",
    ),
    "track-overlap": (
        lambda p: state_ops.track_slots(p, i64([1, 2, 3]), i64([2, 6, -1]), _MASK3),
        "slot 2 is both read",
    ),
    "track-minus-two": (
        lambda p: state_ops.track_slots(p, i64([1, 2, 3]), i64([-2, 6, 7]), _MASK3),
        "track[0] = -2 is outside",
    ),
    "track-int-mask": (
        lambda p: state_ops.track_slots(p, i64([1]), i64([5]), torch.tensor([1], device=DEVICE)),
        "mask must be a bool tensor",
    ),
    "track-mask-length": (
        lambda p: state_ops.track_slots(p, i64([1, 2]), i64([5, 6]), _MASK3),
        "mask has 3 entries and track 2",
    ),
    "scatter-duplicate": (
        lambda p: state_ops.scatter_slots(p, i64([4, 4]), _buffers(p, 2)),
        "duplicate destination slot 4",
    ),
    "scatter-range": (
        lambda p: state_ops.scatter_slots(p, i64([4, 9]), _buffers(p, 2)),
        "slots[1] = 9 is outside",
    ),
    "scatter-shape": (
        lambda p: state_ops.scatter_slots(p, i64([4]), _buffers(p, 2)),
        "expected torch.bfloat16 (2, 1, 3, 5)",
    ),
    "gather-dtype": (
        lambda p: state_ops.gather_slots(p, i64([4]), [b.float() for b in _buffers(p, 1)]),
        "expected torch.bfloat16",
    ),
    "gather-count": (
        lambda p: state_ops.gather_slots(p, i64([4]), _buffers(p, 1)[:2]),
        "a list of 3 tensors",
    ),
    "gather-range": (
        lambda p: state_ops.gather_slots(p, i64([8]), _buffers(p, 1)),
        "slots[0] = 8 is outside",
    ),
    "pool-not-a-list": (
        lambda p: state_ops.copy_slots(p[0], i64([1]), i64([2])),
        "non-empty list of tensors",
    ),
    "pool-layers-differ": (
        lambda p: state_ops.copy_slots([p[0], p[1][:1]], i64([1]), i64([2])),
        "tensors[1] has (layers, slots) = (1, 8)",
    ),
    "pool-inner-strided": (
        lambda p: state_ops.copy_slots([p[0][..., ::2]], i64([1]), i64([2])),
        "must be contiguous",
    ),
    "bad-backend": (lambda p: state_ops.copy_slots(p, i64([1]), i64([2]), backend="cuda"), "backend='cuda'"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_calls_raise_and_change_nothing(case: str) -> None:
    call, message = REFUSED[case]
    pool = make_pool()
    before = bits(pool)
    with pytest.raises(InvalidArgument) as info:
        call(pool)
    assert message in str(info.value), str(info.value)
    assert_same(pool, before, case)


def test_track_check_false_skips_value_checks() -> None:
    """``check=False`` makes the values a precondition (the CUDA default): nothing is read on the host."""
    pool = make_pool()
    both_on = torch.tensor([True, True], device=DEVICE)
    # a repeated destination counts only where it is enabled
    state_ops.track_slots(
        pool, i64([1, 2]), i64([5, 5]), torch.tensor([True, False], device=DEVICE), check=True
    )
    with pytest.raises(InvalidArgument, match="duplicate destination slot 5"):
        state_ops.track_slots(pool, i64([1, 2]), i64([5, 5]), both_on, check=True)
    state_ops.track_slots(pool, i64([1, 2]), i64([5, 5]), both_on, check=False)  # not refused: unchecked


# ------------------------------------------------------------------------------------------ dispatch


class _Calls:
    def __init__(self) -> None:
        self.triton = 0
        self.torch = 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    """Count which backend each call reaches (and still run it)."""
    c = _Calls()
    real_triton, real_ref = slot_move.move_slots_triton, naive.move_slots_ref

    def counting_triton(*a: object, **k: object) -> None:
        c.triton += 1
        real_triton(*a, **k)  # type: ignore[arg-type]

    def counting_ref(*a: object, **k: object) -> None:
        c.torch += 1
        real_ref(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(slot_move, "move_slots_triton", counting_triton)
    monkeypatch.setattr(naive, "move_slots_ref", counting_ref)
    return c


@pytest.mark.skipif(DEVICE.type == "cuda", reason="CPU dispatch")
def test_auto_uses_the_reference_on_cpu(calls: _Calls) -> None:
    pool = make_pool()
    state_ops.copy_slots(pool, i64([1]), i64([2]))
    assert (calls.torch, calls.triton) == (1, 0)


@pytest.mark.skipif(not TRITON_OK, reason="triton unusable")
def test_backend_can_be_forced_per_call_and_per_block(calls: _Calls) -> None:
    pool = make_pool()
    state_ops.copy_slots(pool, i64([1]), i64([2]), backend="triton")
    assert (calls.torch, calls.triton) == (0, 1)
    with state_ops.use_backend("triton"):
        assert state_ops.get_backend() == "triton"
        state_ops.fork_slots(pool, 1, i64([3]))
    assert state_ops.get_backend() == "auto"
    state_ops.fork_slots(pool, 1, i64([4]), backend="torch")
    assert (calls.torch, calls.triton) == (1, 2)


def test_set_backend_rejects_unknown_names() -> None:
    with pytest.raises(InvalidArgument, match="'gpu' is not a backend"):
        state_ops.set_backend("gpu")
    assert state_ops.get_backend() == "auto"


def test_bytes_moved_counts_read_and_write() -> None:
    pool = make_pool()
    per_slot = L * (3 * 5 * 2 + 4 * 1 + 2 * 3 * 3 * 4)
    assert state_ops.bytes_moved(pool, 3) == 2 * 3 * per_slot


# ------------------------------------------------------------------------------------------ GPU only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_track_dispatches_to_triton_without_host_sync(calls: _Calls) -> None:
    pool = make_pool()
    want = loop_move(pool, [(1, 5), (3, 7)])
    active, track = i64([1, 2, 3]), i64([5, -1, 7])
    mask = torch.tensor([True, True, True], device=DEVICE)
    state_ops.track_slots(pool, active, track, mask)  # compile outside the sync check
    pool = make_pool()
    calls.triton = 0
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising op in track raises
    try:
        state_ops.track_slots(pool, active, track, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (calls.torch, calls.triton) == (0, 1)
    assert_same(pool, want, "cuda track")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_gather_to_pinned_host_and_scatter_back() -> None:
    pool = make_pool()
    host = [torch.empty((L, 2, *t.shape[2:]), dtype=t.dtype).pin_memory() for t in pool]
    state_ops.gather_slots(pool, i64([6, 2]), host)
    torch.cuda.current_stream().synchronize()
    for j, t in enumerate(pool):
        assert torch.equal(naive.bits_view(host[j]), naive.bits_view(t[:, [6, 2]]).cpu()), j
    want = loop_move(pool, [(6, 1), (2, 3)])
    state_ops.scatter_slots(pool, i64([1, 3]), host)
    assert_same(pool, want, "scatter from host")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_unchecked_copy_is_bit_identical_to_the_checked_one(dtype: torch.dtype) -> None:
    """``copy_slots(check=False)`` (the cache's trusted copy-on-write) takes a shortcut past the
    reference's checks: it must write exactly the same bits, on every tensor and layer."""
    from mamba_radix import state_ops

    gen = torch.Generator().manual_seed(3)
    base = [torch.randn(2, 9, 3, 5, generator=gen).to(dtype), torch.randn(2, 9, 4, generator=gen)]
    src, dst = torch.tensor([1, 4, 4]), torch.tensor([2, 7, 8])
    checked = [t.clone() for t in base]
    unchecked = [t.clone() for t in base]
    state_ops.copy_slots(checked, src, dst, check=True)
    state_ops.copy_slots(unchecked, src, dst, check=False)
    for a, b, orig in zip(checked, unchecked, base, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert not torch.equal(a.view(torch.uint8), orig.view(torch.uint8))
