"""Known failures of an engine under test: counted, never hidden, never mistaken for a pass.

An adapter for another engine's cache will meet that engine's open bugs (SGLang's slot-exhaustion
assert, say) long before it meets a new one, and a run that stops at the first known bug finds nothing
else. So an adapter may recognise a failure it knows and raise :class:`KnownFailure` with the failure's
name instead of letting the engine's exception through. The state machine then:

1. counts it in its class's :class:`FailureLog` (``Machine.known_failures``), with the first message and
   the step count, so a test can assert that it was seen, how often, and print the tally;
2. discards the example (Hypothesis ``reject``): the engine's state is broken after the failure, so the
   rest of the example would only report consequences; the search goes on with other examples;
3. skips teardown for that example (the cache is left alone).

Only the failures an adapter documents may be counted: :class:`KnownIssue` records name, source (the
public report) and what the failure looks like, and :meth:`KnownIssue.matches` is the one test of an
exception. Anything unrecognised propagates as a failure of the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["FailureLog", "KnownFailure", "KnownIssue"]


@dataclass(frozen=True)
class KnownIssue:
    """A documented engine failure: ``name`` (short, stable), ``report`` (where it is described
    publicly), ``summary`` (what goes wrong), and ``signature``: the exception type names and message
    fragment that identify it (any type in ``types``, and ``message`` a substring of ``str(exc)``)."""

    name: str
    report: str
    summary: str
    types: tuple[str, ...]
    message: str

    def matches(self, exc: BaseException) -> bool:
        names = {cls.__name__ for cls in type(exc).__mro__}
        return bool(names & set(self.types)) and self.message in str(exc)


class KnownFailure(Exception):
    """Raised by an adapter for a documented engine failure (:class:`KnownIssue`). Deliberately not an
    ``AssertionError``: the machine must never read it as a check that failed."""

    def __init__(self, issue: KnownIssue, detail: str) -> None:
        super().__init__(f"known failure {issue.name} ({issue.report}): {detail}")
        self.issue = issue
        self.detail = detail


@dataclass
class FailureLog:
    """Tally of known failures met by a machine class, across examples. ``counts``: name -> times;
    ``first``: name -> the first message; ``examples``: examples run (discarded ones included)."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)
    examples: int = 0

    def record(self, failure: KnownFailure, step: int) -> None:
        name = failure.issue.name
        self.counts[name] += 1
        self.first.setdefault(name, f"step {step}: {failure}")

    def summary(self) -> str:
        """One line per failure name: ``name: count / examples (first message)``."""
        if not self.counts:
            return f"no known failures in {self.examples} examples"
        return "\n".join(
            f"{name}: {n} of {self.examples} examples ({self.first[name]})"
            for name, n in sorted(self.counts.items())
        )
