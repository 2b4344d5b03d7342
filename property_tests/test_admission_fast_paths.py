"""Admission's fast paths (issue 12) against the plain paths they stand for: the free list's int
allocation, the host free list's numpy buffer, the request pool's trusted admission and its mirror
update, the buffer strategy's cached slot counts. Same ids, same pool state, same errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from lifecycle_helpers import prefill

from mamba_radix import CacheConfig, InvalidArgument, MambaRadixCache, Req, strategies
from mamba_radix.buffers import buffer_strategy
from mamba_radix.cache import MatchResult
from mamba_radix.pools import HybridReqToTokenPool, MambaPool
from mamba_radix.pools.free_lists import make_free_list

CPU = torch.device("cpu")


def state(fl) -> tuple:
    """Everything later calls can observe: counts, the free order, pending frees, the bitmap."""
    return (fl.available, fl.free_pages.tolist(), fl.release_pages.tolist(), fl.allocated.tolist())


class IntAllocAgreement(RuleBasedStateMachine):
    """Per backend, one free list allocating with ``alloc`` and one with ``alloc_ints``, driven by the
    same calls (frees, groups, merges, undo of the last allocation): the same ids, the same state."""

    N = 40

    def __init__(self) -> None:
        super().__init__()
        self.restart("host", False)

    @rule(backend=st.sampled_from(["host", "torch"]), need_sort=st.booleans())
    def restart(self, backend, need_sort):
        self.pair = [make_free_list(self.N, CPU, need_sort, "id", backend=backend) for _ in range(2)]
        self.held: list[int] = []
        self.last: list[int] | None = None  # the ids of the last allocation, while it can be undone

    @rule(n=st.integers(0, N + 1))
    def alloc(self, n):
        plain, ints = self.pair
        t = plain.alloc(n)
        got = ints.alloc_ints(n)
        assert (None if t is None else t.tolist()) == got
        assert got is None or all(type(i) is int for i in got)
        if got is not None:
            self.held += got
            self.last = got

    @precondition(lambda self: self.last)
    @rule()
    def undo_last_alloc(self):
        ids = torch.tensor(self.last, dtype=torch.int64)
        for fl in self.pair:
            fl.undo_alloc(ids)
        self.held = [i for i in self.held if i not in self.last]
        self.last = None

    @rule(data=st.data(), check=st.booleans())
    def free(self, data, check):
        if not self.held:
            return
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        for fl in self.pair:
            fl.free(torch.tensor(ids), check=check)
        self.held = [i for i in self.held if i not in ids]
        self.last = None

    @rule()
    def group_begin(self):
        for fl in self.pair:
            fl.free_group_begin()
        self.last = None

    @rule()
    def group_end(self):
        for fl in self.pair:
            fl.free_group_end()
        self.last = None

    @rule()
    def merge(self):
        for fl in self.pair:
            fl.merge()
        self.last = None

    @invariant()
    def agree(self):
        plain, ints = self.pair
        assert state(plain) == state(ints)
        assert plain.allocated_ids().tolist() == sorted(self.held)


TestIntAllocAgreement = IntAllocAgreement.TestCase


def test_host_free_list_buffer_is_numpy_and_alloc_views_it() -> None:
    """The host list's buffer is a numpy array, its allocations tensor views of that memory, and
    free_pages a tensor (the torch list's contract)."""
    fl = make_free_list(8, CPU, False, "id", backend="host")
    ids = fl.alloc(3)
    assert isinstance(ids, torch.Tensor) and ids.tolist() == [1, 2, 3]
    assert isinstance(fl.free_pages, torch.Tensor) and fl.free_pages.tolist() == [4, 5, 6, 7, 8]
    fl.free_ints([2])
    assert fl.alloc_ints(6) == [4, 5, 6, 7, 8, 2]  # a merge: the listed head, then the freed slot
    assert fl.alloc_ints(1) is None and fl.available == 0


@pytest.mark.parametrize("backend", ["host", "torch"])
def test_mamba_pool_alloc_as_list_is_alloc(backend: str) -> None:
    pools = [MambaPool(10, 1, [(2,)], (2,), backend=backend) for _ in range(2)]
    for pool in pools:
        pool.alloc(7)
        pool.free([3, 1])
    assert pools[0].alloc(4).tolist() == pools[1].alloc(4, as_list=True)
    assert pools[0].allocated_slots().tolist() == pools[1].allocated_slots().tolist()
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgument, match="num_slots"):
            pools[1].alloc(bad, as_list=True)  # type: ignore[call-overload]
    assert pools[1].alloc(99, as_list=True) is None


STRATEGIES = {
    "no_buffer": CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True),
    "extra_buffer": CacheConfig(mamba_radix_cache_strategy="extra_buffer"),
    "extra_buffer_no_overlap": CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", disable_overlap_schedule=True
    ),
    "extra_buffer_lazy": CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy"),
    "per_chunk": CacheConfig(mamba_radix_cache_strategy="extra_buffer", mamba_slot_headroom="per_chunk"),
    "per_chunk_lazy": CacheConfig(
        mamba_radix_cache_strategy="extra_buffer_lazy", mamba_slot_headroom="per_chunk"
    ),
    "disabled": CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_radix_cache=True),
}


def pool_state(pool: HybridReqToTokenPool) -> tuple:
    fl = pool.mamba_pool._free_list
    return (
        list(pool._free_rows),
        bytes(pool._row_allocated),
        state(fl),
        pool.req_index_to_mamba_index_mapping.tolist(),
        pool.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist(),
        pool.num_reserved_slots(),
        dict(pool._slot_row),
        list(pool._row_live),
        [list(t) for t in pool._row_track],
        [None if r is None else r.rid for r in pool._row_req],
    )


def req_state(req: Req) -> tuple:
    return (req.req_pool_idx, req.mamba_pool_idx, req.mamba_ping_pong_track_buffer, req.mamba_next_track_idx)


def recount(pool: HybridReqToTokenPool) -> tuple:
    """The mirror's owner record and reserved count rebuilt from the requests the pool records."""
    slot_row = {}
    for row, req in enumerate(pool._row_req):
        if req is not None:
            for s in [req.mamba_pool_idx or 0, *(req.mamba_ping_pong_track_buffer or [])]:
                if s > 0:
                    slot_row[s] = row
    return slot_row, len(slot_row)


@given(
    strategy=st.sampled_from(sorted(STRATEGIES)),
    plan=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12),
)
def test_trusted_admission_equals_checked_admission(strategy: str, plan: list[tuple[bool, bool]]) -> None:
    """``alloc([req], check=False)`` (the cache's admission of a fresh request, with or without a live
    slot its copy-on-write just took) leaves both pools, the mappings, the mirror and the request as the
    checked ``alloc`` does, through admissions, releases and refusals (pools running dry)."""
    config = STRATEGIES[strategy]
    pools = [HybridReqToTokenPool(3, 8, MambaPool(7, 1, [(2,)], (2,)), config) for _ in range(2)]
    running: list[list[Req]] = [[], []]
    for step, (admit, with_slot) in enumerate(plan):
        if admit or not running[0]:
            results = []
            for k, (pool, check) in enumerate(zip(pools, (True, False), strict=True)):
                req = Req(rid=step, origin_input_ids=[1])
                if with_slot:
                    slot = pool.mamba_pool.alloc(1, as_list=True)
                    req.mamba_pool_idx = None if slot is None else slot[0]
                rows = pool.alloc([req], check=check)
                if rows is None and req.mamba_pool_idx is not None:
                    pool.mamba_pool.free([req.mamba_pool_idx])  # the cache's undo of its slot
                    req.mamba_pool_idx = None
                elif rows is not None:
                    running[k].append(req)
                results.append((rows, req_state(req)))
            assert results[0] == results[1]
        else:
            for k, pool in enumerate(pools):
                req = running[k].pop(0)
                pool.free_mamba_cache(req)
                pool.free(req)
        assert pool_state(pools[0]) == pool_state(pools[1])
        for pool in pools:
            assert recount(pool) == (pool._slot_row, pool.num_reserved_slots())


@given(
    strategy=st.sampled_from(sorted(STRATEGIES)),
    live=st.sampled_from([None, 3]),
    track=st.sampled_from([None, [4], [4, 5], [4, -1]]),
)
def test_buffer_admission_slots_equal_the_rule(strategy: str, live, track) -> None:
    """The strategy object's counts, read from the config once, are :mod:`strategies`' rule's."""
    config = STRATEGIES[strategy]
    req = Req(rid=0, origin_input_ids=[1], mamba_pool_idx=live, mamba_ping_pong_track_buffer=track)
    buffer = buffer_strategy(config)
    assert buffer.admission_slots(req) == strategies.admission_slots(config, req)
    assert buffer.per_chunk_headroom_slots == config.per_chunk_headroom_slots


# ------------------------------------------------------------------------ the hit's KV, written lazily
class Recorder:
    """Wraps ``cache.match_prefix`` to keep the results it returns."""

    def __init__(self, cache: MambaRadixCache) -> None:
        self.inner = cache.match_prefix
        self.results: list[MatchResult] = []

    def __call__(self, *args: object, **kwargs: object) -> MatchResult:
        result = self.inner(*args, **kwargs)  # type: ignore[arg-type]
        self.results.append(result)
        return result


def cached_prefix(cache: MambaRadixCache, req: Req) -> list[int]:
    """The row's ``[0, cache_protected_len)``: the tree's KV of the request's cached prefix now."""
    return cache.req_to_token_pool.req_to_token[req.req_pool_idx][: req.cache_protected_len].tolist()


@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(1, 3), min_size=1, max_size=24)),
        min_size=1,
        max_size=10,
    ),
    page=st.sampled_from([1, 2]),
)
def test_lazy_prefix_indices_equal_the_eager_hit_and_the_row(prompts, page) -> None:
    """Two caches serve the same requests (each kept running for two more admissions, so that
    evictions, splits and hand-overs happen while it runs); one reads ``req.prefix_indices`` and the
    match's ``device_indices`` right after admission (the eager form), the other only when the request
    finishes. The early read gives the row's ``[0, hit)`` as written at admission; the late one the row's
    ``[0, cache_protected_len)`` then (after its hand-overs, SGLang's contract: the cached prefix); and the
    caches end equal."""
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer",
        page_size=page,
        mamba_cache_chunk_size=2,
        mamba_track_interval=4,
        chunked_prefill_size=4,
    )
    caches = [
        MambaRadixCache.build(config, num_tokens=96, num_slots=16, max_running_requests=3, max_context_len=40)
        for _ in range(2)
    ]
    stems = [[9, 8, 7, 6, 5, 4], [9, 8, 7, 1], [4, 4, 4, 4]]
    for k, cache in enumerate(caches):
        eager = k == 0
        running: list[tuple[Req, list[int], list[int] | None]] = []
        recorder = Recorder(cache)
        cache.match_prefix = recorder  # type: ignore[method-assign]
        for rid, (stem, tail) in enumerate(prompts):
            while len(running) >= 2:  # finish the oldest: the late read, then its row is freed
                req, row_at_admission, read_early = running.pop(0)
                assert req.prefix_indices.tolist() == cached_prefix(cache, req)
                if read_early is not None:
                    assert read_early == row_at_admission
                cache.finish(req)
            req = Req(rid=rid, origin_input_ids=stems[stem] + tail)
            assert cache.admit(req, max_new_tokens=1)
            hit = req.cache_protected_len
            row = cache.req_to_token_pool.req_to_token[req.req_pool_idx][:hit].tolist()
            read_early = None
            if eager:
                read_early = req.prefix_indices.tolist()
                assert recorder.results[-1].device_indices is req.prefix_indices  # one tensor, read once
                assert req.prefix_indices.dtype == torch.int64 and len(read_early) == hit
            running.append((req, row, read_early))
            prefill(cache, req, chunk=4)
        for req, _, _ in running:
            assert req.prefix_indices.tolist() == cached_prefix(cache, req)
            cache.finish(req)
        cache.check_invariants([])
        assert len(recorder.results) == len(prompts)
    assert caches[0].stats == caches[1].stats
    assert caches[0].pretty_print() == caches[1].pretty_print()


def test_match_result_reads_like_the_named_tuple_it_was() -> None:
    cache = MambaRadixCache.build(
        CacheConfig(mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=1),
        num_tokens=32,
        num_slots=8,
    )
    kv = cache.alloc_token_slots(5)
    slot = cache.alloc_state_slot()
    cache.insert([1, 2, 3, 4, 5], kv, slot)
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert m._fields == (
        "device_indices",
        "last_node",
        "mamba_slot",
        "full_kv_hit_len",
        "mamba_branching_seqlen",
    )
    indices, node, got_slot, full, branching = m
    assert indices.tolist() == kv.tolist() and indices.dtype == torch.int64
    assert indices.data_ptr() != kv.data_ptr()  # a fresh tensor, never the node's storage
    assert m.device_indices is indices and m[0] is indices and m[-1] is branching
    assert (node, got_slot, full, branching) == (m.last_node, slot, 5, None)
    assert m._asdict()["mamba_slot"] == slot and len(m) == 5 and m[1:3] == (node, slot)
    assert "mamba_slot=" in repr(m)
    with pytest.raises(InvalidArgument, match="device_indices or the tree match"):
        MatchResult(None, node, None, 0, None)
