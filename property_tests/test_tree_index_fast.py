"""The base policy's fast index paths against the general one (issue 12: a fast path keeps its reference and
a test that the two agree).

With the config's own policy the tree's index (:class:`~mamba_radix.eviction.OrderIndex`) skips updates that
cannot change a key (an internal node's stamp, a split's new tombstone), re-keys only the full-KV set on a
``last_access`` stamp and only the checkpoint set on a ``mamba_last_access`` stamp, and calls the order's key
functions directly; by default (:class:`~mamba_radix.eviction.LazyStampIndex`) a stamp re-keys nothing until
the node reaches the front. A subclass of :class:`CachePolicy` that overrides nothing makes the tree take the general path (every
change re-derives both keys through the policy): the same operations must leave both trees with the same
candidates, in the same order, under the same keys.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twin_trees import GeneralPath, run_twins, tree_op_st

from mamba_radix import CacheConfig
from mamba_radix.config import EVICTION_ORDERS
from mamba_radix.eviction import EvictionIndex, LazyStampIndex, OrderIndex
from mamba_radix.tree import RadixTree


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
    lazy_stamps=st.booleans(),
    ops=st.lists(tree_op_st, max_size=30),
)
def test_base_policy_fast_paths_agree_with_the_general_path(
    order: str, refresh: str, lazy_stamps: bool, ops: list[tuple[str, object]]
) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer", mamba_eviction_order=order, mamba_lru_refresh=refresh
    )
    fast, general = RadixTree(config, lazy_stamps=lazy_stamps), RadixTree(config, policy=GeneralPath())
    assert type(fast.index) is (LazyStampIndex if lazy_stamps else OrderIndex)
    assert type(general.index) is EvictionIndex
    run_twins(fast, general, ops, _state)
