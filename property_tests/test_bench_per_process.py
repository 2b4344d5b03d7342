"""The per-process benchmark (``benchmarks/bench_per_process.py``) kept from rotting: at a tiny size (a few
trace requests, one round, one SGLang release) it must print every table with the per-request hits identical
between ours and SGLang, and say so; bad usage exits 2. The parent runs in this process (its imports are
already paid); each system's worker is a fresh interpreter, as in a real run. About 10 s of CPU.

Skipped where SGLang's wheel cannot be had (no network, nothing cached): that is not a fault of the code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
VERSION = "0.5.20"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The script as a module (benchmarks/ is not a package; it imports bench_vs_sglang beside it)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_per_process", BENCHMARKS / "bench_per_process.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_a_tiny_run_prints_the_tables_with_identical_hits(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from mamba_radix.testing.sglang import SGLangUnavailableError, load_sglang

    try:
        load_sglang(VERSION)
    except SGLangUnavailableError as err:  # no network: not a failure of the code under test
        pytest.skip(str(err))
    out = tmp_path / "report.md"
    code = bench.main(["--limit", "6", "--repeats", "1", "--versions", VERSION, "--out", str(out)])
    text = capsys.readouterr().out
    assert code == bench.EXIT_OK, text
    assert out.read_text().strip() == text.strip()
    assert f"ours ({VERSION} rules) vs SGLang {VERSION}: 6 / 6 identical in every round." in text
    assert "HITS DIFFER" not in text
    for title in (
        "### Per operation",
        "### Ratios SGLang / ours",
        "### Whole replay",
        "### Memory at the end",
    ):
        assert title in text, title
    rows = [line for line in text.splitlines() if line.startswith("| cache_finished_req")]
    assert len(rows) == 3, rows  # ours, SGLang, and the ratio row
    memory = [line for line in text.splitlines() if line.startswith(f"| SGLang {VERSION} |")][
        -1
    ]  # last table
    cells = [c.strip() for c in memory.strip("|").split("|")]
    assert int(cells[4].replace(",", "")) > 0 and int(cells[5].replace(",", "")) > 0  # nodes, cached tokens


def test_a_hit_difference_is_reported_for_the_pair_and_the_round(bench: ModuleType) -> None:
    def system(kind: str, *rounds: list[int]) -> object:
        return bench.System(kind, VERSION, [{"hits": list(hits)} for hits in rounds])

    same = [0, 64, 128]
    assert bench.hit_differences([system("ours", same, same), system("sglang", same, same)]) == []
    problems = bench.hit_differences([system("ours", same, same), system("sglang", [0, 64, 192], same)])
    assert problems == [
        f"SGLang {VERSION}: round 2's hits differ from round 1's",
        f"ours ({VERSION} rules) vs SGLang {VERSION}: 1 of 3 requests differ; first request 2: 128 vs 192 tokens",
    ]


@pytest.mark.parametrize(
    "argv", [["--repeats", "0"], ["--limit", "-1"], ["--trace", "/no/such/trace.jsonl"], ["--bogus"]]
)
def test_bad_usage_exits_2(bench: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    assert err.value.code == bench.EXIT_USAGE
    assert "error:" in capsys.readouterr().err
