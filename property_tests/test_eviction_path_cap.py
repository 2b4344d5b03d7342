"""mamba_max_states_per_path: a soft cap applied after an insert that adds a checkpoint; the shallowest
checkpoints go first, skipping the tail, forks (children != 1) and mamba-locked nodes."""

from __future__ import annotations

import torch

from mamba_radix import CacheConfig, RadixKey
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.tree import RadixTree


def make_tree(cap: int) -> RadixTree:
    return RadixTree(
        CacheConfig(
            mamba_radix_cache_strategy="no_buffer",
            disable_overlap_schedule=True,
            mamba_max_states_per_path=cap,
        )
    )


def chain(num_tokens: int) -> list[int]:
    return list(range(1, num_tokens + 1))


def insert(tree: RadixTree, tokens: list[int], slot: int) -> list[int]:
    done = tree.insert(RadixKey(tokens), torch.arange(100, 100 + len(tokens), dtype=torch.int64), slot)
    check_tree_invariants(tree)
    return done.capped_slots


def checkpoints_on_path(tree: RadixTree, tokens: list[int]) -> list[int]:
    node, out = tree.root, []
    for node in tree.path_to_root(tree.match(RadixKey(tokens)).best):
        if node.mamba_slot is not None:
            out.append(node.depth)
    return sorted(out)


def test_shallowest_dropped_tail_kept() -> None:
    tree = make_tree(2)
    assert insert(tree, chain(4), 1) == []
    assert insert(tree, chain(8), 2) == []
    assert insert(tree, chain(12), 3) == [1]  # the 4-token checkpoint goes
    assert insert(tree, chain(16), 4) == [2]
    assert checkpoints_on_path(tree, chain(16)) == [12, 16]
    # the dropped ones are tombstones: their KV stays
    assert tree.match(RadixKey(chain(16))).full_kv_hit_len == 16


def test_unlimited_by_default() -> None:
    tree = make_tree(-1)
    for i in range(1, 6):
        assert insert(tree, chain(4 * i), i) == []
    assert checkpoints_on_path(tree, chain(20)) == [4, 8, 12, 16, 20]


def test_forks_are_skipped() -> None:
    tree = make_tree(2)
    insert(tree, chain(4), 1)
    insert(tree, [1, 2, 3, 4, 90, 91], 2)  # the 4-token node now forks
    insert(tree, chain(8), 3)
    assert insert(tree, chain(12), 4) == [3]  # over by one: the fork survives, the 8-token node goes
    assert checkpoints_on_path(tree, chain(12)) == [4, 12]


def test_locked_checkpoints_are_skipped_soft_cap() -> None:
    tree = make_tree(1)
    insert(tree, chain(4), 1)
    locked = tree.match(RadixKey(chain(4))).best
    tree.inc_lock_ref(locked)
    assert insert(tree, chain(8), 2) == []  # only the tail and a locked node: above the cap
    assert checkpoints_on_path(tree, chain(8)) == [4, 8]
    tree.dec_lock_ref(locked)
    assert insert(tree, chain(12), 3) == [1, 2]  # the next insert brings the path back to the cap
    assert checkpoints_on_path(tree, chain(12)) == [12]


def test_other_paths_untouched_and_exists_does_not_cap() -> None:
    tree = make_tree(1)
    insert(tree, [50, 51], 7)
    insert(tree, chain(4), 1)
    assert tree.insert(RadixKey(chain(4)), torch.arange(4, dtype=torch.int64), 9).capped_slots == []
    assert insert(tree, chain(8), 2) == [1]
    assert tree.match(RadixKey([50, 51])).hit_len == 2


def test_revived_tombstone_triggers_the_cap() -> None:
    tree = make_tree(1)
    insert(tree, chain(8), 1)
    tree.match(RadixKey(chain(4)))  # split: a tombstone at 4
    assert insert(tree, chain(4), 2) == []  # the revived node is the tail; 8 is below it, not on its path
    insert(tree, chain(12), 3)
    assert checkpoints_on_path(tree, chain(12)) == [12]
