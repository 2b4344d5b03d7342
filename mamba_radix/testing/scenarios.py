"""Regression scenarios from public bug reports, runnable against any adapter.

Each :class:`Scenario` names the report it comes from, builds a small configuration, and drives the cache
through the state machine's scripted helpers (:meth:`CacheMachine.run_request`, :meth:`CacheMachine.put`,
:meth:`CacheMachine.lookup`), so every after-step check of the suite (oracle, stamps, conservation,
accounting, locks) runs between the steps. On top of those, the scenario states the outcome a correct cache
gives for the sequence the report describes, and raises :class:`ScenarioFailure` with the report's name
when the cache shows the reported symptom instead.

Use::

    from mamba_radix.testing.scenarios import SCENARIOS, run_scenario
    for scenario in SCENARIOS:
        run_scenario(scenario, MyAdapter)        # ScenarioFailure / SuiteViolation on a bug

A scenario whose configuration the adapter cannot build (:attr:`Scenario.needs`: capabilities;
:attr:`Scenario.params`: checked by the adapter's own ``accepts(params)`` when it has one) is reported by
:func:`applicable` so a test can skip it with the reason. Each scenario runs in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from mamba_radix.testing.adapter import CacheAdapter, SuiteParams
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.machine import CacheMachine, make_machine

__all__ = ["SCENARIOS", "Scenario", "ScenarioFailure", "applicable", "run_scenario"]


class ScenarioFailure(SuiteViolation):
    """The cache showed the symptom of a public bug report."""


@dataclass(frozen=True)
class Scenario:
    """``name`` (the report's id), ``report`` (where it is described), ``summary`` (the symptom and the
    correct outcome), ``params`` (the configuration), ``needs`` (adapter capabilities) and ``run`` (the
    script: drives the machine, raises :class:`ScenarioFailure`)."""

    name: str
    report: str
    summary: str
    params: SuiteParams
    run: Callable[[CacheMachine], None]
    needs: frozenset[str] = frozenset({"requests"})

    def __repr__(self) -> str:  # pytest ids and failure messages
        return f"Scenario({self.name})"


def _expect(ok: bool, scenario: str, message: str) -> None:
    if not ok:
        raise ScenarioFailure(f"{scenario}: {message}")


def _prompt(first: int, n: int) -> tuple[int, ...]:
    return tuple(range(first, first + n))


# --------------------------------------------------------------------------------------- scenarios
def _identical_prompts_after_split(m: CacheMachine) -> None:
    # A finishes (its state at the end of prompt + output); B repeats the prompt: the len-1 admission match
    # splits A's leaf one token short of the prompt and recomputes; C, the third identical prompt, must hit.
    prompt = _prompt(1, 10)
    m.run_request(prompt, outputs=(90, 91))
    m.run_request(prompt)
    hit = m.run_request(prompt)
    _expect(
        bool(hit), "sglang-22935", f"the third identical prompt hit {hit} tokens ({m.checkpoint_lengths()})"
    )


def _branch_reuse_under_slot_pressure(m: CacheMachine) -> None:
    # a long chain checkpoints at every chunk while the state pool holds a few states; a branch that forks
    # in the middle of the chain must still find a checkpoint at or below the fork
    chain = _prompt(1, 16)
    m.run_request(chain)
    fork = chain[:9] + _prompt(100, 5)
    m.run_request(fork)
    hit = m.run_request(chain[:9] + _prompt(200, 5))
    _expect(bool(hit), "sglang-36935", f"a branch of the chain hit {hit} tokens ({m.checkpoint_lengths()})")


def _unwritten_slot_not_donated(m: CacheMachine) -> None:
    # the last prefill chunk is shorter than the checkpoint grid (no tracking in it), then decode tracks at
    # the interval: only written states may reach the tree (the suite's stamp checks run at every step)
    m.run_request(_prompt(1, 6), outputs=(50, 51))
    lengths = m.checkpoint_lengths()
    _expect(bool(lengths), "sglang-39342", "nothing was cached")
    _expect(m.lookup((*_prompt(1, 6), 50, 51)) > 0, "sglang-39342", "the finished request cannot be hit")


def _state_depth_on_the_page_grid(m: CacheMachine) -> None:
    # tree page 4 over a state grid of 2: every checkpoint lies on lcm(page, grid) and holds the state of
    # exactly its prefix (stamps), so a hit resumes at the right depth
    prompt = _prompt(1, 14)
    m.run_request(prompt, outputs=(70, 71, 72))
    lengths = m.checkpoint_lengths()
    _expect(all(n % 4 == 0 for n in lengths), "sglang-34780", f"checkpoints off the page grid: {lengths}")
    hit = m.run_request((*prompt[:12], 80, 81))
    # checkpoints at 8 and 12 (prefill chunks of 8 and 6) and 16 (decode): the branch at 12 resumes there
    _expect(hit == 12, "sglang-34780", f"a branch at 12 tokens hit {hit}, expected 12 ({lengths})")


def _prefix_on_a_chunk_boundary(m: CacheMachine) -> None:
    # 9 tokens = two chunks of 4 + one token: the prefix of 8 ends exactly on a chunk boundary; a repeat
    # must hit it (and the 10-token prompt, not on a boundary, hits its chunk end too)
    for n in (9, 10):
        prompt = _prompt(10 * n, n)
        m.run_request(prompt)
        hit = m.run_request(prompt)
        _expect(hit == 8, "sglang-30850", f"a repeat of a {n}-token prompt hit {hit} tokens, expected 8")


def _checkpoint_in_unique_tokens(m: CacheMachine) -> None:
    # a shared 6-token prefix, then request-unique tokens; the grid-aligned checkpoint of the first request
    # lands in its unique part, so the second misses, learns the branch point and checkpoints it: the
    # third request sharing the prefix must hit it
    shared = _prompt(1, 6)
    m.run_request(shared + _prompt(100, 5))
    m.run_request(shared + _prompt(200, 5))
    hit = m.run_request(shared + _prompt(300, 5))
    _expect(
        bool(hit), "vllm-45238", f"the third request sharing the prefix hit {hit} ({m.checkpoint_lengths()})"
    )


def _no_hit_beyond_the_last_state(m: CacheMachine) -> None:
    # KV resident past the deepest state (the request's tail after its last checkpoint) must never be
    # reported as a hit: a hit is a state plus its KV. lookup() checks the hit against the oracle's deepest
    # checkpoint and the state it hands out.
    prompt = _prompt(1, 10)
    m.run_request(prompt, outputs=(60, 61, 62))
    deepest = max(m.checkpoint_lengths(), default=0)
    hit = m.lookup((*prompt, 60, 61, 62, 63))
    _expect(hit == deepest, "lmcache-2863", f"hit {hit} tokens, the deepest state is at {deepest}")


def _params(**kw: Any) -> SuiteParams:
    base = dict(kv_pages=96, state_slots=16, req_rows=1, state_chunk=1, prefill_chunk=16, track_interval=4)
    base.update(kw)
    return SuiteParams(**base)  # type: ignore[arg-type]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "sglang-22935",
        "https://github.com/sgl-project/sglang/issues/22935 (fix PR #38625)",
        "a split and the len-1 admission match give identical prompts 0 hits (no_buffer cannot track the "
        "state one token short of the prompt; the maintainers' answer is extra_buffer): under extra_buffer "
        "the third identical prompt must hit",
        _params(strategy="extra_buffer"),
        _identical_prompts_after_split,
    ),
    Scenario(
        "sglang-36935",
        "https://github.com/sgl-project/sglang/issues/36935 (PR #38000)",
        "branch reuse collapses to 0 when a chain's chunk checkpoints outnumber the state pool; a branch "
        "forking mid-chain must hit",
        _params(strategy="extra_buffer", state_slots=6, prefill_chunk=2),
        _branch_reuse_under_slot_pressure,
    ),
    Scenario(
        "sglang-39342",
        "https://github.com/sgl-project/sglang/issues/39342",
        "a chunk that tracks nothing must not donate its (unwritten) track slot; only stamped states reach "
        "the tree",
        _params(strategy="extra_buffer", state_chunk=4, prefill_chunk=4, track_interval=4),
        _unwritten_slot_not_donated,
    ),
    Scenario(
        "sglang-34780",
        "https://github.com/sgl-project/sglang/issues/34780",
        "a tree page wider than the state grid attaches states at the wrong depth; every checkpoint must "
        "lie on lcm(page, grid) and hold its own prefix's state",
        _params(strategy="extra_buffer", page_size=4, state_chunk=2, prefill_chunk=8, track_interval=4),
        _state_depth_on_the_page_grid,
    ),
    Scenario(
        "sglang-30850",
        "https://github.com/sgl-project/sglang/issues/30850 and #39745",
        "a prefix ending exactly on a chunk boundary is never cached; a repeat must hit the boundary",
        _params(strategy="extra_buffer", prefill_chunk=4),
        _prefix_on_a_chunk_boundary,
    ),
    Scenario(
        "vllm-45238",
        "https://github.com/vllm-project/vllm/issues/45238",
        "the one aligned checkpoint lands in request-unique tokens: 0 hits; the branch point must be "
        "checkpointed so the third request sharing the prefix hits",
        _params(strategy="extra_buffer", state_chunk=4),
        _checkpoint_in_unique_tokens,
        frozenset({"requests", "branching"}),
    ),
    Scenario(
        "lmcache-2863",
        "https://github.com/LMCache/LMCache/pull/2863",
        "KV hits reported beyond the last state give garbled output; a hit must end at the deepest state",
        _params(strategy="extra_buffer", prefill_chunk=4, track_interval=8),
        _no_hit_beyond_the_last_state,
    ),
)


def applicable(scenario: Scenario, adapter_cls: Any) -> str | None:
    """``None`` if ``adapter_cls`` can run ``scenario``, else why not (a missing capability, or a
    configuration its ``accepts(params)`` refuses)."""
    missing = scenario.needs - frozenset(getattr(adapter_cls, "capabilities", frozenset()))
    if missing:
        return f"{adapter_cls.__name__} lacks {sorted(missing)}"
    accepts = getattr(adapter_cls, "accepts", None)
    if accepts is not None and not accepts(scenario.params):
        return f"{adapter_cls.__name__} cannot build {scenario.params}"
    return None


def run_scenario(scenario: Scenario, factory: Callable[[SuiteParams], CacheAdapter]) -> CacheMachine:
    """Run ``scenario`` against a fresh adapter from ``factory``, then tear down (every pool whole).
    Returns the machine (its snapshot is the final content). Raises what the scenario or a check raises."""
    machine_cls = make_machine(factory, st.just(scenario.params), f"Scenario_{scenario.name}")
    m = machine_cls()
    m.start(scenario.params)
    scenario.run(m)
    m.teardown()
    return m
