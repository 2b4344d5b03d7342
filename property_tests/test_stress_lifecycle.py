"""The release stress (``benchmarks/stress_lifecycle.py``) kept from rotting: a few hundred operations of it
on paged and unpaged configurations must run clean, and a planted double free (issue 32's abort defect:
the plan's KV freed on its own before the request's, so a partial page the plan continued is freed twice)
must be reported as a violation with a replay command that reproduces it. Well under 10 s in all."""

from __future__ import annotations

import importlib.util
import io
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

from mamba_radix.lifecycle import RequestLifecycle
from mamba_radix.request import Req

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "stress_lifecycle.py"
UNPAGED_AND_PAGED = "0.5.23/nb/no-ov/p1/cap-/track,0.5.20/eb/ov/p4/cap-/track,0.5.20/lazy/ov/p16/cap1/track"
PAGED = "0.5.20/eb/ov/p4/cap-/track,0.5.23/eb/no-ov/p4/cap3/track"


@pytest.fixture(scope="module")
def stress() -> ModuleType:
    """The script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("stress_lifecycle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def run(stress: ModuleType, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return stress.main(list(argv), out=out), out.getvalue()


def test_a_quick_run_on_paged_and_unpaged_configurations_is_clean(stress: ModuleType) -> None:
    code, text = run(stress, "--quick", "--ops", "450", "--configs", UNPAGED_AND_PAGED, "--check-every", "5")
    assert code == stress.EXIT_OK, text
    assert "violations: 0" in text
    for name in UNPAGED_AND_PAGED.split(","):
        row = next(line for line in text.splitlines() if line.startswith(name))
        ops, admits = (int(cell.replace(",", "")) for cell in row.split()[1:3])
        assert ops >= 150 and admits > 0, row


def test_the_configurations_cover_every_strategy_page_size_and_preset(stress: ModuleType) -> None:
    names = [spec.name for spec in stress.stress_configs()]
    assert len(names) == len(set(names)) >= 24
    for part in ("/nb/", "/eb/", "/lazy/", "/ov/", "/no-ov/", "/p1/", "/p4/", "/p16/", "/dins", "/track"):
        assert any(part in name for name in names), part
    assert {name.split("/")[0] for name in names} >= {"0.5.20", "0.5.23"}
    assert not any("/nb/" in name and "/p1/" not in name for name in names)  # no_buffer is page 1 only


def test_bad_usage_exits_2(stress: ModuleType) -> None:
    assert run(stress, "--configs", "no-such-config")[0] == stress.EXIT_USAGE
    assert run(stress, "--ops", "0")[0] == stress.EXIT_USAGE
    with pytest.raises(SystemExit) as exit_info:
        run(stress, "--ops", "many")
    assert exit_info.value.code == stress.EXIT_USAGE


def test_a_planted_double_free_is_reported_with_a_replay_that_reproduces_it(
    stress: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort before commit 3411282: the pending plan's KV freed on its own, then the request's KV up
    to kv_len; at page_size > 1 the page the plan continued is freed twice. The allocator audit in
    check_invariants must catch it."""
    finish = RequestLifecycle.finish

    def finish_freeing_the_plan_separately(self: RequestLifecycle, req: Req, insert: bool = True) -> None:
        plan = req.pending_plan
        if plan is not None and not insert:
            req.pending_plan = None
            self.token_to_kv_pool_allocator.free(plan.kv_indices)
        finish(self, req, insert)

    monkeypatch.setattr(RequestLifecycle, "finish", finish_freeing_the_plan_separately)
    code, text = run(stress, "--ops", "600", "--configs", PAGED, "--check-every", "1")
    assert code == stress.EXIT_VIOLATION, text
    assert "VIOLATION in configuration 0.5.20/eb/ov/p4/cap-/track" in text
    assert "double free" in text
    replay = next(line for line in text.splitlines() if line.startswith("replay: "))
    argv = shlex.split(replay.removeprefix("replay: "))[2:]  # less the interpreter and the script
    code, again = run(stress, *argv)
    assert code == stress.EXIT_VIOLATION and "double free" in again
