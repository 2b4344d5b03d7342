"""Token sequences that make a radix tree work hard, and how to build them from earlier ones.

Random sequences over a large vocabulary share no prefixes, so a tree fed with them never splits, branches
or hits. The suite instead draws tokens from a tiny alphabet and builds most new sequences as
``earlier[:cut] + suffix``, where ``earlier`` comes from a Hypothesis ``Bundle`` of sequences already used.
A cut inside an earlier sequence makes a mid-edge split likely, a cut at a node boundary a branch point,
and ``cut == len(earlier)`` with an empty suffix an exact repeat. Cuts shrink towards 0 and suffixes
towards ``[]``, so a shrunk failure shows the shortest sequences that still fail.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

__all__ = ["ALPHABET", "MAX_SUFFIX", "build_sequence", "cuts", "suffixes"]

ALPHABET = 3  # tokens 0..2: three symbols already give branches at almost every depth
MAX_SUFFIX = 10


def suffixes(max_size: int = MAX_SUFFIX) -> st.SearchStrategy[list[int]]:
    """New tokens to append after a cut."""
    return st.lists(st.integers(0, ALPHABET - 1), max_size=max_size)


def cuts() -> st.SearchStrategy[int]:
    """Where to cut an earlier sequence; clamped to its length by :func:`build_sequence`."""
    return st.integers(0, 64)


def build_sequence(
    base: Sequence[int], cut: int, suffix: Sequence[int], *, max_len: int, multiple_of: int = 1
) -> tuple[int, ...]:
    """``base[:cut] + suffix``, at most ``max_len`` long and trimmed to a multiple of ``multiple_of``. O(len)."""
    tokens = (tuple(base[: min(cut, len(base))]) + tuple(suffix))[:max_len]
    return tokens[: len(tokens) - len(tokens) % multiple_of]
