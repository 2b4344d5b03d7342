"""The README's Python examples run and their assertions hold (a README that drifts from the code fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _python_blocks() -> list[str]:
    return _BLOCK.findall(README.read_text(encoding="utf-8"))


def test_readme_has_python_examples() -> None:
    assert _python_blocks(), "README.md lost its Python examples"


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_example_runs(index: int, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(_python_blocks()[index], f"README.md[python block {index}]", "exec"), {})
