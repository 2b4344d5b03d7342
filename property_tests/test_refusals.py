"""A refused call changes nothing, and every misuse gets a typed error (issue 11, the layers under the cache).

Pools, state movement, stamps: each test names the misuse it makes and checks the refusal is a
``MambaRadixError`` subclass and that the full state (allocation bitmaps, free lists, request table,
mappings, request fields, state bytes) is what it was. The trace loaders' and the planner's refusals live in
``test_traces.py`` and ``test_capacity_errors.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mamba_radix_kernels import naive

from mamba_radix import state_ops, state_stamp
from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex, InvalidPosition, MambaRadixError
from mamba_radix.pools import (
    HybridReqToTokenPool,
    MambaPool,
    MHATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from mamba_radix.request import Req
from mamba_radix.sim.stamps import StampIO
from mamba_radix.state_stamp import PrefixFingerprints

STRATEGIES = ["no_buffer", "extra_buffer", "extra_buffer_lazy"]


def hybrid(strategy: str, rows: int = 4, slots: int = 12) -> HybridReqToTokenPool:
    mamba = MambaPool(slots, 1, [(2, 4)], (2, 4))
    return HybridReqToTokenPool(rows, 16, mamba, CacheConfig(mamba_radix_cache_strategy=strategy))


def snapshot(pool: HybridReqToTokenPool, *reqs: Req) -> tuple:
    """Everything a refused call must leave alone: rows, slots, the free lists' order, mappings, owners."""
    fl = pool.mamba_pool._free_list
    return (
        list(pool._free_rows),
        bytes(pool._row_allocated),
        fl.allocated.tolist(),
        fl.free_pages.tolist(),
        fl.release_pages.tolist(),
        pool.req_index_to_mamba_index_mapping.tolist(),
        pool.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist(),
        pool.num_reserved_slots(),
        dict(pool._slot_row),
        [id(r) if r is not None else None for r in pool._row_req],
        [
            (
                r.req_pool_idx,
                r.mamba_pool_idx,
                list(r.mamba_ping_pong_track_buffer or []),
                r.mamba_next_track_idx,
            )
            for r in reqs
        ],
    )


def state_bits(pool: MambaPool) -> list[bytes]:
    return [t.contiguous().view(torch.uint8).numpy().tobytes() for t in pool.tensors]


# ------------------------------------------------------------------------- admission: transactional
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("point", ["rows", "slots"])
@pytest.mark.parametrize("mode", ["returns_none", "raises"])
def test_admission_fault_after_counting_leaks_nothing(strategy, point, mode):
    """The row or slot allocation fails although admission counted room (an injected fault): None or the
    fault's exception, nothing taken, and the next admission gets exactly the rows and slots a clean one
    would have."""
    pool = hybrid(strategy)
    running = Req("running", [1, 2])
    pool.alloc([running])
    cow = Req("cow", [1])
    cow.mamba_pool_idx = int(pool.mamba_pool.alloc(1)[0])  # a copy-on-write hit's slot, kept by admission
    batch = [Req(0, [1]), cow]
    clean = hybrid(strategy)  # the same history, without the fault
    clean.alloc([Req("running", [1, 2])])
    clean_cow = Req("cow", [1])
    clean_cow.mamba_pool_idx = int(clean.mamba_pool.alloc(1)[0])
    before = snapshot(pool, running, *batch)

    target = pool if point == "rows" else pool.mamba_pool
    name = "_take_rows" if point == "rows" else "alloc"

    def fault(*args, **kwargs):
        if mode == "returns_none":
            return None
        raise RuntimeError("injected allocation fault")

    setattr(target, name, fault)
    try:
        if mode == "returns_none":
            assert pool.alloc(batch) is None
        else:
            with pytest.raises(RuntimeError, match="injected"):
                pool.alloc(batch)
    finally:
        delattr(target, name)
    assert snapshot(pool, running, *batch) == before
    clean_batch = [Req(0, [1]), clean_cow]
    assert pool.alloc(batch) == clean.alloc(clean_batch)
    assert [(r.mamba_pool_idx, r.mamba_ping_pong_track_buffer) for r in batch] == [
        (r.mamba_pool_idx, r.mamba_ping_pong_track_buffer) for r in clean_batch
    ]


@pytest.mark.parametrize("mode", ["returns_none", "raises"])
def test_lazy_boundary_borrow_that_fails_changes_nothing(mode, monkeypatch):
    pool = hybrid("extra_buffer_lazy")
    r = Req("r", [1])
    pool.alloc([r])
    before = snapshot(pool, r)

    def fault(n):
        if mode == "returns_none":
            return None
        raise RuntimeError("injected allocation fault")

    monkeypatch.setattr(pool.mamba_pool, "alloc", fault)
    if mode == "returns_none":
        assert pool.lazy_alloc_boundary_slot(r) is False
    else:
        with pytest.raises(RuntimeError, match="injected"):
            pool.lazy_alloc_boundary_slot(r)
    assert snapshot(pool, r) == before


@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
def test_admission_refuses_a_request_carrying_another_requests_row_or_slots(strategy):
    pool = hybrid(strategy)
    a = Req("a", [1])
    pool.alloc([a])
    cases = {
        "row": dict(req_pool_idx=a.req_pool_idx),
        "live slot": dict(mamba_pool_idx=a.mamba_pool_idx),
        "track slot as live": dict(mamba_pool_idx=a.mamba_ping_pong_track_buffer[0]),
        "track buffer": dict(mamba_ping_pong_track_buffer=list(a.mamba_ping_pong_track_buffer)),
    }
    for what, fields in cases.items():
        intruder = Req("intruder", [1])
        for k, v in fields.items():
            setattr(intruder, k, v)
        before = snapshot(pool, a, intruder)
        with pytest.raises(InvalidArgument, match=r"holds|held by running request"):
            pool.alloc([intruder])
        assert snapshot(pool, a, intruder) == before, what


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_admission_refuses_one_slot_given_twice(strategy):
    pool = hybrid(strategy)
    slot = int(pool.mamba_pool.alloc(1)[0])
    c, d = Req("c", [1]), Req("d", [1])
    c.mamba_pool_idx = d.mamba_pool_idx = slot
    before = snapshot(pool, c, d)
    with pytest.raises(InvalidArgument, match="given twice in one admission"):
        pool.alloc([c, d])
    assert snapshot(pool, c, d) == before
    if pool.ping_pong_size:
        e = Req("e", [1])
        e.mamba_pool_idx = slot
        e.mamba_ping_pong_track_buffer = [slot] * pool.ping_pong_size  # live == track
        before = snapshot(pool, e)
        with pytest.raises(InvalidArgument, match="given twice"):
            pool.alloc([e])
        assert snapshot(pool, e) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("req_pool_idx", "1"),
        ("req_pool_idx", 1.0),
        ("req_pool_idx", True),
        ("mamba_pool_idx", 2**70),
        ("mamba_pool_idx", 1.5),
        ("mamba_ping_pong_track_buffer", 5),
        ("mamba_ping_pong_track_buffer", [1.5, 2]),
        ("mamba_next_track_idx", "0"),
    ],
)
def test_admission_refuses_wrongly_typed_request_fields(field, value):
    pool = hybrid("extra_buffer")
    r = Req("r", [1])
    setattr(r, field, value)
    before = snapshot(pool)
    with pytest.raises(MambaRadixError):
        pool.alloc([r])
    assert snapshot(pool) == before


@pytest.mark.parametrize("batch", [None, "reqs", {1}, Req("lone", [1])])
def test_admission_takes_only_a_list_of_requests(batch):
    pool = hybrid("no_buffer")
    with pytest.raises(InvalidArgument, match="list of Req"):
        pool.alloc(batch)


# ----------------------------------------------------------------------------- ownership queries
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_slot_and_row_holders_follow_admission_donation_and_release(strategy):
    pool = hybrid(strategy)
    a, b = Req("a", [1]), Req("b", [1])
    pool.alloc([a, b])
    for r in (a, b):
        assert pool.row_holder(r.req_pool_idx) is r
        for s in [r.mamba_pool_idx, *(r.mamba_ping_pong_track_buffer or [])]:
            if s != -1:
                assert pool.slot_holder(s) is r and pool.is_slot_held(s)
    if pool.is_lazy:
        assert pool.lazy_alloc_boundary_slot(a)
        borrowed = a.mamba_ping_pong_track_buffer[a.mamba_next_track_idx]
        assert pool.slot_holder(borrowed) is a
    if pool.ping_pong_size:
        new = int(pool.mamba_pool.alloc(1)[0])
        assert pool.slot_holder(new) is None
        donated = pool.donate_ping_pong_slot(a, new)
        assert pool.slot_holder(new) is a and not pool.is_slot_held(donated)
        # a running request's slot cannot be handed to another as its fresh ping-pong slot
        with pytest.raises(InvalidArgument, match="held by running request"):
            pool.donate_ping_pong_slot(a, b.mamba_pool_idx)
    live = a.mamba_pool_idx
    pool.free_mamba_cache(a)
    assert not pool.is_slot_held(live)
    row = a.req_pool_idx
    pool.free(a)
    assert pool.row_holder(row) is None and pool.row_holder(b.req_pool_idx) is b


def test_release_refuses_a_request_that_carries_slots_it_does_not_hold():
    pool = hybrid("extra_buffer")
    a = Req("a", [1])
    pool.alloc([a])
    stranger = Req("stranger", [1])
    stranger.mamba_pool_idx = a.mamba_pool_idx
    before = snapshot(pool, a, stranger)
    with pytest.raises(InvalidArgument, match="not admitted by this pool"):
        pool.free_mamba_cache(stranger)
    with pytest.raises(InvalidArgument, match="takes a Req"):
        pool.free_mamba_cache(None)
    with pytest.raises(InvalidArgument, match="is not a slot of request"):
        pool.free_mamba_cache(a, keep="1")
    assert snapshot(pool, a, stranger) == before


def test_mamba_pool_is_slot_allocated_is_a_scalar_membership_test():
    pool = MambaPool(4, 1, [(2,)], (2,))
    s = int(pool.alloc(1)[0])
    assert pool.is_slot_allocated(s) and not pool.is_slot_allocated(0)
    assert (
        not pool.is_slot_allocated(99) and not pool.is_slot_allocated(-1) and not pool.is_slot_allocated("1")
    )


# ------------------------------------------------------------------------------- request table
@pytest.mark.parametrize("value", [-(2**63), -1, 2**31])
def test_write_refuses_values_that_are_not_int32_kv_indices(value):
    """-2**63 once passed the fit check (abs overflows) and wrote 0."""
    pool = ReqToTokenPool(2, 8)
    row = pool.alloc(1)[0]
    with pytest.raises(InvalidArgument, match="KV indices"):
        pool.write(row, 0, torch.tensor([5, value], dtype=torch.int64))
    assert pool.req_to_token.abs().sum().item() == 0


@pytest.mark.parametrize("rows", [b"\x01", {1}, None, 1.5, "1"])
def test_row_free_takes_only_ints_or_lists_of_ints(rows):
    pool = ReqToTokenPool(2, 8)
    pool.alloc(1)
    with pytest.raises(InvalidArgument, match="rows must be an int"):
        pool.free(rows)
    assert pool.available_size() == 1


# ----------------------------------------------------------------------------- index conversion
@pytest.mark.parametrize(
    "make",
    [
        lambda: TokenToKVPoolAllocator(8),
        lambda: TokenToKVPoolAllocator(8, backend="torch"),
        lambda: PagedTokenToKVPoolAllocator(16, 4),
        lambda: MambaPool(4, 1, [(2,)], (2,)),
    ],
)
@pytest.mark.parametrize("indices", [2**70, [1, 2**70], [-(2**64)]])
def test_indices_beyond_int64_are_invalid_indices(make, indices):
    pool = make()
    with pytest.raises(InvalidIndex, match="does not fit int64"):
        pool.free(indices)


def test_impossible_pool_sizes_are_refused_before_allocating():
    with pytest.raises(InvalidArgument, match="GiB"):
        TokenToKVPoolAllocator(2**45)
    with pytest.raises(InvalidArgument, match="GiB"):
        MambaPool(2**30, 64, [(1024, 1024)], (1024, 1024))
    with pytest.raises(InvalidArgument, match="GiB"):
        ReqToTokenPool(2**20, 2**20)
    with pytest.raises(InvalidArgument, match="GiB"):
        MHATokenToKVPool(2**40, 1, torch.float16, 64, 128, 64)
    with pytest.raises(InvalidArgument, match="not a torch device"):
        TokenToKVPoolAllocator(8, device="nonsense")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_pool_without_cuda_is_refused_up_front():
    with pytest.raises(InvalidArgument, match="no CUDA device"):
        TokenToKVPoolAllocator(8, device="cuda")


# -------------------------------------------------------------------------------- exact undo
@pytest.mark.parametrize("backend", ["host", "torch"])
@pytest.mark.parametrize("need_sort", [True, False])
def test_undo_alloc_makes_the_next_alloc_hand_out_the_same_ids(backend, need_sort):
    a = TokenToKVPoolAllocator(64, need_sort=need_sort, backend=backend)
    b = TokenToKVPoolAllocator(64, need_sort=need_sort, backend=backend)
    for pool in (a, b):
        first = pool.alloc(40)
        pool.free(first[5:25])  # released, waiting for a merge
    taken = a.alloc(30)  # merges (and with need_sort reorders the free ids)
    a.undo_alloc(taken)
    assert a.available_size() == b.available_size()
    assert a.release_pages.tolist() == b.release_pages.tolist()
    for n in (12, 20, 10):
        assert a.alloc(n).tolist() == b.alloc(n).tolist()
    small = a.alloc(2)  # no merge: the head steps back
    a.undo_alloc(small)
    assert a.alloc(2).tolist() == b.alloc(2).tolist()


def test_fork_gives_its_slots_back_when_the_copy_fails(monkeypatch):
    pool = MambaPool(6, 1, [(2, 4)], (2, 4))
    src = int(pool.alloc(1)[0])
    free_before = pool._free_list.free_pages.tolist()

    def broken(*args, **kwargs):
        raise RuntimeError("copy failed")

    monkeypatch.setattr("mamba_radix.pools.mamba_pool.state_ops.fork_slots", broken)
    with pytest.raises(RuntimeError, match="copy failed"):
        pool.fork(src, 3)
    assert pool.used == 1 and pool._free_list.free_pages.tolist() == free_before


@pytest.mark.parametrize("backend", ["host", "torch"])
def test_paged_extend_gives_its_pages_back_when_building_the_indices_fails(backend, monkeypatch):
    a = PagedTokenToKVPoolAllocator(64, 4, backend=backend)
    b = PagedTokenToKVPoolAllocator(64, 4, backend=backend)
    for pool in (a, b):
        pool.free(pool.alloc(16)[4:12])  # released pages waiting for a merge
    first = a.alloc(8)
    first_b = b.alloc(8)

    def broken(*args, **kwargs):
        raise MemoryError("no memory for the result")

    monkeypatch.setattr(a, "_span_indices", broken)
    with pytest.raises(MemoryError):
        a.alloc_extend([6], [30], [int(first[5])], 24)
    monkeypatch.undo()
    assert a.available_size() == b.available_size()
    want = b.alloc_extend([6], [30], [int(first_b[5])], 24).tolist()
    assert a.alloc_extend([6], [30], [int(first[5])], 24).tolist() == want


# ------------------------------------------------------------------------------- state movement
def _pool_tensors() -> tuple[MambaPool, list[torch.Tensor]]:
    pool = MambaPool(8, 2, [(4, 4)], (4, 4), conv_dtypes=torch.float32)
    torch.manual_seed(0)
    for t in pool.tensors:
        t.copy_(torch.randn_like(t))
    return pool, pool.tensors


@pytest.mark.parametrize(
    ("active", "track", "message"),
    [
        ([1], [99], "outside the pool's slots"),
        ([1, 2], [3, 3], "duplicate destination slot 3"),
        ([1, 2], [2, 3], "both read"),
    ],
)
def test_track_with_index_lists_checks_their_values_by_default(active, track, message):
    """Lists are host values: they are checked like CPU tensors (unchecked, an out-of-range list index
    wrote outside the pool under the Triton interpreter)."""
    pool, tensors = _pool_tensors()
    before = state_bits(pool)
    with pytest.raises(InvalidArgument, match=message):
        state_ops.track_slots(tensors, active, track, torch.ones(len(track), dtype=torch.bool))
    assert state_bits(pool) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda t: state_ops.copy_slots(t, [2**70], [2]),
        lambda t: state_ops.copy_slots(t, [True], [2]),
        lambda t: state_ops.copy_slots(t, [1], [2], check="no"),
        lambda t: state_ops.copy_slots([torch.zeros(2, 4, 3, dtype=torch.complex128)], [1], [2]),
        lambda t: state_ops.gather_slots(t, [2**70], [torch.zeros(2, 1, 4, 4), torch.zeros(2, 1, 4, 4)]),
        lambda t: state_ops.bytes_moved(None, 1),
        lambda t: state_ops.bytes_moved(t, -1),
    ],
)
def test_state_ops_refuse_wrong_python_types_with_typed_errors(call):
    pool, tensors = _pool_tensors()
    before = state_bits(pool)
    with pytest.raises(InvalidArgument):
        call(tensors)
    assert state_bits(pool) == before


def test_fork_accepts_a_numpy_int_source():
    _, tensors = _pool_tensors()
    state_ops.fork_slots(tensors, np.int64(1), [2, 3])
    assert all(torch.equal(t[:, 2], t[:, 1]) and torch.equal(t[:, 3], t[:, 1]) for t in tensors)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: naive.move_slots_ref(t, t, torch.tensor([1]), torch.tensor([99])),
        lambda t: naive.move_slots_ref(t, t, torch.tensor([1.0]), torch.tensor([2.0])),
        lambda t: naive.move_slots_ref(t, t, torch.tensor([1, 2]), torch.tensor([3])),
        lambda t: naive.move_slots_ref(t, t[:1], torch.tensor([1]), torch.tensor([2])),
        lambda t: naive.move_slots_ref(
            t, t, torch.tensor([1]), torch.tensor([2]), torch.tensor([True, False])
        ),
        lambda t: naive.copy_slots_ref(t, None, None),
        lambda t: naive.fork_slots_ref(t, 99, torch.tensor([1])),
        lambda t: naive.bits_view(torch.zeros(2, dtype=torch.complex128)),
    ],
)
def test_torch_reference_refuses_malformed_calls_instead_of_failing_half_way(call):
    pool, tensors = _pool_tensors()
    before = state_bits(pool)
    with pytest.raises(InvalidArgument):
        call(tensors)
    assert state_bits(pool) == before


# ----------------------------------------------------------------------------------------- stamps
@pytest.mark.parametrize(
    ("slot", "fp", "n"),
    [(-1, 1, 1), (99, 1, 1), (2**70, 1, 1), ("1", 1, 1), (1, 2**64, 1), (1, -1, 1), (1, 1, 1.5)],
)
def test_stamp_writers_refuse_slots_outside_the_pool_and_values_outside_int64(slot, fp, n):
    """Slot -1 once wrote the last slot silently (negative indexing)."""
    pool, _ = _pool_tensors()
    before = state_bits(pool)
    with pytest.raises(InvalidArgument):
        state_stamp.write_stamp(pool, slot, fp, n)
    with pytest.raises(InvalidArgument):
        StampIO(pool).write(slot, fp, n)
    assert state_bits(pool) == before


@pytest.mark.parametrize("tokens", [[1.5], [-1], [2**70], None, "abc", [[1, 2]], np.array([1.5])])
def test_fingerprints_refuse_tokens_that_are_not_int64_ids(tokens):
    with pytest.raises(InvalidArgument):
        state_stamp.fingerprint(tokens)
    with pytest.raises(InvalidArgument):
        PrefixFingerprints(tokens)


def test_fingerprints_of_the_largest_token_id_agree_and_do_not_overflow():
    tokens = [2**63 - 1, 0, 2**63 - 2]
    prefix = PrefixFingerprints(np.array(tokens, dtype=np.int64))
    for n in range(4):
        assert prefix.at(n) == state_stamp.fingerprint(tokens[:n])
    # one token t hashes to (t + 1) mod p per modulus; t + 1 = 2**63 must not wrap to -2**63 in int64
    low, high = ((2**63) % p for p in state_stamp._MODULI)
    assert state_stamp.fingerprint([2**63 - 1]) == low | (high << 32)


def test_prefix_length_outside_the_sequence_is_an_invalid_position():
    prefix = PrefixFingerprints(np.array([1, 2], dtype=np.int64))
    for n in (3, -1, "1"):
        with pytest.raises(InvalidPosition):
            prefix.at(n)
