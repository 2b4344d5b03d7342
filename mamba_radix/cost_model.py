"""The simulator's model of time: how long a prefill batch and a decode step take (:class:`CostModel`).

A module of its own, with no import beyond the standard library, because two kinds of reader need it:
the simulator (:mod:`mamba_radix.sim.engine` runs its clock on it) and the command line's flag table
(:mod:`mamba_radix.flags` shows its defaults in ``--help``). Keeping it out of the engine lets
``mamba-radix --help`` print without loading torch or the cache. No side effects on import.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CostModel"]


@dataclass(frozen=True)
class CostModel:
    """Simulated time. Defaults are round numbers for one TP8 instance of a large MoE model, not measured;
    what matters for comparisons is that every configuration uses the same ones.

    A prefill batch of ``n`` tokens takes ``prefill_batch_overhead_s + n / prefill_tokens_per_s`` seconds;
    a decode step of ``b`` running requests takes ``decode_step_s + decode_step_per_req_s * b``. Bounds are
    checked by the engine's options (:class:`mamba_radix.sim.engine.EngineOptions`), which say the flag."""

    prefill_tokens_per_s: float = 40_000.0
    prefill_batch_overhead_s: float = 0.005
    decode_step_s: float = 0.025
    decode_step_per_req_s: float = 0.0002

    def prefill_s(self, num_tokens: int) -> float:
        """Seconds for one prefill batch of ``num_tokens`` tokens. O(1)."""
        return self.prefill_batch_overhead_s + num_tokens / self.prefill_tokens_per_s

    def decode_step_time_s(self, batch_size: int) -> float:
        """Seconds for one decode step with ``batch_size`` running requests. O(1)."""
        return self.decode_step_s + self.decode_step_per_req_s * batch_size
