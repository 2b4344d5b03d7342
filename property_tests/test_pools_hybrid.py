"""HybridReqToTokenPool: admission (eager, P=1, lazy, no_buffer), release, ping-pong, and a stateful
check that admission is all-or-nothing and every slot is accounted for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mamba_radix.config import CacheConfig
from mamba_radix.errors import InvalidArgument, InvalidIndex, InvariantError
from mamba_radix.pools import HybridReqToTokenPool, MambaPool
from mamba_radix.request import Req

CONFIGS = {
    "no_buffer": CacheConfig(mamba_radix_cache_strategy="no_buffer"),
    "eager_p2": CacheConfig(mamba_radix_cache_strategy="extra_buffer"),
    "eager_p1": CacheConfig(mamba_radix_cache_strategy="extra_buffer", disable_overlap_schedule=True),
    "lazy": CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy"),
}


def make(kind: str, rows: int = 4, slots: int = 12) -> HybridReqToTokenPool:
    mamba = MambaPool(slots, 1, [(3, 8)], (2, 4, 4))
    return HybridReqToTokenPool(rows, 32, mamba, CONFIGS[kind])


def req(rid: int) -> Req:
    return Req(rid, [1, 2, 3])


def req_state(r: Req) -> tuple:
    track = None if r.mamba_ping_pong_track_buffer is None else list(r.mamba_ping_pong_track_buffer)
    return (r.req_pool_idx, r.mamba_pool_idx, track, r.mamba_next_track_idx)


def pool_state(p: HybridReqToTokenPool) -> tuple:
    return (
        p.available_size(),
        p.mamba_pool.allocated_slots().tolist(),
        p.num_reserved_slots(),
        p.req_index_to_mamba_index_mapping.tolist(),
        p.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist(),
    )


def assert_mappings_match(p: HybridReqToTokenPool, reqs: list[Req]) -> None:
    width = max(p.ping_pong_size, 1)
    live = [0] * (p.size + 1)
    track = [[-1] * width for _ in range(p.size + 1)]
    for r in reqs:
        if r.req_pool_idx is not None:
            live[r.req_pool_idx] = r.mamba_pool_idx or 0
            track[r.req_pool_idx] = list(r.mamba_ping_pong_track_buffer or [-1] * width)
    assert p.req_index_to_mamba_index_mapping.tolist() == live
    assert p.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist() == track
    assert p.req_index_to_mamba_index_mapping.dtype == torch.int64


# ------------------------------------------------------------------------------------------ admission
@pytest.mark.parametrize(
    ("kind", "track_len", "held_track", "per_req"),
    [("no_buffer", None, 0, 1), ("eager_p2", 2, 2, 3), ("eager_p1", 1, 1, 2), ("lazy", 2, 1, 2)],
)
def test_alloc_gives_row_live_slot_and_track_buffer(kind, track_len, held_track, per_req):
    p = make(kind)
    reqs = [req(0), req(1)]
    assert p.alloc(reqs) == [1, 2]
    for r in reqs:
        assert r.mamba_pool_idx is not None and r.mamba_next_track_idx == 0
        if track_len is None:
            assert r.mamba_ping_pong_track_buffer is None
        else:
            buf = r.mamba_ping_pong_track_buffer
            assert len(buf) == track_len and sum(s != -1 for s in buf) == held_track
            if kind == "lazy":
                assert buf[1] == -1
    held = [s for r in reqs for s in [r.mamba_pool_idx, *(r.mamba_ping_pong_track_buffer or [])] if s != -1]
    assert len(set(held)) == len(held) == 2 * per_req
    assert p.num_reserved_slots() == 2 * per_req == p.mamba_pool.used
    assert sorted(held) == p.reserved_slots()
    assert_mappings_match(p, reqs)


def test_alloc_keeps_a_preset_live_slot_and_row():
    p = make("eager_p2")
    cow = int(p.mamba_pool.alloc(1)[0])  # e.g. a copy-on-write hit
    r = req(0)
    r.mamba_pool_idx = cow
    p.alloc([r])
    assert r.mamba_pool_idx == cow and p.mamba_pool.used == 3 and p.num_reserved_slots() == 3
    row = r.req_pool_idx
    before = req_state(r)
    p.alloc([r])  # a continuing chunk: nothing new taken
    assert req_state(r) == before and r.req_pool_idx == row and p.mamba_pool.used == 3


PER_REQ = {"no_buffer": 1, "eager_p2": 3, "eager_p1": 2, "lazy": 2}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_admission_is_all_or_nothing_on_slot_shortage(kind):
    per_req = PER_REQ[kind]
    p = make(kind, rows=8, slots=3 * per_req - 1)
    a = req(0)
    p.alloc([a])
    before_pool, before_a = pool_state(p), req_state(a)
    # the first request of the batch would fit on its own, the second would not: neither gets anything
    batch = [req(1), req(2)]
    assert p.alloc(batch) is None
    assert pool_state(p) == before_pool and req_state(a) == before_a
    assert all(req_state(r) == (None, None, None, 0) for r in batch)
    assert p.alloc(batch[:1]) == [2]


def test_admission_is_all_or_nothing_on_row_shortage():
    p = make("eager_p2", rows=2, slots=12)
    p.alloc([req(0)])
    before = pool_state(p)
    batch = [req(1), req(2)]
    assert p.alloc(batch) is None
    assert pool_state(p) == before and all(r.req_pool_idx is None and r.mamba_pool_idx is None for r in batch)


def test_alloc_rejects_bad_requests_without_change():
    p = make("eager_p2")
    r = req(0)
    before = pool_state(p)
    with pytest.raises(InvalidArgument, match="same request twice"):
        p.alloc([r, r])
    stale = req(1)
    stale.req_pool_idx = 3
    with pytest.raises(InvalidIndex, match="row 3"):
        p.alloc([req(2), stale])
    foreign = req(3)
    foreign.mamba_pool_idx = 7
    with pytest.raises(InvalidIndex, match="state slot 7"):
        p.alloc([foreign])
    wrong = req(4)
    wrong.mamba_ping_pong_track_buffer = [-1]
    with pytest.raises(InvalidArgument, match="track buffer of 1"):
        p.alloc([wrong])
    assert pool_state(p) == before


# -------------------------------------------------------------------------------------------- release
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_free_mamba_cache_then_free_row(kind):
    p = make(kind)
    r = req(0)
    p.alloc([r])
    with pytest.raises(InvalidArgument, match="free_mamba_cache"):
        p.free(r)
    with pytest.raises(InvalidArgument, match="free_mamba_cache"):
        p.free(r.req_pool_idx)
    p.free_mamba_cache(r)
    assert (r.mamba_pool_idx, r.mamba_ping_pong_track_buffer, r.mamba_next_track_idx) == (None, None, 0)
    assert p.mamba_pool.used == 0 and p.num_reserved_slots() == 0
    assert_mappings_match(p, [r])
    p.free(r)
    assert r.req_pool_idx is None and p.used == 0
    with pytest.raises(InvalidIndex, match="holds no row"):
        p.free(r)


def test_free_mamba_cache_keeps_the_donated_slot():
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    keep = r.mamba_ping_pong_track_buffer[p.ping_pong_keep_idx(r)]
    p.free_mamba_cache(r, keep=keep)
    assert p.mamba_pool.allocated_slots().tolist() == [keep]
    assert p.num_reserved_slots() == 0


def test_free_mamba_cache_with_foreign_keep_changes_nothing():
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    before, before_req = pool_state(p), req_state(r)
    with pytest.raises(InvalidArgument, match="keep=11"):
        p.free_mamba_cache(r, keep=11)
    assert pool_state(p) == before and req_state(r) == before_req


def test_free_mamba_cache_skips_empty_lazy_entry():
    p = make("lazy")
    r = req(0)
    p.alloc([r])
    p.free_mamba_cache(r)
    assert p.mamba_pool.used == 0


# ------------------------------------------------------------------------------------------ ping-pong
def test_ping_pong_indices():
    eager = make("eager_p2")
    assert [eager.ping_pong_other_idx(i) for i in (0, 1)] == [1, 0]
    r = req(0)
    r.mamba_next_track_idx = 0
    assert eager.ping_pong_keep_idx(r) == 1
    p1 = make("eager_p1")
    assert p1.ping_pong_other_idx(0) == 0 and p1.ping_pong_keep_idx(r) == 0
    with pytest.raises(InvalidArgument, match="out of range"):
        p1.ping_pong_other_idx(1)
    lazy = make("lazy")
    r.mamba_next_track_idx = 1
    assert lazy.ping_pong_keep_idx(r) == 1


def test_donate_swaps_the_keep_slot():
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    r.mamba_next_track_idx = 1  # entry 0 holds the newest checkpoint
    old = r.mamba_ping_pong_track_buffer[0]
    new = int(p.mamba_pool.alloc(1)[0])
    assert p.donate_ping_pong_slot(r, new) == old
    assert r.mamba_ping_pong_track_buffer[0] == new
    assert p.num_reserved_slots() == 3
    assert_mappings_match(p, [r])
    with pytest.raises(InvalidArgument, match="already held"):
        p.donate_ping_pong_slot(r, r.mamba_pool_idx)
    with pytest.raises(InvalidIndex, match="not allocated"):
        p.donate_ping_pong_slot(r, 12)
    nb = make("no_buffer")
    q = req(1)
    nb.alloc([q])
    with pytest.raises(InvalidArgument, match="no ping-pong"):
        nb.donate_ping_pong_slot(q, 5)


def test_lazy_boundary_borrow_and_release():
    p = make("lazy", slots=3)
    r = req(0)
    p.alloc([r])  # live + 1 track: one slot left
    first = r.mamba_ping_pong_track_buffer[0]
    assert p.lazy_alloc_boundary_slot(r) is True
    borrowed = r.mamba_ping_pong_track_buffer[1]
    assert borrowed != -1 and r.mamba_next_track_idx == 1 and p.num_reserved_slots() == 3
    assert_mappings_match(p, [r])
    assert p.lazy_alloc_boundary_slot(r) is True  # second entry still held: no-op
    assert p.mamba_pool.used == 3
    p.lazy_release_old_slot(r)
    assert r.mamba_ping_pong_track_buffer == [-1, borrowed] and p.num_reserved_slots() == 2
    assert not bool(p.mamba_pool.is_allocated([first])[0])
    p.lazy_release_old_slot(r)  # nothing left to release
    assert p.num_reserved_slots() == 2
    # no free slot: the borrow fails and changes nothing
    other = int(p.mamba_pool.alloc(1)[0])
    before, before_req = pool_state(p), req_state(r)
    assert p.lazy_alloc_boundary_slot(r) is False
    assert pool_state(p) == before and req_state(r) == before_req
    assert other


def test_lazy_methods_need_the_lazy_strategy():
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    with pytest.raises(InvalidArgument, match="extra_buffer_lazy"):
        p.lazy_alloc_boundary_slot(r)
    with pytest.raises(InvalidArgument, match="extra_buffer_lazy"):
        p.lazy_release_old_slot(r)


# ----------------------------------------------------------------------------------------- hand-over
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_release_slot_gives_up_the_live_slot_without_freeing_it(kind):
    """After release_slot the request keeps its row and track buffer, the live slot stays allocated (now
    the tree's) and is in no record of the pool; the audit holds; reclaim_slot restores the exact state."""
    p = make(kind)
    r, other = req(0), req(1)
    p.alloc([r, other])
    before, before_req = pool_state(p), req_state(r)
    live, track = r.mamba_pool_idx, list(r.mamba_ping_pong_track_buffer or [])
    p.release_slot(r, live)
    assert r.mamba_pool_idx is None and r.req_pool_idx == before_req[0]
    assert list(r.mamba_ping_pong_track_buffer or []) == track
    assert bool(p.mamba_pool.is_allocated([live])[0])  # not freed: the new owner's
    assert not p.is_slot_held(live) and p.slot_holder(live) is None
    assert p.num_reserved_slots() == before[2] - 1
    assert live not in p.reserved_slots()
    assert p.mamba_pool.allocated_slots().tolist() == before[1]
    assert_mappings_match(p, [r, other])
    p.audit()
    p.reclaim_slot(r, live)
    assert pool_state(p) == before and req_state(r) == before_req
    assert p.slot_holder(live) is r
    p.audit()


def test_release_then_finish_frees_only_the_track_buffer():
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    live = r.mamba_pool_idx
    p.release_slot(r, live)
    p.free_mamba_cache(r)  # the track buffer only: the live slot is no longer the request's
    assert p.mamba_pool.allocated_slots().tolist() == [live] and p.num_reserved_slots() == 0
    p.free(r)
    p.audit()


def test_release_and_reclaim_refusals_change_nothing():
    p = make("eager_p2")
    r, other, stranger = req(0), req(1), req(2)
    p.alloc([r, other])
    tree_slot = int(p.mamba_pool.alloc(1)[0])  # allocated, held by no request (a tree checkpoint)
    before, before_req = pool_state(p), req_state(r)
    track0 = r.mamba_ping_pong_track_buffer[0]
    refusals = [
        (lambda: p.release_slot(r, track0), InvalidArgument, "track buffer"),
        (lambda: p.release_slot(r, other.mamba_pool_idx), InvalidArgument, "not one of its slots"),
        (lambda: p.release_slot(r, tree_slot), InvalidArgument, "not one of its slots"),
        (lambda: p.release_slot(r, 1.0), InvalidArgument, "must be an int"),
        (lambda: p.release_slot(r, True), InvalidArgument, "must be an int"),
        (lambda: p.release_slot(stranger, 3), InvalidArgument, "not admitted"),
        (lambda: p.release_slot(object(), 3), InvalidArgument, "takes a Req"),
        (lambda: p.reclaim_slot(r, tree_slot), InvalidArgument, "already holds live slot"),
    ]
    for call, error, message in refusals:
        with pytest.raises(error, match=message):
            call()
        assert pool_state(p) == before and req_state(r) == before_req
    live = r.mamba_pool_idx
    p.release_slot(r, live)
    released = pool_state(p), req_state(r)
    free_slot = next(s for s in range(1, 13) if not bool(p.mamba_pool.is_allocated([s])[0]))
    for call, error, message in [
        (lambda: p.reclaim_slot(r, other.mamba_pool_idx), InvalidArgument, "held by running request"),
        (lambda: p.reclaim_slot(r, track0), InvalidArgument, "held by running request"),
        (lambda: p.reclaim_slot(r, free_slot), InvalidIndex, "not allocated"),
        (lambda: p.reclaim_slot(r, "1"), InvalidArgument, "must be an int"),
        (lambda: p.reclaim_slot(stranger, live), InvalidArgument, "not admitted"),
        (lambda: p.release_slot(r, live), InvalidArgument, "not one of its slots"),
    ]:
        with pytest.raises(error, match=message):
            call()
        assert (pool_state(p), req_state(r)) == released
    p.reclaim_slot(r, live)
    assert pool_state(p) == before and req_state(r) == before_req


def test_release_slot_refuses_a_request_whose_slots_changed_behind_the_pool():
    p = make("no_buffer")
    r = req(0)
    p.alloc([r])
    stolen = int(p.mamba_pool.alloc(1)[0])
    r.mamba_pool_idx = stolen  # rewritten outside the pool
    with pytest.raises(InvalidArgument, match="does not record"):
        p.release_slot(r, stolen)
    assert p.is_slot_held(stolen) is False and p.num_reserved_slots() == 1


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        ("count", "num_reserved_slots"),
        ("record", "owner record"),
        ("mapping", "device slot mappings"),
        ("freed", "not allocated in the state pool"),
    ],
)
def test_audit_catches_a_stale_slot_record(corrupt, message):
    """The audit is what keeps release_slot honest: a release that forgot the count, the owner record or
    the mapping, or a held slot freed under the request, is reported."""
    p = make("eager_p2")
    r = req(0)
    p.alloc([r])
    p.audit()
    live = r.mamba_pool_idx
    if corrupt == "count":
        p._num_reserved -= 1
    elif corrupt == "record":
        p._slot_row.pop(live)
    elif corrupt == "mapping":
        p.req_index_to_mamba_index_mapping[r.req_pool_idx] = 0
    else:
        p.mamba_pool.free([live])
    with pytest.raises(InvariantError, match=message):
        p.audit()


def test_clear_resets_rows_slots_and_mappings():
    p = make("eager_p2")
    p.alloc([req(0), req(1)])
    p.clear()
    assert p.available_size() == 4 and p.mamba_pool.used == 0 and p.num_reserved_slots() == 0
    assert_mappings_match(p, [])


def test_constructor_checks():
    mamba = MambaPool(4, 1, [(3, 8)], (2, 4, 4))
    with pytest.raises(InvalidArgument, match="CacheConfig"):
        HybridReqToTokenPool(2, 8, mamba, {"strategy": "no_buffer"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="MambaPool"):
        HybridReqToTokenPool(2, 8, object(), CONFIGS["lazy"])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ stateful model
class HybridAdmissionMachine(RuleBasedStateMachine):
    """Batches are admitted, requests checkpoint (donate), cross lazy boundaries and finish (the donated
    slot going to a stand-in tree). After every step: each slot is held by exactly one owner (a running
    request, the tree, or the free list), the mappings mirror the requests, and a refused admission
    changed nothing."""

    ROWS, SLOTS = 5, 14

    def __init__(self) -> None:
        super().__init__()
        self.setup("eager_p2")

    def setup(self, kind: str) -> None:
        self.kind = kind
        self.pool = make(kind, rows=self.ROWS, slots=self.SLOTS)
        self.running: list[Req] = []
        self.tree: set[int] = set()
        self.next_rid = 0

    @rule(kind=st.sampled_from(sorted(CONFIGS)))
    def restart(self, kind):
        self.setup(kind)

    @rule(n=st.integers(1, 3), with_cow=st.booleans())
    def admit(self, n, with_cow):
        batch = [req(self.next_rid + i) for i in range(n)]
        self.next_rid += n
        if with_cow and self.tree:  # a hit: the tree's checkpoint copied into a fresh request slot
            cow = self.pool.mamba_pool.alloc(1)
            if cow is not None:
                batch[0].mamba_pool_idx = int(cow[0])
        per_req = PER_REQ[self.kind]
        slots_needed = per_req * n - (batch[0].mamba_pool_idx is not None)
        fits = n <= self.pool.available_size() and slots_needed <= self.pool.mamba_pool.available_size()
        before = pool_state(self.pool)
        got = self.pool.alloc(batch)
        if not fits:
            assert got is None and pool_state(self.pool) == before
            assert all(r.req_pool_idx is None and r.mamba_ping_pong_track_buffer is None for r in batch)
            if batch[0].mamba_pool_idx is not None:
                self.pool.mamba_pool.free([batch[0].mamba_pool_idx])
            return
        assert got == [r.req_pool_idx for r in batch]
        self.running.extend(batch)

    @rule(
        n=st.integers(1, 3),
        point=st.sampled_from(["rows", "slots"]),
        mode=st.sampled_from(["none", "raise"]),
    )
    def admit_with_injected_fault(self, n, point, mode):
        """An allocation that fails anyway (after admission counted room) returns None or propagates, and
        nothing is taken: the next clean admission gets exactly the rows and slots it would have got."""
        batch = [req(self.next_rid + i) for i in range(n)]
        self.next_rid += n
        before = pool_state(self.pool)
        target = self.pool if point == "rows" else self.pool.mamba_pool
        name = "_take_rows" if point == "rows" else "alloc"

        def fail(*args, **kwargs):
            if mode == "none":
                return None
            raise RuntimeError("injected allocation fault")

        fits = (
            n <= self.pool.available_size()
            and PER_REQ[self.kind] * n <= self.pool.mamba_pool.available_size()
        )
        setattr(target, name, fail)
        try:
            if mode == "none" or not fits:  # short of room: refused by the count, before any allocation
                assert self.pool.alloc(batch) is None
            else:
                with pytest.raises(RuntimeError, match="injected"):
                    self.pool.alloc(batch)
        finally:
            delattr(target, name)
        assert pool_state(self.pool) == before
        assert all(req_state(r) == (None, None, None, 0) for r in batch)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), what=st.sampled_from(["row", "live", "track"]))
    def admit_foreign(self, data, what):
        """A new request carrying a running request's row or one of its slots is refused, unchanged."""
        victim = data.draw(st.sampled_from(self.running))
        intruder = req(-1)
        if what == "row":
            intruder.req_pool_idx = victim.req_pool_idx
        elif what == "live":
            if victim.mamba_pool_idx is None:  # its live slot was handed to the tree
                return
            intruder.mamba_pool_idx = victim.mamba_pool_idx
        else:
            track = [s for s in victim.mamba_ping_pong_track_buffer or [] if s != -1]
            if not track:
                return
            intruder.mamba_pool_idx = track[0]
        before = pool_state(self.pool)
        with pytest.raises(InvalidArgument, match=r"holds|held by running request"):
            self.pool.alloc([intruder])
        assert pool_state(self.pool) == before

    @precondition(lambda self: self.running and self.kind != "no_buffer")
    @rule(data=st.data())
    def checkpoint(self, data):
        r = data.draw(st.sampled_from(self.running))
        if self.kind == "lazy" and not self.pool.lazy_alloc_boundary_slot(r):
            return
        new = self.pool.mamba_pool.alloc(1)
        if new is not None:
            self.tree.add(self.pool.donate_ping_pong_slot(r, int(new[0])))
        if self.kind == "lazy":
            self.pool.lazy_release_old_slot(r)
        elif self.pool.ping_pong_size == 2:
            r.mamba_next_track_idx = 1 - r.mamba_next_track_idx

    @precondition(lambda self: self.running)
    @rule(data=st.data(), donate=st.booleans())
    def finish(self, data, donate):
        r = data.draw(st.sampled_from(self.running))
        keep = None
        if donate:
            keep = (
                r.mamba_pool_idx
                if self.kind == "no_buffer"
                else r.mamba_ping_pong_track_buffer[self.pool.ping_pong_keep_idx(r)]
            )
        self.pool.free_mamba_cache(r, keep=keep)
        if keep is not None:
            self.tree.add(keep)
        self.pool.free(r)
        self.running.remove(r)

    @precondition(lambda self: any(r.mamba_pool_idx is not None for r in self.running))
    @rule(data=st.data(), refused=st.booleans())
    def hand_live_slot_to_tree(self, data, refused):
        """SGLang's insert of a running request's live slot: released to the tree; a refused insert
        reclaims it and leaves the pool exactly as it was."""
        r = data.draw(st.sampled_from([r for r in self.running if r.mamba_pool_idx is not None]))
        before, before_req = pool_state(self.pool), req_state(r)
        slot = r.mamba_pool_idx
        self.pool.release_slot(r, slot)
        if refused:
            self.pool.reclaim_slot(r, slot)
            assert pool_state(self.pool) == before and req_state(r) == before_req
        else:
            self.tree.add(slot)

    @precondition(lambda self: self.tree and any(r.mamba_pool_idx is None for r in self.running))
    @rule(data=st.data())
    def reclaim_from_tree(self, data):
        r = data.draw(st.sampled_from([r for r in self.running if r.mamba_pool_idx is None]))
        slot = data.draw(st.sampled_from(sorted(self.tree)))
        self.pool.reclaim_slot(r, slot)
        self.tree.remove(slot)

    @precondition(lambda self: self.tree)
    @rule(data=st.data())
    def tree_evicts(self, data):
        slot = data.draw(st.sampled_from(sorted(self.tree)))
        self.pool.mamba_pool.free([slot])
        self.tree.remove(slot)

    @invariant()
    def every_slot_has_one_owner(self):
        held = [
            s
            for r in self.running
            for s in [r.mamba_pool_idx, *(r.mamba_ping_pong_track_buffer or [])]
            if s not in (None, -1)
        ]
        assert len(held) == len(set(held)), "a slot held twice by running requests"
        assert not set(held) & self.tree, "a slot owned by a request and the tree"
        assert self.pool.num_reserved_slots() == len(held)
        assert self.pool.reserved_slots() == sorted(held)
        assert self.pool.mamba_pool.allocated_slots().tolist() == sorted([*held, *self.tree])
        assert self.pool.mamba_pool.available_size() + self.pool.mamba_pool.used == self.SLOTS
        assert self.pool.used == len(self.running)
        assert_mappings_match(self.pool, self.running)

    @invariant()
    def pool_audit_holds(self):
        self.pool.audit()

    @invariant()
    def owner_records_match_the_requests(self):
        for r in self.running:
            assert self.pool.row_holder(r.req_pool_idx) is r
            for s in [r.mamba_pool_idx, *(r.mamba_ping_pong_track_buffer or [])]:
                if s not in (None, -1):
                    assert self.pool.slot_holder(s) is r and self.pool.is_slot_held(s)
        for s in self.tree:
            assert not self.pool.is_slot_held(s) and self.pool.slot_holder(s) is None


TestHybridAdmissionMachine = HybridAdmissionMachine.TestCase
