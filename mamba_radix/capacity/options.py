"""``plan --compare-memory-options``: the seeds' question, "which option, which ratio, for this workload".

For one deployment and workload, at equal bytes (the deployment's budget), every memory option with every
checkpoint format:

- ``static``: SGLang's fixed split at the given ``--mamba-full-memory-ratio``;
- ``static best``: the fixed split at the ratio that fits the workload best, i.e. where KV and state fill
  together while every running request keeps its checkpoints (:func:`best_ratio`);
- ``adaptive``: this package's adaptive split (``simulate --adaptive-split``, not SGLang's): the line moves
  between two fully allocated pools; page size 1 only;
- ``unified``: SGLang's ``--enable-unified-memory`` (:mod:`mamba_radix.capacity.unified`): one buffer, refused
  with speculative decoding, PD disaggregation, the host tier and DCP > 1 (the config's and the sizing
  inputs' checks, run here, never restated);

and formats ``model`` (the deployment's SSM dtype), ``bf16 state`` (``--mamba-ssm-dtype bfloat16``, only
for an fp32 deployment), ``int8`` and ``fp8_e4m3`` (:mod:`mamba_radix.capacity.formats`).

Columns: state slots (working, model dtype) and checkpoint slots (a quantized pool; ``shared`` for
``model``) and KV tokens at start-up; ``running``: the requests of this workload admitted at once (SGLang's
``max_running_requests``, also capped by the KV the workload holds; under adaptive and unified the start-up
split still sets ``max_running_requests``, the simulator's rule); ``w/ ckpts``: requests that run at once
while each keeps its checkpoints. Adaptive and unified reach, at the peak, the split the static best ratio
fixes in advance; the planner sees only the mean request, so the difference between them (how each gets
there, on a mix of shapes) is the simulator's to measure.

The recommendation is the allowed row (adaptive excluded: SGLang has no such option) with the most
requests keeping their checkpoints, then the most running, then the lossless format, then the simplest
mechanism; its reason names the gain over the best lossless row and the restore error the format costs.
O(formats x mechanisms x shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mamba_radix.capacity.formats import (
    FormatSizing,
    checkpoint_slot_bytes,
    resolve_checkpoints,
)
from mamba_radix.capacity.planner import Workload, expected_workload_checkpoints
from mamba_radix.capacity.sizing import PoolResolution, SizingInputs, resolve_pools
from mamba_radix.capacity.unified import startup_ratio, unified_plan
from mamba_radix.errors import ConfigError

__all__ = [
    "MECHANISMS",
    "MemoryComparison",
    "MemoryOption",
    "best_ratio",
    "compare_memory_options",
]

MECHANISMS = ("static", "static best", "adaptive", "unified")
# restore error per element of each format (docs/checkpoint-formats.md; mamba_radix.checkpoint_format)
_PRICE = {
    "model": "lossless",
    "bf16 state": "every state in bf16, running ones too (8 mantissa bits)",
    "int8": "restore error <= absmax(row) / 254 per element",
    "fp8_e4m3": "restore error <= 2^-4 relative per element",
}
_FIDELITY_RANK = {"model": 0, "bf16 state": 1, "int8": 2, "fp8_e4m3": 3}


@dataclass(frozen=True)
class MemoryOption:
    """One row of the comparison (module docstring's columns); ``refused``: why the deployment cannot run
    this option (then the counts are 0)."""

    mechanism: str
    fmt: str
    ratio: float
    state_slots: int
    checkpoint_slots: int | None
    kv_tokens: int
    running: int
    with_checkpoints: int
    refused: str | None = None
    flags: str = ""

    @property
    def allowed(self) -> bool:
        return self.refused is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "checkpoint_format": self.fmt,
            "mamba_full_memory_ratio": self.ratio,
            "state_slots": self.state_slots,
            "checkpoint_slots": self.checkpoint_slots,
            "kv_tokens": self.kv_tokens,
            "running": self.running,
            "with_checkpoints": self.with_checkpoints,
            "refused": self.refused,
            "flags": self.flags,
        }


@dataclass(frozen=True)
class MemoryComparison:
    """The table and the recommendation."""

    rows: tuple[MemoryOption, ...]
    best: MemoryOption
    reason: str
    budget_gib: float
    kept_per_request: float
    peak_kv_len: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_gib": self.budget_gib,
            "kept_checkpoints_per_request": self.kept_per_request,
            "peak_kv_len": self.peak_kv_len,
            "rows": [r.to_dict() for r in self.rows],
            "recommendation": {**self.best.to_dict(), "reason": self.reason},
        }


def _variant(inputs: SizingInputs, fmt: str, **changes: Any) -> SizingInputs:
    """``inputs`` with checkpoint format ``fmt`` (``bf16 state``: the model format with a bf16 SSM state),
    the checkpoint slots left to the default rule, and ``changes``; the cache config's own fields follow
    when it has them. Raises ConfigError as :class:`SizingInputs` does."""
    cache_changes = changes.pop("cache", {})
    real = "model" if fmt == "bf16 state" else fmt
    if hasattr(inputs.cache, "checkpoint_format"):
        cache_changes = {**cache_changes, "checkpoint_format": real, "checkpoint_slots": None}
    cache = inputs.cache.replace(**cache_changes) if cache_changes else inputs.cache
    if fmt == "bf16 state":
        changes["mamba_ssm_dtype"] = "bfloat16"
    return replace(inputs, cache=cache, checkpoint_format=real, checkpoint_slots=None, **changes)


def _per_request(
    res: PoolResolution, workload: Workload, ckpt_bytes: int, kept: float
) -> tuple[float, float]:
    """Bytes one running request needs at its peak: (reservations only, with its kept checkpoints)."""
    inputs = res.inputs
    draft = (inputs.verify_tokens or 0) if inputs.reserves_intermediate_states else 0
    base = (
        workload.mean_peak_kv_len * float(res.kv.bytes_per_token)
        + (res.slots_per_request + draft) * res.bytes_per_slot
    )
    return base, base + kept * ckpt_bytes


def best_ratio(res: PoolResolution, workload: Workload, fmt: str = "model") -> float:
    """The ``--mamba-full-memory-ratio`` at which KV and state fill together while each running request keeps
    its checkpoints (in format ``fmt``): state bytes per request / KV bytes per request. O(shapes)."""
    kept = expected_workload_checkpoints(res.inputs.cache, workload).mean_kept
    c = checkpoint_slot_bytes(res.state, fmt, res.bytes_per_slot)
    _, with_ckpt = _per_request(res, workload, c, kept)
    kv = workload.mean_peak_kv_len * float(res.kv.bytes_per_token)
    return (with_ckpt - kv) / kv


def _keep(fs: FormatSizing, kv_tokens: int, workload: Workload, kept: float, running: int) -> int:
    """Requests (at most ``running``) that run at once while each keeps its ``kept`` checkpoints."""
    limit = running
    if fs.checkpoint_slots is None:
        limit = min(limit, int(fs.working_slots // (fs.slots_per_request + kept)))
    elif kept > 0:
        limit = min(limit, int(fs.checkpoint_slots // kept))
    return max(0, min(limit, int(kv_tokens // workload.mean_peak_kv_len)))


def _flags(inputs: SizingInputs, fs: FormatSizing, ratio: float, mechanism: str) -> str:
    parts = [f"--mamba-full-memory-ratio {ratio:.3f}"]
    if mechanism == "unified":
        parts.append("--enable-unified-memory")
    if mechanism == "adaptive":
        parts.append("--adaptive-split (simulate only)")
    if inputs.mamba_ssm_dtype == "bfloat16" and fs.fmt == "model":
        parts.append("--mamba-ssm-dtype bfloat16")
    if fs.fmt != "model":
        parts.append(f"--checkpoint-format {fs.fmt} --checkpoint-slots {fs.checkpoint_slots}")
    return " ".join(parts)


def _row(inputs: SizingInputs, workload: Workload, mechanism: str, fmt: str) -> MemoryOption:
    """One row; a refusal becomes ``refused`` with the check's own one-line message."""
    ratio = inputs.mamba_full_memory_ratio
    try:
        changes: dict[str, Any] = {}
        if mechanism == "unified":
            changes["cache"] = {"enable_unified_memory": True}
        if mechanism == "adaptive" and inputs.cache.page_size != 1:
            # the simulator's rule (mamba_radix.sim.capacity_limit.limited_kv_allocator)
            raise ConfigError(
                f"the adaptive split moves single KV tokens; use page_size 1, not {inputs.cache.page_size}"
            )
        v = _variant(inputs, fmt, **changes)
        cache = v.cache
        kept = expected_workload_checkpoints(cache, workload).mean_kept
        quantized = v.checkpoint_format != "model"
        # a quantized pool is sized once, at start-up, whatever the line does: size it for the workload
        for_workload = mechanism == "static best" or quantized
        if for_workload and mechanism != "static":
            start = resolve_pools(v)
            ratio = best_ratio(start, workload, v.checkpoint_format or "model")
            v = replace(v, mamba_full_memory_ratio=ratio, max_mamba_cache_size=None)
        elif mechanism in ("adaptive", "unified"):
            # the start-up split still sets max_running_requests: start where it admits what the buffer holds
            ratio = max(ratio, startup_ratio(resolve_pools(v), workload))
            v = replace(v, mamba_full_memory_ratio=ratio, max_mamba_cache_size=None)
        res = resolve_pools(v)
        peak = workload.mean_peak_kv_len
        if for_workload and quantized and mechanism != "static":
            c = checkpoint_slot_bytes(res.state, v.checkpoint_format or "model", res.bytes_per_slot)
            _, need = _per_request(res, workload, c, kept)
            n = int(v.budget.rest_bytes // need) if v.budget else res.num_slots // res.slots_per_request
            working = min(
                n * res.slots_per_request, res.num_slots // res.slots_per_request * res.slots_per_request
            )
            fs = resolve_checkpoints(res, working_slots=max(working, res.slots_per_request))
        else:
            fs = resolve_checkpoints(res)
        tokens = res.num_tokens or 0
        kv_limit = int(tokens // peak)
        if mechanism in ("static", "static best"):
            running = min(fs.max_running_requests, kv_limit)
            keep = _keep(fs, tokens, workload, kept, running)
        else:  # the line moves with load; the start-up split still sets max_running_requests
            if mechanism == "unified":
                up = unified_plan(res, workload)
                most, most_ckpt = up.max_concurrency, up.max_concurrency_with_checkpoints
            else:
                c = fs.checkpoint_slot_bytes
                base, need = _per_request(res, workload, c, 0.0 if fs.separate_pool else kept)
                rest = res.rest_bytes or 0
                most, most_ckpt = int(rest // base), int(rest // need)
                if fs.separate_pool:
                    rest -= fs.checkpoint_pool_bytes
                    most = most_ckpt = int(rest // base)
                    if kept > 0:
                        most_ckpt = min(most_ckpt, int((fs.checkpoint_slots or 0) // kept))
            running = min(fs.max_running_requests, most)
            keep = min(running, most_ckpt)
        return MemoryOption(
            mechanism=mechanism,
            fmt=fmt,
            ratio=ratio,
            state_slots=fs.working_slots,
            checkpoint_slots=fs.checkpoint_slots,
            kv_tokens=tokens,
            running=running,
            with_checkpoints=keep,
            flags=_flags(v, fs, ratio, mechanism),
        )
    except ConfigError as err:
        return MemoryOption(mechanism, fmt, ratio, 0, None, 0, 0, 0, refused=str(err).splitlines()[0])


def _formats(inputs: SizingInputs) -> tuple[str, ...]:
    res_dtype = inputs.mamba_ssm_dtype or inputs.model.default_ssm_dtype
    extra = ("bf16 state",) if res_dtype == "float32" else ()
    return ("model", *extra, "int8", "fp8_e4m3")


def compare_memory_options(inputs: SizingInputs, workload: Workload) -> MemoryComparison:
    """The comparison table and its recommendation for ``inputs``' deployment and ``workload`` (module
    docstring). Needs a memory budget (equal bytes). Raises :class:`ConfigError` without one, or when no
    row is allowed. O(rows x shapes)."""
    if not isinstance(inputs, SizingInputs):
        raise ConfigError(f"inputs must be SizingInputs, got {type(inputs).__name__}")
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload must be a Workload, got {type(workload).__name__}")
    if inputs.budget is None:
        raise ConfigError(
            "comparing memory options at equal bytes needs a memory budget: give --memory-budget-gb (or "
            "--gpu-memory-gb with --weights-gb)"
        )
    rows = tuple(_row(inputs, workload, m, f) for m in MECHANISMS for f in _formats(inputs))
    candidates = [r for r in rows if r.allowed and r.mechanism != "adaptive"]
    if not candidates:
        raise ConfigError(f"no memory option fits this deployment: {rows[0].refused}")

    def key(r: MemoryOption) -> tuple[int, int, int, int]:
        return (-r.with_checkpoints, -r.running, _FIDELITY_RANK[r.fmt], MECHANISMS.index(r.mechanism))

    best = min(candidates, key=key)
    lossless = min((r for r in candidates if r.fmt == "model"), key=key, default=None)
    kept = expected_workload_checkpoints(inputs.cache, workload).mean_kept
    return MemoryComparison(
        rows=rows,
        best=best,
        reason=_reason(best, lossless, rows),
        budget_gib=inputs.budget.rest_gib,
        kept_per_request=kept,
        peak_kv_len=workload.mean_peak_kv_len,
    )


def _reason(best: MemoryOption, lossless: MemoryOption | None, rows: tuple[MemoryOption, ...]) -> str:
    what = (
        f"{best.mechanism} with {best.fmt} checkpoints"
        if best.fmt != "bf16 state"
        else f"{best.mechanism} with a bf16 state"
    )
    head = (
        f"{what} at ratio {best.ratio:.3f}: {best.with_checkpoints} requests run at once keeping their "
        f"checkpoints, {best.running} admitted"
    )
    if lossless is not None and best is not lossless:
        gain = best.with_checkpoints - lossless.with_checkpoints
        pct = f" ({gain / lossless.with_checkpoints:+.0%})" if lossless.with_checkpoints else ""
        head += (
            f", vs {lossless.with_checkpoints}{pct} for the best lossless option ({lossless.mechanism}); "
            f"price: {_PRICE[best.fmt]}"
        )
    elif best.fmt == "model":
        head += "; a quantized format adds nothing here that is worth its restore error"
    unified = [r for r in rows if r.mechanism == "unified" and r.fmt == "model"]
    if unified and unified[0].refused:
        head += f"; unified memory is refused: {unified[0].refused}"
    return head
