"""The host index (issue 25): host eviction takes its victims from a lazy heap of host-only leaves
(``RadixTree.host_leaves``, :mod:`mamba_radix.tree_host`) instead of scanning the host-only nodes.

The scan stays as the reference (``RadixTree._scan_host_victim``): at every host eviction of a random
host-tier workload the index's victim must be the scan's (the least recently used unpinned host-only leaf,
the deeper of a tie first, then the lower id), under every write policy. The unit tests pin the cases a
random workload reaches rarely: stamps that moved under listed entries (a match through host-only nodes),
a load-back's pinned leaves (skipped and left in the index), the compaction of entries whose nodes left,
and the invariant checker's view of the index.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule
from test_host_tier import EXTRA, POLICIES, HostEngine, HostTierMachine, make_engine, prompt

from mamba_radix import Req
from mamba_radix.errors import InvariantError
from mamba_radix.invariants import check_tree_invariants
from mamba_radix.node import TreeNode
from mamba_radix.token_ids import TokenIds
from mamba_radix.tree import RadixTree

HostEntry = tuple[int, int, int, TreeNode]


def check_against_scan(tree: RadixTree) -> list[tuple[TreeNode | None, bool]]:
    """Make ``tree``'s host index check each victim it picks against the scan's pick on the same state;
    returns the record of picks, as (victim, whether a load-back pinned nodes at that moment)."""
    picks: list[tuple[TreeNode | None, bool]] = []
    next_victim = tree._next_host_victim

    def checked(held: list[HostEntry]) -> TreeNode | None:
        expected = tree._scan_host_victim()
        got = next_victim(held)
        assert got is expected, (
            f"the host index picked {got and got.id}, the scan {expected and expected.id}; "
            f"pinned {sorted(tree.host_pinned)}"
        )
        picks.append((got, bool(tree.host_pinned)))
        return got

    tree._next_host_victim = checked  # type: ignore[method-assign]
    return picks


def key_of(node: TreeNode) -> tuple[int, int, int]:
    return (node.last_access, -node.depth, node.id)


def host_leaves(tree: RadixTree) -> list[TreeNode]:
    return sorted((n for n in tree.host_only_nodes.values() if not n.children), key=key_of)


def tokens_of(tree: RadixTree, node: TreeNode) -> list[int]:
    return [t for n in reversed(list(tree.path_to_root(node))) for t in n.key]


def demoted_forest() -> HostEngine:
    """Six requests run and then demoted (the cache keeps whole 64-token chunks): a 64-token prefix with a
    checkpoint, three branches below it (ending at 128 and 192) and two prompts of their own: host-only
    leaves at several depths, under a host-only fork that holds a host checkpoint."""
    engine = make_engine(host_kv=2048, host_slots=32, **EXTRA)
    requests = [
        prompt(65),
        prompt(193),
        prompt(64) + prompt(65, 100_000),
        prompt(64) + prompt(129, 200_000),
        prompt(129, 5_000),
        prompt(65, 9_000),
    ]
    for rid, tokens in enumerate(requests):
        engine.run(Req(rid, tokens))
    engine.cache.evict(num_tokens=100_000)
    engine.check()
    assert len(host_leaves(engine.cache.tree)) == 5
    return engine


# ------------------------------------------------------------------------------------------- units
def test_victims_follow_the_scan_after_matches_move_host_stamps() -> None:
    engine = demoted_forest()
    cache, tree = engine.cache, engine.cache.tree
    picks = check_against_scan(tree)
    # the two oldest leaves are matched again (a host path's stamps move; the listed entries do not): they
    # become the youngest, so the index must re-key them when they reach the front
    leaves = host_leaves(tree)
    oldest = leaves[:2]
    for node in oldest:
        cache.match_prefix(tokens_of(tree, node))
    engine.check()
    order = []
    while tree.host_only_nodes:
        want = tree._scan_host_victim()
        cache.evict_host(num_tokens=1)
        engine.check()
        order.append(want)
        assert want is not None and not tree.is_attached(want)
    assert [node for node, _ in picks] == order
    others = [order.index(node) for node in leaves[2:]]
    assert max(others) < min(order.index(node) for node in oldest), "the matched leaves go last"
    assert tree.host_leaves == [] and tree.host_leaf_ids == set()


def test_a_pinned_leaf_is_skipped_and_stays_in_the_index() -> None:
    engine = demoted_forest()
    cache, tree = engine.cache, engine.cache.tree
    check_against_scan(tree)
    oldest = host_leaves(tree)[0]
    tree.host_pinned.add(oldest.id)  # as a load-back's plan does until it is applied
    cache.evict_host(num_tokens=1)
    engine.check()
    assert tree.is_attached(oldest) and oldest.id in tree.host_leaf_ids
    assert any(entry[3] is oldest for entry in tree.host_leaves)
    tree.host_pinned.discard(oldest.id)
    assert host_leaves(tree)[0] is oldest
    cache.evict_host(num_tokens=1)
    engine.check()
    assert not tree.is_attached(oldest)


def test_a_host_only_parent_left_a_leaf_is_indexed() -> None:
    """The shared 64-token prefix is a host-only fork with a host checkpoint: when its branches go it
    becomes a host-only leaf itself, and host eviction must find it in the index."""
    engine = demoted_forest()
    cache, tree = engine.cache, engine.cache.tree
    check_against_scan(tree)
    forks = [n for n in tree.host_only_nodes.values() if len(n.children) >= 2 and n.host_slot is not None]
    assert forks
    fork = forks[0]
    while fork.children:
        cache.evict_host(num_tokens=1)
        engine.check()
    assert tree.is_attached(fork) and fork.id in tree.host_leaf_ids
    cache.evict_host(num_tokens=100_000, num_slots=100)
    engine.check()
    assert tree.num_nodes == 1


def test_compaction_drops_entries_of_nodes_that_left() -> None:
    engine = demoted_forest()
    cache, tree = engine.cache, engine.cache.tree
    check_against_scan(tree)
    # entries of nodes no longer in the tree (as a promoted leaf's entry stays after the node was removed
    # from the device): listed, never victims, dropped when popped or compacted
    gone = [
        TreeNode(10_000 + i, TokenIds("q", [1]), None, parent=None, depth=1, extra_key=None, owner=None)
        for i in range(3 * len(tree.host_only_nodes) + 64)
    ]
    tree.host_leaves.extend((0, -1, node.id, node) for node in gone)  # the smallest keys: at the front
    heapq.heapify(tree.host_leaves)
    tree.host_leaf_ids.update(node.id for node in gone)
    check_tree_invariants(tree)
    engine.run(Req(99, prompt(65, 20_000)))
    cache.evict(num_tokens=100_000)  # a demotion pushes: the heap outgrew 2x the host-only nodes
    engine.check()
    assert len(tree.host_leaves) == len(host_leaves(tree)) and not tree.host_leaf_ids & {n.id for n in gone}
    cache.evict_host(num_tokens=100_000, num_slots=100)
    engine.check()
    assert tree.num_nodes == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda tree: tree.host_leaf_ids.pop(), "its id set disagree"),
        (lambda tree: tree.host_leaves.append(tree.host_leaves[-1]), "its id set disagree"),
        (lambda tree: tree.host_leaves.reverse(), "not a heap"),
        (lambda tree: tree.host_leaf_ids.clear() or tree.host_leaves.clear(), "not in the host index"),
    ],
)
def test_the_invariant_checker_sees_a_damaged_index(
    damage: Callable[[RadixTree], object], message: str
) -> None:
    tree = demoted_forest().cache.tree
    damage(tree)
    with pytest.raises(InvariantError, match=message):
        check_tree_invariants(tree)


def test_the_invariant_checker_sees_a_key_ahead_of_its_node() -> None:
    tree = demoted_forest().cache.tree
    _, neg_depth, node_id, node = tree.host_leaves[0]
    tree.host_leaves[0] = (node.last_access + 1, neg_depth, node_id, node)  # still the front: a heap
    with pytest.raises(InvariantError, match="listed in the host index under"):
        check_tree_invariants(tree)


# ------------------------------------------------------------------------------------ state machine
class HostIndexMachine(HostTierMachine):
    """:class:`HostTierMachine`'s random host-tier workload (admissions with host hits and load-backs,
    demotions, host evictions under a full host), each host eviction's victims checked against the scan,
    plus matches that move host-only nodes' stamps without promoting them."""

    picks: list[tuple[TreeNode | None, bool]]
    all_picks: ClassVar[list[list[tuple[TreeNode | None, bool]]]]  # each run's picks, set per test

    @initialize(cap=st.sampled_from([-1, 2]), cap_mode=st.sampled_from(["keep", "drop"]))
    def build(self, cap: int, cap_mode: str) -> None:
        super().build(cap, cap_mode)
        self.picks = check_against_scan(self.engine.cache.tree)
        type(self).all_picks.append(self.picks)

    @rule(
        base=st.sampled_from([0, 1000, 2000]), length=st.sampled_from([40, 70, 90]), tail=st.integers(0, 20)
    )
    def run_then_demote(self, base: int, length: int, tail: int) -> None:
        """A whole request, then every unlocked device leaf demoted: the host fills with host-only leaves
        (and backups make room by host eviction)."""
        self.run_whole(base, length, tail)
        self.engine.cache.evict(num_tokens=1000)
        self.engine.check()

    @rule(pick=st.integers(0, 50), tokens=st.integers(1, 200))
    def host_evict_during_load_back(self, pick: int, tokens: int) -> None:
        """A host eviction while a load-back's plan pins its host path (as a backup that makes host room
        during the plan's device allocation does): the pinned leaf is skipped and stays listed."""
        cache = self.engine.cache
        leaves = host_leaves(cache.tree)
        if not leaves:
            return
        plan = cache.plan_load_back(tokens_of(cache.tree, leaves[pick % len(leaves)]))
        if plan is None:
            return
        assert cache.tree.host_pinned
        cache.evict_host(tokens)
        cache.apply_load_plan(plan)
        self.engine.check()

    @rule(pick=st.integers(0, 50), cut=st.integers(0, 3))
    def touch_host_path(self, pick: int, cut: int) -> None:
        """A match of a host-only leaf's path, or of a prefix of it (a match ending inside a host-only edge
        splits it): the stamps move, the index's entries do not."""
        tree = self.engine.cache.tree
        leaves = host_leaves(tree)
        if not leaves:
            return
        tokens = tokens_of(tree, leaves[pick % len(leaves)])
        self.engine.cache.match_prefix(tokens[: len(tokens) - cut])
        self.engine.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("strategy", ["extra_buffer", "no_buffer"])
def test_host_index_victims_are_the_scans(strategy: str, policy: str) -> None:
    machine = type(
        f"HostIndex_{strategy}_{policy}",
        (HostIndexMachine,),
        {"strategy": strategy, "policy": policy, "all_picks": []},
    )
    machine.TestCase.settings = settings(
        max_examples=10,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
    victims = [node for picks in machine.all_picks for node, _ in picks if node is not None]
    assert victims, "no host eviction took a victim: the comparison checked nothing"
