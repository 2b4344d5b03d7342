"""Typed errors of mamba_radix.

Every error the package raises on purpose derives from :class:`MambaRadixError`, so an engine can catch
the whole family in one place. A call that raises leaves pools and tree exactly as they were before it.

Over-allocation is *not* an error: ``alloc`` returns ``None`` as in SGLang, and the caller decides whether
to evict and retry. :class:`OutOfMemory` / :class:`OutOfSlots` exist for callers that ask for an
exception instead.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "InvalidArgument",
    "InvalidIndex",
    "InvalidPosition",
    "InvariantError",
    "MambaRadixError",
    "OutOfMemory",
    "OutOfSlots",
    "TraceFileError",
    "TraceFormatError",
    "check_count",
]


class MambaRadixError(Exception):
    """Base class of every error raised by mamba_radix."""


class ConfigError(MambaRadixError, ValueError):
    """An invalid configuration. The message names the flag and says how to fix it."""


class InvalidArgument(MambaRadixError, ValueError):
    """A call got an argument of the wrong dtype, shape, device or value."""


class InvalidIndex(InvalidArgument):
    """A free of padding, of an index never allocated, or a double free."""


class InvalidPosition(InvalidArgument, IndexError):
    """A position or prefix length outside the sequence it indexes (also an ``IndexError``)."""


class OutOfMemory(MambaRadixError):
    """KV tokens or request rows ran out (only where a caller asked for an exception)."""


class OutOfSlots(OutOfMemory):
    """State slots ran out (only where a caller asked for an exception)."""


class InvariantError(MambaRadixError, AssertionError):
    """A structural invariant of the cache does not hold; the message carries a readable dump."""


class TraceFormatError(MambaRadixError, ValueError):
    """A bad row in a trace file: carries the file, the 1-based line number and the field."""

    def __init__(self, path: str, line: int, field: str | None, message: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = f"{path}:{line}" + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class TraceFileError(TraceFormatError, OSError):
    """A trace path that cannot be read at all (missing, a folder, no permission): line 0, no field.
    Also an ``OSError``, so callers that handle file errors keep working."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, 0, None, message)
        self.reason = message  # (not OSError's strerror/filename: setting those changes str(err))


def check_count(value: object, what: str, minimum: int = 0) -> int:
    """``value`` (a count of tokens, states, requests, ...) as an int ``>= minimum``, or
    :class:`InvalidArgument` naming ``what``; a bool is refused (``True`` is not a count). The one home of
    this rule: the tree, the lifecycle, the strategies and the pools call it. O(1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{what} must be an int >= {minimum}, got {value!r}")
    return value
