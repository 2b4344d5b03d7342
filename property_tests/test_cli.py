"""The ``mamba-radix`` CLI: --help everywhere, exit codes, one-line errors, simulate/sweep/experiment."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from mamba_radix.cli import main

REPO = Path(__file__).resolve().parents[1]

# a results path no run here writes and no earlier run left behind (a fixed name in /tmp once was)
NEVER_WRITTEN = os.path.join(tempfile.gettempdir(), f"mamba-radix-never-{uuid.uuid4().hex}.jsonl")


@pytest.mark.parametrize(
    "argv", [["--help"], ["simulate", "--help"], ["sweep", "--help"], ["experiment", "--help"]]
)
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    assert "usage:" in capsys.readouterr().out


def test_plan_is_wired_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def test_module_entry_point_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mamba_radix.cli", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and "simulate" in done.stdout


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], ()),
        (["bogus"], ("invalid choice",)),
        (["simulate", "--limit", "0"], ("--limit",)),
        (["simulate", "--mamba-track-interval", "x"], ("--mamba-track-interval",)),
        (["simulate", "--trace", "/nonexistent.jsonl"], ("not found",)),
        (
            ["simulate", "--synthetic", "chat", "--mamba-radix-cache-strategy", "fast"],
            ("--mamba-radix-cache-strategy",),
        ),
        (["simulate", "--synthetic", "chat", "--mamba-full-memory-ratio", "0.001"], ("ratio",)),
        (["simulate", "--check-invariants-every", "-1"], ("--check-invariants-every", "from 0")),
        (["simulate", "--limit", "x"], ("--limit", "integer")),
        (["simulate", "--memory-budget-gb", "1e15"], ("--memory-budget-gb",)),
        (["simulate", "--memory-budget-gb", "inf"], ("--memory-budget-gb",)),
        (["plan", "--input-len", "1000000000000", "--output-len", "10"], ("--input-len",)),
        (["plan", "--output-len", "1000000000000000", "--input-len", "10"], ("--output-len",)),
        (["simulate", "--trace", "/"], ("is a folder",)),
        (["simulate", "--synthetic", "chat", "--out", "/nonexistent/dir/r.jsonl"], ("does not exist",)),
        (["simulate", "--synthetic", "chat", "--kv-tokens", "1000"], ("both",)),
        (
            ["simulate", "--synthetic", "chat", "--kv-tokens", "100000000000", "--state-slots", "8"],
            ("--kv-tokens",),
        ),
        (["sweep", "--out", NEVER_WRITTEN, "--definition", "/nonexistent.json"], ("not found",)),
        (["experiment", "--definition", "/nonexistent.json"], ("not found",)),
        (
            ["experiment", "--workloads", "forest", "--limit", "3"],
            ("unknown workload 'forest'", "conversation"),
        ),
        (
            ["experiment", "--policies", "sift,sglang-0.5.23", "--limit", "3"],
            ("--policies must keep oracle",),
        ),
        (["experiment", "--backend", "ray", "--limit", "3"], ("local processes",)),
        (["experiment", "--definition", "peers", "--policies", "sift"], ("policy comparisons",)),
        (["sweep", "--definition", "default", "--out", NEVER_WRITTEN], ("policy comparison", "experiment")),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    if argv:
        _one_line_error(capsys, *words)


def test_bad_trace_row_reports_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, 2, 3]}\n')  # fmt: skip
    assert main(["simulate", "--trace", str(trace), "--block-size", "4", "--quiet"]) == 2
    _one_line_error(capsys, f"{trace}:2", "hash_ids")


def test_simulate_synthetic_prints_and_writes_a_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, rows = tmp_path / "r.jsonl", tmp_path / "per_request.csv"
    argv = ["simulate", "--synthetic", "agent", "--seed", "3", "--mode", "sequential", "--quiet", "--out", str(out),
            "--mamba-radix-cache-strategy", "extra_buffer", "--memory-budget-gb", "4", "--per-request", str(rows)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "token hit rate" in text and "KV-only matched" in text
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["params"]["strategy"] == "extra_buffer" and rec["params"]["budget_gib"] == 4.0
    table = list(csv.DictReader(rows.open()))
    assert list(table[0]) == ["index", "input_len", "hit", "kv_hit", "ideal", "ttft_s"]
    assert [int(r["index"]) for r in table] == list(range(rec["metrics"]["requests"]))
    assert sum(int(r["hit"]) for r in table) == rec["metrics"]["cached_tokens"] > 0
    assert sum(int(r["kv_hit"]) for r in table) == rec["metrics"]["kv_matched_tokens"]
    assert sum(int(r["input_len"]) for r in table) == rec["metrics"]["input_tokens"]
    # neither file is overwritten without --force, and nothing runs when one exists
    assert main(argv) == 2
    _one_line_error(capsys, str(out), "exists", "--force")
    assert main([*argv, "--force"]) == 0


def test_simulate_json_on_the_bundled_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["simulate", "--limit", "15", "--quiet", "--json", "--mamba-radix-cache-strategy", "no_buffer"])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["requests"] == 15 and 0 <= metrics["token_hit_rate"] <= metrics["ideal_hit_rate"]


def test_sweep_lists_make_a_cartesian_product_and_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "s.jsonl", tmp_path / "rep"
    argv = ["sweep", "--limit", "8", "--jobs", "1", "--quiet", "--out", str(out), "--report", str(report),
            "--mamba-radix-cache-strategy", "no_buffer,extra_buffer", "--mamba-full-memory-ratio", "0.5,0.9"]  # fmt: skip
    assert main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["params"]["strategy"], r["params"]["mamba_full_memory_ratio"]) for r in recs) == [
        ("extra_buffer", 0.5), ("extra_buffer", 0.9), ("no_buffer", 0.5), ("no_buffer", 0.9)
    ]  # fmt: skip
    assert "| run |" in (report / "report.md").read_text()


def test_experiment_writes_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    definition = json.loads((REPO / "experiments" / "sglang-knobs.json").read_text())
    # a bare file name that is not beside the definition names a bundled trace
    assert definition["trace"] == "mooncake_conversation_trace.jsonl"
    definition["groups"] = [
        {
            "name": "memory",
            "fixed": {"mamba_radix_cache_strategy": "extra_buffer"},
            "vary": {"budget_gib": [13.625, 27.25]},
        },
        {
            "name": "ratio",
            "fixed": {"mamba_radix_cache_strategy": "extra_buffer", "mamba_full_memory_ratio": 0.9},
        },
    ]
    path = tmp_path / "def.json"
    path.write_text(json.dumps(definition))
    out = tmp_path / "res"
    assert (
        main(
            [
                "experiment",
                "--definition",
                str(path),
                "--out",
                str(out),
                "--limit",
                "6",
                "--jobs",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    report = (out / "report.md").read_text()
    assert "hit_vs_memory.png" in report and (out / "hit_vs_memory.png").stat().st_size > 1000
    assert (out / "pressure_by_ratio.png").exists() and len(
        (out / "results.jsonl").read_text().splitlines()
    ) == 3
    # the report is redrawn from the results alone
    (out / "report.md").unlink()
    assert main(["experiment", "--definition", str(path), "--out", str(out), "--report-only"]) == 0
    assert "hit_vs_memory.png" in (out / "report.md").read_text()
    assert (
        main(["experiment", "--definition", str(path), "--out", str(tmp_path / "none"), "--report-only"]) == 2
    )


# ----------------------------------------------------------------------------------------------- peers
def test_peer_flag_conflicting_with_an_explicit_flag_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--synthetic", "tree", "--quiet", "--peer", "marconi-static", "--mamba-eviction-order", "leaf_first"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "mamba-radix simulate: error: --mamba-eviction-order conflicts with --peer marconi-static; drop one\n"
    )
    # under sweep the check runs per combination, before anything runs: no results file is written
    argv = ["sweep", "--synthetic", "tree", "--quiet", "--out", str(tmp_path / "x.jsonl"),
            "--peer", "sglang,marconi-static", "--mamba-lru-refresh", "path"]  # fmt: skip
    assert main(argv) == 2
    _one_line_error(capsys, "--mamba-lru-refresh conflicts with --peer sglang; drop one")
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["simulate", "--synthetic", "tree", "--peer", "vllm"]) == 2
    _one_line_error(capsys, "--peer", "marconi-static")
    # the preset's former name: one line naming the preset it became and the policy that kept the name
    for command in (["simulate"], ["sweep", "--out", str(tmp_path / "y.jsonl")]):
        assert main([*command, "--synthetic", "tree", "--peer", "marconi"]) == 2
        _one_line_error(capsys, "--peer", "'marconi-static'", "experiment --policies marconi")
    assert not (tmp_path / "y.jsonl").exists()


def test_simulate_with_a_peer_records_it_and_applies_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["simulate", "--synthetic", "tree", "--seed", "1", "--mode", "sequential", "--quiet",
              "--memory-budget-gb", "4", "--chunked-prefill-size", "512"]  # fmt: skip
    # the value the peer sets anyway is not a conflict
    outs = [tmp_path / "marconi-static.jsonl", tmp_path / "sglang.jsonl"]
    argv = [
        *common,
        "--out",
        str(outs[0]),
        "--peer",
        "marconi-static",
        "--mamba-eviction-order",
        "flop_weighted",
    ]
    assert main(argv) == 0
    assert "peer                marconi-static (admission branch_and_end" in capsys.readouterr().out
    assert main([*common, "--out", str(outs[1]), "--peer", "sglang"]) == 0
    marconi, sglang = (json.loads(o.read_text()) for o in outs)
    assert (marconi["params"]["peer"], sglang["params"]["peer"]) == ("marconi-static", "sglang")
    assert marconi["params"]["mamba_checkpoint_admission"] == "branch_and_end"
    # multi-chunk prompts (root 1,000 tokens, chunks of 512): marconi-static keeps fewer checkpoints
    assert marconi["cache_stats"]["checkpoints_inserted"] < sglang["cache_stats"]["checkpoints_inserted"]


def test_sweep_over_peers_on_a_synthetic_workload_reports_a_peer_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "s.jsonl", tmp_path / "rep"
    argv = ["sweep", "--synthetic", "tree", "--limit", "13", "--jobs", "1", "--quiet", "--out", str(out),
            "--report", str(report), "--peer", "sglang,marconi-static", "--mamba-checkpoint-admission", "all,branch_and_end",
            "--memory-budget-gb", "4"]  # fmt: skip
    assert main(argv) == 2  # (all, marconi-static) and (branch_and_end, sglang) conflict
    _one_line_error(capsys, "--mamba-checkpoint-admission conflicts with --peer ")
    argv = [*argv[: argv.index("--mamba-checkpoint-admission")], "--memory-budget-gb", "4"]
    assert main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["params"]["peer"] for r in recs) == ["marconi-static", "sglang"]
    assert {r["params"]["trace"] for r in recs} == {"synthetic:tree:seed=0"}
    assert {r["metrics"]["requests"] for r in recs} == {13}
    text = (report / "report.md").read_text()
    assert (
        "| run | group | peer | strategy |" in text
        and "| marconi-static | extra_buffer | flop_weighted |" in text
    )
    # without a peer, no peer column
    out2, report2 = tmp_path / "s2.jsonl", tmp_path / "rep2"
    assert main(["sweep", "--synthetic", "tree", "--limit", "3", "--jobs", "1", "--quiet", "--out", str(out2),
                 "--report", str(report2)]) == 0  # fmt: skip
    assert "| peer |" not in (report2 / "report.md").read_text()


def test_new_policy_flags_reach_the_config(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    argv = ["simulate", "--synthetic", "tree", "--limit", "4", "--quiet", "--out", str(out),
            "--mamba-radix-cache-strategy", "extra_buffer", "--mamba-checkpoint-admission", "branch_and_end",
            "--mamba-eviction-order", "flop_weighted", "--mamba-flop-weight", "8.5", "--mamba-flop-crossover", "4096"]  # fmt: skip
    assert main(argv) == 0
    p = json.loads(out.read_text())["params"]
    assert (p["mamba_checkpoint_admission"], p["mamba_eviction_order"]) == ("branch_and_end", "flop_weighted")
    assert (p["mamba_flop_weight"], p["mamba_flop_crossover"], p["peer"]) == (8.5, 4096, None)


# -------------------------------------------------------------------------------------- boolean switches
@pytest.mark.parametrize(
    ("args", "sweep_value", "single_value"),
    [
        ([], None, None),
        (["--disable-overlap-schedule"], [True], True),
        (["--disable-overlap-schedule", "false"], [False], False),
        (["--disable-overlap-schedule", "yes"], [True], True),
        (["--disable-overlap-schedule", "true,false"], [True, False], None),
    ],
)
def test_boolean_flags_are_switches_that_take_a_value(
    args: list[str], sweep_value: Any, single_value: Any
) -> None:
    from mamba_radix.cli import build_parser

    parser = build_parser()
    # a switch followed by another flag does not swallow it
    sw = parser.parse_args(["sweep", "--out", "x", *args, "--skip-decode-lock", "--limit", "3"])
    assert sw.disable_overlap_schedule == sweep_value and sw.skip_decode_lock == [True] and sw.limit == 3
    if single_value is not None or not args:
        sim = parser.parse_args(["simulate", *args, "--skip-decode-lock", "--limit", "3"])
        assert sim.disable_overlap_schedule == single_value and sim.skip_decode_lock is True


def test_a_switch_changes_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--synthetic", "chat", "--limit", "3", "--quiet"]
    outs = [tmp_path / "on.jsonl", tmp_path / "off.jsonl"]
    assert main([*base, "--out", str(outs[0]), "--disable-overlap-schedule"]) == 0
    assert main([*base, "--out", str(outs[1]), "--disable-overlap-schedule", "false"]) == 0
    on, off = (json.loads(o.read_text())["params"] for o in outs)
    # auto resolves to no_buffer without overlap scheduling, to extra_buffer with it
    assert (on["disable_overlap_schedule"], on["strategy"]) == (True, "no_buffer")
    assert (off["disable_overlap_schedule"], off["strategy"]) == (False, "extra_buffer")
    assert main([*base, "--skip-decode-lock", "maybe"]) == 2
    _one_line_error(capsys, "--skip-decode-lock", "true or false")


# ------------------------------------------------------------------------------- version, help, flags
def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    import mamba_radix

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mamba-radix {mamba_radix.__version__}"
    assert mamba_radix.__version__ == version("mamba-radix")


@pytest.mark.parametrize("command", ["simulate", "sweep", "experiment", "plan"])
def test_help_has_examples_and_one_default_per_flag(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "examples: mamba-radix " + command in text
    for flag in ("--memory-budget-gb", "--mamba-full-memory-ratio", "--mamba-track-interval"):
        if command == "experiment":
            break
        start = text.index(flag + " ", text.index("options:") if "options:" in text else 0)
        entry = text[start : text.index(" --", start + len(flag))]
        assert entry.count("(default") == 1, entry


def test_bad_values_name_the_flag_not_a_python_function(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--limit", "ten"]) == 2
    err = capsys.readouterr().err
    assert "--limit" in err and "_positive_int" not in err and "must be an integer from 1" in err


def test_library_argument_names_are_mapped_to_flags() -> None:
    from mamba_radix.flags import flag_message

    assert flag_message("budget_gib must be > 0; kv_tokens and state_slots together") == (
        "--memory-budget-gb must be > 0; --kv-tokens and --state-slots together"
    )
    assert (
        flag_message("mode timed; --mamba-track-interval stays") == "mode timed; --mamba-track-interval stays"
    )
    # name=value is how the flag is given; a switch's True is the flag alone
    assert flag_message("mamba_radix_cache_strategy='no_buffer' needs page_size=1 (got 16)") == (
        "--mamba-radix-cache-strategy no_buffer needs --page-size 1 (got 16)"
    )
    assert flag_message("set disable_overlap_schedule=False; mamba_kv_only_leaves=True") == (
        "set --disable-overlap-schedule false; --mamba-kv-only-leaves"
    )
    assert flag_message("file x exists; pass overwrite=True") == "file x exists; pass --force"
    assert flag_message("cost.decode_step_s >= 0") == "--decode-step-s >= 0"
    # a name without an underscore is a flag only as the subject (or as name=value)
    assert (
        flag_message("peer='marconi-static': mode must be 'timed'")
        == "--peer marconi-static: --mode must be 'timed'"
    )
    assert flag_message("the peer sets the mode; got 'x'") == "the peer sets the mode; got 'x'"
    # names no flag sets, words inside paths and values stay
    assert flag_message("model_supports_extra_buffer=True") == "model_supports_extra_buffer=True"
    assert flag_message("/tmp/page_size/a.jsonl got 'page_size'") == "/tmp/page_size/a.jsonl got 'page_size'"


# library arguments of a config error, and the same run's flags
CONFIG_ERROR_RUNS = [
    (
        {"mamba_radix_cache_strategy": "no_buffer", "page_size": 16},
        ["--mamba-radix-cache-strategy", "no_buffer", "--page-size", "16"],
        "--mamba-radix-cache-strategy no_buffer needs --page-size 1 (got 16); set --page-size 1 or use "
        "--mamba-radix-cache-strategy extra_buffer",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer_lazy", "disable_overlap_schedule": True},
        ["--mamba-radix-cache-strategy", "extra_buffer_lazy", "--disable-overlap-schedule"],
        "--mamba-radix-cache-strategy extra_buffer_lazy requires overlap scheduling; set "
        "--disable-overlap-schedule false or use --mamba-radix-cache-strategy extra_buffer",
    ),
    (
        {"mamba_radix_cache_strategy": "extra_buffer", "page_size": 48},
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "48"],
        "--mamba-track-interval 256 must be a multiple of --page-size 48; pick an interval that --page-size "
        "divides",
    ),
    (
        {"mamba_checkpoint_admission": "branch_and_end", "mamba_radix_cache_strategy": "no_buffer"},
        ["--mamba-checkpoint-admission", "branch_and_end", "--mamba-radix-cache-strategy", "no_buffer"],
        "--mamba-checkpoint-admission branch_and_end needs extra_buffer or extra_buffer_lazy (no_buffer "
        "copies the live state at every chunk end; the strategy in force is no_buffer); set "
        "--mamba-radix-cache-strategy extra_buffer, or use --mamba-checkpoint-admission all",
    ),
]


@pytest.mark.parametrize(
    ("fields", "flags", "line"), CONFIG_ERROR_RUNS, ids=[str(f) for f, _, _ in CONFIG_ERROR_RUNS]
)
def test_a_config_error_names_python_arguments_in_the_library_and_flags_in_the_cli(
    fields: dict[str, Any], flags: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mamba_radix import CacheConfig, ConfigError

    with pytest.raises(ConfigError) as info:
        CacheConfig(**fields)
    library = str(info.value)
    assert "--" not in library and any(name in library for name in fields), library
    assert main(["simulate", "--synthetic", "chat", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"mamba-radix simulate: error: {line}\n"
    assert not any(name in err for name in fields), err


def test_an_error_that_is_not_the_librarys_is_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import mamba_radix.cli as cli

    def boom(args: Any) -> int:
        raise KeyError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "simulate", boom)
    with pytest.raises(KeyError, match="a bug"):
        main(["simulate", "--synthetic", "chat"])


def test_plan_and_simulate_give_the_same_pools_for_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--mamba-ssm-dtype", "float32", "--tp-size", "4"]):
        assert main(["plan", "--model", "kimi-k3", "--memory-budget-gb", "27.25", "--json", *extra]) == 0
        planned = json.loads(capsys.readouterr().out)
        argv = [
            "simulate",
            "--synthetic",
            "chat",
            "--limit",
            "2",
            "--quiet",
            "--json",
            "--memory-budget-gb",
            "27.25",
        ]
        out = Path(tempfile_dir()) / f"r{len(extra)}.jsonl"
        assert main([*argv, "--out", str(out), *extra]) == 0
        capsys.readouterr()
        pools = json.loads(out.read_text())["pools"]
        assert (pools["state_slots"], pools["kv_tokens"]) == (
            planned["max_mamba_cache_size"],
            planned["num_tokens"],
        ), extra


def tempfile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp()


# --------------------------------------------------------------------------------- pools and outputs
def test_exact_pool_sizes_and_page_size_reach_the_run(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    argv = ["simulate", "--synthetic", "chat", "--limit", "4", "--quiet", "--out", str(out),
            "--kv-tokens", "300000", "--state-slots", "40", "--page-size", "16"]  # fmt: skip
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    assert (rec["pools"]["kv_tokens"], rec["pools"]["state_slots"]) == (300_000, 40)
    assert (rec["params"]["kv_tokens"], rec["params"]["state_slots"], rec["params"]["page_size"]) == (
        300_000,
        40,
        16,
    )


def test_experiment_never_overwrites_a_results_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definition = tmp_path / "tiny.json"
    definition.write_text(json.dumps({
        "trace": "mooncake_conversation_trace.jsonl", "limit": 3, "base": {"mode": "sequential"},
        "groups": [{"name": "g", "vary": {"mamba_radix_cache_strategy": ["no_buffer", "extra_buffer"]}}],
    }))  # fmt: skip
    root = tmp_path / "results"
    base = ["experiment", "--definition", str(definition), "--jobs", "1", "--quiet"]
    assert main([*base, "--results-dir", str(root)]) == 0
    assert main([*base, "--results-dir", str(root)]) == 0
    folders = sorted(p.name for p in root.iterdir())
    assert len(folders) == 2 and all(f.startswith("tiny-") for f in folders)  # a new folder each time
    capsys.readouterr()
    out = root / folders[0]
    before = (out / "results.jsonl").read_text()
    assert main([*base, "--out", str(out)]) == 2
    _one_line_error(capsys, str(out), "not empty", "--force")
    assert (out / "results.jsonl").read_text() == before
    assert main([*base, "--out", str(out), "--force"]) == 0
    assert main([*base, "--out", str(tmp_path / "missing" / "deeper")]) == 2
    _one_line_error(capsys, "does not exist")


def test_a_definition_with_problems_reports_each_on_one_line_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definition = tmp_path / "bad.json"
    definition.write_text(json.dumps({
        "trace": "no_such_trace.jsonl", "limit": 3,
        "groups": [
            {"name": "a", "vary": {"mamba_track_interval": [128, 256]}, "fixed": {"mamba_bogus": 1}},
            {"name": "b", "fixed": {"mamba_radix_cache_strategy": "fast"}},
            {"name": "c", "synthetic": {"generator": "forest"}},
        ],
    }))  # fmt: skip
    out = tmp_path / "out"
    for argv in (
        ["experiment", "--definition", str(definition), "--out", str(out)],
        ["sweep", "--definition", str(definition), "--out", str(tmp_path / "s.jsonl")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 4, err
        assert "trace file not found" in err[0] and str(tmp_path / "no_such_trace.jsonl") in err[0]
        assert "group 'a': unknown parameter 'mamba_bogus'" in err[1]
        # a definition speaks in parameter names, so its problems keep them
        assert "group 'b': mamba_radix_cache_strategy must be one of" in err[2]
        assert "group 'c': synthetic workload" in err[3]
    assert not out.exists() and not (tmp_path / "s.jsonl").exists()  # no partial report


def test_sweep_and_experiment_find_a_definitions_trace_alike(tmp_path: Path) -> None:
    """A relative trace is looked up beside the definition (then among the bundled traces), whatever
    the current folder, by both commands."""
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1, "input_length": 8, "output_length": 2, "hash_ids": [1, 3]}\n'
    )
    (folder / "d.json").write_text(json.dumps({
        "trace": "t.jsonl", "block_size": 4, "base": {"mode": "sequential"}, "groups": [{"name": "g"}],
    }))  # fmt: skip
    assert main(["sweep", "--definition", str(folder / "d.json"), "--out", str(tmp_path / "s.jsonl"), "--quiet",
                 "--jobs", "1"]) == 0  # fmt: skip
    assert main(["experiment", "--definition", str(folder / "d.json"), "--out", str(tmp_path / "e"), "--quiet",
                 "--jobs", "1"]) == 0  # fmt: skip
    (s,) = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    (e,) = [json.loads(x) for x in (tmp_path / "e" / "results.jsonl").read_text().splitlines()]
    assert s["params"]["trace"] == e["params"]["trace"] == "t.jsonl" and s["metrics"] == e["metrics"]


def test_sweep_report_draws_plots_for_what_varies(tmp_path: Path) -> None:
    report = tmp_path / "rep"
    argv = ["sweep", "--synthetic", "chat", "--limit", "6", "--jobs", "1", "--quiet", "--out", str(tmp_path / "s.jsonl"),
            "--report", str(report), "--mamba-track-interval", "64,256", "--mamba-max-states-per-path=-1,2"]  # fmt: skip
    assert main(argv) == 0
    text = (report / "report.md").read_text()
    for name in ("hit_vs_mamba_track_interval.png", "hit_vs_mamba_max_states_per_path.png", "pressure.png"):
        assert f"]({name})" in text and (report / name).stat().st_size > 1000
    # the report folder is not overwritten either
    assert main([*argv[:-3], "--out", str(tmp_path / "s2.jsonl")]) == 2


def test_requests_that_cannot_fit_are_counted_and_warned(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--limit", "20", "--kv-tokens", "20000", "--state-slots", "64", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    rejected = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(rejected) == 1 and "4 requests can never fit the pools" in rejected[0]
    assert "rejected            4 requests that can never fit" in captured.out
    assert "requests            16 " in captured.out


def test_runs_too_large_to_simulate_are_refused_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--synthetic", "chat", "--memory-budget-gb", "50000", "--quiet"]) == 2
    _one_line_error(capsys, "--memory-budget-gb 50000 gives", "KV tokens, more than the simulator's limit")
    huge = tmp_path / "huge.jsonl"  # one request of 204.8M tokens: a request table of 72 GiB
    blocks = 400_000
    huge.write_text(json.dumps({"timestamp": 0, "input_length": blocks * 512, "output_length": 10,
                                "hash_ids": list(range(blocks))}) + "\n")  # fmt: skip
    assert main(["simulate", "--trace", str(huge), "--quiet"]) == 2
    _one_line_error(capsys, "GiB of host memory", "MAMBA_RADIX_SIM_MEMORY_GIB")


def test_sweep_definition_with_other_run_flags_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "sweep",
        "--definition",
        "peers",
        "--out",
        str(tmp_path / "s.jsonl"),
        "--mamba-track-interval",
        "128",
    ]
    assert main(argv) == 2
    _one_line_error(capsys, "--definition describes every run")
    assert not (tmp_path / "s.jsonl").exists()


def test_block_convention_flag_reaches_the_loader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--block-convention floor`` replays a trace with one id per full block; ``ceil`` on the same file
    is a one-line error naming the file, the line and the field."""
    path = tmp_path / "floor.jsonl"
    rows = [{"timestamp": t, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]} for t in (0, 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [
        "simulate",
        "--trace",
        str(path),
        "--block-size",
        "4",
        "--kv-tokens",
        "1000",
        "--state-slots",
        "20",
    ]
    assert main([*base, "--block-convention", "floor", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*base, "--block-convention", "ceil", "--quiet"]) == 2
    _one_line_error(capsys, "floor.jsonl:1", "hash_ids", "ceil")


def test_simulate_takes_a_model_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``--model`` is a run's model, not a deployment field (it once reached RunSpec's deployment and
    was refused as an unknown field)."""
    argv = ["simulate", "--synthetic", "chat", "--model", "qwen3-next-80b-a3b", "--quiet", "--limit", "20"]
    assert main(argv) == 0, capsys.readouterr().err


# ------------------------------------------------------------------------------ the main job (policies)
def test_the_default_experiment_is_the_policy_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --definition: the bundled `default`, the policy comparison, into a new folder NAME-<UTC> in
    --results-dir; --workloads/--policies pick a subset; --report-only redraws it; the command is recorded."""
    root = tmp_path / "results"
    argv = ["experiment", "--limit", "8", "--workloads", "chat,tree", "--policies", "sglang-0.5.23,oracle",
            "--jobs", "1", "--quiet", "--results-dir", str(root)]  # fmt: skip
    assert main(argv) == 0
    (folder,) = root.iterdir()
    assert folder.name.startswith("default-")
    rows = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    assert {r["workload"] for r in rows} == {"chat", "tree"} and {r["policy"] for r in rows} == {
        "sglang-0.5.23",
        "oracle",
    }
    assert {r["regime"] for r in rows} == {"slots bind", "KV binds"} and all(r["requests"] == 8 for r in rows)
    info = json.loads((folder / "run_info.json").read_text())
    assert info["command"] == "mamba-radix " + " ".join(argv) and info["kind"] == "policies"
    report = (folder / "report.md").read_text()
    assert (
        "## Each policy as a fraction of the oracle" in report and "## Compared with the reference" in report
    )
    assert (folder / "chat.png").stat().st_size > 1000 and (folder / "overview.png").is_file()
    assert "not comparable" in report.lower()  # 8 requests here, the reference has more
    (folder / "report.md").unlink()
    assert main(["experiment", "--out", str(folder), "--report-only"]) == 0
    assert "## Hit rates at every point" in (folder / "report.md").read_text()
    capsys.readouterr()
    assert main([*argv[:-2], "--out", str(folder)]) == 2  # never overwritten without --force
    _one_line_error(capsys, "not empty")


def test_the_former_default_is_a_named_definition(tmp_path: Path) -> None:
    """`--definition sglang-knobs` is the old one-factor sweep, with its reference results."""
    from mamba_radix.data import bundled_definitions

    assert {"default", "sglang-knobs", "peers"} <= set(bundled_definitions())
    out = tmp_path / "k"
    assert main(["experiment", "--definition", "sglang-knobs", "--limit", "3", "--jobs", "1", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    assert len((out / "results.jsonl").read_text().splitlines()) == 14
    report = (out / "report.md").read_text()
    assert "sglang-knobs.reference.jsonl" in report and (out / "hit_vs_memory.png").is_file()


# ------------------------------------------- bench_serving's load test, launch settings, SGLang env vars
SEED_SETTINGS = (
    '{ "model_path": "/models/kimi-k3", "tp_size": 8, "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": '
    '"bfloat16", "mamba_full_memory_ratio": 0.15, "mamba_radix_cache_strategy": "extra_buffer", '
    '"mamba_track_interval": 256, "chunked_prefill_size": 6144, "max_running_requests": 64, '
    '"enable_linear_replayssm_spec": true, "speculative_dspark_block_size": 7, "linear_replayssm_cache_len": 16, '
    '"cuda_graph_max_bs_decode": 64, "enable_overlap_schedule": true }'
)
SEED_LOAD = ["--dataset-name", "random", "--random-input-len", "16384", "--random-output-len", "3072",
             "--num-prompts", "128", "--request-rate", "4"]  # fmt: skip


def _engine_has(option: str) -> bool:
    from dataclasses import fields

    from mamba_radix.sim.engine import EngineOptions

    return option in {f.name for f in fields(EngineOptions)}


def test_the_seeds_load_test_runs_as_one_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "settings.json"
    settings.write_text(SEED_SETTINGS)
    out = tmp_path / "run.jsonl"
    concurrency = ["--max-concurrency", "32"] if _engine_has("max_concurrency") else []
    argv = ["simulate", *SEED_LOAD, *concurrency, "--config", str(settings), "--quiet", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    # the speculative settings size the pools (sizing only); the CUDA graph one changes nothing modelled
    assert "ignored (no effect on what simulate models): cuda_graph_max_bs_decode\n" in err
    assert "sizing only: enable_linear_replayssm_spec=True" in err
    rec = json.loads(out.read_text())
    p = rec["params"]
    assert (
        p["trace"].startswith("synthetic:random:in=16384,out=3072,n=128")
        and rec["metrics"]["requests"] == 128
    )
    assert (p["kv_cache_dtype"], p["mamba_ssm_dtype"], p["chunked_prefill_size"]) == (
        "fp8_e4m3",
        "bfloat16",
        6144,
    )
    assert (p["strategy"], p["disable_overlap_schedule"], p["max_running_requests"]) == (
        "extra_buffer",
        False,
        64,
    )
    assert "log" not in p
    if concurrency:
        assert p["max_concurrency"] == 32


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--request-rate", "0"], ("--request-rate", "> 0")),
        (["--request-rate", "-4"], ("--request-rate", "> 0")),
        (["--max-concurrency", "0"], ("--max-concurrency", "from 1")),
        (["--random-range-ratio", "1.5"], ("--random-range-ratio",)),
        (["--num-prompts", "0"], ("--num-prompts",)),
        (["--request-rate-distribution", "gamma"], ("--request-rate-distribution",)),
        (["--trace", "x.jsonl"], ("--dataset-name",)),
        (["--seed", str(2**40)], ("seed",)),
    ],
)
def test_bad_load_test_values_are_one_line_and_exit_2(
    extra: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--dataset-name", "random", "--num-prompts", "4", *extra]) == 2
    _one_line_error(capsys, *words)


def test_load_flags_without_the_dataset_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--synthetic", "chat", "--request-rate", "4", "--num-prompts", "9"]) == 2
    _one_line_error(capsys, "--num-prompts, --request-rate", "add --dataset-name random")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            '{"tp_size": 8, "chunked_prefil_size": 4096}',
            ("chunked_prefil_size", "did you mean chunked_prefill_size?"),
        ),
        ('{"tp_size": 8,', ("not valid JSON",)),
        ('{"page_size": "big"}', ("page_size", "integer")),
        (None, ("config file not found",)),
    ],
)
def test_a_bad_config_file_is_one_line_exit_2_and_runs_nothing(
    text: str | None, words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "settings.json"
    if text is not None:
        path.write_text(text)
    out = tmp_path / "run.jsonl"
    assert (
        main(["simulate", "--synthetic", "chat", "--limit", "2", "--config", str(path), "--out", str(out)])
        == 2
    )
    _one_line_error(capsys, *words)
    assert not out.exists()


def test_dspark_block_size_sets_the_verify_window(capsys: pytest.CaptureFixture[str]) -> None:
    from mamba_radix.cli import build_parser
    from mamba_radix.cli._common import resolve_linked_flags

    args = build_parser().parse_args(["plan", "--speculative-dspark-block-size", "7"])
    resolve_linked_flags(args)
    assert args.speculative_num_draft_tokens == 8
    argv = ["plan", "--speculative-dspark-block-size", "7", "--speculative-num-draft-tokens", "4"]
    assert main(argv) == 2
    _one_line_error(capsys, "verify window of 8 tokens", "--speculative-num-draft-tokens is 4")
    # with ReplaySSM the window sets the ring's least length: 8 verify tokens need L >= 16
    argv = ["plan", "--enable-linear-replayssm-spec", "--speculative-dspark-block-size", "15",
            "--linear-replayssm-cache-len", "16", "--memory-budget-gb", "27.25"]  # fmt: skip
    assert main(argv) == 2
    _one_line_error(capsys, "16 verify tokens")


def test_sglang_env_vars_are_the_defaults_and_a_flag_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mamba_radix.cli import build_parser
    from mamba_radix.flags import apply_env_defaults

    def parsed(*argv: str, command: str = "simulate") -> Any:
        args = build_parser().parse_args([command, *argv])
        return args, apply_env_defaults(args, command)

    monkeypatch.setenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "Y")
    monkeypatch.setenv("SGLANG_MAMBA_CONV_DTYPE", "float32")
    args, warnings = parsed()
    assert (args.skip_decode_lock, args.mamba_conv_dtype, warnings) == (True, "float32", [])
    args, _ = parsed("--skip-decode-lock", "false", "--mamba-conv-dtype", "bfloat16", command="plan")
    assert (args.skip_decode_lock, args.mamba_conv_dtype) == (False, "bfloat16")
    args, _ = parsed("--out", "x", command="sweep")  # a sweep is its flags alone
    assert args.skip_decode_lock is None
    monkeypatch.setenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "on")  # not an EnvBool value: SGLang warns too
    args, warnings = parsed()
    assert args.skip_decode_lock is None and "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK='on'" in warnings[0]
    monkeypatch.setenv("SGLANG_MAMBA_CONV_DTYPE", "int4")
    assert main(["plan", "--memory-budget-gb", "27.25"]) == 2
    _one_line_error(capsys, "$SGLANG_MAMBA_CONV_DTYPE", "--mamba-conv-dtype")


def test_the_env_var_reaches_the_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--memory-budget-gb", "27.25", "--json"]
    assert main(argv) == 0
    off = capsys.readouterr().out
    monkeypatch.setenv("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "1")
    assert main(argv) == 0
    on = capsys.readouterr().out
    assert on != off and main([*argv, "--skip-decode-lock", "false"]) == 0
    assert capsys.readouterr().out == off


def test_help_prints_each_switchs_real_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())

    def entry(flag: str) -> str:
        start = text.index(flag + " [BOOL]", text.index("options:"))
        return text[start : text.index(" --", start + len(flag))]

    assert "(default true)" in entry("--mamba-kv-only-leaves")  # on, as CacheConfig (SGLang 0.5.23)
    assert "(default false)" in entry("--mamba-decode-insert")
    assert "$SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK sets the default" in entry("--skip-decode-lock")
    ratio = text[text.index("--random-range-ratio X", text.index("options:")) :][:300]
    assert "(default 0.0)" in ratio and "default 1.0" not in ratio
    assert "--request-rate X requests sent per second (inf: all at time 0) (default inf)" in text


def test_cost_preset_and_fit_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import mamba_radix.cost_model as cost_model

    base = ["simulate", "--synthetic", "chat", "--limit", "3", "--quiet"]
    assert main([*base, "--fit-cost-from", str(tmp_path / "none.log")]) == 2
    _one_line_error(capsys, "--fit-cost-from", "no such file")
    presets = getattr(cost_model, "COST_PRESETS", None)
    if not presets:
        assert main([*base, "--cost-preset", "kimi-k3-8xh200"]) == 2
        _one_line_error(capsys, "--cost-preset", "no cost presets")
        pytest.skip("cost_model.COST_PRESETS is the engine side's (issue 30 item 3)")
    out = tmp_path / "run.jsonl"
    argv = [*base, "--cost-preset", "kimi-k3-8xh200", "--decode-step-s", "0.5", "--out", str(out)]
    assert main(argv) == 0
    cost = json.loads(out.read_text())["params"]["cost"]
    assert cost["decode_step_s"] == 0.5  # the flag overrides the preset's field
    assert cost["prefill_tokens_per_s"] == presets["kimi-k3-8xh200"].prefill_tokens_per_s
    assert main([*base, "--cost-preset", "kimi-k3-8xh200", "--fit-cost-from", str(out)]) == 2
    _one_line_error(capsys, "not both")


def test_log_every_prints_scheduler_lines_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    if not _engine_has("log_every"):
        pytest.skip("EngineOptions.log_every is the engine side's (issue 30 item 3)")
    argv = ["simulate", "--dataset-name", "random", "--num-prompts", "8", "--random-input-len", "2048",
            "--random-output-len", "64", "--log-every", "10", "--json"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # stdout stays JSON
    assert "Decode batch" in err and "Prefill batch" in err
