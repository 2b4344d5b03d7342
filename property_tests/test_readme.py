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


def test_readme_main_job_numbers_are_the_committed_reference_run() -> None:
    """The README's fraction-of-oracle table and wall time are those of experiments/reference/default/ (after
    `make reference`, copy the new table from its report.md)."""
    import json

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Simulator and the default experiment") : text.index("### The command line")]
    reference = README.parent / "experiments" / "reference" / "default"
    report = (reference / "report.md").read_text(encoding="utf-8")
    fraction_rows = [
        line
        for line in section.splitlines()
        if re.match(r"\| [a-z-]+ \| (slots bind|KV binds) \| \d+ \|", line)
    ]
    assert len(fraction_rows) >= 10, "the README lost the main job's fraction-of-oracle table"
    for line in fraction_rows:
        assert line in report, f"README row not in the reference report: {line}"
    info = json.loads((reference / "run_info.json").read_text())
    assert f"{info['wall_s']:.0f} s wall on {info['processes']} processes" in section


def test_readme_adaptive_split_table_is_the_committed_run() -> None:
    """Every row of the README's adaptive-split table equals the committed run's row for its budget and policy
    (`python experiments/adaptive_split.py --out experiments/reference/adaptive_split/adaptive_split.md`)."""
    reference = README.parent / "experiments" / "reference" / "adaptive_split" / "adaptive_split.md"

    def rows(text: str) -> dict[tuple[str, str], list[str]]:
        out = {}
        for line in text.splitlines():
            cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
            if len(cells) >= 8 and cells[0].endswith("slots") and "KV +" in cells[0]:
                out[(cells[0], cells[1])] = cells[2:8]
        return out

    ours, committed = rows(README.read_text(encoding="utf-8")), rows(reference.read_text(encoding="utf-8"))
    assert ours, "README.md lost its adaptive-split table"
    for key, cells in ours.items():
        assert committed.get(key) == cells, f"README row {key} differs from {reference.name}"
