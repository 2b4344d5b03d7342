"""The main job: every registered policy, the offline oracle, the infinite-capacity line and the ideal,
token hit rate against memory, on the bundled workloads, where state slots bind and where KV binds.

A *policy-comparison definition* is a JSON object with ``"kind": "policies"`` (the bundled ``default``,
``mamba_radix/data/experiments/default.json``); :func:`load_policy_definition` checks all of it and
:func:`run_policy_experiment` runs it into a results folder: ``results.jsonl`` (one row per run),
``run_info.json``, ``report.md`` and the plots (:mod:`mamba_radix.experiment_report`, which needs the
``[experiments]`` extra; this module imports no plotting library).

Every run is a sequential replay (one request at a time: exact, order-only comparisons) of one workload
under one policy of :data:`~mamba_radix.policies.registry.POLICIES`, starting from ``extra_buffer`` with
SGLang 0.5.23's rules. Equal memory is equal bytes: the pools of a point are sized exactly
(:func:`mamba_radix.sim.budget.exact_pools`, bytes per KV token and per state slot from the capacity
module at the model's deployment), and every policy at that point gets the same pools. Two regimes per
workload:

- **slots bind**: the KV pool holds every token of the workload (it never evicts); the state slots are
  the points (``slots_bind.state_slots``: the state pool's size, the running requests' slots included);
- **KV binds**: ``kv_binds.slots_per_request`` state slots per request of the workload (plus two requests'
  worth), so slots are never short; the KV pool is the points (``kv_binds.kv_fractions`` of the
  workload's tokens, at least the longest request so that none is rejected; a pool of every token or
  more never evicts, so larger points are cut to that and duplicates dropped).

Lines besides the policies: **infinite**, the same config with pools that never evict
(:func:`mamba_radix.policies.future.demand_hits`: the cache's own ceiling, computed once per workload, and
the demand pass the oracle reads), and **ideal**, the longest previously seen prefix of every request
(any cache's ceiling).

Side effects: reads the traces, writes the results folder, starts ``processes`` worker processes
(:class:`~mamba_radix.sim.runner.Runner`, ``fork``: they inherit the loaded workloads; ``spawn`` on
macOS). Progress: one :class:`~mamba_radix.sim.progress.Progress` counted in requests across all runs
(the runner's progress channel).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, MambaRadixError

__all__ = [
    "KIND",
    "PolicyExperiment",
    "Task",
    "Workload",
    "base_config",
    "is_policy_definition",
    "load_policy_definition",
    "load_requests",
    "memory_points",
    "rerun_policies",
    "run_conversation_target",
    "run_policy_experiment",
    "write_reference",
]

KIND = "policies"
REGIMES = ("slots bind", "KV binds")
BASE_PRESET = "sglang-0.5.23"
SYNTHETIC_GENERATORS = ("chat", "system-prompt", "agent", "tree", "sessions")
# relative CPU cost of a policy's run (pre-passes included), measured on the first 2,000 conversation
# requests: used only to start the longest runs first so that no worker idles at the end
_COST = {"oracle": 3.0, "marconi": 2.0, "sift": 1.5}


def base_config() -> CacheConfig:
    """The config every policy starts from: extra_buffer with SGLang 0.5.23's rules."""
    from mamba_radix.peers import apply_peer

    return apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), BASE_PRESET)


# -------------------------------------------------------------------------------------- definition
@dataclass(frozen=True)
class Workload:
    """One workload of a definition: a trace file (``trace``, ``trace_format``, ``block_size``) or a
    seeded synthetic generator (``synthetic``, ``seed``, ``args``: its keywords as JSON text), its first
    ``limit`` requests (``None``: all), and the points of each regime."""

    name: str
    slot_points: tuple[int, ...]
    kv_fractions: tuple[float, ...]
    slots_per_request: int = 3
    trace: str | None = None
    trace_format: str = "block"
    block_size: int = 512
    synthetic: str | None = None
    seed: int = 0
    args: str = "{}"
    limit: int | None = None

    def describe(self) -> str:
        """``first 2,000 requests of mooncake_conversation_trace.jsonl`` / ``synthetic chat (seed 0)``."""
        if self.synthetic is not None:
            cut = f", first {self.limit:,} requests" if self.limit else ""
            return f"synthetic {self.synthetic} (seed {self.seed}{cut})"
        cut = f"first {self.limit:,} requests of " if self.limit else ""
        return f"{cut}{Path(str(self.trace)).name}"


@dataclass(frozen=True)
class PolicyExperiment:
    """A checked policy-comparison definition (see :func:`load_policy_definition`)."""

    title: str
    description: str
    model: str
    policies: tuple[str, ...]
    workloads: tuple[Workload, ...]
    reference: str | None = None
    base_dir: str = "."
    loss_breakdown: bool = False  # every run probed (mamba_radix.policies.loss_probe): where hits go

    def with_limit(self, limit: int | None) -> PolicyExperiment:
        """Every workload cut to its first ``limit`` requests (``None``: unchanged)."""
        if limit is None:
            return self
        from dataclasses import replace

        cut = tuple(
            replace(w, limit=limit if w.limit is None else min(w.limit, limit)) for w in self.workloads
        )
        return replace(self, workloads=cut)

    def only(self, workloads: Sequence[str] | None, policies: Sequence[str] | None) -> PolicyExperiment:
        """A subset of the workloads and policies (``None``: all). Raises :class:`ConfigError` naming an
        unknown one and what is known."""
        from dataclasses import replace

        names = [w.name for w in self.workloads]
        problems = [
            f"unknown workload {w!r}; known: {', '.join(names)}" for w in workloads or () if w not in names
        ]
        problems += [
            f"unknown policy {p!r}; known: {', '.join(self.policies)}"
            for p in policies or ()
            if p not in self.policies
        ]
        if problems:
            raise ConfigError("; ".join(problems))
        keep_w = tuple(w for w in self.workloads if workloads is None or w.name in workloads)
        keep_p = tuple(p for p in self.policies if policies is None or p in policies)
        return replace(self, workloads=keep_w, policies=keep_p)


_TOP_KEYS = {
    "kind",
    "title",
    "description",
    "model",
    "policies",
    "workloads",
    "reference",
    "loss_breakdown",
}
_WORKLOAD_KEYS = {
    "name",
    "trace",
    "trace_format",
    "block_size",
    "limit",
    "synthetic",
    "slots_bind",
    "kv_binds",
}


def _read_json(path: Path) -> Any:
    from mamba_radix.sim.sweep import load_definition

    return load_definition(path)


def is_policy_definition(path: str | Path) -> bool:
    """Whether the file at ``path`` is a policy-comparison definition (a JSON object with ``"kind":
    "policies"``). False for anything else, a missing or unreadable file included (the caller's loader
    reports those). Reads the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("kind") == KIND


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_workload(i: int, w: Any, base_dir: Path, problems: list[str]) -> Workload | None:
    where = f"workloads[{i}]"
    if not isinstance(w, dict):
        problems.append(f"{where}: a workload is a JSON object")
        return None
    problems += [
        f"{where}: unknown key {k!r}; known: {', '.join(sorted(_WORKLOAD_KEYS))}"
        for k in w
        if k not in _WORKLOAD_KEYS
    ]
    name = w.get("name")
    if not isinstance(name, str) or not name or "/" in name:
        problems.append(f"{where}: 'name' must be a non-empty string without '/'")
        name = f"workload{i}"
    where = f"workload {name!r}"
    n0 = len(problems)
    trace, synthetic = w.get("trace"), w.get("synthetic")
    seed, args = 0, "{}"
    if (trace is None) == (synthetic is None):
        problems.append(f"{where}: give exactly one of 'trace' (a file) and 'synthetic' (a generator)")
    elif trace is not None:
        from mamba_radix.sim.sweep import resolve_trace, trace_problem

        if not isinstance(trace, str):
            problems.append(f"{where}: 'trace' must be a file name or path")
        else:
            trace = resolve_trace(trace, base_dir)
            problem = trace_problem(trace)
            if problem:
                problems.append(f"{where}: {problem}")
    else:
        if not isinstance(synthetic, dict) or synthetic.get("generator") not in SYNTHETIC_GENERATORS:
            problems.append(
                f"{where}: 'synthetic' must be {{\"generator\": one of {', '.join(SYNTHETIC_GENERATORS)}, "
                '"seed": N, "args": {...}}'
            )
        else:
            extra = set(synthetic) - {"generator", "seed", "args"}
            if extra:
                problems.append(
                    f"{where}: unknown synthetic key(s) {sorted(extra)}; known: generator, seed, args"
                )
            seed = synthetic.get("seed", 0)
            if not (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
                problems.append(f"{where}: synthetic seed must be an integer >= 0")
            raw_args = synthetic.get("args", {})
            if not isinstance(raw_args, dict):
                problems.append(f"{where}: synthetic args must be an object (the generator's keywords)")
            else:
                import inspect

                try:  # the keywords are the generator's (their values it checks when it runs)
                    inspect.signature(generators()[synthetic["generator"]]).bind(seed=0, **raw_args)
                except TypeError as exc:
                    problems.append(f"{where}: synthetic args: {exc}")
                args = json.dumps(raw_args, sort_keys=True)
            synthetic = synthetic["generator"]
    fmt = w.get("trace_format", "block")
    if fmt not in ("block", "token", "auto"):
        problems.append(f"{where}: 'trace_format' must be block, token or auto")
    block_size = w.get("block_size", 512)
    if not _positive_int(block_size):
        problems.append(f"{where}: 'block_size' must be a positive integer")
    limit = w.get("limit")
    if limit is not None and not _positive_int(limit):
        problems.append(f"{where}: 'limit' must be a positive integer or null (all requests)")
    sb, kb = w.get("slots_bind"), w.get("kv_binds")
    slots: tuple[int, ...] = ()
    if not (isinstance(sb, dict) and set(sb) == {"state_slots"}):
        problems.append(f"{where}: 'slots_bind' must be {{\"state_slots\": [N, ...]}}")
    else:
        raw = sb["state_slots"]
        if not (isinstance(raw, list) and raw and all(_positive_int(s) for s in raw)):
            problems.append(f"{where}: slots_bind.state_slots must be a non-empty list of positive integers")
        else:
            slots = tuple(sorted(set(raw)))
            spr = base_config().slots_per_request
            if slots[0] < spr:
                problems.append(
                    f"{where}: slots_bind.state_slots {slots[0]} admit no request; give at least {spr}"
                )
    fractions: tuple[float, ...] = ()
    per_request = 3
    if not (
        isinstance(kb, dict) and set(kb) <= {"kv_fractions", "slots_per_request"} and "kv_fractions" in kb
    ):
        problems.append(f'{where}: \'kv_binds\' must be {{"kv_fractions": [f, ...], "slots_per_request": N}}')
    else:
        raw = kb["kv_fractions"]
        ok = isinstance(raw, list) and raw
        ok = ok and all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in raw)
        if not ok:
            problems.append(f"{where}: kv_binds.kv_fractions must be a non-empty list of numbers in (0, 1]")
        else:
            fractions = tuple(sorted({float(f) for f in raw}))
        per_request = kb.get("slots_per_request", 3)
        if not _positive_int(per_request):
            problems.append(f"{where}: kv_binds.slots_per_request must be a positive integer")
    if len(problems) > n0:
        return None
    return Workload(
        name=name,
        slot_points=slots,
        kv_fractions=fractions,
        slots_per_request=per_request,
        trace=trace,
        trace_format=fmt,
        block_size=block_size,
        synthetic=synthetic,
        seed=seed,
        args=args,
        limit=limit,
    )


def load_policy_definition(path: str | Path) -> PolicyExperiment:
    """Read and check a policy-comparison definition. Keys: ``kind`` (``"policies"``), ``title``,
    ``description``, ``model`` (a capacity preset, default ``kimi-k3``), ``policies`` (names of
    :data:`~mamba_radix.policies.registry.POLICIES`, or ``"all"``: every registered one, in registry
    order), ``reference`` (a results file beside the definition, for the comparison; optional) and
    ``workloads`` (each: ``name``, ``trace`` with ``trace_format``/``block_size``, or ``synthetic``:
    ``{"generator", "seed", "args"}``; ``limit``; ``slots_bind: {"state_slots": [...]}``; ``kv_binds:
    {"kv_fractions": [...], "slots_per_request": 3}``) and ``loss_breakdown`` (optional, false: every run
    probed, :mod:`mamba_radix.policies.loss_probe`, and the report splits each policy's loss against the
    oracle by cause and checkpoint kind).

    Raises :class:`~mamba_radix.sim.sweep.DefinitionError` with one line per problem (all found before
    anything runs), :class:`ConfigError` for a file that is missing or not JSON. Reads the file and
    checks that trace files exist; no other side effects."""
    from mamba_radix.policies.registry import POLICIES, VARIANTS
    from mamba_radix.sim.sweep import DefinitionError

    p = Path(path)
    data = _read_json(p)
    problems: list[str] = []
    if data.get("kind") != KIND:
        problems.append(f'{p}: not a policy-comparison definition (it needs "kind": "{KIND}")')
    problems += [
        f"unknown key {k!r}; known: {', '.join(sorted(_TOP_KEYS))}" for k in data if k not in _TOP_KEYS
    ]
    model = data.get("model", "kimi-k3")
    try:
        from mamba_radix.sim.budget import model_bytes

        model_bytes(model)
    except (MambaRadixError, TypeError, ValueError) as exc:
        problems.append(f"model {model!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    raw_policies = data.get("policies", "all")
    if raw_policies == "all":
        policies = tuple(POLICIES)
    elif isinstance(raw_policies, list) and raw_policies and all(isinstance(x, str) for x in raw_policies):
        unknown = [x for x in raw_policies if x not in POLICIES and x not in VARIANTS]
        problems += [f"unknown policy {x!r}; known: {', '.join([*POLICIES, *VARIANTS])}" for x in unknown]
        policies = tuple(dict.fromkeys(raw_policies))
    else:
        problems.append("'policies' must be \"all\" or a non-empty list of policy names")
        policies = ()
    if "oracle" not in policies and policies:
        problems.append("'policies' must include 'oracle': the report gives every policy as a fraction of it")
    raw_workloads = data.get("workloads")
    workloads: list[Workload] = []
    if not (isinstance(raw_workloads, list) and raw_workloads):
        problems.append("'workloads' must be a non-empty list")
    else:
        for i, w in enumerate(raw_workloads):
            checked = _check_workload(i, w, p.parent, problems)
            if checked is not None:
                workloads.append(checked)
        names = [w.name for w in workloads]
        problems += [
            f"workload name {n!r} appears twice" for n in sorted({n for n in names if names.count(n) > 1})
        ]
    reference = data.get("reference")
    if reference is not None and not isinstance(reference, str):
        problems.append("'reference' must be a file name (beside the definition) or null")
    for key in ("title", "description"):
        if not isinstance(data.get(key, ""), str):
            problems.append(f"'{key}' must be a string")
    loss_breakdown = data.get("loss_breakdown", False)
    if not isinstance(loss_breakdown, bool):
        problems.append("'loss_breakdown' must be true or false")
    if problems:
        raise DefinitionError(problems)
    return PolicyExperiment(
        title=data.get("title", "Policies against the offline oracle"),
        description=data.get("description", ""),
        model=model,
        policies=policies,
        workloads=tuple(workloads),
        reference=reference,
        base_dir=str(p.parent),
        loss_breakdown=loss_breakdown,
    )


# -------------------------------------------------------------------------------------------- plan
def generators() -> dict[str, Callable[..., list[Any]]]:
    """The synthetic generators a definition may name: the four of :mod:`mamba_radix.sim.synthetic` and
    ``sessions`` (:func:`mamba_radix.sim.sessions.session_chat`, fitted to the conversation trace)."""
    from mamba_radix.sim.sessions import session_chat
    from mamba_radix.sim.synthetic import GENERATORS

    return {**GENERATORS, "sessions": session_chat}


_REQUESTS: dict[Workload, tuple[Any, ...]] = {}


def load_requests(workload: Workload) -> tuple[Any, ...]:
    """The requests of ``workload`` (its first ``limit``), memoised per process (a worker loads each
    workload once). O(requests) the first time."""
    cached = _REQUESTS.get(workload)
    if cached is not None:
        return cached
    if workload.synthetic is not None:
        requests = tuple(generators()[workload.synthetic](seed=workload.seed, **json.loads(workload.args)))
        if workload.limit:
            requests = requests[: workload.limit]
    else:
        from mamba_radix.sim.traces import iter_trace

        requests = tuple(
            iter_trace(str(workload.trace), workload.trace_format, workload.block_size, workload.limit)  # type: ignore[arg-type]
        )
    if not requests:
        raise ConfigError(f"workload {workload.name!r} has no requests; check its trace or limit")
    _REQUESTS[workload] = requests
    return requests


def workload_tokens(requests: Sequence[Any]) -> int:
    """Every token the workload's requests hold (inputs and outputs): a KV pool this large never evicts."""
    return sum(r.input_len + r.output_len for r in requests)


def memory_points(workload: Workload, requests: Sequence[Any], model: str) -> dict[str, list[Any]]:
    """The :class:`~mamba_radix.sim.budget.PoolSizes` of each regime's points (see the module docstring),
    in increasing order of the pool the regime varies. No side effects."""
    from mamba_radix.sim.budget import exact_pools

    config = base_config()
    every = workload_tokens(requests) + 1
    longest = max(r.input_len + r.output_len for r in requests) + 1
    ample = workload.slots_per_request * len(requests) + 2 * config.slots_per_request
    slots = [exact_pools(config, every, s, model) for s in workload.slot_points]
    kv_sizes = sorted({min(every, max(longest, int(every * f))) for f in workload.kv_fractions})
    kv = [exact_pools(config, k, ample, model) for k in kv_sizes]
    return {"slots bind": slots, "KV binds": kv}


@dataclass(frozen=True)
class Task:
    """One run: ``policy`` on ``workload`` at point ``point`` of ``regime``, on ``pools``."""

    run_id: str
    workload: Workload
    regime: str
    point: int
    policy: str
    pools: Any
    model: str
    demands: tuple[int, ...] | None = None
    loss_breakdown: bool = False  # probe the run (then ``demands`` is given for every policy)


# ------------------------------------------------------------------------------------------ workers
def _run_demands(workload: Workload, progress: Callable[[int], None] | None, model: str) -> list[int]:
    """The infinite-capacity hits of every request (:func:`demand_hits`); no progress (the demand pass
    counts as one run, done when it returns)."""
    from mamba_radix.policies.future import demand_hits

    del progress
    return demand_hits(base_config(), load_requests(workload), model)


def _run_task(task: Task, on_finish: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One policy run; returns its result row (without the infinite line, added by the caller)."""
    from mamba_radix.policies.registry import PolicyContext, find_spec, run_policy

    requests = load_requests(task.workload)
    config = base_config()
    demands = {config: list(task.demands)} if task.demands is not None else {}
    ctx = PolicyContext(requests, task.pools, task.model, demands=demands)
    start, cpu = time.perf_counter(), time.process_time()
    probe = list(task.demands) if task.loss_breakdown and task.demands is not None else None
    result = run_policy(task.policy, config, ctx, on_finish=on_finish, loss_demands=probe)
    pools = task.pools
    gib = 1 << 30
    return {
        "run_id": task.run_id,
        "workload": task.workload.name,
        "regime": task.regime,
        "point": task.point,
        "policy": task.policy,
        "family": find_spec(task.policy).family,  # type: ignore[union-attr]
        "kv_tokens": pools.kv_tokens,
        "state_slots": pools.state_slots,
        "bytes_per_kv_token": pools.bytes_per_kv_token,
        "bytes_per_state_slot": pools.bytes_per_state_slot,
        "kv_gib": round(pools.kv_tokens * pools.bytes_per_kv_token / gib, 4),
        "state_gib": round(pools.state_slots * pools.bytes_per_state_slot / gib, 4),
        "memory_gib": round(pools.budget_gib, 4),
        "requests": len(requests),
        "input_tokens": sum(r.input_len for r in requests),
        "token_hit_rate": result["token_hit_rate"],
        "ideal_hit_rate": result["ideal_hit_rate"],
        "stats": result["stats"],
        "notes": result["notes"],
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        **({"loss": result["loss"]} if "loss" in result else {}),
    }


# --------------------------------------------------------------------------------------------- run
def new_results_folder(root: str | Path, name: str) -> Path:
    """A new folder ``root/NAME-YYYYmmddTHHMMSSZ`` (``-2``, ``-3`` ... when two runs start within a
    second); not created."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = Path(root) / f"{name}-{stamp}"
    n = 2
    while path.exists():
        path, n = Path(root) / f"{name}-{stamp}-{n}", n + 1
    return path


def plan_tasks(experiment: PolicyExperiment) -> tuple[dict[str, int], list[tuple[Workload, str, int, Any]]]:
    """(requests per workload, the (workload, regime, point index, pools) of every point). Loads the
    workloads (memoised)."""
    sizes: dict[str, int] = {}
    plan: list[tuple[Workload, str, int, Any]] = []
    for w in experiment.workloads:
        requests = load_requests(w)
        sizes[w.name] = len(requests)
        for regime, pools in memory_points(w, requests, experiment.model).items():
            plan += [(w, regime, i, p) for i, p in enumerate(pools)]
    return sizes, plan


def run_policy_experiment(
    experiment: PolicyExperiment,
    out: str | Path,
    *,
    processes: int = 2,
    quiet: bool = False,
    command: str = "",
    every_s: float | None = None,
) -> dict[str, Any]:
    """Run ``experiment`` into the folder ``out`` (created; the caller checks it is new or may be
    overwritten) and return its ``run_info``. Writes ``results.jsonl`` (rows sorted by workload, regime,
    point, policy), ``run_info.json``, and, when matplotlib is installed, ``report.md`` and the plots
    (:func:`mamba_radix.experiment_report.write_all`; without it, only the report). Runs in
    ``processes`` worker processes (1: in this one). Progress on stderr unless ``quiet``.

    Cost: one demand pass per workload plus one replay per (point, policy)."""
    from mamba_radix.sim.progress import Progress
    from mamba_radix.sim.runner import Runner

    folder = Path(out)
    started = time.time()
    sizes, plan = plan_tasks(experiment)  # a workload that cannot load fails here, before any file exists
    folder.mkdir(parents=True, exist_ok=True)
    total_runs = len(experiment.workloads) + len(plan) * len(experiment.policies)
    total_requests = sum(sizes.values()) + sum(sizes[w.name] for w, *_ in plan) * len(experiment.policies)
    every = every_s if every_s is not None else float(os.environ.get("MAMBA_RADIX_PROGRESS_EVERY_S", "30"))
    if not quiet:
        sys.stderr.write(
            f"mamba-radix experiment: {len(experiment.policies)} policies x {len(plan)} memory points on "
            f"{len(experiment.workloads)} workloads ({total_runs} runs, {total_requests:,} requests), "
            f"{processes} process{'es' if processes > 1 else ''}; writing {folder}\n"
        )
    rows: list[dict[str, Any]] = []
    infinite: dict[str, float] = {}
    # forked workers inherit the workloads plan_tasks loaded (spawned on macOS: they load them again)
    start_method = "spawn" if sys.platform == "darwin" else "fork"
    with (
        Progress(total_requests, total_runs, "experiment", quiet=quiet, every_s=every) as progress,
        Runner("local", processes, start_method=start_method, on_progress=progress.update) as runner,
    ):  # an error or Ctrl-C leaves the runner first: it stops the workers now, not after their runs
        hits = runner.run(
            experiment.workloads,
            functools.partial(_run_demands, model=experiment.model),
            ids=[f"{w.name}/infinite" for w in experiment.workloads],
        )
        demands: dict[str, list[int]] = {}
        for w, workload_hits in zip(experiment.workloads, hits, strict=True):
            demands[w.name] = workload_hits
            infinite[w.name] = sum(workload_hits) / max(1, sum(r.input_len for r in load_requests(w)))
            progress.run_done(f"{w.name}/infinite", sizes[w.name])
        tasks = [
            Task(
                f"{w.name}/{regime}/{i}/{p}",
                w,
                regime,
                i,
                p,
                pools,
                experiment.model,
                tuple(demands[w.name]) if p == "oracle" or experiment.loss_breakdown else None,
                experiment.loss_breakdown,
            )
            for w, regime, i, pools in plan
            for p in experiment.policies
        ]
        # longest first (tokens x the policy's relative cost): the last runs to finish are short ones
        weight = {w.name: workload_tokens(load_requests(w)) for w in experiment.workloads}
        with open(folder / "results.jsonl", "w", encoding="utf-8") as fh:

            def done(task: Task, row: dict[str, Any]) -> None:
                row["infinite_hit_rate"] = infinite[task.workload.name]
                rows.append(row)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                progress.run_done(task.run_id, sizes[task.workload.name])

            runner.run(
                tasks,
                _run_task,
                first=lambda t: -weight[t.workload.name] * _COST.get(t.policy, 1.0),
                on_result=done,
            )
    rows.sort(key=row_order(experiment))
    with open(folder / "results.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    from mamba_radix import __version__

    info = {
        "kind": KIND,
        "title": experiment.title,
        "command": command or "mamba-radix experiment",
        "wall_s": round(time.time() - started, 1),
        "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
        "processes": processes,
        "runs": len(rows) + len(experiment.workloads),
        "model": experiment.model,
        "policies": list(experiment.policies),
        "workloads": {
            w.name: {"requests": sizes[w.name], "source": w.describe()} for w in experiment.workloads
        },
        "infinite_hit_rate": infinite,
        "reference": experiment.reference,
        "version": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (folder / "run_info.json").write_text(json.dumps(info, indent=2) + "\n")
    from mamba_radix.experiment_report import write_all

    write_all(folder, rows, info, reference_rows(experiment))
    return info


def row_order(experiment: PolicyExperiment | None = None) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """Sort key of result rows: the definition's workload order, then regime, point, policy order."""
    workloads = [w.name for w in experiment.workloads] if experiment else []
    policies = list(experiment.policies) if experiment else []

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        w = workloads.index(r["workload"]) if r["workload"] in workloads else len(workloads)
        p = policies.index(r["policy"]) if r["policy"] in policies else len(policies)
        return (w, r["workload"], REGIMES.index(r["regime"]), r["point"], p, r["policy"])

    return key


# ------------------------------------------------------------------------------------ reference rows
REFERENCE_FIELDS = (
    "workload",
    "regime",
    "point",
    "policy",
    "kv_tokens",
    "state_slots",
    "requests",
    "token_hit_rate",
    "ideal_hit_rate",
    "infinite_hit_rate",
)


def write_reference(results: str | Path, out: str | Path) -> int:
    """Write the compact reference of a results file: each row's :data:`REFERENCE_FIELDS` only (what a
    later run is compared on), sorted. Returns the number of rows. Overwrites ``out``."""
    rows = [
        json.loads(line) for line in Path(results).read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    rows.sort(key=row_order())
    with open(out, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({k: r.get(k) for k in REFERENCE_FIELDS}) + "\n" for r in rows)
    return len(rows)


def reference_rows(experiment: PolicyExperiment) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the definition's reference rows, its name), ``(None, name + " (not found)")`` when the file is
    missing, ``(None, None)`` when the definition names none. Reads the file."""
    if not experiment.reference:
        return None, None
    path = Path(experiment.reference)
    if not path.is_absolute():
        path = Path(experiment.base_dir) / path
    if not path.is_file():
        return None, f"{experiment.reference} (not found)"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows, experiment.reference


def replot(folder: str | Path, experiment: PolicyExperiment | None = None) -> Path:
    """Redraw ``report.md`` and the plots of an existing results folder from its ``results.jsonl`` and
    ``run_info.json`` (compared with ``experiment``'s reference when given). Returns the report's path.
    Raises :class:`ConfigError` when the folder holds no results."""
    path = Path(folder)
    results, info_path = path / "results.jsonl", path / "run_info.json"
    if not results.is_file() or not info_path.is_file():
        raise ConfigError(
            f"no results to report in {path} (results.jsonl, run_info.json); run the experiment first"
        )
    rows = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines() if line.strip()]
    info = json.loads(info_path.read_text(encoding="utf-8"))
    from mamba_radix.experiment_report import write_all

    ref = reference_rows(experiment) if experiment is not None else (None, None)
    return write_all(path, rows, info, ref)


def rerun_policies(
    folder: str | Path,
    experiment: PolicyExperiment,
    policies: Sequence[str],
    *,
    processes: int = 2,
    quiet: bool = False,
    command: str = "",
) -> dict[str, Any]:
    """Re-run only ``policies`` of an existing results folder (for example after a change to one policy)
    and merge: the folder's rows of the other policies stay, the re-run policies' rows are replaced, and
    ``report.md`` and the plots are redrawn (compared with ``experiment``'s reference, as a full run is).
    ``run_info.json`` keeps the full run's figures and lists the re-run under ``reruns`` (policies,
    command, wall and CPU seconds, time), so the report says which rows are newer.

    Raises :class:`ConfigError`, before running anything, when the folder holds no results, or other
    workloads or request counts than ``experiment`` (the kept rows would not be comparable), or a policy
    is not in ``experiment``. Side effects: rewrites the folder's files. Cost: the re-run policies' runs
    plus one demand pass per workload."""
    import shutil
    import tempfile

    path = Path(folder)
    results, info_path = path / "results.jsonl", path / "run_info.json"
    if not results.is_file() or not info_path.is_file():
        raise ConfigError(
            f"no results to merge into in {path} (results.jsonl, run_info.json); run the whole experiment first"
        )
    unknown = [p for p in policies if p not in experiment.policies]
    if unknown or not policies:
        raise ConfigError(
            f"policies to re-run {list(policies)} must be some of {', '.join(experiment.policies)}"
        )
    info = json.loads(info_path.read_text(encoding="utf-8"))
    sizes = {w.name: len(load_requests(w)) for w in experiment.workloads}
    had = {w: v["requests"] if isinstance(v, dict) else v for w, v in info.get("workloads", {}).items()}
    if had != sizes:
        raise ConfigError(
            f"{path} holds workloads {had}, the definition gives {sizes}: re-run the whole experiment instead"
        )
    kept = [
        r
        for r in (json.loads(x) for x in results.read_text(encoding="utf-8").splitlines() if x.strip())
        if r["policy"] not in policies
    ]
    with tempfile.TemporaryDirectory(prefix="rerun-") as tmp:
        part = run_policy_experiment(
            experiment.only(None, policies),
            Path(tmp) / "part",
            processes=processes,
            quiet=quiet,
            command=command,
        )
        new = [
            json.loads(x)
            for x in (Path(tmp) / "part" / "results.jsonl").read_text(encoding="utf-8").splitlines()
        ]
        shutil.rmtree(Path(tmp) / "part")
    rows = sorted(kept + new, key=row_order(experiment))
    with open(results, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    rerun = {k: part[k] for k in ("command", "wall_s", "cpu_s", "utc", "version")}
    info["reruns"] = [*info.get("reruns", []), dict(rerun, policies=list(policies), runs=len(new))]
    # a policy new to the folder joins the list in the definition's order (the report's column order)
    present = {r["policy"] for r in rows}
    info["policies"] = [p for p in experiment.policies if p in present]
    info["cpu_s"] = round(sum(r["cpu_s"] for r in rows), 1)
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    from mamba_radix.experiment_report import write_all

    write_all(path, rows, info, reference_rows(experiment))
    return info


# --------------------------------------------------------------------------------- the target check
TARGET_POLICIES = ("sglang-0.5.20", "sglang-0.5.23", "sift", "sift2", "sift3", "oracle")


def run_conversation_target(
    out: str | Path,
    *,
    requests: int = 2000,
    kv_tokens: int = 8_000_000,
    slots: Sequence[int] = (1024, 256),
    policies: Sequence[str] = TARGET_POLICIES,
    model: str = "kimi-k3",
    quiet: bool = False,
) -> Path:
    """The issue's target check: the first ``requests`` requests of the bundled conversation trace,
    sequential, extra_buffer, ``kv_tokens`` KV tokens and each slot count, under each policy. Writes
    ``target.jsonl`` and ``target.md`` (hit rates, and the gap to the oracle each of our policies
    closes against sglang-0.5.23) into the folder ``out`` (created) and returns it. One process; 5-20 s per run."""
    from mamba_radix.data import trace_path
    from mamba_radix.policies.future import demand_hits
    from mamba_radix.policies.registry import PolicyContext, run_policy
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.progress import Progress

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    conv = Workload("conversation", (), (), trace=str(trace_path()), limit=requests)
    reqs = load_requests(conv)
    config = base_config()
    rows: list[dict[str, Any]] = []
    total = len(reqs) * (len(slots) * len(policies) + 1)
    with Progress(total, len(slots) * len(policies) + 1, "target", quiet=quiet) as progress:
        demands = {config: demand_hits(config, reqs, model)}
        progress.run_done("infinite", len(reqs))
        for s in slots:
            for p in policies:
                run_id = f"{s}/{p}"
                ctx = PolicyContext(reqs, exact_pools(config, kv_tokens, s, model), model, demands=demands)
                cpu = time.process_time()
                result = run_policy(p, config, ctx, on_finish=lambda n, r=run_id: progress.update(r, n))
                progress.run_done(run_id, len(reqs))
                rows.append(
                    {
                        "slots": s,
                        "kv_tokens": kv_tokens,
                        "policy": p,
                        "token_hit_rate": result["token_hit_rate"],
                        "cpu_s": round(time.process_time() - cpu, 1),
                        "checkpoints_declined": result["stats"].get("checkpoints_declined"),
                    }
                )
    with open(folder / "target.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    lines = [
        f"# First {requests} conversation requests, {kv_tokens:,} KV tokens, sequential, extra_buffer",
        "",
        "| slots | " + " | ".join(policies) + " | gap closed vs sglang-0.5.23 |",
        "|---|" + "---|" * (len(policies) + 1),
    ]
    for s in slots:
        at = {r["policy"]: r["token_hit_rate"] for r in rows if r["slots"] == s}
        base, best = at.get("sglang-0.5.23"), at.get("oracle")
        ours = [p for p in policies if p.startswith("sift") and p in at]
        closed = ""
        if base is not None and best is not None and best > base:
            closed = ", ".join(f"{p} {100 * (at[p] - base) / (best - base):.0f}%" for p in ours)
        lines.append(f"| {s} | " + " | ".join(f"{at[p]:.4f}" for p in policies) + f" | {closed} |")
    (folder / "target.md").write_text("\n".join(lines) + "\n")
    return folder
