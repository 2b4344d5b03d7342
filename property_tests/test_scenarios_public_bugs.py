"""Regression scenarios from public bug reports (:mod:`mamba_radix.testing.scenarios`), against our cache
and against SGLang 0.5.20's real cache.

Our cache must pass every one. SGLang's known outcome is pinned: a scenario it fails is marked
``xfail(strict=True)`` with the report, so a fixed release (or a scenario that stops seeing the bug) flips
the test; a scenario its configurator cannot build is skipped with the reason.
"""

from __future__ import annotations

import pytest

from mamba_radix.testing import MambaRadixAdapter
from mamba_radix.testing.scenarios import SCENARIOS, ScenarioFailure, applicable, run_scenario

# what SGLang 0.5.20 shows (measured with this file): the branch reuse collapse of #36935
SGLANG_FAILS = {
    "sglang-36935": "SGLang #36935: a branch forking mid-chain finds no checkpoint below the fork"
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_our_cache_passes(scenario) -> None:  # type: ignore[no-untyped-def]
    assert applicable(scenario, MambaRadixAdapter) is None
    run_scenario(scenario, MambaRadixAdapter)


def test_scenarios_are_named_after_reports() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(set(names)) == len(names) == 7
    assert all(s.report.startswith("https://") for s in SCENARIOS)


def test_a_scenario_sees_its_symptom() -> None:
    """The #22935 scenario under no_buffer (which cannot track the state one token short of the prompt)
    reports exactly the symptom of the report: identical prompts keep missing."""
    import dataclasses

    scenario = next(s for s in SCENARIOS if s.name == "sglang-22935")
    no_buffer = dataclasses.replace(
        scenario, params=dataclasses.replace(scenario.params, strategy="no_buffer")
    )
    with pytest.raises(ScenarioFailure, match="sglang-22935: the third identical prompt hit 0"):
        run_scenario(no_buffer, MambaRadixAdapter)


def _sglang_cases() -> list:  # type: ignore[type-arg]
    cases = []
    for s in SCENARIOS:
        marks = [pytest.mark.sglang]
        if s.name in SGLANG_FAILS:
            marks.append(pytest.mark.xfail(strict=True, raises=ScenarioFailure, reason=SGLANG_FAILS[s.name]))
        cases.append(pytest.param(s, id=s.name, marks=marks))
    return cases


@pytest.mark.parametrize("scenario", _sglang_cases())
def test_sglang_0_5_20(scenario) -> None:  # type: ignore[no-untyped-def]
    from mamba_radix.testing.sglang import SGLangUnavailableError, load_sglang
    from mamba_radix.testing.sglang_adapter import SGLANG_VERSION, SGLangAdapter

    try:
        load_sglang(SGLANG_VERSION)
    except SGLangUnavailableError as err:  # no network: not a failure of the code under test
        pytest.skip(str(err))
    why = applicable(scenario, SGLangAdapter)
    if why is not None:
        pytest.skip(why)
    run_scenario(scenario, SGLangAdapter)
