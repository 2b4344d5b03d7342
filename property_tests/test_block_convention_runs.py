"""The block convention reaches the simulator's runs: a definition (or RunSpec) asks for ``floor`` and the
replay expands the trace that way; a convention the file does not fit is refused before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mamba_radix.errors import MambaRadixError
from mamba_radix.sim.sweep import RunSpec, run_one

# one id per full block of 4 tokens: 10 tokens are 2 blocks and a 2-token tail without an id (floor)
ROWS = [
    {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]},
    {"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]},
]


def trace(tmp_path: Path) -> str:
    path = tmp_path / "floor.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def spec(path: str, convention: str) -> RunSpec:
    return RunSpec(
        run_id=convention,
        trace=path,
        block_size=4,
        block_convention=convention,
        config={"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
        options={"mode": "sequential", "keep_per_request": True},
        budget_gib=1.0,
    )


def test_a_floor_trace_replays_with_fresh_tails(tmp_path: Path) -> None:
    rec = run_one(spec(trace(tmp_path), "floor"))
    assert rec["metrics"]["requests"] == 2
    # the two prompts share their 8 block tokens; the tails are fresh per request, so no_buffer's
    # checkpoint at the first prompt's end (10 tokens) is not on the second one's path: no hit
    assert rec["metrics"]["cached_tokens"] == 0
    assert rec["params"]["block_convention"] == "floor"


def test_a_convention_the_file_does_not_fit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MambaRadixError, match="block_convention"):
        run_one(spec(trace(tmp_path), "ceil"))
