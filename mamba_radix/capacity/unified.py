"""``plan --enable-unified-memory``: the start-up budget, what a workload needs at its peak, and whether one
buffer covers it.

Under SGLang's ``--enable-unified-memory`` (:mod:`mamba_radix.pools.unified`) the KV and the state slots share
one byte buffer: states grow up from the low addresses, KV down from the high ones, so
``--mamba-full-memory-ratio`` only fixes the *start-up* split (:func:`~mamba_radix.capacity.sizing.
resolve_pools`'s slots and tokens) and the boundary then moves with load. Two things stay fixed:

- the buffer: the whole budget (``rest``), less one padding sink of ``max(slot, page)`` bytes that state slot
  0 and KV page 0 share;
- ``max_running_requests``: derived from the start-up split as without unified memory (the simulator's rule,
  :func:`mamba_radix.sim.budget.unified_pools_for_budget`), so a start-up ratio too small for the target
  concurrency still caps it.

At the peak, ``concurrency`` running requests hold the KV of their whole sequence but the last token and the
slots they reserve (plus, to keep their prefixes cached, their kept checkpoints: in the same buffer for
``checkpoint_format="model"``, in the quantized checkpoint pool otherwise, which is sized at start-up and
taken out of the buffer first). The deployments unified memory refuses are
:class:`~mamba_radix.sizing.SizingInputs`' and :class:`~mamba_radix.config.CacheConfig`'s checks (one rule
each). Pure arithmetic, O(shapes of the workload).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mamba_radix.capacity.formats import FormatSizing, resolve_checkpoints
from mamba_radix.capacity.planner import Workload, expected_workload_checkpoints
from mamba_radix.capacity.sizing import PoolResolution
from mamba_radix.errors import ConfigError

__all__ = ["UnifiedPlan", "startup_ratio", "unified_plan"]


@dataclass(frozen=True)
class UnifiedPlan:
    """One unified buffer against a workload's peak (module docstring). Bytes are per GPU."""

    buffer_bytes: int  # the whole budget
    sink_bytes: int  # the padding slot / page both sides alias
    checkpoint_pool_bytes: int  # a quantized checkpoint pool, sized at start-up (0 for "model")
    startup_slots: int
    startup_kv_tokens: int
    max_running_requests: int  # from the start-up split, as SGLang
    concurrency: int  # the target the peak is taken at
    peak_kv_tokens: int
    peak_state_slots: int  # reserved by the running requests (and their draft states)
    peak_checkpoints: int  # the running requests' kept checkpoints
    slot_bytes: int
    kv_bytes_per_token: float
    checkpoint_bytes: int
    max_concurrency: int  # running requests the buffer holds (reservations only)
    max_concurrency_with_checkpoints: int  # ... each keeping its checkpoints
    formats: FormatSizing
    startup_ratio: float  # the smallest start-up ratio whose max_running_requests admits what KV allows

    @property
    def usable_bytes(self) -> int:
        """What the two sides share: the buffer less the sink and the checkpoint pool."""
        return self.buffer_bytes - self.sink_bytes - self.checkpoint_pool_bytes

    @property
    def peak_bytes(self) -> int:
        """Bytes the running requests' reservations take at the peak."""
        return (
            math.ceil(self.peak_kv_tokens * self.kv_bytes_per_token) + self.peak_state_slots * self.slot_bytes
        )

    @property
    def peak_bytes_with_checkpoints(self) -> int:
        in_buffer = self.checkpoint_pool_bytes == 0
        return self.peak_bytes + (self.peak_checkpoints * self.checkpoint_bytes if in_buffer else 0)

    @property
    def covers(self) -> bool:
        """Whether the buffer holds the peak's reservations."""
        return self.peak_bytes <= self.usable_bytes

    @property
    def covers_with_checkpoints(self) -> bool:
        fits_pool = self.checkpoint_pool_bytes == 0 or self.peak_checkpoints <= (
            self.formats.checkpoint_slots or 0
        )
        return self.peak_bytes_with_checkpoints <= self.usable_bytes and fits_pool

    @property
    def capped_by_startup(self) -> bool:
        """The start-up split's max_running_requests admits fewer than the target."""
        return self.max_running_requests < self.concurrency

    def to_dict(self) -> dict[str, Any]:
        return {
            "buffer_bytes": self.buffer_bytes,
            "sink_bytes": self.sink_bytes,
            "checkpoint_pool_bytes": self.checkpoint_pool_bytes,
            "startup_slots": self.startup_slots,
            "startup_kv_tokens": self.startup_kv_tokens,
            "max_running_requests": self.max_running_requests,
            "concurrency": self.concurrency,
            "peak_kv_tokens": self.peak_kv_tokens,
            "peak_state_slots": self.peak_state_slots,
            "peak_checkpoints": self.peak_checkpoints,
            "peak_bytes": self.peak_bytes,
            "peak_bytes_with_checkpoints": self.peak_bytes_with_checkpoints,
            "covers": self.covers,
            "covers_with_checkpoints": self.covers_with_checkpoints,
            "max_concurrency": self.max_concurrency,
            "max_concurrency_with_checkpoints": self.max_concurrency_with_checkpoints,
            "capped_by_startup": self.capped_by_startup,
            "startup_ratio": self.startup_ratio,
        }


def startup_ratio(res: PoolResolution, workload: Workload) -> float:
    """The smallest ``--mamba-full-memory-ratio`` whose start-up split admits as many running requests as the
    KV of the workload allows at that split, for a pool whose line moves with load (adaptive, unified) and
    checkpoints in the state pool: the slots every running request reserves against its KV. O(1)."""
    inputs = res.inputs
    draft = (inputs.verify_tokens or 0) if inputs.reserves_intermediate_states else 0
    state = (res.slots_per_request + draft) * res.bytes_per_slot
    return state / (workload.mean_peak_kv_len * float(res.kv.bytes_per_token))


def unified_plan(
    resolution: PoolResolution, workload: Workload, concurrency: int | None = None
) -> UnifiedPlan:
    """The unified buffer of ``resolution``'s deployment against ``workload`` at ``concurrency`` running
    requests (default: ``--max-running-requests`` if given, else the most the buffer holds). Raises
    :class:`ConfigError` without a memory budget (the buffer is the budget) or when unified memory is not
    enabled in the inputs' cache config. O(shapes)."""
    if not isinstance(resolution, PoolResolution):
        raise ConfigError(f"resolution must be a PoolResolution, got {type(resolution).__name__}")
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload must be a Workload, got {type(workload).__name__}")
    inputs = resolution.inputs
    if not inputs.cache.enable_unified_memory:
        raise ConfigError("unified_plan needs enable_unified_memory=True in the cache config")
    if inputs.budget is None or resolution.num_tokens is None:
        raise ConfigError(
            "unified memory shares one byte budget: give budget (--memory-budget-gb, or --gpu-memory-gb with "
            "--weights-gb)"
        )
    cache = inputs.cache
    fmt = resolve_checkpoints(resolution)
    slot = resolution.bytes_per_slot
    page = resolution.kv.row_bytes * cache.page_size
    sink = max(slot, page)
    ckpt_pool = fmt.checkpoint_pool_bytes
    total = inputs.budget.rest_bytes
    usable = total - sink - ckpt_pool
    spr = cache.slots_per_request
    draft = (inputs.verify_tokens or 0) if inputs.reserves_intermediate_states else 0
    kv_per_token = float(resolution.kv.bytes_per_token)
    kept = expected_workload_checkpoints(cache, workload).mean_kept
    per_request = workload.mean_peak_kv_len * kv_per_token + (spr + draft) * slot
    per_request_ckpt = per_request + (kept * fmt.checkpoint_slot_bytes if not fmt.separate_pool else 0)
    most = max(0, int(usable // per_request))
    most_ckpt = max(0, int(usable // per_request_ckpt))
    if fmt.separate_pool and kept > 0:  # the quantized pool caps the requests that keep theirs
        most_ckpt = min(most_ckpt, int((fmt.checkpoint_slots or 0) // kept))
    if concurrency is None:
        concurrency = inputs.max_running_requests if inputs.max_running_requests is not None else max(most, 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be a positive integer, got {concurrency!r}")
    return UnifiedPlan(
        buffer_bytes=total,
        sink_bytes=sink,
        checkpoint_pool_bytes=ckpt_pool,
        startup_slots=resolution.num_slots,
        startup_kv_tokens=resolution.num_tokens,
        max_running_requests=fmt.max_running_requests,
        concurrency=concurrency,
        peak_kv_tokens=math.ceil(concurrency * workload.mean_peak_kv_len),
        peak_state_slots=concurrency * (spr + draft),
        peak_checkpoints=math.ceil(concurrency * kept),
        slot_bytes=slot,
        kv_bytes_per_token=kv_per_token,
        checkpoint_bytes=fmt.checkpoint_slot_bytes,
        max_concurrency=most,
        max_concurrency_with_checkpoints=most_ckpt,
        formats=fmt,
        startup_ratio=startup_ratio(resolution, workload),
    )
