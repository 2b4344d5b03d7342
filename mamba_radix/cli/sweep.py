"""``mamba-radix sweep``: run many configurations, in local processes or as Ray tasks.

The flags are ``simulate``'s (:mod:`mamba_radix.cli.simulate`), but every sweepable flag takes a
comma-separated list and the cartesian product runs, in ``--jobs`` local processes or as Ray tasks
(``--backend ray``); or ``--definition`` runs an experiment definition that sweeps run parameters
(:func:`mamba_radix.sim.sweep.expand_definition`). Results are JSON lines (``--out``), streamed as runs
finish; ``--report`` adds a markdown report with plots. Exit code 1 when some runs failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mamba_radix.cli._common import (
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
from mamba_radix.cli.simulate import (
    add_run_arguments,
    add_trace_arguments,
    empty_params,
    make_spec,
    params_from_flags,
    trace_source,
)

EXAMPLES = """examples:
  mamba-radix sweep --limit 1000 --mamba-radix-cache-strategy no_buffer,extra_buffer \\
      --memory-budget-gb 27.25,54.5 --out sweep.jsonl --report sweep-report
  mamba-radix sweep --definition experiments/peers.json --out peers.jsonl --jobs 4
  mamba-radix sweep --limit 1000 --mamba-track-interval 128,256,512 --out s.jsonl \\
      --backend ray --ray-address ray://head:10001
  mamba-radix sweep --limit 500 --mamba-max-states-per-path=-1,1,4 --out caps.jsonl
      (a list that starts with a negative number needs the = form)"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = add_command(
        sub,
        "sweep",
        help="run many configurations (local processes or Ray)",
        description=(
            "Cartesian product of comma-separated flag values (or an experiment --definition), run in --jobs "
            "processes or on Ray; results as JSON lines, streamed as runs finish."
        ),
        examples=EXAMPLES,
    )
    add_trace_arguments(p)
    add_run_arguments(p, "sweep")
    add_backend_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument(
        "--definition", metavar="FILE", help="an experiment definition (a JSON file or a bundled name)"
    )
    o.add_argument(
        "--out", required=True, metavar="FILE", help="results JSON-lines file to write (a new file)"
    )
    o.add_argument("--report", metavar="DIR", help="also write report.md with plots into this new folder")
    o.add_argument("--force", action="store_true", help="overwrite an existing --out file / --report folder")


def run(args: argparse.Namespace) -> int:
    single_threaded_torch()
    from mamba_radix.sim.sweep import check_new_file

    check_new_file(args.out, args.force)
    report_dir = Path(args.report) if args.report else None
    if report_dir is not None:
        check_new_dir(report_dir, args.force, "report folder")
        need_experiments_extra("sweep --report")
    definition: dict[str, Any] | None = None
    if args.definition:
        definition, specs = _definition_specs(args)
    else:
        specs = _flag_specs(args)
    records = run_specs(specs, args, args.out, "sweep", args.force)
    failed = failed_runs(records, "sweep")
    if report_dir is not None:
        from mamba_radix.sim.report import write_report

        write_report(records, report_dir, definition=definition or _sweep_definition(records))
    print(
        f"{len(records) - len(failed)} runs written to {args.out}"
        + (f"; report in {report_dir}" if report_dir else "")
    )
    return 1 if failed else 0


def _definition_specs(args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """``--definition``: the definition and its runs; it describes every run, so no other run flag."""
    given = [k for k, v in params_from_flags(args).items() if v] + (
        ["trace"] if args.trace or args.synthetic else []
    )
    if given:
        raise CliError(
            "--definition describes every run; drop the other run flags (or put them in its 'base')"
        )
    path = definition_file(args.definition)
    from mamba_radix.experiment import is_policy_definition

    if is_policy_definition(path):
        raise CliError(
            f"{args.definition} is a policy comparison, not a sweep of run parameters; run it with "
            f"`{PROG} experiment --definition {args.definition}`"
        )
    return expand_definition(path, args.limit)


def _flag_specs(args: argparse.Namespace) -> list[Any]:
    """The cartesian product of the list flags, each run with the single-valued flags too."""
    import itertools

    from mamba_radix.flags import FLAGS

    trace, requests = trace_source(args)
    # a synthetic workload is generated again inside each worker (seeded: the same requests)
    synthetic = None if requests is None else {"generator": args.synthetic, "seed": args.seed}
    where = {f.dest: f.where for f in FLAGS() if "sweep" in f.commands}
    lists = {d: getattr(args, d) for d in where if getattr(args, d, None) is not None}
    single = {d: v for d, v in lists.items() if not isinstance(v, list)}  # non-sweepable flags
    lists = {d: v for d, v in lists.items() if isinstance(v, list)}
    keys = list(lists)
    specs = []
    for i, values in enumerate(itertools.product(*(lists[k] for k in keys))):
        params = empty_params()
        for k, v in [*single.items(), *zip(keys, values, strict=True)]:
            if where[k] in params:
                params[where[k]][k] = v
        specs.append(make_spec(args, f"{i:03d}", params, trace, synthetic))
    return specs


def _sweep_definition(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Plots for a flag sweep: the hit rate against each swept parameter (one series per other one)."""
    from mamba_radix.sim.report import sweep_plots

    return {"title": "mamba_radix sweep", "plots": sweep_plots(records)}
