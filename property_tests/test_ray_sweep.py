"""``sweep --backend ray``: each run a Ray task on a local Ray instance the test starts; the records are
exactly those of the local process pool (only ``wall_s`` differs), streamed as runs finish, with
progress in requests. Skipped when Ray is not installed (it is in the ``[test]`` extra)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from mamba_radix.cli import main  # noqa: E402 - after the skip
from mamba_radix.sim.sweep import RunSpec, run_sweep  # noqa: E402


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray instance of 2 CPUs for this module (the backend reuses a running one)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _specs() -> list[RunSpec]:
    base: dict[str, Any] = {"mode": "sequential"}
    return [
        RunSpec(run_id="000", trace="synthetic:tree", synthetic={"generator": "tree", "seed": 2}, limit=9,
                options=base, budget_gib=4.0, config={"mamba_radix_cache_strategy": "extra_buffer"}),
        RunSpec(run_id="001", trace="synthetic:tree", synthetic={"generator": "tree", "seed": 2}, limit=9,
                options=base, budget_gib=4.0, config={"mamba_radix_cache_strategy": "no_buffer"}),
        RunSpec(run_id="002", trace="synthetic:chat", synthetic={"generator": "chat", "seed": 5}, limit=7,
                options=base, budget_gib=2.0, mamba_full_memory_ratio=0.5),
    ]  # fmt: skip


def _outcome(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != "wall_s"}


def test_ray_backend_gives_exactly_the_local_pool_results(local_ray: None, tmp_path: Path) -> None:
    specs = _specs()
    local = run_sweep(specs, jobs=2, out_path=tmp_path / "local.jsonl")
    done: list[str] = []
    progress: dict[str, int] = {}
    on_ray = run_sweep(
        specs,
        backend="ray",
        out_path=tmp_path / "ray.jsonl",
        on_done=lambda rec: done.append(rec["run_id"]),
        on_progress=lambda run_id, n: progress.__setitem__(run_id, max(n, progress.get(run_id, 0))),
    )
    assert [r["run_id"] for r in on_ray] == ["000", "001", "002"]  # in spec order
    assert all("error" not in r for r in on_ray)
    assert [_outcome(r) for r in on_ray] == [_outcome(r) for r in local]
    # streamed: every record went to on_done and to the file as it finished
    assert sorted(done) == ["000", "001", "002"]
    lines = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert sorted(r["run_id"] for r in lines) == ["000", "001", "002"]
    # progress arrived from inside the tasks, in requests
    assert progress and all(0 < n <= 9 for n in progress.values())


def test_sweep_cli_on_ray(local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_local, out_ray = tmp_path / "l.jsonl", tmp_path / "r.jsonl"
    argv = ["sweep", "--synthetic", "agent", "--limit", "6", "--mode", "sequential", "--quiet",
            "--memory-budget-gb", "4", "--mamba-track-interval", "64,256"]  # fmt: skip
    assert main([*argv, "--out", str(out_local), "--jobs", "1"]) == 0
    assert main([*argv, "--out", str(out_ray), "--backend", "ray"]) == 0
    assert "2 runs written to" in capsys.readouterr().out

    def read(p: Path) -> list[dict[str, Any]]:
        return sorted(
            (_outcome(json.loads(x)) for x in p.read_text().splitlines()), key=lambda r: r["run_id"]
        )

    assert read(out_ray) == read(out_local)
