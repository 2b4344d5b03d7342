"""One system's trace replay in a process of its own: the worker of ``benchmarks/bench_per_process.py``.

A fresh interpreter runs exactly one cache on the trace, as an engine would, so no other cache's heap, garbage
collector passes or CPU-cache footprint is in its timings. Two kinds of system:

- ``ours``: the simulator (:class:`mamba_radix.sim.engine.Engine`, sequential, state verification off) with
  the ``sglang-<version>`` preset, so that its per-request hits equal that SGLang release's;
- ``sglang``: SGLang ``<version>``'s real cache loaded from its wheel, behind the replay module's scheduler
  driver (:class:`bench_vs_sglang.SGLangSide`), on counting pools. With ``--sg-pools light`` (the default)
  the pools keep every count SGLang's own checks read (free tokens, free slots, request rows, the
  ping-pong buffer) but not our liveness record of every id ever issued (a numpy array indexed by id,
  whose check runs on every free): the lightest pools that keep SGLang's checks.

Per operation (admission ``match_prefix``, ``cache_unfinished_req``, ``cache_finished_req``, ``evict``, as
:data:`bench_vs_sglang.COMPARED` names them) it records every call's wall time and, per call, the time spent
inside pool methods; the replay's wall and CPU time; every request's hit; peak RSS
(``ru_maxrss``, read before the memory walk) and the RSS just before the cache was built; and, with
``--memory``, the host bytes the cache holds, found by a walk of the objects reachable from it (see
:func:`deep_bytes`), with the tree's node count and cached tokens.

``--profile-evict LINES`` (ours only) runs cProfile inside every evict call and prints its top lines on
stdout: where an eviction's time goes, by function, within the real replay (issue 28's profile).

Writes one JSON object to ``--out``. Exit status: 0 done, 1 the replay raised, 3 SGLang could not be
loaded. Not run by hand (the parent passes every argument), though it can be::

    .venv/bin/python benchmarks/_per_process_worker.py --system ours --version 0.5.20 --limit 50 --out r.json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FunctionType, MethodType, ModuleType
from typing import Any

import bench_vs_sglang as bvs  # beside this file: benchmarks/ is the script's folder, first on sys.path
import numpy as np
import torch

from mamba_radix.config import CacheConfig
from mamba_radix.data import trace_path
from mamba_radix.errors import MambaRadixError
from mamba_radix.peers import apply_peer
from mamba_radix.sim.traces import TraceRequest, iter_block_trace
from mamba_radix.testing.sglang import SGLangError, load_sglang
from mamba_radix.testing.sglang import replay as sg_replay
from mamba_radix.testing.sglang.parity import replay_config_for

EXIT_OK, EXIT_REPLAY_FAILED, EXIT_NO_SGLANG = 0, 1, 3
OPS = ("match", "handover", "finish", "evict")  # SGLang's operation ids in bench_vs_sglang.SG_OPS
# our side of each operation: (parent, name) of bench_vs_sglang's CallTimes, from its COMPARED table
OUR_OP = {sg_op: ours for _label, ours, sg_op in bvs.COMPARED}
# Our pools' methods, timed as pool calls (a missing name is skipped: the pools are being restructured).
OUR_POOL_METHODS = (
    "alloc",
    "alloc_extend",
    "alloc_decode",
    "free",
    "free_chunks",
    "undo_alloc",
    "available_size",
    "write",
    "free_mamba_cache",
    "donate_ping_pong_slot",
    "lazy_alloc_boundary_slot",
    "lazy_release_old_slot",
    "copy_from",
    "copy_slot",
    "fork",
    "clear_slots",
)


def config_for(version: str) -> CacheConfig:
    """extra_buffer with the preset that makes our cache replay SGLang ``version`` request by request."""
    return apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), f"sglang-{version}")


# ------------------------------------------------------------------------------------------------ memory
def rss_now_kib() -> int:
    """This process's resident set now, in KiB (``/proc/self/statm``; the peak so far where it is absent)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return peak_rss_kib()


def peak_rss_kib() -> int:
    """This process's peak resident set so far, in KiB (Linux reports ``ru_maxrss`` in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


_SHARED_TYPES = (type, ModuleType, FunctionType, MethodType, type(len), type(print.__call__))


def deep_bytes(roots: Iterable[Any], stop: Iterable[Any] = ()) -> int:
    """Host bytes of every object reachable from ``roots`` (through ``gc.get_referents``), each counted once:
    ``sys.getsizeof`` of the object, plus for a torch tensor the bytes of its storage (once per storage, so
    views of one buffer count it once), plus for a numpy view its base. Not entered: the objects in ``stop``
    (another root's memory), classes, modules and functions (code shared with the process, and the timing
    wrappers, which hold the benchmark's samples). Interpreter-cached small ints and strings are counted
    where first reached, a few bytes each.

    Side effects: none (reads only). Cost: O(objects reachable) time and a set of their ids, so run it after
    the peak RSS has been read. Python objects only: memory a C library holds without a Python object (a
    compiled walk's scratch) is not seen."""
    seen: set[int] = {id(obj) for obj in stop}
    storages: set[int] = set()
    stack = [obj for obj in roots if id(obj) not in seen]
    total = 0
    while stack:
        obj = stack.pop()
        oid = id(obj)
        if oid in seen or isinstance(obj, _SHARED_TYPES):
            continue
        seen.add(oid)
        total += sys.getsizeof(obj)
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, np.ndarray) and obj.base is not None:
            stack.append(obj.base)
        stack.extend(gc.get_referents(obj))
    return total


def tree_nodes(root: Any) -> Iterator[Any]:
    """Every node below ``root`` (both trees keep a ``children`` dict per node). O(nodes)."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def measure_memory(cache: Any, root: Any, pools: list[Any]) -> dict[str, int]:
    """The cache's host bytes split into its tree and bookkeeping (reachable from the cache, not through a
    pool) and its pools (reachable from the pool objects), with the tree's nodes and cached tokens (the
    sum of the node keys' lengths: KV tokens the tree holds, requests being finished)."""
    nodes = tokens = 0
    for node in tree_nodes(root):
        nodes += 1
        tokens += len(node.key)
    gc.collect()
    return {
        "nodes": nodes,
        "cached_tokens": tokens,
        "tree_bytes": deep_bytes([cache], stop=pools),
        "pool_bytes": deep_bytes(pools, stop=[cache]),
    }


# --------------------------------------------------------------------------------------------- samples
def op_samples(times: bvs.CallTimes, spec: Iterable[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """Per-call wall ns of the calls ``spec`` names (``(parent, name)`` as :meth:`CallTimes.get` takes them)
    and, per call, the ns spent inside pool methods (the call's time less its exclusive time)."""
    ns: list[int] = []
    pool: list[int] = []
    for parent, name in spec:
        incl = times.get(parent, name)
        excl = times.get(parent, name, exclusive=True)
        ns += incl
        pool += [a - b for a, b in zip(incl, excl, strict=True)]
    return ns, pool


def our_op_samples(times: bvs.CallTimes, op: str) -> tuple[list[int], list[int]]:
    """Our operation's samples. The admission match is a derived sample (the admission check's walk plus
    ``match_prefix``) with no exclusive twin: its pool time is that of the ``match_prefix`` inside the same
    ``admit`` (one per admit, in the same order; the walk makes no pool call)."""
    parent, name = OUR_OP[op]
    if (parent, name) not in times.samples or (parent, name) in times.excl:
        return op_samples(times, [(parent, name)])
    ns = times.get(parent, name)
    _, inner_pool = op_samples(times, [(parent, "match_prefix")])
    pool = inner_pool if len(inner_pool) == len(ns) else [0] * len(ns)
    return ns, pool


# ---------------------------------------------------------------------------------------------- systems
def profile_calls(obj: Any, name: str, profiler: cProfile.Profile) -> None:
    """Run ``profiler`` during every call of ``obj.name`` only (enabled on entry, disabled on exit), so that
    its statistics are those of that one operation inside the whole replay. The calls' timed samples then
    include the profiler's overhead: not comparable with a run without it."""
    inner = getattr(obj, name)

    def profiled(*args: Any, **kwargs: Any) -> Any:
        profiler.enable()
        try:
            return inner(*args, **kwargs)
        finally:
            profiler.disable()

    setattr(obj, name, profiled)


def profile_top(profiler: cProfile.Profile, lines: int) -> str:
    """The profiler's top ``lines`` functions by own time (pstats, directories stripped)."""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def run_ours(
    traces: list[TraceRequest], version: str, kv_tokens: int, state_slots: int, profile_evict: int = 0
) -> dict[str, Any]:
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    config = config_for(version)
    max_len = max(t.input_len + t.output_len for t in traces)
    gc.collect()
    rss_before = rss_now_kib()
    engine = Engine(
        config,
        exact_pools(config, kv_tokens, state_slots, "kimi-k3"),
        max_len,
        EngineOptions(mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=4),
    )
    cache = engine.cache
    times = bvs.CallTimes()
    bvs.instrument_ours(times, cache)
    pools = [cache.token_to_kv_pool_allocator, cache.req_to_token_pool, cache.mamba_pool]
    for pool in pools:
        times.instrument(pool, OUR_POOL_METHODS, pool=True)
    # the cache took its eviction's KV free from the allocator when it was built: point it at the timed one,
    # so that evict's pool column counts it
    cache._free_kv_chunks = cache.token_to_kv_pool_allocator.free_chunks
    profiler = cProfile.Profile() if profile_evict else None
    if profiler is not None:
        profile_calls(cache, "evict", profiler)
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    metrics = engine.run(iter(traces), total=len(traces))
    wall_ns, cpu_ns = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    peak = peak_rss_kib()
    hit_of = {row["index"]: row["hit"] for row in metrics.per_request}
    if profiler is not None:
        print(profile_top(profiler, profile_evict))
    return {
        "ops": {op: our_op_samples(times, op) for op in OPS},
        "wall_ns": wall_ns,
        "cpu_ns": cpu_ns,
        "cache_ns": times.top_ns,
        "pool_ns": times.pool_ns,
        "hits": [hit_of[t.index] for t in traces],
        "rss_before_cache_kib": rss_before,
        "peak_rss_kib": peak,
        "_memory_of": (cache, cache.tree.root, pools),
    }


def light_pools(side: bvs.SGLangSide) -> None:
    """Drop the counting pools' liveness record (an array indexed by every id ever issued, checked on every
    free): ids stay fresh per allocation and every count SGLang reads stays exact. Replaces the private
    ``_ids`` of the two allocators (mamba_radix/testing/sglang/pools.py has no switch for it)."""

    class FreshIds:
        def __init__(self) -> None:
            self.next_id = 1  # id 0 is padding in SGLang's pools

        def issue(self, n: int) -> np.ndarray:
            start, self.next_id = self.next_id, self.next_id + n
            return np.arange(start, start + n, dtype=np.int64)

        def retire(self, ids: np.ndarray, what: str) -> None:
            return None

    for allocator in (side.driver.kv_pool, side.driver.req_pool.mamba_allocator):
        allocator._ids = FreshIds()


def run_sglang(
    traces: list[TraceRequest], version: str, kv_tokens: int, state_slots: int, pools_kind: str
) -> dict[str, Any]:
    sg = load_sglang(version)
    config = config_for(version)
    max_len = max(t.input_len + t.output_len for t in traces)
    gc.collect()
    rss_before = rss_now_kib()
    side = bvs.SGLangSide(sg, replay_config_for(config, kv_tokens, state_slots), max_len)
    if pools_kind == "light":
        light_pools(side)
    with bvs.activated_for([side]):  # one version in this process: its modules stay in sys.modules
        for trace in traces:
            # expanded here, untimed (run() times itself), and dropped after: the trace stays compact
            request = sg_replay.ReplayRequest(trace.index, trace.input_ids, trace.output_ids, trace.extra_key)
            side.run(request)
    peak = peak_rss_kib()
    hit_of = {row.index: row.hit for row in side.rows}
    driver = side.driver
    return {
        "ops": {op: op_samples(side.times, bvs.SG_OPS[version][op]) for op in OPS},
        "wall_ns": side.wall_ns,
        "cpu_ns": side.cpu_ns,
        "cache_ns": side.times.top_ns,
        "pool_ns": side.times.pool_ns,
        "hits": [hit_of[t.index] for t in traces],
        "rss_before_cache_kib": rss_before,
        "peak_rss_kib": peak,
        "_memory_of": (driver.cache, driver.cache.root_node, [driver.kv_pool, driver.req_pool]),
    }


# ------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="One system's trace replay in this process (bench_per_process).")
    p.add_argument("--system", choices=("ours", "sglang"), required=True)
    p.add_argument("--version", required=True, help="SGLang release (ours: the preset replaying it)")
    p.add_argument("--trace", default=str(trace_path()))
    p.add_argument("--limit", type=int, default=2000, help="first N requests (0: all)")
    p.add_argument("--kv-tokens", type=int, default=bvs.KV_TOKENS)
    p.add_argument("--state-slots", type=int, default=bvs.STATE_SLOTS)
    p.add_argument("--sg-pools", choices=("light", "checked"), default="light")
    p.add_argument("--memory", action="store_true", help="walk the cache's objects for its host bytes")
    p.add_argument(
        "--profile-evict",
        type=int,
        default=0,
        metavar="LINES",
        help="ours only: cProfile every evict call and print the top LINES functions by own time on stdout "
        "(the timings then include the profiler: not for comparison)",
    )
    p.add_argument("--out", required=True, help="JSON result file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # as bench_vs_sglang: a second thread slows small tensor ops on a loaded box
    started = time.perf_counter()
    traces = list(iter_block_trace(args.trace, limit=args.limit or None))
    if not traces:
        print(f"error: no requests in {args.trace}", file=sys.stderr)
        return EXIT_REPLAY_FAILED
    try:
        if args.system == "ours":
            res = run_ours(traces, args.version, args.kv_tokens, args.state_slots, args.profile_evict)
        else:
            res = run_sglang(traces, args.version, args.kv_tokens, args.state_slots, args.sg_pools)
    except SGLangError as err:  # the wheel cannot be fetched or imported
        print(f"error: {err}", file=sys.stderr)
        return EXIT_NO_SGLANG
    except (MambaRadixError, AssertionError, RuntimeError) as err:  # a cache refused or raised
        print(f"error: {args.system} {args.version}: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_REPLAY_FAILED
    cache, root, pools = res.pop("_memory_of")
    res["memory"] = measure_memory(cache, root, pools) if args.memory else None
    res.update(
        system=args.system,
        version=args.version,
        requests=len(traces),
        input_tokens=sum(t.input_len for t in traces),
        process_s=time.perf_counter() - started,
        python=sys.version.split()[0],
        torch=torch.__version__,
    )
    Path(args.out).write_text(json.dumps(res))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
