"""The package works installed from a wheel, from any folder: package data, the two bundled commands,
``--version``; the core imports without the ``[experiments]`` extra; every subpackage is in the wheel.

The wheel is built once per session (``pip wheel . --no-deps``, no network), installed with ``--target``
into a temporary folder and run from an empty temporary folder with that folder first on ``PYTHONPATH``
(so the installed copy, not the checkout, is imported; the test checks which one it got).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _pip(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(out))
    (path,) = out.glob("mamba_radix-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    _pip("install", "--no-deps", "--target", str(site), str(wheel))
    return site


def _run(site: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site), MAMBA_RADIX_PROGRESS_EVERY_S="1000")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_the_wheel_holds_every_subpackage_and_the_trace_licence(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # automatic discovery: every package folder of the checkout is in the wheel
    for init in (REPO / "mamba_radix").rglob("__init__.py"):
        rel = init.relative_to(REPO).as_posix()
        assert rel in names, f"{rel} missing from the wheel"
    assert "mamba_radix_kernels/__init__.py" in names and not any(n.startswith("kernels/") for n in names)
    traces = "mamba_radix/data/traces/"
    for f in ("mooncake_conversation_trace.jsonl", "LICENSE-APACHE-2.0", "SOURCE.md", "MOONCAKE_README.md"):
        assert traces + f in names
    bundled = "mamba_radix/data/experiments/"
    for name in ("default", "sglang-knobs", "peers"):
        assert {f"{bundled}{name}.json", f"{bundled}{name}.reference.jsonl"} <= names, name
    # the main job's logic is in the package, not only in the repository's experiments/ folder
    assert {"mamba_radix/experiment.py", "mamba_radix/experiment_report.py"} <= names


def test_installed_commands_work_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    where = _run(
        installed, empty, "-c", "import mamba_radix; print(mamba_radix.__file__, mamba_radix.__version__)"
    )
    assert where.returncode == 0, where.stderr
    path, version = where.stdout.split()
    assert Path(path).is_relative_to(installed), "imported the checkout, not the installed wheel"
    done = _run(installed, empty, "-m", "mamba_radix.cli", "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"mamba-radix {version}"
    # simulate with its defaults: the bundled trace
    done = _run(installed, empty, "-m", "mamba_radix.cli", "simulate", "--limit", "30", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "requests            30" in done.stdout
    # the bundled default experiment (the policy comparison), into a new folder under ./mamba-radix-results
    done = _run(installed, empty, "-m", "mamba_radix.cli", "experiment", "--limit", "12", "--quiet")
    assert done.returncode == 0, done.stderr
    (folder,) = (empty / "mamba-radix-results").iterdir()
    assert folder.name.startswith("default-")
    report = (folder / "report.md").read_text()
    assert (
        "## Each policy as a fraction of the oracle" in report and "## Compared with the reference" in report
    )
    assert (folder / "conversation.png").is_file() and (folder / "overview.png").is_file()
    rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    from mamba_radix.policies.registry import POLICIES

    assert {r["policy"] for r in rows} == set(POLICIES) and all(r["requests"] <= 12 for r in rows)
    assert {r["workload"] for r in rows} == {"conversation", "chat", "system-prompt", "agent", "tree"}
    # the console script is installed too
    script = installed / "bin" / "mamba-radix"
    assert script.is_file()


def test_the_core_imports_without_the_experiments_extra(installed: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None; sys.modules['tqdm'] = None  # as if not installed\n"
        "import mamba_radix, mamba_radix.sim.sweep, mamba_radix.sim.report, mamba_radix.capacity\n"
        "from mamba_radix.cli import main\n"
        "assert main(['simulate', '--synthetic', 'chat', '--limit', '3', '--quiet']) == 0\n"
        "sys.exit(main(['experiment', '--limit', '2', '--quiet']))\n"
    )
    done = _run(installed, tmp_path, "-c", code)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert err == [
        "mamba-radix experiment: error: experiment draws plots and needs the [experiments] extra: "
        'pip install "mamba-radix[experiments]"'
    ]
    assert not (tmp_path / "mamba-radix-results").exists()  # refused before any work
