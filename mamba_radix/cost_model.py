"""The simulator's model of time: how long a prefill batch and a decode step take (:class:`CostModel`).

A module of its own, with no import beyond the standard library, because two kinds of reader need it:
the simulator (:mod:`mamba_radix.sim.engine` runs its clock on it) and the command line's flag table
(:mod:`mamba_radix.flags` shows its defaults in ``--help``). Keeping it out of the engine lets
``mamba-radix --help`` print without loading torch or the cache. No side effects on import.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COST_PRESETS",
    "COST_PRESET_PROVENANCE",
    "DEFAULT_HOST_LINK",
    "HOST_LINK_PRESETS",
    "HOST_LINK_PROVENANCE",
    "CostModel",
    "HostLink",
]


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


# Hardware figures used below (NVIDIA's H200 SXM datasheet): 141 GB HBM3e at 4.8 TB/s, 989 dense BF16
# TFLOPS per GPU. Achieved bandwidth is taken as ~80% of peak (3.8 TB/s). Every number is rounded to one
# or two significant figures: these are derivations, not measurements; fit your own with
# ``mamba_radix.sim.cost_fit.fit_cost_model`` from a server log.
COST_PRESETS: dict[str, CostModel] = {
    "kimi-k3-8xh200": CostModel(
        prefill_tokens_per_s=40_000.0,
        prefill_batch_overhead_s=0.02,
        decode_step_s=0.02,
        decode_step_per_req_s=0.0003,
    ),
    "qwen3-next-1xh200": CostModel(
        prefill_tokens_per_s=50_000.0,
        prefill_batch_overhead_s=0.01,
        decode_step_s=0.008,
        decode_step_per_req_s=0.0003,
    ),
}

# Where every number of each preset comes from (kept apart from CostModel: a run record lists its
# CostModel fields, and the derivation is not a parameter).
COST_PRESET_PROVENANCE: dict[str, str] = {
    "kimi-k3-8xh200": (
        "derived, not measured; H200 SXM datasheet: 4.8 TB/s (3.8 achieved), 989 dense BF16 TFLOPS. Kimi K3's parameter counts are not in the seeds; assumed Kimi K2's (1T "
        "total, 32B active; Moonshot's model card) with ~600 GB of weights (K2's INT4 release), 75 GB per "
        "TP8 rank. prefill: 2 x 32e9 = 64 GFLOP per token; 8 x 989 TFLOPS at ~30-40% MFU ~ 2.5-3e15 "
        "FLOP/s -> ~40k tokens/s. decode_step_s and prefill overhead: 93 layers of kernels and two TP "
        "all-reduces each (~100 us per layer) ~ 0.01 s, doubled for the sampler and scheduler -> 0.02 s "
        "(batch-1 weight reads, ~2 GB per rank at 3.8 TB/s, add < 1 ms). per request: more routed experts "
        "read as the batch grows (all 75 GB per rank / 3.8 TB/s ~ 20 ms once ~128 requests touch every "
        "expert: ~0.15 ms per request) plus the request's MLA KV read (24 layers x 576 x 2 B = 27,648 B "
        "per token; ~20k tokens ~ 0.55 GB ~ 0.15 ms) -> 0.3 ms"
    ),
    "qwen3-next-1xh200": (
        "derived, not measured; H200 SXM datasheet: 4.8 TB/s (3.8 achieved), 989 dense BF16 TFLOPS. Qwen3-Next-80B-A3B (80B total, 3B active; Qwen's model card) in its FP8 "
        "release (~80 GB of weights: BF16's 160 GB does not fit one 141 GB H200). prefill: 2 x 3e9 = "
        "6 GFLOP per token plus attention; 989 TFLOPS at ~30% MFU (small experts) ~ 3e14 FLOP/s -> "
        "~50k tokens/s. decode_step_s: 48 layers' kernels on one GPU, no TP communication, ~0.005 s plus "
        "batch-1 weight reads (~3 GB at 3.8 TB/s ~ 1 ms) and the sampler -> 0.008 s; prefill overhead "
        "about one such step -> 0.01 s. per request: routed experts (512, 10 per token) read as the "
        "batch grows (80 GB / 3.8 TB/s ~ 21 ms over ~200 requests: ~0.1 ms each), the request's KV (12 "
        "layers x 2 KV heads x 256 x 2 x 2 B = 24,576 B per token; ~20k tokens ~ 0.13 ms) and its GDN "
        "state read and written (36 x 32 x 128 x 128 x 4 B ~ 75 MB, twice ~ 0.04 ms) -> 0.3 ms"
    ),
}


@dataclass(frozen=True)
class HostLink:
    """The host<->device link of the host tier: ``gb_per_s`` per direction (GB = 1e9 bytes, as link
    speeds are quoted). Used by the simulator to time load-backs; a backup (device -> host) is counted in
    bytes but never delays a forward (it overlaps compute)."""

    name: str
    gb_per_s: float

    def transfer_s(self, num_bytes: int) -> float:
        """Seconds to move ``num_bytes`` one way at the link's speed. O(1)."""
        return num_bytes / (self.gb_per_s * 1e9)


# Named links (``--host-link``); ``--host-link-gbps`` overrides the number. Achievable per-direction
# bandwidth of pinned-memory copies, not the raw signalling rate.
HOST_LINK_PRESETS: dict[str, HostLink] = {
    "pcie5-x16": HostLink("pcie5-x16", 52.0),
    "gh200-c2c": HostLink("gh200-c2c", 450.0),
}
DEFAULT_HOST_LINK = "pcie5-x16"

HOST_LINK_PROVENANCE: dict[str, str] = {
    "pcie5-x16": (
        "assumed, not measured: PCIe 5.0 x16 signals 32 GT/s x 16 lanes = 64 GB/s raw per direction (63 GB/s "
        "after 128b/130b encoding); pinned host<->device copies achieve ~50-55 GB/s on H100/H200-class hosts "
        "(protocol overhead), so 52 GB/s per direction"
    ),
    "gh200-c2c": (
        "NVIDIA's GH200 datasheet: NVLink-C2C 900 GB/s total, i.e. 450 GB/s per direction; the peak, taken "
        "as achieved (no measurement in the seeds)"
    ),
}
