"""README's "Test your own cache": the toy adapter runs as written, fits in 150 lines, and the suite it
sets up catches a bug planted in the toy cache (so the example is a working test, not a demonstration)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from mamba_radix.testing.toy import ToyPrefixCache

README = Path(__file__).resolve().parent.parent / "docs" / "invariant-suite.md"


def _toy_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Test your own cache") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "README's 'Test your own cache' section lost its Python block"
    return found.group(1)


@pytest.fixture(scope="module")
def toy() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(_toy_block(), "README.md[Test your own cache]", "exec"), namespace)
    return namespace


def test_the_adapter_fits_in_150_lines() -> None:
    assert len(_toy_block().splitlines()) <= 150


def test_the_block_runs_the_suite(toy: dict[str, Any]) -> None:
    machine = toy["ToyMachine"]
    assert machine.known_failures.examples >= 25  # it ran its examples, and passed
    assert not machine.known_failures.counts


# Derandomized, but which stream Hypothesis draws still depends on what ran before in the process (the same
# effect test_mutations.py documents): 200 examples caught the planted "hit" bug alone and missed it after the
# whole suite once. The run stops at the first failure, so a larger budget costs only when a bug hides.
BUDGET = settings(
    max_examples=1500,
    stateful_step_count=30,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _hit_past_the_last_state(original: Any) -> Any:
    """A match that reports the KV past the deepest state as hit (LMCache #2863's symptom)."""

    def match(self: ToyPrefixCache, tokens: tuple[int, ...]) -> Any:
        hit, kv, kv_len, node = original(self, tokens)
        if kv_len > hit and hit:
            return kv_len, kv + [self.kv[tokens[:n]] for n in range(hit + 1, kv_len + 1)], kv_len, node
        return hit, kv, kv_len, node

    return match


def _evict_keeps_slot(original: Any) -> Any:
    """An eviction that never hands one freed state slot back (a leak)."""

    def evict(self: ToyPrefixCache, num_tokens: int, num_states: int) -> tuple[int, int]:
        free = len(self.slot_free)
        out = original(self, num_tokens, num_states)
        if len(self.slot_free) > free:
            self.slot_free.pop()
        return out

    return evict


MUTANTS = {"match": _hit_past_the_last_state, "evict": _evict_keeps_slot}


def planted_run(method: str) -> bool:
    """Plant ``MUTANTS[method]`` in the toy cache (its own check off: the suite's checks must find it),
    run the block's machine, and say whether the suite caught it. Run in a fresh interpreter by the test."""
    toy_ns: dict[str, Any] = {}
    exec(compile(_toy_block(), "README.md[Test your own cache]", "exec"), toy_ns)
    setattr(ToyPrefixCache, method, MUTANTS[method](getattr(ToyPrefixCache, method)))
    ToyPrefixCache.check = lambda self: None  # type: ignore[method-assign]
    try:
        run_state_machine_as_test(toy_ns["ToyMachine"], settings=BUDGET)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("method", ["match", "evict"], ids=["hit", "leak"])
def test_the_toy_suite_catches_a_planted_bug(method: str) -> None:
    """In a fresh interpreter: the derandomized stream then depends on nothing that ran before."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from mamba_radix.testing.profiles import load_profile; load_profile();"
        "import test_toy_adapter as t; sys.exit(0 if t.planted_run(sys.argv[2]) else 1)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent), method],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the suite missed the planted {method} bug:\n{done.stdout}\n{done.stderr}"
