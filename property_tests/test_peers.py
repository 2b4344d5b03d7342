"""Peers as policies (DESIGN.md §9): every preset gives a valid config with the fields it promises,
unknown names and invalid results raise ConfigError, and the policies behave as described through the
real cache (branch-and-end checkpoint positions, legacy root-first victims)."""

from __future__ import annotations

import pytest
import torch

from mamba_radix import CacheConfig, ConfigError, RadixKey
from mamba_radix.peers import PEERS, RETIRED_PEERS, Peer, apply_peer, peer_changes
from mamba_radix.testing import MambaRadixAdapter
from mamba_radix.testing.radix_adapter import RadixSuiteParams
from mamba_radix.tree import RadixTree

BASES = {
    "default": CacheConfig(),
    "no_overlap": CacheConfig(disable_overlap_schedule=True),  # auto resolves to no_buffer
    "no_buffer": CacheConfig(mamba_radix_cache_strategy="no_buffer"),
    "lazy": CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy"),
    "paged": CacheConfig(page_size=16, mamba_track_interval=256),
    "odd_grid": CacheConfig(mamba_cache_chunk_size=48, chunked_prefill_size=1000),
    "no_chunking": CacheConfig(chunked_prefill_size=-1),
}


def test_registry() -> None:
    assert sorted(PEERS) == [
        "marconi-static",
        "sglang",
        "sglang-0.5.20",
        "sglang-0.5.23",
        "sglang-0.5.23-hicache",
        "sglang-legacy",
        "vllm-align",
    ]
    for name, peer in PEERS.items():
        assert isinstance(peer, Peer) and peer.name == name
        assert len(peer.description) > 100 and "\n" not in peer.description


@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("name", list(PEERS))
def test_every_peer_gives_a_valid_config_with_its_changes(name: str, base: str) -> None:
    config = BASES[base]
    changes = peer_changes(config, name)
    peered = apply_peer(config, name)
    assert isinstance(peered, CacheConfig)
    for field, value in changes.items():
        assert getattr(peered, field) == value
    assert apply_peer(peered, name) == peered  # idempotent
    # what a peer does not set stays the caller's
    assert peered.mamba_max_states_per_path == config.mamba_max_states_per_path
    assert peered.disable_overlap_schedule == config.disable_overlap_schedule


def test_sglang_presets() -> None:
    assert apply_peer(CacheConfig(mamba_eviction_order="mixed"), "sglang") == CacheConfig()
    legacy = apply_peer(CacheConfig(), "sglang-legacy")
    assert (legacy.mamba_lru_refresh, legacy.mamba_eviction_order) == ("path", "root_first")


@pytest.mark.parametrize(
    ("config", "block", "chunked_prefill"),
    [
        (CacheConfig(), 64, 8192),
        (CacheConfig(mamba_cache_chunk_size=48, chunked_prefill_size=1000), 48, 960),
        (CacheConfig(mamba_cache_chunk_size=48, chunked_prefill_size=40), 48, 48),
        (CacheConfig(mamba_cache_chunk_size=64, page_size=48, mamba_track_interval=192), 192, 8064),
        (CacheConfig(chunked_prefill_size=-1), 64, -1),
    ],
)
def test_vllm_align_puts_everything_on_the_block_grid(
    config: CacheConfig, block: int, chunked_prefill: int
) -> None:
    peered = apply_peer(config, "vllm-align")
    assert peered.page_size == peered.mamba_cache_chunk_size == peered.mamba_track_interval == block
    assert peered.mamba_checkpoint_grid == block
    assert peered.chunked_prefill_size == chunked_prefill
    assert peered.uses_extra_buffer
    assert (peered.mamba_eviction_order, peered.mamba_lru_refresh) == ("leaf_first", "node")


@pytest.mark.parametrize("base", ["default", "no_overlap", "no_buffer", "lazy"])
def test_marconi_static_preset(base: str) -> None:
    peered = apply_peer(BASES[base], "marconi-static")
    assert peered.mamba_checkpoint_admission == "branch_and_end"
    assert peered.mamba_eviction_order == "flop_weighted"
    assert peered.mamba_lru_refresh == "node"
    assert peered.strategy == ("extra_buffer_lazy" if base == "lazy" else "extra_buffer")


def test_unknown_peer_lists_the_known_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^unknown peer 'vllm'; use one of sglang, sglang-0.5.20, sglang-0.5.23, sglang-0.5.23-hicache, sglang-legacy, vllm-align, marconi-static$",
    ):
        apply_peer(CacheConfig(), "vllm")
    with pytest.raises(ConfigError, match=r"^unknown peer ''; use one of"):
        peer_changes(CacheConfig(), "")


def test_invalid_result_names_the_peer() -> None:
    no_kernels = CacheConfig(model_supports_extra_buffer=False)  # auto: no_buffer, page 1
    with pytest.raises(
        ConfigError, match=r"^peer='marconi-static': mamba_radix_cache_strategy='extra_buffer' needs a model"
    ):
        apply_peer(no_kernels, "marconi-static")
    with pytest.raises(ConfigError, match=r"^peer='vllm-align': "):
        apply_peer(no_kernels, "vllm-align")
    spec = CacheConfig(mamba_track_interval=256, speculative_num_draft_tokens=128)
    with pytest.raises(ConfigError, match=r"^peer='vllm-align': mamba_track_interval=64 must be >= "):
        apply_peer(spec, "vllm-align")
    assert apply_peer(no_kernels, "sglang-legacy").strategy == "no_buffer"


# ------------------------------------------------------------------------------ policies, end to end
def _run_prompt(adapter: MambaRadixAdapter, rid: int, tokens: list[int]) -> int:
    """Admit, prefill and finish one request; its admission hit."""
    admitted = adapter.admit(rid, None, tokens)
    assert admitted is not None
    while adapter.in_prefill(rid):
        assert adapter.prefill_chunk(rid) is not None
        adapter.check_invariants()
    adapter.finish(rid, insert=True)
    adapter.check_invariants()
    return admitted.hit_len


def _checkpoint_lengths(adapter: MambaRadixAdapter) -> list[int]:
    return sorted(len(tokens) for _, tokens in adapter.snapshot().checkpoints)


# 12-token prompts, prefill chunks of 4, grid 2; the second and third share the first 6 tokens.
@pytest.mark.parametrize(
    ("admission", "after_first", "second_hit", "after_second"),
    [
        # every chunk end (4, 8, 12); the sibling hits 4, then checkpoints the branch (6) and its end
        ("all", [4, 8, 12], 4, [4, 6, 8, 12, 12]),
        # the end only, so the sibling misses, checkpoints its branch point and its end: the shared
        # prefix is first hit on its third occurrence, as in Marconi, with 3 checkpoints instead of 5
        ("branch_and_end", [12], 0, [6, 12, 12]),
    ],
)
def test_branch_and_end_through_the_cache(
    admission: str, after_first: list[int], second_hit: int, after_second: list[int]
) -> None:
    params = RadixSuiteParams(
        strategy="extra_buffer",
        overlap=False,
        kv_pages=64,
        state_slots=16,
        req_rows=1,
        state_chunk=2,
        prefill_chunk=4,
        track_interval=64,
        checkpoint_admission=admission,
    )
    adapter = MambaRadixAdapter(params)
    first = list(range(1, 13))
    assert _run_prompt(adapter, 1, first) == 0
    assert _checkpoint_lengths(adapter) == after_first
    second = first[:6] + list(range(100, 106))
    assert adapter.match(None, second[:-1], cow=False).branching_seqlen == 6
    assert _run_prompt(adapter, 2, second) == second_hit
    assert _checkpoint_lengths(adapter) == after_second
    third = first[:6] + list(range(200, 206))
    assert adapter.match(None, third[:-1], cow=False).hit_len == 6


def test_legacy_peer_evicts_root_first_within_a_path() -> None:
    def victims(config: CacheConfig) -> list[int]:
        tree = RadixTree(config)
        kv = 1
        for tokens, slot in (([1, 2], 1), ([1, 2, 3, 4], 2), ([1, 2, 3, 4, 5, 6], 3), ([9, 9], 4)):
            tree.insert(RadixKey(tokens), torch.arange(kv, kv + len(tokens)), slot)
            kv += len(tokens)
        tree.match(RadixKey([1, 2, 3, 4, 5, 6]))
        out = []
        while slots := tree.evict(num_states=1).slots:
            out += slots
        return out

    base = CacheConfig(mamba_radix_cache_strategy="no_buffer")
    assert victims(apply_peer(base, "sglang-legacy")) == [4, 1, 2, 3]  # the whole path is newest
    assert victims(apply_peer(base, "sglang")) == [1, 2, 4, 3]  # only the consumed checkpoint moved


def test_a_name_that_is_both_a_preset_and_a_policy_means_the_same_rules() -> None:
    """One meaning per name, no exception: every preset name that is also an experiment policy configures
    the same cache, from every base, and adds no policy object. Marconi's two readings have two names
    (the preset ``marconi-static``, the policy ``marconi``), so a new collision cannot slip in."""
    from mamba_radix.policies.registry import POLICIES

    shared = PEERS.keys() & POLICIES.keys()
    assert shared == {"sglang-0.5.20", "sglang-0.5.23"}
    for name in sorted(shared):
        for base in BASES.values():
            assert POLICIES[name].configure(base) == apply_peer(base, name), name
        assert POLICIES[name].make(POLICIES[name].configure(CacheConfig()), None) is None  # type: ignore[arg-type]
    assert "not the experiment's policy 'marconi'" in PEERS["marconi-static"].description
    # what differs: the preset evicts by the static flop_weighted key, the policy by its own object
    assert apply_peer(CacheConfig(), "marconi-static").mamba_eviction_order == "flop_weighted"
    assert POLICIES["marconi"].configure(CacheConfig()).mamba_eviction_order != "flop_weighted"


def test_the_former_preset_name_marconi_names_both_meanings() -> None:
    """``marconi`` is the policy's name alone: asking for it as a preset is a one-line ConfigError that
    names the preset it became and the policy that kept the name, never a silent choice of one."""
    assert "marconi" not in PEERS and set(RETIRED_PEERS).isdisjoint(PEERS)
    for call in (apply_peer, peer_changes):
        with pytest.raises(ConfigError) as err:
            call(CacheConfig(), "marconi")
        message = str(err.value)
        assert "\n" not in message
        assert "'marconi-static'" in message and "experiment --policies marconi" in message
