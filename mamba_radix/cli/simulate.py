"""``mamba-radix simulate``: replay one trace through the real cache under one configuration.

The trace is a file (block/Mooncake or token JSON lines), the bundled Mooncake trace by default, a
seeded synthetic workload (``--synthetic``), or SGLang bench_serving's load test (``--dataset-name random``
with its flags, :mod:`mamba_radix.sim.serving`; ``--max-concurrency`` is its client semaphore, an engine
option). SGLang launch settings come in with ``--config FILE`` (:mod:`mamba_radix.launch_config`), the cost
model from a preset (``--cost-preset``) or a fit to a server log (``--fit-cost-from``), and ``--log-every``
prints the scheduler's lines to stderr. Speculative decoding's settings (:data:`SIZING_ONLY`: ReplaySSM's
rings, the verify window) size the pools as ``plan`` sizes them and do nothing else: speculative decoding
itself is not simulated, and a note on stderr says so when they are given. It prints a summary table
(``--json``: the metrics as JSON), optionally writes the JSON-lines record (``--out``) and one CSV row per
request (``--per-request``); the output files must be new unless ``--force``, and are checked before
anything runs.

A run's flags live here, and how they become one :class:`~mamba_radix.sim.sweep.RunSpec` (validated, so a
bad combination is a one-line error before anything runs): ``sweep`` takes the same flags as lists
(:mod:`mamba_radix.cli.sweep`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mamba_radix.cli._common import (
    LIMIT,
    PROG,
    CliError,
    add_command,
    log_line,
    progress,
    single_threaded_torch,
    warn_rejected,
)
from mamba_radix.flags import int_in

DESCRIPTION = """Replay a trace through the real MambaRadixCache and pools; print the metrics.

Speculative decoding's settings (--enable-linear-replayssm-spec, --linear-replayssm-cache-len,
--speculative-dspark-block-size, --speculative-num-draft-tokens) size the pools only, as plan sizes them
(ReplaySSM's rings in every state slot, or plain speculative decoding's intermediate states): speculative
decoding itself is not simulated."""
EXAMPLES = """examples:
  mamba-radix simulate --limit 2000                       # bundled Mooncake trace, Kimi K3 rank
  mamba-radix simulate --limit 500 --kv-tokens 400000 --state-slots 64 --per-request hits.csv
  mamba-radix simulate --synthetic tree --mode sequential --memory-budget-gb 8 --peer marconi-static
  mamba-radix simulate --trace my.jsonl --trace-format token --out run.jsonl --json
  # SGLang's bench_serving load test against the launch settings in settings.json:
  mamba-radix simulate --dataset-name random --random-input-len 16384 --random-output-len 3072 \
      --num-prompts 128 --max-concurrency 32 --request-rate 4 --config settings.json --log-every 500"""

# where a table flag's value goes (mamba_radix.flags.Flag.where): RunSpec's parts; "sizing" holds the
# speculative sizing inputs (SIZING_ONLY)
PARAM_GROUPS = ("config", "budget", "options", "cost", "peer", "deployment", "sizing")

_BUDGET_KEYS = {
    "memory_budget_gb": "budget_gib",
    "mamba_full_memory_ratio": "mamba_full_memory_ratio",
    "max_mamba_cache_size": "max_mamba_cache_size",
    "kv_tokens": "kv_tokens",
    "state_slots": "state_slots",
}
# Speculative decoding's flags (dests) that size the pools and do nothing else here, and where each goes:
# the ReplaySSM rings are RunSpec's sizing fields, the verify window a CacheConfig field (both read by the
# planner's sizing, mamba_radix.sim.budget); --speculative-dspark-block-size sets the window
# (cli._common.resolve_linked_flags) before this module sees the flags.
SIZING_ONLY = {
    "enable_linear_replayssm_spec": "sizing",
    "linear_replayssm_cache_len": "sizing",
    "speculative_num_draft_tokens": "config",
}


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
        "simulate",
        help="replay one trace under one configuration",
        description=DESCRIPTION,
        examples=EXAMPLES,
    )
    add_trace_arguments(p)
    add_run_arguments(p, "simulate")
    out = p.add_argument_group("output")
    out.add_argument("--out", metavar="FILE", help="write the JSON-lines result record to this new file")
    out.add_argument(
        "--per-request",
        metavar="FILE",
        help="write one CSV row per request to this new file: index, input_len, hit, kv_hit, ideal, ttft_s",
    )
    out.add_argument("--force", action="store_true", help="overwrite --out / --per-request files")
    out.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The trace a run replays (``simulate``, ``sweep``)."""
    from mamba_radix.data import DEFAULT_TRACE

    g = p.add_argument_group("trace")
    g.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help=f"trace file, block (Mooncake) or token JSONL (default: the bundled {DEFAULT_TRACE})",
    )
    g.add_argument(
        "--synthetic",
        choices=["chat", "system-prompt", "agent", "tree"],
        help="use a seeded synthetic workload instead of a trace file",
    )
    g.add_argument(
        "--seed",
        type=int_in(0, 2**63 - 1),
        default=None,
        help="seed of the synthetic workload (default 0), or of --dataset-name's lengths, arrivals and "
        "token ids (default 42, bench_serving's; at most 2**32 - 1)",
    )
    g.add_argument("--trace-format", choices=["auto", "block", "token"], default="auto", help="default auto")
    g.add_argument(
        "--block-size", type=int_in(1, 1 << 20), default=512, help="tokens per block id (default 512)"
    )
    g.add_argument(
        "--block-convention",
        choices=["auto", "ceil", "floor"],
        default="auto",
        help="block traces: ceil (the partial tail block has an id: Mooncake), floor (one id per full "
        "block; the tail becomes fresh tokens), or auto (detected; default)",
    )
    g.add_argument("--limit", type=LIMIT, default=None, metavar="N", help="replay only the first N requests")


def add_run_arguments(p: argparse.ArgumentParser, command: str) -> None:
    """The flag table's flags for ``command`` (:func:`mamba_radix.flags.add_flags`) and the engine's own
    switches (``simulate``, ``sweep``)."""
    from mamba_radix.flags import add_flags

    groups = add_flags(p, command)
    g = groups.get("engine") or p.add_argument_group("engine")
    g.add_argument("--infinite", action="store_true", help="pools nothing fills (the strategy's ideal)")
    g.add_argument("--no-verify-states", action="store_true", help="skip the state-stamp checks (faster)")
    g.add_argument(
        "--adaptive-split",
        action="store_true",
        help="one byte budget for KV and states, the line between them moved as the run goes "
        "(starts at the sized split; page size 1)",
    )
    g.add_argument(
        "--check-invariants-every",
        type=int_in(0, 1 << 31),
        default=0,
        metavar="N",
        help="cache.check_invariants() every N finished requests (default 0 = never)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress output")


# ------------------------------------------------------------------------------------ flags to a spec
def empty_params() -> dict[str, dict[str, Any]]:
    """One empty dict per place a table flag's value goes (:data:`PARAM_GROUPS`)."""
    return {w: {} for w in PARAM_GROUPS}


def params_from_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The given table flags, by where they go (a flag left out is absent: the library default holds),
    and the given :data:`SIZING_ONLY` flags (``sizing``: RunSpec's ReplaySSM fields; the verify window in
    ``config``). O(flags)."""
    from mamba_radix.flags import FLAGS

    out = empty_params()
    for f in FLAGS():
        if f.where in out and hasattr(args, f.dest):
            value = getattr(args, f.dest)
            if value is not None:
                out[f.where][f.dest] = value
    for dest, where in SIZING_ONLY.items():
        value = getattr(args, dest, None)
        if value is not None:
            out[where][dest] = value
    return out


def sizing_note(params: dict[str, dict[str, Any]]) -> str | None:
    """The stderr note for speculative settings that only size the pools (None when none is given):
    which, and that speculative decoding is not simulated. O(1)."""
    given = [f"{dest}={params[where][dest]}" for dest, where in SIZING_ONLY.items() if dest in params[where]]
    if not given:
        return None
    return (
        f"sizing only: {', '.join(given)} size the pools as plan does (ReplaySSM rings in every state slot, "
        "or plain speculative decoding's intermediate states); speculative decoding itself is not simulated"
    )


# the load test's flags (mamba_radix.flags rows of group "workload" that simulate has)
_LOAD_FLAGS = (
    "random_input_len",
    "random_output_len",
    "num_prompts",
    "random_range_ratio",
    "request_rate",
    "request_rate_distribution",
)


def load_test(args: argparse.Namespace) -> Any:
    """bench_serving's random dataset and arrivals (:class:`~mamba_radix.sim.serving.RandomWorkload`) from
    ``--dataset-name`` and its flags (a flag left out takes bench_serving's default; ``--seed`` 42), or
    None without ``--dataset-name``. Its flags without it are an error (they would do nothing)."""
    given = {k: getattr(args, k) for k in _LOAD_FLAGS if getattr(args, k, None) is not None}
    if getattr(args, "dataset_name", None) is None:
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise CliError(f"{flags} shape bench_serving's random dataset: add --dataset-name random")
        return None
    if args.trace or args.synthetic:
        raise CliError("give one of --trace, --synthetic and --dataset-name")
    from mamba_radix.sim.serving import DEFAULT_SEED, RandomWorkload

    return RandomWorkload(**given, seed=DEFAULT_SEED if args.seed is None else args.seed)


def trace_source(args: argparse.Namespace) -> tuple[str, list[Any] | None]:
    """(trace path, in-memory requests for --synthetic and --dataset-name). A missing trace, or a folder,
    is an error now. Side effect: a ``--seed`` left out becomes 0 (the synthetic workloads' default) in
    ``args``, which ``sweep`` then records."""
    from mamba_radix.sim.sweep import resolve_trace, trace_problem

    workload = load_test(args)
    if workload is not None:
        requests = workload.requests()
        return workload.label, requests[: args.limit] if args.limit else requests
    if args.seed is None:
        args.seed = 0
    if args.synthetic:
        if args.trace:
            raise CliError("give either --trace or --synthetic, not both")
        from mamba_radix.sim.synthetic import GENERATORS

        requests = GENERATORS[args.synthetic](seed=args.seed)
        if args.limit:
            requests = requests[: args.limit]
        return f"synthetic:{args.synthetic}:seed={args.seed}", requests
    if args.trace is None:
        from mamba_radix.data import trace_path

        return str(trace_path()), None
    path = (
        args.trace if os.path.isabs(args.trace) or os.path.exists(args.trace) else resolve_trace(args.trace)
    )
    problem = trace_problem(path)
    if problem:
        raise CliError(problem)
    return path, None


def make_spec(
    args: argparse.Namespace,
    run_id: str,
    params: dict[str, dict[str, Any]],
    trace: str,
    synthetic: dict[str, Any] | None = None,
) -> Any:
    """A run spec from the flags; its config (with the peer, if any) is validated here, so a bad
    combination is a one-line error before anything runs (ConfigError, e.g. a flag against --peer)."""
    from mamba_radix.sim.sweep import RunSpec

    options = dict(params["options"])
    _check_engine_options(options)
    if options.get("log_every"):
        options["log"] = log_line
    options["verify_states"] = not args.no_verify_states
    options["check_invariants_every"] = args.check_invariants_every
    if getattr(args, "adaptive_split", False):
        if args.infinite:
            raise CliError("--adaptive-split moves bytes between finite pools; drop --infinite")
        options["split"] = {}
    if params["config"].get("enable_unified_memory"):
        if getattr(args, "adaptive_split", False):
            raise CliError(
                "--enable-unified-memory and --adaptive-split both move the KV/state line; choose one"
            )
        if args.infinite:
            raise CliError("--enable-unified-memory shares a finite byte budget; drop --infinite")
    if getattr(args, "per_request", None):
        options["keep_per_request"] = True
    budget = {_BUDGET_KEYS[k]: v for k, v in params["budget"].items()}
    model = getattr(args, "model", None) or "kimi-k3"
    if "budget_gib" not in budget:
        from mamba_radix.defaults import deployment_for

        budget["budget_gib"] = deployment_for(model).memory_budget_gib
    if args.infinite and ({"kv_tokens", "state_slots", "max_mamba_cache_size"} & set(budget)):
        raise CliError(
            "--infinite sizes the pools itself; drop --kv-tokens/--state-slots/--max-mamba-cache-size"
        )
    spec = RunSpec(
        run_id=run_id,
        trace=trace,
        trace_format=args.trace_format,
        block_size=args.block_size,
        block_convention=args.block_convention,
        limit=args.limit,
        config=params["config"],
        model=model,
        infinite=args.infinite,
        options=options,
        cost=base_cost(args) | params["cost"],
        peer=params["peer"].get("peer"),
        synthetic=synthetic,
        deployment={k: v for k, v in params["deployment"].items() if k != "model"},  # model= above
        **budget,
        **params["sizing"],
    )
    spec.validate()
    return spec


def _check_engine_options(options: dict[str, Any]) -> None:
    """A load-test option this engine lacks (an older :class:`~mamba_radix.sim.engine.EngineOptions`) is a
    one-line error naming its flag, not a TypeError from deep inside. O(options)."""
    from dataclasses import fields

    from mamba_radix.sim.engine import EngineOptions

    known = {f.name for f in fields(EngineOptions)}
    for name in ("max_concurrency", "log_every"):
        if name in options and name not in known:
            flag = "--" + name.replace("_", "-")
            raise CliError(f"{flag} needs the engine's {name} option, which this version's engine lacks")


def base_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The cost model's fields before the explicit cost flags: a preset (``--cost-preset``), a fit to an
    SGLang server log (``--fit-cost-from``, read here), or nothing (the CostModel defaults). Raises
    :class:`CliError` for both at once or a log that cannot be read. O(log lines)."""
    from dataclasses import fields

    preset, log = getattr(args, "cost_preset", None), getattr(args, "fit_cost_from", None)
    if preset is None and log is None:
        return {}
    if preset is not None and log is not None:
        raise CliError("give either --cost-preset or --fit-cost-from, not both")
    if preset is not None:
        from mamba_radix.cost_model import COST_PRESETS  # type: ignore[attr-defined,unused-ignore]

        model = COST_PRESETS[preset]
    else:
        path = Path(log)
        if not path.is_file():
            raise CliError(f"--fit-cost-from: no such file: {path}")
        from mamba_radix.sim.cost_fit import fit_cost_model  # type: ignore[import-not-found,unused-ignore]

        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                model = fit_cost_model(f)
        except OSError as err:
            raise CliError(f"--fit-cost-from {path}: cannot read it: {err.strerror}") from None
    return {f.name: getattr(model, f.name) for f in fields(model) if f.init}


# ------------------------------------------------------------------------------------------ the run
def run(args: argparse.Namespace) -> int:
    single_threaded_torch()
    from mamba_radix.sim.sweep import check_new_file, count_requests, run_one

    out = check_new_file(args.out, args.force) if args.out else None
    per_request = (
        check_new_file(args.per_request, args.force, "per-request file") if args.per_request else None
    )
    if out is not None and per_request is not None and out.resolve() == per_request.resolve():
        raise CliError("--out and --per-request name the same file")
    trace, requests = trace_source(args)
    params = params_from_flags(args)
    spec = make_spec(args, "simulate", params, trace)
    note = sizing_note(params)
    if note:
        sys.stderr.write(f"{PROG} simulate: {note}\n")
    total = len(requests) if requests is not None else count_requests(spec)
    # the scheduler's lines (--log-every) are the progress then: a bar would break them up
    quiet = args.quiet or bool(getattr(args, "log_every", 0))
    with progress(total, 1, "simulate", quiet) as bar:
        rec = run_one(spec, progress=lambda n: bar.update("simulate", n), requests=requests)
        bar.run_done("simulate", total)
    warn_rejected(rec, "simulate")
    rows = rec.pop("per_request", None) if per_request is not None else None
    if out is not None:
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    if per_request is not None:
        _write_per_request(per_request, rows or [])
    if args.json:
        print(json.dumps(rec["metrics"] | {"cache_stats": rec["cache_stats"]}, indent=2))
    else:
        print(_format_summary(rec))
    return 0


def _write_per_request(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import csv

    columns = ["index", "input_len", "hit", "kv_hit", "ideal", "ttft_s"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for row in sorted(rows, key=lambda r: r["index"]):
            w.writerow(row)


def _format_summary(rec: dict[str, Any]) -> str:
    """The table ``simulate`` prints for one record: the cache's figures, then the time lines
    (:func:`mamba_radix.sim.metrics.serving_lines`)."""
    from mamba_radix.sim.metrics import host_tier_lines, serving_lines

    m, pools, stats = rec["metrics"], rec["pools"], rec["cache_stats"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f}%"

    p = rec["params"]
    peer = (
        [
            f"peer                {p['peer']} (admission {p['mamba_checkpoint_admission']}, eviction "
            f"{p['mamba_eviction_order']}, refresh {p['mamba_lru_refresh']}, strategy {p['strategy']})"
        ]
        if p.get("peer")
        else []
    )
    lines = [
        *peer,
        f"requests            {m['requests']}  (input {m['input_tokens']:,} tokens, output {m['output_tokens']:,})",
        f"pools               {pools['kv_tokens']:,} KV tokens, {pools['state_slots']:,} state slots, "
        f"max running {pools['max_running_requests_effective']}",
        *(
            [
                f"checkpoint pool     {pools['checkpoint_slots']:,} quantized checkpoint slots "
                f"({p.get('checkpoint_format')}, {pools['bytes_per_checkpoint_slot']:,} B each; the state slots "
                "above hold running requests only)"
            ]
            if pools.get("checkpoint_slots") and pools.get("bytes_per_checkpoint_slot")
            else []
        ),
        *(
            [
                f"adaptive split      ended at {pools['split_end']['kv_tokens']:,} KV tokens, "
                f"{pools['split_end']['state_slots']:,} state slots (same bytes)"
            ]
            if "split_end" in pools
            else []
        ),
        f"token hit rate      {pct(m['token_hit_rate'])}   (ideal {pct(m['ideal_hit_rate'])}, "
        f"{pct(m['fraction_of_ideal'])} of it)",
        *host_tier_lines(m),  # per-tier hits and bytes moved (none without the host tier)
        f"KV-only matched     {m['kv_only_matched_tokens']:,} tokens",
        f"recomputed          {m['recomputed_tokens']:,} tokens (ideal - hit)",
        f"checkpoints         {stats.get('checkpoints_inserted', '-')} inserted, "
        f"{stats.get('checkpoints_skipped', '-')} skipped, {stats.get('states_evicted', '-')} evicted"
        # the skip-decode-lock risk: a running request's checkpoint evicted under it (0 with the lock)
        + (
            f" ({stats['checkpoints_evicted_while_decoding']} while their request decoded)"
            if stats.get("checkpoints_evicted_while_decoding")
            else ""
        )
        + f", {stats.get('checkpoints_capped', '-')} capped",
        f"state copies        {stats['state_copies']:,} ({stats['state_copy_bytes'] / 2**30:.2f} GiB on the model)",
        f"peak running        {m['peak_running']} (bound by {m['peak_running_bound_by'] or 'arrivals, not a pool'}; "
        f"admission blocked {m['admission_blocked'] or '{}'})",
        *serving_lines(m),  # TTFT once, with the load test's throughput and latencies
        f"wall time           {rec['wall_s']:.2f} s",
    ]
    rejected = stats.get("rejected_requests", 0)
    if rejected:
        lines.insert(
            1 + len(peer),
            f"rejected            {rejected:,} requests that can never fit (longer than the KV pool or a request row)",
        )
    return "\n".join(lines)
