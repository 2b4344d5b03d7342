"""Our host placement (issue 25): the ``resumable`` write policy and the per-path cap's ``host_path_cap``.

``resumable`` copies at device eviction the checkpoints a later request can resume from (a sequence's end,
the checkpoint a fork resumes from), evicting host copies for them if it must, and the other checkpoints
only into free host memory; host eviction takes stale host checkpoints (a deeper checkpoint on the same
single-child chain serves every request that passes) before the host-only leaves. ``host_path_cap="drop"`` makes the per-path cap count and free host copies too (SGLang #39853);
``"keep"`` (the default) leaves them (SGLang #31230).

Real pools and real bytes throughout: the engine of ``test_host_tier`` stamps every state with its prefix's
fingerprint and writes every KV row as ``(token, position)``, and checks the invariants (both tiers'
conservation: every host copy freed exactly once) after each step.
"""

from __future__ import annotations

import pytest
from test_host_tier import EXTRA, NO_BUFFER, HostEngine, make_engine, prompt

from mamba_radix import CacheConfig, Req
from mamba_radix.errors import ConfigError
from mamba_radix.node import TreeNode


def tokens_of(engine: HostEngine, node: TreeNode) -> list[int]:
    return [t for n in reversed(list(engine.cache.tree.path_to_root(node))) for t in n.key]


def deepest(engine: HostEngine) -> TreeNode:
    return max(engine.cache.tree.nodes(), key=lambda n: (n.depth, n.id))


def record_state_copies(engine: HostEngine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool, bool]]:
    """Every host copy of a checkpoint the cache makes, as (depth, whether a resume point at that moment,
    whether its host slot was free before the copy)."""
    cache = engine.cache
    copies: list[tuple[int, bool, bool]] = []
    copy = cache._copy_state

    def recording(node: TreeNode) -> bool:
        copies.append(
            (node.depth, cache.tree.is_resume_point(node), cache.host_state_pool.available_size() >= 1)
        )
        return copy(node)

    monkeypatch.setattr(cache, "_copy_state", recording)
    return copies


# ------------------------------------------------------------------------------------------ config
def test_config_names_and_defaults() -> None:
    assert CacheConfig().host_path_cap == "keep"  # today's behaviour: the cap keeps host copies
    on = {"host_kv_tokens": 64, "host_state_slots": 4}
    assert CacheConfig(host_write_policy="resumable", host_path_cap="drop", **on).host_path_cap == "drop"
    with pytest.raises(
        ConfigError, match=r"host_path_cap must be one of keep, drop, got 'dorp' \(did you mean"
    ):
        CacheConfig(host_path_cap="dorp", **on)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resumable"):  # the choices name the new policy
        CacheConfig(host_write_policy="resumeable", **on)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ resumable placement
@pytest.mark.parametrize("host_slots", [1, 32])
@pytest.mark.parametrize("strategy", [EXTRA, NO_BUFFER], ids=["extra_buffer", "no_buffer"])
def test_resumable_copies_resume_points_first(
    strategy: dict, host_slots: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two turns of one conversation, then the device is emptied. Resumable copies the sequence's end and
    the stale checkpoints above it only into free host memory: with one host slot none of them (each would
    displace the end's copy), with 32 every one write_back copies. Either way the next turn loads its
    whole prefix back from the host, byte-exact (the engine checks stamps and KV rows)."""
    copied = {}
    for policy in ("write_back", "resumable"):
        engine = make_engine(host_write_policy=policy, host_slots=host_slots, **strategy)
        copies = record_state_copies(engine, monkeypatch)
        turn1 = prompt(200)
        engine.run(Req(1, turn1))
        turn2 = tokens_of(engine, deepest(engine)) + [50_000 + i for i in range(90)]
        engine.run(Req(2, turn2))
        engine.cache.evict(num_tokens=10_000)
        engine.check()
        tree = engine.cache.tree
        copied[policy] = sorted(n.depth for n in tree.nodes() if n.host_slot is not None)
        if policy == "resumable":
            assert copies and copies[0][1], copies  # the sequence's end first
            assert all(resume or free for _, resume, free in copies), copies  # the rest into free slots
            end = deepest(engine)
            assert end.host_slot is not None
            if host_slots == 1:
                assert copied[policy] == [end.depth]  # the sequence's end alone
            else:
                assert copied[policy] == copied["write_back"]  # room for every fallback
            turn3 = tokens_of(engine, end) + [60_000 + i for i in range(10)]
            req = Req(3, turn3)
            assert engine.admit(req)
            assert req.cache_protected_len == end.depth  # the whole prefix, from the host
            plan = engine.cache.take_load_plan(req)
            assert plan is not None and plan.hit_len == end.depth
            while req.kv_len < len(turn3):
                assert engine.forward(req, min(64, len(turn3) - req.kv_len))
            req.output_ids.append(10_000)
            engine.finish(req)
    assert len(copied["write_back"]) >= len(copied["resumable"]) >= 1


def test_resumable_keeps_the_checkpoint_a_fork_resumes_from() -> None:
    """Two requests share 130 tokens and diverge: the fork is a tombstone at 130, and the checkpoint above
    it (the chunk grid's 128) is what a third request sharing the prefix resumes from: it is a resume point,
    copied at eviction, and served from the host."""
    engine = make_engine(host_write_policy="resumable", host_slots=32, **EXTRA)
    engine.run(Req(1, prompt(130) + [1_000 + i for i in range(70)]))
    engine.run(Req(2, prompt(130) + [2_000 + i for i in range(70)]))
    tree = engine.cache.tree
    fork = next(n for n in tree.nodes() if len(n.children) >= 2)
    grid = max((n for n in tree.path_to_root(fork) if n.mamba_slot is not None), key=lambda n: n.depth)
    assert tree.is_resume_point(grid) and grid.depth == 128
    engine.cache.evict(num_tokens=10_000, num_states=100)
    engine.check()
    assert grid.host_slot is not None
    req = Req(3, prompt(130) + [3_000 + i for i in range(40)])
    assert engine.admit(req)
    assert req.cache_protected_len == 128 and engine.cache.take_load_plan(req) is not None


def test_host_eviction_takes_a_stale_checkpoint_before_an_older_resumable_one() -> None:
    """The host state pool holds two checkpoints: A's end, then B's. A's next turn makes A's end stale
    (a deeper checkpoint now serves every request passing it) and more recent than B's. When the next copy
    needs a host slot, A's stale copy goes (the node stays), not B's older resumable one (plain LRU would
    take B's host-only leaf)."""
    engine = make_engine(host_write_policy="resumable", host_slots=2, host_kv=2048, **EXTRA)
    cache, tree = engine.cache, engine.cache.tree
    engine.run(Req(1, prompt(130)))
    cache.evict(num_tokens=10_000)
    a_end = deepest(engine)
    a_tokens = tokens_of(engine, a_end)
    engine.run(Req(2, prompt(130, base=5_000)))
    cache.evict(num_tokens=10_000)
    b_end = next(n for n in tree.host_slot_owner.values() if n is not a_end)
    assert a_end.host_slot is not None and b_end.host_slot is not None and cache.host_state_pool.used == 2
    engine.run(Req(3, a_tokens + [70_000 + i for i in range(70)]))  # A's next turn, through its host copy
    assert not tree.is_resume_point(a_end) and a_end.last_access > b_end.last_access
    cache.evict(num_tokens=10_000)  # A's new end needs a host slot
    engine.check()
    assert tree.is_attached(a_end) and a_end.host_slot is None, "the stale copy went"
    assert tree.is_attached(b_end) and b_end.host_slot is not None, "the older resumable copy stayed"
    assert deepest(engine).host_slot is not None


# ------------------------------------------------------------------------------------------ the cap
@pytest.mark.parametrize("policy", ["write_through", "resumable"])
def test_the_cap_keeps_or_drops_host_copies(policy: str) -> None:
    """One long prompt under a cap of 2 checkpoints per path: with ``keep`` the host still holds copies of
    checkpoints the cap dropped from the device (write_through copies each at its insert); with ``drop``
    no path holds more than the cap on either tier, and no dropped checkpoint keeps a host copy."""
    held = {}
    for mode in ("keep", "drop"):
        engine = make_engine(
            host_write_policy=policy,
            host_slots=32,
            mamba_max_states_per_path=2,
            host_path_cap=mode,
            **EXTRA,
        )
        cache, tree = engine.cache, engine.cache.tree
        engine.run(Req(1, prompt(400)))
        if policy == "resumable":  # copies at eviction: empty the device's checkpoints, then run it on
            cache.evict(num_states=100)
            engine.run(Req(2, tokens_of(engine, deepest(engine)) + [80_000 + i for i in range(200)]))
        engine.check()
        capped = [n for n in tree.nodes() if not n.is_root and n.mamba_slot is None and n.children]
        leaf = deepest(engine)
        on_path = [n for n in tree.path_to_root(leaf) if n.mamba_slot is not None or n.host_slot is not None]
        held[mode] = (sum(n.host_slot is not None for n in capped), len(on_path))
        assert cache.host_state_pool.used == len(tree.host_slot_owner)
        if mode == "drop":
            assert held[mode][1] <= 2, held
    if policy == "write_through":
        assert held["keep"][0] > 0 and held["keep"][1] > 2, held  # the cap left host copies
    assert held["drop"][0] == 0, held
