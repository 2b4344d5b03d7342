"""Checkpoint positions per strategy and admission (prefill track length, decode boundaries) and slot
accounting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mamba_radix import CacheConfig, InvalidArgument, Req
from mamba_radix.strategies import (
    admission_slots,
    is_decode_boundary,
    max_checkpoints_per_request,
    prefill_track_len,
)

EXTRA = CacheConfig(mamba_radix_cache_strategy="extra_buffer")
NO_BUFFER = CacheConfig(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
LAZY = CacheConfig(mamba_radix_cache_strategy="extra_buffer_lazy")
BRANCH_AND_END = CacheConfig(
    mamba_radix_cache_strategy="extra_buffer", mamba_checkpoint_admission="branch_and_end"
)


@pytest.mark.parametrize(
    ("chunk_start", "extend_len", "branching", "expected"),
    [
        (0, 200, None, 192),  # last grid-aligned position of the chunk
        (0, 256, None, 256),
        (128, 130, None, 256),  # counted from the chunk's own start
        (10, 100, None, 74),
        (0, 63, None, None),  # shorter than the grid: no checkpoint (SGLang PR #30938)
        (0, 300, 128, 128),  # the branch point instead
        (64, 300, 192, 192),
        (10, 300, 64, 266),  # branch not on the chunk's grid: aligned end
        (0, 300, 300, 256),  # branch at the chunk end is not inside it
        (100, 300, 100, 356),  # branch at the chunk start is not inside it
        (0, 300, 0, 256),
    ],
)
def test_prefill_track_len_extra_buffer(
    chunk_start: int, extend_len: int, branching: int | None, expected: int | None
) -> None:
    assert prefill_track_len(EXTRA, chunk_start, extend_len, branching) == expected
    assert prefill_track_len(LAZY, chunk_start, extend_len, branching) == expected


def test_prefill_track_len_uses_the_page_grid() -> None:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer", page_size=48, mamba_track_interval=192)
    assert config.mamba_checkpoint_grid == 192
    assert prefill_track_len(config, 0, 500, None) == 384
    assert prefill_track_len(config, 0, 191, None) is None


def test_no_buffer_never_tracks() -> None:
    assert prefill_track_len(NO_BUFFER, 0, 1000, 512) is None
    assert not is_decode_boundary(NO_BUFFER, 256)


@given(
    chunk_start=st.integers(0, 2000),
    extend_len=st.integers(0, 2000),
    branching=st.none() | st.integers(0, 4000),
    chunk=st.sampled_from([1, 16, 64, 100]),
)
def test_prefill_track_len_lands_on_the_grid_inside_the_chunk(
    chunk_start: int, extend_len: int, branching: int | None, chunk: int
) -> None:
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer", mamba_cache_chunk_size=chunk)
    track = prefill_track_len(config, chunk_start, extend_len, branching)
    if extend_len < chunk:
        assert track is None
        return
    assert track is not None
    assert chunk_start < track <= chunk_start + extend_len
    assert (track - chunk_start) % chunk == 0
    assert track == branching or chunk_start + extend_len - track < chunk


def test_prefill_track_len_all_only_checks_input_len() -> None:
    assert prefill_track_len(EXTRA, 0, 200, None, input_len=200) == 192
    assert prefill_track_len(EXTRA, 0, 200, None, input_len=5000) == 192
    assert prefill_track_len(NO_BUFFER, 0, 200, None, input_len=200) is None


# grid 64; input_len is the prompt length
@pytest.mark.parametrize(
    ("chunk_start", "extend_len", "branching", "input_len", "expected"),
    [
        (0, 8192, None, 20000, None),  # an intermediate chunk: skipped
        (8192, 8192, None, 20000, None),
        (16384, 3616, None, 20000, 19968),  # the last chunk: its last aligned position
        (0, 8192, None, 8200, 8192),  # the tail after it (8 tokens) is too short to checkpoint
        (8192, 8, None, 8200, None),  # ... and that tail itself
        (0, 8192, None, 8256, None),  # a tail of one grid step checkpoints itself
        (8192, 64, None, 8256, 8256),
        (0, 8192, 4096, 20000, 4096),  # the branch point, on the chunk's grid
        (100, 8192, 4096, 20000, 4068),  # off the grid: the last grid position before it
        (0, 8192, 8192, 20000, 8192),  # a branch at the chunk's end is held by this chunk
        (4096, 8192, 4096, 20000, None),  # ... and not by the next one
        (4000, 8192, 4032, 20000, None),  # no grid position between chunk start and branch
        (4000, 200, 4032, 4200, 4192),  # ... the end rule still applies
        (16384, 3616, 17000, 20000, 16960),  # branch and end in one chunk: the branch wins
        (0, 63, None, 63, None),  # shorter than the grid: never
    ],
)
def test_prefill_track_len_branch_and_end(
    chunk_start: int, extend_len: int, branching: int | None, input_len: int, expected: int | None
) -> None:
    assert (
        prefill_track_len(BRANCH_AND_END, chunk_start, extend_len, branching, input_len=input_len) == expected
    )
    lazy = LAZY.replace(mamba_checkpoint_admission="branch_and_end")
    assert prefill_track_len(lazy, chunk_start, extend_len, branching, input_len=input_len) == expected


@given(
    grid=st.sampled_from([1, 16, 64]),
    chunk_steps=st.integers(1, 8),
    input_len=st.integers(0, 1000),
    branch_steps=st.none() | st.integers(1, 1000),
)
def test_branch_and_end_keeps_the_branch_and_the_end_only(
    grid: int, chunk_steps: int, input_len: int, branch_steps: int | None
) -> None:
    """A whole prompt prefilled from 0 in chunks of whole grid steps (the branch point, as match_prefix
    gives it, is a grid multiple): checkpoints exactly at the branch and at the input's last aligned
    position, one of them if a single chunk holds both (the branch then)."""
    config = BRANCH_AND_END.replace(mamba_cache_chunk_size=grid)
    chunk = grid * chunk_steps
    branch = None if branch_steps is None or branch_steps * grid > input_len else branch_steps * grid
    tracks, holders = [], {}
    for start in range(0, input_len, chunk):
        n = min(chunk, input_len - start)
        track = prefill_track_len(config, start, n, branch, input_len=input_len)
        if track is not None:
            tracks.append(track)
        if branch is not None and start < branch <= start + n:
            holders["branch"] = start
        if input_len - (start + n) < grid <= n:
            holders["end"] = start
    want = []
    if branch is not None:
        want.append(branch)
    end = input_len // grid * grid
    if "end" in holders and holders["end"] != holders.get("branch"):
        want.append(end)
    assert tracks == sorted(want)
    assert len(tracks) <= 2


def test_decode_boundaries() -> None:
    assert is_decode_boundary(EXTRA, 256) and is_decode_boundary(EXTRA, 512)
    assert not is_decode_boundary(EXTRA, 255) and not is_decode_boundary(EXTRA, 0)
    assert is_decode_boundary(CacheConfig(mamba_track_interval=64), 192)


@pytest.mark.parametrize(
    ("config", "fresh", "with_live_slot"),
    [
        (NO_BUFFER, 1, 0),
        (EXTRA, 3, 2),
        (CacheConfig(disable_overlap_schedule=True, page_size=4, mamba_track_interval=256), 2, 1),
        (LAZY, 2, 1),
    ],
)
def test_admission_slots(config: CacheConfig, fresh: int, with_live_slot: int) -> None:
    req = Req(1, [1, 2, 3])
    assert admission_slots(config, req) == fresh
    req.mamba_pool_idx = 5  # a copy-on-write hit gave it a live slot
    assert admission_slots(config, req) == with_live_slot
    if config.ping_pong_size:
        req.mamba_ping_pong_track_buffer = [6, 7][: config.ping_pong_size]
        assert admission_slots(config, req) == 0


def test_max_checkpoints_per_request() -> None:
    assert max_checkpoints_per_request(CacheConfig(chunked_prefill_size=8192), 20000) == 4
    assert max_checkpoints_per_request(CacheConfig(chunked_prefill_size=-1), 20000) == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda: prefill_track_len(EXTRA, -1, 10, None),
        lambda: prefill_track_len(EXTRA, 0, -5, None),
        lambda: prefill_track_len(EXTRA, 0, 10, -3),
        lambda: prefill_track_len(EXTRA, 0, 10, None, input_len=-1),
        lambda: is_decode_boundary(EXTRA, -1),
        lambda: max_checkpoints_per_request(EXTRA, 1.5),
    ],
)
def test_bad_lengths_raise(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match="must be an int >= 0"):
        call()


def test_branch_and_end_needs_the_prompt_length() -> None:
    with pytest.raises(InvalidArgument, match=r"needs input_len .*branch_and_end"):
        prefill_track_len(BRANCH_AND_END, 0, 200, None)
    with pytest.raises(InvalidArgument, match=r"input_len=100 ends before the chunk \[0, 200\)"):
        prefill_track_len(BRANCH_AND_END, 0, 200, None, input_len=100)
    with pytest.raises(InvalidArgument, match=r"input_len=100 ends before the chunk"):
        prefill_track_len(EXTRA, 0, 200, None, input_len=100)
