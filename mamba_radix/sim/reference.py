"""Matching a run's records with a reference run's: the one comparison both reports use.

A sweep's report (:func:`mamba_radix.sim.report.reference_comparison`, records matched on their
parameters, identical when every outcome metric is) and the policy experiment's
(:func:`mamba_radix.experiment_report.reference_comparison`, rows matched on workload, regime, point and
policy at the same pools, identical when the hit rate is) differ only in the key, the test for a
counterpart and the test for "identical"; each passes those and writes its own lines from the
:class:`ReferenceMatch` list. No side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ReferenceMatch", "match_reference", "select_runs"]

Record = dict[str, Any]


@dataclass(frozen=True)
class ReferenceMatch:
    """One run and its reference counterpart (None: the reference has none), and whether the two have
    the same outcome (always False without a counterpart)."""

    run: Record
    reference: Record | None
    identical: bool


def match_reference(
    runs: Iterable[Record],
    reference: Sequence[Record],
    key: Callable[[Record], Hashable],
    identical: Callable[[Record, Record], bool],
    counterpart: Callable[[Record, Record], bool] | None = None,
) -> list[ReferenceMatch]:
    """Each of ``runs``, in order, with the reference record of the same ``key`` (the last one of that
    key, should the reference repeat it). A reference record for which ``counterpart(run, ref)`` is false
    (e.g. other pools) counts as none. O(runs + reference)."""
    by_key = {key(r): r for r in reference}
    out = []
    for run in runs:
        ref = by_key.get(key(run))
        if ref is not None and counterpart is not None and not counterpart(run, ref):
            ref = None
        out.append(ReferenceMatch(run, ref, ref is not None and identical(run, ref)))
    return out


def select_runs(
    records: Sequence[Record], groups: Sequence[str] | None, where: dict[str, Any] | None
) -> list[Record]:
    """The successful runs (no ``error``) of ``groups`` (None or empty: every group) whose parameters match
    ``where`` (a value, or a list of accepted values, per key): the runs a plot or table of either report
    draws. O(records)."""
    out = []
    for r in records:
        if "error" in r:
            continue
        p = r["params"]
        if groups and p.get("group") not in groups:
            continue
        if where and any(
            (p.get(k) not in v) if isinstance(v, list) else (p.get(k) != v) for k, v in where.items()
        ):
            continue
        out.append(r)
    return out
