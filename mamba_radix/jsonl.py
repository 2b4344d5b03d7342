"""Reading JSON-lines trace files: one JSON object a line, blank lines skipped.

Shared by the simulator's trace loaders (:mod:`mamba_radix.sim.traces`) and the capacity planner's workload
reader (:mod:`mamba_radix.capacity.planner`), so a bad row reads the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mamba_radix.errors import TraceFormatError

__all__ = ["iter_json_objects"]


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of ``path``, streaming.

    Raises :class:`TraceFormatError` (file and line) for a line that is not JSON or not a JSON object, and
    ``OSError`` if the file cannot be opened. O(1) memory beyond one line.
    """
    with open(path, encoding="utf-8") as f:
        for line_no, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(str(path), line_no, None, f"invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(str(path), line_no, None, "a row must be a JSON object")
            yield line_no, row
