"""The pure radix tree without pools: match, split, insert outcomes, pages, namespaces, locks, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, InvalidArgument, RadixKey
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.node import common_prefix_len
from mamba_radix.tree import RadixTree


def make_tree(**fields: object) -> RadixTree:
    fields.setdefault(
        "mamba_radix_cache_strategy", "extra_buffer" if fields.get("page_size", 1) > 1 else "no_buffer"
    )
    fields.setdefault("disable_overlap_schedule", True)
    return RadixTree(CacheConfig(**fields))  # type: ignore[arg-type]


class KV:
    """Hands out fresh fake KV indices, so every test can compare exact index values."""

    def __init__(self) -> None:
        self.next = 1

    def __call__(self, num_tokens: int) -> torch.Tensor:
        out = torch.arange(self.next, self.next + num_tokens, dtype=torch.int64)
        self.next += num_tokens
        return out


def test_hit_ends_at_deepest_checkpoint_and_reports_kv_beyond() -> None:
    tree, kv = make_tree(mamba_cache_chunk_size=2), KV()
    tree.insert(RadixKey([1, 2, 3]), kv(3), mamba_slot=10)
    tree.insert(
        RadixKey([1, 2, 3, 4, 5, 6, 7]),
        torch.cat([tree.match(RadixKey([1, 2, 3])).device_indices, kv(4)]),
        11,
        3,
    )
    m = tree.match(RadixKey([1, 2, 3, 4, 5]))  # ends inside the [4..7] edge: split, tombstone parent
    assert m.hit_len == 3 and m.best.mamba_slot == 10
    assert m.full_kv_hit_len == 5
    assert m.device_indices.tolist() == [1, 2, 3]
    mid = m.best.children[4]
    assert mid.key == (4, 5) and mid.mamba_slot is None and mid.value.tolist() == [4, 5]
    assert mid.children[6].key == (6, 7) and mid.children[6].mamba_slot == 11
    assert len(tree.slot_owner) == 2  # the split copied no checkpoint
    check_tree_invariants(tree)


def test_split_parent_is_tombstone_and_inherits_full_lock() -> None:
    tree, kv = make_tree(), KV()
    leaf = tree.insert(RadixKey([1, 2, 3, 4]), kv(4), 5).node
    tree.inc_lock_ref(leaf)
    tree.match(RadixKey([1, 2]))
    parent = leaf.parent
    assert parent is not None and parent is not tree.root
    assert parent.mamba_slot is None and parent.full_lock_ref == 1 and parent.mamba_lock_ref == 0
    assert tree.full_protected_size == 4 and tree.full_evictable_size == 0
    check_tree_invariants(tree)
    tree.dec_lock_ref(leaf)
    assert tree.full_protected_size == 0 and tree.full_evictable_size == 4
    check_tree_invariants(tree)


def test_insert_outcomes_new_leaf_revive_exists() -> None:
    tree, kv = make_tree(), KV()
    first = tree.insert(RadixKey([1, 2, 3, 4]), kv(4), 7)
    assert (first.prefix_len, first.mamba_exists) == (0, False)
    tree.match(RadixKey([1, 2]))  # split: [1, 2] is now a tombstone
    revived = tree.insert(RadixKey([1, 2]), kv(2), 8)
    assert (revived.prefix_len, revived.mamba_exists) == (2, False)
    assert revived.node.mamba_slot == 8 and revived.node.key == (1, 2)
    assert revived.duplicate_kv.numel() == 2  # both positions were already the tree's
    exists = tree.insert(RadixKey([1, 2, 3, 4]), kv(4), 9)
    assert (exists.prefix_len, exists.mamba_exists) == (4, True)
    assert 9 not in tree.slot_owner  # the slot stays the caller's
    check_tree_invariants(tree)


def test_duplicate_kv_starts_at_prev_prefix_len() -> None:
    tree, kv = make_tree(), KV()
    tree.insert(RadixKey(list(range(10))), kv(10), 1)
    mine = torch.arange(100, 112, dtype=torch.int64)
    done = tree.insert(RadixKey([*range(10), 50, 51]), mine, 2, prev_prefix_len=4)
    assert done.prefix_len == 10
    assert done.duplicate_kv.tolist() == list(range(104, 110))  # [4, 10): positions below 4 are the tree's
    assert done.node.value.tolist() == [110, 111]


def test_page_size_compares_whole_pages() -> None:
    tree, kv = make_tree(page_size=4, mamba_track_interval=8), KV()
    tree.insert(RadixKey(list(range(12))), kv(12), 1)
    # differs at position 6 (inside the second page): only the first page matches
    m = tree.match(RadixKey([0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11]))
    assert m.full_kv_hit_len == 4 and m.hit_len == 0
    # an unaligned query is truncated to whole pages
    m = tree.match(RadixKey(list(range(11))))
    assert m.full_kv_hit_len == 8
    with pytest.raises(InvalidArgument, match="not a multiple of page_size=4"):
        tree.insert(RadixKey(list(range(6))), kv(6), 2)
    check_tree_invariants(tree)
    for node in tree.nodes():
        assert len(node.key) % 4 == 0


def test_extra_key_namespaces_never_share_nodes() -> None:
    tree, kv = make_tree(), KV()
    tree.insert(RadixKey([1, 2, 3], "lora-a"), kv(3), 1)
    assert tree.match(RadixKey([1, 2, 3])).hit_len == 0
    assert tree.match(RadixKey([1, 2, 3], "lora-b")).hit_len == 0
    assert tree.match(RadixKey([1, 2, 3], "lora-a")).hit_len == 3
    tree.insert(RadixKey([1, 2, 3]), kv(3), 2)
    assert len(tree.root.children) == 2
    check_tree_invariants(tree)


@pytest.mark.parametrize("kv_only_leaves", [False, True])
def test_locks_protect_path_and_count_transitions(kv_only_leaves: bool) -> None:
    tree, kv = make_tree(mamba_kv_only_leaves=kv_only_leaves), KV()
    a = tree.insert(RadixKey([1, 2]), kv(2), 1).node
    b = tree.insert(RadixKey([1, 2, 3, 4]), torch.cat([a.value, kv(2)]), 2, 2).node
    tree.inc_lock_ref(b)
    tree.inc_lock_ref(b)
    assert (a.full_lock_ref, a.mamba_lock_ref, b.full_lock_ref, b.mamba_lock_ref) == (2, 0, 2, 2)
    assert (tree.full_protected_size, tree.mamba_protected_size, tree.mamba_evictable_size) == (4, 1, 1)
    freed = tree.evict(num_tokens=100, num_states=100)
    assert freed.num_tokens == 0 and freed.slots == [1]  # only a's unlocked checkpoint could go
    assert a.mamba_slot is None and a.value.numel() == 2  # a tombstone keeps its KV
    tree.dec_lock_ref(b)
    tree.dec_lock_ref(b)
    freed = tree.evict(num_tokens=1)
    if kv_only_leaves:  # SGLang 0.5.23: the tombstone a stays as a KV-only leaf ...
        assert freed.num_tokens == 2 and freed.slots == [2] and tree.num_nodes == 2
        check_tree_invariants(tree)
        freed = tree.evict(num_tokens=1)  # ... until KV eviction takes it
        assert freed.num_tokens == 2 and freed.slots == []
    else:  # 0.5.20: the leaf, then the tombstone cascade
        assert freed.num_tokens == 4 and freed.slots == [2]
    assert tree.num_nodes == 1
    check_tree_invariants(tree)


def test_lock_errors_change_nothing() -> None:
    tree, kv = make_tree(), KV()
    leaf = tree.insert(RadixKey([1, 2, 3, 4]), kv(4), 1).node
    with pytest.raises(InvalidArgument, match="is not locked"):
        tree.dec_lock_ref(leaf)
    tree.match(RadixKey([1, 2]))
    with pytest.raises(InvalidArgument, match="cannot lock tombstone node"):
        tree.inc_lock_ref(leaf.parent)  # type: ignore[arg-type]
    tree.evict(num_tokens=4)
    with pytest.raises(InvalidArgument, match="no longer in the tree"):
        tree.inc_lock_ref(leaf)
    tree.inc_lock_ref(tree.root)  # the root: a no-op
    tree.dec_lock_ref(tree.root)
    check_tree_invariants(tree)


@pytest.mark.parametrize(
    ("value", "slot", "prev", "message"),
    [
        (torch.arange(3, dtype=torch.int32), 1, 0, "1-D int64 tensor"),
        (torch.arange(2, dtype=torch.int64), 1, 0, "2 entries for 3 tokens"),
        (torch.arange(3, dtype=torch.int64), 0, 0, "mamba_slot must be a state slot id >= 1"),
        (torch.arange(3, dtype=torch.int64), 5, 0, "already belongs to tree node"),
        (torch.arange(3, dtype=torch.int64), 1, 4, r"prev_prefix_len=4 must be .* in \[0, 3\]"),
        (torch.arange(3, dtype=torch.int64), 1, 3, "the tree holds only 2 tokens of this key"),
    ],
)
def test_insert_errors_leave_tree_as_it_was(value: torch.Tensor, slot: int, prev: int, message: str) -> None:
    tree, kv = make_tree(), KV()
    tree.insert(RadixKey([1, 2, 9, 9]), kv(4), 5)
    before = tree.pretty_print()
    with pytest.raises(InvalidArgument, match=message):
        tree.insert(RadixKey([1, 2, 3]), value, slot, prev)
    assert tree.pretty_print() == before


def test_radix_key_validation() -> None:
    assert RadixKey(torch.tensor([1, 2])).token_ids == (1, 2)
    with pytest.raises(InvalidArgument, match="extra_key must be a str or None, got 3"):
        RadixKey([1], 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must be a sequence of ints, got str"):
        RadixKey("abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must be 1-D"):
        RadixKey(torch.zeros(2, 2, dtype=torch.int64))


def test_evict_rejects_negative_counts() -> None:
    with pytest.raises(InvalidArgument, match="num_tokens must be an int >= 0, got -1"):
        make_tree().evict(num_tokens=-1)


@given(
    a=st.lists(st.integers(0, 3), max_size=300),
    b=st.lists(st.integers(0, 3), max_size=300),
    start=st.integers(0, 20),
)
def test_common_prefix_len_matches_naive(a: list[int], b: list[int], start: int) -> None:
    start = min(start, len(b))
    naive = 0
    while naive < len(a) and start + naive < len(b) and a[naive] == b[start + naive]:
        naive += 1
    assert common_prefix_len(tuple(a), tuple(b), start) == naive


@given(st.lists(st.integers(0, 2000), min_size=130, max_size=400), st.integers(0, 399))
def test_common_prefix_len_long_runs(tokens: list[int], cut: int) -> None:
    other = list(tokens)
    if cut < len(other):
        other[cut] = -1
    expected = min(cut, len(tokens))
    assert common_prefix_len(tuple(tokens), tuple(other), 0) == expected


def _shape(tree: RadixTree) -> list[tuple[int, tuple[int, ...], tuple[int, ...], int | None, int, int]]:
    return sorted(
        (n.depth, n.key, tuple(n.value.tolist()), n.mamba_slot, n.last_access, n.mamba_last_access)
        for n in tree.nodes()
        if not n.is_root
    )


@pytest.mark.parametrize("suffix", [[5, 6, 7], [3, 4, 9], [3, 4], [3]])
def test_insert_below_is_an_insert_from_the_root_walked_from_the_node(suffix: list[int]) -> None:
    """Inserting ``prefix + suffix`` from the root, or ``suffix`` below the node ending the prefix, gives
    the same tree (nodes, KV, slots, stamps) and hands back the same duplicate KV."""
    trees = []
    for below in (False, True):
        tree, kv = make_tree(), KV()
        tree.insert(RadixKey([1, 2]), kv(2), 1)
        node = tree.insert(RadixKey([1, 2, 3, 4, 5]), kv(5), 2).node
        prefix = tree.match(RadixKey([1, 2, 3])).best  # ends at 2: [1 2] holds a checkpoint
        assert prefix.depth == 2 and node.depth == 5
        value = kv(len(suffix))
        if below:
            done = tree.insert_below(prefix, RadixKey(suffix), value, 3)
            dup = done.duplicate_kv
        else:
            full = torch.cat([tree.path_values(prefix), value])
            done = tree.insert(RadixKey([1, 2, *suffix]), full, 3, prev_prefix_len=2)
            dup = done.duplicate_kv
        trees.append((_shape(tree), done.prefix_len, done.mamba_exists, dup.tolist(), done.node.depth))
        check_tree_invariants(tree)
    assert trees[0] == trees[1]


def test_insert_below_refuses_a_foreign_node_or_namespace() -> None:
    tree, other, kv = make_tree(), make_tree(), KV()
    node = tree.insert(RadixKey([1, 2], "a"), kv(2), 1).node
    foreign = other.insert(RadixKey([1, 2], "a"), kv(2), 1).node
    with pytest.raises(InvalidArgument, match="not in this tree"):
        tree.insert_below(foreign, RadixKey([3], "a"), kv(1), 2)
    with pytest.raises(InvalidArgument, match="namespace"):
        tree.insert_below(node, RadixKey([3], "b"), kv(1), 2)
    assert tree.insert_below(node, RadixKey([3], "a"), kv(1), 2).node.depth == 3
    check_tree_invariants(tree)


@pytest.mark.parametrize("kv_only_leaves", [False, True])
def test_on_victim_hears_each_victim_with_its_age_and_changes_no_eviction(kv_only_leaves: bool) -> None:
    """The observer given at construction is told (kind, ticks since the victim's last access) once per
    KV victim holding a checkpoint and once per state victim; a KV-only leaf is not reported. A tree with
    and one without the observer free the same."""
    heard: list[tuple[str, int]] = []
    trees = [
        RadixTree(
            CacheConfig(mamba_radix_cache_strategy="no_buffer", mamba_kv_only_leaves=kv_only_leaves),
            on_victim=lambda kind, age: heard.append((kind, age)),
        ),
        make_tree(mamba_kv_only_leaves=kv_only_leaves),
    ]
    freed = []
    for tree in trees:
        kv = KV()
        a = tree.insert(RadixKey([1, 2]), kv(2), 1).node  # clock 1
        tree.insert(RadixKey([1, 2, 3, 4]), torch.cat([a.value, kv(2)]), 2, 2)  # clock 2
        tree.insert(RadixKey([7, 8]), kv(2), 3)  # clock 3
        tree.match(RadixKey([7, 8]))  # clock 4: [7 8] is the youngest
        tree.match(RadixKey([5]))  # clock 5, a miss: only the clock moves
        got = [tree.evict(num_states=1), tree.evict(num_tokens=2), tree.evict(num_tokens=4)]
        freed.append([(f.num_tokens, f.num_states, sorted(f.slots)) for f in got])
        check_tree_invariants(tree)
    assert freed[0] == freed[1]
    # a's checkpoint first (stamped at 1: the longer insert stamps only the KV of a, age 4); then the leaf
    # [3 4] (age 3); then [7 8] (age 1), and with KV-only leaves the tombstone [1 2] before it, unreported
    assert heard == [("state", 4), ("kv", 3), ("kv", 1)]
    assert trees[1].on_victim is None
