"""The invariant suite: a brute-force oracle, pool checks and a Hypothesis state machine for any cache.

- :mod:`~mamba_radix.testing.adapter`: the :class:`CacheAdapter` protocol a cache implements to be driven
  (and how to write one for another engine);
- :mod:`~mamba_radix.testing.oracle`: :class:`PrefixOracle`, what a correct cache may hold and return;
- :mod:`~mamba_radix.testing.checks`: conservation, accounting, state stamps, running requests, path cap;
- :mod:`~mamba_radix.testing.faults`: allocation failures injected into live pools;
- :mod:`~mamba_radix.testing.sequences`: token sequences that share prefixes;
- :mod:`~mamba_radix.testing.machine`: :class:`CacheMachine` and :func:`make_machine`;
- :mod:`~mamba_radix.testing.radix_adapter`: the adapter for :class:`mamba_radix.cache.MambaRadixCache`
  (imported lazily: the protocol and machine do not need our cache).

Needs ``hypothesis`` (the ``test`` extra).
"""

from __future__ import annotations

from typing import Any

from mamba_radix.testing.adapter import (
    AdmitOutcome,
    CacheAdapter,
    EvictOutcome,
    InsertOutcome,
    Key,
    MatchOutcome,
    Offer,
    Ownership,
    RunningView,
    SuiteParams,
    TreeSnapshot,
)
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.faults import CapacityHold, FailNextAllocs
from mamba_radix.testing.machine import CacheMachine, LockHandle, make_machine
from mamba_radix.testing.oracle import ROOT_KEY, ExpectedMatch, OracleViolation, PrefixOracle

__all__ = [
    "ROOT_KEY",
    "AdmitOutcome",
    "CacheAdapter",
    "CacheMachine",
    "CapacityHold",
    "EvictOutcome",
    "ExpectedMatch",
    "FailNextAllocs",
    "InsertOutcome",
    "Key",
    "LockHandle",
    "MambaRadixAdapter",
    "MatchOutcome",
    "Offer",
    "OracleViolation",
    "Ownership",
    "PrefixOracle",
    "RunningView",
    "SuiteParams",
    "SuiteViolation",
    "TreeSnapshot",
    "make_machine",
    "radix_params",
]


def __getattr__(name: str) -> Any:
    # Lazy: the generic suite must import without our cache (another engine's adapter may not need it).
    if name in ("MambaRadixAdapter", "radix_params"):
        from mamba_radix.testing import radix_adapter

        return getattr(radix_adapter, name)
    raise AttributeError(name)
