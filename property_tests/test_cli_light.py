"""``mamba-radix --help``, ``--version`` and every ``COMMAND --help`` load neither torch nor the simulator
nor the SGLang loader: each check runs in a fresh interpreter (this process has long imported them), so
``sys.modules`` shows exactly what the command line pulled in. The cost model the help shows defaults of
lives in the light :mod:`mamba_radix.cost_model`, and the simulator runs on those same numbers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mamba_radix.cost_model import CostModel

# modules a help screen must not load: torch (seconds to import), the engine (imports torch and the
# cache), the SGLang wheel loader (runs pip; package boundaries, issue 24)
HEAVY = ("torch", "mamba_radix.sim.engine", "mamba_radix.cache", "mamba_radix.testing.sglang.loader")


def _loaded_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the HEAVY modules it left in ``sys.modules``."""
    probe = (
        "import contextlib, io, sys\n"
        f"{code}\n"
        f"print('loaded:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    last = proc.stdout.strip().splitlines()[-1]
    return [m for m in last.removeprefix("loaded:").split(",") if m]


def test_importing_the_command_line_loads_nothing_heavy() -> None:
    assert _loaded_after("import mamba_radix.cli") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["simulate", "--help"],
        ["sweep", "--help"],
        ["experiment", "--help"],
        ["plan", "--help"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_help_and_version_load_nothing_heavy(argv: list[str]) -> None:
    code = (
        "from mamba_radix.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({argv!r})\n"
        "assert code == 0 and out.getvalue().strip(), (code, out.getvalue())"
    )
    assert _loaded_after(code) == []


def test_plan_runs_without_torch() -> None:
    # the planner is arithmetic on the model's shapes: the command that runs it loads no torch either
    code = (
        "from mamba_radix.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['plan', '--model', 'kimi-k3', '--memory-budget-gb', '27.25']) == 0"
    )
    assert "torch" not in _loaded_after(code)


def test_the_help_shows_the_cost_model_the_simulator_runs_on() -> None:
    # one set of numbers: the engine's CostModel is the light module's class (re-exported), so the
    # defaults --help prints are the ones a run uses
    from mamba_radix.sim.engine import CostModel as EngineCostModel
    from mamba_radix.sim.engine import EngineOptions

    assert EngineCostModel is CostModel
    assert EngineOptions().cost == CostModel()


def test_the_help_prints_the_cost_defaults() -> None:
    from mamba_radix.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["simulate"].format_help()  # type: ignore[union-attr]
    assert f"(default {CostModel().decode_step_s:g})" in text
    assert f"(default {CostModel().prefill_tokens_per_s:g})" in text


def test_launch_settings_load_nothing_heavy() -> None:
    # --config is read before the command runs: reading it (and plan with it) must stay light
    code = (
        "import json, tempfile, os\n"
        "from mamba_radix.cli import main\n"
        "path = os.path.join(tempfile.mkdtemp(), 's.json')\n"
        "json.dump({'tp_size': 8, 'host': '0.0.0.0', 'speculative_dspark_block_size': 7}, open(path, 'w'))\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert main(['plan', '--config', path, '--memory-budget-gb', '27.25']) == 0"
    )
    assert _loaded_after(code) == []
