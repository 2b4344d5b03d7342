"""Files shipped inside the package: the bundled traces (with their licence) and experiment definitions.

Found through :mod:`importlib.resources`, so they work from any folder, installed from a wheel or from a
checkout (``experiments/traces`` and ``experiments/*.json`` in the repository point here).

- ``traces/``: the Mooncake FAST'25 traces, ``LICENSE-APACHE-2.0``, ``SOURCE.md`` (attribution) and
  ``MOONCAKE_README.md`` (keep them together when copying);
- ``experiments/``: experiment definitions (``default.json``, ``peers.json``) and their reference results
  (``*.reference.jsonl``: the committed runs without time series, for comparison).

No side effects on import; lookups are O(files in the folder).
"""

from __future__ import annotations

import atexit
import contextlib
from importlib import resources
from pathlib import Path

from mamba_radix.errors import ConfigError

__all__ = [
    "DEFAULT_DEFINITION",
    "DEFAULT_TRACE",
    "bundled_definitions",
    "bundled_traces",
    "data_path",
    "definition_path",
    "trace_path",
]

DEFAULT_TRACE = "mooncake_conversation_trace.jsonl"
DEFAULT_DEFINITION = "default"

_files = contextlib.ExitStack()
atexit.register(_files.close)


def data_path(*parts: str) -> Path:
    """A real filesystem path of a file or folder under the package's data folder (extracted to a
    temporary file for the process's lifetime when the package is imported from a zip)."""
    res = resources.files(__name__).joinpath(*parts)
    if isinstance(res, Path):
        return res
    return _files.enter_context(resources.as_file(res))  # pragma: no cover - zip imports only


def bundled_traces() -> list[str]:
    """File names of the bundled traces (``*.jsonl`` in ``traces/``), sorted."""
    return sorted(p.name for p in data_path("traces").iterdir() if p.name.endswith(".jsonl"))


def bundled_definitions() -> list[str]:
    """Names of the bundled experiment definitions (``default``, ``peers``, ...), sorted."""
    return sorted(
        p.name[: -len(".json")] for p in data_path("experiments").iterdir() if p.name.endswith(".json")
    )


def trace_path(name: str = DEFAULT_TRACE) -> Path:
    """The path of bundled trace ``name`` (a file name such as ``mooncake_conversation_trace.jsonl``).

    Raises :class:`ConfigError` naming the bundled traces when there is no such trace."""
    path = data_path("traces", Path(name).name)
    if Path(name).name != name or not path.is_file():
        raise ConfigError(f"no bundled trace {name!r}; bundled: {', '.join(bundled_traces())}")
    return path


def definition_path(name: str = DEFAULT_DEFINITION) -> Path:
    """The path of bundled experiment definition ``name`` (``default``, ``peers``; ``.json`` optional).

    Raises :class:`ConfigError` naming the bundled definitions when there is none."""
    stem = name[: -len(".json")] if name.endswith(".json") else name
    path = data_path("experiments", stem + ".json")
    if "/" in stem or not path.is_file():
        raise ConfigError(
            f"no bundled experiment definition {name!r}; bundled: {', '.join(bundled_definitions())}"
        )
    return path
