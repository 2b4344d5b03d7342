"""``replace_first`` (the re-key of a candidate set's front entry, which the lazy-stamp index does when a
touched node reaches the front) on both candidate-set forms, against a sorted list of the members: the
lazy set pops the old front key instead of marking it dead, and must still hold the same members in the
same order as the eager set after any mix of adds, removals (dead keys included), queries and re-keys."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix.candidates import KeySet, LazyKeySet

op_st = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 20)),
    st.tuples(st.just("remove"), st.integers(0, 20)),
    st.tuples(st.just("rekey_first"), st.integers(1, 50)),  # the front member's stamp moves up by this much
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op_st, max_size=60), compact_from=st.integers(0, 3))
def test_replace_first_keeps_both_forms_equal_to_the_model(ops, compact_from):
    lazy, eager = LazyKeySet(compact_min_dead=compact_from), KeySet()
    model: dict[int, tuple[int, int]] = {}  # id -> its key (stamp, id)
    for clock, (op, arg) in enumerate(ops, start=1):
        if op == "add" and arg not in model:
            model[arg] = (clock, arg)
            lazy.add(model[arg])
            eager.add(model[arg])
        elif op == "remove" and model:
            victim = sorted(model)[arg % len(model)]
            lazy.remove(model[victim])
            eager.remove(model.pop(victim))
        elif op == "rekey_first" and model:
            front = min(model.values())
            assert lazy.first() == eager.first() == front
            new = (front[0] + arg + clock, front[1])  # a later stamp, as a touch gives
            lazy.replace_first(new)
            eager.replace_first(new)
            model[front[1]] = new
        want = sorted(model.values())
        assert lazy.keys() == eager.keys() == want
        assert len(lazy) == len(eager) == len(want)
        assert lazy.first() == eager.first() == (want[0] if want else None)
