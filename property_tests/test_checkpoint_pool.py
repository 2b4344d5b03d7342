"""Quantized checkpoints inside the cache (issue 26): the checkpoint pool, the config fields, and the cache
with ``checkpoint_format`` int8 / fp8_e4m3 for every buffer strategy.

- :class:`~mamba_radix.pools.checkpoint_pool.CheckpointPool` on its own: store / load round trips equal the
  reference ``dequantize(quantize(state))`` bit for bit; every refusal (double free, out of range, slot 0,
  unallocated source or destination, a state pool of another layout, format ``model`` or unknown) raises a
  typed error and changes nothing (free list, counters and stored bytes compared before and after).
- The cache's own hit path: a request that hits a checkpoint starts from exactly
  ``dequantize(quantize(state handed over))`` in its live slot, for each strategy and format.
- A Hypothesis state machine over the cache's lifecycle (admit with copy-on-write, prefill chunks, decode,
  finish or abort, eviction) with tiny state and checkpoint pools, so that checkpoint-pool pressure evicts:
  after every step the cache's invariants with every running request (each checkpoint slot owned by exactly
  one node, each state slot by one request, no leak, the pools' own audits), and at every admission the live
  slot holds the round trip of the model's state at the hit. Every model state is a deterministic function
  of the token prefix (seeded by its fingerprint), so the expected value of any checkpoint is known.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from mamba_radix_kernels import quant_naive

from mamba_radix import MambaRadixCache, Req
from mamba_radix.checkpoint_format import bytes_per_slot
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, InvalidArgument, InvalidIndex, OutOfSlots
from mamba_radix.pools import CheckpointPool, MambaPool
from mamba_radix.state_stamp import fingerprint

FORMATS = ("int8", "fp8_e4m3")
STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
QDTYPE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
NUM_LAYERS = 2
CONV_SHAPES = ((4, 8),)
TEMPORAL_SHAPE = (2, 4, 16)


# ------------------------------------------------------------------------------------------ the model
def model_state(tokens: list[int] | tuple[int, ...], pool: MambaPool) -> list[torch.Tensor]:
    """The model's state after ``tokens``: one tensor per pool tensor, ``[L, *inner]`` in its dtype, a
    deterministic function of the prefix (rows of different magnitudes, so per-row scales matter)."""
    g = torch.Generator().manual_seed(fingerprint(list(tokens)) % (2**31 - 1))
    out = []
    for t in pool.tensors:
        shape = (t.shape[0], *t.shape[2:])
        mags = torch.exp2(torch.randint(-6, 6, shape[:-1], generator=g).float()).unsqueeze(-1)
        out.append((torch.randn(shape, generator=g) * mags).to(t.dtype))
    return out


def write_state(pool: MambaPool, slot: int, values: list[torch.Tensor]) -> None:
    for t, v in zip(pool.tensors, values, strict=True):
        t[:, slot] = v


def read_state(pool: MambaPool, slot: int) -> list[torch.Tensor]:
    return [t[:, slot].clone() for t in pool.tensors]


def round_trip(values: list[torch.Tensor], fmt: str) -> list[torch.Tensor]:
    """``dequantize(quantize(values))`` by the reference row arithmetic (:mod:`quant_naive`)."""
    out = []
    for x in values:
        row = quant_naive.row_len_for(tuple(x.shape[1:]))
        rows = x.reshape(x.shape[0], -1, row)
        q, scale = quant_naive.quantize_rows_ref(rows, QDTYPE[fmt])
        out.append(quant_naive.dequantize_rows_ref(q, scale, x.dtype).reshape(x.shape))
    return out


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(
        x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for x, y in zip(a, b, strict=True)
    )


def small_pool(size: int = 6) -> MambaPool:
    return MambaPool(size, NUM_LAYERS, list(CONV_SHAPES), TEMPORAL_SHAPE)


# -------------------------------------------------------------------------------------- the pool alone
def _pool_state(ckpt: CheckpointPool) -> tuple:
    return (
        ckpt.available_size(),
        tuple(ckpt.allocated_slots().tolist()),
        ckpt.stores,
        ckpt.loads,
        tuple(t.clone() for t in (*ckpt.storage.qs, *ckpt.storage.scales)),
    )


def _same_pool_state(a: tuple, b: tuple) -> bool:
    return a[:4] == b[:4] and all(torch.equal(x, y) for x, y in zip(a[4], b[4], strict=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_and_load_round_trip_bit_exactly(fmt: str) -> None:
    pool = small_pool()
    ckpt = CheckpointPool(pool, fmt, 4)
    src, dst = pool.alloc(2, as_list=True)
    state = model_state([1, 2, 3], pool)
    write_state(pool, src, state)
    slot = ckpt.store_from(pool, src)
    assert slot is not None and ckpt.used == 1 and ckpt.stores == 1
    assert same_bits(ckpt.read(slot, pool.tensors), round_trip(state, fmt))
    ckpt.load_into(pool, [slot], [dst])
    assert same_bits(read_state(pool, dst), round_trip(state, fmt))
    assert same_bits(read_state(pool, src), state)  # the source is read, not changed
    assert ckpt.loads == 1
    ckpt.audit()


@pytest.mark.parametrize("fmt", FORMATS)
def test_sizes_and_exhaustion(fmt: str) -> None:
    pool = small_pool()
    ckpt = CheckpointPool(pool, fmt, 3)
    shapes = [(tuple(t.shape[2:]), t.dtype) for t in pool.tensors]
    assert ckpt.bytes_per_slot == bytes_per_slot(fmt, NUM_LAYERS, shapes)
    assert ckpt.total_bytes == 4 * ckpt.bytes_per_slot  # 3 slots and the reserved slot 0
    assert ckpt.bytes_per_slot < pool.bytes_per_slot
    (src,) = pool.alloc(1, as_list=True)
    got = [ckpt.store_from(pool, src) for _ in range(3)]
    assert sorted(got) == [1, 2, 3]  # type: ignore[type-var]
    before = _pool_state(ckpt)
    assert ckpt.store_from(pool, src) is None  # full: nothing taken, nothing written
    assert ckpt.alloc(1) is None
    assert _same_pool_state(before, _pool_state(ckpt))
    ckpt.free(got)
    assert ckpt.available_size() == 3
    ckpt.audit()


@pytest.mark.parametrize("fmt", FORMATS)
def test_refusals_change_nothing(fmt: str) -> None:
    pool = small_pool()
    other = MambaPool(6, NUM_LAYERS, [(4, 4)], TEMPORAL_SHAPE)
    ckpt = CheckpointPool(pool, fmt, 4)
    src, free_src = pool.alloc(2, as_list=True)
    pool.free([free_src])
    write_state(pool, src, model_state([7], pool))
    slot = ckpt.store_from(pool, src)
    assert slot is not None
    spare = ckpt.alloc(1, as_list=True)
    assert spare is not None
    ckpt.free(spare)
    before = _pool_state(ckpt)
    calls = [
        (InvalidIndex, lambda: ckpt.free(spare)),  # double free
        (InvalidIndex, lambda: ckpt.free([slot, slot])),  # repeated
        (InvalidIndex, lambda: ckpt.free([0])),  # the reserved slot
        (InvalidIndex, lambda: ckpt.free([5])),  # out of range
        (InvalidIndex, lambda: ckpt.store_from(pool, free_src)),  # an unallocated state slot
        (InvalidIndex, lambda: ckpt.store(pool, [src], spare)),  # an unallocated checkpoint slot
        (InvalidIndex, lambda: ckpt.load_into(pool, spare, [src])),  # restore from a free checkpoint
        (InvalidIndex, lambda: ckpt.load_into(pool, [slot], [free_src])),  # into a free state slot
        (InvalidArgument, lambda: ckpt.store_from(other, src)),  # another layout
        (InvalidArgument, lambda: ckpt.store(pool, [src, src], [slot])),  # lengths differ
        (InvalidIndex, lambda: ckpt.read(spare[0], pool.tensors)),
    ]
    for error, call in calls:
        with pytest.raises(error):
            call()
        assert _same_pool_state(before, _pool_state(ckpt))
    ckpt.audit()
    with pytest.raises(InvalidArgument):
        CheckpointPool(pool, "model", 4)
    with pytest.raises(InvalidArgument):
        CheckpointPool(pool, "int4", 4)
    with pytest.raises(InvalidArgument):
        CheckpointPool(pool, fmt, 0)
    with pytest.raises(InvalidArgument):  # the kernels read float32 / bfloat16 states only
        CheckpointPool(MambaPool(2, 1, [(4, 4)], (2, 4, 4), conv_dtypes=torch.float16), fmt, 2)


def test_config_fields() -> None:
    assert CacheConfig().checkpoint_format == "model" and CacheConfig().checkpoint_slots is None
    assert CacheConfig(checkpoint_format="fp8_e4m3", checkpoint_slots=7).checkpoint_slots == 7
    for bad in (
        {"checkpoint_format": "int4"},
        {"checkpoint_format": "int8", "checkpoint_slots": 0},
        {"checkpoint_format": "int8", "checkpoint_slots": True},
        {"checkpoint_slots": 4},  # no quantized pool to size
        {"checkpoint_format": "int8", "enable_unified_memory": True},
    ):
        with pytest.raises(ConfigError) as err:
            CacheConfig(**bad)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------- inside the cache
def build_cache(
    fmt: str,
    strategy: str,
    *,
    num_slots: int = 12,
    checkpoint_slots: int | None = None,
    num_tokens: int = 512,
    rows: int = 6,
) -> MambaRadixCache:
    config = CacheConfig(
        mamba_radix_cache_strategy=strategy,  # type: ignore[arg-type]
        mamba_cache_chunk_size=4,
        mamba_track_interval=4,
        chunked_prefill_size=8,
        checkpoint_format=fmt,  # type: ignore[arg-type]
        checkpoint_slots=checkpoint_slots,
    )
    return MambaRadixCache.build(
        config,
        num_tokens=num_tokens,
        num_slots=num_slots,
        max_running_requests=rows,
        num_layers=NUM_LAYERS,
        conv_shapes=CONV_SHAPES,
        temporal_shape=TEMPORAL_SHAPE,
    )


class Engine:
    """Plays the model over a cache: every state it writes is :func:`model_state` of the prefix."""

    def __init__(self, cache: MambaRadixCache) -> None:
        self.cache = cache
        self.pool = cache.mamba_pool
        self.fmt = cache.config.checkpoint_format
        self.running: dict[int, Req] = {}

    def expected_restore(self, tokens: list[int]) -> list[torch.Tensor]:
        state = model_state(tokens, self.pool)
        return state if self.fmt == "model" else round_trip(state, self.fmt)

    def admit(self, req: Req) -> bool:
        if not self.cache.admit(req, max_new_tokens=4):
            return False
        hit = req.cache_protected_len
        assert req.mamba_pool_idx is not None
        got = read_state(self.pool, req.mamba_pool_idx)
        if hit:
            want = self.expected_restore(list(req.origin_input_ids[:hit]))
            assert same_bits(got, want), f"request {req.rid}: the hit at {hit} restored another state"
        else:
            assert all(not x.any() for x in got), "a request without a hit starts from a zeroed state"
        self.running[req.rid] = req
        return True

    def forward(self, req: Req, num_tokens: int, *, finished: bool = False) -> bool:
        plan = self.cache.extend(req, num_tokens)
        if plan is None:
            return False
        tokens = req.token_ids(plan.end)
        write_state(self.pool, plan.live_slot, model_state(tokens, self.pool))
        if plan.track_slot is not None:
            assert plan.track_len is not None
            write_state(self.pool, plan.track_slot, model_state(tokens[: plan.track_len], self.pool))
        self.cache.commit(plan, finished=finished)
        if req.kv_len >= len(req.origin_input_ids):
            req.output_ids.append(1000 + len(req.output_ids))
        return True

    def step(self, req: Req, budget: int, *, finished: bool = False) -> bool:
        """The next prefill chunk (at most ``budget`` tokens) or decode token; ``finished``: the last
        forward before :meth:`finish` (nothing handed over at its commit, the finish inserts)."""
        if req.kv_len < len(req.origin_input_ids):
            n = self.cache.prefill_chunk_len(req, budget)
            return n > 0 and self.forward(req, n, finished=finished)
        return self.forward(req, 1, finished=finished)

    def finish(self, req: Req, insert: bool = True) -> None:
        self.cache.finish(req, insert)
        del self.running[req.rid]

    def check(self) -> None:
        self.cache.check_invariants(list(self.running.values()))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_hit_restores_the_round_trip_through_the_cache(fmt: str, strategy: str) -> None:
    cache = build_cache(fmt, strategy)
    engine = Engine(cache)
    pool = cache.checkpoint_pool
    assert pool is not None and pool.size == 2 * cache.mamba_pool.size  # SGLang's default size
    prompt = list(range(1, 19))
    first = Req(rid=0, origin_input_ids=prompt)
    assert engine.admit(first)
    while first.kv_len < len(prompt):
        assert engine.step(first, 8)
    engine.finish(first)
    engine.check()
    assert cache.mamba_pool.used == 0  # every checkpoint is in the checkpoint pool
    assert pool.used == len(cache.tree.slot_owner) > 0
    second = Req(rid=1, origin_input_ids=[*prompt, 99, 98])
    assert engine.admit(second)  # asserts the restored state
    assert second.cache_protected_len > 0
    assert pool.loads == 1
    engine.check()
    engine.finish(second, insert=False)
    engine.check()


@pytest.mark.parametrize("at_finish", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_state_the_tree_has_frees_the_fresh_checkpoint(strategy: str, at_finish: bool) -> None:
    """The same prompt served three times: a later request quantizes a state the tree holds already
    (``mamba_exists``; under extra_buffer the second one checkpoints the branch point first), at a prefill
    hand-over or (``at_finish``) at finish; its fresh checkpoint slot must go back (else the invariants
    find a leak)."""
    cache = build_cache("int8", strategy)
    engine = Engine(cache)
    prompt = list(range(1, 17))  # on the checkpoint grid: every strategy checkpoints its end
    for rid in (0, 1, 2):
        req = Req(rid=rid, origin_input_ids=prompt)
        assert engine.admit(req)
        while req.kv_len < len(prompt):
            last = len(prompt) - req.kv_len <= 8
            assert engine.step(req, 8, finished=at_finish and last)
        engine.finish(req)
        engine.check()
    assert cache.stats.checkpoints_existing >= 1
    assert cache.checkpoint_pool is not None
    assert cache.checkpoint_pool.used == len(cache.tree.slot_owner)
    assert cache.mamba_pool.used == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_state_shortfall_evicts_no_checkpoint(fmt: str) -> None:
    """Under a quantized format no checkpoint holds a state slot: admission counts free state slots only
    and refuses (``state_slots``) without evicting, and ``make_room`` / ``alloc_state_slot`` evict
    nothing for states."""
    cache = build_cache(fmt, "no_buffer", num_slots=4)
    engine = Engine(cache)
    prompt = list(range(1, 17))
    req = Req(rid=0, origin_input_ids=prompt)
    assert engine.admit(req)
    while req.kv_len < len(prompt):
        assert engine.step(req, 8)
    engine.finish(req)
    held = cache.mamba_pool.alloc(cache.mamba_pool.available_size())  # the state pool is full
    assert held is not None and cache.mamba_evictable_size() > 0
    tree = cache.pretty_print()
    check = cache.can_admit(Req(rid=1, origin_input_ids=[*prompt, 5]))
    assert not check.ok and check.reason == "state_slots"
    assert not cache.make_room(0, 1)
    assert cache.alloc_state_slot() is None
    assert cache.stats.states_evicted == 0 and cache.pretty_print() == tree
    cache.mamba_pool.free(held)
    engine.check()


def test_model_format_builds_no_checkpoint_pool() -> None:
    cache = build_cache("model", "extra_buffer")
    assert cache.checkpoint_pool is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_public_insert_keeps_the_model_contract(fmt: str) -> None:
    cache = build_cache(fmt, "no_buffer", checkpoint_slots=1)
    pool = cache.mamba_pool
    kv = cache.token_to_kv_pool_allocator.alloc(4)
    (slot,) = pool.alloc(1, as_list=True)
    write_state(pool, slot, model_state([5, 6, 7, 8], pool))
    result = cache.insert([5, 6, 7, 8], kv, slot)
    assert not result.mamba_exists and not pool.is_slot_allocated(slot)  # consumed, as under "model"
    cache.check_invariants([])
    kv2 = cache.token_to_kv_pool_allocator.alloc(4)
    (slot2,) = pool.alloc(1, as_list=True)
    before = (cache.pretty_print(), pool.available_size(), cache.checkpoint_pool.available_size())  # type: ignore[union-attr]
    with pytest.raises(OutOfSlots):  # the one checkpoint slot is taken; the insert evicts nothing
        cache.insert([9, 9, 9, 9], kv2, slot2)
    assert before == (cache.pretty_print(), pool.available_size(), cache.checkpoint_pool.available_size())  # type: ignore[union-attr]
    with pytest.raises(InvalidIndex):
        cache.insert([9, 9, 9, 9], kv2, -1)


# ----------------------------------------------------------------------------------- the state machine
class QuantizedCacheMachine(RuleBasedStateMachine):
    """The cache's lifecycle under a quantized format with tiny pools (set by :func:`machine_for`)."""

    fmt = "int8"
    strategy = "no_buffer"

    def __init__(self) -> None:
        super().__init__()
        # 7 state slots: two requests of the eager strategy fit; 3 checkpoint slots: hand-overs evict
        self.cache = build_cache(self.fmt, self.strategy, num_slots=7, checkpoint_slots=3, num_tokens=160)
        self.engine = Engine(self.cache)
        self.next_rid = 0
        self.seen: list[list[int]] = []
        self.bases = ([3, 1, 4, 1, 5, 9, 2, 6], [3, 1, 4, 1, 7, 7], [8, 8])

    @rule(
        base=st.integers(0, 2),
        cut=st.integers(0, 8),
        tail=st.lists(st.integers(0, 2), min_size=1, max_size=6),
    )
    def admit(self, base: int, cut: int, tail: list[int]) -> None:
        self._admit(self.bases[base][:cut] + tail)

    @precondition(lambda self: self.seen)
    @rule(pick=st.integers(0, 15), tail=st.lists(st.integers(0, 2), max_size=2))
    def admit_again(self, pick: int, tail: list[int]) -> None:
        """A prompt seen before, maybe longer: hits (a restore) and hand-overs the tree has already."""
        self._admit(self.seen[pick % len(self.seen)] + tail)

    def _admit(self, prompt: list[int]) -> None:
        req = Req(rid=self.next_rid, origin_input_ids=prompt)
        self.next_rid += 1
        if self.engine.admit(req):
            self.seen.append(list(prompt))

    @precondition(lambda self: self.engine.running)
    @rule(pick=st.integers(0, 7), budget=st.integers(1, 16))
    def forward(self, pick: int, budget: int) -> None:
        reqs = list(self.engine.running.values())
        req = reqs[pick % len(reqs)]
        if len(req.output_ids) < 3:
            self.engine.step(req, budget)

    @precondition(lambda self: self.engine.running)
    @rule(pick=st.integers(0, 7), insert=st.booleans())
    def finish(self, pick: int, insert: bool) -> None:
        reqs = list(self.engine.running.values())
        self.engine.finish(reqs[pick % len(reqs)], insert)

    @rule(tokens=st.integers(0, 12), states=st.integers(0, 2))
    def evict(self, tokens: int, states: int) -> None:
        self.cache.evict(tokens, states)

    @invariant()
    def consistent(self) -> None:
        self.engine.check()
        ckpt = self.cache.checkpoint_pool
        assert ckpt is not None and ckpt.used == len(self.cache.tree.slot_owner)

    def teardown(self) -> None:
        for req in list(self.engine.running.values()):
            self.engine.finish(req)
        self.engine.check()
        assert self.cache.mamba_pool.used == 0  # no state slot leaks once every request is done


def machine_for(fmt: str, strategy: str) -> type[QuantizedCacheMachine]:
    return type(f"Quantized_{fmt}_{strategy}", (QuantizedCacheMachine,), {"fmt": fmt, "strategy": strategy})


MACHINE_BUDGET = settings(
    max_examples=20,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_cache_state_machine(fmt: str, strategy: str) -> None:
    run_state_machine_as_test(machine_for(fmt, strategy), settings=MACHINE_BUDGET)
