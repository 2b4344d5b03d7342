"""The tree's walk loops, one chosen per tree at construction (:func:`choose_walk`).

A walk follows ``tokens[:num_tokens]`` down from a node, read-only, and returns (the fully matched nodes
top-down, then the node matched in part if any; the tokens the fully matched nodes cover; the tokens
matched into the last node's edge, 0 if none). With ``page_size > 1`` only whole pages match. Edges are
compared with ``memcmp``, never token by token in Python.

Three implementations, one result (each is checked against the next by a property test):

- ``general`` (:class:`GeneralWalk`): any page size, namespace and key length, the reference
  (``property_tests/test_tree_walk_fast.py`` checks it against a plain walk over lists too). A key that
  fits the walk's scratch buffer is copied there once and compared in place; a longer one edge by edge
  (:func:`~mamba_radix.token_ids.prefix_len_in`, numpy in place on long edges).
- ``scratch`` (:class:`ScratchWalk`): the common case, page size 1 and no namespace, in Python
  (:func:`walk_in_scratch`): one bound ``startswith`` per whole edge and no page or namespace arithmetic.
  A namespaced key, or one longer than the scratch buffer, takes the general loop.
- ``compiled`` (:class:`CompiledWalk`): the same loop in C (``mamba_radix._cwalk``, built from
  ``mamba_radix/_cwalk.c`` by ``pip install`` where a C compiler is found), comparing in the key's own
  buffer: no copy, any key length. On a large tree the Python loop's interpreter work per node dominates
  a match. Input outside its contract (a ``TypeError``, nothing changed) and namespaced keys take the
  scratch walk (``property_tests/test_tree_walk_c.py`` checks the two agree).

The default (:func:`default_walk_kind`) is ``compiled`` when the extension imported and
:mod:`mamba_radix.native`'s switch allows it (read once, at import), else ``scratch``; a tree with
``page_size > 1`` always takes the general loop. Each walk owns a scratch buffer (no allocation per
walk), so a tree is not safe to walk from two threads at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from mamba_radix.errors import InvalidArgument
from mamba_radix.native import compiled_paths_enabled
from mamba_radix.node import TreeNode, child_key
from mamba_radix.token_ids import TokenIds, prefix_len_bytes, prefix_len_in

try:  # the compiled page-1 loop: optional (setup.py builds it where a C compiler is found)
    from mamba_radix._cwalk import walk_in_scratch as _c_walk_in_scratch
except ImportError:  # not built (no compiler at install time) or built for another Python
    _c_walk_in_scratch = None

__all__ = [
    "SCRATCH_TOKENS",
    "WALK_KINDS",
    "CompiledWalk",
    "GeneralWalk",
    "ScratchWalk",
    "WalkFn",
    "WalkKind",
    "choose_walk",
    "default_walk_kind",
    "walk_in_scratch",
]

WalkKind = Literal["compiled", "scratch", "general"]
WALK_KINDS: tuple[WalkKind, ...] = ("compiled", "scratch", "general")
# (tokens, extra_key, start node, num_tokens) -> (path, pos, partial)
WalkFn = Callable[[TokenIds, str | None, TreeNode, int], tuple[list[TreeNode], int, int]]

# Tokens of a walk's scratch buffer (256 KiB, one per tree, reused). Read when a walk is built (a property
# test shrinks it so that short keys take the long-key path).
SCRATCH_TOKENS = 32768

# Whether the compiled loop imported and MAMBA_RADIX_C allowed it at import.
_COMPILED = _c_walk_in_scratch is not None and compiled_paths_enabled()


def default_walk_kind() -> WalkKind:
    """``compiled`` when the extension imported and ``MAMBA_RADIX_C`` was not 0 at import, else
    ``scratch``. O(1)."""
    return "compiled" if _COMPILED else "scratch"


def choose_walk(page_size: int, kind: WalkKind | None = None) -> tuple[WalkKind, WalkFn]:
    """The walk a tree with ``page_size`` takes: ``kind`` (default :func:`default_walk_kind`) for page
    size 1, the general loop for any other. Returns the kind in force and the walk function. Raises
    :class:`InvalidArgument` for an unknown kind, or ``compiled`` when the extension was not built."""
    kind = default_walk_kind() if kind is None else kind
    if kind not in WALK_KINDS:
        raise InvalidArgument(f"walk must be one of {', '.join(WALK_KINDS)}, got {kind!r}")
    general = GeneralWalk(page_size)
    if page_size != 1 or kind == "general":
        return "general", general.walk
    scratch = ScratchWalk(general)
    if kind == "scratch":
        return "scratch", scratch.walk
    if _c_walk_in_scratch is None:
        raise InvalidArgument("walk='compiled' but mamba_radix._cwalk was not built (no C compiler)")
    return "compiled", CompiledWalk(scratch).walk


class GeneralWalk:
    """The reference loop: any page size, namespace and key length. O(num_tokens + path)."""

    __slots__ = ("page_size", "scratch")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.scratch = bytearray(SCRATCH_TOKENS * 8)

    def walk(
        self, tokens: TokenIds, extra_key: str | None, node: TreeNode, num_tokens: int
    ) -> tuple[list[TreeNode], int, int]:
        page = self.page_size
        path: list[TreeNode] = []
        if num_tokens == 0 or not node.children:
            return path, 0, 0
        child = node.children.get(child_key(tokens, 0, page, extra_key))
        if child is None:  # a miss at the first edge: no bytes needed
            return path, 0, 0
        view = memoryview(tokens)[:num_tokens]
        # A key that fits the scratch buffer is copied into it once (no allocation) and every edge is
        # compared there in place; a longer one edge by edge (prefix_len_in: numpy in place on long edges)
        scratch = self.scratch
        nbytes = num_tokens * 8
        haystack: bytearray | None = None
        if nbytes <= len(scratch):
            memoryview(scratch)[:nbytes] = view.cast("B")
            haystack = scratch
        pos = 0
        while True:
            edge = child.key
            n = len(edge)
            # the common case inline: the whole edge matches (one memcmp, no call); else find where not
            if haystack is None or pos + n > num_tokens or not haystack.startswith(edge, pos * 8, nbytes):
                n = (
                    prefix_len_in(edge, view, pos, scratch)
                    if haystack is None
                    else prefix_len_bytes(edge, haystack, pos, num_tokens)
                )
                if page > 1:
                    n -= n % page
                path.append(child)
                if n < len(edge):
                    return path, pos, n
            else:
                path.append(child)
            pos += n
            if pos >= num_tokens or not child.children:
                return path, pos, 0
            # the next edge's child key, as child_key makes it (a page's bytes: a short tail never matches)
            first = tokens[pos] if page == 1 else view[pos : pos + page].tobytes()
            child = child.children.get(first if extra_key is None else (extra_key, first))
            if child is None:
                return path, pos, 0


class ScratchWalk:
    """Page size 1: a key without a namespace that fits the scratch buffer takes :func:`walk_in_scratch`,
    any other the general loop. O(num_tokens + path)."""

    __slots__ = ("general", "scratch")

    def __init__(self, general: GeneralWalk) -> None:
        self.general = general.walk
        self.scratch = general.scratch  # one buffer per tree

    def walk(
        self, tokens: TokenIds, extra_key: str | None, node: TreeNode, num_tokens: int
    ) -> tuple[list[TreeNode], int, int]:
        nbytes = num_tokens * 8
        if extra_key is not None or nbytes > len(self.scratch):
            return self.general(tokens, extra_key, node, num_tokens)
        child = node.children.get(tokens[0]) if num_tokens else None
        if child is None:  # a miss at the first edge: no bytes needed
            return [], 0, 0
        scratch = self.scratch
        memoryview(scratch)[:nbytes] = memoryview(tokens)[:num_tokens].cast("B")
        return walk_in_scratch(scratch, tokens, child, num_tokens, [])


class CompiledWalk:
    """Page size 1, the compiled loop: a key without a namespace is compared in its own buffer (it holds
    the first ``num_tokens`` tokens, all the loop asks of its scratch argument); a namespaced key, or input
    the loop refuses (``TypeError``, the path untouched), takes the scratch walk. O(num_tokens + path)."""

    __slots__ = ("fallback",)

    def __init__(self, fallback: ScratchWalk) -> None:
        self.fallback = fallback.walk

    def walk(
        self, tokens: TokenIds, extra_key: str | None, node: TreeNode, num_tokens: int
    ) -> tuple[list[TreeNode], int, int]:
        if extra_key is None:
            path: list[TreeNode] = []
            child = node.children.get(tokens[0]) if num_tokens else None
            if child is None:
                return path, 0, 0
            try:
                return _c_walk_in_scratch(tokens, tokens, child, num_tokens, path)  # type: ignore[misc]
            except TypeError:  # outside the C loop's contract (path left as it was): the Python loops
                pass
        return self.fallback(tokens, extra_key, node, num_tokens)


def walk_in_scratch(
    scratch: bytearray, tokens: TokenIds, child: TreeNode, num_tokens: int, path: list[TreeNode]
) -> tuple[list[TreeNode], int, int]:
    """The page-1 loop in Python, the reference of the compiled one: page size 1, no namespace, the key's
    first ``num_tokens`` tokens already copied into ``scratch``; ``child`` is the first edge's node (its
    first token matched). Appends to ``path`` and returns it. O(num_tokens + path)."""
    startswith = scratch.startswith
    append = path.append
    nbytes = num_tokens * 8
    pos = 0
    while True:
        edge = child.key
        end = pos + len(edge)
        append(child)
        if end > num_tokens or not startswith(edge, pos * 8, nbytes):
            # the first mismatch is inside this edge (or the key ends there): always a partial match
            return path, pos, prefix_len_bytes(edge, scratch, pos, num_tokens)
        if end == num_tokens:
            return path, end, 0
        children = child.children
        if not children:
            return path, end, 0
        child = children.get(tokens[end])  # type: ignore[assignment]
        if child is None:
            return path, end, 0
        pos = end
