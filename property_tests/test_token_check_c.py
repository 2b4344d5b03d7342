"""The compiled token-list check (``mamba_radix._ctokens``, issue 12: a compiled core keeps the pure-Python
path as the reference and a test checks the two agree) against ``check_token_list_reference``
(:mod:`mamba_radix.token_checks`).

- the check :func:`make_token_check` chooses with the compiled path on and the reference alone, on random
  lists mixing valid
  ints (the whole int64 range, its bounds, CPython's one-digit and multi-digit ints), bools, numpy
  integers (in and out of range), floats, None, strings, ints past int64, int subclasses and objects whose
  ``__index__`` returns, overflows or raises: the same ``array('q')`` or the same exception type and
  message;
- ``pack_int64`` itself: it takes every list of exact ints in range and bools (so the fast path is really
  the one that runs), and hands back (None) every list holding anything else, and every non-list;
- a list resized by a finaliser while the array is allocated, references (nothing leaked);
- the choice is made once, when a lifecycle is built (``compiled_token_check``, default ``MAMBA_RADIX_C``),
  never by a global switch on the check's path;
- admission: a bad prompt or output list is refused with the same error and message, the cache unchanged,
  with the compiled check on and off.

Skipped when the extension was not built (no C compiler at install time): the reference is then the only
check, and the admission tests elsewhere cover it.
"""

from __future__ import annotations

import gc
import sys
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, InvalidArgument, MambaRadixCache, Req
from mamba_radix.lifecycle import RequestLifecycle
from mamba_radix.native import ENV
from mamba_radix.token_checks import (
    check_token_list_reference,
    compiled_token_check_built,
    make_token_check,
)

ctokens = pytest.importorskip("mamba_radix._ctokens", reason="the compiled token check was not built")
pack_int64 = ctokens.pack_int64

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
WHAT = "request 'r': origin_input_ids"


class SubInt(int):
    """An int subclass whose ``__index__`` lies: the reference reads the int's own value, never calls it."""

    def __index__(self) -> int:
        return 99


class Indexable:
    """Not an int, but ``__index__`` makes it one (as numpy integers do): the reference takes its result."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __index__(self) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value

    def __repr__(self) -> str:
        return f"Indexable({self.value!r})"


# the two checks a lifecycle can be built with: the compiled fast path (built: the importorskip above)
# and the reference alone
compiled_check = make_token_check(True)
reference_check = make_token_check(False)


def test_the_choice_is_made_at_construction() -> None:
    assert compiled_token_check_built()
    assert reference_check is check_token_list_reference
    assert compiled_check is not check_token_list_reference
    cache = MambaRadixCache.build(CacheConfig(), num_tokens=16, num_slots=4, max_context_len=16)
    for on in (True, False):
        lifecycle = RequestLifecycle(cache, compiled_token_check=on)
        assert (lifecycle.check_tokens is check_token_list_reference) is not on
    for value, compiled in (("1", True), ("0", False)):  # the default: MAMBA_RADIX_C, read at construction
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV, value)
            assert (make_token_check() is check_token_list_reference) is not compiled
            assert (RequestLifecycle(cache).check_tokens is check_token_list_reference) is not compiled


def check_for(on: bool) -> Any:
    return compiled_check if on else reference_check


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    """A call's result as something comparable: ('ok', type code, values) or ('raised', type, message)."""
    try:
        ids = call(*args)
    except Exception as exc:  # the type and message are what is compared
        return ("raised", type(exc), str(exc))
    assert type(ids) is array
    return ("ok", ids.typecode, ids.tolist())


BOUNDS = [INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1]
# exact ints the C loop reads digit by digit or through PyLong_AsLongLongAndOverflow: small (cached),
# one 30-bit digit, two and three digits, the int64 bounds and their neighbours
int64_st = (
    st.integers(-300, 300)
    | st.integers(INT64_MIN, INT64_MAX)
    | st.sampled_from([0, 1, -1, 2**30 - 1, 2**30, -(2**30), 2**31, 2**60, -(2**62), *BOUNDS])
)
valid_item_st = int64_st | st.booleans()
# items the C loop must hand back; the reference takes some (int subclasses, numpy ints, __index__) and
# refuses others (floats, None, strings, overflow), or raises what __index__ raises
odd_item_st = st.one_of(
    st.builds(SubInt, int64_st),
    st.builds(np.int64, int64_st),
    st.builds(np.int32, st.integers(-(2**31), 2**31 - 1)),
    st.builds(np.uint64, st.sampled_from([0, 7, 2**63 - 1, 2**63, 2**64 - 1])),
    st.sampled_from([np.True_, np.False_]),
    st.floats(allow_nan=True),
    st.just(None),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.integers(INT64_MAX + 1, 2**100) | st.integers(-(2**100), INT64_MIN - 1),
    st.builds(Indexable, int64_st | st.sampled_from([2**63, -(2**63) - 1, 1.5, "7"])),
    st.sampled_from([Indexable(ValueError("no index")), Indexable(OverflowError("too big"))]),
    st.builds(complex, st.integers(-3, 3)),
    st.sampled_from([[1], (1,), {1}, object()]),
)
# mostly valid lists (so some mixed ones are refused late, past many good items), some with odd items
mixed_list_st = st.lists(valid_item_st, max_size=40) | st.lists(
    st.one_of(valid_item_st, odd_item_st), max_size=40
)


@given(tokens=mixed_list_st)
def test_compiled_check_agrees_with_the_reference(tokens: list[Any]) -> None:
    fast = outcome(compiled_check, list(tokens), WHAT)
    slow = outcome(reference_check, list(tokens), WHAT)
    assert fast == slow == outcome(check_token_list_reference, list(tokens), WHAT)


@given(tokens=st.lists(valid_item_st, max_size=60))
def test_exact_ints_and_bools_take_the_compiled_path(tokens: list[Any]) -> None:
    ids = pack_int64(tokens)
    assert type(ids) is array and ids.typecode == "q"
    assert ids.tolist() == [int(t) for t in tokens] == check_token_list_reference(tokens, WHAT).tolist()


@given(
    head=st.lists(valid_item_st, max_size=20),
    odd=odd_item_st,
    tail=st.lists(valid_item_st, max_size=20),
)
def test_any_other_item_is_handed_back(head: list[Any], odd: Any, tail: list[Any]) -> None:
    assert pack_int64([*head, odd, *tail]) is None


def test_the_int64_bounds_and_a_long_prompt() -> None:
    assert pack_int64([INT64_MIN, INT64_MAX, True, False, -1, 0]).tolist() == [
        INT64_MIN,
        INT64_MAX,
        1,
        0,
        -1,
        0,
    ]
    assert pack_int64([INT64_MAX + 1]) is None and pack_int64([INT64_MIN - 1]) is None
    assert pack_int64([]) == array("q")
    prompt = list(range(-6000, 6000)) + [2**40 + i for i in range(100)]
    assert pack_int64(prompt) == check_token_list_reference(prompt, WHAT) == array("q", prompt)


@pytest.mark.parametrize(
    "tokens", [(1, 2), range(3), array("i", [1]), array("l", [1]), np.arange(3), "12", None, {1: 2}]
)
def test_non_lists_are_handed_back(tokens: Any) -> None:
    assert pack_int64(tokens) is None
    for check in (compiled_check, reference_check):
        with pytest.raises(InvalidArgument, match="must be a list of int token ids"):
            check(tokens, WHAT)


def test_a_list_subclass_is_handed_back_to_the_reference() -> None:
    class Reversed(list):  # the reference unpacks through __iter__: only it may decide
        def __iter__(self) -> Iterator[Any]:
            return reversed(list(super().__iter__()))

    tokens = Reversed([1, 2, 3])
    assert pack_int64(tokens) is None
    assert compiled_check(tokens, WHAT).tolist() == [3, 2, 1]


def test_a_list_resized_while_the_array_is_allocated() -> None:
    """A garbage collection during the array's allocation runs a callback that empties the list: the
    compiled check re-reads the size and hands the list back rather than read past its end."""
    tokens = list(range(1000, 1500))
    inside = [False]  # the callback acts only inside pack_int64 (a collection elsewhere is ignored)
    fired: list[int] = []

    def shrink(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and inside[0] and not fired:
            fired.append(len(tokens))
            del tokens[:]

    threshold = gc.get_threshold()
    gc.callbacks.append(shrink)
    try:
        gc.set_threshold(1)
        for _ in range(50):  # until a collection lands inside the call
            inside[0] = True
            result = pack_int64(tokens)
            inside[0] = False
            if fired:
                break
            assert result is not None and result.tolist() == tokens
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(shrink)
    assert fired == [500], "no collection ran inside pack_int64"
    assert result is None and tokens == []


def test_references_are_not_leaked() -> None:
    items = [10**12 + 5, 7, True]
    tokens = items * 100
    before = [sys.getrefcount(item) for item in items] + [sys.getrefcount(tokens)]
    for _ in range(200):
        assert pack_int64(tokens) is not None
        assert pack_int64([*tokens, 1.5]) is None
    assert [sys.getrefcount(item) for item in items] + [sys.getrefcount(tokens)] == before


# ----------------------------------------------------------------------------------------- admission
def cache_state(cache: MambaRadixCache) -> tuple:
    return (
        sorted((n.id, n.key, n.mamba_slot, n.last_access) for n in cache.tree.nodes()),
        cache.tree.clock,
        repr(cache.stats),
        cache.token_to_kv_pool_allocator.available_size(),
        cache.mamba_pool.available_size(),
        cache.req_to_token_pool.available_size(),
        cache.reserved_kv_tokens,
    )


BAD_PROMPTS: list[Any] = [
    [1, 2.5],
    [1, None, 3],
    ["7"],
    [1, 2**63],
    [-(2**63) - 1],
    [np.uint64(2**63)],
    [7, Indexable(2**63)],
    (1, 2),
    [],
]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("prompt", BAD_PROMPTS, ids=repr)
def test_admission_refuses_a_bad_prompt_as_before(on: bool, prompt: Any) -> None:
    def attempt(compiled: bool) -> tuple[Any, tuple]:
        cache = MambaRadixCache.build(
            CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True),
            num_tokens=64,
            num_slots=8,
            max_context_len=64,
        )
        cache.lifecycle = RequestLifecycle(cache, compiled_token_check=compiled)
        before = cache_state(cache)
        result = outcome(cache.admit, Req(rid="r", origin_input_ids=prompt))
        assert cache_state(cache) == before  # a refused admission changes nothing
        return result

    got = attempt(on)
    reference = attempt(False)
    assert got == reference and got[0] == "raised" and got[1] is InvalidArgument


@pytest.mark.parametrize("on", [True, False])
def test_admission_takes_good_prompts_alike(on: bool) -> None:
    config = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
    for prompt in ([5, 6, 7, True], [np.int64(5), SubInt(6), 7], [0, INT64_MAX, INT64_MIN]):
        cache = MambaRadixCache.build(config, num_tokens=64, num_slots=8, max_context_len=64)
        cache.lifecycle = RequestLifecycle(cache, compiled_token_check=on)
        req = Req(rid="r", origin_input_ids=list(prompt))
        assert cache.admit(req)
        assert cache.lifecycle.checked_tokens[req].tolist() == [int(t) for t in prompt]


@pytest.mark.parametrize("error", [ValueError("no index"), TypeError("not today"), OverflowError("too big")])
def test_an_item_whose_index_raises_is_a_typed_refusal(error: Exception) -> None:
    # whatever an item's __index__ raises comes out as InvalidArgument naming the list, on either path
    for on in (True, False):
        with pytest.raises(InvalidArgument, match="prompt must hold int token ids"):
            check_for(on)([1, Indexable(error), 3], "prompt")


def test_an_int64_array_prompt_is_taken_as_a_copy() -> None:
    # array('q') holds int64 values by construction: the reference copies it (the compiled check, which
    # takes only lists, hands it over), so a later change to the caller's array changes nothing here
    tokens = array("q", [5, -(2**63), 2**63 - 1])
    for on in (True, False):
        got = check_for(on)(tokens, WHAT)
        assert got == tokens and got is not tokens
    tokens[0] = 7
    assert got[0] == 5


@pytest.mark.parametrize(
    "bad", [2.5, None, "7", 2**63, np.uint64(2**63), Indexable(ValueError("no"))], ids=repr
)
def test_a_decode_extend_refuses_a_bad_sampled_token_alike(bad: Any) -> None:
    """The sampled tokens are checked by the lifecycle's chosen check at extend: the same refusal, the
    cache unchanged, and a good token then taken, with the compiled check on and off."""

    def attempt(compiled: bool) -> tuple[Any, list[int]]:
        cache = MambaRadixCache.build(
            CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True),
            num_tokens=64,
            num_slots=8,
            max_context_len=64,
        )
        cache.lifecycle = RequestLifecycle(cache, compiled_token_check=compiled)
        req = Req(rid="r", origin_input_ids=[1, 2, 3, 4])
        assert cache.admit(req, 4)
        cache.commit(cache.extend(req, 4))
        req.output_ids.append(bad)
        before = cache_state(cache)
        refused = outcome(cache.extend, req, 1)
        assert cache_state(cache) == before and req.pending_plan is None
        req.output_ids[-1] = 9
        cache.commit(cache.extend(req, 1))
        return refused, cache.lifecycle.checked_tokens[req].tolist()

    got, reference = attempt(True), attempt(False)
    assert got == reference and got[0][0] == "raised" and got[0][1] is InvalidArgument
    assert got[1] == [1, 2, 3, 4, 9]
