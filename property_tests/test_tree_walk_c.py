"""The compiled page-1 walk (``mamba_radix._cwalk``, issue 12: a compiled core keeps the pure-Python path
as the reference and a test checks the two agree) against the Python ``walks.walk_in_scratch``.

- the two functions side by side on random raw trees and keys: mismatches inside an edge, keys ending
  mid-edge or exactly at an edge's end, empty children, empty and long edges, keys longer than every edge,
  limits below the key's length, tokens at the int64 bounds, any start node;
- the same on node types the C loop does not read through slot offsets (plain attributes, a property
  added to a slotted class after a first walk): the attribute protocol;
- its refusals (TypeError, the caller's list unchanged) and the compiled walk's fallback to the Python loop;
- references and buffers: nothing leaked, every buffer released;
- whole trees: sequences of insert, match and evict give identical results and trees with the compiled
  walk and the scratch walk (``RadixTree(walk=...)``), keys longer than the scratch buffer included (the
  compiled loop walks them in the key's own buffer, the Python side takes the general loop).

Skipped when the extension was not built (no C compiler at install time): the Python loop is then the
only one, and the other walk tests cover it.
"""

from __future__ import annotations

import contextlib
import sys
from array import array
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, RadixKey
from mamba_radix import walks as walks_mod
from mamba_radix.errors import InvalidArgument
from mamba_radix.native import compiled_paths_enabled
from mamba_radix.node import TokenIds, TreeNode, as_token_ids
from mamba_radix.tree import RadixTree
from mamba_radix.walks import choose_walk, walk_in_scratch

cwalk = pytest.importorskip("mamba_radix._cwalk", reason="the compiled walk was not built (no C compiler)")
c_walk = cwalk.walk_in_scratch

_NO_KV = torch.empty(0, dtype=torch.int64)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# a small alphabet (so random keys share prefixes) plus a few values that stress the conversion: small
# ints CPython caches, ints just past that cache, and the int64 bounds
tokens_st = st.integers(0, 3) | st.sampled_from([-1, 256, 257, 10**12, INT64_MIN, INT64_MAX])
short_edge_st = st.lists(tokens_st, min_size=1, max_size=6)
# a long edge: a repeated pattern, so a key can follow it for hundreds of tokens and still differ late
long_edge_st = st.builds(
    lambda unit, times: unit * times, st.lists(tokens_st, min_size=1, max_size=3), st.integers(40, 200)
)
# mostly short edges; a long one in 4; an empty one (outside what RadixTree builds, inside the loops'
# contract: both pass through it) rarely
edge_st = st.integers(0, 19).flatmap(
    lambda roll: st.just([]) if roll == 0 else long_edge_st if roll <= 5 else short_edge_st
)


def _node(node_id: int, edge: list[int], cls: type = TreeNode) -> Any:
    return cls(node_id, as_token_ids(edge), _NO_KV, parent=None, depth=0, extra_key=None)


class RawTree(NamedTuple):
    """A raw tree (not built by RadixTree): every node (the root first), each node's parent index and
    the token path from the root to each node's end."""

    nodes: list[Any]
    parents: list[int]
    paths: list[list[int]]


@st.composite
def raw_trees(draw: st.DrawFn, cls: type = TreeNode) -> RawTree:
    """Nodes of ``cls``, grown mostly depth first. A child hangs under its edge's first token, or
    (rarely) under another token, so the loops also meet a child whose first token does not match; an
    empty edge hangs under a drawn token."""
    tree = RawTree([_node(0, [], cls)], [-1], [[]])
    frontier = [0]
    budget = draw(st.integers(1, 30))
    while frontier and len(tree.nodes) <= budget:
        at = frontier.pop(-1 if draw(st.integers(0, 3)) else draw(st.integers(0, len(frontier) - 1)))
        for _ in range(draw(st.integers(0, 3))):
            edge = draw(edge_st)
            first = edge[0] if edge and draw(st.integers(0, 19)) else draw(tokens_st)
            if first in tree.nodes[at].children:
                continue  # one child per first token (a replaced one would be unreachable)
            tree.nodes[at].children[first] = _node(len(tree.nodes), edge, cls)
            tree.nodes.append(tree.nodes[at].children[first])
            tree.parents.append(at)
            tree.paths.append(tree.paths[at] + edge)
            frontier.append(len(tree.nodes) - 1)
    return tree


@st.composite
def walks(draw: st.DrawFn, tree: RawTree) -> tuple[list[int], Any]:
    """A key and the node the walk starts at. Usually: a node ``d``, one of its ancestors ``s`` (or ``d``)
    as the start, and the tokens from ``s``'s edge to ``d``'s end as the key; cut anywhere (mid-edge, an
    exact end), maybe one token changed (a mismatch inside an edge), maybe a tail added (longer than the
    edges). Sometimes a random key from a random node."""
    if len(tree.nodes) == 1 or draw(st.integers(0, 5)) == 0:
        return draw(st.lists(tokens_st, max_size=30)), draw(st.sampled_from(tree.nodes))
    d = max(draw(st.integers(1, len(tree.nodes) - 1)) for _ in range(2))  # later nodes lie deeper
    chain = [d]
    while tree.parents[chain[-1]] > 0:
        chain.append(tree.parents[chain[-1]])
    s = chain[-1] if draw(st.booleans()) else draw(st.sampled_from(chain))  # often from the root's child
    key = tree.paths[d][len(tree.paths[tree.parents[s]]) :]
    key = key[: draw(st.integers(0, len(key)))] if draw(st.integers(0, 2)) == 0 else list(key)
    if key and draw(st.integers(0, 2)) == 0:
        key[draw(st.integers(0, len(key) - 1))] = draw(tokens_st)
    if draw(st.booleans()):
        key += draw(st.lists(tokens_st, min_size=1, max_size=8))
    return key, tree.nodes[s]


def _scratch(tokens: TokenIds, num_tokens: int, spare: int) -> bytearray:
    """The walk's scratch buffer: the first ``num_tokens`` tokens, then ``spare`` tokens of garbage that
    neither loop may read (the tree's buffer is larger than most keys and holds older keys there)."""
    return bytearray(tokens[:num_tokens].tobytes()) + bytearray(b"\xa5" * 8 * spare)


def _both(
    tokens: TokenIds, child: Any, num_tokens: int, spare: int = 3, prefix: list[Any] | None = None
) -> tuple[tuple[list[int], int, int], tuple[list[int], int, int]]:
    """The C and the Python loop on the same input, each with its own copy of the caller's list: (node
    identities, pos, partial) of each; checks each returned the caller's very list, and that the C loop
    gives the same with the key as its own scratch buffer (as the tree calls it)."""
    out = []
    for walk, haystack in (
        (c_walk, _scratch(tokens, num_tokens, spare)),
        (walk_in_scratch, _scratch(tokens, num_tokens, spare)),
        (c_walk, tokens),
    ):
        path = list(prefix or [])
        got_path, pos, partial = walk(haystack, tokens, child, num_tokens, path)
        assert got_path is path
        out.append(([id(node) for node in got_path], pos, partial))
    assert out[2] == out[0]
    return out[0], out[1]


@given(data=st.data(), tree=raw_trees())
def test_c_walk_equals_the_python_walk(data: st.DataObject, tree: RawTree) -> None:
    for _ in range(data.draw(st.integers(1, 6))):
        query, child = data.draw(walks(tree))
        tokens = as_token_ids(query)
        num_tokens = (
            data.draw(st.integers(0, len(query))) if data.draw(st.integers(0, 3)) == 0 else len(query)
        )
        spare = data.draw(st.integers(0, 4))
        c_result, py_result = _both(tokens, child, num_tokens, spare, prefix=[tree.nodes[0]])
        assert c_result == py_result


class PlainNode:
    """A node with ``key`` and ``children`` in an instance dict: the C loop reads them through the
    attribute protocol, not slot offsets."""

    def __init__(self, node_id: int, key: TokenIds, value: torch.Tensor, **_: object) -> None:
        self.id, self.key, self.children = node_id, key, {}


@given(data=st.data(), tree=raw_trees(PlainNode))
def test_c_walk_equals_the_python_walk_on_plain_attribute_nodes(data: st.DataObject, tree: RawTree) -> None:
    query, child = data.draw(walks(tree))
    c_result, py_result = _both(as_token_ids(query), child, len(query))
    assert c_result == py_result


def test_a_class_changed_after_a_walk_is_read_through_its_new_attribute() -> None:
    """The C loop caches where a slotted class keeps ``key``; a property put on the class later (which
    changes the type's version) is honoured by the next walk, as Python would."""

    class Node(TreeNode):
        __slots__ = ()

    a, b = _node(1, [1, 2], Node), _node(2, [3, 4], Node)
    a.children[3] = b
    tokens = as_token_ids([1, 2, 3, 4])
    assert _both(tokens, a, 4)[0] == ([id(a), id(b)], 4, 0)
    Node.key = property(lambda self: as_token_ids([1, 9]))  # type: ignore[assignment,misc]
    c_result, py_result = _both(tokens, a, 4)
    assert c_result == py_result == ([id(a)], 0, 1)


def test_partial_edges_find_the_first_mismatching_token() -> None:
    """The partial length is the first int64 that differs, wherever the bytes differ (a token that
    shares its low bytes with the key's), and is cut at the key's end."""
    big = as_token_ids([7, INT64_MAX, 1 << 40, INT64_MIN, 5] * 20)
    node = _node(1, list(big))
    for i in range(len(big)):
        for changed in (big[i] ^ 1, big[i] ^ (1 << 62), big[i] ^ (1 << 8)):
            query = [*big[:i], changed, *big[i + 1 :]]
            assert _both(as_token_ids(query), node, len(query))[0] == ([id(node)], 0, i)
        assert _both(big, node, i)[0] == ([id(node)], 0, i)  # the key ends mid-edge
    assert _both(big, node, len(big))[0] == ([id(node)], len(big), 0)  # an exact end
    longer = as_token_ids([*big, 1, 2])
    assert _both(longer, node, len(longer))[0] == ([id(node)], len(big), 0)  # no children
    node.children[1] = other = _node(2, [1, 3])
    assert _both(longer, node, len(longer))[0] == ([id(node), id(other)], len(big), 1)


def test_refusals_leave_the_callers_list_unchanged() -> None:
    """Input outside the C loop's contract: TypeError, and the caller's list as it was (a later node
    refusing after earlier ones were appended included)."""
    good = _node(1, [1, 2])
    tokens = as_token_ids([1, 2, 3, 4])
    scratch = _scratch(tokens, 4, 0)
    sentinel = object()

    def refused(
        child: Any, *, scratch: Any = scratch, tokens: Any = tokens, num_tokens: Any = 4, path: Any = None
    ) -> str:
        path = [sentinel] if path is None else path
        before = list(path)
        with pytest.raises(TypeError) as info:
            c_walk(scratch, tokens, child, num_tokens, path)
        assert list(path) == before
        return str(info.value)

    # a later node's key is not an int64 buffer: a list, an int32 array, a 2-D buffer
    for bad_key in ([3, 4], array("i", [3, 4]), memoryview(array("q", [3, 4])).cast("B").cast("q", (1, 2))):
        bad = _node(2, [3, 4])
        bad.key = bad_key
        good.children = {3: bad}
        assert "node.key" in refused(good)
    # children not a dict (a dict subclass may override get)
    good.children = type("Sub", (dict,), {})({3: _node(2, [3, 4])})
    assert "children" in refused(good)
    good.children = {}
    assert "tokens" in refused(good, tokens=[1, 2, 3, 4])
    assert "tokens" in refused(good, tokens=array("d", [1.0, 2.0]))
    assert "scratch" in refused(good, scratch="not bytes")
    for num_tokens in (-1, 5, 2**70, 1.0):
        refused(good, num_tokens=num_tokens)
    assert "num_tokens" in refused(good, scratch=bytearray(8 * 3))  # the key does not fit the scratch
    assert "path" in refused(good, path=(sentinel,))
    with pytest.raises(TypeError):
        c_walk(scratch, tokens, good, 4)  # four arguments
    # another error (a node without a key) propagates, the list restored too
    path = [sentinel]
    good.children = {3: PlainNode.__new__(PlainNode)}
    with pytest.raises(AttributeError):
        c_walk(scratch, tokens, good, 4, path)
    assert path == [sentinel]


def test_no_reference_or_buffer_is_leaked() -> None:
    """After many walks every object's reference count is as before, and every buffer was released
    (an array or bytearray with an export alive cannot be resized)."""
    a, b, c = _node(1, [1, 2]), _node(2, [300, 4, 5]), _node(3, [6])
    a.children[300] = b
    b.children[6] = c
    tokens = as_token_ids([1, 2, 300, 4, 9])
    scratch = _scratch(tokens, 5, 2)
    watched = [a, b, c, a.key, b.key, c.key, a.children, b.children, tokens, scratch]
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(1000):
        c_walk(scratch, tokens, a, 5, [])  # ends inside b's edge
        c_walk(scratch, tokens, a, 2, [])  # ends at a's end
        with contextlib.suppress(TypeError):
            c_walk(scratch, tokens, a, 6, [])  # refused
    assert [sys.getrefcount(obj) for obj in watched] == before
    for buffer in (tokens, scratch, a.key, b.key):
        buffer.extend(buffer[:1])  # BufferError if an export were still alive
        del buffer[-1]


class CountingDict(dict):
    """Children the C loop refuses (not an exact dict) but the Python loop walks: counts its lookups."""

    gets = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountingDict.gets += 1
        return super().get(key, default)


def test_the_compiled_walk_falls_back_to_the_python_walk_on_a_refusal() -> None:
    tree = RadixTree(CacheConfig(mamba_radix_cache_strategy="no_buffer"), walk="compiled")
    tree.insert(RadixKey([1, 2, 3]), torch.arange(3), 1)
    tree.insert(RadixKey([1, 2, 3, 4, 5]), torch.arange(5), 2)
    node = tree.root.children[1]
    node.children = CountingDict(node.children)
    key = RadixKey([1, 2, 3, 4, 5, 6])
    CountingDict.gets = 0
    on = tree.walk(key)
    assert CountingDict.gets == 1  # the Python loop ran
    off = choose_walk(1, "scratch")[1](key.token_ids, None, tree.root, len(key))
    assert (on.path, on.pos, on.partial) == off
    assert [n.id for n in on.path] == [node.id, node.children[4].id] and (on.pos, on.partial) == (5, 0)


def test_the_walk_is_chosen_once_per_tree() -> None:
    """The compiled walk where it was built and not switched off, the scratch walk otherwise; page sizes
    above 1 always take the general loop; an explicit kind wins."""
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer")
    assert RadixTree(config).walk_kind == walks_mod.default_walk_kind()
    assert walks_mod.default_walk_kind() == ("compiled" if compiled_paths_enabled() else "scratch")
    for kind in walks_mod.WALK_KINDS:
        assert RadixTree(config, walk=kind).walk_kind == kind
        assert RadixTree(CacheConfig(page_size=4), walk=kind).walk_kind == "general"
    with pytest.raises(InvalidArgument, match="walk must be one of"):
        RadixTree(config, walk="fast")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------- whole trees
op_st = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=30)),
    st.tuples(st.just("match"), st.lists(st.integers(0, 3), max_size=36)),
    st.tuples(st.just("walk"), st.lists(st.integers(0, 3), max_size=36)),
    st.tuples(st.just("evict"), st.integers(0, 12), st.integers(0, 2)),
)


def _snapshot(tree: RadixTree) -> list[tuple[object, ...]]:
    return sorted(
        (
            node.id,
            -1 if node.parent is None else node.parent.id,
            tuple(node.key),
            tuple(node.value.tolist()),
            node.mamba_slot,
            node.depth,
            node.last_access,
            node.mamba_last_access,
            tuple(sorted((k, c.id) for k, c in node.children.items())),
        )
        for node in tree.nodes()
    )


def _run(
    ops: list[tuple[Any, ...]], c_on: bool, scratch_tokens: int | None
) -> tuple[list[object], list[tuple[object, ...]]]:
    """Apply ``ops`` to a fresh tree with the compiled walk or the scratch walk: what each returned, and
    the tree. ``scratch_tokens``: a smaller scratch buffer, so that longer keys take the long-key path (the
    general loop when the compiled one is off)."""
    out: list[object] = []
    with pytest.MonkeyPatch.context() as patch:
        if scratch_tokens is not None:
            patch.setattr(walks_mod, "SCRATCH_TOKENS", scratch_tokens)  # read when the walk is built
        tree = RadixTree(
            CacheConfig(mamba_radix_cache_strategy="no_buffer"), walk="compiled" if c_on else "scratch"
        )
    slot = 1
    for op in ops:
        if op[0] == "insert":
            kv = torch.tensor([100 * (i + 1) + t for i, t in enumerate(op[1])], dtype=torch.int64)
            r = tree.insert(RadixKey(op[1]), kv, slot)
            out.append((r.prefix_len, r.mamba_exists, r.node.id, r.duplicate_kv.tolist(), r.capped_slots))
            slot += 1
        elif op[0] == "match":
            m = tree.match(RadixKey(op[1]))
            out.append((m.best.id, m.hit_len, m.full_kv_hit_len, m.device_indices.tolist()))
        elif op[0] == "walk":
            w = tree.walk(RadixKey(op[1]))
            out.append(([n.id for n in w.path], w.pos, w.partial, w.version))
        else:
            freed = tree.evict(num_tokens=op[1], num_states=op[2])
            out.append(([kv.tolist() for kv in freed.kv], freed.slots, freed.num_tokens, freed.num_states))
    return out, _snapshot(tree)


@given(ops=st.lists(op_st, min_size=1, max_size=25), scratch_tokens=st.none() | st.integers(1, 12))
def test_whole_tree_operations_are_the_same_with_the_c_walk_on_and_off(
    ops: list[tuple[Any, ...]], scratch_tokens: int | None
) -> None:
    assert _run(ops, True, scratch_tokens) == _run(ops, False, scratch_tokens)


@pytest.mark.parametrize(
    ("environ", "enabled"),
    [
        ({}, True),
        ({"MAMBA_RADIX_C": "0"}, False),
        ({"MAMBA_RADIX_C": "1"}, True),
    ],
)
def test_one_switch_for_the_compiled_paths(environ: dict[str, str], enabled: bool) -> None:
    assert compiled_paths_enabled(environ) is enabled


def test_a_bad_switch_value_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="MAMBA_RADIX_C='yes' is not a switch"):
        compiled_paths_enabled({"MAMBA_RADIX_C": "yes"})
