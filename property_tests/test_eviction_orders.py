"""Exact victim sequences: full-KV LRU leaves, checkpoint orders leaf_first / root_first / mixed /
flop_weighted, refresh node vs path, and SGLang's scenarios (four inserts; refresh only the used node) at
the tree level."""

from __future__ import annotations

import pytest
import torch

from mamba_radix import CacheConfig, ConfigError, RadixKey
from mamba_radix.eviction import (
    FLOP_SCORE_SCALE,
    CheckpointOrder,
    EvictionIndex,
    flop_score,
    is_full_candidate,
    is_mamba_candidate,
    mamba_evict_key,
    saved_compute,
)
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.node import TreeNode
from mamba_radix.tree import RadixTree


def make_tree(order: str = "leaf_first", refresh: str = "node", **fields: object) -> RadixTree:
    return RadixTree(
        CacheConfig(
            mamba_radix_cache_strategy="no_buffer",
            disable_overlap_schedule=True,
            mamba_eviction_order=order,  # type: ignore[arg-type]
            mamba_lru_refresh=refresh,  # type: ignore[arg-type]
            **fields,  # type: ignore[arg-type]
        )
    )


class Inserter:
    """Inserts keys with fresh fake KV indices; the slot of each insert is given explicitly."""

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree
        self.next_kv = 1

    def __call__(self, tokens: list[int], slot: int) -> None:
        kv = torch.arange(self.next_kv, self.next_kv + len(tokens), dtype=torch.int64)
        self.next_kv += len(tokens)
        done = self.tree.insert(RadixKey(tokens), kv, slot)
        assert not done.mamba_exists


def state_victims(tree: RadixTree) -> list[int]:
    """Evict checkpoints one at a time until none is evictable; the slots in eviction order."""
    order = []
    while True:
        freed = tree.evict(num_states=1)
        if not freed.slots:
            return order
        check_tree_invariants(tree)
        order.extend(freed.slots)


A, B, C = [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
E, F = [30, 31, 32, 33], [30, 31, 32, 33, 34, 35, 36, 37]
D = [20, 21, 22, 23]


def build_forest(tree: RadixTree) -> None:
    """Chain A(1) - B(2) - C(3), chain E(4) - F(5), single D(6), one insert per tick."""
    insert = Inserter(tree)
    for tokens, slot in ((A, 1), (B, 2), (C, 3), (E, 4), (F, 5), (D, 6)):
        insert(tokens, slot)


# path refresh: every insert walk re-stamps the checkpoints it passes, so A, B, C share stamp 3 and E, F
# share stamp 5: ties decide. D is newest.
@pytest.mark.parametrize(
    ("order", "expected"),
    [("leaf_first", [3, 2, 1, 5, 4, 6]), ("root_first", [1, 2, 3, 4, 5, 6]), ("mixed", [3, 2, 1, 5, 4, 6])],
)
def test_path_refresh_ties_follow_order(order: str, expected: list[int]) -> None:
    tree = make_tree(order, "path")
    build_forest(tree)
    assert state_victims(tree) == expected


# A running request is locked on C; a later hit re-stamps A, B, C (path refresh) so they are the newest.
# mixed takes the request's superseded checkpoints A, B first (shallowest first), then LRU leaf-first.
# flop_weighted (weight 32, crossover 2^16): A 7+32*2, B 7+32*3, E 5+32*2, F 5+32*3, D 6+32*2 ticks.
@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("leaf_first", [5, 4, 6, 2, 1]),
        ("root_first", [4, 5, 6, 1, 2]),
        ("mixed", [1, 2, 5, 4, 6]),
        ("flop_weighted", [4, 6, 1, 5, 2]),
    ],
)
def test_victims_with_a_running_request(order: str, expected: list[int]) -> None:
    tree = make_tree(order, "path")
    build_forest(tree)
    locked = tree.match(RadixKey(C)).best
    tree.inc_lock_ref(locked)
    assert state_victims(tree) == expected
    assert locked.mamba_slot == 3  # a locked checkpoint is never evicted
    tree.dec_lock_ref(locked)
    assert state_victims(tree) == [3]
    check_tree_invariants(tree)


@pytest.mark.parametrize("order", ["leaf_first", "root_first"])
def test_node_refresh_moves_only_the_consumed_checkpoint(order: str) -> None:
    tree = make_tree(order, "node")
    build_forest(tree)
    tree.match(RadixKey(C))  # only C is refreshed: A and B stay the oldest
    assert state_victims(tree) == [1, 2, 4, 5, 6, 3]


def test_sglang_refresh_only_the_used_node() -> None:
    # Two sessions of 2-node chains; re-accessing session 1 moves only its leaf to the MRU end, so its
    # ancestor stays older than session 2's (sglang-semantics §11).
    tree = make_tree("leaf_first", "node")
    insert = Inserter(tree)
    insert([1, 2, 3], 11)
    insert([1, 2, 3, 4, 5, 6], 12)
    insert([7, 8, 9], 21)
    insert([7, 8, 9, 10, 11, 12], 22)
    assert tree.match(RadixKey([1, 2, 3, 4, 5, 6])).hit_len == 6
    assert state_victims(tree) == [11, 21, 22, 12]

    older = make_tree("leaf_first", "path")  # the behaviour before SGLang PR #31643
    insert = Inserter(older)
    insert([1, 2, 3], 11)
    insert([1, 2, 3, 4, 5, 6], 12)
    insert([7, 8, 9], 21)
    insert([7, 8, 9, 10, 11, 12], 22)
    older.match(RadixKey([1, 2, 3, 4, 5, 6]))
    assert state_victims(older) == [22, 21, 12, 11]


def test_sglang_four_insert_scenario_tree_level() -> None:
    tree = make_tree("leaf_first", "node")
    insert = Inserter(tree)
    insert([1, 2, 3], 1)  # kv 1..3
    insert([1, 2, 3, 4, 5, 6, 7], 2)  # kv 4..10, [1, 2, 3] duplicate
    insert([10, 11, 12], 3)  # kv 11..13
    insert([1, 2, 3, 4, 5, 60, 70], 4)  # kv 14..20; splits [4..7] into [4, 5] + [6, 7]
    # the split touched [6, 7] in the same insert: [10, 11, 12] is the least recently used leaf
    freed = tree.evict(num_tokens=1)
    assert (freed.num_tokens, freed.slots, torch.cat(freed.kv).tolist()) == (3, [3], [11, 12, 13])
    freed = tree.evict(num_states=1)  # the oldest checkpoint, [1, 2, 3], becomes a tombstone
    assert freed.slots == [1] and freed.num_tokens == 0
    assert tree.match(RadixKey([1, 2, 3, 4, 5])).hit_len == 0
    m = tree.match(RadixKey([1, 2, 3, 4, 5, 60, 70]))
    assert m.hit_len == 7 and m.best.key == (60, 70)
    assert tree.match(RadixKey([1, 2, 3, 4, 5, 6, 7])).hit_len == 7
    freed = tree.evict(num_states=1)  # [60, 70] was consumed before [6, 7]: the leaf goes, KV too
    assert freed.slots == [4] and freed.num_tokens == 2
    assert tree.match(RadixKey([1, 2, 3, 4, 5, 60, 70])).hit_len == 0
    check_tree_invariants(tree)


def test_full_kv_lru_leaves_with_depth_ties_and_cascade() -> None:
    tree = make_tree()
    insert = Inserter(tree)
    insert([1, 2], 1)
    insert([1, 2, 3, 4], 2)  # kv 3..6: [3, 4] gets kv 5, 6
    insert([9], 3)  # kv 7
    insert([8, 8, 8], 4)  # kv 8..10
    tree.match(RadixKey([1, 2, 3, 4]))  # refreshes [1, 2] and [3, 4]
    order = []
    while True:
        freed = tree.evict(num_tokens=1)
        if not freed.kv:
            break
        order.append(torch.cat(freed.kv).tolist())
    assert order == [[7], [8, 9, 10], [5, 6], [1, 2]]


def test_leaf_with_locked_kv_is_never_a_checkpoint_victim() -> None:
    # SGLang #21379: a leaf whose KV a request holds must not be picked by checkpoint eviction.
    tree = make_tree()
    insert = Inserter(tree)
    insert([1, 2, 3], 1)
    node = tree.match(RadixKey([1, 2, 3])).best
    tree.inc_lock_ref(node)
    assert tree.evict(num_states=5).slots == []
    assert tree.index.first_mamba() is None
    tree.dec_lock_ref(node)
    assert tree.evict(num_states=5).slots == [1]


def test_candidate_predicates() -> None:
    # A KV-only lock (skip_decode_lock's hand-over) protects the KV, not the checkpoint: the leaf's
    # checkpoint may go, its KV may not; a mamba lock protects both.
    leaf = TreeNode(5, (1, 2), torch.arange(2), parent=None, depth=2, extra_key=None, mamba_slot=3)
    assert is_mamba_candidate(leaf) and is_full_candidate(leaf)
    leaf.full_lock_ref = leaf.kv_lock_ref = 1
    assert is_mamba_candidate(leaf) and not is_full_candidate(leaf)
    leaf.kv_lock_ref, leaf.mamba_lock_ref = 0, 1
    assert not is_mamba_candidate(leaf) and not is_full_candidate(leaf)
    leaf.mamba_lock_ref = 0
    leaf.children[9] = leaf  # any child makes it internal: its checkpoint may go, its KV may not
    assert is_mamba_candidate(leaf) and not is_full_candidate(leaf)
    leaf.mamba_lock_ref = 1
    assert not is_mamba_candidate(leaf)


# ------------------------------------------------------------------------------------------ flop_weighted
# build_forest with node refresh stamps A..D 1..6; depths A 4, B 8, C 12, E 4, F 8, D 4.
# score = stamp + weight * log2(depth * (1 + depth / crossover)), lowest first; equal scores: deepest first.
@pytest.mark.parametrize(
    ("weight", "crossover", "expected"),
    [
        # plain LRU
        (0.0, 65536, [1, 2, 3, 4, 5, 6]),
        # A 1+4, B 2+6, C 3+7.17, E 4+4, F 5+6, D 6+4: B and E tie at 8, B is deeper
        (2.0, 65536, [1, 2, 4, 6, 3, 5]),
        # crossover 4: F(L) = L(1 + L/4): A 1+6.0, E 4+6.0, B 2+9.17, D 6+6.0, C 3+11.2, F 5+9.17
        (2.0, 4, [1, 4, 2, 6, 3, 5]),
        # compute dominates: by depth, then by age
        (8.0, 65536, [1, 4, 6, 2, 5, 3]),
    ],
)
def test_flop_weighted_victims(weight: float, crossover: int, expected: list[int]) -> None:
    tree = make_tree("flop_weighted", "node", mamba_flop_weight=weight, mamba_flop_crossover=crossover)
    build_forest(tree)
    assert state_victims(tree) == expected


@pytest.mark.parametrize("refresh", ["node", "path"])
def test_flop_weighted_with_weight_zero_is_leaf_first_lru(refresh: str) -> None:
    lru = make_tree("leaf_first", refresh)
    build_forest(lru)
    flop = make_tree("flop_weighted", refresh, mamba_flop_weight=0.0)
    build_forest(flop)
    assert state_victims(flop) == state_victims(lru)


def test_flop_weighted_trades_doublings_for_ticks() -> None:
    # One 48-token prefix (stamp 1) and a stream of 2-token ones (stamps 2..13), weight 2: the long one
    # saves 24x the compute, log2(24) = 4.58 doublings, worth 9.17 ticks. It outlives the short ones
    # stamped up to 10 (scores k + 2 <= 12 < 12.17), then goes before those stamped 11..13.
    tree = make_tree("flop_weighted", "node", mamba_flop_weight=2.0)
    insert = Inserter(tree)
    insert(list(range(100, 148)), 1)
    for k in range(2, 14):
        insert([k, k], k)
    assert state_victims(tree) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 11, 12, 13]
    lru = make_tree("leaf_first", "node")
    insert = Inserter(lru)
    insert(list(range(100, 148)), 1)
    for k in range(2, 14):
        insert([k, k], k)
    assert state_victims(lru) == list(range(1, 14))


def test_flop_weighted_refresh_moves_only_the_consumed_checkpoint() -> None:
    tree = make_tree("flop_weighted", "node", mamba_flop_weight=2.0)
    build_forest(tree)
    # A is re-stamped 7: score 7 + 2 * 2 = 11, tied with F (5 + 2 * 3), which is deeper and goes first;
    # B and E tie at 8 (B deeper), then D 10, C 10.17. Nothing else moved.
    tree.match(RadixKey(A))
    assert state_victims(tree) == [2, 4, 6, 3, 5, 1]


def test_flop_score_values() -> None:
    assert saved_compute(8, 8) == 16.0  # 8 tokens of linear work plus as much again in attention
    assert flop_score(3, 8, 2.0, 8) == (3 + 2 * 4) * FLOP_SCORE_SCALE  # 3 + 2 * log2(16) ticks
    assert flop_score(3, 8, 0.0, 8) == 3 * FLOP_SCORE_SCALE
    assert flop_score(0, 1, 1.0, 65536) == 0  # log2(1 + 1/65536) * 1024 rounds to 0
    # the key depends on the node's own stamp and depth only: static between two updates
    node = TreeNode(7, (1, 2), torch.arange(2), parent=None, depth=8, extra_key=None, mamba_slot=3)
    node.mamba_last_access = 3
    order = CheckpointOrder("flop_weighted", 2.0, 8)
    assert mamba_evict_key(order, node) == (0, 11 * FLOP_SCORE_SCALE, -8, 7)
    assert EvictionIndex("flop_weighted", flop_weight=2.0, flop_crossover=8).order == order


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("fifo",),
            r"^eviction order must be one of leaf_first, root_first, mixed, flop_weighted, got 'fifo'$",
        ),
        (("flop_weighted", -1.0), r"^flop_weight must be a finite number >= 0, got -1.0$"),
        (("flop_weighted", float("inf")), r"^flop_weight must be a finite number >= 0, got inf$"),
        (("flop_weighted", 1.0, 0), r"^flop_crossover must be an integer >= 1, got 0$"),
    ],
)
def test_checkpoint_order_validates(args: tuple, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CheckpointOrder(*args)
