"""The numbers the README and the documentation site quote from committed runs are those runs' numbers (a page
that drifts from the reference results fails here). Their Python examples run in test_docs_snippets.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAIN_JOB_PAGE = ROOT / "docs" / "experiments.md"  # the main job's tables
POLICIES_PAGE = ROOT / "docs" / "policies.md"  # the adaptive-split table
REFERENCE = ROOT / "experiments" / "reference" / "default"


def _fraction_rows(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if re.match(r"\| [a-z-]+ \| (slots bind|KV binds) \| \d+ \|", line)
    ]


def _wall_time() -> str:
    info = json.loads((REFERENCE / "run_info.json").read_text())
    return f"{info['wall_s']:.0f} s wall on {info['processes']} processes"


def test_readme_has_python_examples() -> None:
    assert re.search(r"^```python$", README.read_text(encoding="utf-8"), re.M), (
        "README.md lost its Python example"
    )


def test_main_job_page_numbers_are_the_committed_reference_run() -> None:
    """The main job page's fraction-of-oracle table and wall time are those of experiments/reference/default/
    (after `make reference`, copy the new table from its report.md into docs/experiments.md)."""
    text = MAIN_JOB_PAGE.read_text(encoding="utf-8")
    report = (REFERENCE / "report.md").read_text(encoding="utf-8")
    rows = _fraction_rows(text)
    assert len(rows) >= 10, f"{MAIN_JOB_PAGE.name} lost the main job's fraction-of-oracle table"
    for line in rows:
        assert line in report, f"{MAIN_JOB_PAGE.name} row not in the reference report: {line}"
    assert _wall_time() in text


def test_readme_main_job_excerpt_is_the_committed_reference_run() -> None:
    """The README quotes the conversation rows of the same table, and the same wall time."""
    text = README.read_text(encoding="utf-8")
    report = (REFERENCE / "report.md").read_text(encoding="utf-8")
    rows = _fraction_rows(text)
    assert rows, "README.md lost the main job's headline rows"
    for line in rows:
        assert line in report, f"README row not in the reference report: {line}"
    assert _wall_time() in text


def test_adaptive_split_table_is_the_committed_run() -> None:
    """Every row of the adaptive-split table (docs/policies.md) equals the committed run's row for its budget and
    policy (`python experiments/adaptive_split.py --out experiments/reference/adaptive_split/adaptive_split.md`)."""
    reference = ROOT / "experiments" / "reference" / "adaptive_split" / "adaptive_split.md"

    def rows(text: str) -> dict[tuple[str, str], list[str]]:
        out = {}
        for line in text.splitlines():
            cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
            if len(cells) >= 8 and cells[0].endswith("slots") and "KV +" in cells[0]:
                out[(cells[0], cells[1])] = cells[2:8]
        return out

    ours = rows(POLICIES_PAGE.read_text(encoding="utf-8"))
    committed = rows(reference.read_text(encoding="utf-8"))
    assert ours, f"{POLICIES_PAGE.name} lost its adaptive-split table"
    for key, cells in ours.items():
        assert committed.get(key) == cells, f"{POLICIES_PAGE.name} row {key} differs from {reference.name}"


def test_host_tier_tables_are_the_committed_run() -> None:
    """The host tier page's comparison rows (SGLang's HiCache, our placement, the tier-aware oracle) are rows of
    the committed host_tier run's report (`mamba-radix experiment --definition host_tier --out
    experiments/reference/host_tier --force`, then copy the rows into docs/host-tier.md)."""
    page = (ROOT / "docs" / "host-tier.md").read_text(encoding="utf-8")
    report = (ROOT / "experiments" / "reference" / "host_tier" / "report.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| host 4x, ")]
    assert len(rows) >= 8, "docs/host-tier.md lost its HiCache-against-ours tables"
    for line in rows:
        assert line in report, f"docs/host-tier.md row not in the host_tier reference report: {line}"
