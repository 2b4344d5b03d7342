"""Shared by the index tests: two trees that must behave alike (a fast path and its reference) driven by the
same random operations, compared after each one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from hypothesis import strategies as st

from mamba_radix import RadixKey
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.policy import CachePolicy
from mamba_radix.tree import RadixTree


class GeneralPath(CachePolicy):
    """The base policy's keys through the general path (a subclass: the tree cannot assume its keys)."""

    name = "general-path"


tokens_st = st.lists(st.integers(0, 3), min_size=1, max_size=16)
tree_op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st),
    st.tuples(st.just("match"), tokens_st),
    st.tuples(st.just("lock"), st.integers(0, 50)),
    st.tuples(st.just("unlock"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.tuples(st.integers(0, 8), st.integers(0, 2))),
)


def run_twins(
    a: RadixTree,
    b: RadixTree,
    ops: Sequence[tuple[str, object]],
    state: Callable[[RadixTree], object],
) -> None:
    """Apply each of ``ops`` (drawn from :data:`tree_op_st`) to both trees: inserts of fresh KV and slots,
    matches, locks and unlocks of checkpoint holders, evictions. After each, the outcomes, ``state(tree)``
    and ``a``'s invariants must agree."""
    locked: list[tuple[object, object]] = []  # (a's node, b's node), both locked
    slot, kv = 1, 1
    for op, arg in ops:
        if op == "insert":
            tokens = list(arg)  # type: ignore[call-overload]
            value = torch.arange(kv, kv + len(tokens), dtype=torch.int64)
            kv += len(tokens)
            x = a.insert(RadixKey(tokens), value, slot)
            y = b.insert(RadixKey(tokens), value.clone(), slot)
            assert (x.prefix_len, x.mamba_exists, x.node.id) == (y.prefix_len, y.mamba_exists, y.node.id)
            slot += 1
        elif op == "match":
            x_m = a.match(RadixKey(list(arg)))  # type: ignore[call-overload]
            y_m = b.match(RadixKey(list(arg)))  # type: ignore[call-overload]
            assert (x_m.best.id, x_m.hit_len, x_m.full_kv_hit_len) == (
                y_m.best.id,
                y_m.hit_len,
                y_m.full_kv_hit_len,
            )
        elif op == "lock":
            holders = [n for n in a.nodes() if n.mamba_slot is not None]
            if holders:
                node = holders[int(arg) % len(holders)]  # type: ignore[call-overload]
                twin = next(n for n in b.nodes() if n.id == node.id)
                a.inc_lock_ref(node)
                b.inc_lock_ref(twin)
                locked.append((node, twin))
        elif op == "unlock":
            if locked:
                node, twin = locked.pop(int(arg) % len(locked))  # type: ignore[call-overload]
                a.dec_lock_ref(node)  # type: ignore[arg-type]
                b.dec_lock_ref(twin)  # type: ignore[arg-type]
        else:
            tokens_n, states_n = arg  # type: ignore[misc]
            x_f, y_f = a.evict(tokens_n, states_n), b.evict(tokens_n, states_n)
            assert (x_f.slots, x_f.num_tokens, x_f.num_states) == (y_f.slots, y_f.num_tokens, y_f.num_states)
        assert state(a) == state(b)
        check_tree_invariants(a)
