"""Runs: one configuration (:func:`run_one`), many in parallel processes (:func:`run_sweep`), and the
expansion of an experiment definition into runs (:func:`expand_definition`).

A :class:`RunSpec` is plain data (picklable, JSON-able): the trace file and how much of it, the cache
config fields, the memory budget, the engine options. Each worker process streams the trace itself, so
nothing large crosses process boundaries; results come back as one dict per run (see
:func:`mamba_radix.sim.metrics.result_record`) and are written to a new JSON-lines file as they finish.

A run may name a research policy (``RunSpec.policy``: a name of the policy registry,
:func:`mamba_radix.policies.registry.find_spec`, e.g. ``"oracle"``; a definition's group gives it as
``"policy"``): the same engine, mode and pools, with that policy's eviction and admission in the cache
(:func:`policy_problem` says which options refuse one).

Backends (:class:`mamba_radix.sim.runner.Runner` runs the specs): ``local`` (a pool of spawned processes on
this machine, the default; this process when ``jobs`` is 1) and ``ray`` (each run a Ray task). Both stream
records as runs finish and report progress in finished requests per run; the records are the same
whatever the backend (only ``wall_s`` differs).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mamba_radix.config import CacheConfig
from mamba_radix.defaults import Deployment, deployment_for
from mamba_radix.errors import ConfigError
from mamba_radix.peers import PEERS, RETIRED_PEERS, apply_peer, peer_changes, peer_engine_options
from mamba_radix.sim.budget import (  # infinite_pools: re-exported (its callers' old import)
    KIMI_K3_PER_RANK_BUDGET_GIB,
    PoolSizes,
    check_sim_memory,
    infinite_pools,
    model_bytes,
    pools_for_run,
)
from mamba_radix.sim.engine import CostModel, Engine, EngineOptions, check_simulable, wall_clock
from mamba_radix.sim.ideal import ideal_for
from mamba_radix.sim.metrics import result_record
from mamba_radix.sim.report import plot_problems
from mamba_radix.sim.traces import TraceRequest, TraceSummary, iter_trace, scan_trace

__all__ = [
    "BACKENDS",
    "DefinitionError",
    "RunSpec",
    "check_new_file",
    "count_requests",
    "expand_definition",
    "infinite_pools",
    "load_definition",
    "open_results",
    "peer_config",
    "policy_problem",
    "resolve_trace",
    "run_one",
    "run_sweep",
    "spec_pools",
    "trace_facts",
    "trace_problem",
]

CONFIG_FIELDS = {f.name for f in fields(CacheConfig)}
COST_FIELDS = {f.name for f in fields(CostModel)}
# EngineOptions fields that are no parameter of a run a definition or sweep may set, and why (the one rule:
# OPTION_FIELDS leaves them out and a definition naming one is refused with this reason). ``cost`` comes as
# its own fields (COST_FIELDS); ``log`` is a writer, a callable and no data; ``log_every`` writes the
# scheduler's lines, which only ``simulate --log-every`` shows (a sweep's workers would interleave them).
NOT_SWEEPABLE = {
    "cost": "give the cost model's fields (prefill_tokens_per_s, decode_step_s, ...) instead",
    "log": "the scheduler lines' writer is no parameter (a callable); simulate --log-every sets it",
    "log_every": "the scheduler's lines are simulate's (--log-every), one run at a time",
}
OPTION_FIELDS = {f.name for f in fields(EngineOptions)} - set(NOT_SWEEPABLE)
# speculative decoding's sizing inputs (not simulated): ReplaySSM's rings add to every state slot's bytes
SIZING_FIELDS = {"enable_linear_replayssm_spec", "linear_replayssm_cache_len"}
BUDGET_FIELDS = {
    "budget_gib",
    "mamba_full_memory_ratio",
    "max_mamba_cache_size",
    "infinite",
    "kv_tokens",
    "state_slots",
} | SIZING_FIELDS
DEPLOYMENT_FIELDS = {"tp_size", "kv_cache_dtype", "mamba_ssm_dtype", "mamba_conv_dtype"}
BACKENDS = ("local", "ray")


class DefinitionError(ConfigError):
    """An experiment definition with problems: ``problems`` holds one line per problem (all of them,
    found before anything runs); the message is those lines."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def peer_config(fields_set: dict[str, Any], peer: str | None) -> CacheConfig:
    """The run's :class:`CacheConfig`: ``fields_set`` (the fields the user gave), then peer ``peer``'s
    policy applied on top (:func:`mamba_radix.peers.apply_peer`).

    A field the user gave that the peer would set to another value is a contradiction, not an override:
    :class:`ConfigError` ``"mamba_eviction_order conflicts with peer='marconi-static'; drop one"`` (every
    such field named). A field given with the value the peer sets anyway is accepted. Unknown peer
    names and invalid results raise :class:`ConfigError` too. O(fields).
    """
    config = CacheConfig(**fields_set)
    if peer is None:
        return config
    if peer in RETIRED_PEERS:
        raise ConfigError(RETIRED_PEERS[peer])
    if peer not in PEERS:
        raise ConfigError(f"peer must be one of {', '.join(PEERS)} (or None), got {peer!r}")
    changes = peer_changes(config, peer)
    clash = [k for k in fields_set if k in changes and changes[k] != fields_set[k]]
    if clash:
        names = ", ".join(clash)
        verb = "conflicts" if len(clash) == 1 else "conflict"
        raise ConfigError(f"{names} {verb} with peer={peer!r}; drop one")
    return apply_peer(config, peer)


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs. ``infinite``: pools large enough that nothing is ever evicted (the
    infinite-capacity ideal *for this strategy*: checkpoint positions still limit the hits). ``peer``: a
    preset of :data:`mamba_radix.peers.PEERS` applied over ``config`` (see :func:`peer_config`)."""

    run_id: str
    trace: str
    trace_format: str = "auto"
    block_size: int = 512
    limit: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    block_convention: str = "auto"  # block traces: "ceil" (Mooncake), "floor", or detected
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    model: str = "kimi-k3"
    infinite: bool = False
    # exact pool sizes (both or neither): instead of splitting budget_gib
    kv_tokens: int | None = None
    state_slots: int | None = None
    # the model's deployment overrides (tp_size, kv_cache_dtype, mamba_ssm_dtype, mamba_conv_dtype):
    # the rest comes from mamba_radix.defaults.deployment_for(model), as in `plan`
    deployment: dict[str, Any] = field(default_factory=dict)
    # ReplaySSM's ring buffers (SGLang's --enable-linear-replayssm-spec, --linear-replayssm-cache-len):
    # sizing inputs only, part of every state slot's bytes (speculative decoding is not simulated)
    enable_linear_replayssm_spec: bool = False
    linear_replayssm_cache_len: int = 16
    options: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    group: str = ""
    keep_timeseries: bool = True
    peer: str | None = None
    # a seeded synthetic workload instead of the trace file: {"generator": name in GENERATORS, "seed": int,
    # "args": {keyword: value}}; generated inside the worker (see synthetic_requests)
    synthetic: dict[str, Any] | None = None
    # a research policy of the registry (mamba_radix.policies.registry) run in the cache, or None for the
    # config's own eviction and admission (see policy_problem for the options that refuse one)
    policy: str | None = None

    def cache_config(self) -> CacheConfig:
        """The validated config this run uses: ``config`` with ``peer`` applied. Raises ConfigError."""
        return peer_config(self.config, self.peer)

    def engine_fields(self) -> dict[str, Any]:
        """The run's :class:`EngineOptions` fields: ``options`` with the peer's simulator options where the run
        sets none (the HiCache preset's host ratio, :func:`~mamba_radix.peers.peer_engine_options`). A new
        dict. Raises ConfigError for an invalid config. O(fields)."""
        return peer_engine_options(self.peer, dict(self.options), self.cache_config())

    def validate(self) -> None:
        """Raise :class:`ConfigError` now for what would fail the run at its start: an invalid config, a
        field against the peer, an unknown synthetic generator, bad options, a bad model or deployment,
        pools the budget cannot buy or the simulator cannot hold. O(fields) plus the planner's sizing."""
        check_simulable(self.cache_config())
        if self.policy is not None:
            problem = policy_problem(self)
            if problem:
                raise ConfigError(problem)
        if self.synthetic is not None:
            synthetic_label(self.synthetic)
        if (self.kv_tokens is None) != (self.state_slots is None):
            raise ConfigError("kv_tokens and state_slots size the pools together: give both or neither")
        if self.kv_tokens is not None and self.infinite:
            raise ConfigError("infinite pools and exact kv_tokens/state_slots exclude each other; drop one")
        EngineOptions(
            cost=CostModel(**self.cost), **self.engine_fields()
        )  # bad options fail here, not mid-sweep
        unknown = set(self.deployment) - DEPLOYMENT_FIELDS
        if unknown:
            raise ConfigError(
                f"unknown deployment field(s) {sorted(unknown)}; known: {sorted(DEPLOYMENT_FIELDS)}"
            )
        # a bad model, TP size, dtype or ring length fails here
        model_bytes(self.model, self.deployment_defaults(), self.cache_config(), **self.sizing())
        if not self.infinite:  # a budget that buys no running request fails here, not mid-sweep
            spec_pools(self, self.cache_config(), 0, 0, 0)

    def sizing(self) -> dict[str, Any]:
        """The speculative sizing inputs (:data:`SIZING_FIELDS`) as keywords of
        :func:`mamba_radix.sim.budget.pools_for_run`. O(1)."""
        return {name: getattr(self, name) for name in sorted(SIZING_FIELDS)}

    def deployment_defaults(self) -> Deployment:
        """The model's deployment (:func:`mamba_radix.defaults.deployment_for`) with this run's overrides."""
        return deployment_for(self.model, **self.deployment)

    def params(self) -> dict[str, Any]:
        """The flat parameters of this run, as they appear in results and tables (the config fields
        after the peer, if any, and ``peer`` itself)."""
        cfg = self.cache_config()
        out: dict[str, Any] = {"group": self.group, "trace": Path(self.trace).name, "limit": self.limit}
        out["block_convention"] = self.block_convention
        out["peer"] = self.peer
        if self.policy is not None:  # recorded only when set: a record without one is what it was before
            out["policy"] = self.policy
        out.update({f.name: getattr(cfg, f.name) for f in fields(CacheConfig)})
        out["strategy"] = cfg.strategy
        out.update(
            budget_gib=self.budget_gib,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
            model=self.model,
            infinite=self.infinite,
            kv_tokens=self.kv_tokens,
            state_slots=self.state_slots,
            **self.sizing(),
        )
        dep = self.deployment_defaults()
        out.update({k: getattr(dep, k) for k in sorted(DEPLOYMENT_FIELDS)})
        options = asdict(EngineOptions(**self.options))
        options.pop("log")  # a writer (simulate's stderr), no parameter and no JSON
        for name in (
            "host_link",
            "host_link_gbps",
            "host_memory_ratio",
            "host_split",
            "host_merged",
        ):  # the host tier's, when off:
            if options.get(name) is None:  # left out, so a record without the tier is what it was before
                options.pop(name, None)
        out.update(options | {"cost": asdict(CostModel(**self.cost))})
        return out


def policy_problem(spec: RunSpec) -> str | None:
    """Why ``spec.policy`` cannot run with ``spec``'s options, as one line that says what to drop, or None.

    Refused: a name the registry does not know (the known ones listed); a ``peer`` as well (each sets the
    rules; a policy starts from its own release preset); a config field the policy's preset would set to
    another value; the host tier for a policy that cannot run with it (``host_tier_problem``: the offline
    oracle) unless ``host_merged`` merges it into the device pools (the tier-aware reference, tier off);
    any other policy chooses the device victims with the tier on as without it;
    unified memory (its give-way rule, not the policy, picks which side loses bytes when KV and states
    meet). The adaptive split and quantized checkpoint formats run with a policy. O(fields)."""
    from mamba_radix.policies.registry import POLICIES, REFERENCES, VARIANTS, find_spec

    name = spec.policy
    if name is None:
        return None
    found = find_spec(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join([*POLICIES, *VARIANTS, *REFERENCES])
        return f"unknown policy {name!r}; known: {known}"
    if spec.peer is not None:
        return f"policy {name!r} and peer {spec.peer!r} both set the rules; drop one"
    config = spec.cache_config()
    configured = found.configure(config)
    clash = [k for k in sorted(spec.config) if getattr(configured, k) != getattr(config, k)]
    if clash:
        verb = "conflicts" if len(clash) == 1 else "conflict"
        return f"{', '.join(clash)} {verb} with policy {name!r} (it sets its own rules); drop one"
    tiered = (config.host_tier or spec.options.get("host_memory_ratio")) and not spec.options.get(
        "host_merged"
    )
    problem = found.host_tier_problem if tiered else None
    if problem is not None:
        return (
            f"research policy {name!r} cannot run with the host tier: {problem}; drop 'policy' or the host "
            "pools (host_kv_tokens, host_state_slots, host_memory_ratio), or set host_merged"
        )
    if config.enable_unified_memory:
        return (
            f"unified memory refuses research policy {name!r}: its give-way rule, not the policy, picks "
            "which side loses bytes when KV and states meet; drop 'policy' or enable_unified_memory"
        )
    return None


def _policy_config(spec: RunSpec) -> CacheConfig:
    """The config a policy run uses: the policy's preset over the run's config (equal to it on every field
    the run set: :func:`policy_problem`)."""
    from mamba_radix.policies.registry import find_spec

    found = find_spec(str(spec.policy))
    assert found is not None  # validated
    return found.configure(spec.cache_config())


def synthetic_label(synthetic: dict[str, Any]) -> str:
    """``synthetic:NAME:seed=S`` (the run's ``trace`` parameter), after checking the description:
    ``generator`` one of :data:`mamba_radix.sim.synthetic.GENERATORS`, ``seed`` an int, ``args`` the
    generator's keywords. Raises :class:`ConfigError`. O(1)."""
    from mamba_radix.sim.synthetic import GENERATORS

    unknown = set(synthetic) - {"generator", "seed", "args"}
    name = synthetic.get("generator")
    if unknown or name not in GENERATORS:
        raise ConfigError(
            f"synthetic workload {synthetic!r}: needs 'generator' (one of {', '.join(GENERATORS)}) and "
            "optionally 'seed' and 'args'"
        )
    return f"synthetic:{name}:seed={synthetic.get('seed', 0)}"


def synthetic_requests(synthetic: dict[str, Any], limit: int | None = None) -> list[TraceRequest]:
    """The requests of a synthetic workload description (see :func:`synthetic_label`), first ``limit``."""
    from mamba_radix.sim.synthetic import GENERATORS

    synthetic_label(synthetic)
    requests = GENERATORS[synthetic["generator"]](seed=synthetic.get("seed", 0), **synthetic.get("args", {}))
    return requests[:limit] if limit else requests


def trace_facts(
    path: str,
    fmt: str = "auto",
    block_size: int = 512,
    limit: int | None = None,
    block_convention: str = "auto",
) -> tuple[TraceSummary, tuple[int, ...]]:
    """The trace's totals and the ideal hit of every request, computed once per process and trace.

    Every run of a sweep replays the same trace; a worker process runs many of them, so the two passes
    over the file (totals, then the ideal) are memoised, keyed by the file's path, size and modification
    time. O(rows + blocks) the first time, O(1) after.
    """
    st = os.stat(path)
    return _trace_facts(
        str(Path(path).resolve()), st.st_size, st.st_mtime_ns, fmt, block_size, limit, block_convention
    )


@functools.lru_cache(maxsize=4)
def _trace_facts(
    path: str, size: int, mtime_ns: int, fmt: str, block_size: int, limit: int | None, convention: str
) -> tuple[TraceSummary, tuple[int, ...]]:
    del size, mtime_ns  # cache key only: a changed file is read again
    summary = scan_trace(path, fmt, block_size, limit, block_convention=convention)  # type: ignore[arg-type]
    hits: list[int] = []
    ideal = None
    for req in iter_trace(path, fmt, block_size, limit, block_convention=convention):  # type: ignore[arg-type]
        if ideal is None:
            ideal = ideal_for(req)
        hits.append(ideal.observe(req))
    return summary, tuple(hits)


def _engine_options(spec: RunSpec, infinite_rows: bool) -> EngineOptions:
    opts = spec.engine_fields()
    if infinite_rows and opts.get("max_running_requests") is None:
        opts["max_running_requests"] = 256  # bounded request table: 256 x max_context_len int32
    return EngineOptions(cost=CostModel(**spec.cost), **opts)


def resolve_trace(trace: str, base_dir: str | Path | None = None) -> str:
    """The file a run's ``trace`` names: an absolute path as it is; a relative one against ``base_dir``
    (a definition's folder; the current folder when None) when that file exists; otherwise the bundled
    trace of that file name (:func:`mamba_radix.data.trace_path`) when there is one; otherwise the path
    against ``base_dir`` (which does not exist: the caller reports it). O(1) filesystem look-ups."""
    if trace.startswith("synthetic:") or os.path.isabs(trace):
        return trace
    local = Path(base_dir or ".") / trace
    if local.is_file():
        return str(local.resolve())
    from mamba_radix.data import bundled_traces, trace_path

    name = Path(trace).name
    if name in bundled_traces():
        return str(trace_path(name))
    return str(local.absolute())


def _local_trace(trace: str) -> str:
    """``trace`` on this machine: on another node of a cluster the driver's path may not exist, but a
    bundled trace is found in this node's installed package by its name."""
    if os.path.isfile(trace) or trace.startswith("synthetic:"):
        return trace
    from mamba_radix.data import bundled_traces, trace_path

    return str(trace_path(Path(trace).name)) if Path(trace).name in bundled_traces() else trace


def trace_problem(trace: str) -> str | None:
    """Why ``trace`` cannot be read (missing, a folder, unreadable), or None. O(1)."""
    if trace.startswith("synthetic:"):
        return None
    if os.path.isdir(trace):
        return f"trace {trace} is a folder, not a trace file"
    if not os.path.isfile(trace):
        return f"trace file not found: {trace}"
    if not os.access(trace, os.R_OK):
        return f"trace file not readable: {trace}"
    return None


def count_requests(spec: RunSpec) -> int:
    """How many requests ``spec`` replays (for progress totals): the synthetic workload's size or one
    cheap pass over the trace (memoised per file). Raises ``TraceFormatError`` for a bad trace."""
    if spec.synthetic is not None:
        return len(synthetic_requests(spec.synthetic, spec.limit))
    return _count_trace(
        _local_trace(spec.trace), spec.trace_format, spec.block_size, spec.limit, spec.block_convention
    )


@functools.lru_cache(maxsize=16)
def _count_trace(path: str, fmt: str, block_size: int, limit: int | None, convention: str) -> int:
    return scan_trace(path, fmt, block_size, limit, block_convention=convention).num_requests  # type: ignore[arg-type]


def spec_pools(
    spec: RunSpec, config: CacheConfig, input_tokens: int, output_tokens: int, num_requests: int
) -> PoolSizes:
    """The pools of a run (:func:`mamba_radix.sim.budget.pools_for_run`, the one sizing rule): infinite,
    exact (``kv_tokens`` and ``state_slots``) or split from the budget."""
    return pools_for_run(
        config,
        model=spec.model,
        deployment=spec.deployment_defaults(),
        infinite=spec.infinite,
        kv_tokens=spec.kv_tokens,
        state_slots=spec.state_slots,
        budget_gib=spec.budget_gib,
        mamba_full_memory_ratio=spec.mamba_full_memory_ratio,
        max_mamba_cache_size=spec.max_mamba_cache_size,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        num_requests=num_requests,
        **spec.sizing(),
    )


def run_one(
    spec: RunSpec,
    progress: Callable[[int], None] | None = None,
    requests: Sequence[TraceRequest] | None = None,
) -> dict[str, Any]:
    """Run one configuration to the end and return its results record.

    ``requests`` replays an in-memory trace instead of ``spec.trace`` (tests, synthetic workloads);
    ``progress(n)`` is called with the number of finished requests after each one finishes.
    ``spec.policy``: the research policy runs in the cache, on the same pools and engine options; it
    reads the whole trace (the oracle's future), so a trace file is loaded into memory first, and its
    pre-passes (the oracle's demand replay) run before the engine.
    Side effects: none outside the process (builds its own pools and cache). Raises ``ConfigError`` for
    a bad configuration or pools too large to simulate (before allocating them), ``TraceFormatError``
    for a bad trace.
    """
    config = spec.cache_config()
    trace = _local_trace(spec.trace)
    if requests is None and spec.synthetic is not None:
        requests = synthetic_requests(spec.synthetic, spec.limit)
    if spec.policy is not None:
        problem = policy_problem(spec)
        if problem:
            raise ConfigError(problem)
        config = _policy_config(spec)
        if requests is None:
            requests = list(
                iter_trace(
                    trace,
                    spec.trace_format,
                    spec.block_size,
                    spec.limit,
                    block_convention=spec.block_convention,
                )  # type: ignore[arg-type]
            )
    ideal_hits: tuple[int, ...] | None = None
    if requests is not None:
        num = len(requests)
        in_tok = sum(r.input_len for r in requests)
        out_tok = sum(r.output_len for r in requests)
        max_len = max(r.input_len + r.output_len for r in requests)
    else:
        summary, ideal_hits = trace_facts(
            trace, spec.trace_format, spec.block_size, spec.limit, spec.block_convention
        )
        num, in_tok, out_tok, max_len = (
            summary.num_requests,
            summary.input_tokens,
            summary.output_tokens,
            summary.max_seq_len,
        )
    pools = spec_pools(spec, config, in_tok, out_tok, num)
    options = _engine_options(spec, spec.infinite)
    check_sim_memory(pools, config, max_len, options.max_running_requests)
    start = wall_clock()
    policy = None
    if spec.policy is not None:
        from mamba_radix.policies.registry import PolicyContext, find_spec

        found = find_spec(spec.policy)
        assert found is not None and requests is not None  # validated and loaded above
        policy = found.make(config, PolicyContext(requests, pools, spec.model))
    # the loaded requests (a policy run, a synthetic workload) also size a planned host split up front
    engine = Engine(config, pools, max_len, options, policy=policy, workload=requests)
    source = (
        requests
        if requests is not None
        else iter_trace(
            trace, spec.trace_format, spec.block_size, spec.limit, block_convention=spec.block_convention
        )
    )  # type: ignore[arg-type]
    metrics = engine.run(source, total=num, on_finish=progress, ideal_hits=ideal_hits)
    wall_s = wall_clock() - start
    return result_record(
        spec.run_id,
        spec.params(),
        pools.as_dict() | {"max_running_requests_effective": engine.max_running} | _split_end(engine),
        metrics.summary(),
        engine.cache_stats(),
        metrics.timeseries() if spec.keep_timeseries else None,
        wall_s,
        metrics.per_request if engine.options.keep_per_request else None,
    )


def _split_end(engine: Engine) -> dict[str, Any]:
    """Where an adaptive split ended (the pools' sizes are where it started); nothing without one."""
    if engine.split is None:
        return {}
    return {"split_end": {"kv_tokens": engine.split.kv_tokens, "state_slots": engine.split.state_slots}}


def _failure_record(spec: RunSpec, error: str) -> dict[str, Any]:
    """The record of a run that failed (the sweep goes on): ``error`` is ``"ExceptionType: message"``.

    Only the library's own errors (bad configuration or trace) are expected; anything else is a bug and
    its record says so with the exception type."""
    return {"run_id": spec.run_id, "params": spec.params(), "error": error}


def check_new_file(path: str | Path, overwrite: bool = False, what: str = "results file") -> Path:
    """Check, before any work, that ``path`` can be written as a new file: refuses (:class:`ConfigError`)
    a folder, a missing or read-only parent folder, and an existing file unless ``overwrite``. No side
    effects; O(1)."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{what} {target} is a folder; name a file")
    parent = target.parent
    if not parent.is_dir():
        raise ConfigError(f"folder {parent} of {what} {target.name} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"folder {parent} of {what} {target.name} is not writable")
    if target.exists() and not overwrite:
        raise ConfigError(f"{what} {target} exists; pick a new name or pass overwrite=True")
    return target


def open_results(path: str | Path, overwrite: bool = False) -> Any:
    """Open a new results file for writing (:func:`check_new_file` first). Side effects: creates it."""
    target = check_new_file(path, overwrite)
    try:
        return open(target, "w" if overwrite else "x", encoding="utf-8")  # the caller closes it
    except OSError as exc:
        raise ConfigError(f"cannot write results file {target}: {exc.strerror}") from None


def run_sweep(
    specs: Sequence[RunSpec],
    jobs: int = 2,
    out_path: str | Path | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Run ``specs`` and return their records in ``specs`` order.

    ``backend="local"``: ``jobs`` spawned processes (in this process when 1), longest-expected first;
    ``backend="ray"``: each run a Ray task on the cluster at ``ray_address`` (or ``RAY_ADDRESS``; a
    local instance when neither), ``jobs`` ignored (:class:`mamba_radix.sim.runner.Runner` runs them).
    Records are appended to ``out_path`` (JSON lines, a new file: an existing one is refused unless
    ``overwrite``) and passed to ``on_done`` as each run finishes; ``on_progress(run_id,
    finished_requests)`` is called while runs go on (at most every
    :data:`~mamba_radix.sim.runner.PROGRESS_EVERY_S` per run). A run that raises becomes a record with an
    ``error`` field. Side effects: writes ``out_path``; the ray backend may start a local Ray instance.
    """
    from mamba_radix.sim.runner import Runner

    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if jobs < 1:
        raise ConfigError(f"jobs must be >= 1, got {jobs}")
    if len({s.run_id for s in specs}) != len(specs):
        raise ConfigError("run ids in a sweep must be unique")
    written = 0
    sink = open_results(out_path, overwrite) if out_path else None

    def collect(_spec: RunSpec, rec: dict[str, Any]) -> None:
        nonlocal written
        written += 1
        if sink:
            sink.write(json.dumps(rec, separators=(",", ":")) + "\n")
            sink.flush()
        if on_done:
            on_done(rec)

    try:
        # spawned workers: each imports the package afresh and streams its own trace
        with Runner(
            backend, jobs, start_method="spawn", ray_address=ray_address, on_progress=on_progress
        ) as runner:
            return runner.run(
                specs,
                run_one,
                # infinite and large-memory runs first: they are the slowest, start them early
                first=lambda s: (not s.infinite, -s.budget_gib),
                on_result=collect,
                on_failure=_failure_record,
            )
    except BaseException:
        if sink and not written:  # nothing ran (e.g. no Ray cluster there): leave no empty results file
            sink.close()
            Path(sink.name).unlink(missing_ok=True)
        raise
    finally:
        if sink:
            sink.close()


# ------------------------------------------------------------------------------------- definitions
def _split_params(params: dict[str, Any], where: str, problems: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        "config": {}, "options": {}, "cost": {}, "budget": {}, "peer": {}, "deployment": {}
    }  # fmt: skip
    for key, value in params.items():
        if key in DEPLOYMENT_FIELDS:
            out["deployment"][key] = value
        elif key == "peer":
            if value in RETIRED_PEERS:
                problems.append(f"{where}: {RETIRED_PEERS[value]}")
                continue
            if value is not None and value not in PEERS:
                problems.append(f"{where}: peer must be one of {', '.join(PEERS)} or null, got {value!r}")
                continue
            out["peer"]["peer"] = value
        elif key in NOT_SWEEPABLE:
            problems.append(f"{where}: {key!r} cannot be set in a definition or swept: {NOT_SWEEPABLE[key]}")
        elif key in CONFIG_FIELDS:
            out["config"][key] = value
        elif key in OPTION_FIELDS:
            out["options"][key] = value
        elif key in COST_FIELDS:
            out["cost"][key] = value
        elif key in BUDGET_FIELDS:
            out["budget"][key] = value
        else:
            problems.append(f"{where}: unknown parameter {key!r}")
    return out


_DEFINITION_KEYS = {
    "title", "description", "trace", "trace_format", "block_size", "block_convention", "limit", "model", "base", "groups",
    "plots", "reference",
}  # fmt: skip


def load_definition(path: str | Path) -> dict[str, Any]:
    """Read an experiment definition JSON file. Raises :class:`ConfigError` naming the file (missing,
    a folder, not JSON, not an object). A plot's ``fidelity`` file becomes a full path (beside the
    definition, else the bundled one: :func:`_resolve_data_file`). No side effects."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"experiment definition {p} is a folder, not a JSON file")
    if not p.is_file():
        raise ConfigError(f"experiment definition not found: {p}")
    try:
        definition = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read ({exc})") from None
    if not isinstance(definition, dict):
        raise ConfigError(f"{p}: an experiment definition is a JSON object")
    for plot in definition.get("plots") or []:
        if isinstance(plot, dict) and isinstance(plot.get("fidelity"), str):
            # the report reads it later, from any folder: resolved now, as a trace is (resolve_trace)
            plot["fidelity"] = _resolve_data_file(plot["fidelity"], p.parent)
    return definition


def _resolve_data_file(name: str, base_dir: Path) -> str:
    """A file a definition names: absolute as it is; else beside the definition when there; else the
    bundled file of that name (``mamba_radix/data/experiments``) when there; else beside the definition
    (missing: the definition's check reports it). O(1) filesystem look-ups."""
    if os.path.isabs(name):
        return name
    local = base_dir / name
    if local.is_file():
        return str(local.resolve())
    from mamba_radix.data import data_path

    bundled = data_path("experiments", Path(name).name)
    return str(bundled if bundled.is_file() else local.absolute())


def expand_definition(
    definition: dict[str, Any], base_dir: str | Path = ".", check_traces: bool = False
) -> list[RunSpec]:
    """Turn an experiment definition (see ``mamba_radix/data/experiments/default.json``) into run specs,
    after checking all of it: every problem (a missing key, an unknown parameter, an invalid value, a
    trace that does not exist, a bad plot) is one line of one :class:`DefinitionError`, so nothing runs
    and no partial report is written for a definition that cannot complete.

    Keys: ``trace`` (a path relative to ``base_dir``, the definition's folder, or the file name of a
    bundled trace: see :func:`resolve_trace`), ``trace_format``, ``block_size``, ``limit``, ``model``,
    ``base`` (parameters of every run), and ``groups``: each with a ``name``, ``fixed`` parameters and
    ``vary`` (parameter -> list of values; the runs are the cartesian product), and optionally
    ``synthetic`` (``{"generator", "seed", "args"}``, see :func:`synthetic_label`: the group replays that
    seeded workload instead of the trace, and ``limit`` applies to it only if the group gives its own
    ``limit``), and ``policy`` (a research policy's name, :attr:`RunSpec.policy`: its runs are refused,
    with the reason, where :func:`policy_problem` says so). Parameters are CacheConfig fields, EngineOptions fields, CostModel fields, or budget
    fields (``budget_gib``, ``mamba_full_memory_ratio``, ``max_mamba_cache_size``, ``infinite``,
    ``kv_tokens`` and ``state_slots``, and the sizing inputs ``enable_linear_replayssm_spec`` and
    ``linear_replayssm_cache_len``), or ``peer`` (a name of :data:`mamba_radix.peers.PEERS`, or null:
    applied after the other parameters; a parameter the peer would set to another value is refused, as on
    the command line). The options of :data:`NOT_SWEEPABLE` (``log``, ``log_every``, ``cost``) are
    refused with the reason. Runs with identical parameters in several groups are kept once (the first group
    names them). Also ``plots`` (checked: each needs ``file``; a ``"kind": "memory"`` plot is checked by
    :func:`mamba_radix.experiment_report.memory_plot_problems`) and ``reference`` (a results file, for the
    report's comparison). ``check_traces``: also report a trace file that does not exist or is not a
    file (the command line always checks). O(runs), plus one stat per trace.
    """
    problems: list[str] = []
    if not isinstance(definition, dict):
        raise DefinitionError(["an experiment definition is a JSON object"])
    for key in ("trace", "groups"):
        if key not in definition:
            problems.append(f"an experiment definition needs {key!r}")
    unknown = sorted(set(definition) - _DEFINITION_KEYS)
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(_DEFINITION_KEYS))}"
        )
    groups = definition.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        problems.append("'groups' must be a list of objects")
        groups = []
    trace = resolve_trace(str(definition.get("trace", "")), base_dir) if "trace" in definition else ""
    limit = definition.get("limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        problems.append(f"'limit' must be a positive integer or null, got {limit!r}")
    uses_trace = any(g.get("synthetic") is None for g in groups)
    if check_traces and uses_trace and trace:
        problem = trace_problem(trace)
        if problem:
            problems.append(f"{problem} (from 'trace': {definition['trace']!r})")
    plots = definition.get("plots", []) or []
    for i, plot in enumerate(plots):
        if not isinstance(plot, dict) or not plot.get("file"):
            problems.append(f"plot {i}: needs a 'file' (the PNG name)")
    # what the report cannot draw (a y_unit it does not know) is refused here, before any run
    problems += plot_problems([p for p in plots if isinstance(p, dict)])
    memory_plots = [(i, p) for i, p in enumerate(plots) if isinstance(p, dict) and p.get("kind") == "memory"]
    if memory_plots:
        from mamba_radix.experiment_report import memory_plot_problems

        for i, plot in memory_plots:
            problems += memory_plot_problems(i, plot, groups)
    base = dict(definition.get("base", {}))
    specs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for gi, group in enumerate(groups):
        name = group.get("name") or f"group{gi}"
        where = f"group {name!r}"
        vary: dict[str, list[Any]] = group.get("vary", {})
        if not isinstance(vary, dict) or not all(isinstance(v, list) and v for v in vary.values()):
            problems.append(f"{where}: 'vary' maps each parameter to a non-empty list of values")
            continue
        keys = list(vary)
        synthetic = group.get("synthetic")
        policy = group.get("policy")
        if policy is not None and not isinstance(policy, str):
            problems.append(f"{where}: 'policy' must be a policy's name (e.g. \"oracle\") or null")
            continue
        label = ""
        if synthetic is not None:
            try:
                label = synthetic_label(synthetic)
            except ConfigError as err:
                problems.append(f"{where}: {err}")
                continue
        for values in itertools.product(*(vary[k] for k in keys)):
            params = base | group.get("fixed", {}) | dict(zip(keys, values, strict=True))
            before = len(problems)
            parts = _split_params(params, where, problems)
            if len(problems) > before:
                break  # the same unknown parameter in every combination: say it once
            fingerprint = json.dumps([params, synthetic, policy], sort_keys=True)
            if fingerprint in seen:
                continue
            run_id = f"{len(specs):03d}"
            seen[fingerprint] = run_id
            try:
                spec = RunSpec(
                    run_id=run_id,
                    trace=trace if synthetic is None else label,
                    trace_format=definition.get("trace_format", "auto"),
                    block_size=definition.get("block_size", 512),
                    block_convention=definition.get("block_convention", "auto"),
                    limit=limit if synthetic is None else group.get("limit"),
                    synthetic=synthetic,
                    config=parts["config"],
                    model=definition.get("model", "kimi-k3"),
                    options=parts["options"],
                    cost=parts["cost"],
                    group=name,
                    peer=parts["peer"].get("peer"),
                    deployment=parts["deployment"],
                    policy=policy,
                    **parts["budget"],
                )
                spec.validate()  # early, with the parameter named in the message
            except ConfigError as err:
                problem = f"{where}: {err}"
                if problem not in problems:
                    problems.append(problem)
                continue
            specs.append(spec)
    if not specs and not problems:
        problems.append("the definition has no runs (every group is empty)")
    if problems:
        raise DefinitionError(problems)
    return specs
