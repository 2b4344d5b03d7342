"""The cache's fast paths (issue 12) against the checked reference paths they replace: same bytes, same
pool state, same errors, same fingerprints, same keys."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from mamba_radix import CacheConfig, InvalidArgument, InvalidIndex, MambaRadixCache, Req
from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mamba_radix.sim.ideal import BlockPrefixIdeal
from mamba_radix.sim.traces import OUTPUT_TOKEN_BASE, TraceRequest
from mamba_radix.state_stamp import PrefixFingerprints, fingerprint, read_stamp, write_stamp


def _bits(pool: MambaPool) -> list[bytes]:
    return [t.view(torch.uint8).numpy().tobytes() for t in pool.tensors]


@pytest.mark.parametrize("layers", [1, 3])
def test_trusted_slot_copy_writes_what_the_checked_copy_writes(layers: int, monkeypatch) -> None:
    """numpy byte views (CPU) and host-int torch indexing (the device path, forced here) give the checked
    state_ops copy's bytes, NaN payloads and all."""
    results = []
    for path in ("checked", "views", "copy_slot", "torch"):
        pool = MambaPool(6, layers, [(8,), (3, 4)], (2, 5), conv_dtypes=[torch.bfloat16, torch.float16])
        gen = torch.Generator().manual_seed(7)
        for t in pool.tensors:
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=gen))
        src, dst = (int(s) for s in pool.alloc(2))
        if path == "checked":
            pool.copy_from([src], [dst])
        elif path == "copy_slot":
            pool.copy_slot(src, dst)
        else:
            if path == "torch":
                monkeypatch.setattr(pool, "_host_byte_views", lambda: None)
            pool.copy_from([src], [dst], check=False)
        results.append(_bits(pool))
    assert results[0] == results[1] == results[2] == results[3]


def test_trusted_slot_copy_follows_replaced_tensors() -> None:
    """The byte views are built once per set of tensors: replacing the temporal tensor or the conv
    tensors drops them, and the next copy writes into the new tensors; an item of ``conv`` cannot be
    replaced unseen (a tuple)."""
    pool = MambaPool(4, 1, [(8,)], (4,))
    a, b = (int(s) for s in pool.alloc(2))
    pool.copy_from([a], [b], check=False)  # builds the views
    pool.temporal = torch.zeros_like(pool.temporal)
    pool.temporal[0, a] = 5.0
    pool.copy_from([a], [b], check=False)
    assert pool.temporal[0, b].tolist() == [5.0] * 4
    pool.conv = [torch.zeros_like(pool.conv[0])]
    pool.conv[0][0, a] = 3.0
    pool.copy_slot(a, b)
    assert pool.conv[0][0, b].tolist() == [3.0] * 8
    with pytest.raises(TypeError):
        pool.conv[0] = torch.zeros_like(pool.conv[0])  # type: ignore[index]


@pytest.mark.parametrize("backend", ["host", "torch"])
def test_int_list_frees_equal_tensor_frees(backend: str) -> None:
    pools = [MambaPool(20, 1, [(2,)], (2,), backend=backend) for _ in range(2)]
    for pool in pools:
        pool.alloc(12)
    pools[0].free([3, 7, 1])
    pools[1].free(torch.tensor([3, 7, 1]))
    for bad, error in (([3], "not allocated"), ([5, 5], "twice"), ([0], "padding"), ([99], "out of range")):
        for pool in pools:
            with pytest.raises(InvalidIndex, match=error):
                pool.free(bad)
    with pytest.raises(InvalidArgument, match="ints"):
        pools[0].free([1.5])  # type: ignore[list-item]
    assert pools[0].allocated_slots().tolist() == pools[1].allocated_slots().tolist()
    assert pools[0].available_size() == pools[1].available_size()
    assert pools[0].alloc(11).tolist() == pools[1].alloc(11).tolist()  # the same free order


# every KV allocator kind the fast paths serve: host free list, torch free list, paged
ALLOCATORS = [
    lambda: TokenToKVPoolAllocator(64),
    lambda: TokenToKVPoolAllocator(64, backend="torch"),
    lambda: PagedTokenToKVPoolAllocator(64, 4),
]


@pytest.mark.parametrize("make", ALLOCATORS)
def test_all_allocated_agrees_with_the_mask_for_int32_and_int64(make) -> None:
    alloc = make()
    held = alloc.alloc(16)
    alloc.free(held[4:8])
    rng = random.Random(3)
    for _ in range(50):
        values = [rng.randrange(-3, 80) for _ in range(rng.randrange(0, 6))]
        for dtype in (torch.int32, torch.int64):
            idx = torch.tensor(values, dtype=dtype)
            want = bool(alloc.is_allocated(idx.to(torch.int64)).all()) if values else True
            assert alloc.all_allocated(idx) == want, (values, dtype)


@pytest.mark.parametrize("length", [(1 << 15) - 1, 1 << 15, (1 << 15) + 1, 70_000])
def test_prefix_fingerprints_across_chunk_boundaries(length: int) -> None:
    """The unreduced prefix sums carry across 2**15-token chunks; large ids and the top id are reduced."""
    rng = np.random.default_rng(length)
    tokens = rng.integers(0, 1 << 20, length).astype(np.int64)
    tokens[-50:] = OUTPUT_TOKEN_BASE + np.arange(50)
    tokens[length // 2] = 2**63 - 1
    prefix = PrefixFingerprints(tokens)
    as_list = tokens.tolist()
    for n in sorted({1, length // 2, length // 2 + 1, (1 << 15) - 1, 1 << 15, length}):
        if n <= length:
            assert prefix.at(n) == fingerprint(as_list[:n]), n


def test_block_ideal_equals_the_longest_earlier_prefix() -> None:
    rng = random.Random(11)
    ideal, seen = BlockPrefixIdeal(block_size=4), []
    for i in range(300):
        base = rng.choice(seen)[0] if seen and rng.random() < 0.7 else []
        blocks = base[: rng.randrange(0, len(base) + 1)] + [
            rng.randrange(50) for _ in range(rng.randrange(1, 4))
        ]
        length = 4 * len(blocks) - rng.randrange(0, 4)
        want = 0
        for other, other_len in seen:
            shared = 0
            while shared < min(len(blocks), len(other)) and blocks[shared] == other[shared]:
                shared += 1
            want = max(want, min(4 * shared, length, other_len))
        req = TraceRequest(
            index=i, timestamp_ms=0, input_len=length, output_len=1, block_ids=blocks, block_size=4
        )
        assert ideal.observe(req) == min(want, length - 1), i
        seen.append((blocks, length))


# ------------------------------------------------------------------------------------------ lifecycle
CONFIG = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer",
    mamba_cache_chunk_size=4,
    mamba_track_interval=8,
    chunked_prefill_size=8,
)


def _stamp(cache: MambaRadixCache, req: Req, plan) -> None:
    """Play the model: the live state at plan.end, the tracked one at plan.track_len."""
    write_stamp(cache.mamba_pool, plan.live_slot, fingerprint(req.token_ids(plan.end)), plan.end)
    if plan.track_slot is not None:
        tokens = req.token_ids(plan.track_len)
        write_stamp(cache.mamba_pool, plan.track_slot, fingerprint(tokens), plan.track_len)


def _serve(cache: MambaRadixCache, rid: int, prompt: list[int], outputs: list[int]) -> Req:
    req = Req(rid=rid, origin_input_ids=prompt)
    assert cache.admit(req, max_new_tokens=len(outputs))
    while req.kv_len < len(prompt) + len(outputs) - 1:
        if req.kv_len < len(prompt):
            n = min(8, len(prompt) - req.kv_len)
        else:
            req.output_ids = outputs[: req.kv_len - len(prompt) + 1]
            n = 1
        plan = cache.extend(req, n)
        assert plan is not None
        _stamp(cache, req, plan)
        cache.commit(plan)
    req.output_ids = list(outputs)
    cache.finish(req)
    return req


def _paths(cache: MambaRadixCache) -> list[tuple[list[int], int]]:
    tree, out = cache.tree, []
    for node in tree.nodes():
        if node.mamba_slot is not None:
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            assert read_stamp(cache.mamba_pool, node.mamba_slot) == (fingerprint(tokens), node.depth)
            out.append((tokens, node.depth))
    return sorted(out)


def test_keys_cut_from_the_checked_tokens_are_the_requests_tokens() -> None:
    """Hand-over and finish keys come from the admission's checked array (and the sampled tokens extends
    checked): every checkpoint's path spells its request's tokens, and its stamp agrees."""
    cache = MambaRadixCache.build(CONFIG, num_tokens=512, num_slots=40, max_context_len=128)
    shared = list(range(100, 120))
    _serve(cache, 1, [*shared, 1, 2, 3], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    _serve(cache, 2, [*shared, 1, 2, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15, 40, 41], [50, 51, 52])
    paths = _paths(cache)
    assert paths and all(depth == len(tokens) for tokens, depth in paths)
    assert any(tokens[:20] == shared for tokens, _ in paths)
    assert not cache.lifecycle.checked_tokens  # finish dropped every entry
    cache.check_invariants([])


def test_a_refused_decode_extend_keeps_no_checked_tokens() -> None:
    """A decode extend that is refused changes nothing, not even the checked-token record: a token fixed
    after the refusal is the one inserted."""
    cache = MambaRadixCache.build(CONFIG, num_tokens=512, num_slots=40, max_context_len=128)
    prompt = list(range(200, 206))
    req = Req(rid=3, origin_input_ids=prompt)
    assert cache.admit(req, max_new_tokens=8)
    plan = cache.extend(req, 6)
    assert plan is not None
    _stamp(cache, req, plan)
    cache.commit(plan)
    req.output_ids = [60, 61, 62, 63]
    with pytest.raises(InvalidArgument, match="decode boundary"):
        cache.extend(req, 3)  # crosses the boundary at 8
    assert len(cache.lifecycle.checked_tokens[req]) == 6
    req.output_ids = [60, 70, 71]
    plan = cache.extend(req, 2)
    assert plan is not None
    _stamp(cache, req, plan)
    cache.commit(plan)
    cache.finish(req)
    assert [[*prompt, 60, 70]] == [tokens for tokens, _ in _paths(cache) if len(tokens) == 8]


def test_trusted_donation_and_release_leave_the_pool_as_the_checked_ones() -> None:
    """donate_ping_pong_slot and free_mamba_cache with check=False (the lifecycle's calls) update the
    mirror, the owner records and the device mappings exactly as the checked calls do."""
    from mamba_radix.pools import HybridReqToTokenPool

    def pool_state(pool: HybridReqToTokenPool, req: Req) -> tuple:
        return (
            dict(pool._slot_row),
            [list(t) for t in pool._row_track],
            list(pool._row_live),
            pool.num_reserved_slots(),
            pool.req_index_to_mamba_index_mapping.tolist(),
            pool.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist(),
            pool.mamba_pool.allocated_slots().tolist(),
            req.mamba_ping_pong_track_buffer,
            req.mamba_pool_idx,
        )

    states = []
    for check in (True, False):
        config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
        pool = HybridReqToTokenPool(3, 16, MambaPool(12, 1, [(2,)], (2,)), config)
        req = Req(rid=1, origin_input_ids=[1, 2])
        pool.alloc([req])
        fresh = int(pool.mamba_pool.alloc(1)[0])
        donated = pool.donate_ping_pong_slot(req, fresh, check)
        pool.mamba_pool.free([donated])
        mid = pool_state(pool, req)
        pool.free_mamba_cache(req, keep=fresh, check=check)
        states.append((donated, mid, pool_state(pool, req)))
    assert states[0] == states[1]


@pytest.mark.parametrize("make", ALLOCATORS)
def test_has_repeats_agrees_with_unique(make) -> None:
    alloc = make()
    rng = random.Random(5)
    for _ in range(200):
        values = [rng.randrange(0, 66) for _ in range(rng.randrange(0, 8))]
        idx = torch.tensor(values, dtype=torch.int64)
        assert alloc.has_repeats(idx) == (len(set(values)) != len(values)), values
