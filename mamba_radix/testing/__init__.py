"""The invariant suite: a brute-force oracle, pool checks and a Hypothesis state machine for any cache.

- :mod:`~mamba_radix.testing.adapter`: the :class:`CacheAdapter` protocol a cache implements to be driven
  (and how to write one for another engine), :data:`CAPABILITIES`;
- :mod:`~mamba_radix.testing.params`: :func:`suite_params`, consistent tiny configurations;
- :mod:`~mamba_radix.testing.oracle`: :class:`PrefixOracle`, what a correct cache may hold and return;
- :mod:`~mamba_radix.testing.checks`: conservation, accounting, state stamps, running requests, path cap;
- :mod:`~mamba_radix.testing.stamps`: state stamps and a tensor-free :class:`StampStore`;
- :mod:`~mamba_radix.testing.faults`: allocation failures injected into live pools;
- :mod:`~mamba_radix.testing.known`: documented engine failures, counted (:class:`KnownFailure`);
- :mod:`~mamba_radix.testing.sequences`: token sequences that share prefixes;
- :mod:`~mamba_radix.testing.machine`: :class:`CacheMachine`, :class:`LifecycleMachine` (an adapter with the
  ``lifecycle_steps`` capability: the paged lifecycle step by step, misuse and refusals included) and
  :func:`make_machine`;
- :mod:`~mamba_radix.testing.scenarios`: regression scenarios from public bug reports, for any adapter;
- :mod:`~mamba_radix.testing.profiles`: the ``ci`` / ``dev`` / ``thorough`` Hypothesis profiles;
- :mod:`~mamba_radix.testing.radix_adapter`: the adapter for :class:`mamba_radix.cache.MambaRadixCache`;
- :mod:`~mamba_radix.testing.sglang_adapter`: the adapter for SGLang's own cache, loaded from its wheel.

The two adapters are imported lazily: the protocol, checks and machine need neither our cache nor torch.
Needs ``hypothesis`` (the ``test`` extra).
"""

from __future__ import annotations

from typing import Any

from mamba_radix.testing.adapter import (
    CAPABILITIES,
    AdmitOutcome,
    CacheAdapter,
    EvictOutcome,
    InsertOutcome,
    Key,
    LifecycleAdapter,
    MatchOutcome,
    Offer,
    Ownership,
    RunningView,
    SuiteParams,
    TreeSnapshot,
)
from mamba_radix.testing.checks import SuiteViolation
from mamba_radix.testing.faults import CapacityHold, FailNextAllocs
from mamba_radix.testing.known import FailureLog, KnownFailure, KnownIssue
from mamba_radix.testing.machine import CacheMachine, LifecycleMachine, LockHandle, make_machine
from mamba_radix.testing.oracle import ROOT_KEY, ExpectedMatch, OracleViolation, PrefixOracle
from mamba_radix.testing.params import suite_params
from mamba_radix.testing.profiles import load_profile, register_profiles
from mamba_radix.testing.stamps import StampStore, expected_stamp

__all__ = [
    "CAPABILITIES",
    "ROOT_KEY",
    "AdmitOutcome",
    "CacheAdapter",
    "CacheMachine",
    "CapacityHold",
    "EvictOutcome",
    "ExpectedMatch",
    "FailNextAllocs",
    "FailureLog",
    "InsertOutcome",
    "Key",
    "KnownFailure",
    "KnownIssue",
    "LifecycleAdapter",
    "LifecycleMachine",
    "LockHandle",
    "MambaRadixAdapter",
    "MatchOutcome",
    "Offer",
    "OracleViolation",
    "Ownership",
    "PrefixOracle",
    "RadixSuiteParams",
    "RunningView",
    "SGLangAdapter",
    "StampStore",
    "SuiteParams",
    "SuiteViolation",
    "TreeSnapshot",
    "expected_stamp",
    "lifecycle_params",
    "load_profile",
    "make_machine",
    "radix_params",
    "register_profiles",
    "sglang_params",
    "suite_params",
]

_LAZY = {
    "MambaRadixAdapter": "radix_adapter",
    "RadixSuiteParams": "radix_adapter",
    "radix_params": "radix_adapter",
    "lifecycle_params": "radix_adapter",
    "SGLangAdapter": "sglang_adapter",
    "sglang_params": "sglang_adapter",
}


def __getattr__(name: str) -> Any:
    # Lazy: the generic suite must import without our cache (another engine's adapter does not need it).
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mamba_radix.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"mamba_radix.testing.{module}"), name)
