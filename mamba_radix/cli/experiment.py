"""``mamba-radix experiment``: an experiment definition into a new results folder.

The folder gets ``results.jsonl``, ``run_info.json``, ``report.md`` (compared with the definition's
reference results) and PNG plots; ``--report-only`` redraws the report from a folder's results. The
bundled ``default`` is the main job, the policy comparison (:mod:`mamba_radix.experiment`): every
registered policy, the offline oracle, the infinite-capacity line and the ideal, hit rate against memory
where state slots bind and where KV binds, on the Mooncake conversation trace and four synthetic workloads.
Other bundled definitions (``sglang-knobs``: SGLang's knobs one at a time in timed mode; ``peers``) are
sweeps of run parameters (:func:`mamba_radix.sim.sweep.expand_definition`), run as ``sweep`` runs them.
Needs the ``[experiments]`` extra (plots); exit code 1 when some runs failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mamba_radix.cli._common import (
    LIMIT,
    PROG,
    CliError,
    add_backend_arguments,
    add_command,
    check_new_dir,
    definition_file,
    expand_definition,
    failed_runs,
    need_experiments_extra,
    run_specs,
    single_threaded_torch,
)

DEFAULT_RESULTS_DIR = "mamba-radix-results"

EXAMPLES = """examples:
  mamba-radix experiment                       # the main job: policies vs the oracle, a new folder
  mamba-radix experiment --limit 200 --out quick --workloads chat,tree --policies sglang-0.5.23,sift,oracle
  mamba-radix experiment --definition sglang-knobs --results-dir experiments/results   # the old default
  mamba-radix experiment --definition peers
  mamba-radix experiment --out quick --report-only         # redraw report.md and plots"""


def _names(text: str) -> list[str]:
    """A comma-separated list of names (``chat,tree``); empty items are an error."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
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
        examples=EXAMPLES,
    )
    from mamba_radix.data import bundled_definitions

    p.add_argument(
        "--definition",
        default="default",
        metavar="NAME|FILE",
        help=f"a bundled definition ({', '.join(bundled_definitions())}) or a JSON file (default: default)",
    )
    p.add_argument(
        "--out", metavar="DIR", help="the results folder (new or empty; default: a new one in --results-dir)"
    )
    p.add_argument(
        "--results-dir",
        default=DEFAULT_RESULTS_DIR,
        metavar="DIR",
        help=f"where a run without --out makes its folder NAME-YYYYmmddTHHMMSSZ (default ./{DEFAULT_RESULTS_DIR})",
    )
    p.add_argument("--force", action="store_true", help="write into a non-empty --out folder (overwrites)")
    p.add_argument(
        "--limit",
        type=LIMIT,
        default=None,
        metavar="N",
        help="override the definition's request count (policy comparisons: at most N requests per workload)",
    )
    p.add_argument(
        "--workloads",
        type=_names,
        default=None,
        metavar="A,B",
        help="policy comparisons only: run only these workloads of the definition (default all)",
    )
    p.add_argument(
        "--policies",
        type=_names,
        default=None,
        metavar="A,B",
        help="policy comparisons only: run only these policies of the definition (default all; keep oracle)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--report-only", action="store_true", help="redraw report.md and the plots from --out's results.jsonl"
    )
    add_backend_arguments(p)


# -------------------------------------------------------------------------------------------- runs
def run(args: argparse.Namespace) -> int:
    single_threaded_torch()
    from mamba_radix.sim.report import write_report

    need_experiments_extra("experiment")
    path = definition_file(args.definition)
    from mamba_radix.experiment import is_policy_definition

    if is_policy_definition(path):
        return _run_policy_experiment(args, path)
    if args.workloads or args.policies:
        raise CliError("--workloads and --policies apply to policy comparisons (such as default) only")
    definition, specs = expand_definition(path, args.limit)
    reference, reference_name = _load_reference(definition, path.parent)
    if args.report_only:
        from mamba_radix.sim.report import load_records

        out_dir = _report_only_dir(args)
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
    out_dir = _out_dir(args, path.stem)
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
    records = run_specs(specs, args, out_dir / "results.jsonl", "experiment", args.force)
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
    failed = failed_runs(records, "experiment")
    report = write_report(
        records, out_dir, definition=definition, runtime_s=elapsed, jobs=info["jobs"],
        reference=reference, reference_name=reference_name,
    )  # fmt: skip
    print(f"{len(records) - len(failed)}/{len(records)} runs in {elapsed:.0f} s; report: {report}")
    return 1 if failed else 0


def _run_policy_experiment(args: argparse.Namespace, path: Path) -> int:
    """``experiment`` on a policy-comparison definition (:mod:`mamba_radix.experiment`)."""
    from mamba_radix.experiment import load_policy_definition, replot, run_policy_experiment

    experiment = load_policy_definition(path).with_limit(args.limit).only(args.workloads, args.policies)
    if "oracle" not in experiment.policies:
        raise CliError("--policies must keep oracle: the report gives every policy as a fraction of it")
    if args.backend != "local":
        raise CliError("a policy comparison runs in local processes (--jobs); drop --backend ray")
    if args.report_only:
        print(f"report: {replot(_report_only_dir(args), experiment)}")
        return 0
    out_dir = _out_dir(args, path.stem)
    info = run_policy_experiment(
        experiment, out_dir, processes=args.jobs, quiet=args.quiet, command=_command_line(args)
    )
    print(f"{info['runs']} runs in {info['wall_s']:.1f} s; report: {out_dir / 'report.md'}")
    return 0


# ----------------------------------------------------------------------------------------- folders
def _report_only_dir(args: argparse.Namespace) -> Path:
    """The folder ``--report-only`` redraws: ``--out``, which it needs."""
    if not args.out:
        raise CliError("--report-only redraws an existing results folder: give it as --out")
    return Path(args.out)


def _out_dir(args: argparse.Namespace, name: str) -> Path:
    """The results folder: ``--out`` (new or empty unless ``--force``) or a new ``NAME-<UTC time>`` in
    ``--results-dir``. Checked, not created."""
    if args.out:
        out_dir = Path(args.out)
        check_new_dir(out_dir, args.force, "results folder")
        return out_dir
    root = Path(args.results_dir)
    if root.exists() and not root.is_dir():
        raise CliError(f"--results-dir {root} is not a folder")
    return _new_results_dir(root, name)


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


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed (for run_info and the report): ``mamba-radix`` and the arguments."""
    import shlex

    return " ".join([PROG, *(shlex.quote(a) for a in getattr(args, "argv", []))])
