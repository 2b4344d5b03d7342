"""Runs: one configuration (:func:`run_one`), many in parallel processes (:func:`run_sweep`), and the
expansion of an experiment definition into runs (:func:`expand_definition`).

A :class:`RunSpec` is plain data (picklable, JSON-able): the trace file and how much of it, the cache
config fields, the memory budget, the engine options. Each worker process streams the trace itself, so
nothing large crosses process boundaries; results come back as one dict per run (see
:func:`mamba_radix.sim.metrics.result_record`) and are appended to a JSON-lines file as they finish.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.peers import PEERS, apply_peer, peer_changes
from mamba_radix.sim.budget import KIMI_K3_PER_RANK_BUDGET_GIB, PoolSizes, model_bytes, pools_for_budget
from mamba_radix.sim.engine import CostModel, Engine, EngineOptions, check_simulable, wall_clock
from mamba_radix.sim.ideal import ideal_for
from mamba_radix.sim.metrics import result_record
from mamba_radix.sim.traces import TraceRequest, TraceSummary, iter_trace, scan_trace

__all__ = [
    "RunSpec",
    "expand_definition",
    "infinite_pools",
    "peer_config",
    "run_one",
    "run_sweep",
    "trace_facts",
]

CONFIG_FIELDS = {f.name for f in fields(CacheConfig)}
COST_FIELDS = {f.name for f in fields(CostModel)}
OPTION_FIELDS = {f.name for f in fields(EngineOptions)} - {"cost"}
BUDGET_FIELDS = {"budget_gib", "mamba_full_memory_ratio", "max_mamba_cache_size", "infinite"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def peer_config(fields_set: dict[str, Any], peer: str | None) -> CacheConfig:
    """The run's :class:`CacheConfig`: ``fields_set`` (the fields the user gave), then peer ``peer``'s
    policy applied on top (:func:`mamba_radix.peers.apply_peer`).

    A field the user gave that the peer would set to another value is a contradiction, not an override:
    :class:`ConfigError` ``"--mamba-eviction-order conflicts with --peer marconi; drop one"`` (every
    such field named). A field given with the value the peer sets anyway is accepted. Unknown peer
    names and invalid results raise :class:`ConfigError` too. O(fields).
    """
    config = CacheConfig(**fields_set)
    if peer is None:
        return config
    if peer not in PEERS:
        raise ConfigError(f"--peer must be one of {', '.join(PEERS)}, got {peer!r}")
    changes = peer_changes(config, peer)
    clash = [k for k in fields_set if k in changes and changes[k] != fields_set[k]]
    if clash:
        flags = ", ".join(_flag(k) for k in clash)
        verb = "conflicts" if len(clash) == 1 else "conflict"
        raise ConfigError(f"{flags} {verb} with --peer {peer}; drop one")
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
    budget_gib: float = KIMI_K3_PER_RANK_BUDGET_GIB
    mamba_full_memory_ratio: float = 0.9
    max_mamba_cache_size: int | None = None
    model: str = "kimi-k3"
    infinite: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    group: str = ""
    keep_timeseries: bool = True
    peer: str | None = None
    # a seeded synthetic workload instead of the trace file: {"generator": name in GENERATORS, "seed": int,
    # "args": {keyword: value}}; generated inside the worker (see synthetic_requests)
    synthetic: dict[str, Any] | None = None

    def cache_config(self) -> CacheConfig:
        """The validated config this run uses: ``config`` with ``peer`` applied. Raises ConfigError."""
        return peer_config(self.config, self.peer)

    def validate(self) -> None:
        """Raise :class:`ConfigError` now for what would fail the run at its start: an invalid config, a
        flag against the peer, a config the simulator cannot run (page_size > 1), an unknown synthetic
        generator. O(fields)."""
        check_simulable(self.cache_config())
        if self.synthetic is not None:
            synthetic_label(self.synthetic)

    def params(self) -> dict[str, Any]:
        """The flat parameters of this run, as they appear in results and tables (the config fields
        after the peer, if any, and ``peer`` itself)."""
        cfg = self.cache_config()
        out: dict[str, Any] = {"group": self.group, "trace": Path(self.trace).name, "limit": self.limit}
        out["peer"] = self.peer
        out.update({f.name: getattr(cfg, f.name) for f in fields(CacheConfig)})
        out["strategy"] = cfg.strategy
        out.update(
            budget_gib=self.budget_gib,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
            model=self.model,
            infinite=self.infinite,
        )
        out.update(asdict(EngineOptions(**self.options)) | {"cost": asdict(CostModel(**self.cost))})
        return out


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


def infinite_pools(
    config: CacheConfig, input_tokens: int, output_tokens: int, num_requests: int, model: str
) -> PoolSizes:
    """Pools no trace of this size can fill: every token and every checkpoint it could ever create."""
    mb = model_bytes(model)
    interval = max(1, config.mamba_track_interval)
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else 1 << 30
    checkpoints = num_requests * 3 + input_tokens // min(chunk, 64) + output_tokens // interval
    running = 256
    slots = checkpoints + running * config.slots_per_request
    return PoolSizes(
        kv_tokens=input_tokens + output_tokens + 1,
        state_slots=slots,
        max_running_requests=config.max_running_requests(slots),
        budget_gib=float("inf"),
        mamba_full_memory_ratio=float("nan"),
        bytes_per_kv_token=mb.bytes_per_kv_token,
        bytes_per_state_slot=mb.bytes_per_state_slot,
        model=model,
    )


def trace_facts(
    path: str, fmt: str = "auto", block_size: int = 512, limit: int | None = None
) -> tuple[TraceSummary, tuple[int, ...]]:
    """The trace's totals and the ideal hit of every request, computed once per process and trace.

    Every run of a sweep replays the same trace; a worker process runs many of them, so the two passes
    over the file (totals, then the ideal) are memoised, keyed by the file's path, size and modification
    time. O(rows + blocks) the first time, O(1) after.
    """
    st = os.stat(path)
    return _trace_facts(str(Path(path).resolve()), st.st_size, st.st_mtime_ns, fmt, block_size, limit)


@functools.lru_cache(maxsize=4)
def _trace_facts(
    path: str, size: int, mtime_ns: int, fmt: str, block_size: int, limit: int | None
) -> tuple[TraceSummary, tuple[int, ...]]:
    del size, mtime_ns  # cache key only: a changed file is read again
    summary = scan_trace(path, fmt, block_size, limit)  # type: ignore[arg-type]
    hits: list[int] = []
    ideal = None
    for req in iter_trace(path, fmt, block_size, limit):  # type: ignore[arg-type]
        if ideal is None:
            ideal = ideal_for(req)
        hits.append(ideal.observe(req))
    return summary, tuple(hits)


def _engine_options(spec: RunSpec, infinite_rows: bool) -> EngineOptions:
    opts = dict(spec.options)
    if infinite_rows and opts.get("max_running_requests") is None:
        opts["max_running_requests"] = 256  # bounded request table: 256 x max_context_len int32
    return EngineOptions(cost=CostModel(**spec.cost), **opts)


def run_one(
    spec: RunSpec,
    progress: Callable[[int], None] | None = None,
    requests: Sequence[TraceRequest] | None = None,
) -> dict[str, Any]:
    """Run one configuration to the end and return its results record.

    ``requests`` replays an in-memory trace instead of ``spec.trace`` (tests, synthetic workloads).
    Side effects: none outside the process (builds its own pools and cache). Raises ``ConfigError`` for
    a bad configuration, ``TraceFormatError`` for a bad trace.
    """
    config = spec.cache_config()
    if requests is None and spec.synthetic is not None:
        requests = synthetic_requests(spec.synthetic, spec.limit)
    ideal_hits: tuple[int, ...] | None = None
    if requests is not None:
        num = len(requests)
        in_tok = sum(r.input_len for r in requests)
        out_tok = sum(r.output_len for r in requests)
        max_len = max(r.input_len + r.output_len for r in requests)
    else:
        summary, ideal_hits = trace_facts(spec.trace, spec.trace_format, spec.block_size, spec.limit)
        num, in_tok, out_tok, max_len = (
            summary.num_requests,
            summary.input_tokens,
            summary.output_tokens,
            summary.max_seq_len,
        )
    if spec.infinite:
        pools = infinite_pools(config, in_tok, out_tok, num, spec.model)
    else:
        pools = pools_for_budget(
            config, spec.budget_gib, spec.mamba_full_memory_ratio, spec.max_mamba_cache_size, spec.model
        )
    start = wall_clock()
    engine = Engine(config, pools, max_len, _engine_options(spec, spec.infinite))
    source = (
        requests
        if requests is not None
        else iter_trace(spec.trace, spec.trace_format, spec.block_size, spec.limit)
    )  # type: ignore[arg-type]
    metrics = engine.run(source, total=num, on_finish=progress, ideal_hits=ideal_hits)
    wall_s = wall_clock() - start
    return result_record(
        spec.run_id,
        spec.params(),
        pools.as_dict() | {"max_running_requests_effective": engine.max_running},
        metrics.summary(),
        engine.cache_stats(),
        metrics.timeseries() if spec.keep_timeseries else None,
        wall_s,
        metrics.per_request if engine.options.keep_per_request else None,
    )


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # the sweep's parallelism is across processes


def _run_safely(spec: RunSpec) -> dict[str, Any]:
    try:
        return run_one(spec)
    except Exception as exc:  # a failed run is reported as a record, the sweep goes on
        return {"run_id": spec.run_id, "params": spec.params(), "error": f"{type(exc).__name__}: {exc}"}


def run_sweep(
    specs: Sequence[RunSpec],
    jobs: int = 2,
    out_path: str | Path | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``specs`` in ``jobs`` processes (spawned), longest-expected first; append each record to
    ``out_path`` (JSON lines) as it finishes. Returns the records in ``specs`` order.

    A run that raises becomes a record with an ``error`` field. Side effects: writes ``out_path``.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    order = {s.run_id: i for i, s in enumerate(specs)}
    if len(order) != len(specs):
        raise ConfigError("run ids in a sweep must be unique")
    records: dict[str, dict[str, Any]] = {}
    sink = open(out_path, "w", encoding="utf-8") if out_path else None  # noqa: SIM115 - closed below
    try:
        if jobs == 1:
            _worker_init()
            done: Iterator[dict[str, Any]] = (_run_safely(s) for s in specs)
            for rec in done:
                _collect(rec, records, sink, on_done)
        else:
            # infinite and large-memory runs first: they are the slowest, start them early
            queue = sorted(specs, key=lambda s: (not s.infinite, -s.budget_gib))
            ctx = get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
                futures = [pool.submit(_run_safely, s) for s in queue]
                for fut in as_completed(futures):
                    _collect(fut.result(), records, sink, on_done)
    finally:
        if sink:
            sink.close()
    return sorted(records.values(), key=lambda r: order[r["run_id"]])


def _collect(
    rec: dict[str, Any],
    records: dict[str, dict[str, Any]],
    sink: Any,
    on_done: Callable[[dict[str, Any]], None] | None,
) -> None:
    records[rec["run_id"]] = rec
    if sink:
        sink.write(json.dumps(rec, separators=(",", ":")) + "\n")
        sink.flush()
    if on_done:
        on_done(rec)


# ------------------------------------------------------------------------------------- definitions
def _split_params(params: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"config": {}, "options": {}, "cost": {}, "budget": {}, "peer": {}}
    for key, value in params.items():
        if key == "peer":
            if value is not None and value not in PEERS:
                raise ConfigError(f"{where}: peer must be one of {', '.join(PEERS)} or null, got {value!r}")
            out["peer"]["peer"] = value
        elif key in CONFIG_FIELDS:
            out["config"][key] = value
        elif key in OPTION_FIELDS:
            out["options"][key] = value
        elif key in COST_FIELDS:
            out["cost"][key] = value
        elif key in BUDGET_FIELDS:
            out["budget"][key] = value
        else:
            raise ConfigError(f"{where}: unknown parameter {key!r}")
    return out


def expand_definition(definition: dict[str, Any], base_dir: str | Path = ".") -> list[RunSpec]:
    """Turn an experiment definition (see ``experiments/default.json``) into run specs.

    Keys: ``trace`` (path relative to ``base_dir``), ``trace_format``, ``block_size``, ``limit``,
    ``model``, ``base`` (parameters of every run), and ``groups``: each with a ``name``, ``fixed``
    parameters and ``vary`` (parameter -> list of values; the runs are the cartesian product), and
    optionally ``synthetic`` (``{"generator", "seed", "args"}``, see :func:`synthetic_label`: the group
    replays that seeded workload instead of the trace, and ``limit`` applies to it only if the group
    gives its own ``limit``). Parameters
    are CacheConfig fields, EngineOptions fields, CostModel fields, or budget fields (``budget_gib``,
    ``mamba_full_memory_ratio``, ``max_mamba_cache_size``, ``infinite``), or ``peer`` (a name of
    :data:`mamba_radix.peers.PEERS`, or null: applied after the other parameters; a parameter the peer
    would set to another value is refused, as on the command line). Runs with identical parameters in
    several groups are kept once (the first group names them). O(runs).
    """
    if "trace" not in definition or "groups" not in definition:
        raise ConfigError("an experiment definition needs 'trace' and 'groups'")
    trace = (
        str((Path(base_dir) / definition["trace"]).resolve())
        if not os.path.isabs(definition["trace"])
        else definition["trace"]
    )
    base = dict(definition.get("base", {}))
    specs: list[RunSpec] = []
    seen: dict[str, str] = {}
    for group in definition["groups"]:
        name = group.get("name") or f"group{len(seen)}"
        vary: dict[str, list[Any]] = group.get("vary", {})
        keys = list(vary)
        synthetic = group.get("synthetic")
        if synthetic is not None:
            try:
                label = synthetic_label(synthetic)
            except ConfigError as err:
                raise ConfigError(f"group {name!r}: {err}") from None
        for values in itertools.product(*(vary[k] for k in keys)):
            params = base | group.get("fixed", {}) | dict(zip(keys, values, strict=True))
            parts = _split_params(params, f"group {name!r}")
            fingerprint = json.dumps([params, synthetic], sort_keys=True)
            if fingerprint in seen:
                continue
            run_id = f"{len(specs):03d}"
            seen[fingerprint] = run_id
            spec = RunSpec(
                run_id=run_id,
                trace=trace if synthetic is None else label,
                trace_format=definition.get("trace_format", "auto"),
                block_size=definition.get("block_size", 512),
                limit=definition.get("limit") if synthetic is None else group.get("limit"),
                synthetic=synthetic,
                config=parts["config"],
                model=definition.get("model", "kimi-k3"),
                options=parts["options"],
                cost=parts["cost"],
                group=name,
                peer=parts["peer"].get("peer"),
                **parts["budget"],
            )
            try:  # validate early, with the flag name in the message
                spec.validate()
            except ConfigError as err:
                raise ConfigError(f"group {name!r}: {err}") from None
            specs.append(spec)
    return specs
