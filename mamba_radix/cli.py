"""The ``mamba-radix`` command line: ``simulate``, ``sweep``, ``experiment`` and ``plan``.

- ``simulate``: replay one trace (a file, or a seeded synthetic workload) through the real cache under
  one configuration; prints a summary, optionally appends the JSON-lines record to ``--out``.
- ``sweep``: the same flags, but every sweepable flag takes a comma-separated list; the cartesian product
  runs in ``--jobs`` processes; or ``--definition FILE`` runs an experiment definition. Results as JSON
  lines, optionally a markdown report with plots (``--report``).
- ``experiment``: the default experiment (``experiments/default.json``): the Mooncake conversation trace
  under a Kimi-K3-like per-rank budget; writes ``results.jsonl``, ``report.md`` and PNG plots.
- ``plan``: the capacity planner (:mod:`mamba_radix.capacity.cli`).

``--peer NAME`` (a list under ``sweep``) applies a peer system's policy preset
(:mod:`mamba_radix.peers`) after the other flags; a flag given with a value the peer would change is an
error. Boolean flags are switches (``--disable-overlap-schedule`` alone means true) that also take an
explicit value (``true``/``false``; a comma list under ``sweep``).

Flags carry SGLang's server-argument names where one exists. Errors are one line on stderr and exit
code 2, never a traceback; progress bars go to stderr and are off when it is not a terminal or with
``--quiet``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main"]

PROG = "mamba-radix"
DEFAULT_TRACE = "experiments/traces/mooncake_conversation_trace.jsonl"
DEFAULT_DEFINITION = "experiments/default.json"
DEFAULT_EXPERIMENT_OUT = "experiments/results/default"


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``prog: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


# ----------------------------------------------------------------------------------------- flag types
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _list_of(conv: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("needs at least one value")
        return [conv(t) for t in items]

    parse.__name__ = f"list of {getattr(conv, '__name__', 'value')}"
    return parse


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text}")


_bool.__name__ = "bool"


def _peer_name(text: str) -> str:
    from mamba_radix.peers import PEERS

    if text not in PEERS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(PEERS)}, got {text}")
    return text


_peer_name.__name__ = "peer"


def _peer_help() -> str:
    from mamba_radix.peers import PEERS

    return (
        f"a peer system's cache policy ({', '.join(PEERS)}; mamba_radix.peers), applied after the other "
        "flags; a flag it sets to another value is an error. vllm-align needs --page-size > 1, which the "
        "simulator does not support yet"
    )


# (flag, dest, type, default, help, where): "config" = CacheConfig field, "budget", "options", "cost",
# "peer" (a preset of mamba_radix.peers applied over the config fields). Flags of type _bool are switches:
# given alone they mean true (as SGLang's), or take an explicit value (a list under sweep).
# fmt: off
_SWEEPABLE: list[tuple[str, str, Callable[[str], Any], Any, str, str]] = [
    ("--mamba-radix-cache-strategy", "mamba_radix_cache_strategy", str, "auto",
     "auto, no_buffer, extra_buffer or extra_buffer_lazy", "config"),
    ("--mamba-track-interval", "mamba_track_interval", int, 256, "decode checkpoint every N tokens", "config"),
    ("--mamba-max-states-per-path", "mamba_max_states_per_path", int, -1,
     "soft cap on checkpoints per path (-1 = unlimited)", "config"),
    ("--mamba-cache-chunk-size", "mamba_cache_chunk_size", int, 64, "prefill checkpoint grid (tokens)", "config"),
    ("--mamba-eviction-order", "mamba_eviction_order", str, "leaf_first",
     "checkpoint victim order: leaf_first, root_first, mixed or flop_weighted (LRU with a bonus for the "
     "compute a checkpoint saves)", "config"),
    ("--mamba-lru-refresh", "mamba_lru_refresh", str, "node", "refresh on hit: node or path", "config"),
    ("--mamba-checkpoint-admission", "mamba_checkpoint_admission", str, "all",
     "which prefill chunks checkpoint (extra_buffer): all, or branch_and_end (Marconi: the branch point "
     "and the input's end only)", "config"),
    ("--mamba-flop-weight", "mamba_flop_weight", float, 32.0,
     "flop_weighted: ticks of recency one doubling of saved compute is worth (0 = plain LRU)", "config"),
    ("--mamba-flop-crossover", "mamba_flop_crossover", int, 65536,
     "flop_weighted: prefix length (tokens) where attention's quadratic cost equals the linear cost",
     "config"),
    ("--chunked-prefill-size", "chunked_prefill_size", int, 8192, "tokens per prefill chunk (-1 = none)", "config"),
    ("--page-size", "page_size", int, 1, "tokens per KV page (the simulator supports 1)", "config"),
    ("--disable-overlap-schedule", "disable_overlap_schedule", _bool, False,
     "no overlap scheduling (ping-pong P = 1); a switch, or true/false", "config"),
    ("--skip-decode-lock", "skip_decode_lock", _bool, False,
     "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK; a switch, or true/false", "config"),
    ("--memory-budget-gb", "budget_gib", float, None,
     "KV + state memory per rank in GiB (default 27.25: Kimi K3, one TP8 rank)", "budget"),
    ("--mamba-full-memory-ratio", "mamba_full_memory_ratio", float, 0.9,
     "state : KV memory ratio r (states get r/(1+r) of the budget)", "budget"),
    ("--max-mamba-cache-size", "max_mamba_cache_size", int, None, "state slots (overrides the ratio)", "budget"),
    ("--max-running-requests", "max_running_requests", int, None, "cap on running requests (request rows)",
     "options"),
    ("--mode", "mode", str, "timed", "timed (arrivals, concurrency) or sequential (one request at a time)",
     "options"),
    ("--arrival-time-scale", "arrival_time_scale", float, 1.0, "multiply trace timestamps by this", "options"),
    ("--prefill-tokens-per-s", "prefill_tokens_per_s", float, 40_000.0, "cost model: prefill speed", "cost"),
    ("--decode-step-s", "decode_step_s", float, 0.025, "cost model: seconds per decode step", "cost"),
    ("--decode-step-per-req-s", "decode_step_per_req_s", float, 0.0002,
     "cost model: extra seconds per decode step per running request", "cost"),
    ("--peer", "peer", _peer_name, None, "", "peer"),
]
# fmt: on
_WHERE = ("config", "budget", "options", "cost", "peer")


def _add_trace_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trace")
    g.add_argument(
        "--trace", default=None, help=f"trace file (block or token JSONL; default {DEFAULT_TRACE})"
    )
    g.add_argument(
        "--synthetic",
        choices=["chat", "system-prompt", "agent", "tree"],
        help="use a seeded synthetic workload instead of a trace file",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload (default 0)")
    g.add_argument("--trace-format", choices=["auto", "block", "token"], default="auto")
    g.add_argument("--block-size", type=_positive_int, default=512, help="tokens per block id (default 512)")
    g.add_argument("--limit", type=_positive_int, default=None, help="replay only the first N requests")


def _add_run_arguments(p: argparse.ArgumentParser, sweep: bool) -> None:
    g = p.add_argument_group("cache, memory and engine" + (" (comma-separated lists sweep)" if sweep else ""))
    for flag, dest, conv, default, help_text, _ in _SWEEPABLE:
        kind = _list_of(conv) if sweep else conv
        if dest == "peer":
            g.add_argument(flag, dest=dest, type=kind, default=None, metavar="NAME", help=_peer_help())
            continue
        extra: dict[str, Any] = {}
        if conv is _bool:  # a switch: alone it means true; an explicit value (or list) still works
            extra = {"nargs": "?", "const": [True] if sweep else True, "metavar": "BOOL"}
        g.add_argument(
            flag, dest=dest, type=kind, default=None, help=f"{help_text} (default {default})", **extra
        )
    g.add_argument(
        "--model", default="kimi-k3", help="model preset for bytes per token/slot (default kimi-k3)"
    )
    g.add_argument("--infinite", action="store_true", help="pools nothing fills (the strategy's ideal)")
    g.add_argument("--no-verify-states", action="store_true", help="skip the state-stamp checks (faster)")
    g.add_argument(
        "--check-invariants-every", type=int, default=0, help="cache.check_invariants() every N requests"
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Mamba-aware radix prefix cache: simulator, sweeps, planner.")
    sub = parser.add_subparsers(
        dest="command", metavar="{simulate,sweep,experiment,plan}", parser_class=_Parser
    )

    sim = sub.add_parser(
        "simulate",
        help="replay one trace under one configuration",
        description=("Replay a trace through the real MambaRadixCache and pools; print the metrics."),
    )
    _add_trace_arguments(sim)
    _add_run_arguments(sim, sweep=False)
    sim.add_argument("--out", help="append the JSON-lines result record to this file")
    sim.add_argument("--per-request", action="store_true", help="include per-request hits in the record")
    sim.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")

    sw = sub.add_parser(
        "sweep",
        help="run many configurations in parallel processes",
        description=(
            "Cartesian product of comma-separated flag values (or an experiment --definition), run in --jobs "
            "processes; results as JSON lines."
        ),
    )
    _add_trace_arguments(sw)
    _add_run_arguments(sw, sweep=True)
    sw.add_argument("--definition", help="an experiment definition JSON (instead of flag lists)")
    sw.add_argument("--jobs", type=_positive_int, default=2, help="worker processes (default 2)")
    sw.add_argument("--out", required=True, help="results JSON-lines file to write")
    sw.add_argument("--report", help="also write a markdown report with plots into this directory")

    ex = sub.add_parser(
        "experiment",
        help="the default experiment (report with tables and plots)",
        description=(
            "The Mooncake conversation trace under a Kimi-K3-like per-rank budget: strategies, eviction orders, "
            "per-path caps, track intervals, memory ratios and budgets. Writes results.jsonl, report.md and PNGs."
        ),
    )
    ex.add_argument("--definition", default=DEFAULT_DEFINITION, help=f"default {DEFAULT_DEFINITION}")
    ex.add_argument(
        "--out", default=DEFAULT_EXPERIMENT_OUT, help=f"output directory (default {DEFAULT_EXPERIMENT_OUT})"
    )
    ex.add_argument("--jobs", type=_positive_int, default=2, help="worker processes (default 2)")
    ex.add_argument(
        "--limit", type=_positive_int, default=None, help="override the definition's request count"
    )
    ex.add_argument("--quiet", action="store_true", help="no progress bar")
    ex.add_argument(
        "--report-only", action="store_true", help="redraw report.md and the plots from --out's results.jsonl"
    )

    pl = sub.add_parser("plan", help="capacity planner: split GPU memory between KV and state slots")
    try:
        from mamba_radix.capacity.cli import add_plan_arguments

        add_plan_arguments(pl)
    except ImportError:  # pragma: no cover - the planner lands separately
        pl.set_defaults(_plan_missing=True)
    return parser


# -------------------------------------------------------------------------------------------- helpers
def _progress(total: int | None, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="req",
        file=sys.stderr,
        disable=quiet or not sys.stderr.isatty(),
        dynamic_ncols=True,
        leave=False,
    )


def _single_params(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {w: {} for w in _WHERE}
    for _, dest, _, _, _, where in _SWEEPABLE:
        value = getattr(args, dest)
        if value is not None:
            out[where][dest] = value
    return out


def _trace_source(args: argparse.Namespace) -> tuple[str, list[Any] | None]:
    """(trace path, in-memory requests for --synthetic)."""
    if args.synthetic:
        if args.trace:
            raise CliError("give either --trace or --synthetic, not both")
        from mamba_radix.sim.synthetic import GENERATORS

        requests = GENERATORS[args.synthetic](seed=args.seed)
        if args.limit:
            requests = requests[: args.limit]
        return f"synthetic:{args.synthetic}:seed={args.seed}", requests
    path = args.trace or DEFAULT_TRACE
    if not os.path.isfile(path):
        raise CliError(f"trace file not found: {path}")
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
    if getattr(args, "per_request", False):
        options["keep_per_request"] = True
    spec = RunSpec(
        run_id=run_id,
        trace=trace,
        trace_format=args.trace_format,
        block_size=args.block_size,
        limit=args.limit,
        config=params["config"],
        model=args.model,
        infinite=args.infinite,
        options=options,
        cost=params["cost"],
        peer=params["peer"].get("peer"),
        synthetic=synthetic,
        **params["budget"],
    )
    spec.validate()
    return spec


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
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- commands
def cmd_simulate(args: argparse.Namespace) -> int:
    from mamba_radix.sim.sweep import run_one

    trace, requests = _trace_source(args)
    spec = _make_spec(args, "simulate", _single_params(args), trace)
    total = len(requests) if requests is not None else args.limit
    if total is None:
        from mamba_radix.sim.traces import scan_trace

        total = scan_trace(trace, args.trace_format, args.block_size).num_requests
    with _progress(total, "simulate", args.quiet) as bar:
        rec = run_one(spec, progress=lambda n: bar.update(n - bar.n), requests=requests)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    if args.json:
        print(json.dumps(rec["metrics"] | {"cache_stats": rec["cache_stats"]}, indent=2))
    else:
        print(_format_summary(rec))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from mamba_radix.sim.sweep import expand_definition

    if args.definition:
        definition = _load_definition(args.definition)
        specs = expand_definition(definition, base_dir=".")
    else:
        import itertools

        trace, requests = _trace_source(args)
        # a synthetic workload is generated again inside each worker (seeded: the same requests)
        synthetic = None if requests is None else {"generator": args.synthetic, "seed": args.seed}
        lists = {dest: getattr(args, dest) for _, dest, *_ in _SWEEPABLE if getattr(args, dest) is not None}
        keys = list(lists)
        specs = []
        where = {dest: w for _, dest, _, _, _, w in _SWEEPABLE}
        for i, values in enumerate(itertools.product(*(lists[k] for k in keys))):
            params: dict[str, dict[str, Any]] = {w: {} for w in _WHERE}
            for k, v in zip(keys, values, strict=True):
                params[where[k]][k] = v
            specs.append(_make_spec(args, f"{i:03d}", params, trace, synthetic))
        definition = None
    records = _run_with_bar(specs, args.jobs, args.out, getattr(args, "quiet", False))
    failed = [r for r in records if "error" in r]
    for r in failed:
        sys.stderr.write(f"{PROG} sweep: run {r['run_id']} failed: {r['error']}\n")
    if args.report:
        from mamba_radix.sim.report import write_report

        write_report(records, args.report, definition=definition)
    print(
        f"{len(records) - len(failed)} runs written to {args.out}"
        + (f"; report in {args.report}" if args.report else "")
    )
    return 1 if failed else 0


def _run_with_bar(specs: Sequence[Any], jobs: int, out: str | Path, quiet: bool) -> list[dict[str, Any]]:
    from mamba_radix.sim.sweep import run_sweep

    with _progress(len(specs), "runs", quiet) as bar:
        bar.unit = "run"
        return run_sweep(specs, jobs=jobs, out_path=out, on_done=lambda _: bar.update(1))


def _load_definition(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CliError(f"experiment definition not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None


def cmd_experiment(args: argparse.Namespace) -> int:
    import time

    from mamba_radix.sim.report import write_report
    from mamba_radix.sim.sweep import expand_definition

    definition = _load_definition(args.definition)
    if args.limit:
        definition["limit"] = args.limit
    base_dir = Path(args.definition).resolve().parent.parent  # definitions live in <repo>/experiments/
    specs = expand_definition(definition, base_dir=base_dir)
    out_dir = Path(args.out)
    if args.report_only:
        from mamba_radix.sim.report import load_records

        results = out_dir / "results.jsonl"
        if not results.is_file():
            raise CliError(f"no results to report: {results} not found; run the experiment first")
        info = (
            json.loads((out_dir / "run_info.json").read_text())
            if (out_dir / "run_info.json").is_file()
            else {}
        )
        report = write_report(
            load_records(results), out_dir, definition, info.get("runtime_s"), info.get("jobs")
        )
        print(f"report: {report}")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if not args.quiet:
        sys.stderr.write(
            f"{PROG} experiment: {len(specs)} runs x {definition.get('limit') or 'all'} requests of "
            f"{Path(definition['trace']).name}, {args.jobs} processes\n"
        )
    records = _run_with_bar(specs, args.jobs, out_dir / "results.jsonl", args.quiet)
    elapsed = time.perf_counter() - start
    (out_dir / "run_info.json").write_text(
        json.dumps({"runtime_s": round(elapsed, 1), "jobs": args.jobs}) + "\n"
    )
    failed = [r for r in records if "error" in r]
    for r in failed:
        sys.stderr.write(f"{PROG} experiment: run {r['run_id']} failed: {r['error']}\n")
    report = write_report(records, out_dir, definition=definition, runtime_s=elapsed, jobs=args.jobs)
    print(f"{len(records) - len(failed)}/{len(records)} runs in {elapsed:.0f} s; report: {report}")
    return 1 if failed else 0


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "_plan_missing", False):
        raise CliError("the capacity planner is not installed in this build")
    from mamba_radix.capacity.cli import run_plan

    return run_plan(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "simulate": cmd_simulate,
    "sweep": cmd_sweep,
    "experiment": cmd_experiment,
    "plan": cmd_plan,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point. Returns the exit code: 0 ok, 1 some sweep runs failed, 2 bad input."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    from mamba_radix.errors import MambaRadixError

    try:
        import torch

        torch.set_num_threads(1)  # tiny tensors: threads only add contention; sweeps use processes
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, MambaRadixError, OSError, ValueError, KeyError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        sys.stderr.write(f"{PROG} {args.command}: error: {message}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG} {args.command}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
