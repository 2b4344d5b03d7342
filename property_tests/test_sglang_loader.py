"""The SGLang loader is test and benchmark tooling behind the ``sglang-tools`` extra: without pip it says,
in one line and before running anything, which extra to install; a wheel already in its cache needs no
pip; ``pyproject.toml`` declares the extra it names and the ``test`` extra includes it. No network: the
download itself is covered by test_sglang_parity.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mamba_radix.testing.sglang import SGLangToolsMissingError, SGLangUnavailableError, fetch_wheel, loader

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture
def no_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty wheel cache and an interpreter without pip; any subprocess is a failure."""
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(loader, "_pip_available", lambda: False)

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ran {args!r} although pip is missing")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    return tmp_path


def test_a_missing_extra_is_one_line_naming_it(no_pip: Path) -> None:
    with pytest.raises(SGLangToolsMissingError) as err:
        fetch_wheel("0.5.20")
    message = str(err.value)
    assert "\n" not in message
    assert 'pip install "mamba-radix[sglang-tools]"' in message
    assert "sglang==0.5.20" in message
    # a kind of unavailability: the tests and benchmarks that skip an unavailable SGLang still do
    assert isinstance(err.value, SGLangUnavailableError)
    assert not (no_pip / "0.5.20").exists()  # nothing created before the check


def test_load_sglang_checks_before_anything(no_pip: Path) -> None:
    with pytest.raises(SGLangToolsMissingError, match=r"mamba-radix\[sglang-tools\]"):
        loader.load_sglang("0.5.23")


def test_a_cached_wheel_needs_no_pip(no_pip: Path) -> None:
    folder = no_pip / "0.5.20"
    folder.mkdir()
    wheel = folder / "sglang-0.5.20-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert fetch_wheel("0.5.20") == wheel


def test_pyproject_declares_the_extra_the_error_names() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert loader.EXTRA in extras
    needs = {req.split(">")[0].split("=")[0].split(";")[0].strip() for req in extras[loader.EXTRA]}
    assert {"pip", "hypothesis"} <= needs  # the download; mamba_radix.testing's state machine
    assert any(f"{loader.EXTRA}" in req and req.startswith("mamba-radix[") for req in extras["test"])


def test_the_test_environment_has_the_extra() -> None:
    # the test extra includes sglang-tools: the real check passes here (no download is attempted)
    loader.require_sglang_tools("0.5.20")
