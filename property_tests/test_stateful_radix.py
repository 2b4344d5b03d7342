"""The invariant suite against our cache: one state machine per buffer strategy.

Each strategy gets its own test (and so its own example budget under every profile); page sizes, eviction
orders, refresh modes, per-path caps and pool sizes are drawn per example by
:func:`mamba_radix.testing.radix_params`. Profiles: ``MAMBA_RADIX_HYPOTHESIS_PROFILE=ci|dev|thorough``.
"""

from __future__ import annotations

from mamba_radix.testing import MambaRadixAdapter, make_machine, radix_params

NoBufferMachine = make_machine(MambaRadixAdapter, radix_params(strategies=("no_buffer",)), "NoBufferMachine")
ExtraBufferMachine = make_machine(
    MambaRadixAdapter, radix_params(strategies=("extra_buffer",)), "ExtraBufferMachine"
)
LazyMachine = make_machine(MambaRadixAdapter, radix_params(strategies=("extra_buffer_lazy",)), "LazyMachine")

TestNoBuffer = NoBufferMachine.TestCase
TestExtraBuffer = ExtraBufferMachine.TestCase
TestExtraBufferLazy = LazyMachine.TestCase
