"""SGLang's official Mamba ratio calculator, restated, and the steps from its answer to the planner's.

The official rule (SGLang's ``compute-mamba-ratio`` skill and the Kimi-K3 cookbook's "Mamba ratio
calculator") balances the two pools per running request: a request holds ``S`` state slots (plus ``D``
speculative intermediate states) and ``L`` KV tokens, so the state : KV split that fills both together is

    r* = (S + D) * token_equiv * dcp_size / L,    token_equiv = state_bytes_per_slot / kv_bytes_per_token

with ``kv_bytes_per_token`` the per-GPU cost of a token before DCP shards it (DCP then makes KV
``dcp_size`` times cheaper, hence the factor). ``S`` is SGLang's ``_calculate_mamba_ratio`` (the skill's
table mirrors it): extra_buffer 5 (4 without overlap), extra_buffer_lazy 4, no_buffer 3, the radix cache
off 1, one less under ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1`` except under no_buffer. We take it from
:attr:`CacheConfig.slots_per_request`, the one home of that table. ``D`` is the draft-token count under
plain speculative decoding and 0 with ReplaySSM (its rings replace the intermediate states).

Seed 000 lists what the formula leaves out; :func:`compare` walks from ``r*`` to the planner's ratio one
named step at a time, each step evaluated in the same budget by SGLang's own sizing
(:func:`~mamba_radix.capacity.sizing.resolve_pools`), so the steps' differences add up to the total:

1. the checkpoints chunked prefill stores (and the newest decode one) that a request keeps in the tree;
2. ``--mamba-max-states-per-path``, which caps those;
3. the slots reserved per running request and the target concurrency, which set ``--max-mamba-cache-size``.

Two differences that are not in the seed get their own lines when they change the ratio: the peak KV of a
request (``input + output - 1``: the last sampled token never gets KV) and the intermediate states, which
the planner's balance leaves out. Everything here is O(1) arithmetic plus one pool resolution per step.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from mamba_radix.capacity.memory import GIB
from mamba_radix.capacity.sizing import MAX_MEMORY_RATIO, MemoryBudget, PoolResolution, resolve_pools
from mamba_radix.errors import ConfigError

__all__ = [
    "Comparison",
    "OfficialAnswer",
    "SplitOutcome",
    "Step",
    "compare",
    "official_answer",
    "official_ratio",
]

SKIP_LOCK_ENV = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1"


def _positive(name: str, value: object) -> float:
    """``value`` as a finite float > 0, or :class:`ConfigError` naming ``name``. O(1)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not value > 0:  # type: ignore[arg-type]
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def official_ratio(
    *,
    state_bytes_per_slot: float,
    kv_bytes_per_token: float,
    slots_per_request: int,
    draft_tokens: int,
    dcp_size: int,
    context_len: float,
) -> float:
    """The official ``r* = (S + D) * token_equiv * dcp_size / L`` (module docstring). Pure, O(1).

    ``kv_bytes_per_token`` is per GPU before DCP shards it; ``context_len`` is the mean input + output
    tokens of a request. Raises :class:`ConfigError` for a non-positive size or a negative count.
    """
    state = _positive("state_bytes_per_slot", state_bytes_per_slot)
    kv = _positive("kv_bytes_per_token", kv_bytes_per_token)
    length = _positive("context_len", context_len)
    for name, value, low in (("slots_per_request", slots_per_request, 1), ("draft_tokens", draft_tokens, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(dcp_size, bool) or not isinstance(dcp_size, int) or dcp_size < 1:
        raise ConfigError(f"dcp_size must be an integer >= 1, got {dcp_size!r}")
    token_equiv = state / kv
    return (slots_per_request + draft_tokens) * token_equiv * dcp_size / length


@dataclass(frozen=True)
class SplitOutcome:
    """What one ``--mamba-full-memory-ratio`` gives in a budget, by SGLang's sizing.

    ``running_with_checkpoints`` is how many requests run at once while every one keeps its checkpoints
    in the tree: SGLang's ``max_running_requests``, the slots over ``S + kept`` and the KV tokens over a
    request's peak, whichever is least. ``error`` is SGLang's refusal to start (then the counts are 0).
    """

    ratio: float
    slots: int
    kv_tokens: int
    max_running_requests: int
    running_with_checkpoints: int
    error: str | None = None


@dataclass(frozen=True)
class OfficialAnswer:
    """The official calculator's inputs, its ``r*`` and (with a budget) what ``r*`` gives there."""

    ratio: float
    state_bytes_per_slot: int  # SGLang's mamba_cache_per_req on one GPU (rings included when on)
    kv_bytes_per_token: int  # on one GPU before DCP shards it
    slots_per_request: int  # S, with the skip-decode-lock drop when the switch is on
    slots_per_request_without_skip_lock: int  # S of the strategy's row with the switch off
    draft_tokens: int  # D
    dcp_size: int
    context_len: float  # L, mean input + output tokens
    budget_gib: float | None  # the budget it is evaluated in (None: no budget known)
    outcome: SplitOutcome | None

    @property
    def token_equiv(self) -> float:
        return self.state_bytes_per_slot / self.kv_bytes_per_token

    @property
    def skip_lock_drop(self) -> int:
        """Slots per request the skip-decode-lock switch saves here (0 when off or when it saves none)."""
        return self.slots_per_request_without_skip_lock - self.slots_per_request


def _outcome_dict(o: SplitOutcome | None) -> dict[str, Any] | None:
    return None if o is None else asdict(o)


def _budget(resolution: PoolResolution) -> MemoryBudget | None:
    """The budget of the comparison: the user's, else the bytes the resolved pools occupy. O(1)."""
    if resolution.inputs.budget is not None:
        return resolution.inputs.budget
    rest = resolution.rest_bytes
    return None if rest is None else MemoryBudget(rest / GIB)


def evaluate_ratio(
    resolution: PoolResolution, ratio: float, demand_slots: float, peak_kv_len: float
) -> SplitOutcome | None:
    """Resolve the pools at ``ratio`` in the comparison's budget (None without one); ``demand_slots``
    (``S + kept``) and ``peak_kv_len`` give ``running_with_checkpoints``. One :func:`resolve_pools` call.

    The ratio replaces ``--max-mamba-cache-size``; ``--max-total-tokens`` stays only when the budget was
    given (without one, the budget is the pools' bytes and the cap defined it)."""
    budget = _budget(resolution)
    if budget is None:
        return None
    inputs = resolution.inputs
    try:
        sized = resolve_pools(
            replace(
                inputs,
                budget=budget,
                mamba_full_memory_ratio=min(ratio, MAX_MEMORY_RATIO),
                max_mamba_cache_size=None,
                max_total_tokens=inputs.max_total_tokens if inputs.budget is not None else None,
            )
        )
    except ConfigError as exc:  # the ratio leaves a pool empty: SGLang would not start
        return SplitOutcome(ratio, 0, 0, 0, 0, error=str(exc).splitlines()[0])
    assert sized.num_tokens is not None  # a budget always sizes the KV pool
    running = min(
        sized.max_running_requests,
        int(sized.num_slots / demand_slots),
        int(sized.num_tokens / peak_kv_len),
    )
    return SplitOutcome(
        ratio=ratio,
        slots=sized.num_slots,
        kv_tokens=sized.num_tokens,
        max_running_requests=sized.max_running_requests,
        running_with_checkpoints=running,
    )


def official_answer(
    resolution: PoolResolution,
    context_len: float,
    kept_per_request: float = 0.0,
    peak_kv_len: float | None = None,
) -> OfficialAnswer:
    """The official calculator for the deployment ``resolution`` was sized for and a mean request of
    ``context_len`` tokens (input + output), with what its ratio gives in the same budget.

    ``kept_per_request`` and ``peak_kv_len`` (default ``context_len``) only feed
    :attr:`SplitOutcome.running_with_checkpoints`. One :func:`resolve_pools` call; raises
    :class:`ConfigError` for a bad ``context_len``.
    """
    if not isinstance(resolution, PoolResolution):
        raise ConfigError(f"resolution must be a PoolResolution, got {type(resolution).__name__}")
    length = _positive("context_len", context_len)
    inputs = resolution.inputs
    cache = inputs.cache
    draft = (inputs.verify_tokens or 0) if inputs.reserves_intermediate_states else 0
    kv_bytes = resolution.kv.row_bytes
    ratio = official_ratio(
        state_bytes_per_slot=resolution.bytes_per_slot,
        kv_bytes_per_token=kv_bytes,
        slots_per_request=cache.slots_per_request,
        draft_tokens=draft,
        dcp_size=resolution.kv.dcp_size,
        context_len=length,
    )
    budget = _budget(resolution)
    demand = cache.slots_per_request + kept_per_request
    return OfficialAnswer(
        ratio=ratio,
        state_bytes_per_slot=resolution.bytes_per_slot,
        kv_bytes_per_token=kv_bytes,
        slots_per_request=cache.slots_per_request,
        slots_per_request_without_skip_lock=cache.replace(skip_decode_lock=False).slots_per_request,
        draft_tokens=draft,
        dcp_size=resolution.kv.dcp_size,
        context_len=length,
        budget_gib=None if budget is None else budget.rest_gib,
        outcome=evaluate_ratio(resolution, ratio, demand, peak_kv_len or length),
    )


@dataclass(frozen=True)
class Step:
    """One named line of the difference: the ratio after it, and (with a budget) what that ratio gives.

    ``seed`` is the seed 000 defect it corrects (1-3), or None for a difference the seed does not list.
    """

    name: str
    detail: str
    seed: int | None
    ratio: float
    kept_per_request: float
    outcome: SplitOutcome | None


@dataclass(frozen=True)
class Comparison:
    """The official answer, the steps from it to the planner's ratio, and that ratio's slot pin."""

    official: OfficialAnswer
    kept_per_request: float  # the workload's real kept checkpoints (capped), used to judge every step
    steps: tuple[Step, ...]
    concurrency: int
    max_mamba_cache_size: int  # the planner's pin at `concurrency`

    @property
    def corrected(self) -> Step:
        return self.steps[-1]

    def deltas(self) -> list[tuple[Step, Step]]:
        """Each step with the one before it (the official answer as step 0). O(steps)."""
        first = Step("official calculator", "", None, self.official.ratio, 0.0, self.official.outcome)
        chain = [first, *self.steps]
        return list(itertools.pairwise(chain))

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON: the official answer, then each step with its totals and its difference
        from the step before (the differences add up to corrected minus official)."""
        o = self.official
        steps = []
        for before, after in self.deltas():
            delta: dict[str, float | int | None] = {"ratio": after.ratio - before.ratio}
            delta["kept_per_request"] = after.kept_per_request - before.kept_per_request
            for name in ("slots", "kv_tokens", "max_running_requests", "running_with_checkpoints"):
                known = before.outcome is not None and after.outcome is not None
                delta[name] = getattr(after.outcome, name) - getattr(before.outcome, name) if known else None
            steps.append(
                {
                    "name": after.name,
                    "seed_defect": after.seed,
                    "detail": after.detail,
                    "mamba_full_memory_ratio": after.ratio,
                    "kept_per_request": after.kept_per_request,
                    "outcome": _outcome_dict(after.outcome),
                    "delta": delta,
                }
            )
        return {
            "official": {
                "mamba_full_memory_ratio": o.ratio,
                "state_bytes_per_slot_per_gpu": o.state_bytes_per_slot,
                "kv_bytes_per_token_per_gpu_before_dcp": o.kv_bytes_per_token,
                "token_equiv": o.token_equiv,
                "slots_per_request": o.slots_per_request,
                "slots_per_request_without_skip_decode_lock": o.slots_per_request_without_skip_lock,
                "draft_tokens": o.draft_tokens,
                "dcp_size": o.dcp_size,
                "context_len": o.context_len,
                "budget_gib": o.budget_gib,
                "outcome": _outcome_dict(o.outcome),
            },
            "steps": steps,
            "corrected": {
                "mamba_full_memory_ratio": self.corrected.ratio,
                "max_mamba_cache_size": self.max_mamba_cache_size,
                "concurrency": self.concurrency,
                "outcome": _outcome_dict(self.corrected.outcome),
            },
        }


def compare(
    resolution: PoolResolution,
    *,
    context_len: float,
    peak_kv_len: float,
    kept_uncapped: float,
    kept: float,
    max_states_per_path: int,
    concurrency: int,
    corrected_ratio: float,
    corrected_slots: int,
) -> Comparison:
    """Walk from the official ``r*`` to ``corrected_ratio`` (the planner's keep-checkpoints ratio at
    ``concurrency`` running requests, pinning ``corrected_slots``) one named step at a time.

    ``kept_uncapped`` / ``kept`` are a request's mean kept checkpoints without and with the per-path cap.
    Every step is judged by the workload's real demand (``S + kept`` slots, ``peak_kv_len`` tokens), so
    its ``running_with_checkpoints`` says what the step buys. Side effects: none. Cost: one
    :func:`resolve_pools` call per step (at most five).
    """
    official = official_answer(resolution, context_len, kept, peak_kv_len)
    s, d = official.slots_per_request, official.draft_tokens
    per_token = resolution.kv.row_bytes / resolution.kv.dcp_size
    slot = resolution.bytes_per_slot
    demand = s + kept

    def ratio_of(slots_per_request: float, length: float) -> float:
        return slots_per_request * slot / (length * per_token)

    def step(name: str, detail: str, seed: int | None, ratio: float, kept_now: float) -> Step:
        return Step(
            name, detail, seed, ratio, kept_now, evaluate_ratio(resolution, ratio, demand, peak_kv_len)
        )

    steps = [
        step(
            "chunked-prefill checkpoints",
            f"a request keeps {kept_uncapped:.2f} checkpoints in the tree (its prefill chunks' and the newest "
            "decode one); the official formula counts none",
            1,
            ratio_of(s + d + kept_uncapped, context_len),
            kept_uncapped,
        )
    ]
    cap = "unlimited (-1)" if max_states_per_path < 0 else str(max_states_per_path)
    steps.append(
        step(
            "--mamba-max-states-per-path",
            f"cap {cap}: {kept_uncapped:.2f} -> {kept:.2f} kept checkpoints per request",
            2,
            ratio_of(s + d + kept, context_len),
            kept,
        )
    )
    if peak_kv_len != context_len:
        steps.append(
            step(
                "peak KV per request",
                f"{peak_kv_len:,.1f} KV tokens at the peak, not L = {context_len:,.1f} (the last sampled token "
                "never gets KV); not in the seed",
                None,
                ratio_of(s + d + kept, peak_kv_len),
                kept,
            )
        )
    final = evaluate_ratio(resolution, corrected_ratio, demand, peak_kv_len)
    reserved = f"S = {s} slots reserved per running request"
    if official.skip_lock_drop:
        # the switch is on: say what it buys at this split (SGLang admits slots // S)
        without = official.slots_per_request_without_skip_lock
        reserved += f" ({without} - {official.skip_lock_drop} under {SKIP_LOCK_ENV}"
        if final is not None and final.error is None:
            reserved += f": admits {final.slots // s} rather than {final.slots // without} at this split"
        reserved += ")"
    detail = (
        f"{reserved}; whole slots for {concurrency} running requests: --max-mamba-cache-size "
        f"{concurrency} x ({s} + {kept:.2f}) = {corrected_slots}"
    )
    steps.append(Step("reserved slots at the target concurrency", detail, 3, corrected_ratio, kept, final))
    return Comparison(official, kept, tuple(steps), concurrency, corrected_slots)
