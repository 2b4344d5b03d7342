"""The ``mamba-radix`` command line: the top-level parser, ``--help``, ``--version``, exit codes and the
one-line errors of every subcommand. Each subcommand is a module with its flags and its run:

- ``simulate`` (:mod:`mamba_radix.cli.simulate`): replay one trace through the real cache under one
  configuration.
- ``sweep`` (:mod:`mamba_radix.cli.sweep`): many configurations (comma-separated flag values, or a
  definition), in local processes or on Ray.
- ``experiment`` (:mod:`mamba_radix.cli.experiment`): an experiment definition into a new results folder
  with a report; the bundled ``default`` is the main job, the policy comparison.
- ``plan`` (:mod:`mamba_radix.cli.plan`): the capacity planner (:mod:`mamba_radix.capacity.cli`).

What they share is in :mod:`mamba_radix.cli._common`. Flags come from one table (:mod:`mamba_radix.flags`),
with SGLang's server-argument names where one exists; ``plan`` and ``simulate`` share the model's
deployment defaults (:mod:`mamba_radix.defaults`). Before a command runs, ``main`` inserts the flags of an
SGLang launch-settings file (``--config FILE``, :mod:`mamba_radix.launch_config`; flags given on the command
line win), fills flags left out from SGLang's environment variables (``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``,
``SGLANG_MAMBA_CONV_DTYPE``: :func:`mamba_radix.flags.apply_env_defaults`) and derives the flags another
sets (``--speculative-dspark-block-size``: :func:`mamba_radix.cli._common.resolve_linked_flags`).

Nothing is overwritten silently: ``--out`` files and folders must be new unless ``--force``, and output
paths are checked before anything runs. Errors of the library (:class:`~mamba_radix.errors.MambaRadixError`)
and bad flags are one line on stderr (a definition's problems one line each) and exit code 2; anything
else is a bug and shows its traceback. Progress (in requests, across all runs, with rate and ETA) goes to
stderr: a bar on a terminal, a line every 30 s otherwise, nothing with ``--quiet``.

The subcommand modules import the simulator (so torch), matplotlib and Ray only inside their run
functions, so that ``mamba-radix --help``, ``--version`` and every ``COMMAND --help`` load none of them
(``property_tests/test_cli_light.py`` holds that), and ``plan`` never loads torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from mamba_radix.cli import experiment, plan, simulate, sweep
from mamba_radix.cli._common import PROG, Parser, resolve_linked_flags
from mamba_radix.errors import MambaRadixError

__all__ = ["main"]

# the subcommands, in the order of --help: name -> its run (0 ok, 1 some runs failed, 2 bad input)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "simulate": simulate.run,
    "sweep": sweep.run,
    "experiment": experiment.run,
    "plan": plan.run,
}
_PARSERS = (simulate.add_parser, sweep.add_parser, experiment.add_parser, plan.add_parser)
# the subcommands that take SGLang launch settings (--config FILE: mamba_radix.launch_config)
_CONFIG_COMMANDS = ("simulate", "sweep", "plan")


def build_parser() -> argparse.ArgumentParser:
    from mamba_radix import __version__

    parser = Parser(
        prog=PROG,
        description="Mamba-aware radix prefix cache: simulator, sweeps, experiments, capacity planner.",
        epilog="run `mamba-radix COMMAND --help` for a command's flags and examples",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{simulate,sweep,experiment,plan}", parser_class=Parser
    )
    for add_parser in _PARSERS:
        add_parser(sub)
    return parser


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
    from mamba_radix.flags import apply_env_defaults
    from mamba_radix.launch_config import expand_config

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # --config FILE: the file's flags go first, so that the command line's win
        expanded, ignored = expand_config(argv, _CONFIG_COMMANDS)
    except MambaRadixError as exc:  # in the file's key names: not mapped to flags
        sys.stderr.write(f"{PROG} {argv[0]}: error: {str(exc).splitlines()[0]}\n")
        return 2
    try:
        args = parser.parse_args(expanded)
    except SystemExit as exc:  # --help / --version (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    args.argv = argv
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    if ignored:
        sys.stderr.write(
            f"{PROG} {args.command}: config {args.config}: ignored (no effect on what {args.command} models): "
            f"{', '.join(ignored)}\n"
        )
    try:
        for warning in apply_env_defaults(args, args.command):
            sys.stderr.write(f"{PROG} {args.command}: warning: {warning}\n")
        resolve_linked_flags(args)
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
