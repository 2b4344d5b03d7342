"""The policy experiment (the main job) from the repository: a thin script over :mod:`mamba_radix.experiment`.

``mamba-radix experiment`` (``make experiment``) runs the same thing from any folder; this script adds the
two jobs that belong to the repository::

    python experiments/policies.py                      # the main job, into experiments/results/default-<UTC>/
    python experiments/policies.py --limit 300 --workloads chat,tree --policies sglang-0.5.23,sift,oracle
    python experiments/policies.py --update-reference   # re-run it into experiments/reference/default/ and
                                                        # refresh mamba_radix/data/experiments/default.reference.jsonl
    python experiments/policies.py --update-reference --policies sift   # re-run one policy's rows only
                                                        # (about 100 CPU-s for sift), keep the others
    python experiments/policies.py --target             # the issue's check: 2,000 conversation requests,
                                                        # 8M KV tokens, 1024 and 256 slots
    python experiments/policies.py --replot DIR         # redraw report.md and the plots of a results folder

``--update-reference`` replaces the committed reference run (about 600 CPU-s, 5 minutes on 2 idle cores);
with ``--policies`` it re-runs only those policies' rows and keeps the others (``run_info.json`` lists the
re-run under ``reruns``; only valid when nothing else changed results). Either way its report compares the
new numbers with the reference it replaces, so the commit shows what changed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from mamba_radix.data import definition_path
from mamba_radix.experiment import (
    load_policy_definition,
    new_results_folder,
    replot,
    rerun_policies,
    run_conversation_target,
    run_policy_experiment,
    write_reference,
)

HERE = Path(__file__).resolve().parent
REFERENCE_DIR = HERE / "reference" / "default"
UPDATE_COMMAND = "python experiments/policies.py --update-reference"


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--definition", default="default", help="a bundled policy definition or a JSON file")
    parser.add_argument("--out", help="a new folder for the results (default experiments/results/NAME-<UTC>)")
    parser.add_argument("--limit", type=int, default=None, help="at most N requests per workload")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--policies", help="comma-separated policy names (default: the definition's)")
    parser.add_argument("--workloads", help="comma-separated workload names (default: the definition's)")
    parser.add_argument("--quiet", action="store_true")
    job = parser.add_mutually_exclusive_group()
    job.add_argument("--replot", metavar="DIR", help="only redraw the report and plots of a results folder")
    job.add_argument("--target", action="store_true", help="the 2,000-request conversation target check")
    job.add_argument(
        "--update-reference",
        action="store_true",
        help="re-run the main job into experiments/reference/default and refresh the bundled reference",
    )
    args = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    if args.target:
        folder = run_conversation_target(
            Path(args.out) if args.out else new_results_folder(HERE / "results", "target")
        )
        print(folder / "target.md")
        return 0
    path = Path(args.definition) if Path(args.definition).is_file() else definition_path(args.definition)
    experiment = load_policy_definition(path).with_limit(args.limit)
    experiment = experiment.only(_names(args.workloads), _names(args.policies))
    if args.replot:
        print(replot(args.replot, experiment))
        return 0
    if args.update_reference:
        if args.limit or args.workloads or args.definition != "default":
            parser.error(
                "--update-reference runs the bundled default on every workload; drop --limit/--workloads"
            )
        if args.policies:  # only these policies' rows are re-run; the others are kept
            full = load_policy_definition(path)
            command = f"{UPDATE_COMMAND} --policies {args.policies}"
            rerun_policies(
                REFERENCE_DIR,
                full,
                _names(args.policies) or [],
                processes=args.processes,
                quiet=args.quiet,
                command=command,
            )
        else:
            # the reference's report compares with the reference it replaces (read before it is overwritten)
            shutil.rmtree(REFERENCE_DIR, ignore_errors=True)
            run_policy_experiment(
                experiment, REFERENCE_DIR, processes=args.processes, quiet=args.quiet, command=UPDATE_COMMAND
            )
        n = write_reference(REFERENCE_DIR / "results.jsonl", path.parent / "default.reference.jsonl")
        print(f"{REFERENCE_DIR / 'report.md'}; {n} rows in {path.parent / 'default.reference.jsonl'}")
        return 0
    folder = Path(args.out) if args.out else new_results_folder(HERE / "results", path.stem)
    if folder.exists() and any(folder.iterdir()):
        parser.error(f"{folder} exists and is not empty; pass a new --out folder")
    command = " ".join(["python experiments/policies.py", *given])
    run_policy_experiment(experiment, folder, processes=args.processes, quiet=args.quiet, command=command)
    print(folder / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
