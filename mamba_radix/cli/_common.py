"""What several subcommands share: the command-line error, the parser classes, flag types, the output
checks, experiment definitions given by name or file, and the run of many specs (``sweep``, ``experiment``)
with progress and its warnings.

Imports nothing heavy at module level: ``mamba-radix --help`` loads it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from mamba_radix.errors import MambaRadixError
from mamba_radix.flags import int_in

PROG = "mamba-radix"
EXTRA_HINT = 'pip install "mamba-radix[experiments]"'

LIMIT = int_in(1, 1 << 31)
JOBS = int_in(1, 1024)


class CliError(MambaRadixError):
    """A user error found by the command line itself: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``prog: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the examples' line breaks."""


def add_command(
    sub: argparse._SubParsersAction[Any], name: str, help: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """The subcommand ``name``'s parser, its ``examples`` (line breaks kept) at the end of its help."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog=examples, formatter_class=_Help
    )
    return parser


def add_backend_arguments(p: argparse.ArgumentParser) -> None:
    """``--jobs``, ``--backend``, ``--ray-address``: where many runs go (``sweep``, ``experiment``)."""
    from mamba_radix.sim.ray_backend import RAY_ADDRESS_ENV

    g = p.add_argument_group("where the runs go")
    g.add_argument("--jobs", type=JOBS, default=2, help="local worker processes (default 2)")
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


def single_threaded_torch() -> None:
    """Import torch and give it one intra-op thread: the simulator's tensors are tiny, so threads only add
    contention (a sweep runs in processes instead). Called by the run of each subcommand that simulates
    (not at start-up: ``--help`` and ``plan`` never load torch). Side effect: torch's global thread count."""
    import torch

    torch.set_num_threads(1)


# ------------------------------------------------------------------------- flags that set each other
def resolve_linked_flags(args: argparse.Namespace) -> None:
    """Flags whose value follows from another's: ``--speculative-dspark-block-size`` gamma (DSpark's block
    size) means a verify window of ``1 + gamma`` tokens (one anchor and gamma drafts), so it sets
    ``--speculative-num-draft-tokens`` to ``gamma + 1``; that flag given with another value is an error.
    (ReplaySSM's ring rule, ``--linear-replayssm-cache-len`` a power of two and at least twice the window,
    is the planner's check: :func:`mamba_radix.capacity.memory`'s ring sizing.) Side effect: sets
    attributes of ``args``. Raises :class:`CliError`. O(1)."""
    gamma = getattr(args, "speculative_dspark_block_size", None)
    if gamma is None:
        return
    window = gamma + 1
    given = getattr(args, "speculative_num_draft_tokens", None)
    if given is None:
        args.speculative_num_draft_tokens = window
    elif given != window:
        raise CliError(
            f"--speculative-dspark-block-size {gamma} means a verify window of {window} tokens (1 anchor + "
            f"{gamma} drafts), but --speculative-num-draft-tokens is {given}; give {window} or drop it"
        )


def log_line(line: str) -> None:
    """Where the engine's scheduler lines go (``--log-every``): stderr, flushed, so that ``--json`` keeps
    stdout parseable and the lines interleave with nothing else. Side effect: writes to stderr."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------- checks up front
def need_experiments_extra(what: str) -> None:
    """Fail now (before any run) when the plotting extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError(f"{what} draws plots and needs the [experiments] extra: {EXTRA_HINT}") from None


def check_new_dir(path: Path, force: bool, what: str) -> None:
    """``path`` must be a new or empty folder (or anything with ``force``), its parent must exist."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{what} {path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise CliError(
            f"{what} {path} is not empty; pick a new folder, or pass --force to overwrite its files"
        )
    if not path.exists() and not path.parent.is_dir():
        raise CliError(f"folder {path.parent} (for {what} {path.name}) does not exist; create it first")


# ------------------------------------------------------------------------------------- definitions
def definition_file(name: str) -> Path:
    """A definition given as a file path, or as the name of a bundled one (``default``, ``sglang-knobs``,
    ``peers``)."""
    if os.path.exists(name) or os.sep in name:
        return Path(name)
    from mamba_radix.data import bundled_definitions, definition_path

    if name in bundled_definitions():
        return definition_path(name)
    return Path(name)  # missing: load_definition says so


def expand_definition(path: Path, limit: int | None) -> tuple[dict[str, Any], list[Any]]:
    """Load and expand a sweep definition, every problem found first (traces included)."""
    from mamba_radix.sim.sweep import expand_definition, load_definition

    definition = load_definition(path)
    if limit:
        definition["limit"] = limit
    return definition, expand_definition(definition, base_dir=path.parent, check_traces=True)


# -------------------------------------------------------------------------------------------- runs
def progress(total: int, runs: int, desc: str, quiet: bool) -> Any:
    """Progress in requests across ``runs`` runs on stderr (a line every ``$MAMBA_RADIX_PROGRESS_EVERY_S``
    seconds, default 30, where stderr is no terminal)."""
    from mamba_radix.sim.progress import Progress

    every = float(os.environ.get("MAMBA_RADIX_PROGRESS_EVERY_S", "30"))
    return Progress(total, runs, desc, quiet=quiet, every_s=every)


def run_specs(
    specs: Sequence[Any], args: argparse.Namespace, out: str | Path, desc: str, force: bool
) -> list[dict[str, Any]]:
    """Run ``specs`` with progress in requests across all runs; records streamed into ``out``."""
    from mamba_radix.sim.sweep import count_requests, run_sweep

    sizes = {s.run_id: count_requests(s) for s in specs}
    with progress(sum(sizes.values()), len(specs), desc, args.quiet) as bar:
        return run_sweep(
            specs,
            jobs=args.jobs,
            out_path=out,
            on_done=lambda rec: bar.run_done(rec["run_id"], sizes.get(rec["run_id"], 0)),
            on_progress=bar.update,
            backend=args.backend,
            ray_address=args.ray_address,
            overwrite=force,
        )


def warn_rejected(rec: dict[str, Any], command: str) -> None:
    """One warning line on stderr for a run that rejected requests (they never ran; the hit rate is over
    the others)."""
    rejected = rec.get("cache_stats", {}).get("rejected_requests", 0)
    if rejected:
        where = "" if command == "simulate" else f"run {rec['run_id']}: "
        sys.stderr.write(
            f"{PROG} {command}: warning: {where}{rejected:,} requests can never fit the pools (longer than the KV "
            "pool or a request row) and were rejected\n"
        )


def failed_runs(records: Sequence[dict[str, Any]], command: str) -> list[dict[str, Any]]:
    """The records of the runs that failed, each said on stderr, then a warning for each run that
    rejected requests."""
    failed = [r for r in records if "error" in r]
    for r in failed:
        sys.stderr.write(f"{PROG} {command}: run {r['run_id']} failed: {r['error']}\n")
    for r in records:
        warn_rejected(r, command)
    return failed
