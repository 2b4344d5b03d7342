"""The paged request lifecycle as engines use and misuse it (issue 32): the Hypothesis state machine
:class:`~mamba_radix.testing.machine.LifecycleMachine` over our cache, one machine per buffer strategy and
page size: no_buffer unpaged (it needs page size 1), extra_buffer and extra_buffer_lazy at page sizes 1, 4
and 16 (:func:`~mamba_radix.testing.radix_adapter.lifecycle_params`: tiny pools, 3-6 pages at 16).

Every step runs the suite's after-step checks (the cache's ``check_invariants`` with the running requests,
whose pending forwards' KV is theirs, and each allocator's audit; the oracle; conservation of KV pages,
slots and rows; stamps). On top, the machine predicts every lifecycle call from the contract: a prefill
chunk ends on a page boundary or at the prompt's end (``prefill_chunk_len`` is SGLang's cut), a decode
forward does not cross the next decode boundary, one forward is pending per request, ``finish(insert=True)``
refuses a pending forward, a plan commits once and never after its request finished. A call the contract
refuses must be refused with ``lifecycle_state()`` (tree dump, pools, counters, ``reserved_kv_tokens``,
stats, every request's fields and row) unchanged; one it allows must go through. Requests are aborted with
a forward pending (prefill or decode, starting a page or continuing the last partial one, in the first page
or later), retracted when KV runs short and admitted again as fresh requests.

A last test asserts that the machines reached every kind of step the file names (``Machine.coverage``: per
page size over the strategies, the rest over all machines), so a change that stops the rules from reaching
one fails instead of passing vacuously. The example budget follows the Hypothesis profile (``ci``: 16
examples of up to 50 steps per machine, derandomized); the reach is asserted from the ``ci`` budget up,
not under ``dev``'s quick loop.

With the issue-32 fixes reverted, this file fails for each: an extend that accepts a prefill chunk ending
inside a page is reported at once ("accepted, but the contract refuses it"); an abort that frees the last
partial page twice is caught by the allocator audit of the next ``check_invariants``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from mamba_radix.testing.machine import LifecycleMachine, make_machine
from mamba_radix.testing.radix_adapter import MambaRadixAdapter, lifecycle_params

CONFIGURATIONS: tuple[tuple[str, int], ...] = (
    ("no_buffer", 1),  # no_buffer runs unpaged
    ("extra_buffer", 1),
    ("extra_buffer", 4),
    ("extra_buffer", 16),
    ("extra_buffer_lazy", 1),
    ("extra_buffer_lazy", 4),
    ("extra_buffer_lazy", 16),
)
MACHINES = {
    (strategy, page): make_machine(
        MambaRadixAdapter,
        lifecycle_params(strategies=(strategy,), page_sizes=(page,)),
        f"Lifecycle_{strategy}_page{page}",
        base=LifecycleMachine,
    )
    for strategy, page in CONFIGURATIONS
}

# Quantized checkpoints (issue 26): int8 / fp8 e4m3 drawn per example, with the checkpoint pool's size, and
# value stamps (mamba_radix/testing/value_stamps.py). One machine per strategy, each strategy at another page
# size, so that each strategy's and each page size's hand-over quantizes and its hits dequantize.
QUANTIZED: tuple[tuple[str, int], ...] = (("no_buffer", 1), ("extra_buffer", 4), ("extra_buffer_lazy", 16))
QUANTIZED_MACHINES = {
    (strategy, page): make_machine(
        MambaRadixAdapter,
        lifecycle_params(strategies=(strategy,), page_sizes=(page,), checkpoint_formats=("int8", "fp8_e4m3")),
        f"Lifecycle_{strategy}_page{page}_quantized",
        base=LifecycleMachine,
    )
    for strategy, page in QUANTIZED
}

# A sixth of the profile's examples per machine, seven machines: about one test of test_stateful_radix.py
# (ci: 16 examples of up to 50 steps each, ~4 s per machine on one core).
_PROFILE = settings.default  # the profile conftest.py loaded
EXAMPLES = max(3, _PROFILE.max_examples // 6)
BUDGET = settings(_PROFILE, max_examples=EXAMPLES)
# half that for the quantized machines (a hand-over quantizes, a check dequantizes every checkpoint)
QUANTIZED_BUDGET = settings(_PROFILE, max_examples=max(2, EXAMPLES // 2))
REACH_FROM = 16  # the reach is asserted from the ci budget up (dev's few examples reach less)

_REACHED: dict[tuple[str, int], Counter[str]] = {}


def run_machine(strategy: str, page: int) -> Counter[str]:
    """Run the machine of ``strategy`` at ``page`` under :data:`BUDGET`, once per session (the machine
    test and the reach test share the run); returns what it reached. Raises what the run found."""
    key = (strategy, page)
    if key not in _REACHED:
        machine = MACHINES[key]
        machine.coverage.clear()
        run_state_machine_as_test(machine, settings=BUDGET)
        _REACHED[key] = Counter(machine.coverage)
    return _REACHED[key]


@pytest.mark.parametrize(("strategy", "page"), QUANTIZED, ids=[f"{s}-page{p}" for s, p in QUANTIZED])
def test_paged_lifecycle_machine_with_quantized_checkpoints(strategy: str, page: int) -> None:
    """The same contract and checks with the tree's checkpoints quantized in their own pool."""
    run_state_machine_as_test(QUANTIZED_MACHINES[(strategy, page)], settings=QUANTIZED_BUDGET)


def unreached(reached: dict[tuple[str, int], Counter[str]]) -> list[str]:
    """What the machines (``(strategy, page)`` -> events reached) failed to reach. Per page size, over
    the strategies run at it: prefill and decode forwards, aborts with each pending, eviction; paged, the
    abort of a decode forward continuing the request's last partial page (the double free of issue 32) and
    of a prefill forward ending inside a page. Over all machines: every refusal, a KV shortage, a
    retraction, a re-admission, an abort with a forward pending in a first page of 16 tokens, a refused
    admission, a hand-over checkpoint evicted under a KV-only lock (``skip_decode_lock``). O(events)."""
    missing: list[str] = []
    for page in sorted({p for _, p in reached}):
        at_page = sum((c for (_, p), c in reached.items() if p == page), Counter())
        events = [
            f"forward: prefill (page={page})",
            f"forward: decode (page={page})",
            f"abort: pending prefill forward (page={page})",
            f"abort: pending decode forward (page={page})",
            f"KV evicted (page={page})",
        ]
        if page > 1:
            events += [
                f"abort: pending decode forward continuing a partial page (page={page})",
                f"abort: pending prefill forward ending inside a page (page={page})",
            ]
        missing += [event for event in events if not at_page[event]]
    everywhere = sum(reached.values(), Counter())
    events = [
        "KV short",
        "retracted when KV was short",
        "re-admitted after an abort",
        "abort: pending forward in the first page (page=16)",
        "refused: extend while a forward is pending",
        "refused: finish(insert=True) with a forward pending",
        "refused: commit of a plan committed already",
        "refused: commit of a forward aborted in flight",
        "refused: commit after its request finished",
        "refused: finish of a finished request",
        "refused: extend of a finished request",
        "refused: extend by zero tokens",
        "refused: prefill chunk past the prompt's end",
        "refused: prefill chunk ending inside a page",
        "refused: decode over a token not sampled yet",
        "refused: decode span across the decode boundary",
        "checkpoint evicted under a KV-only lock",
    ]
    missing += [event for event in events if not everywhere[event]]
    if not any(event.startswith("refused: admission") for event in everywhere):
        missing.append("refused: admission (can_admit's no and admit's refusal)")
    return missing


@pytest.mark.parametrize(
    ("strategy", "page"), CONFIGURATIONS, ids=[f"{s}-page{p}" for s, p in CONFIGURATIONS]
)
def test_paged_lifecycle_machine(strategy: str, page: int) -> None:
    """The machine finds no violation of the lifecycle contract or of the suite's checks."""
    run_machine(strategy, page)


def test_the_machines_reach_every_kind_of_step() -> None:
    """The rules must keep reaching what the file names: a change that stops them from reaching one fails
    here instead of passing vacuously. Runs the machines the tests above did not run in this session."""
    reached = {configuration: run_machine(*configuration) for configuration in CONFIGURATIONS}
    if EXAMPLES < REACH_FROM:
        pytest.skip(
            f"{EXAMPLES} examples per machine: the reach is asserted from {REACH_FROM} (the ci profile) up"
        )
    missing = unreached(reached)
    everything = dict(sorted(sum(reached.values(), Counter()).items()))
    assert not missing, f"the machines never reached {missing}; they reached {everything}"


_LIFECYCLE_CALLS = (
    "lifecycle_view",
    "prefill_chunk_len",
    "can_admit",
    "start_forward",
    "commit_forward",
    "finish_step",
    "recommit",
    "lifecycle_state",
)


class _WithoutSteps(MambaRadixAdapter):
    """Our adapter without capability "lifecycle_steps", counting the base request calls the machine makes;
    any lifecycle call fails the run."""

    capabilities = MambaRadixAdapter.capabilities - {"lifecycle_steps"}
    calls: ClassVar[Counter[str]] = Counter()

    def admit(self, rid: int, extra_key: Any, input_ids: Any, max_new_tokens: int | None = None) -> Any:
        type(self).calls["admit"] += 1
        return super().admit(rid, extra_key, input_ids, max_new_tokens)

    def prefill_chunk(self, rid: int) -> Any:
        type(self).calls["prefill_chunk"] += 1
        return super().prefill_chunk(rid)

    def finish(self, rid: int, insert: bool) -> Any:
        type(self).calls["finish"] += 1
        return super().finish(rid, insert)


def _not_without_the_capability(name: str) -> Any:
    def call(self: _WithoutSteps, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the machine called {name} of an adapter without capability lifecycle_steps")

    return call


for _name in _LIFECYCLE_CALLS:
    setattr(_WithoutSteps, _name, _not_without_the_capability(_name))


def test_an_adapter_without_the_capability_gets_the_base_rules_only() -> None:
    """Adapters lacking "lifecycle_steps" are unaffected: the lifecycle machine drives them with the base
    machine's rules (admit, prefill, decode, finish...) and never calls a lifecycle method."""
    machine = make_machine(
        _WithoutSteps,
        lifecycle_params(strategies=("extra_buffer",), page_sizes=(4,)),
        "LifecycleWithoutSteps",
        base=LifecycleMachine,
    )
    _WithoutSteps.calls.clear()
    run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=10))
    assert not machine.coverage, dict(machine.coverage)
    assert _WithoutSteps.calls["admit"], dict(_WithoutSteps.calls)
    if EXAMPLES >= REACH_FROM:  # derandomized: the base request rules reach prefill and finish
        assert _WithoutSteps.calls["prefill_chunk"] and _WithoutSteps.calls["finish"], dict(
            _WithoutSteps.calls
        )
