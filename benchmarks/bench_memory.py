"""Host memory of the pools and the tree against capacity and against use (issue 28, item 3).

For each KV pool size asked for, one fresh process builds the simulator's cache over the first
``--limit`` requests of the Mooncake conversation trace (sequential replay, extra_buffer with SGLang
0.5.23's rules, ``--slots`` state slots) and prints:

- **pools**: every capacity-sized host array of the pools (allocation bitmap, pending marks, scratch,
  free list, the request table, the held-KV flags), its nominal bytes (what capacity would cost if every
  byte were resident) and its resident bytes after the build and after the replay (its pages present in
  memory, from ``/proc/self/pagemap``);
- **tree**: cached KV tokens and nodes at the end, and the process's resident growth during the replay
  less the pools' growth, per cached token and per node (the tree's Python objects and index tensors,
  the allocator's heap included: an upper bound);
- **process**: resident set after imports, after the build, and its peak (``VmHWM``).

Memory that grows with use shows as equal rows for a small and a large pool on the same trace.

    .venv/bin/python benchmarks/bench_memory.py                      # 2M and 28M KV tokens, 2,000 requests
    .venv/bin/python benchmarks/bench_memory.py --kv-tokens 28146377 --limit 500
    .venv/bin/python benchmarks/bench_memory.py --experiment-peak -- --jobs 2   # the main job's peak RSS

``--experiment-peak`` instead runs ``mamba-radix experiment`` (arguments after ``--``) and samples the
summed resident set (and proportional set, which counts pages shared after ``fork`` once) of the whole
process tree twice a second, printing the peaks: the figure ``make experiment`` must keep under 3 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "mamba_radix" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
MIB = 1 << 20


# ------------------------------------------------------------------------------------ /proc readings
def status_bytes(field: str, pid: int | str = "self") -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/PID/status`` in bytes; 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(address: int, nbytes: int) -> int:
    """Bytes of ``[address, address + nbytes)`` in memory: the present pages of that span, read from
    ``/proc/self/pagemap`` (8 bytes per page, bit 63 = present), so adjacent arrays and the kernel's
    merging of neighbouring mappings do not blur the count. A page that was only read maps the shared
    zero page and counts here though not in the RSS (the pools read no unwritten page in a replay).
    O(nbytes / page size)."""
    if nbytes <= 0:
        return 0
    first, last = address // PAGE, (address + nbytes - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    import numpy as np

    entries = np.frombuffer(raw, dtype=np.uint64)
    present = int(np.count_nonzero(entries >> np.uint64(63)))
    return min(nbytes, present * PAGE)


# ---------------------------------------------------------------------------------- one measurement
def capacity_arrays(cache) -> dict[str, object]:
    """The pools' host arrays sized by capacity (KV indices or request rows x context), by name."""
    import numpy as np

    arrays: dict[str, object] = {}
    alloc = cache.token_to_kv_pool_allocator
    fl = alloc._free_list
    arrays["KV free list: allocation bitmap (1 B/id)"] = fl.allocated
    arrays["KV free list: duplicate-check scratch (4 B/id)"] = fl._scratch
    pending = getattr(fl, "_pending", None)
    if pending is not None:
        arrays["KV free list: pending marks (1 B/id)"] = pending
    buf = fl._buf
    if isinstance(buf, np.ndarray) or hasattr(buf, "numel"):
        arrays["KV free list: listed ids (8 B/listed id)"] = buf
    arrays["request table (4 B/row/position)"] = cache.req_to_token_pool.req_to_token
    held = cache.held_kv_if_built()
    if held is not None:
        arrays["held-KV flags (1 B/index)"] = getattr(held, "_flags_np", None)
    return {k: v for k, v in arrays.items() if v is not None}


def array_span(arr) -> tuple[int, int]:
    """(data address, bytes) of a numpy array or a CPU tensor."""
    import numpy as np

    if isinstance(arr, np.ndarray):
        return arr.ctypes.data, arr.nbytes
    return arr.data_ptr(), arr.numel() * arr.element_size()


def measure(kv_tokens: int, slots: int, limit: int, policy: str) -> dict[str, object]:
    """Build the cache at ``kv_tokens`` / ``slots``, replay ``limit`` requests; the readings as a dict."""
    from mamba_radix.experiment import base_config
    from mamba_radix.policies.registry import POLICIES
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions
    from mamba_radix.sim.traces import iter_trace

    rss_imports = status_bytes("VmRSS")

    requests = tuple(iter_trace(str(TRACE), "block", 512, limit))
    config = POLICIES[policy].configure(base_config())
    pools = exact_pools(config, kv_tokens, slots, "kimi-k3")
    max_len = max(r.input_len + r.output_len for r in requests)
    rss_loaded = status_bytes("VmRSS")
    engine = Engine(config, pools, max_len, EngineOptions(mode="sequential", verify_states=False))
    cache = engine.cache
    rss_built = status_bytes("VmRSS")
    spans = {name: array_span(a) for name, a in capacity_arrays(cache).items()}
    built = {name: resident_bytes(addr, n) for name, (addr, n) in spans.items()}
    engine.run(requests, total=len(requests))
    rss_after = status_bytes("VmRSS")
    arrays = capacity_arrays(cache)  # the free list's buffer may have been replaced
    spans = {name: array_span(a) for name, a in arrays.items()}
    after = {name: resident_bytes(addr, n) for name, (addr, n) in spans.items()}
    cached = int(cache.full_evictable_size() + cache.full_protected_size())
    nodes = int(cache.tree.num_nodes)
    pools_growth = sum(after.values()) - sum(built.get(k, 0) for k in after)
    tree_bytes = max(0, rss_after - rss_built - pools_growth)
    return {
        "kv_tokens": pools.kv_tokens,
        "state_slots": pools.state_slots,
        "requests": len(requests),
        "rows": cache.req_to_token_pool.size,
        "arrays": {
            name: {"nominal": n, "built": built.get(name, 0), "after": after[name]}
            for name, (_, n) in spans.items()
        },
        "cached_tokens": cached,
        "nodes": nodes,
        "tree_bytes": tree_bytes,
        "rss_imports": rss_imports,
        "rss_loaded": rss_loaded,
        "rss_built": rss_built,
        "rss_after": rss_after,
        "rss_peak": status_bytes("VmHWM"),
    }


def print_measurement(m: dict) -> None:
    print(
        f"\nKV pool {m['kv_tokens']:,} tokens, {m['state_slots']:,} state slots ({m['rows']:,} request rows), "
        f"{m['requests']:,} conversation requests"
    )
    print(
        f"  {'capacity-sized host array':48s} {'nominal MiB':>12s} {'resident built':>15s} {'after replay':>13s}"
    )
    nominal = built = after = 0
    for name, a in m["arrays"].items():
        print(f"  {name:48s} {a['nominal'] / MIB:12.1f} {a['built'] / MIB:15.1f} {a['after'] / MIB:13.1f}")
        nominal, built, after = nominal + a["nominal"], built + a["built"], after + a["after"]
    print(f"  {'all of them':48s} {nominal / MIB:12.1f} {built / MIB:15.1f} {after / MIB:13.1f}")
    cached, nodes, tree = m["cached_tokens"], m["nodes"], m["tree_bytes"]
    print(
        f"  tree: {cached:,} cached KV tokens in {nodes:,} nodes; {tree / MIB:.1f} MiB resident growth "
        f"besides the pools = {tree / max(cached, 1):.1f} B per cached token, {tree / max(nodes, 1):,.0f} B "
        "per node"
    )
    print(
        f"  process RSS: {m['rss_imports'] / MIB:.0f} MiB after imports, {m['rss_loaded'] / MIB:.0f} with the "
        f"trace, {m['rss_built'] / MIB:.0f} built, {m['rss_after'] / MIB:.0f} after the replay, "
        f"peak {m['rss_peak'] / MIB:.0f}"
    )


# ------------------------------------------------------------------------------- the main job's peak
def process_tree(root: int) -> list[int]:
    """``root`` and every descendant (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, i = [root], 0
    while i < len(out):
        out += children.get(out[i], [])
        i += 1
    return out


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def experiment_peak(args: list[str], every_s: float = 0.5) -> dict[str, object]:
    """Run ``mamba-radix experiment ARGS``; the peaks of the summed RSS and PSS of its process tree."""
    cmd = [sys.executable, "-m", "mamba_radix.cli", "experiment", *args]
    proc = subprocess.Popen(cmd, cwd=REPO)
    peak_rss = peak_pss = peak_procs = 0
    hwm: dict[int, int] = {}
    start = time.perf_counter()
    while proc.poll() is None:
        pids = process_tree(proc.pid)
        rss = sum(status_bytes("VmRSS", p) for p in pids)
        if rss > peak_rss:
            peak_rss, peak_procs = rss, len(pids)
        peak_pss = max(peak_pss, sum(pss_bytes(p) for p in pids))
        for p in pids:
            hwm[p] = max(hwm.get(p, 0), status_bytes("VmHWM", p))
        time.sleep(every_s)
    return {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_sum_rss_bytes": peak_rss,
        "peak_sum_pss_bytes": peak_pss,
        "processes_at_peak": peak_procs,
        "largest_process_hwm_bytes": max(hwm.values(), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-tokens", type=int, nargs="+", default=[2_000_000, 28_146_377])
    parser.add_argument("--slots", type=int, default=16_384, help="state slots (sets the request rows)")
    parser.add_argument("--limit", type=int, default=2000, help="first N requests of the conversation trace")
    parser.add_argument("--policy", default="sglang-0.5.23")
    parser.add_argument("--json", action="store_true", help="print each measurement as JSON too")
    parser.add_argument("--experiment-peak", action="store_true", help="measure the main job instead")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure this size, print JSON
    parser.add_argument("rest", nargs="*", help="after --: arguments of `mamba-radix experiment`")
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.slots, args.limit, args.policy)))
        return
    if args.experiment_peak:
        result = experiment_peak(args.rest or ["--results-dir", "experiments/results", "--jobs", "2"])
        print(json.dumps(result, indent=1))
        gib = 1 << 30
        print(
            f"peak over all processes: {result['peak_sum_rss_bytes'] / gib:.2f} GiB RSS summed, "
            f"{result['peak_sum_pss_bytes'] / gib:.2f} GiB PSS summed; largest single process "
            f"{result['largest_process_hwm_bytes'] / gib:.2f} GiB"
        )
        return
    for kv in args.kv_tokens:  # each size in a fresh process: its RSS is its own
        child = [sys.executable, __file__, "--one", str(kv), "--slots", str(args.slots)]
        child += ["--limit", str(args.limit), "--policy", args.policy]
        out = subprocess.run(child, capture_output=True, text=True, check=True).stdout
        m = json.loads(out.strip().splitlines()[-1])
        print_measurement(m)
        if args.json:
            print(json.dumps(m))


if __name__ == "__main__":
    main()
