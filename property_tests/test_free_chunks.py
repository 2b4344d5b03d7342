"""The trusted multi-chunk free an eviction uses (``free_chunks``) against its reference,
``free(torch.cat(chunks), check=False)``, and the compiled release (``mamba_radix._cfree.release_ids``)
against its numpy reference.

- on random alloc / free histories (need_sort or not, a free group open or not), a host free list freeing
  chunks (compiled release on and off) and a torch free list freeing their concatenation hold the same
  bitmap, the same free ids in the same order (merged list, waiting ids), then hand out the same ids;
- the token and paged allocators' ``free_chunks`` equal their checked-off ``free`` of the concatenation;
- ``release_ids`` writes what two numpy scatters write, on runs, shuffled and scattered ids, and declines
  (False) with nothing written for anything outside its contract.

The compiled parts are skipped where the extension was not built; the reference paths always run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mamba_radix.pools.free_list import FreeList
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.host_free_list import HostFreeList, compiled_release_ids

CPU = torch.device("cpu")
C_BUILT = compiled_release_ids(True) is not None
needs_c = pytest.mark.skipif(not C_BUILT, reason="the compiled release (mamba_radix._cfree) was not built")


def _state(fl: FreeList) -> tuple:
    return (
        fl.available,
        fl.free_pages.tolist(),
        fl.release_pages.tolist(),
        fl.allocated_ids().tolist(),
    )


def _chunks(ids: list[int], cuts: list[int]) -> list[torch.Tensor]:
    """``ids`` cut into consecutive chunks at ``cuts`` (empty chunks kept: callers may pass them)."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [torch.tensor(ids[a:b], dtype=torch.int64) for a, b in itertools.pairwise(bounds)]


# One step of a history: ("alloc", n) or ("free", picks, cuts, shuffle, group) freeing some held ids.
STEP = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 40)),
    st.tuples(
        st.just("free"),
        st.lists(st.integers(0, 10_000), min_size=1, max_size=60),
        st.lists(st.integers(0, 100), max_size=5),
        st.booleans(),
        st.booleans(),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(STEP, min_size=1, max_size=25),
    need_sort=st.booleans(),
    compiled=st.booleans(),
    num_ids=st.sampled_from([64, 300]),
    seed=st.integers(0, 2**16),
)
def test_free_chunks_matches_free_of_the_concatenation(steps, need_sort, compiled, num_ids, seed):
    if compiled and not C_BUILT:
        compiled = False
    ours = make_free_list(num_ids, CPU, need_sort, "id", backend="host")
    assert isinstance(ours, HostFreeList)
    ours._release_ids = compiled_release_ids(compiled)
    ref = make_free_list(num_ids, CPU, need_sort, "id", backend="torch")
    rng = np.random.default_rng(seed)
    held: list[int] = []
    for step in steps:
        if step[0] == "alloc":
            a, b = ours.alloc(step[1]), ref.alloc(step[1])
            assert (a is None) == (b is None)
            if a is not None:
                assert a.tolist() == b.tolist()
                held.extend(a.tolist())
        else:
            _, picks, cuts, shuffle, group = step
            chosen = list(dict.fromkeys(held[p % len(held)] for p in picks)) if held else []
            if shuffle:
                chosen = [int(x) for x in rng.permutation(chosen)]
            held = [i for i in held if i not in set(chosen)]
            if group:
                ours.free_group_begin()
                ref.free_group_begin()
            ours.free_chunks(_chunks(chosen, cuts))
            ref.free(torch.tensor(chosen, dtype=torch.int64), check=False)
            if group:
                assert _state(ours) == _state(ref)
                ours.free_group_end()
                ref.free_group_end()
        assert _state(ours) == _state(ref)
        ours.audit()
    rest = ours.available  # every free id, in the order both hand them out
    assert ours.alloc(rest).tolist() == ref.alloc(rest).tolist()


def test_free_chunks_keeps_the_chunks_without_a_copy_and_frees_nothing_for_no_chunks():
    fl = make_free_list(100, CPU, True, "id", backend="host")
    ids = fl.alloc(30)
    chunk = ids[5:20].clone()
    fl.free_chunks([])
    fl.free_chunks([torch.empty(0, dtype=torch.int64)])
    assert fl.available == 70
    fl.free_chunks([chunk])
    assert fl.available == 85
    assert np.shares_memory(fl._released[-1], chunk.numpy())  # parked as it is: the caller hands it over


def test_fifo_free_list_free_chunks_queues_the_ids_in_chunk_order():
    ours = make_free_list(40, CPU, False, "slot", backend="fifo")
    ref = make_free_list(40, CPU, False, "slot", backend="fifo")
    a, b = ours.alloc(30), ref.alloc(30)
    assert a.tolist() == b.tolist()
    picked = a.tolist()[25:2:-2]
    ours.free_chunks(_chunks(picked, [3, 7]))
    ref.free(torch.tensor(picked), check=False)
    assert _state(ours) == _state(ref)
    assert ours.alloc(ours.available).tolist() == ref.alloc(ref.available).tolist()


@pytest.mark.parametrize("need_sort", [True, False])
def test_token_allocator_free_chunks_equals_unchecked_free(need_sort):
    ours, ref = (
        TokenToKVPoolAllocator(500, need_sort=need_sort),
        TokenToKVPoolAllocator(500, need_sort=need_sort),
    )
    a, b = ours.alloc(200), ref.alloc(200)
    assert a.tolist() == b.tolist()
    picked = a.tolist()[150:10:-3]
    ours.free_chunks(_chunks(picked, [7, 20, 21]))
    ref.free(torch.tensor(picked), check=False)
    assert ours.available_size() == ref.available_size()
    assert ours.release_pages.tolist() == ref.release_pages.tolist()
    assert ours.alloc(ours.available_size()).tolist() == ref.alloc(ref.available_size()).tolist()


def test_paged_allocator_free_chunks_equals_unchecked_free():
    ours, ref = PagedTokenToKVPoolAllocator(512, 4), PagedTokenToKVPoolAllocator(512, 4)
    a, b = ours.alloc(160), ref.alloc(160)
    assert a.tolist() == b.tolist()
    picked = a.tolist()[16:96]
    ours.free_chunks([torch.tensor(picked[:40]), torch.tensor(picked[40:])])
    ref.free(torch.tensor(picked), check=False)
    assert ours.available_size() == ref.available_size()
    assert ours.alloc(ours.available_size()).tolist() == ref.alloc(ref.available_size()).tolist()


# --------------------------------------------------------------------------- the compiled release
def _numpy_release(bits: np.ndarray, pending: np.ndarray | None, chunks: list[np.ndarray]) -> None:
    for a in chunks:
        bits[a] = False
        if pending is not None:
            pending[a] = True


@needs_c
@settings(max_examples=80, deadline=None)
@given(
    num_ids=st.integers(1, 400),
    runs=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 30)), min_size=1, max_size=12),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    shuffle=st.booleans(),
    with_pending=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_release_ids_matches_the_numpy_scatters(num_ids, runs, cuts, shuffle, with_pending, seed):
    release = compiled_release_ids(True)
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for start, length in runs:  # ascending runs, as a node's KV mostly is; distinct ids in 1..num_ids
        first = 1 + start % num_ids
        ids.extend(range(first, min(first + length, num_ids + 1)))
    ids = list(dict.fromkeys(ids))
    if shuffle:
        ids = [int(x) for x in rng.permutation(ids)]
    chunks = [c.numpy() for c in _chunks(ids, cuts)]
    bits = rng.integers(0, 2, num_ids + 2).astype(np.bool_)
    pending = rng.integers(0, 2, num_ids + 2).astype(np.bool_) if with_pending else None
    want_bits, want_pending = bits.copy(), None if pending is None else pending.copy()
    _numpy_release(want_bits, want_pending, chunks)
    assert release(bits, pending, chunks) is True
    assert np.array_equal(bits, want_bits)
    if pending is not None:
        assert np.array_equal(pending, want_pending)


@needs_c
@pytest.mark.parametrize(
    "case",
    [
        "id 0",
        "id past the last",
        "negative id",
        "int32 ids",
        "strided ids",
        "read-only bitmap",
        "pending of another length",
        "int64 bitmap",
        "a tuple of chunks",
        "bad id in a later chunk",
    ],
)
def test_release_ids_declines_with_nothing_written(case):
    release = compiled_release_ids(True)
    num_ids = 50
    bits = np.ones(num_ids + 2, dtype=np.bool_)
    pending = np.zeros(num_ids + 2, dtype=np.bool_)
    good = np.arange(3, 9, dtype=np.int64)
    chunks: object = [good]
    if case == "id 0":
        chunks = [np.array([4, 0, 5], dtype=np.int64)]
    elif case == "id past the last":
        chunks = [np.array([num_ids + 1], dtype=np.int64)]
    elif case == "negative id":
        chunks = [np.array([2, -1], dtype=np.int64)]
    elif case == "int32 ids":
        chunks = [good.astype(np.int32)]
    elif case == "strided ids":
        chunks = [np.arange(1, 20, dtype=np.int64)[::2]]
    elif case == "read-only bitmap":
        bits.flags.writeable = False
    elif case == "pending of another length":
        pending = np.zeros(num_ids + 1, dtype=np.bool_)
    elif case == "int64 bitmap":
        bits = np.ones(num_ids + 2, dtype=np.int64)
    elif case == "a tuple of chunks":
        chunks = (good,)
    elif case == "bad id in a later chunk":
        chunks = [good, np.array([10, 11, num_ids + 7], dtype=np.int64)]
    before_bits, before_pending = bits.copy(), pending.copy()
    assert release(bits, pending, chunks) is False
    assert np.array_equal(bits, before_bits) and np.array_equal(pending, before_pending)


@needs_c
def test_release_ids_takes_more_chunks_than_its_stack_holds():
    release = compiled_release_ids(True)
    bits = np.ones(2002, dtype=np.bool_)
    pending = np.zeros(2002, dtype=np.bool_)
    chunks = [np.array([i, i + 1000], dtype=np.int64) for i in range(1, 301)]  # 300 two-run chunks
    want_bits, want_pending = bits.copy(), pending.copy()
    _numpy_release(want_bits, want_pending, chunks)
    assert release(bits, pending, chunks) is True
    assert np.array_equal(bits, want_bits) and np.array_equal(pending, want_pending)


def test_the_switch_turns_the_compiled_release_off(monkeypatch):
    monkeypatch.setenv("MAMBA_RADIX_C", "0")
    assert make_free_list(10, CPU, True, "id", backend="host")._release_ids is None
    monkeypatch.setenv("MAMBA_RADIX_C", "1")
    assert (make_free_list(10, CPU, True, "id", backend="host")._release_ids is None) == (not C_BUILT)
