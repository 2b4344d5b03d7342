"""Retraction copies (issue 25 item 4): ``get_cpu_copy`` / ``load_cpu_copy`` of the state pool, the KV
storages, the hybrid pool and the SGLang-form pools.

Contents are random bytes (NaN payloads and subnormals included), so equality is checked on the bytes,
never on values: a round trip must restore exactly what was copied, into the same or other slots and
indices. Every refusal is checked to change nothing: the pool's tensors byte for byte and its free list.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix.compat.sglang_pools import HybridLinearKVPool as SGLangHybridLinearKVPool
from mamba_radix.compat.sglang_pools import MambaPool as SGLangMambaPool
from mamba_radix.compat.sglang_pools import TokenToKVPoolAllocator as SGLangAllocator
from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import (
    HybridLinearKVPool,
    MambaPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    TokenToKVPoolAllocator,
)
from mamba_radix.pools.cpu_copy import MambaCpuCopy

DTYPES = st.sampled_from([torch.bfloat16, torch.float32])
SLOTS = 8  # state slots of the pools below
KV_SIZE = 48  # KV rows of the pools below (+ padding)


# ---------------------------------------------------------------------------------------- helpers
def fill_random_bytes(tensor: torch.Tensor, seed: int) -> None:
    """Overwrite ``tensor`` with random bytes (any bit pattern of its dtype, NaNs included)."""
    raw = tensor.view(torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))


def raw(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` (a fresh copy, for byte-exact comparison)."""
    return tensor.contiguous().view(torch.uint8).clone()


def state_pool(conv_dtype: torch.dtype, temporal_dtype: torch.dtype, seed: int = 0) -> MambaPool:
    pool = MambaPool(SLOTS, 3, [(3, 8), (2, 4)], (2, 4, 4), [conv_dtype, torch.float32], temporal_dtype)
    for i, tensor in enumerate(pool.tensors):
        fill_random_bytes(tensor, seed * 31 + i)
    return pool


def state_snapshot(pool: MambaPool) -> tuple:
    return pool.available_size(), pool.allocated_slots().tolist(), [raw(t) for t in pool.tensors]


def assert_same_snapshot(a: tuple, b: tuple) -> None:
    assert a[:2] == b[:2]
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2], strict=True))


def slot_bytes(pool: MambaPool, slots: list[int]) -> list[torch.Tensor]:
    idx = torch.tensor(slots, dtype=torch.int64)
    return [raw(t.index_select(1, idx)) for t in pool.tensors]


def kv_pool(dtype: torch.dtype, chunk_tokens: int, seed: int = 0) -> MHATokenToKVPool:
    pool = MHATokenToKVPool(KV_SIZE, 1, dtype, 2, 4, 3)
    pool.cpu_offloading_chunk_size = chunk_tokens
    for i, tensor in enumerate([*pool.k_buffer, *pool.v_buffer]):
        fill_random_bytes(tensor, seed * 31 + i)
    return pool


def kv_snapshot(pool: MHATokenToKVPool) -> list[torch.Tensor]:
    return [raw(t) for t in [*pool.k_buffer, *pool.v_buffer]]


def kv_rows(pool: MHATokenToKVPool, indices: list[int]) -> list[torch.Tensor]:
    idx = torch.tensor(indices, dtype=torch.int64)
    return [raw(t.index_select(0, idx)) for t in [*pool.k_buffer, *pool.v_buffer]]


@st.composite
def two_slot_sets(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Source slots and as many distinct destination slots, both from 1..SLOTS."""
    src = draw(st.lists(st.integers(1, SLOTS), min_size=0, max_size=SLOTS, unique=True))
    dst = draw(st.permutations(range(1, SLOTS + 1)))[: len(src)]
    return src, list(dst)


@st.composite
def two_index_sets(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """KV indices to copy (repeats allowed on a copy) and as many distinct indices to load into."""
    src = draw(st.lists(st.integers(1, KV_SIZE), min_size=0, max_size=20))
    dst = draw(st.permutations(range(1, KV_SIZE + 1)))[: len(src)]
    return src, list(dst)


# --------------------------------------------------------------------------------- the state pool
@given(DTYPES, DTYPES, two_slot_sets(), st.integers(0, 2**16))
def test_state_round_trip_is_byte_exact_into_other_slots(conv_dtype, temporal_dtype, slot_sets, seed) -> None:
    src, dst = slot_sets
    pool = state_pool(conv_dtype, temporal_dtype, seed)
    pool.alloc(SLOTS)  # every slot allocated: any source and destination is valid
    before = slot_bytes(pool, src)
    copy = pool.get_cpu_copy(src)
    assert isinstance(copy, MambaCpuCopy)
    assert all(t.device.type == "cpu" for t in [*copy.conv, copy.temporal])
    assert [t.dtype for t in copy.conv] == pool.conv_dtypes and copy.temporal.dtype == temporal_dtype
    # the copy does not alias the pool: scribbling over the source slots leaves it intact
    for tensor in pool.tensors:
        fill_random_bytes(tensor, seed + 1)
    untouched = [s for s in range(SLOTS + 1) if s not in dst]
    others = slot_bytes(pool, untouched)
    pool.load_cpu_copy(copy, dst)
    assert all(torch.equal(a, b) for a, b in zip(slot_bytes(pool, dst), before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(slot_bytes(pool, untouched), others, strict=True))


@given(DTYPES, st.integers(1, SLOTS), st.integers(0, 2**16))
def test_state_retraction_frees_and_restores_into_new_slots(dtype, count, seed) -> None:
    """The scheduler's sequence: copy, free, let others take slots, allocate anew, load."""
    pool = state_pool(dtype, dtype, seed)
    held = pool.alloc(count)
    before = slot_bytes(pool, held.tolist())
    copy = pool.get_cpu_copy(held)
    pool.free(held)
    other = pool.alloc(SLOTS - count)  # another request takes (and overwrites) what was freed
    pool.clear_slots(other)
    pool.free(other)
    fresh = pool.alloc(count)
    pool.load_cpu_copy(copy, fresh)
    assert all(torch.equal(a, b) for a, b in zip(slot_bytes(pool, fresh.tolist()), before, strict=True))


def test_state_copy_loads_into_another_pool_of_the_same_shape() -> None:
    a, b = state_pool(torch.bfloat16, torch.float32, 1), state_pool(torch.bfloat16, torch.float32, 2)
    src, dst = a.alloc(3), b.alloc(3)
    b.load_cpu_copy(a.get_cpu_copy(src), dst)
    assert all(
        torch.equal(x, y)
        for x, y in zip(slot_bytes(a, src.tolist()), slot_bytes(b, dst.tolist()), strict=True)
    )


def test_state_copy_memory_is_pinned_exactly_where_cuda_is_available() -> None:
    pool = state_pool(torch.bfloat16, torch.float32)
    copy = pool.get_cpu_copy(pool.alloc(2))
    assert all(t.is_pinned() == torch.cuda.is_available() for t in [*copy.conv, copy.temporal])


@pytest.mark.parametrize(
    "case",
    [
        "free slot",
        "padding slot",
        "out of range",
        "repeated slot",
        "count mismatch",
        "dtype mismatch",
        "other pool's shape",
        "missing conv tensor",
        "not a pair",
        "not tensors",
    ],
)
def test_state_load_refusals_change_nothing(case: str) -> None:
    pool = state_pool(torch.bfloat16, torch.float32, 3)
    slots = pool.alloc(4).tolist()
    copy = pool.get_cpu_copy(slots[:2])
    other = MambaPool(SLOTS, 3, [(3, 8), (2, 5)], (2, 4, 4), [torch.bfloat16, torch.float32], torch.float32)
    error, target, given_copy = {
        "free slot": (InvalidIndex, [slots[0], SLOTS], copy),
        "padding slot": (InvalidIndex, [0, slots[0]], copy),
        "out of range": (InvalidIndex, [slots[0], SLOTS + 5], copy),
        "repeated slot": (InvalidIndex, [slots[0], slots[0]], copy),
        "count mismatch": (InvalidArgument, slots[:3], copy),
        "dtype mismatch": (InvalidArgument, slots[:2], MambaCpuCopy(copy.conv, copy.temporal.double())),
        "other pool's shape": (InvalidArgument, slots[:2], other.get_cpu_copy(other.alloc(2))),
        "missing conv tensor": (InvalidArgument, slots[:2], (copy.conv[:1], copy.temporal)),
        "not a pair": (InvalidArgument, slots[:2], (*copy, copy.temporal)),
        "not tensors": (InvalidArgument, slots[:2], ([c.tolist() for c in copy.conv], copy.temporal)),
    }[case]
    before = state_snapshot(pool)
    with pytest.raises(error):
        pool.load_cpu_copy(given_copy, target)
    assert_same_snapshot(state_snapshot(pool), before)


def test_state_get_refuses_slots_not_allocated() -> None:
    pool = state_pool(torch.float32, torch.float32)
    held = pool.alloc(2).tolist()
    before = state_snapshot(pool)
    for bad in ([held[0], SLOTS], [0], [SLOTS + 1]):
        with pytest.raises(InvalidIndex):
            pool.get_cpu_copy(bad)
    assert_same_snapshot(state_snapshot(pool), before)


# ------------------------------------------------------------------------------------ KV storage
@given(DTYPES, two_index_sets(), st.integers(1, 7), st.integers(0, 2**16))
def test_kv_round_trip_is_byte_exact_in_chunks(dtype, index_sets, chunk_tokens, seed) -> None:
    src, dst = index_sets
    pool = kv_pool(dtype, chunk_tokens, seed)
    before = kv_rows(pool, src)
    copy = pool.get_cpu_copy(src)
    assert len(copy) == pool.layer_num
    assert all(len(chunks) == -(-len(src) // chunk_tokens) for chunks in copy)
    assert all(k.shape[0] <= chunk_tokens and k.device.type == "cpu" for chunks in copy for k, _ in chunks)
    untouched = [r for r in range(KV_SIZE + 1) if r not in dst]
    others = kv_rows(pool, untouched)
    pool.load_cpu_copy(copy, dst)
    assert all(torch.equal(a, b) for a, b in zip(kv_rows(pool, dst), before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(kv_rows(pool, untouched), others, strict=True))


@given(DTYPES, st.lists(st.integers(1, KV_SIZE), min_size=1, max_size=12, unique=True), st.integers(0, 99))
def test_mla_round_trip_is_byte_exact(dtype, indices, seed) -> None:
    pool = MLATokenToKVPool(KV_SIZE, 1, dtype, 6, 2, 2)
    pool.cpu_offloading_chunk_size = 5
    for i, tensor in enumerate(pool.kv_buffer):
        fill_random_bytes(tensor, seed + i)
    before = [raw(b[indices]) for b in pool.kv_buffer]
    dst = [KV_SIZE + 1 - i for i in indices]  # other rows (KV_SIZE + 1 - i is in 1..KV_SIZE too)
    pool.load_cpu_copy(pool.get_cpu_copy(indices), dst)
    assert all(torch.equal(raw(b[dst]), x) for b, x in zip(pool.kv_buffer, before, strict=True))


@pytest.mark.parametrize(
    "case",
    [
        "padding row",
        "out of range",
        "repeated row",
        "count mismatch",
        "dtype",
        "row shape",
        "chunking",
        "layers",
    ],
)
def test_kv_load_refusals_change_nothing(case: str) -> None:
    pool = kv_pool(torch.bfloat16, 4, 5)
    copy = pool.get_cpu_copy(list(range(1, 7)))  # six tokens: chunks of 4 and 2
    wide = MHATokenToKVPool(KV_SIZE, 1, torch.bfloat16, 2, 8, 3)
    wide.cpu_offloading_chunk_size = 4
    rechunked = kv_pool(torch.bfloat16, 3).get_cpu_copy(list(range(1, 7)))
    error, target, given_copy = {
        "padding row": (InvalidIndex, [0, *range(20, 25)], copy),
        "out of range": (InvalidIndex, [*range(20, 25), KV_SIZE + 1], copy),
        "repeated row": (InvalidIndex, [20, 20, 21, 22, 23, 24], copy),
        "count mismatch": (InvalidArgument, list(range(20, 25)), copy),
        "dtype": (
            InvalidArgument,
            list(range(20, 26)),
            [[(k.float(), v.float()) for k, v in c] for c in copy],
        ),
        "row shape": (InvalidArgument, list(range(20, 26)), wide.get_cpu_copy(list(range(1, 7)))),
        "chunking": (InvalidArgument, list(range(20, 26)), rechunked),
        "layers": (InvalidArgument, list(range(20, 26)), copy[:2]),
    }[case]
    before = kv_snapshot(pool)
    with pytest.raises(error):
        pool.load_cpu_copy(given_copy, target)
    assert all(torch.equal(a, b) for a, b in zip(kv_snapshot(pool), before, strict=True))


# --------------------------------------------------------------------------------- the hybrid pool
def hybrid_pool(seed: int = 0) -> HybridLinearKVPool:
    full = kv_pool(torch.bfloat16, 4, seed)
    return HybridLinearKVPool(full, [3, 7, 11], state_pool(torch.bfloat16, torch.float32, seed), [0, 1, 2])


@given(two_index_sets(), two_slot_sets(), st.integers(0, 2**16))
def test_hybrid_round_trip_restores_both_parts(index_sets, slot_sets, seed) -> None:
    (src, dst), (slots_src, slots_dst) = index_sets, slot_sets
    pool = hybrid_pool(seed)
    pool.mamba_pool.alloc(SLOTS)
    kv_before, state_before = kv_rows(pool.full_kv_pool, src), slot_bytes(pool.mamba_pool, slots_src)
    copy = pool.get_cpu_copy(src, mamba_indices=slots_src)
    assert pool.get_cpu_copy(src).mamba is None  # no state without mamba_indices
    pool.load_cpu_copy(copy, dst, mamba_indices=slots_dst)
    assert all(torch.equal(a, b) for a, b in zip(kv_rows(pool.full_kv_pool, dst), kv_before, strict=True))
    assert all(
        torch.equal(a, b) for a, b in zip(slot_bytes(pool.mamba_pool, slots_dst), state_before, strict=True)
    )


def test_hybrid_load_refused_on_the_state_part_writes_no_kv() -> None:
    pool = hybrid_pool(7)
    slots = pool.mamba_pool.alloc(2).tolist()
    copy = pool.get_cpu_copy([1, 2, 3], mamba_indices=slots)
    pool.mamba_pool.free([slots[1]])
    kv_before, state_before = kv_snapshot(pool.full_kv_pool), state_snapshot(pool.mamba_pool)
    with pytest.raises(InvalidIndex):  # a destination slot was freed: the whole load is refused
        pool.load_cpu_copy(copy, [10, 11, 12], mamba_indices=slots)
    with pytest.raises(InvalidArgument):  # state asked of a copy made without it
        pool.load_cpu_copy(pool.get_cpu_copy([1, 2, 3]), [10, 11, 12], mamba_indices=slots[:1])
    assert all(torch.equal(a, b) for a, b in zip(kv_snapshot(pool.full_kv_pool), kv_before, strict=True))
    assert_same_snapshot(state_snapshot(pool.mamba_pool), state_before)


# ---------------------------------------------------------------------------- SGLang's call forms
def sglang_pools() -> tuple[SGLangAllocator, SGLangHybridLinearKVPool, SGLangMambaPool]:
    mamba = SGLangMambaPool(SLOTS, num_layers=2)
    kv = SGLangHybridLinearKVPool(KV_SIZE, torch.bfloat16, 1, 2, 4, [1, 3], mamba_pool=mamba)
    allocator = SGLangAllocator(KV_SIZE, torch.bfloat16, "cpu", kv, need_sort=False)
    for i, tensor in enumerate([*mamba.core.tensors, *kv.full_kv_pool.k_buffer, *kv.full_kv_pool.v_buffer]):
        fill_random_bytes(tensor, i)
    return allocator, kv, mamba


def test_sglang_forms_round_trip_through_the_allocator() -> None:
    allocator, kv, mamba = sglang_pools()
    indices, slots = allocator.alloc(5), mamba.alloc(2)
    conv_cpu, temporal_cpu = mamba.get_cpu_copy(slots)  # SGLang's unpacking
    kv_before, state_before = (
        kv_rows(kv.full_kv_pool, indices.tolist()),
        slot_bytes(mamba.core, slots.tolist()),
    )
    _, mamba_cpu = copy = allocator.get_cpu_copy(indices, mamba_indices=slots)
    assert mamba_cpu is not None and allocator.get_cpu_copy(indices, mamba_indices=None)[1] is None
    allocator.free(indices)
    mamba.free(slots)
    new_indices, new_slots = allocator.alloc(5), mamba.alloc(2)
    allocator.load_cpu_copy(copy, new_indices, mamba_indices=new_slots)
    assert all(
        torch.equal(a, b)
        for a, b in zip(kv_rows(kv.full_kv_pool, new_indices.tolist()), kv_before, strict=True)
    )
    assert all(
        torch.equal(a, b)
        for a, b in zip(slot_bytes(mamba.core, new_slots.tolist()), state_before, strict=True)
    )
    mamba.load_cpu_copy((conv_cpu, temporal_cpu), new_slots)  # the plain pair loads as well


def test_sglang_allocator_refuses_freed_indices_and_a_missing_storage() -> None:
    allocator, kv, _ = sglang_pools()
    indices = allocator.alloc(3)
    copy = allocator.get_cpu_copy(indices)
    allocator.free(indices)
    before = kv_snapshot(kv.full_kv_pool)
    with pytest.raises(InvalidIndex):
        allocator.load_cpu_copy(copy, indices)  # freed: another request may own those rows now
    with pytest.raises(InvalidIndex):
        allocator.get_cpu_copy(indices)
    assert all(torch.equal(a, b) for a, b in zip(kv_snapshot(kv.full_kv_pool), before, strict=True))
    with pytest.raises(InvalidArgument, match="kvcache"):
        SGLangAllocator(KV_SIZE).get_cpu_copy([1])
    plain = SGLangAllocator(KV_SIZE, kvcache=MHATokenToKVPool(KV_SIZE, 1, torch.bfloat16, 2, 4, 1))
    with pytest.raises(InvalidArgument, match="holds no state"):
        plain.get_cpu_copy(plain.alloc(1), mamba_indices=[1])


def test_core_allocator_indices_work_with_core_storage() -> None:
    """The core pools need no allocator: any rows outside the padding can be copied and loaded."""
    allocator, pool = TokenToKVPoolAllocator(KV_SIZE), kv_pool(torch.float32, 8, 9)
    rows = allocator.alloc(10).tolist()
    before = kv_rows(pool, rows)
    pool.load_cpu_copy(pool.get_cpu_copy(rows), rows[::-1])
    assert all(torch.equal(a, b.flip(0)) for a, b in zip(kv_rows(pool, rows), before, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pools_round_trip_through_pinned_host_memory() -> None:
    state = MambaPool(SLOTS, 2, [(3, 8)], (2, 4, 4), torch.bfloat16, torch.float32, device="cuda")
    full = MHATokenToKVPool(KV_SIZE, 1, torch.bfloat16, 2, 4, 2, device="cuda")
    full.cpu_offloading_chunk_size = 3
    for tensor in [*state.tensors, *full.k_buffer, *full.v_buffer]:
        tensor.view(torch.uint8).random_(0, 256)
    slots, rows = state.alloc(3), torch.arange(1, 8, device="cuda")
    state_copy, kv_copy = state.get_cpu_copy(slots), full.get_cpu_copy(rows)
    assert all(t.is_pinned() for t in [*state_copy.conv, state_copy.temporal])
    assert all(k.is_pinned() and v.is_pinned() for chunks in kv_copy for k, v in chunks)
    new_slots, new_rows = state.alloc(3), torch.arange(20, 27, device="cuda")
    state.load_cpu_copy(state_copy, new_slots)
    full.load_cpu_copy(kv_copy, new_rows)
    assert all(torch.equal(raw(t[:, slots]), raw(t[:, new_slots])) for t in state.tensors)
    assert all(torch.equal(raw(b[rows]), raw(b[new_rows])) for b in [*full.k_buffer, *full.v_buffer])
