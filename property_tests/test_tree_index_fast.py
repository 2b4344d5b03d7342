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

from hypothesis import given, settings
from hypothesis import strategies as st
from twin_trees import GeneralPath, run_twins, tree_op_st

from mamba_radix import CacheConfig
from mamba_radix.config import EVICTION_ORDERS
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
    ops=st.lists(tree_op_st, max_size=30),
)
def test_base_policy_fast_paths_agree_with_the_general_path(
    order: str, refresh: str, ops: list[tuple[str, object]]
) -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer", mamba_eviction_order=order, mamba_lru_refresh=refresh
    )
    fast, general = RadixTree(config), RadixTree(config, policy=GeneralPath())
    assert fast._base_policy_keys and not general._base_policy_keys
    run_twins(fast, general, ops, _state)
