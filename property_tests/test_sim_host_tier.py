"""The host tier in the simulator (issue 25): flags, the transfer model, per-tier hits and bytes moved.

Runs ``simulate`` on the seeded synthetic chat workload at a small device budget (0.5 GiB: the device
evicts, so a host copy is worth something), with the real cache, its real host pools and the state-stamp
checks on, and reads the JSON-lines record.
"""

from __future__ import annotations

import json
import math
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from mamba_radix.cache import MambaRadixCache
from mamba_radix.cli import main
from mamba_radix.cost_model import HOST_LINK_PRESETS
from mamba_radix.errors import ConfigError
from mamba_radix.sim.report import load_records, write_report
from mamba_radix.sim.sweep import expand_definition, load_definition

BASE = ["simulate", "--synthetic", "chat", "--memory-budget-gb", "0.5", "--quiet"]


def _run(tmp_path: Path, name: str, *flags: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.jsonl"
    assert main([*BASE, *flags, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_tier_adds_host_hits_and_the_tiers_add_up(tmp_path: Path) -> None:
    off = _run(tmp_path, "off", "--limit", "60")
    on = _run(tmp_path, "on", "--limit", "60", "--host-memory-ratio", "4")
    assert "host_tier" not in off["metrics"]  # off: the summary is what it was
    m = on["metrics"]
    h = m["host_tier"]
    assert h["host_hit_tokens"] > 0 and h["host_hit_requests"] > 0 and h["load_backs"] > 0
    assert m["cached_tokens"] > off["metrics"]["cached_tokens"]
    assert h["device_hit_tokens"] + h["host_hit_tokens"] + h["miss_tokens"] == m["input_tokens"]
    assert h["device_hit_tokens"] + h["host_hit_tokens"] == m["cached_tokens"]
    assert math.isclose(h["device_hit_rate"] + h["host_hit_rate"] + h["miss_rate"], 1.0)
    # --host-memory-ratio 4: both host pools at four times the device pools
    assert h["host_state_slots"] == 4 * on["pools"]["state_slots"]
    assert h["host_kv_tokens"] == 4 * on["pools"]["kv_tokens"]


def test_bytes_moved_are_the_load_plans_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans: list[Any] = []
    apply = MambaRadixCache.apply_load_plan

    def recording(self: MambaRadixCache, plan: Any) -> Any:
        applied = apply(self, plan)
        plans.append(applied)
        return applied

    monkeypatch.setattr(MambaRadixCache, "apply_load_plan", recording)
    rec = _run(tmp_path, "bytes", "--limit", "60", "--host-memory-ratio", "4", "--host-link", "gh200-c2c")
    h, pools = rec["metrics"]["host_tier"], rec["pools"]
    kv_b, slot_b = pools["bytes_per_kv_token"], pools["bytes_per_state_slot"]
    assert plans and len(plans) == h["load_backs"]
    want = sum(p.num_tokens for p in plans) * kv_b + len(plans) * slot_b
    assert h["bytes_host_to_device"] == want > 0
    assert h["bytes_device_to_host"] == h["kv_tokens_backed_up"] * kv_b + h["states_backed_up"] * slot_b > 0
    gbps = HOST_LINK_PRESETS["gh200-c2c"].gb_per_s
    assert h["link"] == "gh200-c2c" and h["link_gb_per_s"] == gbps
    assert math.isclose(h["load_s"], want / (gbps * 1e9), rel_tol=1e-9)
    assert math.isclose(h["load_overlapped_s"] + h["load_exposed_s"], h["load_s"], rel_tol=1e-9)


def test_transfer_time_is_in_ttft(tmp_path: Path) -> None:
    # sequential: the cache does the same whatever the clock, so the TTFTs differ by the exposed loads only
    flags = ["--limit", "40", "--mode", "sequential", "--host-memory-ratio", "4"]
    fast = _run(tmp_path, "fast", *flags, "--host-link-gbps", "100000")
    slow = _run(tmp_path, "slow", *flags, "--host-link-gbps", "0.5")
    fm, sm = fast["metrics"], slow["metrics"]
    assert fm["cached_tokens"] == sm["cached_tokens"]
    exposed = sm["host_tier"]["load_exposed_s"] - fm["host_tier"]["load_exposed_s"]
    assert exposed > 0.1
    n = sm["requests"]
    assert math.isclose(n * (sm["ttft_mean_s"] - fm["ttft_mean_s"]), exposed, rel_tol=1e-6)
    # timed mode: a slow link shows in the load test's TTFT too
    timed_fast = _run(tmp_path, "tfast", "--limit", "40", "--host-memory-ratio", "4")
    timed_slow = _run(
        tmp_path, "tslow", "--limit", "40", "--host-memory-ratio", "4", "--host-link-gbps", "0.5"
    )
    assert timed_slow["metrics"]["host_tier"]["load_exposed_s"] > 0
    assert timed_slow["metrics"]["ttft_mean_ms"] > timed_fast["metrics"]["ttft_mean_ms"]


def test_summary_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--limit", "30"]) == 0
    assert "host tier" not in capsys.readouterr().out
    assert main([*BASE, "--limit", "30", "--host-kv-tokens", "40000", "--host-state-slots", "32"]) == 0
    out = capsys.readouterr().out
    assert "host tier           40,000 KV tokens, 32 state slots, write_through; link pcie5-x16" in out
    assert "hits by tier        device " in out and "host -> device " in out and "device -> host " in out


@pytest.mark.parametrize(
    "flags",
    [
        ["--host-link-gbps", "0"],
        ["--host-link", "pcie4"],
        ["--host-write-policy", "write_thru"],
        ["--host-memory-ratio", "-1"],
        ["--host-kv-tokens", "100"],  # without host state slots
        ["--host-link", "gh200-c2c"],  # without the tier
        ["--host-memory-ratio", "2", "--host-kv-tokens", "100", "--host-state-slots", "4"],
    ],
)
def test_bad_flags_are_one_line_errors(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--limit", "3", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err, err


def test_sweep_takes_the_host_flags(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    argv = ["sweep", "--synthetic", "chat", "--limit", "20", "--memory-budget-gb", "0.5", "--jobs", "1"]
    assert main([*argv, "--quiet", "--host-memory-ratio", "0,4", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    tiers = sorted("host_tier" in r["metrics"] for r in records)
    assert tiers == [False, True]
    # the report: a host-tier section with the tiered run's row only, and none without a tiered run
    tiered = next(r for r in records if "host_tier" in r["metrics"])
    h = tiered["metrics"]["host_tier"]
    text = write_report(records, tmp_path / "report").read_text()
    assert "## Host tier" in text
    section = text.split("## Host tier")[1].split("## All runs")[0]
    rows = [line for line in section.splitlines() if line.startswith(f"| {tiered['run_id']} |")]
    assert len(rows) == 1 and f"| {100 * h['host_hit_rate']:.2f} |" in rows[0]
    plain = [r for r in records if "host_tier" not in r["metrics"]]
    assert "## Host tier" not in write_report(plain, tmp_path / "plain").read_text()


def test_bundled_host_tier_definition_loads_and_its_smallest_run_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled ``host_tier`` definition: host memory at 0, 4x and 10x device for every workload, each
    write policy, and a load-back plot in GiB; its smallest device budget on chat, tier off and on, runs
    through ``experiment`` and the load-back plot draws the tiered run's bytes (the tier-off run has none)."""
    import matplotlib.axes

    path = files("mamba_radix") / "data" / "experiments" / "host_tier.json"
    definition = load_definition(str(path))
    specs = expand_definition(definition, check_traces=True)
    by_workload: dict[str, set[float]] = {}
    for s in specs:
        by_workload.setdefault(s.group.split(":")[0], set()).add(s.options["host_memory_ratio"])
    assert set(by_workload) == {"chat", "agent", "tree", "system-prompt", "conversation"}
    assert all(ratios == {0, 4, 10} for ratios in by_workload.values())
    policies = {s.config.get("host_write_policy") for s in specs if s.options["host_memory_ratio"]}
    assert {"write_through", "write_back"} <= policies
    # the smallest run: chat at its smallest budget, tier off and at 10x, on the first 40 requests
    chat = [
        g for g in definition["groups"] if g["name"] in ("chat: no host tier", "chat: host 10x, write_back")
    ]
    smallest = min(chat[0]["vary"]["budget_gib"])
    small = definition | {
        "groups": [g | {"vary": {"budget_gib": [smallest]}, "limit": 40} for g in chat],
        # the load-back plot over both runs: the tier-off run must be left out, not drawn at 0 GiB
        "plots": [
            {k: v for k, v in p.items() if k != "reference_groups"} | {"groups": [g["name"] for g in chat]}
            for p in definition["plots"]
            if p["file"].startswith("chat_")
        ],
    }
    small_path = tmp_path / "small.json"
    small_path.write_text(json.dumps(small))
    drawn: list[list[float]] = []
    plot = matplotlib.axes.Axes.plot

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) >= 2:
            drawn.append([float(y) for y in args[1]])
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    out = tmp_path / "run"
    assert (
        main(["experiment", "--definition", str(small_path), "--out", str(out), "--jobs", "1", "--quiet"])
        == 0
    )
    records = load_records(out / "results.jsonl")
    off, on = sorted(records, key=lambda r: "host_tier" in r["metrics"])
    assert "host_tier" not in off["metrics"]
    h = on["metrics"]["host_tier"]
    assert h["host_hit_tokens"] > 0 and on["metrics"]["token_hit_rate"] > off["metrics"]["token_hit_rate"]
    assert (out / "chat_hit_vs_memory.png").is_file() and (out / "chat_load_back_vs_memory.png").is_file()
    assert "## Host tier" in (out / "report.md").read_text()
    # the load-back plot: the tiered run's bytes in GiB, one point (the tier-off run is left out, not a 0)
    assert [h["bytes_host_to_device"] / (1 << 30)] in drawn and [0.0] not in drawn
    # a unit the report cannot draw is refused before anything is written
    bad = small | {"plots": [small["plots"][-1] | {"y_unit": "MB"}]}
    with pytest.raises(ConfigError, match="y_unit must be 'GiB'"):
        write_report(records, tmp_path / "bad", bad)
    assert not (tmp_path / "bad").exists()
