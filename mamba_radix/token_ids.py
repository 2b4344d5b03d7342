"""Token ids in one C buffer (:class:`TokenIds`) and the comparisons the tree's walk runs on them.

The tree keeps every edge's tokens as int64 in one buffer, so a slice is one ``memcpy`` and two keys are
compared with ``memcmp`` (``bytes.startswith``), never token by token in Python. Each fast comparison keeps
its plain-Python reference (:func:`common_prefix_len_reference`), and ``property_tests/test_tree_keys.py``
checks them against it with the thresholds below shrunk so that short keys reach every path.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import numpy as np

__all__ = [
    "TokenIds",
    "as_token_ids",
    "common_prefix_len",
    "common_prefix_len_reference",
    "key_slice",
    "prefix_len_bytes",
    "prefix_len_in",
]

# Below this many tokens the mismatch search compares token by token: one Python step costs about as
# much as a memcmp of a few hundred bytes, so halving further does not pay.
_LINEAR_TOKENS = 8
_TOKEN_BYTES = 8  # int64
# prefix_len_in's thresholds (module constants so the property test can shrink them to reach every path):
# from how many tokens numpy compares zero-copy views instead of a scratch copy and memcmp (measured per
# 1M tokens: 0.33 ms in place, 0.6 ms copy and compare), and tokens per numpy chunk (a 64 KiB mask).
_NUMPY_MIN_TOKENS = 32768
_NUMPY_CHUNK_TOKENS = 65536


class TokenIds(array):
    """Token ids as one C buffer of int64 (an ``array('q')``): the form the tree keeps keys in.

    Why: a slice copies with one ``memcpy`` and the tree compares keys with ``memcmp`` (see
    :func:`prefix_len_in`), where a tuple of Python ints costs a pointer chase and an int compare per
    token; and the garbage collector never traverses it. It is a sequence of ints (``len``, indexing,
    iteration, ``tuple(...)``, ``np.asarray``) that compares equal to a tuple, list or array of the same
    ints, so code written against tuple keys keeps working. Two differences from a tuple: it is not
    hashable (it is mutable; the tree never mutates a key in place), and a slice is a plain
    ``array('q')``, which compares equal to arrays only. Build one with :func:`as_token_ids`.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, array):
            return array.__eq__(self, other)  # memcmp for two int64 arrays of one length
        if isinstance(other, (tuple, list)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # mutable, like array

    def __copy__(self) -> TokenIds:  # array's copy would return a plain array('q')
        return TokenIds("q", self)

    def __deepcopy__(self, memo: dict[int, object]) -> TokenIds:
        return TokenIds("q", self)


def as_token_ids(tokens: Sequence[int] | array | memoryview) -> TokenIds:
    """``tokens`` as a fresh :class:`TokenIds` (never shared with the caller, who may change theirs).

    No validation beyond the conversion's own. An int64 ``array('q')`` (a :class:`TokenIds` too) or a
    C-contiguous 1-D int64 buffer (a numpy array, a ``memoryview``) is copied with one ``memcpy``
    (about 0.2 ns per token); a list or tuple of Python ints goes through ``struct.pack`` (7-20 ns per
    token, half of ``array('q', list)``'s); any other sequence item by item. Raises ``TypeError`` for a
    non-int and ``OverflowError`` beyond int64. O(len).
    """
    if isinstance(tokens, array) and tokens.typecode == "q":
        return TokenIds("q", tokens)
    if isinstance(tokens, (list, tuple)):
        out = TokenIds("q")
        if tokens:
            try:  # struct.pack converts about twice as fast as array's item-by-item path
                out.frombytes(struct.pack(f"{len(tokens)}q", *tokens))
            except struct.error:  # not ints, or beyond int64: array's conversion says which, precisely
                return TokenIds("q", tokens)
        return out
    if isinstance(tokens, range):
        return TokenIds("q", tokens)
    try:
        view = memoryview(tokens)  # type: ignore[arg-type]
    except TypeError:
        return TokenIds("q", tokens)
    if view.ndim == 1 and view.itemsize == _TOKEN_BYTES and view.format in ("q", "l") and view.c_contiguous:
        out = TokenIds("q")
        out.frombytes(view.cast("B"))
        return out
    return TokenIds("q", view.tolist())


# Up to this many tokens key_slice slices the array and copies the slice (two memcpy of at most 32 KiB,
# ~0.2 us); a longer slice is copied once through a memoryview (a second fresh buffer that size would
# page-fault in).
_SLICE_COPY_TOKENS = 4096


def key_slice(tokens: TokenIds | array, start: int, stop: int) -> TokenIds:
    """``tokens[start:stop]`` (an int64 array) as a fresh :class:`TokenIds`. O(stop - start)."""
    if stop - start <= _SLICE_COPY_TOKENS:
        return TokenIds("q", tokens[start:stop])
    out = TokenIds("q")
    out.frombytes(memoryview(tokens)[start:stop].cast("B"))
    return out


def prefix_len_bytes(
    node_key: TokenIds | array | memoryview, haystack: bytes | bytearray, start: int, end: int | None = None
) -> int:
    """Length of the common prefix of ``node_key`` and the tokens ``haystack`` holds in ``[start, end)``
    (``haystack``: int64 bytes, ``tokens.tobytes()`` or a scratch buffer; ``end`` in tokens, the whole
    haystack by default). Equal to :func:`common_prefix_len_reference` (a property test checks it).

    No copy: ``startswith`` compares the key's buffer (or a ``memoryview`` window of it) in place with
    ``memcmp``. A whole-edge match is one call; a mismatch is found by halving the window still in
    doubt, then token by token over the last few. O(n) bytes compared, O(log n) Python steps.
    """
    total = len(haystack) // _TOKEN_BYTES if end is None else end
    n = min(len(node_key), total - start)
    if n <= 0:
        return 0
    offset, stop = start * _TOKEN_BYTES, total * _TOKEN_BYTES
    whole = node_key if n == len(node_key) else memoryview(node_key)[:n]
    if haystack.startswith(whole, offset, stop):
        return n
    view = memoryview(node_key)
    lo, hi = 0, n  # key[:lo] matches; key[lo:hi] holds the first mismatch
    while hi - lo > _LINEAR_TOKENS:
        mid = (lo + hi) // 2
        if haystack.startswith(view[lo:mid], offset + lo * _TOKEN_BYTES, stop):
            lo = mid
        else:
            hi = mid
    while haystack.startswith(view[lo : lo + 1], offset + lo * _TOKEN_BYTES, stop):
        lo += 1
    return lo


def prefix_len_in(
    node_key: TokenIds | array, tokens: memoryview, start: int, scratch: bytearray | None = None
) -> int:
    """Length of the common prefix of ``node_key`` and ``tokens[start:]``; ``tokens``: a ``memoryview`` of
    an int64 array. The fast path of :func:`common_prefix_len` for one edge of a long key, equal to
    :func:`common_prefix_len_reference` (a property test checks it).

    Nothing is allocated per call: a fresh buffer of more than 64 KiB page-faults its way in (glibc
    maps it, or trims it off the heap when freed), and on this kind of VM a fault costs about 6 us, far
    more than comparing the page. So an overlap shorter than :data:`_NUMPY_MIN_TOKENS` tokens is copied
    into ``scratch`` (a reused buffer of at least that many int64s; one is allocated if it is missing
    or too small) and compared there by :func:`prefix_len_bytes`; a longer one is compared in place by
    numpy on zero-copy views of both buffers, in chunks of :data:`_NUMPY_CHUNK_TOKENS` (one small mask
    each), ``argmin`` finding the first mismatch. O(n) (n = the shorter length).
    """
    n = min(len(node_key), len(tokens) - start)
    if n <= 0:
        return 0
    if n >= _NUMPY_MIN_TOKENS:
        key = np.frombuffer(node_key, dtype=np.int64, count=n)
        ids = np.frombuffer(tokens, dtype=np.int64, count=n, offset=start * _TOKEN_BYTES)
        i = 0
        while i < n:
            j = min(i + _NUMPY_CHUNK_TOKENS, n)
            same = key[i:j] == ids[i:j]
            if not same.all():
                return i + int(same.argmin())
            i = j
        return n
    nbytes = n * _TOKEN_BYTES
    if scratch is None or len(scratch) < nbytes:
        scratch = bytearray(nbytes)
    memoryview(scratch)[:nbytes] = tokens[start : start + n].cast("B")
    return prefix_len_bytes(node_key, scratch, 0, n)


def common_prefix_len(node_key: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``node_key`` and ``tokens[start:]``, for any two int sequences.

    Converts what is not int64 already (O(len) at C speed for arrays, item by item for Python ints)
    and runs :func:`prefix_len_in`, which the tree's walk calls directly. O(n).
    """
    key = node_key if isinstance(node_key, array) and node_key.typecode == "q" else as_token_ids(node_key)
    ids = tokens if isinstance(tokens, array) and tokens.typecode == "q" else as_token_ids(tokens)
    return prefix_len_in(key, memoryview(ids), start)


def common_prefix_len_reference(node_key: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """The reference: the same length, one token at a time in plain Python. O(n); kept for the property
    test that checks :func:`prefix_len_in` (the path the tree runs) against it."""
    n = 0
    limit = min(len(node_key), len(tokens) - start)
    while n < limit and node_key[n] == tokens[start + n]:
        n += 1
    return n
