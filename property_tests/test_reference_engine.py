"""Cached generation equals uncached generation on real transformers hybrid model code (issue 14).

Tiny random-weight Kimi Linear (KDA + MLA) and Qwen3-Next (Gated DeltaNet + GQA) models, fp32 on the CPU,
served by :class:`~mamba_radix.reference_engine.ReferenceEngine` through our pools and the cache's
lifecycle API, for every buffer strategy, on a multi-turn and a branching prompt set (several requests in
flight, chunked prefill of 16 tokens, checkpoint grid 8, decode interval 8). Three checks:

1. greedy tokens with the cache equal the tokens of plain transformers forwards of the whole sequence
   (no cache of any kind) and of the same engine with the radix cache disabled;
2. the logits of the first forward after every restored checkpoint equal a from-scratch forward within
   :data:`~mamba_radix.reference_engine.LOGIT_ATOL` (derivation at its definition), and every checkpoint
   left in the tree, probed with one token, does too;
3. planted bugs make at least one of those checks fail: a tracked state written one token or one grid
   step off, a track write skipped, a copy-on-write or donation copy that writes nothing, the live state
   written one token off, and (cache side) a right state attached to the tree one token or one grid
   step off.

The same checks also run under eviction pressure (KV and checkpoints evicted while requests are in
flight) and with paged KV (page size 4).

The model side is checked on its own first: a span run in one piece is bit-exact with a plain forward of
the whole sequence, token-by-token runs are bit-exact with transformers' own cache, and any split of the
work stays within the tolerance while a state one token off moves the logits 100x further.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

transformers = pytest.importorskip(
    "transformers",
    minversion="5.23",
    reason="the reference engine needs transformers>=5.23 (pip install 'mamba-radix[engine]')",
)

from mamba_radix import CacheConfig, buffers, state_ops  # noqa: E402
from mamba_radix.pools import TokenToKVPoolAllocator  # noqa: E402
from mamba_radix.pools import mamba_pool as mamba_pool_mod  # noqa: E402
from mamba_radix.reference_engine import LOGIT_ATOL, tiny_model  # noqa: E402
from mamba_radix.reference_engine.engine import (  # noqa: E402
    ReferenceEngine,
    audit_checkpoints,
    greedy_reference,
)

FAMILIES = ("kimi_linear", "qwen3_next")
STRATEGIES = ("no_buffer", "extra_buffer", "extra_buffer_lazy")
CHUNK = 16  # chunked_prefill_size
GRID = 8  # mamba_cache_chunk_size
INTERVAL = 8  # mamba_track_interval
VOCAB = 128


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These models are tiny: thread pools only add synchronisation (100x slower on a shared 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def model(family: str):
    return tiny_model(family, seed=0)


@functools.cache
def oracle(family: str, prompt: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    return tuple(greedy_reference(model(family), prompt, max_new))


def config(strategy: str, **overrides) -> CacheConfig:
    return CacheConfig(
        mamba_radix_cache_strategy=strategy,
        chunked_prefill_size=CHUNK,
        mamba_cache_chunk_size=GRID,
        mamba_track_interval=INTERVAL,
        **overrides,
    )


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# --------------------------------------------------------------------------------------- scenarios
def run_multi_turn(engine: ReferenceEngine, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    """Two conversations sharing a system prompt, three turns each, both in flight every round: turn k's
    prompt is turn k-1's prompt + its answer + a new user message. Prompts stay <= 64 tokens."""
    rng = random.Random(seed)
    system = tokens(rng, 10)
    convs = [list(system), list(system)]
    served = []
    for _turn in range(3):
        rids = []
        for c in convs:
            c += tokens(rng, 7)
            rids.append(engine.submit(list(c), 5))
        engine.run()
        for c, rid in zip(convs, rids, strict=True):
            served.append((list(c), engine.finished[rid]))
            c += engine.finished[rid]
    return served


def run_branching(engine: ReferenceEngine, seed: int = 2) -> list[tuple[list[int], list[int]]]:
    """A 20-token stem with three branches, two of which fork again, all submitted at once (requests
    admitted while others still prefill), then every prompt once more (full restores)."""
    rng = random.Random(seed)
    stem = tokens(rng, 20)
    branches = [stem + tokens(rng, 9 + 3 * i) for i in range(3)]
    forks = [branches[0][:25] + tokens(rng, 6), branches[1][:31] + tokens(rng, 10)]
    prompts = branches + forks
    served = []
    for _wave in range(2):
        rids = [engine.submit(p, 4) for p in prompts]
        engine.run()
        served += [(p, engine.finished[r]) for p, r in zip(prompts, rids, strict=True)]
    return served


SCENARIOS = {"multi_turn": run_multi_turn, "branching": run_branching}


def serve(family: str, strategy: str, scenario: str, **config_overrides):
    engine = ReferenceEngine.build(
        model(family), config(strategy, **config_overrides), max_running_requests=3, record=True
    )
    served = SCENARIOS[scenario](engine)
    return engine, served


# ------------------------------------------------------------------------------------------ checks
def token_mismatches(family: str, served) -> list[str]:
    """Requests whose greedy tokens differ from plain transformers forwards of the whole sequence."""
    bad = []
    for prompt, out in served:
        want = oracle(family, tuple(prompt), len(out))
        if tuple(out) != want:
            bad.append(f"prompt of {len(prompt)} tokens: got {out}, want {list(want)}")
    return bad


def restored_logit_errors(engine: ReferenceEngine) -> list[float]:
    """Max |logit diff| vs a from-scratch forward, for the first forward after every restored checkpoint
    (the request's first forward when admission found a hit)."""
    errors = []
    firsts = {}
    for rec in engine.records:
        firsts.setdefault(rec.rid, rec)
    for rid, first in firsts.items():
        if first.hit_len == 0:
            continue
        assert first.start == first.hit_len
        seq = engine.requests[rid].all_token_ids
        want = engine.model.reference_logits(seq[: first.end])[first.start :]
        errors.append(float((first.logits - want).abs().max()))
    return errors


def every_forward_error(engine: ReferenceEngine) -> float:
    """Max |logit diff| over every forward the engine ran (prefill chunks, track splits, decode steps)
    against a from-scratch forward of the request's tokens up to the forward's end."""
    worst = 0.0
    for rec in engine.records:
        seq = engine.requests[rec.rid].all_token_ids
        want = engine.model.reference_logits(seq[: rec.end])[rec.start :]
        worst = max(worst, float((rec.logits - want).abs().max()))
    return worst


def failures(family: str, engine: ReferenceEngine, served, check_tokens: bool = True) -> dict[str, object]:
    """Every check's failures (empty lists when all hold) and the largest differences seen.
    ``check_tokens=False`` skips the greedy oracle (the planted-bug tests need only the checkpoint checks)."""
    restored = restored_logit_errors(engine)
    audits = audit_checkpoints(engine)
    return {
        "tokens": token_mismatches(family, served) if check_tokens else [],
        "restored": [e for e in restored if e > LOGIT_ATOL],
        "audit": [(a.depth, a.max_abs_diff) for a in audits if a.max_abs_diff > LOGIT_ATOL],
        "max_restored": max(restored, default=0.0),
        "max_audit": max((a.max_abs_diff for a in audits), default=0.0),
        "num_restored": len(restored),
        "num_checkpoints": len(audits),
    }


# ------------------------------------------------------------------------------------ model side
@pytest.mark.parametrize("family", FAMILIES)
def test_forward_span_matches_plain_forward(family):
    """One piece is bit-exact with a plain forward; any split stays within LOGIT_ATOL, at KV indices
    scattered over the storage; token-by-token is bit-exact with transformers' own cache."""
    m = model(family)
    rng = random.Random(5)
    seq = tokens(rng, 48)
    ref = m.reference_logits(seq)
    gen = torch.Generator().manual_seed(5)
    for split in ([48], [16, 16, 16], [8] * 6, [5, 27, 1, 1, 14], [1] * 12 + [36]):
        kv_pool, mamba = m.new_kv_pool(128), m.new_mamba_pool(2)
        pools = m.pools_view(kv_pool, mamba)
        idx = TokenToKVPoolAllocator(128).alloc(48)[torch.randperm(48, generator=gen)]
        slot = int(mamba.alloc(1)[0])
        mamba.clear(slot)
        out, start = [], 0
        for n in split:
            out.append(
                m.forward_span(
                    pools, seq[start : start + n], start, idx[:start], idx[start : start + n], slot, slot
                )
            )
            start += n
        got = torch.cat(out)
        if len(split) == 1:
            assert torch.equal(got, ref), "one piece must be bit-exact with the plain forward"
        assert float((got - ref).abs().max()) <= LOGIT_ATOL, split

    # token by token against transformers' DynamicCache: the same computation order, bit for bit
    p = 20
    with torch.no_grad():
        first = m.model(input_ids=torch.tensor([seq[:p]]), use_cache=True)
        hf_cache, hf = first.cache, [first.logits[0]]
        for t in range(p, 32):
            step = m.model(input_ids=torch.tensor([[seq[t]]]), cache=hf_cache, use_cache=True)
            hf_cache = step.cache
            hf.append(step.logits[0])
    kv_pool, mamba = m.new_kv_pool(64), m.new_mamba_pool(1)
    pools = m.pools_view(kv_pool, mamba)
    idx = torch.arange(1, 33)
    slot = int(mamba.alloc(1)[0])
    mamba.clear(slot)
    ours = [m.forward_span(pools, seq[:p], 0, idx[:0], idx[:p], slot, slot)]
    for t in range(p, 32):
        ours.append(m.forward_span(pools, seq[t : t + 1], t, idx[:t], idx[t : t + 1], slot, slot))
    assert torch.equal(torch.cat(ours), torch.cat(hf))


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_bit_exact_with_transformers_cache(family):
    """Served through the engine (KV at the allocator's indices, states in pool slots, several requests
    in flight) with the same computation order as transformers' own generate loop (whole prompt in one
    forward, then one token at a time), every logit is bit-exact."""
    m = model(family)
    rng = random.Random(7)
    prompts = [tokens(rng, 23), tokens(rng, 30)]
    engine = ReferenceEngine.build(
        m, config("no_buffer", disable_radix_cache=True), chunked_prefill_size=-1, record=True
    )
    rids = [engine.submit(p, 6) for p in prompts]
    engine.run()
    for rid, prompt in zip(rids, prompts, strict=True):
        ours = torch.cat([r.logits for r in engine.records if r.rid == rid])
        out = engine.finished[rid]
        with torch.no_grad():
            step = m.model(input_ids=torch.tensor([prompt]), use_cache=True)
            hf_cache, hf = step.cache, [step.logits[0]]
            for t in out[:-1]:
                step = m.model(input_ids=torch.tensor([[t]]), cache=hf_cache, use_cache=True)
                hf_cache = step.cache
                hf.append(step.logits[0])
        assert torch.equal(ours, torch.cat(hf))


@pytest.mark.parametrize("family", FAMILIES)
def test_track_split_and_off_by_one_sensitivity(family):
    """A track point inside a span (two pieces) writes the state the model has there; a state one
    token or one grid step off moves the next logits by >= 100 x LOGIT_ATOL (so the engine checks can
    tell), while the right one stays within it."""
    m = model(family)
    seq = tokens(random.Random(6), 40)
    ref = m.reference_logits(seq)
    kv_pool, mamba = m.new_kv_pool(128), m.new_mamba_pool(8)
    pools = m.pools_view(kv_pool, mamba)
    idx = torch.arange(1, 41)
    live, track = (int(s) for s in mamba.alloc(2))
    mamba.clear([live, track])
    logits = m.forward_span(pools, seq[:32], 0, idx[:0], idx[:32], live, live, track_len=24, track_slot=track)
    assert float((logits - ref[:32]).abs().max()) <= LOGIT_ATOL
    for pos, slot in ((24, track), (32, live)):
        probe = int(mamba.alloc(1)[0])
        mamba.copy_from([slot], [probe])
        got = m.forward_span(pools, seq[pos:40], pos, idx[:pos], idx[pos:40], probe, probe)
        assert float((got - ref[pos:40]).abs().max()) <= LOGIT_ATOL
        mamba.free([probe])
    for wrong in (23, 25, 24 - GRID):
        scratch = int(mamba.alloc(1)[0])
        mamba.clear(scratch)
        m.forward_span(pools, seq[:wrong], 0, idx[:0], torch.arange(41, 41 + wrong), scratch, scratch)
        got = m.forward_span(pools, seq[24:40], 24, idx[:24], idx[24:40], scratch, scratch)
        assert float((got[0] - ref[24]).abs().max()) >= 100 * LOGIT_ATOL, wrong
        mamba.free([scratch])


# ----------------------------------------------------------------------------------- engine: honest
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_generation_equals_uncached(family, strategy, scenario):
    engine, served = serve(family, strategy, scenario)
    found = failures(family, engine, served)
    assert found["tokens"] == [], found
    assert found["restored"] == [] and found["audit"] == [], found
    assert every_forward_error(engine) <= LOGIT_ATOL
    # Token equality is then a theorem, not luck: no sampled position is a near tie (top-2 gap above
    # 2 x LOGIT_ATOL, so logits within the tolerance pick the same argmax on any CPU). Measured >= 1.4e-3.
    gaps = [float(g[0] - g[1]) for g in (r.logits[-1].topk(2).values for r in engine.records)]
    assert min(gaps) > 2 * LOGIT_ATOL, "a near tie in the prompt set: pick other tokens"
    # the checks must have had something to check
    assert engine.stats.hit_tokens > 0 and found["num_restored"] > 0 and found["num_checkpoints"] > 0, found
    engine.cache.check_invariants([])
    # the same engine with the radix cache disabled gives the same tokens, computing every prompt token
    plain = ReferenceEngine.build(
        model(family), config("no_buffer", disable_radix_cache=True), max_running_requests=3
    )
    for prompt, out in served:
        assert plain.generate(prompt, len(out)) == out
    assert plain.stats.hit_tokens == 0
    assert engine.stats.prefill_tokens + engine.stats.hit_tokens == engine.stats.prompt_tokens


# ------------------------------------------------------------------------------ engine: planted bugs
def _plant(monkeypatch, family: str, strategy: str, bug: str) -> dict[str, int]:
    """Plant a state bug of the kinds real engines have shipped (SGLang #39342, #34780, LMCache #2863,
    vLLM #57128): the model side writes a state at the wrong position or not at all, a copy writes
    nothing, or (``attach_*``, the cache side) a right state is attached to the tree one token or one
    grid step off. Returns a counter of the calls the bug actually changed."""
    m = model(family)
    original = m.forward_span
    planted = {"changes": 0}

    def buggy(
        pools, token_ids, start, prefix_kv, new_kv, read_slot, write_slot, track_len=None, track_slot=None
    ):
        end = start + len(token_ids)
        if track_len is not None and bug in ("track_minus_1", "track_plus_1", "track_minus_grid"):
            shifted = track_len + {"track_minus_1": -1, "track_plus_1": 1, "track_minus_grid": -GRID}[bug]
            if start < shifted <= end:  # the checkpoint's state is written at the wrong position
                track_len = shifted
                planted["changes"] += 1
        elif track_len is not None and bug == "skip_track_write":  # the track slot keeps stale contents
            track_len = track_slot = None
            planted["changes"] += 1
        elif track_len is None and bug == "live_minus_1" and len(token_ids) > 1:
            # prefill chunk: the live slot gets the state one token before the chunk end
            planted["changes"] += 1
            return original(pools, token_ids, start, prefix_kv, new_kv, read_slot, 0, end - 1, write_slot)
        return original(
            pools, token_ids, start, prefix_kv, new_kv, read_slot, write_slot, track_len, track_slot
        )

    monkeypatch.setattr(m, "forward_span", buggy)
    if bug.startswith("attach_"):  # the cache side: the state is right, its tree node one token/step off
        shift = {"attach_plus_1": 1, "attach_minus_1": -1, "attach_plus_grid": GRID}[bug]
        strategy_cls = buffers.BUFFER_STRATEGIES[strategy]
        true_len = strategy_cls.checkpoint_len

        def attach_off(self, req, pending=None):
            length = true_len(self, req, pending)
            kv_len = req.kv_len if pending is None else pending[0]  # pending: a commit's check before it runs
            if length is not None and req.cache_protected_len < length + shift <= kv_len:
                planted["changes"] += 1
                return length + shift
            return length

        monkeypatch.setattr(strategy_cls, "checkpoint_len", attach_off)
    if bug == "copy_writes_nothing":
        # copy-on-write and no_buffer's donation copies leave the target unwritten
        calls = planted

        def no_copy(tensors, src, dst, **kwargs):
            calls["changes"] += 1

        def no_copy_row(views, src, dst):  # the compiled one-slot copy on the CPU: "done", nothing written
            calls["changes"] += 1
            return True

        monkeypatch.setattr(state_ops, "copy_slots", no_copy)
        monkeypatch.setattr(mamba_pool_mod, "_c_copy_row", no_copy_row)
    return planted


PLANTED = (
    [
        (strategy, bug)
        for strategy in ("extra_buffer", "extra_buffer_lazy")
        for bug in ("track_minus_1", "track_plus_1", "track_minus_grid", "skip_track_write")
    ]
    + [(strategy, "copy_writes_nothing") for strategy in STRATEGIES]
    + [("no_buffer", "live_minus_1")]
    # the cache side: a right state attached to the tree one token or one grid step off
    + [("extra_buffer", bug) for bug in ("attach_plus_1", "attach_minus_1", "attach_plus_grid")]
    + [("no_buffer", "attach_minus_1")]
)


@pytest.mark.parametrize(("strategy", "bug"), PLANTED)
@pytest.mark.parametrize("family", FAMILIES)
def test_planted_bug_is_caught(monkeypatch, family, strategy, bug):
    """Each planted state bug is seen by the checkpoint checks (restored logits or the tree audit)."""
    planted = _plant(monkeypatch, family, strategy, bug)
    engine, served = serve(family, strategy, "branching")
    assert planted["changes"] > 0, f"{bug} was never exercised: the scenario does not test it"
    found = failures(family, engine, served, check_tokens=False)
    assert found["restored"] or found["audit"], found


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_under_eviction_pressure(family, strategy):
    """128 KV tokens and 12 state slots for both prompt sets on one engine: the cache evicts KV and
    checkpoints while requests are in flight, and every check still holds."""
    engine = ReferenceEngine.build(
        model(family), config(strategy), num_tokens=128, num_slots=12, max_running_requests=3, record=True
    )
    served = run_branching(engine) + run_multi_turn(engine)
    found = failures(family, engine, served)
    assert found["tokens"] == [] and found["restored"] == [] and found["audit"] == [], found
    stats = engine.cache.stats
    assert stats.tokens_evicted > 0 and stats.states_evicted > 0 and found["num_restored"] > 0, stats
    engine.cache.check_invariants([])


@pytest.mark.parametrize("family", FAMILIES)
def test_paged_kv(family):
    """Page size 4 (paged allocator, KV storage with a padding page): same checks, extra_buffer."""
    engine, served = serve(family, "extra_buffer", "branching", page_size=4)
    found = failures(family, engine, served)
    assert found["tokens"] == [] and found["restored"] == [] and found["audit"] == [], found
    assert engine.stats.hit_tokens > 0 and found["num_restored"] > 0


def test_misuse_raises_typed_errors():
    """Wrong pool shapes, bad spans and bad requests raise InvalidArgument and change nothing."""
    from mamba_radix import InvalidArgument, MambaRadixCache

    m = model("qwen3_next")
    cache = MambaRadixCache.build(config("no_buffer"), num_tokens=64, num_slots=8)  # default state shapes
    with pytest.raises(InvalidArgument, match="state shapes"):
        ReferenceEngine(m, cache, m.new_kv_pool(64))
    engine = ReferenceEngine.build(m, config("no_buffer"), num_tokens=64, num_slots=8, max_context_len=64)
    with pytest.raises(InvalidArgument, match="max_new_tokens"):
        engine.submit([5, 6], 0)
    with pytest.raises(InvalidArgument, match="empty"):
        engine.submit([], 3)
    engine.submit(list(range(3, 90)), 4)  # longer than max_context_len: can never be admitted
    with pytest.raises(InvalidArgument, match="cannot be admitted: it is longer"):
        engine.run()
    pools = m.pools_view(m.new_kv_pool(16), m.new_mamba_pool(1))
    idx = torch.arange(1, 5)
    with pytest.raises(InvalidArgument, match="prefix KV"):
        m.forward_span(pools, [5, 6], 1, idx[:0], idx[:2], 1, 1)
    with pytest.raises(InvalidArgument, match="track_len"):
        m.forward_span(pools, [5, 6], 0, idx[:0], idx[:2], 1, 1, track_len=3, track_slot=1)
    slot = int(pools.mamba_pool.alloc(1)[0])
    pools.mamba_pool.temporal[:, slot] = 1.0  # a slot nobody cleared
    with pytest.raises(InvalidArgument, match="non-zero state"):
        m.forward_span(pools, [5, 6], 0, idx[:0], idx[:2], slot, slot)
    with pytest.raises(InvalidArgument, match="kimi_linear and qwen3_next"):
        from mamba_radix.reference_engine import HybridModel

        HybridModel(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_edge_requests(strategy):
    """One generated token (finish right after prefill), a one-token prompt, the same prompt twice (hit
    on a request that ends at its prompt), and an EOS stop: tokens equal the oracle's."""
    m = model("kimi_linear")
    prompt = tokens(random.Random(9), 27)
    want = oracle("kimi_linear", tuple(prompt), 10)
    engine = ReferenceEngine.build(m, config(strategy))
    assert engine.generate(prompt, 1) == list(want[:1])
    assert engine.generate(prompt, 1) == list(want[:1])
    assert engine.generate(prompt[:1], 3) == list(oracle("kimi_linear", tuple(prompt[:1]), 3))
    assert engine.stats.hit_tokens > 0
    stop = want[3]
    first_stop = want.index(stop)
    eos_engine = ReferenceEngine.build(m, config(strategy), eos_token_id=stop)
    assert eos_engine.generate(prompt, 10) == list(want[: first_stop + 1])
    engine.cache.check_invariants([])
    eos_engine.cache.check_invariants([])


# ------------------------------------------------------------------------------- quantized checkpoints
# Logit bounds of a restore from a quantized checkpoint: the worst audit difference docs/checkpoint-formats.md
# measured on these models (fp8 e4m3 at restore: 9.5e-3 with feedback, 8.0e-3 without) times a margin.
QUANTIZED_AUDIT_BOUND = 5e-2


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_the_audit_probes_quantized_checkpoints_where_a_hit_restores_them(fmt):
    """Under a quantized format the tree's slots are checkpoint-pool slots: the audit dequantizes them
    (read as state-pool slots they would be other requests' states or stale ones). The probe's error is
    the format's: above the exact path's tolerance, within the measured bound."""
    engine, _ = serve("qwen3_next", "extra_buffer", "branching", checkpoint_format=fmt)
    pool = engine.cache.checkpoint_pool
    assert pool is not None and pool.used > 0 and pool.loads > 0
    audits = audit_checkpoints(engine)
    assert len(audits) == pool.used  # every checkpoint, each a checkpoint-pool slot
    assert {a.slot for a in audits} == set(pool.allocated_slots().tolist())
    worst = max(a.max_abs_diff for a in audits)
    assert LOGIT_ATOL < worst < QUANTIZED_AUDIT_BOUND, worst
