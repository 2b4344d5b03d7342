"""The tree walk's fast paths against their references (issue 12: a fast core keeps a pure-Python reference
and a test that the two agree): the scratch walk (``walks.ScratchWalk``, the page-1 loop) against the
general loop, every walk against a plain Python walk, and splits whose value halves are views against a
plain model."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, RadixKey
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.node import TreeNode
from mamba_radix.tree import RadixTree, Walk
from mamba_radix.walks import WALK_KINDS, choose_walk

keys_st = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=20), min_size=1, max_size=10)
queries_st = st.lists(st.lists(st.integers(0, 2), max_size=24), min_size=1, max_size=6)


def _tree(keys: list[list[int]], matches: list[list[int]]) -> RadixTree:
    """A tree of ``keys`` (KV index = 1000 * depth + first token, a checkpoint at each key's end), then
    ``matches`` matched (their splits included)."""
    tree = RadixTree(CacheConfig(mamba_radix_cache_strategy="no_buffer"))
    slot = 1
    for key in keys:
        kv = torch.tensor([1000 * (i + 1) + t for i, t in enumerate(key)], dtype=torch.int64)
        if not tree.insert(RadixKey(key), kv, slot).mamba_exists:
            slot += 1
    for key in matches:
        tree.match(RadixKey(key))
    return tree


def _ids(result: Walk | tuple[list[TreeNode], int, int]) -> tuple[list[int], int, int]:
    """A walk (a :class:`Walk`, or a walk function's result) with node ids for nodes."""
    path, pos, partial = (result.path, result.pos, result.partial) if isinstance(result, Walk) else result
    return [node.id for node in path], pos, partial


@given(keys=keys_st, matches=queries_st, queries=queries_st, limit=st.none() | st.integers(0, 30))
def test_fast_walk_equals_the_general_loop(
    keys: list[list[int]], matches: list[list[int]], queries: list[list[int]], limit: int | None
) -> None:
    """From the root and from every node, with and without a limit: the same path, position and partial
    length from the page-1 loop as from the general loop."""
    tree = _tree(keys, matches)
    scratch_walk, general_walk = choose_walk(1, "scratch")[1], choose_walk(1, "general")[1]
    for query in queries:
        tokens = RadixKey(query).token_ids
        num_tokens = len(tokens) if limit is None else min(limit, len(tokens))
        for start in tree.nodes():  # any continuation: the walk compares from the start node's children on
            fast = _ids(scratch_walk(tokens, None, start, num_tokens))
            assert fast == _ids(general_walk(tokens, None, start, num_tokens))


def _walk_reference(tree: RadixTree, query: list[int]) -> tuple[list[int], int, int]:
    """The walk in plain Python on the node keys as lists: the matched path, tokens fully matched and the
    tokens matched into the next edge."""
    node, pos, path = tree.root, 0, []
    while pos < len(query):
        child = node.children.get(query[pos])
        if child is None:
            break
        edge = list(child.key)
        n = 0
        while n < len(edge) and pos + n < len(query) and edge[n] == query[pos + n]:
            n += 1
        path.append(child.id)
        if n < len(edge):
            return path, pos, n
        pos, node = pos + n, child
    return path, pos, 0


@given(keys=keys_st, matches=queries_st, queries=queries_st)
def test_walk_equals_a_plain_python_walk(
    keys: list[list[int]], matches: list[list[int]], queries: list[list[int]]
) -> None:
    """Every walk a tree can take (compiled where built, scratch, general) against the plain walk."""
    tree = _tree(keys, matches)
    kinds = [kind for kind in WALK_KINDS if kind != "compiled" or tree.walk_kind == "compiled"]
    for query in queries:
        key = RadixKey(query)
        assert _ids(tree.walk(key)) == _walk_reference(tree, query)
        for kind in kinds:
            walk = choose_walk(1, kind)[1]
            assert _ids(walk(key.token_ids, None, tree.root, len(query))) == _walk_reference(tree, query)


@given(keys=keys_st, queries=queries_st, later=st.lists(st.integers(0, 2), min_size=1, max_size=20))
def test_a_repeated_walk_is_never_stale(
    keys: list[list[int]], queries: list[list[int]], later: list[int]
) -> None:
    """A walk of one key object after an insert, a match (which may split) or an eviction sees the tree as
    it is then; a caller that changes a returned path does not change the next answer."""
    tree = _tree(keys, [])
    slot = 10_000
    for query in queries:
        key = RadixKey(query)
        first = tree.walk(key)
        again = tree.walk(key)
        assert _ids(again) == _ids(first) == _walk_reference(tree, query)
        again.path.append(tree.root)  # a caller's change to its walk
        assert _ids(tree.walk(key)) == _walk_reference(tree, query)
        kv = torch.arange(len(later), dtype=torch.int64) + 50_000
        tree.insert(RadixKey(later), kv, slot)
        slot += 1
        assert _ids(tree.walk(key)) == _walk_reference(tree, query)
        tree.match(RadixKey(later[: len(later) // 2 + 1]))
        assert _ids(tree.walk(key)) == _walk_reference(tree, query)
        tree.evict(num_tokens=3)
        assert _ids(tree.walk(key)) == _walk_reference(tree, query)
        # another key object with equal tokens agrees
        assert _ids(tree.walk(RadixKey(query))) == _walk_reference(tree, query)


@given(keys=keys_st, matches=queries_st)
def test_split_values_are_the_tokens_kv(keys: list[list[int]], matches: list[list[int]]) -> None:
    """Splits hand the halves views of the old value: every node's value is still the KV of its own
    tokens (1000 * position + token), and every match returns fresh, contiguous KV."""
    tree = _tree(keys, matches)
    check_tree_invariants(tree)
    for node in tree.nodes():
        if node is tree.root:
            continue
        start = node.depth - len(node.key)
        want = [1000 * (start + i + 1) + t for i, t in enumerate(node.key)]
        assert node.value.tolist() == want
    for key in matches:
        m = tree.match(RadixKey(key))
        want = [1000 * (i + 1) + t for i, t in enumerate(key[: m.hit_len])]
        row = torch.full((m.hit_len + 3,), -1, dtype=torch.int64)  # a caller's buffer: chunks written out
        if m.kv_chunks:
            torch.cat(m.kv_chunks, out=row[: m.hit_len])
        assert row.tolist() == [*want, -1, -1, -1]
        assert [t for chunk in m.kv_chunks for t in chunk.tolist()] == want
        got = m.device_indices
        assert got.tolist() == want and m.device_indices is got  # concatenated once
        if got.numel():
            for node in tree.nodes():  # never a node's storage
                assert got.data_ptr() != node.value.data_ptr()
