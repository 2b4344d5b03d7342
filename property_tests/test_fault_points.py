"""Every allocation point of a whole request lifecycle, failed once and failed for good (issue 11 item 4).

A run counts the allocation calls a request makes under each strategy (KV allocator, state pool, request
rows: admission's copy-on-write slot and its row and slots, every extend's KV, every hand-over's fresh
slot, the lazy strategy's boundary slot). Then, for each call k, the same run is repeated with call k
failing once, and with every call from k on failing. The cache must degrade, never break: admission
refuses with nothing taken, an extend returns None with nothing taken (the engine then aborts the
request), a hand-over without a slot is skipped; afterwards the invariants with conservation hold, every
stamp is right, and evicting everything gives every pool back whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp

CONFIGS = {
    "no_buffer": CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True),
    "extra_buffer": CacheConfig(mamba_radix_cache_strategy="extra_buffer"),
    "extra_buffer_no_overlap": CacheConfig(
        mamba_radix_cache_strategy="extra_buffer", disable_overlap_schedule=True
    ),
    "extra_buffer_lazy": CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy"),
    "paged": CacheConfig(mamba_radix_cache_strategy="extra_buffer", page_size=4),
    "sglang-0.5.20": CacheConfig(mamba_radix_cache_strategy="extra_buffer", mamba_slot_headroom="per_chunk"),
}
SMALL = {"mamba_cache_chunk_size": 4, "mamba_track_interval": 8, "chunked_prefill_size": 8}


class Faults:
    """Counts the calls of the wrapped allocation methods; fails the ones asked for (returns None)."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_from: int | None = None
        self.fail_once: int | None = None

    def wrap(self, obj: Any, name: str) -> None:
        real = getattr(obj, name)

        def alloc(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.fail_once or (self.fail_from is not None and self.calls >= self.fail_from):
                return None
            return real(*args, **kwargs)

        setattr(obj, name, alloc)


def build(name: str) -> tuple[MambaRadixCache, Faults]:
    config = CONFIGS[name].replace(**SMALL)
    cache = MambaRadixCache.build(
        config, num_tokens=256, num_slots=16, max_running_requests=3, max_context_len=96
    )
    faults = Faults()
    allocator = cache.token_to_kv_pool_allocator
    for method in ("alloc", "alloc_extend"):
        if hasattr(allocator, method):
            faults.wrap(allocator, method)
    faults.wrap(cache.mamba_pool, "alloc")
    faults.wrap(cache.req_to_token_pool, "_take_rows")
    return cache, faults


def serve(cache: MambaRadixCache, rid: int, prompt: list[int], num_out: int) -> None:
    """One request; on any refusal the engine aborts it (what an engine would do, minus retries)."""
    req = Req(rid=rid, origin_input_ids=prompt)
    if not cache.admit(req, max_new_tokens=num_out):
        assert req.req_pool_idx is None and req.mamba_pool_idx is None and req.last_node is None
        return
    assert read_stamp(cache.mamba_pool, req.mamba_pool_idx) == (fingerprint(prompt[: req.kv_len]), req.kv_len)
    last = len(prompt) + num_out - 1
    while len(req.output_ids) < num_out:
        n = min(8, len(prompt) - req.kv_len) if req.kv_len < len(prompt) else 1
        plan = cache.extend(req, n)
        if plan is None:
            cache.finish(req, insert=False)
            return
        write_stamp(cache.mamba_pool, plan.live_slot, fingerprint(req.token_ids(plan.end)), plan.end)
        if plan.track_slot is not None:
            write_stamp(
                cache.mamba_pool, plan.track_slot, fingerprint(req.token_ids(plan.track_len)), plan.track_len
            )
        cache.commit(plan, finished=plan.end == last)
        if plan.end >= len(prompt):
            req.output_ids.append(9000 + rid * 100 + len(req.output_ids))
    cache.finish(req)


def workload(cache: MambaRadixCache) -> None:
    shared = list(range(1, 21))
    serve(cache, 1, [*shared, 30, 31, 32, 33], 10)  # a prefill, chunked, then decode past a boundary
    serve(cache, 2, [*shared, 40, 41], 3)  # hits the shared prefix: copy-on-write
    serve(cache, 3, [*shared, 30, 31, 32, 33], 2)  # a repeat


def check_whole(cache: MambaRadixCache) -> None:
    cache.check_invariants([])
    tree = cache.tree
    for node in tree.nodes():
        if node.mamba_slot is not None:
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            assert read_stamp(cache.mamba_pool, node.mamba_slot) == (fingerprint(tokens), node.depth)
    cache.evict(num_tokens=10**6, num_states=10**6)
    assert cache.tree.num_nodes == 1
    assert cache.token_to_kv_pool_allocator.used == 0
    assert cache.mamba_pool.used == 0
    assert cache.req_to_token_pool.used == 0
    assert cache.reserved_kv_tokens == 0


def count_calls(name: str) -> int:
    cache, faults = build(name)
    workload(cache)
    check_whole(cache)
    return faults.calls


@contextmanager
def failing(name: str, setup: Callable[[Faults], None]) -> Iterator[MambaRadixCache]:
    cache, faults = build(name)
    setup(faults)
    yield cache


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_allocation_point_failed_once_and_for_good(name: str) -> None:
    total = count_calls(name)
    assert total >= 8  # rows, slots, KV per chunk and per decode step, hand-over slots
    for k in range(1, total + 1):
        for mode in ("once", "from"):
            cache, faults = build(name)
            if mode == "once":
                faults.fail_once = k
            else:
                faults.fail_from = k
            workload(cache)
            check_whole(cache)
