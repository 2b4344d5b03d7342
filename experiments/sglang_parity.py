"""The full parity grid: our simulator against SGLang's real cache, request by request.

For every configuration of {no_buffer, extra_buffer} x KV tokens {2M, 8M, 32M, inf} x state slots
{256, 1024, 4096, inf} x page size {1, 64} (no_buffer needs page 1) and every SGLang version asked for,
the first ``--limit`` Mooncake conversation requests (block size 512) are replayed sequentially through
our simulator with the version's preset (``--peer sglang-<version>``) and through that version's cache,
loaded from its PyPI wheel (``mamba_radix.testing.sglang``). A configuration is identical when every
request got the same number of cached tokens.

Prints one table row per configuration ("identical / total", both hit rates, KV-match agreement, state
evictions on both sides, the first differing request) and a summary line; writes one JSON object per
configuration to ``--out``.

Example (about 1.5 min of CPU per configuration at 2,000 requests)::

    python experiments/sglang_parity.py --limit 2000 --versions 0.5.20 --jobs 2 --out parity.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

STRATEGIES = ("no_buffer", "extra_buffer")
KV_TOKENS: tuple[int | None, ...] = (2_000_000, 8_000_000, 32_000_000, None)
STATE_SLOTS: tuple[int | None, ...] = (256, 1024, 4096, None)
PAGES = (1, 64)
DEFAULT_TRACE = "mooncake_conversation_trace.jsonl"  # bundled with the package (mamba_radix.data)


def _size(n: int | None) -> str:
    if n is None:
        return "inf"
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else str(n)


def parse_sizes(text: str) -> list[int | None]:
    """``"2M,8M,inf"`` -> ``[2_000_000, 8_000_000, None]`` (plain integers too)."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        if part == "inf":
            out.append(None)
        elif part.endswith("m"):
            out.append(int(float(part[:-1]) * 1_000_000))
        else:
            out.append(int(part))
    return out


def grid(
    versions: list[str],
    strategies: list[str],
    pages: list[int],
    kv_sizes: list[int | None] = list(KV_TOKENS),  # noqa: B006  (read only)
    slot_sizes: list[int | None] = list(STATE_SLOTS),  # noqa: B006
) -> Iterator[tuple[str, str, int, int | None, int | None]]:
    for version in versions:
        for strategy in strategies:
            for page in pages:
                if strategy == "no_buffer" and page != 1:
                    continue
                for kv in kv_sizes:
                    for slots in slot_sizes:
                        yield version, strategy, page, kv, slots


def run_one(
    trace: str, limit: int, version: str, strategy: str, page: int, kv: int | None, slots: int | None
) -> dict[str, Any]:
    """One configuration (runs in a worker process). Errors become a row with ``error``."""
    from mamba_radix.config import CacheConfig
    from mamba_radix.errors import MambaRadixError
    from mamba_radix.sim.traces import iter_block_trace
    from mamba_radix.testing.sglang.parity import compare

    row: dict[str, Any] = {
        "version": version,
        "strategy": strategy,
        "page_size": page,
        "kv_tokens": kv,
        "state_slots": slots,
        "limit": limit,
    }
    start = time.perf_counter()
    try:
        traces = list(iter_block_trace(trace, block_size=512, limit=limit))
        config = CacheConfig(mamba_radix_cache_strategy=strategy, page_size=page)  # type: ignore[arg-type]
        row.update(compare(traces, config, kv, slots, version, peer="auto").as_dict())
    except MambaRadixError as err:
        row["error"] = f"{type(err).__name__}: {err}"
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


def _table_line(row: dict[str, Any]) -> str:
    cfg = f"{row['version']:>7} {row['strategy']:<12} p{row['page_size']:<3} KV {_size(row['kv_tokens']):>4} slots {_size(row['state_slots']):>4}"
    if "error" in row:
        return f"{cfg}  ERROR {row['error']}"
    diff = row.get("first_diff")
    first = (
        f"  first diff #{diff['index']}: ours {diff['ours_hit']} / sglang {diff['sglang_hit']}"
        if diff
        else ""
    )
    return (
        f"{cfg}  {row['identical']:>5} / {row['total']:<5} hit {row['ours_hit_rate']:.4f} / "
        f"{row['sglang_hit_rate']:.4f}  kv-match {row['kv_identical']} same  states evicted "
        f"{row['ours_stats'].get('states_evicted', '?')} / {row['sglang_states_evicted']}{first}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=2000, help="first N requests of the trace (default 2000)")
    ap.add_argument("--versions", default="0.5.20,0.5.23", help="comma-separated SGLang versions")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated strategies")
    ap.add_argument("--pages", default="1,64", help="comma-separated page sizes (default 1,64)")
    ap.add_argument("--kv", default="2M,8M,32M,inf", help="KV pool sizes in tokens (default 2M,8M,32M,inf)")
    ap.add_argument("--slots", default="256,1024,4096,inf", help="state slots (default 256,1024,4096,inf)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help="Mooncake block trace, block size 512 (default: the bundled conversation trace)",
    )
    ap.add_argument("--out", required=True, help="JSON-lines results file (one object per configuration)")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.jobs < 1:
        ap.error("--limit and --jobs must be >= 1")
    if os.path.exists(args.out):
        ap.error(f"{args.out} exists; choose a new --out")

    from tqdm import tqdm

    from mamba_radix.data import bundled_traces, trace_path

    if not os.path.exists(args.trace) and args.trace in bundled_traces():
        args.trace = str(trace_path(args.trace))

    from mamba_radix.errors import MambaRadixError
    from mamba_radix.testing.sglang import load_sglang

    versions = [v for v in args.versions.split(",") if v]
    usable = []
    for version in versions:  # fetch each wheel once, here, before the workers start
        try:
            load_sglang(version)
            usable.append(version)
        except MambaRadixError as err:
            print(f"sglang {version}: skipped ({err})", file=sys.stderr)
    try:
        kv_sizes, slot_sizes = parse_sizes(args.kv), parse_sizes(args.slots)
    except ValueError as err:
        ap.error(f"--kv / --slots: {err}")
    pages = [int(p) for p in args.pages.split(",") if p]
    specs = list(grid(usable, args.strategies.split(","), pages, kv_sizes, slot_sizes))
    rows: list[dict[str, Any]] = []
    with open(args.out, "w") as out, tqdm(total=len(specs), unit="config", file=sys.stderr) as bar:
        if args.jobs == 1:
            results = (run_one(args.trace, args.limit, *spec) for spec in specs)
            for row in results:
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=args.jobs) as pool:
                futures = [pool.submit(run_one, args.trace, args.limit, *spec) for spec in specs]
                for fut in as_completed(futures):
                    row = fut.result()
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    bar.update(1)
    order = {spec: i for i, spec in enumerate(specs)}
    rows.sort(
        key=lambda r: order[(r["version"], r["strategy"], r["page_size"], r["kv_tokens"], r["state_slots"])]
    )
    print("version strategy     page KV   slots  identical / total  hit ours / sglang")
    for row in rows:
        print(_table_line(row))
    ok = [r for r in rows if "error" not in r]
    same = sum(r["all_identical"] for r in ok)
    print(
        f"summary: {same} of {len(rows)} configurations identical per request "
        f"({len(rows) - len(ok)} errors); {sum(r['identical'] for r in ok)} of "
        f"{sum(r['total'] for r in ok)} requests identical"
    )
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
