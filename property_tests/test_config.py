"""CacheConfig: every ConfigError case (the message names the field, the value and the fix), auto
resolution, ping-pong size, slots reserved per request (DESIGN.md §6 table) and max_running_requests."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, ConfigError

# (fields, regex the message must match): one row per validation rule
CONFIG_ERRORS = [
    ({"page_size": "4"}, r"page_size must be an integer, got '4'"),
    ({"page_size": 1.5}, r"page_size must be an integer, got 1.5"),
    ({"page_size": True}, r"page_size must be an integer, got True"),
    ({"mamba_track_interval": None}, r"mamba_track_interval must be an integer"),
    ({"disable_overlap_schedule": "yes"}, r"disable_overlap_schedule must be True or False, got 'yes'"),
    ({"skip_decode_lock": 1}, r"skip_decode_lock must be True or False, got 1"),
    ({"page_size": 0}, r"page_size must be >= 1, got 0"),
    ({"mamba_track_interval": 0}, r"mamba_track_interval must be >= 1, got 0"),
    ({"mamba_cache_chunk_size": -64}, r"mamba_cache_chunk_size must be >= 1, got -64"),
    ({"mamba_max_states_per_path": 0}, r"mamba_max_states_per_path must be -1 \(unlimited\).*got 0"),
    ({"mamba_max_states_per_path": -2}, r"mamba_max_states_per_path must be -1 .*got -2"),
    ({"chunked_prefill_size": 0}, r"chunked_prefill_size must be -1 \(no chunking\).*got 0"),
    ({"chunked_prefill_size": -5}, r"chunked_prefill_size must be -1 .*got -5"),
    ({"speculative_num_draft_tokens": -1}, r"speculative_num_draft_tokens must be >= 0, got -1"),
    (
        {"mamba_radix_cache_strategy": "ping_pong"},
        r"mamba_radix_cache_strategy must be one of .*'ping_pong'",
    ),
    (
        {"mamba_eviction_order": "fifo"},
        r"mamba_eviction_order must be one of leaf_first, root_first, mixed, flop_weighted, got 'fifo'",
    ),
    ({"mamba_lru_refresh": "all"}, r"mamba_lru_refresh must be one of node, path, got 'all'"),
    (
        {"mamba_eviction_order": "marconi"},
        r"mamba_eviction_order must be one of leaf_first, root_first, mixed, flop_weighted, got 'marconi'",
    ),
    ({"mamba_flop_weight": -0.5}, r"mamba_flop_weight must be >= 0 .*0 = plain LRU\), got -0.5"),
    ({"mamba_flop_weight": "8"}, r"mamba_flop_weight must be a finite number, got '8'"),
    ({"mamba_flop_weight": float("nan")}, r"mamba_flop_weight must be a finite number, got nan"),
    ({"mamba_flop_weight": float("inf")}, r"mamba_flop_weight must be a finite number, got inf"),
    ({"mamba_flop_weight": True}, r"mamba_flop_weight must be a finite number, got True"),
    ({"mamba_flop_crossover": 0}, r"mamba_flop_crossover must be >= 1 \(tokens\), got 0"),
    ({"mamba_flop_crossover": 1.5}, r"mamba_flop_crossover must be an integer, got 1.5"),
    (
        {"mamba_checkpoint_admission": "marconi"},
        r"mamba_checkpoint_admission must be one of all, branch_and_end, got 'marconi'",
    ),
    (
        {"mamba_checkpoint_admission": "branch_and_end", "mamba_radix_cache_strategy": "no_buffer"},
        r"mamba_checkpoint_admission='branch_and_end' needs extra_buffer or extra_buffer_lazy .*; "
        r"set mamba_radix_cache_strategy='extra_buffer', or use mamba_checkpoint_admission='all'$",
    ),
    (
        # auto resolves to no_buffer without overlap
        {"mamba_checkpoint_admission": "branch_and_end", "disable_overlap_schedule": True},
        r"branch_and_end' needs extra_buffer .*the strategy in force is no_buffer\); set "
        r"mamba_radix_cache_strategy='extra_buffer'",
    ),
    (
        {"mamba_checkpoint_admission": "branch_and_end", "model_supports_extra_buffer": False},
        r"branch_and_end' needs extra_buffer .*; the model has no extra-buffer support, or use "
        r"mamba_checkpoint_admission='all'$",
    ),
    (
        {"disaggregation_mode": "both"},
        r"disaggregation_mode must be one of null, prefill, decode, got 'both'",
    ),
    (
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16},
        r"^mamba_radix_cache_strategy='no_buffer' needs page_size=1 \(got 16\); set page_size=1 or use "
        r"mamba_radix_cache_strategy='extra_buffer'$",
    ),
    (
        # auto falls back to no_buffer without extra-buffer support, which cannot page
        {"page_size": 16, "model_supports_extra_buffer": False},
        r"^mamba_radix_cache_strategy='auto' \(resolved to no_buffer\) needs page_size=1 \(got 16\); "
        r"set page_size=1$",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer", "model_supports_extra_buffer": False},
        r"^mamba_radix_cache_strategy='extra_buffer' needs a model with extra-buffer support "
        r"\(model_supports_extra_buffer=True\); use mamba_radix_cache_strategy='no_buffer'",
    ),
    (
        {
            "mamba_radix_cache_strategy": "extra_buffer",
            "mamba_track_interval": 4,
            "speculative_num_draft_tokens": 8,
        },
        r"^mamba_track_interval=4 must be >= speculative_num_draft_tokens=8; raise the interval$",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer", "page_size": 48, "mamba_track_interval": 256},
        r"^mamba_track_interval=256 must be a multiple of page_size=48; pick an interval that page_size divides$",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer", "disable_radix_cache": True},
        r"^mamba_radix_cache_strategy='extra_buffer' is useless with disable_radix_cache=True and no "
        r"speculative decoding; use mamba_radix_cache_strategy='no_buffer' or enable the radix cache$",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer_lazy", "disable_overlap_schedule": True},
        r"^mamba_radix_cache_strategy='extra_buffer_lazy' requires overlap scheduling; set "
        r"disable_overlap_schedule=False or use mamba_radix_cache_strategy='extra_buffer'$",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer_lazy", "disaggregation_mode": "decode"},
        r"extra_buffer_lazy' is not supported with PD disaggregation \(disaggregation_mode='decode'\); "
        r"use mamba_radix_cache_strategy='extra_buffer'$",
    ),
]


@pytest.mark.parametrize(("fields", "message"), CONFIG_ERRORS, ids=[str(f) for f, _ in CONFIG_ERRORS])
def test_config_error_names_field_value_and_fix(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        CacheConfig(**fields)
    # a library error speaks in Python argument names (the CLI maps them to its flags: test_cli.py)
    text = str(info.value)
    assert "--" not in text, text
    assert any(name in text for name in fields), text


def test_auto_says_what_it_resolved_to() -> None:
    with pytest.raises(
        ConfigError, match=r"^mamba_radix_cache_strategy='auto' \(resolved to extra_buffer\) is useless"
    ):
        CacheConfig(disable_radix_cache=True)


def test_peer_policy_fields_accept_valid_values() -> None:
    config = CacheConfig(
        mamba_radix_cache_strategy="extra_buffer_lazy",
        mamba_checkpoint_admission="branch_and_end",
        mamba_eviction_order="flop_weighted",
        mamba_flop_weight=0,  # an int is a number too
        mamba_flop_crossover=1,
    )
    assert (config.mamba_flop_weight, config.mamba_flop_crossover) == (0, 1)
    defaults = CacheConfig()
    assert defaults.mamba_checkpoint_admission == "all" and defaults.mamba_eviction_order == "leaf_first"
    # no_buffer with the default admission stays valid (the admission only constrains extra_buffer)
    assert CacheConfig(mamba_radix_cache_strategy="no_buffer").mamba_checkpoint_admission == "all"


def test_replace_validates_and_config_is_frozen() -> None:
    config = CacheConfig()
    with pytest.raises(ConfigError, match=r"^page_size must be >= 1, got 0$"):
        config.replace(page_size=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.page_size = 4  # type: ignore[misc]
    assert config.replace(page_size=4).page_size == 4


@pytest.mark.parametrize(
    ("fields", "strategy", "overlap"),
    [
        ({}, "extra_buffer", True),  # overlap on by default
        ({"disable_overlap_schedule": True}, "no_buffer", False),
        ({"disable_overlap_schedule": True, "page_size": 16}, "extra_buffer", False),  # paging forces it
        ({"model_supports_extra_buffer": False}, "no_buffer", False),  # overlap forced off
        ({"mamba_radix_cache_strategy": "no_buffer"}, "no_buffer", False),
        ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, "extra_buffer_lazy", True),
    ],
)
def test_auto_resolution(fields: dict, strategy: str, overlap: bool) -> None:
    config = CacheConfig(**fields)
    assert config.strategy == strategy
    assert config.overlap is overlap


def test_auto_never_resolves_to_lazy() -> None:
    for overlap_off in (False, True):
        for page_size in (1, 16):
            config = CacheConfig(disable_overlap_schedule=overlap_off, page_size=page_size)
            assert config.strategy != "extra_buffer_lazy"


# DESIGN.md §6 / sglang-semantics §6.4: slots reserved per running request, and the ping-pong size P.
SLOT_TABLE = [
    ({"disable_radix_cache": True, "mamba_radix_cache_strategy": "no_buffer"}, 1, 0),
    ({"mamba_radix_cache_strategy": "no_buffer"}, 3, 0),
    ({"mamba_radix_cache_strategy": "extra_buffer"}, 5, 2),
    ({"mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": True}, 4, 1),
    ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 4, 2),
    ({"mamba_radix_cache_strategy": "extra_buffer", "skip_decode_lock": True}, 4, 2),
    ({"mamba_radix_cache_strategy": "extra_buffer_lazy", "skip_decode_lock": True}, 3, 2),
    ({"mamba_radix_cache_strategy": "no_buffer", "skip_decode_lock": True}, 3, 0),
]


@pytest.mark.parametrize(("fields", "slots", "ping_pong"), SLOT_TABLE, ids=[str(f) for f, _, _ in SLOT_TABLE])
def test_slots_per_request_and_ping_pong(fields: dict, slots: int, ping_pong: int) -> None:
    config = CacheConfig(**fields)
    assert config.slots_per_request == slots
    assert config.ping_pong_size == ping_pong


def test_max_running_requests_matches_the_seed() -> None:
    # "capped to 16 by the mamba state cache (max_mamba_cache_size=80, 5 state slots per request)"
    assert CacheConfig().max_running_requests(80) == 16
    assert CacheConfig(mamba_radix_cache_strategy="no_buffer").max_running_requests(80) == 26


@given(chunk=st.integers(1, 512), page=st.sampled_from([1, 2, 4, 16, 48, 64]))
def test_checkpoint_grid_is_lcm(chunk: int, page: int) -> None:
    config = CacheConfig(mamba_cache_chunk_size=chunk, page_size=page, mamba_track_interval=page * 8)
    grid = config.mamba_checkpoint_grid
    assert grid % chunk == 0 and grid % page == 0
    assert all(m % chunk or m % page for m in range(1, grid))


def test_the_slot_budget_is_the_one_home_of_the_per_request_slot_rules() -> None:
    """Every consumer reads the budget: the buffer strategy's admission count, the position rules', the
    request pool's track slots and the planner's decode slots agree with it for every strategy."""
    from mamba_radix import strategies
    from mamba_radix.buffers import buffer_strategy
    from mamba_radix.capacity.planner import decode_slots_in_use
    from mamba_radix.config import SlotBudget
    from mamba_radix.request import Req

    expected = {  # (strategy, overlap, skip_decode_lock): (entries, held, reserved, in use)
        ("no_buffer", False, False): (0, 0, 3, 2),
        ("extra_buffer", False, False): (1, 1, 4, 3),
        ("extra_buffer", True, False): (2, 2, 5, 4),
        ("extra_buffer", True, True): (2, 2, 4, 3),
        ("extra_buffer_lazy", True, False): (2, 1, 4, 3),
        ("extra_buffer_lazy", True, True): (2, 1, 3, 2),
    }
    for (strategy, overlap, skip), (entries, held, reserved, in_use) in expected.items():
        config = CacheConfig(
            mamba_radix_cache_strategy=strategy,
            disable_overlap_schedule=not overlap,
            skip_decode_lock=skip,
        )
        budget = config.slot_budget
        assert budget == SlotBudget(entries, held, reserved, in_use, 0), (strategy, overlap, skip)
        assert (config.ping_pong_size, config.slots_per_request) == (entries, reserved)
        assert decode_slots_in_use(config) == in_use
        req = Req(rid=1, origin_input_ids=[1, 2])
        assert (
            strategies.admission_slots(config, req)
            == buffer_strategy(config).admission_slots(req)
            == 1 + held
        )
    lazy_0520 = CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy", mamba_slot_headroom="per_chunk")
    assert lazy_0520.slot_budget.per_chunk_headroom == lazy_0520.per_chunk_headroom_slots == 2
