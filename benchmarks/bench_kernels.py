"""Bandwidth of the state-movement kernels against torch indexing and a plain device copy.

Pools are Kimi-K3-like, per TP rank: 69 KDA layers, conv ``3 x 4608`` bf16 and temporal ``12 x 128 x 128``
in bf16 or fp32 (29.0 / 56.2 MB per slot over all layers). For 1/4/16/64 slot pairs it times, in one run:

- ``ours``: :func:`mamba_radix.state_ops.copy_slots` on the Triton path (one launch, all layers, both tensors);
- ``torch``: SGLang-style advanced indexing, ``t[:, dst] = t[:, src]`` per tensor;
- ``ceiling``: one contiguous ``copy_`` of the same number of bytes;

and prints microseconds, TB/s counting read + write, ours/ceiling and torch/ours. Extra rows: fork (1 -> N),
masked track, gather to a device staging buffer, a tile-size sweep, launch overhead per call, CUDA-graph
replay, and gather into pinned host memory (D2H). Every operation is checked bit-exact against torch once.
L2 is flushed (a 256 MB write) before each timed repetition, so the numbers are cold-cache like a real
copy-on-write; the median of the repetitions is reported.

Runs from the source tree with no installs (``PYTHONPATH=<repo>``; ``mamba_radix_kernels`` is found as
``<repo>/kernels`` if it is not installed)::

    python benchmarks/bench_kernels.py --json results.json          # on the GPU
    python benchmarks/bench_kernels.py --dry-run                     # CPU, tiny shapes, Triton interpreter

``--dry-run`` (the default without CUDA) runs tiny shapes on the CPU under ``TRITON_INTERPRET=1`` so the
script itself is exercised; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    p.add_argument("--pairs", type=int, nargs="+", default=None, help="slot-pair counts (default 1 4 16 64)")
    p.add_argument("--ssm-dtypes", nargs="+", default=["bfloat16", "float32"], help="temporal state dtypes")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per measurement (median kept)")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 before each repetition")
    p.add_argument("--no-extras", action="store_true", help="only the copy table")
    p.add_argument("--json", type=Path, default=None, help="write all results to this JSON file")
    return p.parse_args(argv)


ARGS = _parse(None if __name__ == "__main__" else [])
if __name__ == "__main__":
    import torch as _torch_probe

    if ARGS.dry_run or not _torch_probe.cuda.is_available():
        ARGS.dry_run = True
        # Triton reads this when the kernels are decorated, i.e. before mamba_radix_kernels is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if importlib.util.find_spec("mamba_radix_kernels") is None:  # source tree, not installed
    _spec = importlib.util.spec_from_file_location(
        "mamba_radix_kernels",
        REPO / "kernels" / "__init__.py",
        submodule_search_locations=[str(REPO / "kernels")],
    )
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["mamba_radix_kernels"] = _mod
    _spec.loader.exec_module(_mod)

import torch  # noqa: E402
from mamba_radix_kernels import naive, slot_move  # noqa: E402

from mamba_radix import state_ops  # noqa: E402

# ----------------------------------------------------------------------------------------------- shapes

FULL = {"layers": 69, "conv": (3, 4608), "temporal": (12, 128, 128), "pairs": [1, 4, 16, 64], "reps": 20}
TINY = {"layers": 2, "conv": (3, 16), "temporal": (2, 8, 8), "pairs": [1, 4], "reps": 1}


class Timer:
    """Median time of ``fn`` in microseconds: CUDA events per repetition (L2 flushed first), or wall clock."""

    def __init__(self, device: torch.device, reps: int, flush: bool) -> None:
        self.device, self.reps = device, reps
        self.cuda = device.type == "cuda"
        self.flush_buf = (
            torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if self.cuda and flush else None
        )

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(2 if self.cuda else 0):  # CPU dry run: already warm from the correctness check
            fn()
        times = []
        if self.cuda:
            torch.cuda.synchronize()
            for _ in range(self.reps):
                if self.flush_buf is not None:
                    self.flush_buf.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def make_pool(
    cfg: dict[str, Any], ssm_dtype: torch.dtype, slots: int, device: torch.device
) -> list[torch.Tensor]:
    """``[conv, temporal]`` with random bits (so a wrong copy cannot pass by accident)."""
    pool = []
    for inner, dtype in ((cfg["conv"], torch.bfloat16), (cfg["temporal"], ssm_dtype)):
        t = torch.empty((cfg["layers"], slots, *inner), dtype=dtype, device=device)
        naive.bits_view(t).random_()
        pool.append(t)
    return pool


def bits_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(naive.bits_view(x), naive.bits_view(y)) for x, y in zip(a, b, strict=True))


def torch_copy(pool: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """The baseline: SGLang's ``MambaPool.copy_from`` (advanced indexing, per tensor, over all layers)."""
    for t in pool:
        t[:, dst] = t[:, src]


def tbps(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e12 if us > 0 else float("nan")


# -------------------------------------------------------------------------------------------- sections


def bench_copy(
    cfg: dict[str, Any], ssm: torch.dtype, device: torch.device, timer: Timer, extras: bool
) -> list[dict[str, Any]]:
    """Copy/fork/track/gather rows for one SSM dtype over every pair count."""
    max_n = max(cfg["pairs"])
    pool = make_pool(cfg, ssm, 2 * max_n + 2, device)
    per_slot = state_ops.bytes_moved(pool, 1) // 2
    flat = torch.empty(2 * max_n * per_slot, dtype=torch.uint8, device=device)  # the ceiling's buffers
    rows = []
    for n in cfg["pairs"]:
        src = torch.arange(1, n + 1, device=device)
        dst = torch.arange(max_n + 1, max_n + 1 + n, device=device)
        moved = 2 * n * per_slot  # read + write
        a, b = flat[: n * per_slot], flat[max_n * per_slot : (max_n + n) * per_slot]

        # correctness, once: ours vs torch on a clone
        ref = [t.clone() for t in pool]
        torch_copy(ref, src, dst)
        state_ops.copy_slots(pool, src, dst, check=False, backend="triton")
        ok = bits_equal(pool, ref)
        del ref

        row: dict[str, Any] = {
            "op": "copy",
            "ssm": str(ssm).removeprefix("torch."),
            "pairs": n,
            "bytes": moved,
        }
        row["ceiling_us"] = timer(lambda a=a, b=b: b.copy_(a))
        row["ours_us"] = timer(lambda s=src, d=dst: slot_move.copy_slots_triton(pool, s, d))
        row["torch_us"] = timer(lambda s=src, d=dst: torch_copy(pool, s, d))
        row["bit_exact"] = ok
        rows.append(row)

        if not extras:
            continue
        # fork: 1 -> n (reads one slot, writes n)
        ref = [t.clone() for t in pool]
        for t in ref:
            t[:, dst] = t[:, 1:2]
        slot_move.fork_slots_triton(pool, 1, dst)
        ok = bits_equal(pool, ref)
        del ref
        rows.append(
            {
                "op": "fork",
                "ssm": row["ssm"],
                "pairs": n,
                "bytes": (n + 1) * per_slot,
                "ours_us": timer(lambda d=dst: slot_move.fork_slots_triton(pool, 1, d)),
                "torch_us": timer(lambda d=dst: [t.__setitem__((slice(None), d), t[:, 1:2]) for t in pool]),
                "bit_exact": ok,
            }
        )
        # masked track over a static batch of 2n entries, half of them enabled
        active = torch.arange(1, 2 * n + 1, device=device)
        track = torch.full((2 * n,), -1, dtype=torch.int64, device=device)
        track[::2] = dst
        mask = torch.ones(2 * n, dtype=torch.bool, device=device)
        ref = [t.clone() for t in pool]
        naive.track_slots_ref(ref, active, track, mask)
        slot_move.track_slots_triton(pool, active, track, mask)
        ok = bits_equal(pool, ref)
        del ref
        rows.append(
            {
                "op": "track",
                "ssm": row["ssm"],
                "pairs": n,
                "bytes": moved,
                "ours_us": timer(
                    lambda a=active, t=track, m=mask: slot_move.track_slots_triton(pool, a, t, m)
                ),
                "torch_us": timer(lambda a=active, t=track, m=mask: naive.track_slots_ref(pool, a, t, m)),
                "bit_exact": ok,
            }
        )
        # gather into a slot-major device staging buffer [n, L, ...] seen as [L, n, ...]
        stage = [
            torch.empty((n, t.shape[0], *t.shape[2:]), dtype=t.dtype, device=device).transpose(0, 1)
            for t in pool
        ]
        slot_move.gather_slots_triton(pool, src, stage)
        ok = all(
            torch.equal(naive.bits_view(s), naive.bits_view(t[:, src]))
            for s, t in zip(stage, pool, strict=True)
        )
        rows.append(
            {
                "op": "gather",
                "ssm": row["ssm"],
                "pairs": n,
                "bytes": moved,
                "ours_us": timer(lambda s=src, st=stage: slot_move.gather_slots_triton(pool, s, st)),
                "torch_us": timer(
                    lambda s=src, st=stage: [o.copy_(t[:, s]) for o, t in zip(st, pool, strict=True)]
                ),
                "bit_exact": ok,
            }
        )
        del stage
    for r in rows:
        r["ceiling_us"] = r.get("ceiling_us") or next(
            x["ceiling_us"] for x in rows if x["op"] == "copy" and x["pairs"] == r["pairs"]
        )
    return rows


def bench_tiles(
    cfg: dict[str, Any], ssm: torch.dtype, device: torch.device, timer: Timer
) -> list[dict[str, Any]]:
    """Copy of 4 pairs under several (BLOCK, num_warps): data for choosing the defaults."""
    n = min(4, max(cfg["pairs"]))
    pool = make_pool(cfg, ssm, 2 * n + 2, device)
    src, dst = torch.arange(1, n + 1, device=device), torch.arange(n + 1, 2 * n + 1, device=device)
    moved = state_ops.bytes_moved(pool, n)
    rows = []
    cuda = device.type == "cuda"
    for block in [1024, 2048, 4096, 8192] if cuda else [64]:
        for warps in (4, 8) if cuda else (4,):
            us = timer(
                lambda b=block, w=warps: slot_move.copy_slots_triton(pool, src, dst, block=b, num_warps=w)
            )
            rows.append({"ssm": str(ssm).removeprefix("torch."), "pairs": n, "block": block, "warps": warps,
                         "us": us, "tbps": tbps(moved, us)})  # fmt: skip
    return rows


def bench_launch(cfg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Host cost per track call with nothing enabled, and GPU cost per CUDA-graph replay of it."""
    pool = make_pool(cfg, torch.bfloat16, 4, device)
    n = 64 if device.type == "cuda" else 4
    active = torch.ones(n, dtype=torch.int64, device=device)
    track = torch.full((n,), -1, dtype=torch.int64, device=device)
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    fn = lambda: slot_move.track_slots_triton(pool, active, track, mask)  # noqa: E731
    fn()
    calls = 2000 if device.type == "cuda" else 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    out: dict[str, Any] = {"batch": n, "host_us_per_call": host_us}
    if device.type == "cuda":
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                fn()
            replays = 1000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            out["graph_replay_us"] = start.elapsed_time(end) * 1e3 / replays
            # the captured launch reads the mask at replay time: enable one pair and replay once
            ref = [t.clone() for t in pool]
            mask[0], track[0] = True, 3
            naive.track_slots_ref(ref, active, track, mask)
            graph.replay()
            torch.cuda.synchronize()
            out["graph_bit_exact"] = bits_equal(pool, ref)
        except Exception as exc:  # report, don't abort the run
            out["graph_error"] = repr(exc)
    return out


def bench_d2h(cfg: dict[str, Any], device: torch.device, reps: int) -> list[dict[str, Any]]:
    """gather_slots into pinned host memory (staging gather + async D2H copy), bf16 and fp32 SSM."""
    rows = []
    if device.type != "cuda":
        return rows
    for ssm in (torch.bfloat16, torch.float32):
        pool = make_pool(cfg, ssm, 6, device)
        for n in (1, 4):
            slots = torch.arange(1, n + 1, device=device)
            host = [torch.empty((t.shape[0], n, *t.shape[2:]), dtype=t.dtype).pin_memory() for t in pool]
            state_ops.gather_slots(pool, slots, host, check=False)
            torch.cuda.synchronize()
            ok = all(
                torch.equal(naive.bits_view(h), naive.bits_view(t[:, slots]).cpu())
                for h, t in zip(host, pool, strict=True)
            )
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                state_ops.gather_slots(pool, slots, host, check=False)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e6)
            us = statistics.median(times)
            nbytes = state_ops.bytes_moved(pool, n) // 2
            rows.append({"ssm": str(ssm).removeprefix("torch."), "slots": n, "bytes": nbytes, "us": us,
                         "gbps": nbytes / (us * 1e-6) / 1e9, "bit_exact": ok})  # fmt: skip
        del pool
    return rows


# ----------------------------------------------------------------------------------------------- report


def print_copy_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'op':6s} {'ssm':9s} {'pairs':>5s} {'MB r+w':>9s} | {'ceiling us':>10s} {'TB/s':>5s} | "
        f"{'ours us':>9s} {'TB/s':>5s} {'/ceil':>6s} | {'torch us':>9s} {'TB/s':>5s} {'torch/ours':>10s} | exact"
    )
    for r in rows:
        c, o, t = r["ceiling_us"], r["ours_us"], r["torch_us"]
        print(
            f"{r['op']:6s} {r['ssm']:9s} {r['pairs']:5d} {r['bytes'] / 1e6:9.1f} | {c:10.1f} {tbps(r['bytes'], c):5.2f} | "
            f"{o:9.1f} {tbps(r['bytes'], o):5.2f} {c / o:6.2f} | {t:9.1f} {tbps(r['bytes'], t):5.2f} {t / o:10.2f} | "
            f"{r['bit_exact']}"
        )


def main() -> int:
    args = ARGS
    device = torch.device("cpu" if args.dry_run else "cuda")
    cfg = dict(TINY if args.dry_run else FULL)
    if args.pairs:
        cfg["pairs"] = args.pairs
    reps = args.reps or cfg["reps"]
    timer = Timer(device, reps, flush=not args.no_flush)
    env = {
        "device": torch.cuda.get_device_name()
        if device.type == "cuda"
        else "cpu (dry run: timings meaningless)",
        "torch": torch.__version__,
        "triton": getattr(sys.modules.get("triton"), "__version__", None),
        "python": sys.version.split()[0],
        "interpreted": slot_move.INTERPRETED,
        "layers": cfg["layers"],
        "conv": cfg["conv"],
        "temporal": cfg["temporal"],
        "reps": reps,
        "l2_flush": not args.no_flush,
    }
    if not slot_move.triton_usable(device):
        print(f"Triton cannot run on {device} here: {slot_move.TRITON_IMPORT_ERROR!r}", file=sys.stderr)
        return 2
    print(json.dumps(env))
    results: dict[str, Any] = {"env": env, "copy": [], "tiles": [], "launch": None, "d2h": []}
    t_start = time.perf_counter()
    for name in args.ssm_dtypes:
        ssm = getattr(torch, name)
        per_slot = cfg["layers"] * (math.prod(cfg["conv"]) * 2 + math.prod(cfg["temporal"]) * ssm.itemsize)
        print(f"\n== temporal {name}: {per_slot / 1e6:.2f} MB per slot over {cfg['layers']} layers ==")
        rows = bench_copy(cfg, ssm, device, timer, extras=not args.no_extras)
        print_copy_table(rows)
        results["copy"] += rows
        if not args.no_extras:
            tiles = bench_tiles(cfg, ssm, device, timer)
            results["tiles"] += tiles
            print(
                "tile sweep (copy, 4 pairs): "
                + ", ".join(f"B{r['block']}/w{r['warps']}={r['tbps']:.2f}" for r in tiles)
            )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not args.no_extras:
        results["launch"] = bench_launch(cfg, device)
        print("\nlaunch:", json.dumps(results["launch"]))
        results["d2h"] = bench_d2h(cfg, device, reps)
        for r in results["d2h"]:
            print(
                f"d2h {r['ssm']:9s} slots={r['slots']} {r['bytes'] / 1e6:.1f} MB {r['us']:.0f} us {r['gbps']:.1f} GB/s exact={r['bit_exact']}"
            )
    copies = [r for r in results["copy"] if r["op"] == "copy"]
    summary = {
        "all_bit_exact": all(r["bit_exact"] for r in results["copy"]),
        "min_ours_over_ceiling_from_4_pairs": min(
            (r["ceiling_us"] / r["ours_us"] for r in copies if r["pairs"] >= 4), default=None
        ),
        "min_torch_over_ours": min((r["torch_us"] / r["ours_us"] for r in copies), default=None),
        "seconds": time.perf_counter() - t_start,
    }
    results["summary"] = summary
    print("\nsummary:", json.dumps(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0 if summary["all_bit_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
