"""Our cache against SGLang's real cache on the same requests, in one run: per-call times and their ratios.

What it measures (issue 12), each stage with both caches in the same process, taking turns so that load
on a shared machine hits both alike (the trace replay in turns of 50 requests, the other stages request by
request or call by call):

1. **Trace replay**: the first ``--limit`` Mooncake conversation requests (block size 512), sequential,
   extra_buffer, 8M KV tokens / 1024 state slots. Ours: the simulator (:class:`mamba_radix.sim.engine.Engine`,
   state verification off) with the ``sglang-0.5.20`` preset; SGLang: its own ``MambaRadixCache`` loaded
   from the PyPI wheel, driven by :mod:`mamba_radix.testing.sglang.replay`'s scheduler (counting pools).
   The per-request hits must be identical (checked and printed), so both sides do the same cache work.
   Per operation, median and p99 in µs and the ratio SGLang / ours (> 1: ours is faster):

   - admission ``match_prefix`` with copy-on-write (SGLang: the scheduler's call; ours: the one inside
     ``admit``). SGLang defers the state copy to the forward; ours copies the slot (tiny tensors) here;
   - ``cache_unfinished_req`` (the checkpoint hand-over after a prefill chunk; ours: inside ``commit``);
   - ``cache_finished_req`` (ours: inside ``finish``);
   - ``evict`` (every call, from wherever it is made);
   - ours only: ``can_admit``, ``admit``, ``extend``, ``commit``, ``finish`` (the lifecycle calls).

   Walls: SGLang's is its replay driver's time per request (scheduler steps, decode token by token,
   counting pools; the requests arrive expanded); ours is the engine's run (it expands the trace blocks
   itself). "Cache calls" is the time inside the top-level cache calls; the simulator's own work is the
   rest of its wall (trace expansion, ideal hits, state stamps, scheduling, metrics).
2. **Long context**: a path of ``P`` tokens (1k, 128k, 1M) built by one request, then requests that hit
   it and add prefill chunks of 1,024 new tokens each (``cache_unfinished_req``), decode across track
   boundaries (ours: ``commit`` at a boundary; SGLang only notes the boundary in its scheduler: no cache
   call) and finish inserting 1,024 new tokens (``cache_finished_req``). The cost at ``P`` over the cost
   at 1k, at equal new tokens, says whether a hand-over is O(new tokens) or O(path).
3. **Deep multi-turn sessions**: two sessions interleaved, each turn the whole conversation so far plus
   2,048 new tokens and 256 output tokens; per-turn costs in the first and the last quarter of the turns.
4. **A large tree** (at least 100k nodes; ``--quick``: 4k): random branching keys inserted into both
   trees directly (``insert``), then ``match_prefix`` of random prefixes of inserted keys and further
   inserts, alternating the two caches call by call.

Targets (issue 12) are printed next to the numbers: every cache operation's median at least 3x faster
than the faster SGLang core; checkpoint and insert cost at most 1.5x from a 1k to a 128k path at equal
new tokens; the whole replay at least 3x faster than SGLang's; the simulator's own work at most a third
of its wall. Only SGLang 0.5.20 can be replayed today (the loader has no stand-ins for 0.5.23's
``UnifiedRadixCache``); a version that cannot be loaded is reported and skipped. Ratios only: no timing
is asserted anywhere.

The trace replay's turns (``--interleave N``, default 50) decide what a call finds in the CPU caches. In
turns of 50 each cache replays its own requests warm, as the issue's sequential replays did: the targets are
judged there. Request by request (``--interleave 1``) each cache's calls run just after the other's whole
request, and what they cost then depends on the other cache's footprint: SGLang's admission median moved
from 84 to 58-61 µs when only our code changed (a smaller request of ours left more of SGLang's data in the
CPU caches). ``--cold-mib M`` reads ``M`` MiB before every request of each side, untimed, so both run
equally cold (64: twice this machine's L3), as between an engine's forward passes. Both are reported in
docs/benchmarks.md beside the targets' run: a cache whose calls are a few distinct steps (ours) loses more to
cold caches than one whose calls repeat the same steps per node (SGLang's).

One torch thread (``torch.set_num_threads(1)``): on a loaded 2-core machine a second thread makes small
tensor operations orders of magnitude slower. Not collected by pytest.

Usage::

    .venv/bin/python benchmarks/bench_vs_sglang.py                 # ~3-5 min on 2 shared cores
    .venv/bin/python benchmarks/bench_vs_sglang.py --quick         # smoke run, under a minute
    .venv/bin/python benchmarks/bench_vs_sglang.py --limit 500 --stages trace,long
    .venv/bin/python benchmarks/bench_vs_sglang.py --stages trace --interleave 1    # request by request
    .venv/bin/python benchmarks/bench_vs_sglang.py --stages trace --cold-mib 64     # both equally cold
    .venv/bin/python benchmarks/bench_vs_sglang.py --markdown perf.md --json perf.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mamba_radix.cache import MambaRadixCache
from mamba_radix.config import CacheConfig
from mamba_radix.data import trace_path
from mamba_radix.peers import apply_peer
from mamba_radix.request import Req
from mamba_radix.sim.progress import Progress
from mamba_radix.sim.traces import TraceRequest, iter_block_trace
from mamba_radix.testing.sglang import SGLangError, load_sglang
from mamba_radix.testing.sglang import replay as sg_replay
from mamba_radix.testing.sglang.parity import replay_config_for
from mamba_radix.tree import RadixKey

CLOCK = time.perf_counter_ns  # per call: wall (a CPU-time clock read costs ~2 µs here, a wall one 0.3)
CPU = time.thread_time_ns  # per request and per replay: CPU time of this thread (immune to preemption)
KV_TOKENS = 8_000_000
STATE_SLOTS = 1024
VERSIONS = ("0.5.20", "0.5.23")
STAGES = ("trace", "long", "sessions", "tree")
TARGET_OP_SPEEDUP = 3.0  # every operation's median, vs the faster SGLang core
TARGET_PATH_GROWTH = 1.5  # checkpoint / insert cost from a 1k to a 128k path, equal new tokens
TARGET_WALL_SPEEDUP = 3.0  # whole replay, vs SGLang's replay
TARGET_SIM_SHARE = 1 / 3  # the simulator's own work, of its wall
# Trace requests per turn of each cache in the trace replay: the sequential replay (each cache
# runs warm on its own requests; only a turn's first request finds the other's data in the CPU caches),
# with machine load seconds apart still shared by both. Request by request (1), each cache runs just
# after the other's whole request, and what it costs then depends on the other's footprint.
DEFAULT_TURN = 50

# The operations compared: (label, our call as (parent, name), SGLang's operation id). Parent "" is a
# top-level call (made by the driver), "*" any caller, "!x" any caller but x.
COMPARED = (
    (
        "admission match (copy-on-write; ours: check's walk + match_prefix)",
        ("admit", "walk+match_prefix"),
        "match",
    ),
    ("cache_unfinished_req (checkpoint hand-over)", ("commit", "cache_unfinished_req"), "handover"),
    ("cache_finished_req (finish)", ("finish", "cache_finished_req"), "finish"),
    ("evict", ("*", "evict"), "evict"),
)
# SGLang's calls for each operation, per release. 0.5.23's UnifiedRadixCache hands over with
# checkpoint(req, up_to) and finishes through several calls (checkpoint, free_kv_row, unlock, on_release:
# the driver's finish, which also frees the request row in the counting pool).
SG_OPS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "0.5.20": {
        "match": (("", "match_prefix"),),
        "handover": (("", "cache_unfinished_req"),),
        "finish": (("", "cache_finished_req"),),
        "evict": (("*", "evict"),),
    },
    "0.5.23": {
        "match": (("", "match_prefix"),),
        "handover": (("", "checkpoint"),),
        "finish": (("", "finish"),),
        "evict": (("*", "evict_for_alloc"), ("!evict_for_alloc", "evict")),
    },
}
# methods of the 0.5.23 driver itself timed as one operation
SG_DRIVER_OPS = {"0.5.23": ("finish",)}


def sg_samples(times: CallTimes, version: str, op: str, exclusive: bool = False) -> list[int]:
    """The samples of SGLang ``version``'s calls that make up operation ``op``."""
    spec = SG_OPS.get(version, SG_OPS["0.5.20"])[op]
    return [t for parent, name in spec for t in times.get(parent, name, exclusive)]


# Samples made of a call's wrapped children: our admission match is the admission check's tree walk plus
# match_prefix (the match reuses the check's walk; SGLang's match_prefix walks itself). Recorded under
# (call, derived name) when the required child ran.
DERIVED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "admit": ("walk+match_prefix", ("walk", "match_prefix"), "match_prefix"),
}
OURS_ONLY = ("can_admit", "admit", "extend", "commit", "finish")
OUR_METHODS = (
    "can_admit",
    "admit",
    "extend",
    "commit",
    "finish",
    "match_prefix",
    "cache_unfinished_req",
    "cache_finished_req",
    "evict",
    "insert",
)
SG_POOL_METHODS = (  # the counting pools' methods (mamba_radix/testing/sglang/pools.py)
    "alloc",
    "alloc_extend_one",
    "free",
    "free_segment",
    "free_segments",
    "available_size",
    "schedulable_available_size",
    "write",
    "free_mamba_cache",
    "donate_mamba_ping_pong_slot",
    "get_mamba_ping_pong_keep_idx",
    "get_mamba_ping_pong_other_idx",
    "set_mamba_ping_pong_slot",
    "translate_mamba_indices",
    "copy_from",
)
SG_METHODS = (
    "checkpoint",
    "lock",
    "unlock",
    "claim_kv_row",
    "free_kv_row",
    "on_release",
    "prefix_device_indices",
    "match_prefix",
    "inc_lock_ref",
    "dec_lock_ref",
    "cache_unfinished_req",
    "cache_finished_req",
    "evict",
    "evict_for_alloc",
    "insert",
    "full_evictable_size",
)


# ----------------------------------------------------------------------------------------------- timing
class CallTimes:
    """Per-call wall times of wrapped methods, keyed by ``(parent, name)`` (``parent``: the innermost
    wrapped call this one ran inside, ``""`` at top level), plus the total time inside top-level calls.

    :meth:`instrument` replaces methods on one object (an instance attribute shadows the class's, and
    the cache's own ``self.x()`` calls find it too). Methods instrumented with ``pool=True`` are not
    samples themselves: their time (outermost pool call only) is charged to every enclosing call, whose
    time without it goes to :attr:`excl` (SGLang's side runs on our counting pools, whose liveness checks
    are not SGLang's cost). Overhead: two clock reads and a few list operations per call (under a µs)."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.excl: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.stack: list[list[Any]] = []  # [name, pool ns inside it]
        self.pool_depth = 0
        self.pool_ns = 0  # outermost pool calls inside cache calls
        self.top_ns = 0
        self.recording = True

    def instrument(self, obj: Any, names: Sequence[str], pool: bool = False) -> None:
        for name in names:
            inner = getattr(obj, name, None)
            if inner is not None and callable(inner):
                setattr(obj, name, self._wrap_pool(inner) if pool else self._wrap(name, inner))

    def _wrap(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        stack, samples, excl = self.stack, self.samples, self.excl

        derived = DERIVED.get(name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            parent = stack[-1][0] if stack else ""
            frame: list[Any] = [name, 0, {}]  # name, pool ns inside, ns per wrapped child name
            stack.append(frame)
            t0 = CLOCK()
            try:
                return inner(*args, **kwargs)
            finally:
                dt = CLOCK() - t0
                stack.pop()
                if stack:
                    children = stack[-1][2]
                    children[name] = children.get(name, 0) + dt
                if self.recording:
                    samples[(parent, name)].append(dt)
                    excl[(parent, name)].append(dt - frame[1])
                    if derived is not None and derived[2] in frame[2]:
                        samples[(name, derived[0])].append(sum(frame[2].get(c, 0) for c in derived[1]))
                    if not stack:
                        self.top_ns += dt

        return timed

    def _wrap_pool(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        stack = self.stack

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not stack or self.pool_depth:  # a driver's own pool call, or one inside a pool call
                return inner(*args, **kwargs)
            self.pool_depth += 1
            t0 = CLOCK()
            try:
                return inner(*args, **kwargs)
            finally:
                dt = CLOCK() - t0
                self.pool_depth -= 1
                for frame in stack:
                    frame[1] += dt
                if self.recording:
                    self.pool_ns += dt

        return timed

    def get(self, parent: str, name: str, exclusive: bool = False) -> list[int]:
        table = self.excl if exclusive else self.samples
        if parent == "*":
            return [t for (p, n), ts in table.items() if n == name for t in ts]
        if parent.startswith("!"):
            return [t for (p, n), ts in table.items() if n == name and p != parent[1:] for t in ts]
        return table.get((parent, name), [])

    def snapshot(self) -> CallTimes:
        """A copy of the samples so far (for per-request breakdowns)."""
        out = CallTimes()
        for k, v in self.samples.items():
            out.samples[k] = list(v)
        for k, v in self.excl.items():
            out.excl[k] = list(v)
        out.top_ns, out.pool_ns = self.top_ns, self.pool_ns
        return out

    @staticmethod
    def merged(parts: Sequence[CallTimes]) -> CallTimes:
        out = CallTimes()
        for part in parts:
            for k, v in part.samples.items():
                out.samples[k] += v
            for k, v in part.excl.items():
                out.excl[k] += v
            out.top_ns += part.top_ns
            out.pool_ns += part.pool_ns
        return out

    def reset(self) -> None:
        self.samples.clear()
        self.excl.clear()
        self.top_ns = self.pool_ns = 0


def median_p99_us(samples_ns: Sequence[int]) -> tuple[float, float, int]:
    """Median and p99 (nearest rank) in µs, and the count; NaN for no samples."""
    if not samples_ns:
        return math.nan, math.nan, 0
    s = sorted(samples_ns)
    n = len(s)
    mid = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p99 = s[min(n - 1, max(0, math.ceil(0.99 * n) - 1))]
    return mid / 1e3, p99 / 1e3, n


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


# ------------------------------------------------------------------------------------------------ sides
def bench_config() -> CacheConfig:
    """extra_buffer with the preset that makes our cache replay SGLang 0.5.20 request by request."""
    return apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), "sglang-0.5.20")


class SGLangSide:
    """One SGLang version's cache behind the replay module's scheduler driver, one request at a time."""

    def __init__(self, sg: Any, cfg: sg_replay.ReplayConfig, max_context_len: int) -> None:
        driver_cls = sg_replay._DRIVERS.get(sg.version)
        if driver_cls is None:
            raise SGLangError(f"the replay module has no scheduler driver for sglang {sg.version}")
        self.sg, self.version = sg, sg.version
        self.times = CallTimes()
        with sg.activated():
            self.driver = driver_cls(sg, cfg, max_context_len)
        self.times.instrument(self.driver.cache, SG_METHODS)
        self.times.instrument(self.driver, SG_DRIVER_OPS.get(sg.version, ()))
        req_pool = self.driver.req_pool
        for pool_obj in (self.driver.kv_pool, req_pool, req_pool.mamba_allocator, req_pool.mamba_pool):
            self.times.instrument(pool_obj, SG_POOL_METHODS, pool=True)
        self.wall_ns = 0
        self.cpu_ns = 0
        self.rows: list[Any] = []
        self.active = False  # inside activated_for(): this version's modules are in sys.modules already

    def activated(self) -> contextlib.AbstractContextManager[Any]:
        """This version's modules in ``sys.modules`` (a no-op inside :func:`activated_for`)."""
        return contextlib.nullcontext() if self.active else self.sg.activated()

    @property
    def cache(self) -> Any:
        return self.driver.cache

    def run(self, request: sg_replay.ReplayRequest, chunk: int | None = None) -> Any:
        """Replay one request (prefill chunks of ``chunk`` tokens if given); its wall goes to ``wall_ns``."""
        if chunk is not None and chunk != self.driver.cfg.chunked_prefill_size:
            self.driver.cfg = dataclasses.replace(self.driver.cfg, chunked_prefill_size=chunk)
        with self.activated():
            t0, c0 = CLOCK(), CPU()
            try:
                row = self.driver.run_one(request)
            except (AssertionError, RuntimeError, IndexError, ValueError, TypeError) as err:
                raise sg_replay.ReplayError(
                    f"sglang {self.version} raised on request {request.index}: {type(err).__name__}: {err}"
                ) from err
            self.cpu_ns += CPU() - c0
            self.wall_ns += CLOCK() - t0
        self.rows.append(row)
        return row


def instrument_ours(times: CallTimes, cache: MambaRadixCache) -> None:
    """Time our cache's calls, its lifecycle's SGLang-named hand-overs (commit and finish make them on the
    lifecycle layer, not through the cache's forwarding methods), and its tree's walk (the admission check
    walks; the match reuses it)."""
    times.instrument(cache, OUR_METHODS)
    times.instrument(cache.lifecycle, ("cache_unfinished_req", "cache_finished_req"))
    times.instrument(cache.tree, ("walk",))


class OursSide:
    """Our cache driven through the request lifecycle by a minimal loop (the simulator's protocol: chunked
    prefill, decode from track boundary to track boundary, finish), without the simulator around it."""

    def __init__(self, config: CacheConfig, num_tokens: int, num_slots: int, max_context_len: int) -> None:
        self.cache = MambaRadixCache.build(
            config,
            num_tokens=num_tokens,
            num_slots=num_slots,
            max_running_requests=2,
            max_context_len=max_context_len + 1,
            conv_shapes=((8,),),
            temporal_shape=(4,),
        )
        self.times = CallTimes()
        instrument_ours(self.times, self.cache)
        self.wall_ns = 0
        self.hits: list[int] = []
        self.boundary_ns: list[int] = []  # extend + commit of decode segments that end on a track boundary

    def run(self, rid: int, input_ids: list[int], output_ids: list[int], chunk: int) -> int:
        cache, t0 = self.cache, CLOCK()
        req = Req(rid=rid, origin_input_ids=input_ids)
        if not cache.admit(req, max(len(output_ids), 1)):
            raise RuntimeError(f"our cache refused request {rid}; the benchmark's pools are too small")
        hit = req.cache_protected_len
        n_in = len(input_ids)
        final = n_in + max(len(output_ids) - 1, 0)
        while req.kv_len < n_in:
            left = n_in - req.kv_len
            plan = cache.extend(req, left if chunk <= 0 else min(chunk, left))
            assert plan is not None
            last = plan.end == n_in
            if last:
                req.output_ids = output_ids[:1]
            cache.commit(plan, finished=last and plan.end >= final)
        while req.kv_len < final:
            kv = req.kv_len
            boundary = cache.buffer.next_decode_boundary(kv)
            end = final if boundary is None else min(final, boundary)
            req.output_ids = output_ids[: end - n_in]
            t_seg = CLOCK()
            plan = cache.extend(req, end - kv)
            assert plan is not None
            req.output_ids = output_ids[: end - n_in + 1]
            cache.commit(plan, finished=end >= final)
            if end == boundary:
                self.boundary_ns.append(CLOCK() - t_seg)
        cache.finish(req)
        self.wall_ns += CLOCK() - t0
        self.hits.append(hit)
        return hit


FAILED: dict[str, str] = {}  # SGLang versions dropped during the run, and why (printed in the report)


def run_sides(
    sides: list[SGLangSide],
    request: sg_replay.ReplayRequest,
    chunk: int | None = None,
    before: Callable[[], None] | None = None,
) -> None:
    """Replay ``request`` through every side (``before()`` first, untimed, if given); a side whose cache
    raises is dropped from ``sides`` (and from the rest of the run's comparisons for this stage) with the
    reason in :data:`FAILED`, so one release's failure does not lose the others' numbers."""
    for side in list(sides):
        if before is not None:
            before()
        try:
            side.run(request, chunk)
        except sg_replay.ReplayError as err:
            FAILED[side.version] = str(err)
            sides.remove(side)


@contextlib.contextmanager
def activated_for(sides: Sequence[SGLangSide]) -> Iterator[None]:
    """With one SGLang version, keep its modules in ``sys.modules`` for the whole stage: swapping them
    costs about a millisecond (it scans ``sys.modules``), far more than a cache call. With several, each
    call swaps (outside the timed region)."""
    if len(sides) != 1:
        yield
        return
    side = sides[0]
    with side.sg.activated():
        side.active = True
        try:
            yield
        finally:
            side.active = False


def load_versions(versions: Sequence[str]) -> tuple[list[Any], dict[str, str]]:
    """The loadable versions' modules, and why each other version was skipped."""
    loaded, skipped = [], {}
    for version in versions:
        try:
            sg = load_sglang(version)
            if version not in sg_replay._DRIVERS:
                raise SGLangError(
                    f"no replay driver for sglang {version} in mamba_radix/testing/sglang/replay.py"
                )
            loaded.append(sg)
        except SGLangError as err:
            skipped[version] = str(err)
    return loaded, skipped


# ---------------------------------------------------------------------------------- 1. the trace replay
class CacheChill:
    """Cold CPU caches on demand: ``chill()`` reads a buffer of ``mib`` MiB (more than this machine's 32 MiB
    L3 at the default of 64), evicting what the last request left there; ``mib=0`` does nothing. A stand-in
    for the engine's own work between two cache calls, the same for both caches. Untimed by its callers."""

    def __init__(self, mib: int) -> None:
        self.buffer = np.ones(mib << 18, dtype=np.float32) if mib > 0 else None

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.sum()


def stage_trace(
    traces: list[TraceRequest],
    sgs: list[Any],
    progress: Progress,
    block: int = DEFAULT_TURN,
    cold_mib: int = 0,
) -> dict[str, Any]:
    """Both caches on the trace, taking turns of ``block`` requests (1: request by request); with
    ``cold_mib``, every request of every side starts after a read of that many MiB (untimed), so all run
    equally cold. Per-op samples, walls, hit parity."""
    from mamba_radix.sim.budget import exact_pools
    from mamba_radix.sim.engine import Engine, EngineOptions

    config = bench_config()
    max_len = max(t.input_len + t.output_len for t in traces)
    sides = [SGLangSide(sg, replay_config_for(config, KV_TOKENS, STATE_SLOTS), max_len) for sg in sgs]
    pools = exact_pools(config, KV_TOKENS, STATE_SLOTS, "kimi-k3")
    engine = Engine(
        config,
        pools,
        max_len,
        EngineOptions(mode="sequential", keep_per_request=True, verify_states=False, max_running_requests=4),
    )
    ours = CallTimes()
    instrument_ours(ours, engine.cache)
    outside_ns = outside_cpu_ns = 0  # what the engine's run spent in SGLang's requests (the generator)
    chill = CacheChill(cold_mib)

    def source() -> Iterator[TraceRequest]:
        nonlocal outside_ns, outside_cpu_ns
        for n, trace in enumerate(traces):
            t0, c0 = CLOCK(), CPU()
            if n % block == 0:  # SGLang's turn: this request and the rest of its block
                for k, t in enumerate(traces[n : n + block], n + 1):
                    request = sg_replay.ReplayRequest(t.index, t.input_ids, t.output_ids, t.extra_key)
                    run_sides(sides, request, before=chill)
                    progress.update("trace", k)
            chill()  # ours next
            outside_cpu_ns += CPU() - c0
            outside_ns += CLOCK() - t0
            yield trace

    with activated_for(sides):
        t0, c0 = CLOCK(), CPU()
        metrics = engine.run(source(), total=len(traces))
    ours_cpu_ns = CPU() - c0 - outside_cpu_ns
    ours_wall_ns = CLOCK() - t0 - outside_ns
    ours_hits = {row["index"]: row["hit"] for row in metrics.per_request}
    out: dict[str, Any] = {
        "requests": len(traces),
        "block": block,
        "cold_mib": cold_mib,
        "input_tokens": sum(t.input_len for t in traces),
        "ours": {"times": ours, "wall_ns": ours_wall_ns, "cpu_ns": ours_cpu_ns, "cache_ns": ours.top_ns},
        "sglang": {},
    }
    for side in sides:
        same = sum(ours_hits.get(r.index) == r.hit for r in side.rows)
        out["sglang"][side.version] = {
            "times": side.times,
            "wall_ns": side.wall_ns,
            "cpu_ns": side.cpu_ns,
            "cache_ns": side.times.top_ns,
            "identical_hits": same,
        }
    return out


# ------------------------------------------------------------------------------------ 2. long contexts
class TokenSource:
    """Fresh token ids, never repeated, so no two synthetic requests share tokens by accident."""

    def __init__(self, start: int = 1_000_000_000) -> None:
        self.next = start

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _sg_request(index: int, input_ids: list[int], output_ids: list[int]) -> sg_replay.ReplayRequest:
    return sg_replay.ReplayRequest(index, input_ids, output_ids)


def stage_long(
    sgs: list[Any], paths: Sequence[int], requests_per_path: int, chunks: int, progress: Progress
) -> dict[str, Any]:
    """Per path length ``P``: one request builds the path (one prefill chunk, one output token), then
    ``requests_per_path`` requests hit it, each adding ``chunks`` prefill chunks of 1,024 new tokens and
    1,025 output tokens (four decode boundaries; finish inserts 1,024 new tokens)."""
    config = bench_config()
    new, decode = 1024, 1025
    results: dict[str, Any] = {}
    done = 0
    for path in paths:
        tokens = TokenSource()
        base = tokens.take(path)
        max_len = path + chunks * new + decode + 1
        need_kv = path + 2 + requests_per_path * (chunks * new + decode) + 4096
        ours = OursSide(config, need_kv, 64, max_len)
        rcfg = replay_config_for(config, need_kv, 64)
        sides = [SGLangSide(sg, rcfg, max_len) for sg in sgs]
        first_out = tokens.take(1)
        # the path: P tokens then one more, so the finish's checkpoint sits at P (a multiple of 64)
        build_in = base + tokens.take(1)
        run_sides(sides, _sg_request(0, build_in, first_out), chunk=-1)
        ours.run(0, build_in, first_out, chunk=-1)
        for side in sides:
            side.times.reset()
        ours.times.reset()
        ours.boundary_ns.clear()
        for j in range(1, requests_per_path + 1):
            inp = base + tokens.take(chunks * new)
            out = tokens.take(decode)
            run_sides(sides, _sg_request(j, inp, out), chunk=new)
            ours.run(j, inp, out, chunk=new)
            done += 1
            progress.update("long", done)
        results[path] = {
            "ours": ours.times,
            "decode_commits": ours.boundary_ns,
            "sglang": {s.version: s.times for s in sides},
        }
        hits_sg = [r.hit for s in sides for r in s.rows[1:]]
        results[path]["hits_agree"] = all(h == path for h in ours.hits[1:]) and all(
            h == path for h in hits_sg
        )
    return results


# --------------------------------------------------------------------------------- 3. deep sessions
def stage_sessions(
    sgs: list[Any], sessions: int, turns: int, user_tokens: int, output_tokens: int, progress: Progress
) -> dict[str, Any]:
    """``sessions`` conversations, interleaved turn by turn: each turn's prompt is the session so far
    (prompts and outputs) plus ``user_tokens`` new tokens; per-turn call times on both sides."""
    config = bench_config()
    tokens = TokenSource()
    max_len = turns * (user_tokens + output_tokens) + 1
    need_kv = sessions * max_len + 8192
    ours = OursSide(config, need_kv, 256, max_len)
    rcfg = replay_config_for(config, need_kv, 256)
    sides = [SGLangSide(sg, rcfg, max_len) for sg in sgs]
    history = [[] for _ in range(sessions)]  # type: list[list[int]]
    per_turn: list[dict[str, Any]] = []
    rid = 0
    for turn in range(turns):
        for s in range(sessions):
            inp = history[s] + tokens.take(user_tokens)
            out = tokens.take(output_tokens)
            for side in sides:
                side.times.reset()
            run_sides(sides, _sg_request(rid, inp, out), chunk=8192)
            ours.times.reset()
            ours.run(rid, inp, out, chunk=8192)
            per_turn.append(
                {
                    "turn": turn,
                    "depth": len(inp),
                    "ours": ours.times.snapshot(),
                    "sglang": {side.version: side.times.snapshot() for side in sides},
                }
            )
            history[s] = inp + out
            rid += 1
            progress.update("sessions", rid)
    hits_same = all(mine == row.hit for side in sides for mine, row in zip(ours.hits, side.rows, strict=True))
    return {"per_turn": per_turn, "hits_identical": hits_same, "max_depth": max(p["depth"] for p in per_turn)}


# ------------------------------------------------------------------------------------- 4. a large tree
def stage_tree(
    sgs: list[Any], target_nodes: int, measured: int, seed: int, progress: Progress
) -> dict[str, Any]:
    """Random branching keys (a prefix of an earlier key, cut anywhere, plus 16-128 fresh tokens) inserted
    into both trees until ours has ``target_nodes`` nodes; then ``measured`` matches (random prefixes of
    inserted keys, the scheduler's kind of lookup) and ``measured`` inserts, alternating the caches."""
    rng = random.Random(seed)
    config = bench_config()
    tokens = TokenSource()
    est_keys = target_nodes + 2 * measured + 2000  # at least one new node per key
    kv_cap = est_keys * 80 + 1_000_000  # live KV: the fresh suffixes (16-128 tokens)
    ours = OursSide(config, kv_cap, est_keys + 16, 4096)
    rcfg = replay_config_for(config, kv_cap, est_keys + 16)
    sides = [SGLangSide(sg, rcfg, 4096) for sg in sgs]
    base_mod = {sg.version: sg.modules["sglang.srt.mem_cache.base_prefix_cache"] for sg in sgs}
    keys: list[list[int]] = []
    ours_alloc = ours.cache.token_to_kv_pool_allocator
    ours_slots = ours.cache.mamba_pool

    def new_key() -> list[int]:
        if keys and rng.random() < 0.95:
            parent = keys[rng.randrange(len(keys))]
            head = parent[: rng.randint(1, len(parent))]
        else:
            head = []
        return head + tokens.take(rng.randint(16, 128))

    failed: dict[str, str] = {}

    def dropped(side: SGLangSide, err: Exception) -> None:
        failed[side.version] = f"{type(err).__name__}: {err}"
        sides.remove(side)

    def insert_both(key: list[int]) -> None:
        for side in list(sides):
            mod = base_mod[side.version]
            value = side.cache.token_to_kv_pool_allocator.alloc(len(key))
            slot = side.driver.req_pool.mamba_allocator.alloc(1)
            params = mod.InsertParams(key=side.sg.RadixKey(array("q", key)), value=value, mamba_value=slot)
            try:
                with side.activated():
                    result = side.cache.insert(params)
            except Exception as err:  # a release whose insert wants more than a key and values
                dropped(side, err)
                continue
            if getattr(result, "mamba_exist", False):
                side.driver.req_pool.mamba_allocator.free(slot)
        kv = ours_alloc.alloc(len(key))
        slot = ours_slots.alloc(1)
        assert kv is not None and slot is not None, "tree benchmark pools too small"
        res = ours.cache.insert(RadixKey(tuple(key)), kv, int(slot[0]))
        if res.mamba_exists:
            ours_slots.free([int(slot[0])])
        keys.append(key)

    def ours_nodes() -> int:
        return sum(1 for _ in ours.cache.tree.nodes())

    def build_and_measure() -> None:
        while True:
            for _ in range(2000):
                insert_both(new_key())
            nodes = ours_nodes()
            progress.update("tree", min(nodes, target_nodes))
            if nodes >= target_nodes:
                break
        for side in sides:
            side.times.reset()
        ours.times.reset()
        for i in range(measured):
            key = keys[rng.randrange(len(keys))]
            key = key[: rng.randint(1, len(key))]
            ours_key = RadixKey(tuple(key))
            ours.cache.match_prefix(ours_key)
            for side in list(sides):
                params = side.sg.MatchPrefixParams(key=side.sg.RadixKey(array("q", key)))
                try:
                    with side.activated():
                        side.cache.match_prefix(params)
                except Exception as err:
                    dropped(side, err)
            insert_both(new_key())
            if i % 100 == 0:
                progress.update("tree", target_nodes + i)

    with activated_for(sides):
        build_and_measure()
    progress.update("tree", target_nodes + measured)

    def sg_nodes(side: SGLangSide) -> int | None:
        collect = getattr(side.cache, "_collect_all_nodes", None)
        return len(collect()) if collect is not None else None

    return {
        "failed": failed,
        "ours_nodes": ours_nodes(),
        "sglang_nodes": {s.version: sg_nodes(s) for s in sides},
        "keys": len(keys),
        "ours": ours.times,
        "sglang": {s.version: s.times for s in sides},
    }


# --------------------------------------------------------------------------------------------- report
def _fmt(x: float, digits: int = 1) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    return f"{x:,.{digits}f}"


def _fx(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def trace_mode(block: int, cold_mib: int) -> str:
    """How the trace replay ran, in words (the report's header and the stage's title)."""
    turns = "request by request" if block == 1 else f"in turns of {block} requests"
    cold = f", each request after a read of {cold_mib} MiB (both equally cold)" if cold_mib else ""
    return f"in the trace replay the caches alternate {turns}{cold}"


def report_trace(res: dict[str, Any]) -> list[str]:
    lines = []
    versions = list(res["sglang"])
    ours: CallTimes = res["ours"]["times"]
    lines.append(
        f"### Trace replay: first {res['requests']:,} Mooncake conversation requests "
        f"({res['input_tokens'] / 1e6:.1f}M input tokens), extra_buffer, 8M KV tokens / 1024 slots; "
        + trace_mode(res["block"], res["cold_mib"]).replace("in the trace replay ", "")
    )
    lines.append("")
    for v in versions:
        lines.append(
            f"Per-request hits identical to SGLang {v}: {res['sglang'][v]['identical_hits']:,} / {res['requests']:,}"
            + (" (ours runs the sglang-0.5.20 preset; 0.5.23's rules differ)." if v != "0.5.20" else ".")
        )
    lines.append("")
    head = "| operation | calls | ours median µs | ours p99 µs |"
    sep = "|---|---:|---:|---:|"
    for v in versions:
        head += (
            f" SGLang {v} median µs | p99 µs | median ratio SGLang/ours | p99 ratio |"
            " SGLang median without counting pools µs | its ratio |"
        )
        sep += "---:|---:|---:|---:|---:|---:|"
    head += f" target (median ratio >= {TARGET_OP_SPEEDUP:g}) met |"
    sep += "---|"
    lines += [head, sep]
    summary: dict[str, Any] = {}
    for label, (op, opn), sg_op in COMPARED:
        om, op99, on = median_p99_us(ours.get(op, opn))
        row = f"| {label} | {on:,} | {_fmt(om)} | {_fmt(op99)} |"
        best = best_excl = math.nan
        for v in versions:
            times: CallTimes = res["sglang"][v]["times"]
            sm, sp99, _ = median_p99_us(sg_samples(times, v, sg_op))
            se, _, _ = median_p99_us(sg_samples(times, v, sg_op, exclusive=True))
            row += (
                f" {_fmt(sm)} | {_fmt(sp99)} | {_fx(ratio(sm, om))} | {_fx(ratio(sp99, op99))} |"
                f" {_fmt(se)} | {_fx(ratio(se, om))} |"
            )
            if not math.isnan(sm):
                best = sm if math.isnan(best) else min(best, sm)
                best_excl = se if math.isnan(best_excl) else min(best_excl, se)
        r = ratio(best, om)
        ok = None if math.isnan(r) else r >= TARGET_OP_SPEEDUP
        summary[label] = {
            "ours_median_us": om,
            "best_sglang_median_us": best,
            "best_sglang_median_without_pools_us": best_excl,
            "ratio": r,
            "ratio_without_pools": ratio(best_excl, om),
            "met": ok,
        }
        row += f" {_met(ok)} |"
        lines.append(row)
    lines.append("")
    lines.append(
        "SGLang's side runs on counting pools (`mamba_radix/testing/sglang/pools.py`: fresh ids, liveness "
        "checks in numpy) instead of its device pools; the 'without counting pools' columns subtract the "
        "time inside them, a lower bound on SGLang's own cost. Targets use the plain medians, as the issue "
        "measured them."
    )
    lines.append("")
    lines.append("Ours only (the lifecycle calls the simulator makes):")
    lines.append("")
    lines.append("| call | calls | median µs | p99 µs | total s |")
    lines.append("|---|---:|---:|---:|---:|")
    for name in OURS_ONLY:
        s = ours.get("", name)
        m, p, n = median_p99_us(s)
        lines.append(f"| {name} | {n:,} | {_fmt(m)} | {_fmt(p)} | {sum(s) / 1e9:.2f} |")
    lines.append("")
    ow, oc = res["ours"]["wall_ns"] / 1e9, res["ours"]["cache_ns"] / 1e9
    ocpu = res["ours"]["cpu_ns"] / 1e9
    own_share = (ow - oc) / ow if ow else math.nan
    lines.append(
        "| replay | wall s | CPU s | in cache calls s (wall) | rest s (driver / simulator) | rest share of wall |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|")
    lines.append(f"| ours (simulator) | {ow:.2f} | {ocpu:.2f} | {oc:.2f} | {ow - oc:.2f} | {own_share:.0%} |")
    best_wall = best_cpu = math.nan
    for v in versions:
        d = res["sglang"][v]
        sw, sc, scpu = d["wall_ns"] / 1e9, d["cache_ns"] / 1e9, d["cpu_ns"] / 1e9
        best_wall = sw if math.isnan(best_wall) else min(best_wall, sw)
        best_cpu = scpu if math.isnan(best_cpu) else min(best_cpu, scpu)
        lines.append(
            f"| SGLang {v} (replay driver) | {sw:.2f} | {scpu:.2f} | {sc:.2f} | {sw - sc:.2f} | "
            f"{(sw - sc) / sw:.0%} |"
        )
    wall_ratio = ratio(best_wall, ow)
    lines.append("")
    lines.append(
        f"- whole replay, SGLang wall / ours: **{_fx(wall_ratio)}**, CPU time: {_fx(ratio(best_cpu, ocpu))} "
        f"(target >= {TARGET_WALL_SPEEDUP:g}x: "
        f"{_met(None if math.isnan(wall_ratio) else wall_ratio >= TARGET_WALL_SPEEDUP)})"
    )
    if versions:
        sc = min(res["sglang"][v]["cache_ns"] for v in versions) / 1e9
        lines.append(f"- time in cache calls, SGLang / ours: {_fx(ratio(sc, oc))}")
    lines.append(
        f"- the simulator's own work: {own_share:.0%} of its wall (target <= {TARGET_SIM_SHARE:.0%}: "
        f"{_met(own_share <= TARGET_SIM_SHARE)})"
    )
    res["summary"] = {
        "ops": summary,
        "wall_ratio": wall_ratio,
        "sim_share": own_share,
        "ours_wall_s": ow,
        "ours_cache_s": oc,
    }
    return lines


def report_long(res: dict[str, Any]) -> list[str]:
    lines = ["### Long context: a path of P tokens, then hand-overs of 1,024 new tokens each", ""]
    paths = sorted(res)
    versions = [
        v for v in (res[paths[0]]["sglang"] if paths else ()) if all(v in res[p]["sglang"] for p in paths)
    ]
    ops = (
        ("admission match (key of P + 4k)", ("admit", "walk+match_prefix"), "match"),
        ("cache_unfinished_req, 1,024 new tokens", ("commit", "cache_unfinished_req"), "handover"),
        ("cache_finished_req, 1,024 new tokens", ("finish", "cache_finished_req"), "finish"),
        ("extend + commit of a decode segment ending on a boundary", ("", "commit@decode"), None),
    )
    head = "| operation | path P | ours median µs | ours vs P=1k |"
    sep = "|---|---:|---:|---:|"
    for v in versions:
        head += f" SGLang {v} median µs | SGLang vs P=1k | ratio SGLang/ours |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    growth: dict[str, dict[int, float]] = defaultdict(dict)
    for label, (op, opn), sg_op in ops:
        base_ours: float = math.nan
        base_sg: dict[str, float] = {}
        for p in paths:
            ours: CallTimes = res[p]["ours"]
            samples = res[p].get("decode_commits", []) if opn == "commit@decode" else ours.get(op, opn)
            om, _, on = median_p99_us(samples)
            if p == paths[0]:
                base_ours = om
            growth[label][p] = ratio(om, base_ours)
            row = f"| {label} | {p:,} | {_fmt(om)} (n={on}) | {_fx(ratio(om, base_ours))} |"
            for v in versions:
                if sg_op is None:
                    row += " no cache call (the scheduler notes the boundary) | | |"
                    continue
                sm, _, _ = median_p99_us(sg_samples(res[p]["sglang"][v], v, sg_op))
                if p == paths[0]:
                    base_sg[v] = sm
                row += f" {_fmt(sm)} | {_fx(ratio(sm, base_sg[v]))} | {_fx(ratio(sm, om))} |"
            lines.append(row)
    lines.append("")
    p128 = next((p for p in paths if p == 131_072), None)
    for label in (ops[1][0], ops[2][0]):
        g = growth[label].get(p128, math.nan) if p128 else math.nan
        lines.append(
            f"- {label}: ours at 128k / at 1k = **{_fx(g)}** (target <= {TARGET_PATH_GROWTH:g}x: "
            f"{_met(None if math.isnan(g) else g <= TARGET_PATH_GROWTH)})"
        )
    if not all(res[p]["hits_agree"] for p in paths):
        lines.append("- WARNING: some request did not hit its whole path on one side")
    return lines


def report_sessions(res: dict[str, Any]) -> list[str]:
    per = res["per_turn"]
    versions = [v for v in (per[0]["sglang"] if per else ()) if all(v in r["sglang"] for r in per)]
    q = max(1, len(per) // 4)
    first, last = per[:q], per[-q:]
    lines = [
        f"### Deep multi-turn sessions: {len(per)} turns in all, depth up to {res['max_depth']:,} tokens "
        f"(hits identical: {'yes' if res['hits_identical'] else '**no**'}); medians over the first and "
        "the last quarter of the turns",
        "",
    ]
    ops = (
        ("admission match", ("admit", "walk+match_prefix"), "match"),
        ("cache_unfinished_req", ("commit", "cache_unfinished_req"), "handover"),
        ("cache_finished_req", ("finish", "cache_finished_req"), "finish"),
    )
    head = "| operation | ours first µs | ours last µs | ours growth |"
    sep = "|---|---:|---:|---:|"
    for v in versions:
        head += f" SGLang {v} first µs | last µs | growth | ratio SGLang/ours (last) |"
        sep += "---:|---:|---:|---:|"
    lines += [head, sep]
    ours_first = CallTimes.merged([r["ours"] for r in first])
    ours_last = CallTimes.merged([r["ours"] for r in last])
    for label, (op, opn), sg_op in ops:
        a, _, _ = median_p99_us(ours_first.get(op, opn))
        b, _, _ = median_p99_us(ours_last.get(op, opn))
        row = f"| {label} | {_fmt(a)} | {_fmt(b)} | {_fx(ratio(b, a))} |"
        for v in versions:
            c, _, _ = median_p99_us(sg_samples(CallTimes.merged([r["sglang"][v] for r in first]), v, sg_op))
            d, _, _ = median_p99_us(sg_samples(CallTimes.merged([r["sglang"][v] for r in last]), v, sg_op))
            row += f" {_fmt(c)} | {_fmt(d)} | {_fx(ratio(d, c))} | {_fx(ratio(d, b))} |"
        lines.append(row)
    return lines


def report_tree(res: dict[str, Any]) -> list[str]:
    versions = list(res["sglang"])
    lines = [
        f"### A large tree: ours {res['ours_nodes']:,} nodes"
        + "".join(f", SGLang {v} {n:,} nodes" for v, n in res["sglang_nodes"].items() if n is not None)
        + f" ({res['keys']:,} keys)",
        "",
    ]
    for v, why in res["failed"].items():
        lines += [f"- SGLang {v} left out of this case: {why}", ""]
    head = "| operation | ours median µs | ours p99 µs |"
    sep = "|---|---:|---:|"
    for v in versions:
        head += f" SGLang {v} median µs | p99 µs | median ratio SGLang/ours |"
        sep += "---:|---:|---:|"
    lines += [head, sep]
    for label, name in (("match_prefix", "match_prefix"), ("insert", "insert")):
        om, op, _ = median_p99_us(res["ours"].get("", name))
        row = f"| {label} | {_fmt(om)} | {_fmt(op)} |"
        for v in versions:
            sm, sp, _ = median_p99_us(res["sglang"][v].get("", name))
            row += f" {_fmt(sm)} | {_fmt(sp)} | {_fx(ratio(sm, om))} |"
        lines.append(row)
    return lines


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Our cache vs SGLang's real cache on the same requests in one run: per-call medians, "
        "p99s and ratios SGLang/ours, walls, long-context, deep-session and large-tree cases, with the "
        "issue's targets. Ratios only (nothing is asserted).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--limit", type=int, default=2000, help="trace requests to replay (0: the whole trace)")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run under a minute: 200 requests, small cases"
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--versions", default=",".join(VERSIONS), help="SGLang versions to compare with")
    p.add_argument("--tree-nodes", type=int, default=100_000, help="nodes of the large tree (stage tree)")
    p.add_argument("--trace", default=str(trace_path()), help="block-format trace file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markdown", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--json", metavar="FILE", help="write the summary numbers as JSON to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--interleave",
        type=int,
        default=DEFAULT_TURN,
        metavar="N",
        help=f"trace stage: the caches take turns of N requests (default {DEFAULT_TURN}, where the targets "
        "are judged; 1: request by request, each cache's calls then run just after the other's whole "
        "request)",
    )
    p.add_argument(
        "--cold-mib",
        type=int,
        default=0,
        metavar="M",
        help="trace stage: before every request of each cache, read M MiB (untimed; 64 is twice this "
        "machine's L3), so both run equally cold, as between an engine's forward passes; 0: off",
    )
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in args.stages if s not in STAGES]
    if bad:
        p.error(f"unknown stage {bad[0]!r}; choose from {', '.join(STAGES)}")
    if args.limit < 0 or args.tree_nodes < 1 or args.interleave < 1 or args.cold_mib < 0:
        p.error("--limit and --cold-mib must be >= 0, and --tree-nodes and --interleave >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    quick = args.quick
    limit = 200 if quick and args.limit == 2000 else (args.limit or None)
    paths = (1024, 131_072) if quick else (1024, 131_072, 1_048_576)
    per_path, chunks = (3, 3) if quick else (6, 4)
    sessions, turns = (2, 8) if quick else (2, 32)
    tree_nodes = min(args.tree_nodes, 4000) if quick else args.tree_nodes
    measured = 300 if quick else 2000

    sgs, skipped = load_versions([v.strip() for v in args.versions.split(",") if v.strip()])
    traces = list(iter_block_trace(args.trace, limit=limit)) if "trace" in args.stages else []
    units = {
        "trace": len(traces),
        "long": len(paths) * per_path,
        "sessions": sessions * turns,
        "tree": tree_nodes + measured,
    }
    total = sum(units[s] for s in args.stages)
    out: list[str] = [
        "## Our cache vs SGLang's, same requests, one run",
        "",
        f"Command: `python benchmarks/bench_vs_sglang.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; one torch thread; "
        + trace_mode(args.interleave, args.cold_mib)
        + "; the other stages interleave call by call or request by request).",
        "",
    ]
    for v, why in skipped.items():
        out.append(f"- SGLang {v} skipped: {why}")
    if skipped:
        out.append("")
    summary: dict[str, Any] = {"skipped": skipped}
    started = time.perf_counter()
    with Progress(total, len(args.stages), "bench_vs_sglang", quiet=args.quiet, every_s=10.0) as progress:
        for stage in args.stages:
            if stage == "trace":
                res = stage_trace(traces, sgs, progress, args.interleave, args.cold_mib)
                out += [*report_trace(res), ""]
                summary["trace"] = res["summary"]
            elif stage == "long":
                res = stage_long(sgs, paths, per_path, chunks, progress)
                out += [*report_long(res), ""]
            elif stage == "sessions":
                res = stage_sessions(sgs, sessions, turns, 2048, 256, progress)
                out += [*report_sessions(res), ""]
            elif stage == "tree":
                res = stage_tree(sgs, tree_nodes, measured, args.seed, progress)
                out += [*report_tree(res), ""]
            progress.run_done(stage, units[stage])
    for v, why in FAILED.items():
        out.append(f"- SGLang {v} was dropped during the run: {why}")
    out.append(f"Benchmark wall: {time.perf_counter() - started:.0f} s.")
    text = "\n".join(out)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
