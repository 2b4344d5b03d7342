"""The ``mamba-radix`` command line: ``simulate``, ``sweep``, ``experiment`` and ``plan``.

- ``simulate``: replay one trace (a file, the bundled Mooncake trace by default, or a seeded synthetic
  workload) through the real cache under one configuration; prints a summary, optionally writes the
  JSON-lines record (``--out``) and one row per request (``--per-request``).
- ``sweep``: the same flags, but every sweepable flag takes a comma-separated list; the cartesian product
  runs in ``--jobs`` local processes or as Ray tasks (``--backend ray``); or ``--definition`` runs an
  experiment definition. Results as JSON lines, optionally a markdown report with plots (``--report``).
- ``experiment``: an experiment definition into a new results folder: ``results.jsonl``, ``report.md``
  (compared with the definition's reference results) and PNG plots. The bundled ``default`` is the main
  job, the policy comparison (:mod:`mamba_radix.experiment`): every registered policy, the offline oracle,
  the infinite-capacity line and the ideal, hit rate against memory where state slots bind and where KV
  binds, on the Mooncake conversation trace and four synthetic workloads. Other bundled definitions
  (``sglang-knobs``: SGLang's knobs one at a time in timed mode; ``peers``) are sweeps of run
  parameters (:func:`mamba_radix.sim.sweep.expand_definition`).
- ``plan``: the capacity planner (:mod:`mamba_radix.capacity.cli`).

Flags come from one table (:mod:`mamba_radix.flags`), with SGLang's server-argument names where one
exists; ``plan`` and ``simulate`` share the model's deployment defaults (:mod:`mamba_radix.defaults`).

Nothing is overwritten silently: ``--out`` files and folders must be new unless ``--force``, and output
paths are checked before anything runs. Errors of the library (:class:`~mamba_radix.errors.MambaRadixError`)
and bad flags are one line on stderr (a definition's problems one line each) and exit code 2; anything
else is a bug and shows its traceback. Progress (in requests, across all runs, with rate and ETA) goes to
stderr: a bar on a terminal, a line every 30 s otherwise, nothing with ``--quiet``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from mamba_radix.errors import MambaRadixError
from mamba_radix.flags import int_in

__all__ = ["main"]

PROG = "mamba-radix"
DEFAULT_RESULTS_DIR = "mamba-radix-results"
EXTRA_HINT = 'pip install "mamba-radix[experiments]"'


class CliError(MambaRadixError):
    """A user error found by the command line itself: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``prog: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the examples' line breaks."""


# --------------------------------------------------------------------------------------- flag types
_LIMIT = int_in(1, 1 << 31)
_JOBS = int_in(1, 1024)


def _names(text: str) -> list[str]:
    """A comma-separated list of names (``chat,tree``); empty items are an error."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


EXAMPLES = {
    "simulate": """examples:
  mamba-radix simulate --limit 2000                       # bundled Mooncake trace, Kimi K3 rank
  mamba-radix simulate --limit 500 --kv-tokens 400000 --state-slots 64 --per-request hits.csv
  mamba-radix simulate --synthetic tree --mode sequential --memory-budget-gb 8 --peer marconi
  mamba-radix simulate --trace my.jsonl --trace-format token --out run.jsonl --json""",
    "sweep": """examples:
  mamba-radix sweep --limit 1000 --mamba-radix-cache-strategy no_buffer,extra_buffer \\
      --memory-budget-gb 27.25,54.5 --out sweep.jsonl --report sweep-report
  mamba-radix sweep --definition experiments/peers.json --out peers.jsonl --jobs 4
  mamba-radix sweep --limit 1000 --mamba-track-interval 128,256,512 --out s.jsonl \\
      --backend ray --ray-address ray://head:10001
  mamba-radix sweep --limit 500 --mamba-max-states-per-path=-1,1,4 --out caps.jsonl
      (a list that starts with a negative number needs the = form)""",
    "experiment": """examples:
  mamba-radix experiment                       # the main job: policies vs the oracle, a new folder
  mamba-radix experiment --limit 200 --out quick --workloads chat,tree --policies sglang-0.5.23,sift,oracle
  mamba-radix experiment --definition sglang-knobs --results-dir experiments/results   # the old default
  mamba-radix experiment --definition peers
  mamba-radix experiment --out quick --report-only         # redraw report.md and plots""",
    "plan": """examples:
  mamba-radix plan --model kimi-k3 --memory-budget-gb 27.25
  mamba-radix plan --model kimi-k3 --memory-budget-gb 27.25 --input-len 12000 --output-len 300
  mamba-radix plan --model qwen3-next-80b-a3b --gpu-memory-gb 80 --weights-gb 40 --tp-size 2""",
}


def _add_trace_arguments(p: argparse.ArgumentParser) -> None:
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
        "--seed", type=int_in(0, 2**63 - 1), default=0, help="seed of the synthetic workload (default 0)"
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
    g.add_argument("--limit", type=_LIMIT, default=None, metavar="N", help="replay only the first N requests")


def _add_run_arguments(p: argparse.ArgumentParser, command: str) -> None:
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


def _add_backend_arguments(p: argparse.ArgumentParser) -> None:
    from mamba_radix.sim.ray_backend import RAY_ADDRESS_ENV

    g = p.add_argument_group("where the runs go")
    g.add_argument("--jobs", type=_JOBS, default=2, help="local worker processes (default 2)")
    g.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: a process pool here (default); ray: each run a Ray task (needs the [ray] extra)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help=f"Ray cluster to use (default ${RAY_ADDRESS_ENV}, else a local instance)",
    )


def build_parser() -> argparse.ArgumentParser:
    from mamba_radix import __version__

    parser = _Parser(
        prog=PROG,
        description="Mamba-aware radix prefix cache: simulator, sweeps, experiments, capacity planner.",
        epilog="run `mamba-radix COMMAND --help` for a command's flags and examples",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{simulate,sweep,experiment,plan}", parser_class=_Parser
    )

    sim = sub.add_parser(
        "simulate",
        help="replay one trace under one configuration",
        description="Replay a trace through the real MambaRadixCache and pools; print the metrics.",
        epilog=EXAMPLES["simulate"],
        formatter_class=_Help,
    )
    _add_trace_arguments(sim)
    _add_run_arguments(sim, "simulate")
    out = sim.add_argument_group("output")
    out.add_argument("--out", metavar="FILE", help="write the JSON-lines result record to this new file")
    out.add_argument(
        "--per-request",
        metavar="FILE",
        help="write one CSV row per request to this new file: index, input_len, hit, kv_hit, ideal, ttft_s",
    )
    out.add_argument("--force", action="store_true", help="overwrite --out / --per-request files")
    out.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")

    sw = sub.add_parser(
        "sweep",
        help="run many configurations (local processes or Ray)",
        description=(
            "Cartesian product of comma-separated flag values (or an experiment --definition), run in --jobs "
            "processes or on Ray; results as JSON lines, streamed as runs finish."
        ),
        epilog=EXAMPLES["sweep"],
        formatter_class=_Help,
    )
    _add_trace_arguments(sw)
    _add_run_arguments(sw, "sweep")
    _add_backend_arguments(sw)
    o = sw.add_argument_group("output")
    o.add_argument(
        "--definition", metavar="FILE", help="an experiment definition (a JSON file or a bundled name)"
    )
    o.add_argument(
        "--out", required=True, metavar="FILE", help="results JSON-lines file to write (a new file)"
    )
    o.add_argument("--report", metavar="DIR", help="also write report.md with plots into this new folder")
    o.add_argument("--force", action="store_true", help="overwrite an existing --out file / --report folder")

    ex = sub.add_parser(
        "experiment",
        help="an experiment definition into a new results folder (report with tables and plots)",
        description=(
            "Run an experiment definition into a new folder: results.jsonl, run_info.json, report.md (compared "
            "with the definition's reference results) and PNG plots. The default, the bundled `default`, is the "
            "main job: every registered policy, the offline oracle, the infinite-capacity line and the ideal, "
            "token hit rate against memory (log scale) where state slots bind and where KV binds, at equal bytes "
            "(Kimi K3), on the first 2,000 requests of the Mooncake conversation trace and four synthetic "
            "workloads; about 400 CPU-seconds of runs: 211 s measured on 2 idle cores, 17 minutes on a loaded one. "
            "`--definition sglang-knobs` runs the former default "
            "(SGLang's knobs one at a time, timed mode, 10,000 requests)."
        ),
        epilog=EXAMPLES["experiment"],
        formatter_class=_Help,
    )
    from mamba_radix.data import bundled_definitions

    ex.add_argument(
        "--definition",
        default="default",
        metavar="NAME|FILE",
        help=f"a bundled definition ({', '.join(bundled_definitions())}) or a JSON file (default: default)",
    )
    ex.add_argument(
        "--out", metavar="DIR", help="the results folder (new or empty; default: a new one in --results-dir)"
    )
    ex.add_argument(
        "--results-dir",
        default=DEFAULT_RESULTS_DIR,
        metavar="DIR",
        help=f"where a run without --out makes its folder NAME-YYYYmmddTHHMMSSZ (default ./{DEFAULT_RESULTS_DIR})",
    )
    ex.add_argument("--force", action="store_true", help="write into a non-empty --out folder (overwrites)")
    ex.add_argument(
        "--limit",
        type=_LIMIT,
        default=None,
        metavar="N",
        help="override the definition's request count (policy comparisons: at most N requests per workload)",
    )
    ex.add_argument(
        "--workloads",
        type=_names,
        default=None,
        metavar="A,B",
        help="policy comparisons only: run only these workloads of the definition (default all)",
    )
    ex.add_argument(
        "--policies",
        type=_names,
        default=None,
        metavar="A,B",
        help="policy comparisons only: run only these policies of the definition (default all; keep oracle)",
    )
    ex.add_argument("--quiet", action="store_true", help="no progress output")
    ex.add_argument(
        "--report-only", action="store_true", help="redraw report.md and the plots from --out's results.jsonl"
    )
    _add_backend_arguments(ex)

    pl = sub.add_parser(
        "plan",
        help="capacity planner: split GPU memory between KV and state slots",
        description="Size the full-KV and state pools of a hybrid model as SGLang does, and recommend a split.",
        epilog=EXAMPLES["plan"],
        formatter_class=_Help,
    )
    from mamba_radix.capacity.cli import add_plan_arguments

    add_plan_arguments(pl)
    return parser


# -------------------------------------------------------------------------------------------- helpers
def _need_experiments_extra(what: str) -> None:
    """Fail now (before any run) when the plotting extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError(f"{what} draws plots and needs the [experiments] extra: {EXTRA_HINT}") from None


def _params_from_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The given table flags, by where they go (a flag left out is absent: the library default holds)."""
    from mamba_radix.flags import FLAGS

    out: dict[str, dict[str, Any]] = {
        w: {} for w in ("config", "budget", "options", "cost", "peer", "deployment")
    }
    for f in FLAGS():
        if f.where in out and hasattr(args, f.dest):
            value = getattr(args, f.dest)
            if value is not None:
                out[f.where][f.dest] = value
    return out


_BUDGET_KEYS = {
    "memory_budget_gb": "budget_gib",
    "mamba_full_memory_ratio": "mamba_full_memory_ratio",
    "max_mamba_cache_size": "max_mamba_cache_size",
    "kv_tokens": "kv_tokens",
    "state_slots": "state_slots",
}


def _trace_source(args: argparse.Namespace) -> tuple[str, list[Any] | None]:
    """(trace path, in-memory requests for --synthetic). A missing trace, or a folder, is an error now."""
    from mamba_radix.sim.sweep import resolve_trace, trace_problem

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


def _make_spec(
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
    options["verify_states"] = not args.no_verify_states
    options["check_invariants_every"] = args.check_invariants_every
    if getattr(args, "adaptive_split", False):
        if args.infinite:
            raise CliError("--adaptive-split moves bytes between finite pools; drop --infinite")
        options["split"] = {}
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
        cost=params["cost"],
        peer=params["peer"].get("peer"),
        synthetic=synthetic,
        deployment={k: v for k, v in params["deployment"].items() if k != "model"},  # model= above
        **budget,
    )
    spec.validate()
    return spec


def _progress_for(specs: Sequence[Any], desc: str, quiet: bool) -> Any:
    from mamba_radix.sim.progress import Progress
    from mamba_radix.sim.sweep import count_requests

    total = sum(count_requests(s) for s in specs)
    every = float(os.environ.get("MAMBA_RADIX_PROGRESS_EVERY_S", "30"))
    return Progress(total, len(specs), desc, quiet=quiet, every_s=every)


def _run_specs(
    specs: Sequence[Any], args: argparse.Namespace, out: str | Path, desc: str, force: bool
) -> list[dict[str, Any]]:
    """Run ``specs`` with progress in requests across all runs; records streamed into ``out``."""
    from mamba_radix.sim.sweep import count_requests, run_sweep

    sizes = {s.run_id: count_requests(s) for s in specs}
    with _progress_for(specs, desc, args.quiet) as progress:
        return run_sweep(
            specs,
            jobs=args.jobs,
            out_path=out,
            on_done=lambda rec: progress.run_done(rec["run_id"], sizes.get(rec["run_id"], 0)),
            on_progress=progress.update,
            backend=args.backend,
            ray_address=args.ray_address,
            overwrite=force,
        )


def _check_new_dir(path: Path, force: bool, what: str) -> None:
    """``path`` must be a new or empty folder (or anything with ``force``), its parent must exist."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{what} {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise CliError(
            f"{what} {path} is not empty; pick a new folder, or pass --force to overwrite its files"
        )
    if not path.exists() and not path.parent.is_dir():
        raise CliError(f"folder {path.parent} (for {what} {path.name}) does not exist; create it first")


def _warn_rejected(rec: dict[str, Any], command: str) -> None:
    """One warning line on stderr for a run that rejected requests (they never ran; the hit rate is over
    the others)."""
    rejected = rec.get("cache_stats", {}).get("rejected_requests", 0)
    if rejected:
        where = "" if command == "simulate" else f"run {rec['run_id']}: "
        sys.stderr.write(
            f"{PROG} {command}: warning: {where}{rejected:,} requests can never fit the pools (longer than the KV "
            "pool or a request row) and were rejected\n"
        )


def _write_per_request(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import csv

    columns = ["index", "input_len", "hit", "kv_hit", "ideal", "ttft_s"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for row in sorted(rows, key=lambda r: r["index"]):
            w.writerow(row)


def _format_summary(rec: dict[str, Any]) -> str:
    m, pools, stats = rec["metrics"], rec["pools"], rec["cache_stats"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f}%"

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f} s"

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
                f"adaptive split      ended at {pools['split_end']['kv_tokens']:,} KV tokens, "
                f"{pools['split_end']['state_slots']:,} state slots (same bytes)"
            ]
            if "split_end" in pools
            else []
        ),
        f"token hit rate      {pct(m['token_hit_rate'])}   (ideal {pct(m['ideal_hit_rate'])}, "
        f"{pct(m['fraction_of_ideal'])} of it)",
        f"KV-only matched     {m['kv_only_matched_tokens']:,} tokens",
        f"recomputed          {m['recomputed_tokens']:,} tokens (ideal - hit)",
        f"checkpoints         {stats.get('checkpoints_inserted', '-')} inserted, "
        f"{stats.get('checkpoints_skipped', '-')} skipped, {stats.get('states_evicted', '-')} evicted, "
        f"{stats.get('checkpoints_capped', '-')} capped",
        f"state copies        {stats['state_slot_copies']:,} ({stats['state_copy_bytes'] / 2**30:.2f} GiB on the model)",
        f"peak running        {m['peak_running']} (bound by {m['peak_running_bound_by'] or 'arrivals, not a pool'}; "
        f"admission blocked {m['admission_blocked'] or '{}'})",
        f"TTFT                p50 {sec(m['ttft_p50_s'])}, p90 {sec(m['ttft_p90_s'])}, "
        f"p99 {sec(m['ttft_p99_s'])}; simulated {m['sim_time_s']:.1f} s",
        f"wall time           {rec['wall_s']:.2f} s",
    ]
    rejected = stats.get("rejected_requests", 0)
    if rejected:
        lines.insert(
            1 + len(peer),
            f"rejected            {rejected:,} requests that can never fit (longer than the KV pool or a request row)",
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- commands
def cmd_simulate(args: argparse.Namespace) -> int:
    from mamba_radix.sim.progress import Progress
    from mamba_radix.sim.sweep import check_new_file, run_one

    out = check_new_file(args.out, args.force) if args.out else None
    per_request = (
        check_new_file(args.per_request, args.force, "per-request file") if args.per_request else None
    )
    if out is not None and per_request is not None and out.resolve() == per_request.resolve():
        raise CliError("--out and --per-request name the same file")
    trace, requests = _trace_source(args)
    spec = _make_spec(args, "simulate", _params_from_flags(args), trace)
    from mamba_radix.sim.sweep import count_requests

    total = len(requests) if requests is not None else count_requests(spec)
    every = float(os.environ.get("MAMBA_RADIX_PROGRESS_EVERY_S", "30"))
    with Progress(total, 1, "simulate", quiet=args.quiet, every_s=every) as progress:
        rec = run_one(spec, progress=lambda n: progress.update("simulate", n), requests=requests)
        progress.run_done("simulate", total)
    _warn_rejected(rec, "simulate")
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


def _definition_file(name: str) -> Path:
    """A definition given as a file path, or as the name of a bundled one (``default``, ``sglang-knobs``,
    ``peers``)."""
    if os.path.exists(name) or os.sep in name:
        return Path(name)
    from mamba_radix.data import bundled_definitions, definition_path

    if name in bundled_definitions():
        return definition_path(name)
    return Path(name)  # missing: load_definition says so


def _expand(path: Path, limit: int | None) -> tuple[dict[str, Any], list[Any]]:
    """Load and expand a definition, every problem found first (traces included)."""
    from mamba_radix.sim.sweep import expand_definition, load_definition

    definition = load_definition(path)
    if limit:
        definition["limit"] = limit
    return definition, expand_definition(definition, base_dir=path.parent, check_traces=True)


def cmd_sweep(args: argparse.Namespace) -> int:
    from mamba_radix.sim.sweep import check_new_file

    check_new_file(args.out, args.force)
    report_dir = Path(args.report) if args.report else None
    if report_dir is not None:
        _check_new_dir(report_dir, args.force, "report folder")
        _need_experiments_extra("sweep --report")
    definition: dict[str, Any] | None = None
    if args.definition:
        given = [k for k, v in _params_from_flags(args).items() if v] + (
            ["trace"] if args.trace or args.synthetic else []
        )
        if given:
            raise CliError(
                "--definition describes every run; drop the other run flags (or put them in its 'base')"
            )
        path = _definition_file(args.definition)
        from mamba_radix.experiment import is_policy_definition

        if is_policy_definition(path):
            raise CliError(
                f"{args.definition} is a policy comparison, not a sweep of run parameters; run it with "
                f"`{PROG} experiment --definition {args.definition}`"
            )
        definition, specs = _expand(path, args.limit)
    else:
        import itertools

        from mamba_radix.flags import FLAGS

        trace, requests = _trace_source(args)
        # a synthetic workload is generated again inside each worker (seeded: the same requests)
        synthetic = None if requests is None else {"generator": args.synthetic, "seed": args.seed}
        where = {f.dest: f.where for f in FLAGS() if "sweep" in f.commands}
        lists = {d: getattr(args, d) for d in where if getattr(args, d, None) is not None}
        single = {d: v for d, v in lists.items() if not isinstance(v, list)}  # non-sweepable flags
        lists = {d: v for d, v in lists.items() if isinstance(v, list)}
        keys = list(lists)
        specs = []
        for i, values in enumerate(itertools.product(*(lists[k] for k in keys))):
            params: dict[str, dict[str, Any]] = {
                w: {} for w in ("config", "budget", "options", "cost", "peer", "deployment")
            }
            for k, v in [*single.items(), *zip(keys, values, strict=True)]:
                if where[k] in params:
                    params[where[k]][k] = v
            specs.append(_make_spec(args, f"{i:03d}", params, trace, synthetic))
    records = _run_specs(specs, args, args.out, "sweep", args.force)
    failed = [r for r in records if "error" in r]
    for r in failed:
        sys.stderr.write(f"{PROG} sweep: run {r['run_id']} failed: {r['error']}\n")
    for r in records:
        _warn_rejected(r, "sweep")
    if report_dir is not None:
        from mamba_radix.sim.report import write_report

        write_report(records, report_dir, definition=definition or _sweep_definition(records))
    print(
        f"{len(records) - len(failed)} runs written to {args.out}"
        + (f"; report in {report_dir}" if report_dir else "")
    )
    return 1 if failed else 0


def _sweep_definition(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Plots for a flag sweep: the hit rate against each swept parameter (one series per other one)."""
    from mamba_radix.sim.report import sweep_plots

    return {"title": "mamba_radix sweep", "plots": sweep_plots(records)}


def _new_results_dir(root: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = root / f"{name}-{stamp}"
    n = 2
    while path.exists():  # two runs within a second
        path, n = root / f"{name}-{stamp}-{n}", n + 1
    return path


def _load_reference(definition: dict[str, Any], base: Path) -> tuple[list[dict[str, Any]] | None, str | None]:
    ref = definition.get("reference")
    if not ref:
        return None, None
    from mamba_radix.sim.report import load_records

    path = (base / ref) if not os.path.isabs(ref) else Path(ref)
    if not path.is_file():
        return None, f"{ref} (not found)"
    return load_records(path), str(ref)


def _experiment_out_dir(args: argparse.Namespace, name: str) -> Path:
    """The results folder: ``--out`` (new or empty unless ``--force``) or a new ``NAME-<UTC time>`` in
    ``--results-dir``. Checked, not created."""
    if args.out:
        out_dir = Path(args.out)
        _check_new_dir(out_dir, args.force, "results folder")
        return out_dir
    root = Path(args.results_dir)
    if root.exists() and not root.is_dir():
        raise CliError(f"--results-dir {root} is not a folder")
    return _new_results_dir(root, name)


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed (for run_info and the report): ``mamba-radix`` and the arguments."""
    import shlex

    return " ".join([PROG, *(shlex.quote(a) for a in getattr(args, "argv", []))])


def cmd_policy_experiment(args: argparse.Namespace, path: Path) -> int:
    """``experiment`` on a policy-comparison definition (:mod:`mamba_radix.experiment`)."""
    from mamba_radix.experiment import load_policy_definition, replot, run_policy_experiment

    experiment = load_policy_definition(path).with_limit(args.limit).only(args.workloads, args.policies)
    if "oracle" not in experiment.policies:
        raise CliError("--policies must keep oracle: the report gives every policy as a fraction of it")
    if args.backend != "local":
        raise CliError("a policy comparison runs in local processes (--jobs); drop --backend ray")
    if args.report_only:
        if not args.out:
            raise CliError("--report-only redraws an existing results folder: give it as --out")
        print(f"report: {replot(args.out, experiment)}")
        return 0
    out_dir = _experiment_out_dir(args, path.stem)
    info = run_policy_experiment(
        experiment, out_dir, processes=args.jobs, quiet=args.quiet, command=_command_line(args)
    )
    print(f"{info['runs']} runs in {info['wall_s']:.1f} s; report: {out_dir / 'report.md'}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from mamba_radix.sim.report import write_report

    _need_experiments_extra("experiment")
    path = _definition_file(args.definition)
    from mamba_radix.experiment import is_policy_definition

    if is_policy_definition(path):
        return cmd_policy_experiment(args, path)
    if args.workloads or args.policies:
        raise CliError("--workloads and --policies apply to policy comparisons (such as default) only")
    definition, specs = _expand(path, args.limit)
    reference, reference_name = _load_reference(definition, path.parent)
    if args.report_only:
        from mamba_radix.sim.report import load_records

        if not args.out:
            raise CliError("--report-only redraws an existing results folder: give it as --out")
        out_dir = Path(args.out)
        results = out_dir / "results.jsonl"
        if not results.is_file():
            raise CliError(f"no results to report: {results} not found; run the experiment first")
        info = (
            json.loads((out_dir / "run_info.json").read_text())
            if (out_dir / "run_info.json").is_file()
            else {}
        )
        report = write_report(
            load_records(results), out_dir, definition, info.get("runtime_s"), info.get("jobs"),
            reference=reference, reference_name=reference_name,
        )  # fmt: skip
        print(f"report: {report}")
        return 0
    out_dir = _experiment_out_dir(args, path.stem)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if not args.quiet:
        where = (
            f"Ray ({args.ray_address or os.environ.get('RAY_ADDRESS') or 'local'})"
            if args.backend == "ray"
            else f"{args.jobs} processes"
        )
        sys.stderr.write(
            f"{PROG} experiment: {path.stem}, {len(specs)} runs x {definition.get('limit') or 'all'} requests of "
            f"{Path(str(definition['trace'])).name}, {where}; writing {out_dir}\n"
        )
    records = _run_specs(specs, args, out_dir / "results.jsonl", "experiment", args.force)
    elapsed = time.perf_counter() - start
    from mamba_radix import __version__

    info = {
        "runtime_s": round(elapsed, 1),
        "jobs": args.jobs if args.backend == "local" else None,
        "backend": args.backend,
        "definition": str(args.definition),
        "limit": definition.get("limit"),
        "version": __version__,
    }
    (out_dir / "run_info.json").write_text(json.dumps(info) + "\n")
    failed = [r for r in records if "error" in r]
    for r in failed:
        sys.stderr.write(f"{PROG} experiment: run {r['run_id']} failed: {r['error']}\n")
    for r in records:
        _warn_rejected(r, "experiment")
    report = write_report(
        records, out_dir, definition=definition, runtime_s=elapsed, jobs=info["jobs"],
        reference=reference, reference_name=reference_name,
    )  # fmt: skip
    print(f"{len(records) - len(failed)}/{len(records)} runs in {elapsed:.0f} s; report: {report}")
    return 1 if failed else 0


def cmd_plan(args: argparse.Namespace) -> int:
    from mamba_radix.capacity.cli import run_plan

    return run_plan(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "simulate": cmd_simulate,
    "sweep": cmd_sweep,
    "experiment": cmd_experiment,
    "plan": cmd_plan,
}


def error_lines(exc: MambaRadixError) -> list[str]:
    """The lines a library error prints as: one per problem of a definition (in its parameter names), else
    its first line with Python argument names mapped to the flags that set them
    (:func:`mamba_radix.flags.flag_message`)."""
    from mamba_radix.flags import flag_message
    from mamba_radix.sim.sweep import DefinitionError

    if isinstance(exc, DefinitionError):  # a definition speaks in parameter names: keep them
        return list(exc.problems)
    text = str(exc)
    return [flag_message(text.splitlines()[0] if text else type(exc).__name__)]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the exit code: 0 ok, 1 some sweep runs failed, 2 bad input.

    Only the library's errors (:class:`MambaRadixError`) and usage errors become one-line messages; any
    other exception propagates with its traceback (it is a bug)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    args.argv = argv
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    try:
        import torch

        torch.set_num_threads(1)  # tiny tensors: threads only add contention; sweeps use processes
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except MambaRadixError as exc:
        for line in error_lines(exc):
            sys.stderr.write(f"{PROG} {args.command}: error: {line}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG} {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
