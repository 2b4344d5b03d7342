"""The host tier in the tree (issue 25, first slice): residency, demotion, host hits and the load-back plan.

A small engine plays the model on real pools: every state it computes is stamped with its prefix's
fingerprint (:mod:`mamba_radix.state_stamp`) and every KV row of a real ``MHATokenToKVPool`` holds its
token and position, so a load-back is checked byte for byte: the loaded checkpoint resumes the right
prefix, and the KV rows the request reads hold that prefix's tokens after the round trip through the host.
The invariants (DESIGN.md §5 with the host tier's: residency subtrees, host conservation) run after every
step, in the unit tests and in a Hypothesis state machine per buffer strategy and write policy.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mamba_radix import CacheConfig, MambaRadixCache, Req
from mamba_radix.errors import ConfigError, InvalidArgument
from mamba_radix.peers import apply_peer
from mamba_radix.policy import CachePolicy
from mamba_radix.pools import MHATokenToKVPool
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp

EXTRA = {"mamba_radix_cache_strategy": "extra_buffer"}
NO_BUFFER = {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}
LAZY = {"mamba_radix_cache_strategy": "extra_buffer_lazy"}
STRATEGIES = {"no_buffer": NO_BUFFER, "extra_buffer": EXTRA, "extra_buffer_lazy": LAZY}
POLICIES = ("write_through", "write_through_selective", "write_back", "resumable")


class HostEngine:
    """Plays the model for the lifecycle: stamps states, writes each new token's KV row as
    ``(token, position)`` into a real KV storage; checks the invariants and the bytes after every step."""

    def __init__(self, cache: MambaRadixCache, storage: MHATokenToKVPool) -> None:
        self.cache = cache
        self.storage = storage
        self.running: list[Req] = []

    def check(self) -> None:
        cache = self.cache
        cache.check_invariants(self.running)
        tree = cache.tree
        for node in tree.nodes():
            if node.is_root or node.value is None:
                continue
            tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
            assert self.kv_tokens(tree.path_values(node)) == tokens  # device KV holds its prefix
            if node.mamba_slot is not None:
                assert read_stamp(cache.mamba_pool, node.mamba_slot) == (fingerprint(tokens), node.depth)

    def kv_tokens(self, indices: torch.Tensor) -> list[int]:
        rows = self.storage.k_buffer[0][indices]
        positions = rows[:, 0, 1].to(torch.int64).tolist()
        assert positions == list(range(len(positions))), "a KV row holds another position"
        return rows[:, 0, 0].to(torch.int64).tolist()

    def admit(self, req: Req) -> bool:
        ok = self.cache.admit(req)
        if ok:
            self.running.append(req)
            assert read_stamp(self.cache.mamba_pool, req.mamba_pool_idx) == (
                fingerprint(req.token_ids(req.kv_len)),
                req.kv_len,
            )
            row = self.cache.req_to_token_pool.req_to_token[req.req_pool_idx][: req.kv_len].to(torch.int64)
            assert self.kv_tokens(row) == list(req.token_ids(req.kv_len))
        self.check()
        return ok

    def forward(self, req: Req, num_tokens: int, *, finished: bool = False) -> bool:
        start = req.kv_len
        if start < len(req.origin_input_ids):  # a prefill chunk: cut as SGLang's scheduler does
            num_tokens = self.cache.prefill_chunk_len(req, num_tokens)
            if num_tokens == 0:
                return False
        plan = self.cache.extend(req, num_tokens)
        if plan is None:
            return False
        tokens = req.token_ids(plan.end)
        for i, idx in enumerate(plan.kv_indices.tolist()):
            self.storage.k_buffer[0][idx, 0, 0] = float(tokens[start + i])
            self.storage.k_buffer[0][idx, 0, 1] = float(start + i)
        write_stamp(self.cache.mamba_pool, plan.live_slot, fingerprint(tokens), plan.end)
        if plan.track_slot is not None:
            write_stamp(
                self.cache.mamba_pool, plan.track_slot, fingerprint(tokens[: plan.track_len]), plan.track_len
            )
        self.cache.commit(plan, finished=finished)
        self.check()
        return True

    def run(self, req: Req, num_output_tokens: int = 2) -> int:
        """The whole request; returns its usable hit length at admission."""
        assert self.admit(req)
        hit = req.cache_protected_len
        while req.kv_len < len(req.origin_input_ids):
            assert self.forward(req, min(64, len(req.origin_input_ids) - req.kv_len))
            if req.kv_len == len(req.origin_input_ids):
                req.output_ids.append(10_000 + len(req.output_ids))
        for _ in range(num_output_tokens - 1):
            assert self.forward(req, 1)
            req.output_ids.append(10_000 + len(req.output_ids))
        self.finish(req)
        return hit

    def finish(self, req: Req) -> None:
        self.cache.finish(req)
        self.running.remove(req)
        self.check()


def make_engine(
    *,
    num_tokens: int = 2048,
    num_slots: int = 48,
    host_kv: int = 1024,
    host_slots: int = 16,
    events: bool = False,
    policy: CachePolicy | None = None,
    peer: str | None = None,
    **fields: object,
) -> HostEngine:
    """A :class:`HostEngine` over real pools; ``events`` / ``policy`` go to the cache, ``peer`` (a preset of
    :mod:`mamba_radix.peers`) is applied to the config built from ``fields``."""
    config = CacheConfig(host_kv_tokens=host_kv, host_state_slots=host_slots, **fields)  # type: ignore[arg-type]
    if peer is not None:
        config = apply_peer(config, peer)
    storage = MHATokenToKVPool(num_tokens, config.page_size, torch.float32, 1, 2, 1)
    cache = MambaRadixCache.build(
        config,
        num_tokens=num_tokens,
        num_slots=num_slots,
        max_running_requests=6,
        max_context_len=1024,
        kv_storage=storage,
        events=events,
        policy=policy,
    )
    return HostEngine(cache, storage)


def prompt(length: int, base: int = 0) -> list[int]:
    return [base + i for i in range(length)]


# ------------------------------------------------------------------------------------------- config
def test_off_by_default_and_config_refusals() -> None:
    assert not CacheConfig().host_tier
    assert CacheConfig().host_write_policy == "write_through"  # SGLang's default
    with pytest.raises(ConfigError, match="did you mean 'write_back'"):
        CacheConfig(host_kv_tokens=8, host_state_slots=2, host_write_policy="write_bak")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs both pools"):
        CacheConfig(host_kv_tokens=8)
    with pytest.raises(ConfigError, match="needs both pools"):
        CacheConfig(host_state_slots=8)
    with pytest.raises(ConfigError, match="int8"):
        CacheConfig(host_kv_tokens=8, host_state_slots=2, checkpoint_format="int8")
    with pytest.raises(ConfigError, match="unified"):
        CacheConfig(host_kv_tokens=8, host_state_slots=2, enable_unified_memory=True)
    with pytest.raises(ConfigError, match=">= 0"):
        CacheConfig(host_kv_tokens=-8, host_state_slots=2)
    with pytest.raises(ConfigError, match="threshold"):
        CacheConfig(host_kv_tokens=8, host_state_slots=2, host_write_through_threshold=0)
    with pytest.raises(ConfigError, match="page_size"):
        CacheConfig(host_kv_tokens=10, host_state_slots=2, page_size=4)


def test_cache_refusals_with_the_tier() -> None:
    config = CacheConfig(host_kv_tokens=64, host_state_slots=4)
    # events cover both tiers (docs/events.md)
    assert MambaRadixCache.build(config, num_tokens=128, num_slots=16, events=True).events_enabled

    class Research(CachePolicy):
        pass

    # a research policy runs with the tier (test_host_policies.py); the oracle alone is refused there
    assert MambaRadixCache.build(config, num_tokens=128, num_slots=16, policy=Research()).host_stats
    off = MambaRadixCache.build(CacheConfig(), num_tokens=128, num_slots=16)
    assert off.host_kv_pool is None and off.host_stats is None
    with pytest.raises(InvalidArgument, match="host tier"):
        off.evict_host(1)
    assert off.load_back(prompt(8)) is None


# ------------------------------------------------------------------------ demotion and load-back
def warm(engine: HostEngine, policy: str, tokens: list[int]) -> None:
    """Run ``tokens`` as a request; twice under write_through_selective (backed up at the second hit)."""
    engine.run(Req(1, tokens))
    if policy == "write_through_selective":
        engine.run(Req(2, tokens))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_demote_then_host_hit_loads_back_byte_exact(strategy: str, policy: str) -> None:
    engine = make_engine(host_write_policy=policy, **STRATEGIES[strategy])
    cache, tree = engine.cache, engine.cache.tree
    tokens = prompt(200)
    warm(engine, policy, tokens)
    if policy == "resumable":  # it keeps resume points only: a next turn resumes from the sequence's end
        end = max(tree.nodes(), key=lambda n: n.depth)
        tokens = [t for n in reversed(list(tree.path_to_root(end))) for t in n.key] + [99_999]
    device_hit = cache.peek_prefix(tokens[:-1]).hit_len
    assert device_hit > 0
    if policy not in ("write_back", "resumable"):  # those two copy at device eviction
        assert cache.host_stats.kv_backed_up > 0  # backed up before any eviction
    cache.evict(num_tokens=10_000)  # everything unlocked leaves the device
    engine.check()
    assert tree.full_evictable_size == 0 and tree.host_only_nodes, "the nodes stay, host-only"
    assert cache.peek_prefix(tokens[:-1]).hit_len == 0  # no device hit left
    match = cache.match_prefix(tokens[:-1])  # the host extension is reported, nothing is loaded
    assert match.last_node is tree.root and match.host_hit_len == device_hit and match.host_checkpoint
    # the KV of the device indices is overwritten before the load-back: the bytes must come from the host
    engine.storage.k_buffer[0].fill_(-1.0)
    req = Req(9, tokens)
    assert engine.admit(req)  # checks the live state's stamp and the row's KV bytes
    assert req.cache_protected_len == device_hit, "the host hit is the device hit of before"
    plan = cache.take_load_plan(req)
    assert plan is not None and plan.applied and plan.hit_len == device_hit
    assert plan.num_tokens == device_hit and cache.host_stats.host_hits == 1
    assert cache.take_load_plan(req) is None  # taken once
    while req.kv_len < len(tokens):
        assert engine.forward(req, min(64, len(tokens) - req.kv_len))
    req.output_ids.append(10_000)
    engine.finish(req)


def test_a_checkpoint_evicted_from_the_device_keeps_its_host_copy() -> None:
    engine = make_engine(**EXTRA)
    cache, tree = engine.cache, engine.cache.tree
    tokens = prompt(200)
    engine.run(Req(1, tokens))
    holders = [n for n in tree.nodes() if n.mamba_slot is not None]
    assert holders and all(n.host_slot is not None for n in holders)  # write_through: copies at insert
    cache.evict(num_states=len(holders))
    engine.check()
    assert cache.mamba_evictable_size() == 0
    assert all(tree.is_attached(n) and n.host_slot is not None for n in holders)
    req = Req(2, tokens)
    assert engine.admit(req)
    assert req.cache_protected_len == max(n.depth for n in holders if n.depth < len(tokens))
    plan = cache.take_load_plan(req)
    assert plan is not None and plan.applied


def test_a_load_plan_applied_twice_is_refused_and_changes_nothing() -> None:
    engine = make_engine(**EXTRA)
    cache = engine.cache
    tokens = prompt(130)
    engine.run(Req(1, tokens))
    cache.evict(num_tokens=10_000)
    plan = cache.plan_load_back(tokens[:-1])
    assert plan is not None and not plan.applied
    applied = cache.apply_load_plan(plan)
    assert applied.applied
    engine.check()
    before = (
        cache.tree.pretty_print(),
        cache.host_kv_pool.used,
        cache.host_state_pool.used,
        cache.token_to_kv_pool_allocator.available_size(),
        cache.mamba_pool.available_size(),
    )
    for again in (plan, applied):
        with pytest.raises(InvalidArgument, match="applied already"):
            cache.apply_load_plan(again)
    after = (
        cache.tree.pretty_print(),
        cache.host_kv_pool.used,
        cache.host_state_pool.used,
        cache.token_to_kv_pool_allocator.available_size(),
        cache.mamba_pool.available_size(),
    )
    assert before == after
    engine.check()
    assert cache.plan_load_back(tokens[:-1]) is None  # the device holds the hit now


def test_a_locked_node_is_never_demoted() -> None:
    engine = make_engine(**EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(200)))
    req = Req(2, prompt(200))
    assert engine.admit(req)
    locked = req.last_node
    cache.evict(num_tokens=10_000, num_states=100)
    engine.check()
    assert locked.value is not None and all(n.value is not None for n in cache.tree.path_to_root(locked))


def test_an_insert_through_host_only_nodes_revives_them_with_its_kv() -> None:
    engine = make_engine(**EXTRA)
    cache, tree = engine.cache, engine.cache.tree
    tokens = prompt(130)
    engine.run(Req(1, tokens))
    cache.evict(num_tokens=10_000)
    host_only = list(tree.host_only_nodes.values())
    assert host_only
    kv = cache.alloc_token_slots(128)
    slot = cache.alloc_state_slot()
    for i, idx in enumerate(kv.tolist()):  # the caller computed these tokens' KV itself
        engine.storage.k_buffer[0][idx, 0, 0] = float(tokens[i])
        engine.storage.k_buffer[0][idx, 0, 1] = float(i)
    write_stamp(cache.mamba_pool, slot, fingerprint(tokens[:128]), 128)
    free_before = cache.token_to_kv_pool_allocator.available_size()
    cache.insert(tokens[:128], kv, slot)
    engine.check()
    # the host-only nodes on the path took the caller's KV: nothing came back as a duplicate
    assert cache.token_to_kv_pool_allocator.available_size() == free_before
    assert all(n.value is not None for n in host_only if n.depth <= 128 and tree.is_attached(n))
    assert cache.peek_prefix(tokens[:128]).hit_len == 128


def test_an_insert_claiming_host_only_kv_as_its_prefix_is_refused_and_changes_nothing() -> None:
    engine = make_engine(**EXTRA)
    cache, tree = engine.cache, engine.cache.tree
    tokens = prompt(130)
    engine.run(Req(1, tokens))
    cache.evict(num_tokens=10_000)
    kv = cache.alloc_token_slots(128)
    slot = cache.alloc_state_slot()
    before = (tree.pretty_print(), cache.token_to_kv_pool_allocator.available_size(), cache.host_kv_pool.used)
    with pytest.raises(InvalidArgument, match="host-only"):
        cache.insert(tokens[:128], kv, slot, prev_prefix_len=64)
    assert before == (
        tree.pretty_print(),
        cache.token_to_kv_pool_allocator.available_size(),
        cache.host_kv_pool.used,
    )
    cache.token_to_kv_pool_allocator.free(kv)
    cache.mamba_pool.free([slot])
    engine.check()


# ------------------------------------------------------------------------------------ write policies
def test_write_through_selective_backs_up_at_the_threshold() -> None:
    engine = make_engine(host_write_policy="write_through_selective", host_write_through_threshold=3, **EXTRA)
    cache = engine.cache
    tokens = prompt(130)
    engine.run(Req(1, tokens))
    engine.run(Req(2, tokens))
    assert cache.host_stats.kv_backed_up == 0
    engine.run(Req(3, tokens))
    assert cache.host_stats.kv_backed_up > 0


def test_write_back_backs_up_only_at_eviction() -> None:
    engine = make_engine(host_write_policy="write_back", **EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(130)))
    engine.run(Req(2, prompt(130)))
    assert cache.host_stats.kv_backed_up == 0 and cache.host_kv_pool.used == 0
    cache.evict(num_tokens=10_000)
    engine.check()
    assert cache.host_stats.kv_backed_up > 0 and cache.tree.host_only_nodes


def test_without_host_room_a_victim_is_dropped_as_without_the_tier() -> None:
    engine = make_engine(host_write_policy="write_back", host_kv=8, host_slots=1, **EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(130)))
    cache.evict(num_tokens=10_000)
    engine.check()
    assert cache.host_stats.backups_skipped > 0
    assert cache.tree.num_nodes == 1 + len(cache.tree.host_only_nodes)


def test_write_back_frees_a_host_checkpoint_whose_kv_never_reached_the_host() -> None:
    """write_back copies an internal checkpoint the device drops even when the node's KV has no host copy;
    with no host room for KV, the node later leaves the device and the tree: its host slot is freed with
    it, not leaked (the invariants' conservation rule)."""
    engine = make_engine(host_write_policy="write_back", host_kv=8, host_slots=16, **EXTRA)
    cache = engine.cache
    engine.run(Req(1, prompt(200)))
    cache.evict(num_states=3)
    engine.check()
    assert any(n.host_slot is not None and n.host_kv is None for n in cache.tree.nodes())
    cache.evict(num_tokens=10_000)
    engine.check()
    assert cache.tree.num_nodes == 1 and cache.host_state_pool.used == 0


# ------------------------------------------------------------------------------------ host eviction
def test_host_eviction_takes_lru_host_only_leaves_and_frees_their_copies() -> None:
    engine = make_engine(**EXTRA)
    cache, tree = engine.cache, engine.cache.tree
    engine.run(Req(1, prompt(130, base=0)))
    engine.run(Req(2, prompt(130, base=5_000)))
    cache.evict(num_tokens=10_000)
    engine.check()
    leaves = sorted(
        (n for n in tree.host_only_nodes.values() if not n.children),
        key=lambda n: (n.last_access, -n.depth, n.id),
    )
    assert len(leaves) >= 2
    oldest = leaves[0]
    used = cache.host_kv_pool.used
    freed = cache.evict_host(num_tokens=1)
    engine.check()
    assert not tree.is_attached(oldest) and freed.num_tokens > 0
    assert cache.host_kv_pool.used == used - freed.num_tokens == tree.host_kv_tokens
    cache.evict_host(num_tokens=10_000, num_slots=100)
    engine.check()
    assert tree.num_nodes == 1 and cache.host_kv_pool.used == 0 and cache.host_state_pool.used == 0
    with pytest.raises(InvalidArgument):
        cache.evict_host(-1)


def test_a_full_host_makes_room_by_host_eviction() -> None:
    engine = make_engine(host_kv=256, host_slots=4, **EXTRA)
    cache = engine.cache
    for i in range(6):
        engine.run(Req(i, prompt(130, base=10_000 * i)))
        cache.evict(num_tokens=10_000)
        engine.check()
    assert cache.host_stats.host_tokens_evicted > 0
    assert cache.host_kv_pool.used <= 256 and cache.host_state_pool.used <= 4


# ------------------------------------------------------------------------------------ state machine
class HostTierMachine(RuleBasedStateMachine):
    """Admit / extend / finish / evict / host-evict with the host tier on, on real pools; every step checks
    the invariants with conservation over both tiers, the stamps and the KV bytes. Each run draws the
    per-path cap (none or 2) and what it does to host copies (``host_path_cap``: keep or drop)."""

    strategy = "extra_buffer"
    policy = "write_through"

    def __init__(self) -> None:
        super().__init__()
        self.rid = 0

    @initialize(cap=st.sampled_from([-1, 2]), cap_mode=st.sampled_from(["keep", "drop"]))
    def build(self, cap: int, cap_mode: str) -> None:
        self.engine = make_engine(
            num_tokens=768,
            num_slots=40,
            host_kv=384,
            host_slots=6,
            host_write_policy=self.policy,
            mamba_cache_chunk_size=16,
            chunked_prefill_size=32,
            mamba_track_interval=8,
            mamba_max_states_per_path=cap,
            host_path_cap=cap_mode,
            **STRATEGIES[self.strategy],
        )

    @rule(
        base=st.sampled_from([0, 0, 1000, 2000]),
        length=st.sampled_from([20, 40, 70, 90]),
        tail=st.integers(0, 20),
    )
    def admit(self, base: int, length: int, tail: int) -> None:
        """A prompt sharing a prefix (of a few fixed lengths) with others, and a tail of its own."""
        if len(self.engine.running) >= 3:
            return
        self.rid += 1
        tokens = prompt(length, base) + [7_000_000 + 100 * self.rid + i for i in range(tail)]
        self.engine.admit(Req(self.rid, tokens))

    @rule(base=st.sampled_from([0, 1000]), length=st.sampled_from([40, 70, 90]), tail=st.integers(0, 20))
    def run_whole(self, base: int, length: int, tail: int) -> None:
        """A whole request at once, when it fits: the tree grows (and later demotes) faster."""
        self.rid += 1
        self._run_whole(prompt(length, base) + [7_000_000 + 100 * self.rid + i for i in range(tail)])

    @rule(pick=st.integers(0, 50), tail=st.integers(1, 30))
    def next_turn(self, pick: int, tail: int) -> None:
        """A later turn: a cached sequence's end (on either tier) extended by new tokens, so its
        checkpoint goes stale (what resumable's host eviction takes first)."""
        tree = self.engine.cache.tree
        leaves = [n for n in tree.nodes() if not n.children and not n.is_root]
        if not leaves:
            return
        leaf = leaves[pick % len(leaves)]
        self.rid += 1
        tokens = [t for n in reversed(list(tree.path_to_root(leaf))) for t in n.key]
        if len(tokens) > 400:  # well inside the pools and max_context_len
            return
        self._run_whole(tokens + [8_000_000 + 100 * self.rid + i for i in range(tail)])

    def _run_whole(self, tokens: list[int]) -> None:
        req = Req(self.rid, tokens)
        if not self.engine.admit(req):
            return
        while req.kv_len < len(tokens):
            if not self.engine.forward(req, min(32, len(tokens) - req.kv_len)):
                return  # short of KV: it stays running, finished by the finish rule later
        req.output_ids.append(10_000)
        self.engine.finish(req)

    @rule(pick=st.integers(0, 5), n=st.integers(1, 40))
    def extend(self, pick: int, n: int) -> None:
        if not self.engine.running:
            return
        req = self.engine.running[pick % len(self.engine.running)]
        left = len(req.origin_input_ids) - req.kv_len
        if left > 0:
            if self.engine.forward(req, min(n, left)) and req.kv_len == len(req.origin_input_ids):
                req.output_ids.append(10_000 + len(req.output_ids))
        elif self.engine.forward(req, 1):
            req.output_ids.append(10_000 + len(req.output_ids))

    @rule(pick=st.integers(0, 5))
    def finish(self, pick: int) -> None:
        running = [r for r in self.engine.running if r.kv_len >= len(r.origin_input_ids)]
        if running:
            self.engine.finish(running[pick % len(running)])

    @rule(tokens=st.sampled_from([0, 16, 64, 1000]), states=st.integers(0, 4))
    def evict(self, tokens: int, states: int) -> None:
        self.engine.cache.evict(tokens, states)
        self.engine.check()

    @rule(tokens=st.integers(0, 100), slots=st.integers(0, 2))
    def evict_host(self, tokens: int, slots: int) -> None:
        self.engine.cache.evict_host(tokens, slots)
        self.engine.check()

    @rule(tokens=st.integers(-3, 3), slots=st.integers(-3, -1))
    def refused_evict_host(self, tokens: int, slots: int) -> None:
        """A refused call changes nothing in either tier."""
        cache = self.engine.cache
        before = (cache.tree.pretty_print(), cache.host_kv_pool.used, cache.host_state_pool.used)
        with pytest.raises(InvalidArgument):
            cache.evict_host(tokens, slots)
        assert before == (cache.tree.pretty_print(), cache.host_kv_pool.used, cache.host_state_pool.used)

    @invariant()
    def sound(self) -> None:
        self.engine.check()


def _machine(strategy: str, policy: str) -> type:
    return type(f"HostTier_{strategy}_{policy}", (HostTierMachine,), {"strategy": strategy, "policy": policy})


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_state_machine(strategy: str, policy: str) -> None:
    machine = _machine(strategy, policy)
    machine.TestCase.settings = settings(
        max_examples=12,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    machine.TestCase().runTest()
