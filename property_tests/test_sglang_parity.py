"""Differential test: the same Mooncake requests through our simulator and through SGLang's real cache.

SGLang's cache is imported from its PyPI wheel at run time (``mamba_radix.testing.sglang``), fetched
once into ``$MAMBA_RADIX_SGLANG_CACHE`` (default ``~/.cache/mamba_radix/sglang``). Our side runs with the
preset that models the release (``--peer sglang-<version>``). Per request, the cached tokens must be
identical, and so must the KV-match lengths and the number of states evicted.

The slice is bounded for CI: the first 150 conversation requests, pools small enough that both state
and KV eviction happen, and unbounded ones. The full grid is ``experiments/sglang_parity.py``.
"""

from __future__ import annotations

import functools

import pytest

from mamba_radix.config import CacheConfig
from mamba_radix.data import trace_path
from mamba_radix.sim.traces import iter_block_trace
from mamba_radix.testing.sglang import SGLangLoadError, SGLangUnavailableError, load_sglang
from mamba_radix.testing.sglang.parity import compare, preset_for, replay_config_for
from mamba_radix.testing.sglang.replay import ReplayConfig, prefill_chunk_len, replay, requests_from_trace

pytestmark = pytest.mark.sglang

TRACE = trace_path("mooncake_conversation_trace.jsonl")
LIMIT = 150
# (version, strategy, page size, KV tokens, state slots); None = unbounded
CONFIGS = [
    ("0.5.20", "no_buffer", 1, 2_000_000, 256),
    ("0.5.20", "extra_buffer", 1, 2_000_000, 16),  # so few slots that the releases' slot rules change hits
    ("0.5.20", "extra_buffer", 1, None, None),
    ("0.5.23", "no_buffer", 1, 2_000_000, 256),
    ("0.5.23", "extra_buffer", 1, 2_000_000, 16),
]


@functools.lru_cache(maxsize=1)
def _traces() -> tuple:
    return tuple(iter_block_trace(TRACE, limit=LIMIT))


def _sglang(version: str):  # type: ignore[no-untyped-def]
    try:
        return load_sglang(version)
    except SGLangUnavailableError as err:  # no network: not a failure of the code under test
        pytest.skip(str(err))


@pytest.mark.parametrize(("version", "strategy", "page", "kv", "slots"), CONFIGS)
def test_per_request_hits_identical_to_sglang(
    version: str, strategy: str, page: int, kv: int | None, slots: int | None
):
    _sglang(version)
    config = CacheConfig(mamba_radix_cache_strategy=strategy, page_size=page)  # type: ignore[arg-type]
    res = compare(_traces(), config, kv, slots, version, peer="auto")
    assert res.peer == f"sglang-{version}"
    assert res.first_diff is None, f"first differing request: {res.first_diff}"
    assert res.identical == res.total == LIMIT
    assert res.kv_identical == res.total
    assert res.sglang_states_evicted == res.ours_stats["states_evicted"]
    if kv is not None:
        assert res.sglang_states_evicted > 0, "the finite slice must exercise state eviction"


def test_each_preset_differs_from_the_other_release():
    """The releases' rules differ on this slice, and our 0.5.20 preset does not pass for 0.5.23."""
    _sglang("0.5.23")
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    res = compare(_traces(), config, 2_000_000, 16, "0.5.23", peer="sglang-0.5.20")
    assert res.identical < res.total


def test_the_slice_is_sensitive_to_each_rule():
    """Changing one scheduler rule in the SGLang replay (inserting at decode boundaries, as our simulator
    once did; a different slot headroom) changes some request's hit on this slice, so the parity test
    above would catch our side getting that rule wrong."""
    sg = _sglang("0.5.20")
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
    requests = requests_from_trace(_traces())
    base = replay_config_for(config, 2_000_000, 16)
    hits = [r.hit for r in replay(sg, requests, base).rows]
    for rule in ({"insert_at_decode_boundary": True}, {"headroom_slots": 6}):
        changed = replay(sg, requests, ReplayConfig(**{**base.__dict__, **rule}))
        assert hits != [r.hit for r in changed.rows], f"{rule} changed no hit"


def test_preset_names_follow_versions():
    assert preset_for("0.5.20") == "sglang-0.5.20"
    assert preset_for("9.9.9") is None


def test_sglang_modules_stay_out_of_sys_modules():
    import sys

    sg = _sglang("0.5.20")
    assert not any(k == "sglang" or k.startswith("sglang.") for k in sys.modules)
    with sg.activated():
        assert "sglang.srt.mem_cache.mamba_radix_cache" in sys.modules
    assert not any(k == "sglang" or k.startswith("sglang.") for k in sys.modules)


def test_unknown_version_is_a_typed_one_line_error():
    with pytest.raises(SGLangLoadError) as err:
        load_sglang("0.0.1")
    assert "\n" not in str(err.value) and "0.5.20" in str(err.value)


def test_unavailable_wheel_is_a_typed_one_line_error(tmp_path, monkeypatch):
    from mamba_radix.testing.sglang import loader

    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(
        loader, "_pip_download", lambda version, dest, extra: (False, "No matching distribution")
    )
    with pytest.raises(SGLangUnavailableError) as err:
        loader.fetch_wheel("0.5.20")
    msg = str(err.value)
    assert "\n" not in msg and "sglang==0.5.20" in msg and "No matching distribution" in msg


def test_the_schedulers_first_chunk_ends_on_a_page() -> None:
    # a request resuming at token 3 with 100 left, chunks of 16, pages of 4: the first chunk stops at 16
    # (the page boundary at or below 3 + 16), later chunks are whole; a rest that fits goes at once
    assert prefill_chunk_len(3, 100, 16, 4, first=True) == 13
    assert prefill_chunk_len(16, 87, 16, 4, first=False) == 16
    assert prefill_chunk_len(3, 100, 16, 1, first=True) == 16
    assert prefill_chunk_len(3, 10, 16, 4, first=True) == 10
    assert prefill_chunk_len(3, 100, 0, 4, first=True) == 100  # chunking off
