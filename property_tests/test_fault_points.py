"""Every allocation point of a whole request lifecycle, failed once and failed for good (issue 11 item 4).

A run counts the allocation calls a request makes under each strategy (KV allocator, state pool, request
rows: admission's copy-on-write slot and its row and slots, every extend's KV, every hand-over's fresh
slot, the lazy strategy's boundary slot). Then, for each call k, the same run is repeated with call k
failing once, and with every call from k on failing. The cache must degrade, never break: admission
refuses with nothing taken, an extend returns None with nothing taken (the engine then aborts the
request), a hand-over without a slot is skipped; afterwards the invariants with conservation hold, every
stamp is right, and evicting everything gives every pool back whole.

Each configuration runs with ``model`` and with one quantized format, int8 and fp8 e4m3 alternating over
the configurations (issue 26): under ``int8`` / ``fp8_e4m3`` the
checkpoint pool's allocation (every hand-over's checkpoint slot) is an allocation point too, states carry
value stamps that the quantized round trip keeps exactly (:mod:`mamba_radix.testing.value_stamps`), every
checkpoint's stamp is read through the format's dequantization, and the checkpoint pool must come back
whole as well. Two configurations also run on unified memory (the simulator's one byte budget for KV and
states, :mod:`mamba_radix.sim.unified`): the budget must be whole again at the end too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.sim.capacity_limit import LimitedMambaPool, limited_kv_allocator
from mamba_radix.sim.unified import UnifiedMemoryCache
from mamba_radix.state_stamp import fingerprint
from mamba_radix.testing.value_stamps import StateStamps

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
FORMATS = ("model", "int8", "fp8_e4m3")
# value stamps need 32 payload elements per layer's slot in every state tensor (one row of 64 each)
SHAPES = {"conv_shapes": [(4, 16)], "temporal_shape": (2, 4, 8)}
UNIFIED_SLOT_BYTES = 4  # a state slot's bytes in KV tokens' under unified memory (the line moves both ways)


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


def build(name: str, fmt: str = "model") -> tuple[MambaRadixCache, Faults]:
    """The cache of configuration ``name`` with checkpoint format ``fmt``, its allocations wrapped.
    ``"unified"``: the model format on unified memory, the simulator's byte budget for KV and states
    (:data:`UNIFIED_SLOT_BYTES` per state slot, one per KV token, 40 tokens' and 4 slots' bytes in all,
    so that the workload evicts on both sides)."""
    if fmt == "unified":
        config = CONFIGS[name].replace(**SMALL, enable_unified_memory=True)
        total = 40 + 4 * UNIFIED_SLOT_BYTES  # tight: the workload evicts KV and checkpoints for room
        cache = UnifiedMemoryCache.build(
            config,
            num_tokens=total,
            num_slots=total // UNIFIED_SLOT_BYTES,
            max_running_requests=3,
            max_context_len=96,
            mamba_pool_factory=LimitedMambaPool,
            kv_allocator_factory=limited_kv_allocator,
            **SHAPES,
        )
        cache.attach_budget(total, 1, UNIFIED_SLOT_BYTES)
        fmt = "model"
    else:
        config = CONFIGS[name].replace(**SMALL, checkpoint_format=fmt)
        cache = MambaRadixCache.build(
            config, num_tokens=256, num_slots=16, max_running_requests=3, max_context_len=96, **SHAPES
        )
    cache.stamps = StateStamps(fmt, cache.mamba_pool)  # type: ignore[attr-defined]  # the test's own
    faults = Faults()
    allocator = cache.token_to_kv_pool_allocator
    for method in ("alloc", "alloc_extend"):
        if hasattr(allocator, method):
            faults.wrap(allocator, method)
    faults.wrap(cache.mamba_pool, "alloc")
    if cache.checkpoint_pool is not None:
        faults.wrap(cache.checkpoint_pool, "alloc")
    faults.wrap(cache.req_to_token_pool, "_take_rows")
    return cache, faults


def serve(cache: MambaRadixCache, rid: int, prompt: list[int], num_out: int) -> None:
    """One request; on any refusal the engine aborts it (what an engine would do, minus retries)."""
    stamps: StateStamps = cache.stamps  # type: ignore[attr-defined]
    req = Req(rid=rid, origin_input_ids=prompt)
    if not cache.admit(req, max_new_tokens=num_out):
        assert req.req_pool_idx is None and req.mamba_pool_idx is None and req.last_node is None
        return
    assert stamps.read(req.mamba_pool_idx) == (fingerprint(prompt[: req.kv_len]), req.kv_len)
    last = len(prompt) + num_out - 1
    while len(req.output_ids) < num_out:
        n = min(8, len(prompt) - req.kv_len) if req.kv_len < len(prompt) else 1
        plan = cache.extend(req, n)
        if plan is None:
            cache.finish(req, insert=False)
            return
        stamps.write(plan.live_slot, fingerprint(req.token_ids(plan.end)), plan.end)
        if plan.track_slot is not None:
            stamps.write(plan.track_slot, fingerprint(req.token_ids(plan.track_len)), plan.track_len)
        cache.commit(plan, finished=plan.end == last)
        budget = getattr(cache, "budget", None)  # unified memory: within the byte budget at every step
        assert budget is None or budget.used_bytes() <= budget.total_bytes
        if plan.end >= len(prompt):
            req.output_ids.append(9000 + rid * 100 + len(req.output_ids))
    cache.finish(req)


def workload(cache: MambaRadixCache) -> None:
    shared = list(range(1, 21))
    serve(cache, 1, [*shared, 30, 31, 32, 33], 10)  # a prefill, chunked, then decode past a boundary
    serve(cache, 2, [*shared, 40, 41], 3)  # hits the shared prefix: copy-on-write
    serve(cache, 3, [*shared, 30, 31, 32, 33], 2)  # a repeat


def check_whole(cache: MambaRadixCache) -> None:
    stamps: StateStamps = cache.stamps  # type: ignore[attr-defined]
    ckpt_pool = cache.checkpoint_pool
    budget = getattr(cache, "budget", None)  # unified memory: KV and states within one byte budget
    assert budget is None or budget.used_bytes() <= budget.total_bytes
    cache.check_invariants([])
    tree = cache.tree
    for node in tree.nodes():
        if node.mamba_slot is not None:
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            held = (
                stamps.read(node.mamba_slot)
                if ckpt_pool is None
                else stamps.read_checkpoint(ckpt_pool, node.mamba_slot)
            )
            assert held == (fingerprint(tokens), node.depth)
    cache.evict(num_tokens=10**6, num_states=10**6)
    assert cache.tree.num_nodes == 1
    assert cache.token_to_kv_pool_allocator.used == 0
    assert cache.mamba_pool.used == 0
    assert ckpt_pool is None or ckpt_pool.used == 0
    assert budget is None or budget.used_bytes() == 0
    assert cache.req_to_token_pool.used == 0
    assert cache.reserved_kv_tokens == 0


def count_calls(name: str, fmt: str) -> int:
    cache, faults = build(name, fmt)
    workload(cache)
    check_whole(cache)
    return faults.calls


@contextmanager
def failing(name: str, setup: Callable[[Faults], None]) -> Iterator[MambaRadixCache]:
    cache, faults = build(name)
    setup(faults)
    yield cache


# every configuration with "model" and with one quantized format, the two alternating over the
# configurations (each format's hand-over is the same code; a run per pair would double the time)
CASES = [(name, fmt) for i, name in enumerate(CONFIGS) for fmt in ("model", FORMATS[1 + i % 2])]
# and unified memory (model format, page size 1: the simulator's byte budget moves single KV tokens)
CASES += [("no_buffer", "unified"), ("extra_buffer", "unified")]


@pytest.mark.parametrize(("name", "fmt"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_every_allocation_point_failed_once_and_for_good(name: str, fmt: str) -> None:
    total = count_calls(name, fmt)
    assert total >= 8  # rows, slots, KV per chunk and per decode step, hand-over slots
    for k in range(1, total + 1):
        for mode in ("once", "from"):
            cache, faults = build(name, fmt)
            if mode == "once":
                faults.fail_once = k
            else:
                faults.fail_from = k
            workload(cache)
            check_whole(cache)
