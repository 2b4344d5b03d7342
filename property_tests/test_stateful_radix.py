"""The invariant suite against our cache: one state machine per buffer strategy.

Each strategy gets its own test (and so its own example budget under every profile); page sizes, eviction
orders, refresh modes, per-path caps and pool sizes are drawn per example by
:func:`mamba_radix.testing.radix_params`. Profiles: ``MAMBA_RADIX_HYPOTHESIS_PROFILE=ci|dev|thorough``.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from mamba_radix.testing import MambaRadixAdapter, SuiteParams, make_machine, radix_params
from mamba_radix.testing.radix_adapter import RadixSuiteParams
from mamba_radix.testing.scenarios import SCENARIOS, Scenario, run_scenario
from mamba_radix.testing.unified_adapter import UnifiedRadixAdapter, unified_params

NoBufferMachine = make_machine(MambaRadixAdapter, radix_params(strategies=("no_buffer",)), "NoBufferMachine")
ExtraBufferMachine = make_machine(
    MambaRadixAdapter, radix_params(strategies=("extra_buffer",)), "ExtraBufferMachine"
)
LazyMachine = make_machine(MambaRadixAdapter, radix_params(strategies=("extra_buffer_lazy",)), "LazyMachine")

TestNoBuffer = NoBufferMachine.TestCase
TestExtraBuffer = ExtraBufferMachine.TestCase
TestExtraBufferLazy = LazyMachine.TestCase

# Quantized checkpoints (issue 26): the tree's checkpoints in their own int8 / fp8 e4m3 pool, stamped with
# value stamps that the round trip keeps bit for bit (mamba_radix/testing/value_stamps.py). One machine over
# the three strategies and both formats (drawn with the checkpoint pool's size), on a quarter of the
# profile's examples: the quantized paths differ from the model path only at hand-over, hit and eviction.
QuantizedMachine = make_machine(
    MambaRadixAdapter, radix_params(checkpoint_formats=("int8", "fp8_e4m3")), "QuantizedCheckpointMachine"
)
TestQuantizedCheckpoints = QuantizedMachine.TestCase
TestQuantizedCheckpoints.settings = settings(
    settings.default, max_examples=max(4, settings.default.max_examples // 4)
)


# the scenarios whose script admits no request over a cached checkpoint (measured: no restore)
SCENARIOS_WITHOUT_HITS = frozenset({"sglang-39342", "lmcache-2863"})


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_the_public_bug_scenarios_with_quantized_checkpoints(fmt: str, scenario: Scenario) -> None:
    """The scripted scenarios of mamba_radix/testing/scenarios.py (identical prompts, branches, chunk
    boundaries: hits by construction, which the random machine above reaches rarely) with every checkpoint
    quantized at hand-over and every hit restored by dequantization, under all the suite's checks."""

    built: list[MambaRadixAdapter] = []

    def quantized(params: SuiteParams) -> MambaRadixAdapter:
        fields = {k: getattr(params, k) for k in SuiteParams.__dataclass_fields__}
        built.append(MambaRadixAdapter(RadixSuiteParams(**fields, checkpoint_format=fmt)))
        return built[-1]

    run_scenario(scenario, quantized)
    (adapter,) = built
    pool = adapter.checkpoint_pool
    assert pool is not None and pool.stores > 0
    # every hit restored through the format (a hit is the one state copy a quantized cache makes)
    assert pool.loads == adapter.cache.stats.state_copies
    if scenario.name not in SCENARIOS_WITHOUT_HITS:
        assert pool.loads > 0, f"{scenario.name}: no hit was restored from a quantized checkpoint"


# Unified memory (issue 26): the simulator's unified-memory cache (one byte budget for KV and states, the
# give-way rule drawn) under the whole suite plus the byte budget's invariant after every step. The core
# cache builds no byte pool of its own (mamba_radix/testing/unified_adapter.py says what it would need).
UnifiedMachine = make_machine(
    UnifiedRadixAdapter, unified_params(strategies=("no_buffer", "extra_buffer")), "UnifiedMemoryMachine"
)
TestUnifiedMemory = UnifiedMachine.TestCase
TestUnifiedMemory.settings = settings(
    settings.default, max_examples=max(4, settings.default.max_examples // 4)
)
