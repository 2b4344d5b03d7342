"""Cache events with the host tier on (issue 25; :mod:`mamba_radix.events`, ``docs/events.md``).

With the tier on, the stream covers both tiers, per medium as SGLang's HiCache publishes: a backup stores
host blocks (``medium="CPU_PINNED"``) and host checkpoints (``tier="host"``), a demotion removes the device
blocks and checkpoint while the host copies stay, a load-back (or an insert through host-only nodes)
stores device blocks again, and the load-back a device checkpoint; host eviction and the per-path cap
under ``host_path_cap="drop"`` remove host copies. The contract extends: replaying the events gives
exactly the cache's device blocks and checkpoints and exactly its host blocks and host checkpoints; on each
tier a checkpoint is announced after its block and retracted before it (a ``write_back`` copy of an
internal checkpoint sits on a device block: its KV never reached the host).

The property is checked over :class:`~test_host_tier.HostTierMachine`'s workload (admissions with host
hits and load-backs, chunked prefill, decode, finishes, device and host eviction, the per-path cap with
host copies kept or dropped) under every write policy, on no_buffer and extra_buffer, at page sizes 1 and
4, with host pools small enough that host eviction runs; after every step the replay must equal both
tiers recomputed from the tree's own tokens (not from the log's maps), and a router's predicted hit, on
the device and after a load-back, must equal the cache's own answer.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule
from test_host_tier import EXTRA, POLICIES, STRATEGIES, HostEngine, HostTierMachine, make_engine, prompt

from mamba_radix import MambaRadixCache, RadixKey, Req
from mamba_radix.errors import InvalidArgument
from mamba_radix.events import (
    DEVICE_MEDIUM,
    HOST_MEDIUM,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    CheckpointRemoved,
    CheckpointStored,
    PrefixIndex,
    chain_block_hashes,
)
from mamba_radix.node import TreeNode


# ------------------------------------------------------------------------------------------ helpers
def make_events_engine(**kwargs: Any) -> HostEngine:
    """:func:`test_host_tier.make_engine`'s engine over a cache that records events."""
    return make_engine(events=True, **kwargs)


def tiers_view(cache: MambaRadixCache) -> dict[str, dict[int, Any]]:
    """Both tiers of the tree, hashed from the nodes' own tokens top-down (independent of the event log):
    device and host blocks (hash -> parent hash), device and host checkpoints (hash of the block they sit
    at -> depth). O(n + tokens)."""
    page = cache.config.page_size
    view: dict[str, dict[int, Any]] = {"blocks": {}, "host_blocks": {}, "device": {}, "host": {}}
    last: dict[int, int | None] = {cache.tree.root.id: None}  # node id -> hash of its last block
    for node in cache.tree.nodes():
        if node.is_root:
            continue
        assert node.parent is not None
        parent = last[node.parent.id]
        hashes = chain_block_hashes(node.key, page, parent_block_hash=parent, extra_key=node.extra_key)
        for block_hash in hashes:
            if node.value is not None:
                view["blocks"][block_hash] = parent
            if node.host_kv is not None:
                view["host_blocks"][block_hash] = parent
            parent = block_hash
        last[node.id] = parent
        if node.mamba_slot is not None:
            view["device"][parent] = node.depth
        if node.host_slot is not None:
            view["host"][parent] = node.depth
    return view


def assert_mirrors_both_tiers(index: PrefixIndex, cache: MambaRadixCache) -> None:
    view = tiers_view(cache)
    assert index.blocks == view["blocks"], "device blocks"
    assert index.host_blocks == view["host_blocks"], "host blocks"
    assert index.checkpoints["device"] == view["device"], "device checkpoints"
    assert index.checkpoints["host"] == view["host"], "host checkpoints"


def path_tokens(node: TreeNode) -> list[int]:
    chain = []
    while node.parent is not None:
        chain.append(node)
        node = node.parent
    return [t for n in reversed(chain) for t in n.key]


def label(event: CacheEvent) -> str:
    where = getattr(event, "medium", None) or getattr(event, "tier", "")
    return f"{type(event).__name__} {where} {getattr(event, 'reason', '')}".rstrip()


# ------------------------------------------------------------------------------------------ examples
def test_events_are_recorded_with_the_tier_on() -> None:
    """The refusal is lifted: a cache with the host tier records events."""
    engine = make_events_engine(**EXTRA)
    assert engine.cache.events_enabled and engine.cache.host_stats is not None


def test_a_backup_announces_host_blocks_then_the_host_checkpoint() -> None:
    """write_through backs a new leaf up at its insert: its device events, then the same blocks (same
    hashes) on the host, chained onto the parent's host block, then its host checkpoint."""
    engine = make_events_engine(**EXTRA)
    engine.run(Req(1, prompt(130)))
    events = engine.cache.take_events()
    host = [e for e in events if isinstance(e, BlockStored) and e.medium == HOST_MEDIUM]
    device = [e for e in events if isinstance(e, BlockStored) and e.medium == DEVICE_MEDIUM]
    assert host and [e.block_hashes for e in host] == [e.block_hashes for e in device]
    assert [e.parent_block_hash for e in host] == [e.parent_block_hash for e in device]
    for event in host:  # each host checkpoint comes after its host block
        first = events.index(event)
        later = [e for e in events[first:] if isinstance(e, CheckpointStored) and e.tier == "host"]
        assert later and later[0].block_hash == event.block_hashes[-1]
    index = PrefixIndex()
    index.apply(events)
    assert_mirrors_both_tiers(index, engine.cache)


@pytest.mark.parametrize("page", [1, 4])
def test_a_demotion_then_a_load_back_announces_gpu_blocks_and_a_device_checkpoint(page: int) -> None:
    """A demotion removes the device blocks and checkpoints (retracted first), the host copies stay; the
    load-back at admission stores the path's blocks on the device again (the same hashes, chained from
    the root) and then the device checkpoint at the hit's depth."""
    engine = make_events_engine(page_size=page, **EXTRA)
    cache = engine.cache
    tokens = prompt(200)
    engine.run(Req(1, tokens))
    index = PrefixIndex()
    index.apply(cache.take_events())
    host_before = dict(index.host_blocks), dict(index.checkpoints["host"])
    cache.evict(num_tokens=10_000)
    demotion = cache.take_events()
    assert cache.tree.host_only_nodes and index.checkpoints["host"]
    assert {type(e) for e in demotion} == {CheckpointRemoved, BlockRemoved}
    assert all(e.tier == "device" for e in demotion if isinstance(e, CheckpointRemoved))
    assert all(e.medium == DEVICE_MEDIUM for e in demotion if isinstance(e, BlockRemoved))
    assert isinstance(demotion[-1], BlockRemoved)  # every checkpoint retracted before the blocks
    index.apply(demotion)
    assert index.blocks == {} and index.checkpoints["device"] == {}
    assert (index.host_blocks, index.checkpoints["host"]) == host_before  # the host copies stay
    assert index.reusable_tokens(tokens, page) == 0
    host_hit = index.reusable_tokens(tokens, page, with_host=True)
    assert host_hit > 0

    req = Req(2, tokens)
    assert engine.admit(req)
    plan = cache.take_load_plan(req)
    assert plan is not None and plan.applied and plan.hit_len == host_hit
    load_back = cache.take_events()
    stored = [e for e in load_back if isinstance(e, BlockStored)]
    assert stored and all(e.medium == DEVICE_MEDIUM for e in stored)
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == chain_block_hashes(tokens[: plan.hit_len], page)  # the path, from the root
    assert stored[0].parent_block_hash is None
    checkpoint = next(e for e in load_back if isinstance(e, CheckpointStored))
    assert load_back.index(checkpoint) > load_back.index(stored[-1])  # after its blocks
    assert (checkpoint.tier, checkpoint.depth_tokens, checkpoint.block_hash) == (
        "device",
        plan.hit_len,
        hashes[-1],
    )
    index.apply(load_back)
    assert_mirrors_both_tiers(index, cache)
    assert index.reusable_tokens(tokens, page) == plan.hit_len
    while req.kv_len < len(tokens):
        assert engine.forward(req, min(64, len(tokens) - req.kv_len))
    req.output_ids.append(10_000)
    engine.finish(req)
    index.apply(cache.take_events())
    assert_mirrors_both_tiers(index, cache)


def test_host_eviction_retracts_the_host_checkpoint_before_its_host_blocks() -> None:
    engine = make_events_engine(**EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(130)))
    cache.evict(num_tokens=10_000)
    index = PrefixIndex()
    index.apply(cache.take_events())
    cache.evict_host(num_tokens=10_000, num_slots=100)
    events = cache.take_events()
    kinds = [label(e) for e in events]
    assert kinds[-1] == f"BlockRemoved {HOST_MEDIUM}"
    assert set(kinds[:-1]) == {"CheckpointRemoved host dropped"}
    index.apply(events)
    assert index.host_blocks == {} and index.checkpoints["host"] == {} and cache.tree.num_nodes == 1
    assert_mirrors_both_tiers(index, cache)


def test_an_insert_through_host_only_nodes_announces_them_on_the_device() -> None:
    """An insert that brings the KV of host-only nodes revives them: device blocks again, named by their
    host blocks' hashes, before the insert's own checkpoint."""
    engine = make_events_engine(**EXTRA)
    cache = engine.cache
    tokens = prompt(130)
    engine.run(Req(1, tokens))
    cache.evict(num_tokens=10_000)
    index = PrefixIndex()
    index.apply(cache.take_events())
    kv = cache.alloc_token_slots(128)
    slot = cache.alloc_state_slot()
    assert kv is not None and slot is not None
    cache.insert(tokens[:128], kv, slot)
    events = cache.take_events()
    stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == chain_block_hashes(tokens[:128], 1)
    assert all(e.medium == DEVICE_MEDIUM for e in events if isinstance(e, BlockStored))
    index.apply(events)
    assert_mirrors_both_tiers(index, cache)
    assert index.reusable_tokens(tokens[:128], 1) == 128


def test_the_cap_under_drop_retracts_host_copies_as_capped() -> None:
    engine = make_events_engine(mamba_max_states_per_path=1, host_path_cap="drop", **EXTRA)
    cache = engine.cache
    index = PrefixIndex()
    for rid, length in enumerate((64, 130, 200)):  # a request's own match locks the checkpoint it
        engine.run(Req(rid, prompt(length)))  # resumes from: the cap takes the one above it, both tiers
    events = cache.take_events()
    assert "CheckpointRemoved host capped" in {label(e) for e in events}
    index.apply(events)
    assert_mirrors_both_tiers(index, cache)


def test_write_back_copies_an_internal_checkpoint_onto_a_device_block() -> None:
    """write_back copies an internal checkpoint the device drops even when the node's KV has no host copy
    (no host room for KV): the host checkpoint sits on a device block, and goes before that block does."""
    engine = make_events_engine(host_write_policy="write_back", host_kv=8, host_slots=16, **EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(200)))
    index = PrefixIndex()
    index.apply(cache.take_events())
    cache.evict(num_states=3)
    events = cache.take_events()
    on_device_only = [
        e
        for e in events
        if isinstance(e, CheckpointStored) and e.tier == "host" and e.block_hash not in index.host_blocks
    ]
    assert on_device_only
    index.apply(events)
    assert_mirrors_both_tiers(index, cache)
    with pytest.raises(InvalidArgument, match="live checkpoint"):  # its block cannot go under it
        PrefixIndex(dict(index.blocks), {}, {"device": {}, "host": dict(index.checkpoints["host"])}).apply(
            [BlockRemoved([on_device_only[0].block_hash])]
        )
    cache.evict(num_tokens=10_000)
    index.apply(cache.take_events())
    assert_mirrors_both_tiers(index, cache)
    assert index.checkpoints == {"device": {}, "host": {}} and index.blocks == {}


def test_write_back_host_room_for_a_checkpoint_may_take_the_nodes_last_children() -> None:
    """State eviction under write_back copies an internal checkpoint to a full host: the host eviction
    that makes room takes the node's only child (a host-only leaf), so the node is a leaf when its
    checkpoint goes. It is evicted as a leaf (demoted: its copies are on the host), not tombstoned (the
    tree asserted an internal node there; found by the state machine below)."""
    engine = make_events_engine(host_write_policy="write_back", host_slots=1, **EXTRA)
    cache = engine.cache
    for length in (8, 16):
        kv, slot = cache.alloc_token_slots(length), cache.alloc_state_slot()
        assert kv is not None and slot is not None
        cache.insert(prompt(length), kv, slot)
    cache.evict(num_tokens=8)  # the leaf at 16 is demoted, its checkpoint takes the one host slot
    index = PrefixIndex()
    index.apply(cache.take_events())
    (node,) = [n for n in cache.tree.nodes() if n.mamba_slot is not None]
    assert node.depth == 8 and all(child.value is None for child in node.children.values())
    cache.evict(num_states=1)
    engine.check()
    assert cache.tree.num_nodes == 2 and node.value is None and node.host_slot is not None
    index.apply(cache.take_events())
    assert_mirrors_both_tiers(index, cache)


def test_the_replay_keeps_the_tiers_apart_and_is_strict() -> None:
    (h,) = chain_block_hashes([1], 1)
    index = PrefixIndex()
    index.apply([BlockStored([h], None, [1], 1), BlockStored([h], None, [1], 1, medium=HOST_MEDIUM)])
    assert index.blocks == {h: None} and index.host_blocks == {h: None}  # one block, on both tiers
    with pytest.raises(InvalidArgument, match="unknown parent"):
        index.apply([BlockStored([9], 8, [2], 1, medium=HOST_MEDIUM)])
    with pytest.raises(InvalidArgument, match="stored twice"):
        index.apply([BlockStored([h], None, [1], 1, medium=HOST_MEDIUM)])
    with pytest.raises(InvalidArgument, match="unknown medium"):
        index.apply([BlockStored([5], None, [1], 1, medium="DISK")])
    index.apply([CheckpointStored(h, 1, "host")])
    index.apply([BlockRemoved([h])])  # a demotion: the host copy and its checkpoint stay
    assert index.reusable_tokens([1], 1) == 0 and index.reusable_tokens([1], 1, with_host=True) == 1
    with pytest.raises(InvalidArgument, match="unknown or checkpointed"):
        index.apply([CheckpointStored(h, 1, "device")])  # not on the device any more
    with pytest.raises(InvalidArgument, match="live checkpoint"):
        index.apply([BlockRemoved([h], HOST_MEDIUM)])
    index.apply([CheckpointRemoved(h, 1, "dropped", "host"), BlockRemoved([h], HOST_MEDIUM)])
    assert index == PrefixIndex()


# ------------------------------------------------------------------------------------ state machine
class HostEventsMachine(HostTierMachine):
    """:class:`HostTierMachine`'s host-tier workload over a cache that records events, plus demotions of
    everything, matches through host-only edges (which split them), and a host eviction while a load-back
    pins its path. After every step the events replay to both tiers exactly; a rule asks the replay what
    a sequence would reuse, on the device and after a load-back."""

    coverage: ClassVar[Counter[str]]

    @initialize(
        cap=st.sampled_from([-1, 2]), cap_mode=st.sampled_from(["keep", "drop"]), page=st.sampled_from([1, 4])
    )
    def build(self, cap: int, cap_mode: str, page: int) -> None:
        self.engine = make_events_engine(
            num_tokens=768,
            num_slots=40,
            host_kv=256,
            host_slots=5,
            page_size=1 if self.strategy == "no_buffer" else page,  # no_buffer pages by token only
            host_write_policy=self.policy,
            mamba_cache_chunk_size=16,
            chunked_prefill_size=32,
            mamba_track_interval=8,
            mamba_max_states_per_path=cap,
            host_path_cap=cap_mode,
            **STRATEGIES[self.strategy],
        )
        self.index = PrefixIndex()
        self.host_hits = 0

    @rule(base=st.sampled_from([0, 1000]), length=st.sampled_from([40, 90]), tail=st.integers(0, 20))
    def run_then_demote(self, base: int, length: int, tail: int) -> None:
        """A whole request, then every unlocked device leaf demoted (or dropped)."""
        self.run_whole(base, length, tail)
        self.engine.cache.evict(num_tokens=1000)
        self.engine.check()

    @rule(pick=st.integers(0, 50), cut=st.integers(0, 5))
    def match_through_host(self, pick: int, cut: int) -> None:
        """A match of a node's path, or of a prefix of it: one ending inside an edge (host-only or not)
        splits it, which must publish nothing."""
        nodes = [n for n in self.engine.cache.tree.nodes() if not n.is_root]
        if nodes:
            tokens = path_tokens(nodes[pick % len(nodes)])
            self.engine.cache.match_prefix(tokens[: max(1, len(tokens) - cut)])
            self.engine.check()

    @rule(pick=st.integers(0, 50), tokens=st.integers(1, 200))
    def host_evict_during_load_back(self, pick: int, tokens: int) -> None:
        """A host eviction between a load-back's plan and its application (the plan pins its path)."""
        cache = self.engine.cache
        nodes = list(cache.tree.host_only_nodes.values())
        if not nodes:
            return
        plan = cache.plan_load_back(path_tokens(nodes[pick % len(nodes)]))
        if plan is None:
            return
        cache.evict_host(tokens)
        cache.apply_load_plan(plan)
        self.engine.check()

    @rule(pick=st.integers(0, 50), cut=st.integers(0, 12), tail=st.booleans())
    def router_predicts_the_hit(self, pick: int, cut: int, tail: bool) -> None:
        """The replay's answer for a cached path (cut short, maybe with a token the tree lacks) is the
        cache's: the device hit ``peek_prefix`` reports, and with the host the depth a load-back reaches
        (the tree's host extension)."""
        cache = self.engine.cache
        tree, page = cache.tree, cache.config.page_size
        nodes = [n for n in tree.nodes() if not n.is_root]
        if not nodes:
            return
        tokens = path_tokens(nodes[pick % len(nodes)])
        tokens = tokens[: max(1, len(tokens) - cut)] + ([9_999_999] if tail else [])
        device = cache.peek_prefix(tokens).hit_len
        assert self.index.reusable_tokens(tokens, page) == device
        target, _ = tree.host_extension(tree.walk(RadixKey(tokens)))
        with_host = device if target is None else target.depth
        assert self.index.reusable_tokens(tokens, page, with_host=True) == with_host
        type(self).coverage["host hit predicted"] += with_host > device

    @invariant()
    def events_replay_to_both_tiers(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        events = engine.cache.take_events()
        coverage = type(self).coverage
        for event in events:
            coverage[label(event)] += 1
        hits = engine.cache.host_stats.host_hits
        coverage["load-back"] += hits - self.host_hits
        self.host_hits = hits
        self.index.apply(events)
        assert_mirrors_both_tiers(self.index, engine.cache)
        host_blocks = (
            self.index.host_blocks
        )  # write_back's internal copies: host checkpoints on device blocks
        coverage["host checkpoint on a device block"] += sum(
            h not in host_blocks for h in self.index.checkpoints["host"]
        )


# every policy on both strategies the brief names; extra_buffer_lazy on one policy
CASES = [(s, p) for s in ("no_buffer", "extra_buffer") for p in POLICIES] + [
    ("extra_buffer_lazy", "resumable")
]


@pytest.mark.parametrize(("strategy", "policy"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_state_machine_events_replay_to_both_tiers(strategy: str, policy: str) -> None:
    machine = type(
        f"HostEvents_{strategy}_{policy}",
        (HostEventsMachine,),
        {"strategy": strategy, "policy": policy, "coverage": Counter()},
    )
    machine.TestCase.settings = settings(
        max_examples=12,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
    reached = machine.coverage
    print("COVERAGE", strategy, policy, dict(sorted(reached.items())))
    for kind in (
        f"BlockStored {HOST_MEDIUM}",
        f"BlockRemoved {HOST_MEDIUM}",
        f"BlockRemoved {DEVICE_MEDIUM}",
        "CheckpointStored host",
        "load-back",
    ):
        assert reached[kind], (kind, dict(reached))
    assert any(k.startswith("CheckpointRemoved host") for k in reached), dict(reached)
