"""Reading JSON-lines trace files: one JSON object a line, blank lines skipped.

Shared by the simulator's trace loaders (:mod:`mamba_radix.sim.traces`) and the capacity planner's workload
reader (:mod:`mamba_radix.capacity.planner`), so a bad row reads the same everywhere.

Every failure is a :class:`~mamba_radix.errors.TraceFormatError` naming the file and the 1-based line: a
line that is not UTF-8 (a binary file), not JSON, nested too deeply for the parser, holding an integer
literal too long to convert, or not a JSON object; a path that cannot be opened (missing, a folder, no
permission) is a :class:`~mamba_radix.errors.TraceFileError` (also an ``OSError``) at line 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mamba_radix.errors import TraceFileError, TraceFormatError

__all__ = ["MAX_LINE_BYTES", "iter_json_objects"]

# A longer line is refused rather than read: a binary or corrupt file without newlines would otherwise be
# read into memory whole. Token-format rows of million-token requests stay far below this.
MAX_LINE_BYTES = 1 << 30


def _open(path: str | Path):
    try:
        return open(path, "rb")  # bytes: each line is decoded on its own, so a bad byte has a line number
    except IsADirectoryError:
        raise TraceFileError(
            str(path), "is a folder, not a trace file; pass the .jsonl file inside it"
        ) from None
    except FileNotFoundError:
        raise TraceFileError(str(path), "no such file") from None
    except OSError as exc:
        raise TraceFileError(str(path), f"cannot be read ({exc.strerror or exc})") from None


def iter_json_objects(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line number, object)`` for each non-blank line of ``path``, streaming.

    Raises :class:`TraceFormatError` (file and line) for a line that is not UTF-8, not JSON (or nested
    past the parser's depth, or with an over-long integer literal), longer than :data:`MAX_LINE_BYTES`,
    or not a JSON object; :class:`TraceFileError` if the file cannot be opened (at the first ``next``).
    O(1) memory beyond one line.
    """
    name = str(path)
    with _open(path) as f:
        line_no = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise TraceFileError(name, f"cannot be read ({exc.strerror or exc})") from None
            if not raw:
                return
            line_no += 1
            if len(raw) > MAX_LINE_BYTES:
                raise TraceFormatError(
                    name, line_no, None, f"line longer than {MAX_LINE_BYTES} bytes; not a trace"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(
                    name, line_no, None, f"not UTF-8 text (byte {exc.start}); is this a binary file?"
                ) from None
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(name, line_no, None, f"invalid JSON ({exc.msg})") from None
            except RecursionError:
                raise TraceFormatError(name, line_no, None, "JSON nested too deeply to read") from None
            except ValueError as exc:  # e.g. an integer literal past Python's digit limit
                raise TraceFormatError(name, line_no, None, f"invalid JSON value ({exc})") from None
            if not isinstance(row, dict):
                raise TraceFormatError(name, line_no, None, "a row must be a JSON object")
            yield line_no, row
