"""The base policy's fast index paths against the general one (issue 12: a fast path keeps its reference and
a test that the two agree).

With the config's own policy the tree skips index updates that cannot change a key (an internal node's
stamp, a split's new tombstone), re-keys only the full-KV set on a ``last_access`` stamp and only the
checkpoint set on a ``mamba_last_access`` stamp, and lets the index call the order's key functions directly.
A subclass of :class:`CachePolicy` that overrides nothing makes the tree take the general path (every
change re-derives both keys through the policy): the same operations must leave both trees with the same
candidates, in the same order, under the same keys.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mamba_radix import CacheConfig, RadixKey
from mamba_radix.config import EVICTION_ORDERS
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.policy import CachePolicy
from mamba_radix.tree import RadixTree


class GeneralPath(CachePolicy):
    """The base policy's keys through the general path (a subclass: the tree cannot assume its keys)."""

    name = "general-path"


tokens_st = st.lists(st.integers(0, 3), min_size=1, max_size=16)
op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st),
    st.tuples(st.just("match"), tokens_st),
    st.tuples(st.just("lock"), st.integers(0, 50)),
    st.tuples(st.just("unlock"), st.integers(0, 50)),
    st.tuples(st.just("evict"), st.tuples(st.integers(0, 8), st.integers(0, 2))),
)


def _state(tree: RadixTree) -> tuple[object, ...]:
    index = tree.index
    return (
        [n.id for n in index.full_candidates()],
        [n.id for n in index.mamba_candidates()],
        index.full_keys(),
        index.mamba_keys(),
        sorted((n.id, n.last_access, n.mamba_last_access, n.mamba_slot) for n in tree.nodes()),
    )


@settings(deadline=None)
@given(
    order=st.sampled_from(EVICTION_ORDERS),
    refresh=st.sampled_from(["node", "path"]),
    ops=st.lists(op_st, max_size=30),
)
def test_base_policy_fast_paths_agree_with_the_general_path(
    order: str, refresh: str, ops: list[tuple[str, object]]
) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer", mamba_eviction_order=order, mamba_lru_refresh=refresh
    )
    fast, general = RadixTree(config), RadixTree(config, policy=GeneralPath())
    assert fast._base_policy_keys and not general._base_policy_keys
    locked: list[tuple[object, object]] = []  # (fast node, general node), both locked
    slot, kv = 1, 1
    for op, arg in ops:
        if op == "insert":
            tokens = list(arg)  # type: ignore[call-overload]
            value = torch.arange(kv, kv + len(tokens), dtype=torch.int64)
            kv += len(tokens)
            a = fast.insert(RadixKey(tokens), value, slot)
            b = general.insert(RadixKey(tokens), value.clone(), slot)
            assert (a.prefix_len, a.mamba_exists, a.node.id) == (b.prefix_len, b.mamba_exists, b.node.id)
            slot += 1
        elif op == "match":
            a_m = fast.match(RadixKey(list(arg)))  # type: ignore[call-overload]
            b_m = general.match(RadixKey(list(arg)))  # type: ignore[call-overload]
            assert (a_m.best.id, a_m.hit_len, a_m.full_kv_hit_len) == (
                b_m.best.id,
                b_m.hit_len,
                b_m.full_kv_hit_len,
            )
        elif op == "lock":
            holders = [n for n in fast.nodes() if n.mamba_slot is not None]
            if holders:
                node = holders[int(arg) % len(holders)]  # type: ignore[call-overload]
                twin = next(n for n in general.nodes() if n.id == node.id)
                fast.inc_lock_ref(node)
                general.inc_lock_ref(twin)
                locked.append((node, twin))
        elif op == "unlock":
            if locked:
                node, twin = locked.pop(int(arg) % len(locked))  # type: ignore[call-overload]
                fast.dec_lock_ref(node)  # type: ignore[arg-type]
                general.dec_lock_ref(twin)  # type: ignore[arg-type]
        else:
            tokens_n, states_n = arg  # type: ignore[misc]
            a_f, b_f = fast.evict(tokens_n, states_n), general.evict(tokens_n, states_n)
            assert (a_f.slots, a_f.num_tokens) == (b_f.slots, b_f.num_tokens)
        assert _state(fast) == _state(general)
        check_tree_invariants(fast)
