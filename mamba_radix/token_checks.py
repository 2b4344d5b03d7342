"""The token-list check of the request lifecycle: the pure-Python reference and its compiled fast path.

A request's prompt and each sampled token are checked once, at the lifecycle's public edge, into an
int64 ``array('q')`` that hand-over keys are later cut from (:mod:`mamba_radix.lifecycle`).
:func:`check_token_list_reference` decides every input and raises every error. The compiled
``pack_int64`` (``mamba_radix/_ctokens.c``, optional: setup.py builds it where a C compiler is found)
takes only the common case, a list of exact ints in int64 range, and hands anything else back to the
reference, so the two accept and refuse exactly alike (``property_tests/test_token_check_c.py``).

Which of the two runs is chosen once, when a lifecycle is built (:func:`make_token_check`), never on the
check's path: the checking code reads like the reference.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable

from mamba_radix.errors import InvalidArgument
from mamba_radix.native import compiled_paths_enabled

try:  # the compiled token check: optional (setup.py builds it where a C compiler is found)
    from mamba_radix._ctokens import pack_int64 as _c_pack_int64
except ImportError:  # not built (no compiler at install time) or built for another Python
    _c_pack_int64 = None

__all__ = ["TokenCheck", "check_token_list_reference", "compiled_token_check_built", "make_token_check"]

# check(tokens, what) -> the tokens as a new int64 array('q'); raises InvalidArgument naming ``what``
TokenCheck = Callable[[object, str], array]


def check_token_list_reference(tokens: object, what: str) -> array:
    """A list of ints in int64 range, returned as an int64 ``array('q')`` (the validated copy the keys are
    cut from). O(len), at C speed: ``struct.pack`` refuses floats, None, strings and overflow (~6 ns a
    token, 2.5x faster than ``array('q', list)``), then one ``memcpy`` into the array. Takes bools (as 1
    and 0), int subclasses and objects with ``__index__`` (numpy integers) as the ints they stand for.
    An ``array('q')`` holds int64 values by construction: it is copied with one ``memcpy``, unchecked (a
    caller that has its tokens in one, such as the simulator, builds no Python list). Raises
    :class:`InvalidArgument` naming ``what`` for anything else. No side effects.

    The reference: it decides every list and raises every error; the compiled check only skips it for
    the lists it takes."""
    if type(tokens) is array and tokens.typecode == "q":
        return tokens[:]  # a copy (a slice of an array is a new array: one memcpy)
    if not isinstance(tokens, list):
        raise InvalidArgument(
            f"{what} must be a list of int token ids or an array('q'), got {type(tokens).__name__}"
        )
    ids = array("q")
    if tokens:
        try:
            ids.frombytes(struct.pack(f"{len(tokens)}q", *tokens))
        except (struct.error, TypeError, ValueError, OverflowError) as exc:
            # struct's own refusals, and whatever an item's __index__ raises (a typed error either way)
            raise InvalidArgument(f"{what} must hold int token ids in int64 range: {exc}") from None
    return ids


def compiled_token_check_built() -> bool:
    """Whether the compiled ``pack_int64`` was built and imported. O(1)."""
    return _c_pack_int64 is not None


def make_token_check(compiled: bool | None = None) -> TokenCheck:
    """The token check a new lifecycle uses: the compiled fast path when it was built and ``compiled``
    (None: :func:`mamba_radix.native.compiled_paths_enabled`, ``MAMBA_RADIX_C`` read now), else
    :func:`check_token_list_reference` itself. Either gives the reference's result and errors. O(1)."""
    if compiled is None:
        compiled = compiled_paths_enabled()
    pack = _c_pack_int64 if compiled else None
    if pack is None:
        return check_token_list_reference
    reference = check_token_list_reference

    def check_token_list_compiled(tokens: object, what: str) -> array:
        """:func:`check_token_list_reference`'s result and errors, faster: a list of exact ints in int64
        range (and bools) is packed by the compiled ``pack_int64`` (about 1.6 ns a token on a list in
        cache against 9 for the reference; about half the reference's time on one that is not); any other
        input, valid or not, goes to the reference, which accepts or refuses it. O(len), no side
        effects."""
        ids = pack(tokens)
        return ids if ids is not None else reference(tokens, what)

    return check_token_list_compiled
