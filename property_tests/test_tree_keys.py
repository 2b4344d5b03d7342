"""Tree keys in C buffers: :class:`TokenIds`, the fast prefix comparisons against the pure-Python reference
(issue 12: every fast core keeps a reference and a test that the two agree), and whole walks that reach
the windowed and numpy paths."""

from __future__ import annotations

import contextlib
import copy
import operator
import pickle
from array import array
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, InvalidArgument, RadixKey
from mamba_radix import token_ids as token_ids_mod
from mamba_radix import walks as walks_mod
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.node import (
    TokenIds,
    as_token_ids,
    child_key,
    common_prefix_len,
    common_prefix_len_reference,
    key_slice,
    prefix_len_bytes,
    prefix_len_in,
)
from mamba_radix.tree import RadixTree

# a small alphabet makes long common prefixes (and mismatches deep inside them) likely
tokens_st = st.lists(st.integers(0, 3), max_size=80)
wide_tokens_st = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20)


@contextlib.contextmanager
def tiny_thresholds() -> Iterator[None]:
    """Shrink every threshold so that keys of a few tokens already take every path: numpy from 7 tokens
    in chunks of 4, the linear tail below 2 tokens, a tree scratch buffer of 2 tokens (longer keys are
    compared edge by edge). A context manager, not a fixture: Hypothesis runs many examples per fixture
    instance."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(token_ids_mod, "_NUMPY_MIN_TOKENS", 7)
        patch.setattr(token_ids_mod, "_NUMPY_CHUNK_TOKENS", 4)
        patch.setattr(token_ids_mod, "_LINEAR_TOKENS", 2)
        patch.setattr(walks_mod, "SCRATCH_TOKENS", 2)
        patch.setattr(token_ids_mod, "_SLICE_COPY_TOKENS", 2)
        yield


def _all_fast_paths(key: list[int], tokens: list[int], start: int) -> set[int]:
    k, t = TokenIds("q", key), TokenIds("q", tokens)
    # a scratch buffer holding the tokens' bytes, then stale bytes that must not count (end bounds it)
    stale = bytearray(t.tobytes() + TokenIds("q", key[max(len(tokens) - start, 0) :] or [7]).tobytes())
    return {
        prefix_len_in(k, memoryview(t), start),
        prefix_len_in(k, memoryview(t), start, bytearray(8)),  # too small: it allocates its own
        prefix_len_in(k, memoryview(t), start, bytearray(1 << 12)),
        prefix_len_bytes(k, t.tobytes(), start),
        prefix_len_bytes(k, stale, start, len(t)),
        common_prefix_len(key, tokens, start),
        common_prefix_len(k, t, start),
    }


@given(a=tokens_st, b=tokens_st, start=st.integers(0, 90))
def test_fast_prefix_len_equals_reference(a: list[int], b: list[int], start: int) -> None:
    assert _all_fast_paths(a, b, start) == {common_prefix_len_reference(a, b, start)}


@given(a=tokens_st, b=tokens_st, start=st.integers(0, 90))
def test_fast_prefix_len_equals_reference_on_every_path(a: list[int], b: list[int], start: int) -> None:
    with tiny_thresholds():
        assert _all_fast_paths(a, b, start) == {common_prefix_len_reference(a, b, start)}


@given(a=wide_tokens_st, b=wide_tokens_st)
def test_fast_prefix_len_over_the_whole_int64_range(a: list[int], b: list[int]) -> None:
    """Byte order and sign cannot fool memcmp-based equality: only equality is asked of it."""
    assert _all_fast_paths(a, a + b, 0) == {len(a)}
    assert _all_fast_paths(a + b, a, 0) == {len(a)}
    assert _all_fast_paths(a, b, 0) == {common_prefix_len_reference(a, b, 0)}


@pytest.mark.parametrize("length", [1, 8, 9, 32767, 32768, 65536, 65537, 200_000])
@given(where=st.floats(0, 1), start=st.integers(0, 3), delta=st.sampled_from([1, -1, 2**40, 256]))
def test_long_keys_with_real_thresholds(length: int, where: float, start: int, delta: int) -> None:
    """Keys around and beyond the real numpy threshold and chunk, one token changed anywhere."""
    key = TokenIds("q", range(1000, 1000 + length))
    tokens = TokenIds("q", range(1000 - start, 1000 + length + 5))
    assert prefix_len_in(key, memoryview(tokens), start) == length
    cut = min(int(where * length), length - 1)
    tokens[start + cut] += delta
    expected = cut
    assert prefix_len_in(key, memoryview(tokens), start) == expected
    assert prefix_len_bytes(key, tokens.tobytes(), start) == expected
    if length <= 10_000:  # the reference walks token by token in Python
        assert common_prefix_len_reference(key, tokens, start) == expected
    short = memoryview(tokens)[: start + cut // 2]  # the tokens end first
    assert prefix_len_in(key, short, start) == cut // 2


def test_token_ids_compare_like_a_tuple() -> None:
    ids = as_token_ids([4, 5, 6])
    assert ids == (4, 5, 6) and ids == [4, 5, 6] and ids == array("q", [4, 5, 6])
    assert operator.eq((4, 5, 6), ids) and operator.eq([4, 5, 6], ids)  # the reflected comparisons
    assert ids != (4, 5) and ids != (4, 5, 7) and ids != "456" and operator.ne(ids, (4, 5, 6)) is False
    assert tuple(ids) == (4, 5, 6) and list(ids[1:]) == [5, 6] and len(ids) == 3
    assert np.asarray(ids).dtype == np.int64 and np.asarray(ids).tolist() == [4, 5, 6]
    with pytest.raises(TypeError):
        hash(ids)
    for twin in (copy.copy(ids), copy.deepcopy(ids), pickle.loads(pickle.dumps(ids))):
        assert type(twin) is TokenIds and twin == (4, 5, 6) and twin is not ids


def test_as_token_ids_copies_every_input_kind() -> None:
    source = array("q", [7, 8, 9])
    for given_ids in (
        source,
        [7, 8, 9],
        (7, 8, 9),
        range(7, 10),
        np.array([7, 8, 9], dtype=np.int64),
        memoryview(source),
    ):
        ids = as_token_ids(given_ids)
        assert type(ids) is TokenIds and ids == (7, 8, 9)
    ids = as_token_ids(source)
    source[0] = 0
    assert ids[0] == 7  # a copy, never the caller's buffer
    strided = np.arange(10, dtype=np.int64)[::3]
    assert as_token_ids(strided) == (0, 3, 6, 9)  # not C-contiguous: the item-by-item path
    assert key_slice(ids, 1, 3) == (8, 9) and type(key_slice(ids, 1, 3)) is TokenIds


def test_radix_key_normalises_and_refuses() -> None:
    assert RadixKey(np.array([1, 2], dtype=np.int32)).token_ids == (1, 2)
    assert RadixKey(torch.tensor([3, 4], dtype=torch.int64)).token_ids == (3, 4)
    assert RadixKey(array("q", [5])).token_ids == (5,)
    assert RadixKey.trusted([6, 7], "ns").token_ids == (6, 7)
    for bad in ([1.5], [None], [2**63], np.array([2**63], dtype=np.uint64), torch.tensor([0.5])):
        with pytest.raises(InvalidArgument, match="int token ids in int64 range"):
            RadixKey(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("page_size", [1, 4])
def test_child_key_is_the_same_for_every_sequence_kind(page_size: int) -> None:
    ids = [11, 12, 13, 14, 15]
    keys = {child_key(kind, 1, page_size, None) for kind in (ids, tuple(ids), as_token_ids(ids))}
    assert len(keys) == 1
    assert child_key(ids, 0, page_size, "a") != child_key(ids, 0, page_size, "b")


def _walk_model(keys: list[list[int]], query: list[int], page: int) -> int:
    """Tokens of ``query`` the tree holds: the longest common prefix with any inserted key, in pages."""
    best = max((common_prefix_len_reference(k, query, 0) for k in keys), default=0)
    return best - best % page


@pytest.mark.parametrize("page_size", [1, 2])
@given(
    inserted=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=24), max_size=8),
    queries=st.lists(st.lists(st.integers(0, 2), max_size=30), max_size=6),
)
def test_walks_on_every_path_match_the_model(
    page_size: int, inserted: list[list[int]], queries: list[list[int]]
) -> None:
    """Inserts and matches with thresholds so small that edges are compared in windows and with numpy:
    the tree's structure, hits and KV stay those of a plain longest-prefix model."""
    with tiny_thresholds():
        _walks_match_the_model(page_size, inserted, queries)


def _walks_match_the_model(page_size: int, inserted: list[list[int]], queries: list[list[int]]) -> None:
    tree = RadixTree(
        CacheConfig(
            mamba_radix_cache_strategy="extra_buffer" if page_size > 1 else "no_buffer",
            page_size=page_size,
            disable_overlap_schedule=True,
        )
    )
    kept: list[list[int]] = []
    kv_of: dict[
        tuple[int, ...], int
    ] = {}  # token prefix -> the KV index the tree must hold for its last token
    next_kv, slot = 1, 1
    for key in inserted:
        key = key[: len(key) - len(key) % page_size]
        if not key:
            continue
        prefix_len = tree.walk(RadixKey(key))
        held = prefix_len.pos + prefix_len.partial
        assert held == _walk_model(kept, key, page_size)
        value = []
        for i in range(len(key)):
            index = kv_of.get(tuple(key[: i + 1]))
            if index is None:
                index = kv_of[tuple(key[: i + 1])] = next_kv
                next_kv += 1
            value.append(index)
        done = tree.insert(RadixKey(key), torch.tensor(value, dtype=torch.int64), slot)
        slot += 1
        assert done.prefix_len == held
        kept.append(key)
        check_tree_invariants(tree)
    for query in queries:
        walk = tree.walk(RadixKey(query))
        assert walk.pos + walk.partial == _walk_model(kept, query, page_size)
        m = tree.match(RadixKey(query))
        assert m.full_kv_hit_len == walk.pos + walk.partial
        assert m.device_indices.tolist() == [kv_of[tuple(query[: i + 1])] for i in range(m.hit_len)]
        check_tree_invariants(tree)
    for node in tree.nodes():
        assert type(node.key) is TokenIds


@given(tokens=wide_tokens_st, data=st.data())
def test_key_slice_is_the_slice_on_both_paths(tokens: list[int], data: st.DataObject) -> None:
    """key_slice (a slice and a copy up to _SLICE_COPY_TOKENS, one memcpy through a memoryview beyond)
    equals the list slice, as a fresh TokenIds, from a TokenIds or a plain int64 array."""
    start = data.draw(st.integers(0, len(tokens)))
    stop = data.draw(st.integers(start, len(tokens)))
    for source in (TokenIds("q", tokens), array("q", tokens)):
        with tiny_thresholds():
            long_path = key_slice(source, start, stop)
        short_path = key_slice(source, start, stop)
        for got in (long_path, short_path):
            assert type(got) is TokenIds and got == tokens[start:stop]
            assert got is not source
