"""A long, seeded stress of the request lifecycle over tiny pools: the engine's protocol, and its misuses.

Run before each release (not collected by pytest; ``property_tests/test_stress_lifecycle.py`` runs a few
hundred operations of it so that it cannot rot). Issue 32 found two paged-lifecycle defects that a long
random run missed because its driver avoided two cases at ``page_size > 1``; this driver goes out of its
way to reach every case an engine can: chunks cut raw (inside a page: they must be refused with nothing
changed) as well as by ``prefill_chunk_len``, aborts between extend and commit (first chunk, later
chunks, decode, a plan continuing a partial page), retraction when ``extend`` returns ``None``, multi-turn
and branching prompts, and deliberate misuses that must raise the documented typed error and change
nothing.

Every configuration (strategy x overlap x SGLang release preset x page size x decode insert, with per-path
caps and a few policy variants; ``--list`` prints them) gets its own cache, with pools so small that
eviction and admission refusals happen all the time, and its own seed derived from ``--seed``. One
*operation* is one call into the lifecycle that may change the cache: ``admit`` (with its ``can_admit``),
``extend``, ``commit``, ``finish``, or one deliberately refused call. The budget ``--ops`` is split evenly
over the configurations.

What is checked:

- ``admit`` succeeds iff ``can_admit`` said ok, with the hit and reservation it announced; a refused admit,
  an ``extend`` that returns ``None`` and every refused call change nothing (before/after snapshot: the tree
  dump, pool sizes, evictable/protected sizes, ``reserved_kv_tokens``, the cache's counters, every running
  request's fields and request row);
- state stamps (:mod:`mamba_radix.state_stamp`'s layout, written and compared through the simulator's
  byte-identical fast path :mod:`mamba_radix.sim.stamps`): the model writes the stamp of the exact token
  prefix into the live and track slots; after every admit the live slot must hold the stamp of the request's first
  ``kv_len`` tokens (the restored checkpoint, or a cleared slot), before every forward the live slot
  must hold the state at ``kv_len``, and at every invariant check every checkpoint in the tree must hold the
  stamp of its path;
- ``cache.check_invariants(running)`` every ``--check-every`` operations and at the end of every
  configuration (it audits each allocator's own bookkeeping, so a double free is caught there);
- at the end of a configuration every request is finished, the tree is evicted down to its root and every
  pool is whole again.

On the first violation it prints the configuration, the seeds, the operation index and a replay command
for that configuration alone, and exits 1. Exit codes: 0 ok, 1 violation, 2 bad usage.

Usage::

    .venv/bin/python benchmarks/stress_lifecycle.py                  # 1,000,000 operations (about 15 min)
    .venv/bin/python benchmarks/stress_lifecycle.py --quick          # a smoke test, seconds
    .venv/bin/python benchmarks/stress_lifecycle.py --configs '*/p16/*' --ops 50000 --seed 7
    .venv/bin/python benchmarks/stress_lifecycle.py --list

Cost: each operation is the cache call's own cost (O(L + path * log n)) plus O(1) stamp work; a refused
call adds two snapshots (O(n + L)); an invariant check is O(n + tokens) plus O(tokens) for the tree's
stamps. Memory stays flat (tiny pools; at most 64 earlier sequences are kept for multi-turn prompts).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import random
import re
import resource
import shlex
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import NoReturn

import numpy as np
import torch

import mamba_radix
from mamba_radix import CacheConfig, ForwardPlan, MambaRadixCache, Req
from mamba_radix.errors import InvalidArgument, InvariantError
from mamba_radix.peers import apply_peer
from mamba_radix.sim.stamps import StampIO
from mamba_radix.state_stamp import PrefixFingerprints, fingerprint_extend, read_stamp

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2
DEFAULT_OPS = 1_000_000
QUICK_OPS = 4_000
DEFAULT_CHECK_EVERY = 50
QUICK_CHECK_EVERY = 10
HISTORY = 64  # earlier sequences kept for multi-turn and branching prompts
MAX_RUNNING = 4  # request rows: a tiny batch, so rows run out too
SCRIPT = "benchmarks/stress_lifecycle.py"


class Violation(Exception):
    """A broken contract: the message says which, and what was seen."""


# ----------------------------------------------------------------------------------------- configurations
@dataclass(frozen=True)
class StressConfig:
    """One configuration: the cache config, its tiny pools and the request sizes drawn for it."""

    name: str
    config: CacheConfig
    num_tokens: int  # KV pool, in tokens
    num_slots: int  # state slots
    max_context_len: int  # request row width
    max_prompt: int  # fresh prompts are 1..max_prompt tokens
    max_outputs: int  # a request samples 1..max_outputs tokens


# Grid and pool sizes per page size: checkpoints every few tokens, a KV pool a few requests deep.
# (page: mamba_cache_chunk_size, mamba_track_interval, chunked_prefill_size, num_tokens, max_context_len,
# max_prompt, max_outputs)
_SIZES = {
    1: (4, 8, 12, 128, 120, 48, 24),
    4: (4, 8, 16, 192, 160, 64, 24),
    16: (16, 32, 48, 640, 480, 160, 48),
}
_PRESETS = ("sglang-0.5.20", "sglang-0.5.23")
_CAPS = (-1, 2, 1, 3)  # mamba_max_states_per_path, in turn over the configurations
_SHORT = {"no_buffer": "nb", "extra_buffer": "eb", "extra_buffer_lazy": "lazy"}


def _stress_config(
    label: str, peer: str, strategy: str, overlap: bool, page: int, cap: int, dins: bool, **policy: object
) -> StressConfig:
    chunk, interval, prefill, num_tokens, max_context, max_prompt, max_outputs = _SIZES[page]
    base = CacheConfig(
        mamba_radix_cache_strategy=strategy,  # type: ignore[arg-type]
        page_size=page,
        disable_overlap_schedule=not overlap,
        mamba_cache_chunk_size=chunk,
        mamba_track_interval=interval,
        chunked_prefill_size=prefill,
        mamba_max_states_per_path=cap,
    )
    # The preset's fields win over the caller's (peers.py); decode insert and the policy variants are
    # switches on top of it.
    config = apply_peer(base, peer).replace(mamba_decode_insert=dins, **policy)
    name = "/".join(
        (
            label,
            _SHORT[config.strategy],
            "ov" if config.overlap else "no-ov",
            f"p{page}",
            f"cap{cap}" if cap > 0 else "cap-",
            "dins" if dins else "track",
        )
    )
    # Two requests' worth of slots and a few for the tree: state slots bind as often as KV does.
    num_slots = 2 * config.slots_per_request + 3
    return StressConfig(name, config, num_tokens, num_slots, max_context, max_prompt, max_outputs)


def stress_configs() -> list[StressConfig]:
    """Every configuration the stress runs, in run order (unpaged first). No side effects. O(1)."""
    grid = []
    for page in (1, 4, 16):
        for peer in _PRESETS:
            for dins in (False, True):
                if page == 1:
                    grid.append((peer, "no_buffer", False, page, dins))
                grid.append((peer, "extra_buffer", True, page, dins))
                grid.append((peer, "extra_buffer", False, page, dins))
                grid.append((peer, "extra_buffer_lazy", True, page, dins))
    configs = [
        _stress_config(
            peer.removeprefix("sglang-"), peer, strategy, overlap, page, _CAPS[i % len(_CAPS)], dins
        )
        for i, (peer, strategy, overlap, page, dins) in enumerate(grid)
    ]
    # Policy variants over the 0.5.23 rules: other victim orders and Marconi's checkpoint admission.
    configs += [
        _stress_config("legacy", "sglang-legacy", "extra_buffer", True, 4, -1, False),
        _stress_config(
            "mixed", "sglang-0.5.23", "extra_buffer", False, 1, 2, True, mamba_eviction_order="mixed"
        ),
        # the preset marconi-static under its short label "marconi" (as "legacy" is sglang-legacy's): the
        # label names the configuration and seeds it, so keeping it keeps the documented run's operations
        _stress_config("marconi", "marconi-static", "extra_buffer_lazy", True, 16, -1, False),
    ]
    return configs


def config_seed(seed: int, name: str) -> int:
    """The configuration's own seed: a hash of the run's ``--seed`` and its name, so that a filtered
    run (``--configs``) replays exactly the same operations. O(1)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little")


# ----------------------------------------------------------------------------------------- the driver
@dataclass(eq=False)
class Job:
    """A request as the engine knows it: the cache's ``Req`` and every token it will sample."""

    req: Req
    future: list[int]  # every output token it samples, in order; output_ids is a prefix of it
    max_new: int | None  # what admission is told (may be short of len(future): retraction)
    fps: PrefixFingerprints  # fingerprints of every prefix of prompt + future
    committed: ForwardPlan | None = None  # the last committed plan, for the stale-commit misuse
    done: bool = False  # the last forward is committed; only finish remains

    @property
    def final_kv_len(self) -> int:
        """KV length at the end: the last sampled token's KV is never computed."""
        return len(self.req.origin_input_ids) + len(self.future) - 1

    def stamp(self, n: int) -> tuple[int, int]:
        """The stamp of the state after the first ``n`` tokens."""
        return self.fps.at(n), n


@dataclass
class Counts:
    """What one configuration did (the table's columns, and a few more)."""

    ops: int = 0
    admits: int = 0
    admit_refusals: int = 0
    too_long: int = 0
    finishes: int = 0
    aborts: int = 0
    aborts_with_plan: int = 0
    aborts_partial_page: int = 0
    retractions: int = 0
    refusals: int = 0  # refused calls checked to change nothing (misuses, raw chunks, None extends)
    restores: int = 0  # live slots checked after admit
    live_checks: int = 0  # live slots checked before a forward
    tree_stamps: int = 0  # tree checkpoints checked at invariant checks
    invariant_checks: int = 0
    tokens_evicted: int = 0
    states_evicted: int = 0
    wall_s: float = 0.0

    def add(self, other: Counts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class Driver:
    """Drives one cache as an engine would, with misuses; raises :class:`Violation` on a broken contract.

    ``ops_done`` counts operations (see the module docstring); :meth:`step` performs one scheduler
    action (several operations for a batch) and checks invariants whenever the count crosses a multiple
    of ``check_every``. Everything random comes from ``rng``, and nothing depends on the budget, so
    the first ``n`` operations are the same whatever ``--ops`` is (replays rely on it).
    """

    spec: StressConfig
    rng: random.Random
    check_every: int
    counts: Counts = field(default_factory=Counts)
    running: list[Job] = field(default_factory=list)
    waiting: deque[Job] = field(default_factory=deque)
    finished_reqs: deque[Req] = field(default_factory=lambda: deque(maxlen=4))
    history: deque[list[int]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    next_check: int = 0

    def __post_init__(self) -> None:
        spec = self.spec
        self.cache = MambaRadixCache.build(
            spec.config,
            num_tokens=spec.num_tokens,
            num_slots=spec.num_slots,
            max_running_requests=MAX_RUNNING,
            max_context_len=spec.max_context_len,
        )
        self.page = spec.config.page_size
        self.stamps = StampIO(self.cache.mamba_pool)
        self.next_rid = 0
        self.next_check = self.check_every
        self.whole = self._pool_sizes()  # what the pools hold free when nothing is in use

    # ------------------------------------------------------------------------------------ helpers
    @property
    def ops_done(self) -> int:
        return self.counts.ops

    def _op(self) -> None:
        self.counts.ops += 1

    def _pool_sizes(self) -> tuple[int, int, int]:
        c = self.cache
        return (
            c.token_to_kv_pool_allocator.available_size(),
            c.mamba_pool.available_size(),
            c.req_to_token_pool.available_size(),
        )

    def _req_fields(self, req: Req, with_row: bool) -> tuple:
        """Every field of ``req`` the cache writes, its known tokens and (``with_row``) its row up to its
        plan's end."""
        plan = req.pending_plan
        row: list[int] = []
        if with_row and req.req_pool_idx is not None:
            end = req.kv_len if plan is None else plan.end
            row = self.cache.req_to_token_pool.req_to_token[req.req_pool_idx, :end].tolist()
        node = req.last_node
        return (
            req.kv_len,
            id(plan),
            req.prefill_chunks,
            req.mamba_next_track_idx,
            req.mamba_last_track_seqlen,
            req.cache_protected_len,
            req.kv_reserved_tokens,
            req.req_pool_idx,
            req.mamba_pool_idx,
            tuple(req.mamba_ping_pong_track_buffer or ()),
            req.mamba_lazy_is_insert,
            None if node is None else node.id,
            len(req.output_ids),
            req.finished,
            tuple(row),
        )

    def snapshot(self, extra: Iterable[Req] = (), full: bool = True) -> tuple:
        """Everything a refused call must leave as it was: the tree dump (``full``; O(n)), pool sizes,
        evictable and protected sizes, ``reserved_kv_tokens``, the cache's counters and every running
        request's fields and row. O(n + running tokens). The cheap form (``full=False``, taken before
        every extend in case it returns ``None``) leaves the dump and the rows out: a change to the tree
        shows in the sizes or counters, and extend writes a row only after it allocated."""
        c = self.cache
        reqs = [job.req for job in self.running] + list(extra)
        return (
            c.pretty_print() if full else None,
            self._pool_sizes(),
            (c.full_evictable_size(), c.full_protected_size()),
            (c.mamba_evictable_size(), c.mamba_protected_size()),
            c.reserved_kv_tokens,
            tuple(vars(c.stats).values()),  # CacheStats: plain int fields
            tuple(self._req_fields(r, full) for r in reqs),
        )

    def _unchanged(self, before: tuple, what: str, extra: Iterable[Req] = ()) -> None:
        """``before`` (a :meth:`snapshot`) must equal the state now; counts one checked refusal."""
        after = self.snapshot(extra, full=before[0] is not None)
        if after != before:
            parts = (
                "tree",
                "pool sizes",
                "KV evictable/protected",
                "states evictable/protected",
                "reserved_kv_tokens",
                "cache stats",
                "request fields",
            )
            changed = [f"{p}: {a!r} -> {b!r}" for p, a, b in zip(parts, before, after, strict=True) if a != b]
            raise Violation(f"{what} changed what it must not:\n" + "\n".join(changed))
        self.counts.refusals += 1

    def expect_refusal(
        self, call: Callable[[], object], pattern: str, what: str, extra: Iterable[Req] = ()
    ) -> None:
        """``call`` must raise :class:`InvalidArgument` matching ``pattern`` and change nothing. One op."""
        before = self.snapshot(extra)
        self._op()
        try:
            call()
        except InvalidArgument as err:
            if not re.search(pattern, str(err)):
                raise Violation(f"{what}: raised {type(err).__name__} {err!r}, expected /{pattern}/") from err
        else:
            raise Violation(f"{what}: accepted, expected InvalidArgument /{pattern}/")
        self._unchanged(before, what, extra)

    def _check_live(self, job: Job, what: str) -> None:
        """The live slot must hold the state of exactly the request's first ``kv_len`` tokens. O(1)."""
        req = job.req
        want = job.stamp(req.kv_len)
        if not self.stamps.holds(req.mamba_pool_idx, *want):  # type: ignore[arg-type]
            got = read_stamp(self.cache.mamba_pool, req.mamba_pool_idx)  # type: ignore[arg-type]
            raise Violation(
                f"{what}: request {req.rid} live slot {req.mamba_pool_idx} holds the state of {got[1]} tokens "
                f"(fingerprint {got[0]:#x}), expected {want[1]} tokens ({want[0]:#x})"
            )

    def check(self) -> None:
        """The cache's invariants with every running request, then every tree checkpoint's stamp (each
        must hold the state of exactly its path). O(n + tokens)."""
        self.cache.check_invariants([job.req for job in self.running])
        self.counts.invariant_checks += 1
        fps: dict[int, int] = {}
        for node in self.cache.tree.nodes():  # parents before children
            if node.parent is None:
                fps[node.id] = 0
                continue
            fps[node.id] = fp = fingerprint_extend(fps[node.parent.id], node.key)
            if node.mamba_slot is not None:
                self.counts.tree_stamps += 1
                if not self.stamps.holds(node.mamba_slot, fp, node.depth):
                    got = read_stamp(self.cache.mamba_pool, node.mamba_slot)
                    raise Violation(
                        f"tree node #{node.id} (depth {node.depth}) checkpoint slot {node.mamba_slot} holds "
                        f"the state of {got[1]} tokens ({got[0]:#x}), not of its path ({fp:#x})"
                    )

    def _maybe_check(self) -> None:
        if self.counts.ops >= self.next_check:
            self.next_check = (self.counts.ops // self.check_every + 1) * self.check_every
            self.check()

    # --------------------------------------------------------------------------------- new requests
    def _tokens(self, n: int) -> list[int]:
        # a tiny vocabulary now and then: accidental shared prefixes the history does not plan
        vocab = 4 if self.rng.random() < 0.15 else 50_000
        return [self.rng.randrange(vocab) for _ in range(n)]

    def _cut(self, seq: list[int]) -> int:
        """Where a branch leaves ``seq``: anywhere, or next to a page or grid boundary (the edge cases)."""
        rng = self.rng
        if rng.random() < 0.5:
            return rng.randint(1, len(seq))
        grid = self.spec.config.mamba_checkpoint_grid
        unit = rng.choice((self.page, grid))
        at = rng.randint(0, len(seq) // unit) * unit + rng.choice((-1, 0, 0, 1))
        return min(max(at, 1), len(seq))

    def new_job(self) -> Job:
        """A new request: a multi-turn follow-up (an earlier prompt and its outputs plus new tokens), a
        branch (an earlier sequence cut at a random point, plus new tokens), a repeat, or fresh tokens;
        now and then too long on purpose. Sample count and declared ``max_new_tokens`` drawn. O(L)."""
        rng, spec = self.rng, self.spec
        kind = rng.random()
        if self.history and kind < 0.3:
            prompt = rng.choice(self.history) + self._tokens(rng.randint(1, 16))
        elif self.history and kind < 0.65:
            seq = rng.choice(self.history)
            prompt = seq[: self._cut(seq)] + self._tokens(rng.randint(0, 24))
        elif self.history and kind < 0.72:
            prompt = list(rng.choice(self.history))
        elif kind < 0.98:
            prompt = self._tokens(rng.randint(1, spec.max_prompt))
        else:  # longer than a request row: admission must say too_long
            prompt = self._tokens(spec.max_context_len + rng.randint(1, 8))
        outputs = rng.randint(1, spec.max_outputs)
        long_decode = rng.random() < 0.2
        if long_decode:  # decodes up to a full row, declaring little: it outruns its reservation
            outputs = rng.randint(spec.max_outputs, max(spec.max_outputs, spec.max_context_len - len(prompt)))
        room = max(1, spec.max_context_len - outputs + 1)
        if len(prompt) > room and rng.random() < 0.9:  # mostly cut to fit; else too long on purpose
            prompt = prompt[:room]
        job = self._job(prompt, self._tokens(outputs), extra_key=self._namespace())
        if len(prompt) > room:  # declared in full, so that admission sees it cannot fit (too_long)
            job.max_new = outputs
        elif long_decode:
            job.max_new = rng.choice((None, rng.randint(1, spec.max_outputs)))
        return job

    def _namespace(self) -> str | None:
        return None if self.rng.random() < 0.9 else self.rng.choice(("a", "b"))

    def _job(self, prompt: list[int], future: list[int], extra_key: str | None) -> Job:
        rng = self.rng
        self.next_rid += 1
        req = Req(rid=self.next_rid, origin_input_ids=prompt, extra_key=extra_key)
        roll = rng.random()
        if roll < 0.6:
            max_new: int | None = len(future)
        elif roll < 0.75:
            max_new = None  # only the prompt reserved: decode may find KV short (retraction)
        elif roll < 0.9:
            max_new = rng.randint(1, len(future))  # an under-estimate: the same
        else:
            max_new = len(future) + rng.randint(1, 8)  # an over-estimate (an early stop)
        fps = PrefixFingerprints(np.asarray(prompt + future, dtype=np.int64))
        return Job(req, future, max_new, fps)

    # --------------------------------------------------------------------------------- scheduler actions
    def step(self) -> None:
        """One scheduler action, drawn: admit, a batch forward, an abort, an early finish, a finish of
        a request whose last forward is committed, or a misuse probe. One or more operations."""
        rng = self.rng
        done = [job for job in self.running if job.done]
        roll = rng.random()
        if done and (roll < 0.5 or len(done) == len(self.running)):
            self.finish(rng.choice(done))
        elif not self.running or (len(self.running) < MAX_RUNNING and roll < 0.35) or roll < 0.36:
            self.admit()
        elif roll < 0.39:
            self.misuse()
        elif roll < 0.42:
            self.abort(rng.choice(self.running))
        elif roll < 0.44:
            self.early_finish()
        else:
            self.forward()
        self._maybe_check()

    def admit(self) -> None:
        """Admit the head of the waiting queue (retracted requests first), or a new request: ``admit``
        must agree with ``can_admit``, a refusal must change nothing, and the live slot must hold the
        restored state. One op."""
        if not self.waiting or self.rng.random() < 0.2:
            self.waiting.append(self.new_job())
        job = self.waiting[0]
        req, cache = job.req, self.cache
        check = cache.can_admit(req, job.max_new)
        before = None if check.ok else self.snapshot([req])
        self._op()
        admitted = cache.admit(req, job.max_new)
        if admitted != check.ok:
            raise Violation(f"admit returned {admitted} but can_admit said {check}")
        if not admitted:
            self.counts.admit_refusals += 1
            self._unchanged(before, f"refused admit ({check.reason})", [req])  # type: ignore[arg-type]
            if check.reason == "too_long":
                self.counts.too_long += 1
                self.waiting.popleft()
            elif self.rng.random() < 0.3:
                self.waiting.rotate(-1)  # another waiting request first, now and then
            return
        self.waiting.popleft()
        self.counts.admits += 1
        if req.kv_len != check.hit_len or req.kv_reserved_tokens != check.kv_tokens_needed:
            raise Violation(
                f"admit: kv_len={req.kv_len}, reserved={req.kv_reserved_tokens}, but can_admit announced "
                f"hit_len={check.hit_len}, kv_tokens_needed={check.kv_tokens_needed}"
            )
        self._check_live(job, "restore after admit")
        self.counts.restores += 1
        self.running.append(job)
        self.history.append(list(req.origin_input_ids))

    def _decode_len(self, job: Job) -> int:
        """A decode span: one token, or up to the next decode boundary (never past it)."""
        req = job.req
        limit = job.final_kv_len - req.kv_len
        boundary = self.cache.buffer.next_decode_boundary(req.kv_len)
        if boundary is not None:
            limit = min(limit, boundary - req.kv_len)
        return 1 if self.rng.random() < 0.6 else self.rng.randint(1, limit)

    def _know(self, job: Job, end: int) -> None:
        """The engine knows the sampled tokens up to position ``end`` (exclusive): output_ids grows."""
        req = job.req
        want = min(end - len(req.origin_input_ids), len(job.future))
        if want > len(req.output_ids):
            req.output_ids.extend(job.future[len(req.output_ids) : want])

    def _extend(self, job: Job) -> ForwardPlan | None:
        """One extend for ``job``: a prefill chunk (cut by ``prefill_chunk_len``, or raw, which must be
        refused when it ends inside a page) or a decode span. ``None``: no plan (refused, nothing to
        schedule, or KV short: then the request is retracted)."""
        req, rng, cache = job.req, self.rng, self.cache
        self._check_live(job, "before a forward")
        self.counts.live_checks += 1
        input_len = len(req.origin_input_ids)
        if req.kv_len < input_len:
            if rng.random() < 0.7:
                budget = rng.choice(
                    (self.spec.config.chunked_prefill_size, rng.randint(1, 3 * self.page + 8))
                )
                n = cache.prefill_chunk_len(req, budget)
                if n == 0:  # the budget does not reach the next page boundary: later
                    return None
            else:
                n = rng.randint(1, input_len - req.kv_len)
                end = req.kv_len + n
                if end != input_len and end % self.page:
                    self.expect_refusal(
                        lambda: cache.extend(req, n),
                        "must end on a page boundary",
                        "a chunk ending inside a page",
                    )
                    return None
        else:
            n = self._decode_len(job)
            self._know(job, req.kv_len + n)
        before = self.snapshot(full=False)
        self._op()
        plan = cache.extend(req, n)
        if plan is None:
            self._unchanged(before, "an extend that found KV short")
            self.retract(job)
            return None
        if (plan.start, plan.end, plan.is_prefill) != (req.kv_len, req.kv_len + n, req.kv_len < input_len):
            raise Violation(f"extend({n}) at kv_len={req.kv_len} planned [{plan.start}, {plan.end})")
        return plan

    def _run_model(self, job: Job, plan: ForwardPlan) -> None:
        """The model's part: the state at ``end`` into the live slot, the tracked one into the track slot."""
        self.stamps.write(plan.live_slot, *job.stamp(plan.end))
        if plan.track_slot is not None:
            self.stamps.write(plan.track_slot, *job.stamp(plan.track_len))  # type: ignore[arg-type]

    def forward(self) -> None:
        """A batch: extend several running requests, run the model, then commit each plan, or abort the
        request before its commit now and then (the plan's KV is freed with the request's). A request
        whose last forward this is is finished at once or later."""
        rng = self.rng
        ready = [job for job in self.running if not job.done]
        if not ready:
            return
        batch = rng.sample(ready, rng.randint(1, len(ready)))
        planned = []
        for job in batch:
            plan = self._extend(job)
            if plan is not None:
                planned.append((job, plan))
        for job, plan in planned:
            if rng.random() < 0.04:  # aborted before its commit, the model run or not
                if rng.random() < 0.5:
                    self._run_model(job, plan)
                self.abort(job)
            else:
                self._run_model(job, plan)
                self.commit(job, plan)

    def commit(self, job: Job, plan: ForwardPlan) -> None:
        """Commit ``plan`` (two ops when it finishes the request there and then); the token the forward
        samples becomes known."""
        req = job.req
        last = plan.end == job.final_kv_len
        self._op()
        self.cache.commit(plan, finished=last)
        job.committed = plan
        if req.kv_len != plan.end or req.pending_plan is not None:
            raise Violation(f"commit of [{plan.start}, {plan.end}) left kv_len={req.kv_len}")
        self._know(job, plan.end + 1)
        if last:
            job.done = True
            if self.rng.random() < 0.8:
                self.finish(job)

    def finish(self, job: Job) -> None:
        """Finish with insert (the newest checkpoint goes to the tree). One op."""
        req = job.req
        self._op()
        self.cache.finish(req)
        self.counts.finishes += 1
        self._retire(job)
        self.history.append(req.all_token_ids)

    def early_finish(self) -> None:
        """A decoding request stops early (a stop token): finish with insert, no plan pending."""
        decoding = [j for j in self.running if not j.done and j.req.kv_len >= len(j.req.origin_input_ids)]
        if decoding:
            self.finish(self.rng.choice(decoding))

    def abort(self, job: Job) -> None:
        """Abort ``job`` (``finish(insert=False)``), with its pending plan if it has one, now and then
        right after an extend made for the purpose. One or two ops."""
        req = job.req
        if req.pending_plan is None and not job.done and self.rng.random() < 0.5:
            plan = self._extend(job)  # an abort between extend and commit, made on purpose
            if plan is not None and self.rng.random() < 0.5:
                self._run_model(job, plan)
            if job not in self.running:  # retracted by the extend
                return
        plan = req.pending_plan
        self._op()
        self.cache.finish(req, insert=False)
        if req.pending_plan is not None or req.req_pool_idx is not None:
            raise Violation(f"abort left request {req.rid} with a plan or a row")
        self.counts.aborts += 1
        if plan is not None:
            self.counts.aborts_with_plan += 1
            self.counts.aborts_partial_page += plan.start % self.page != 0
        self._retire(job)

    def retract(self, job: Job) -> None:
        """``extend`` found KV short: abort the request and queue it again, first, as a fresh ``Req``
        whose prompt is the prompt and outputs so far (SGLang's retraction). One op."""
        req = job.req
        self._op()
        self.cache.finish(req, insert=False)
        self.counts.retractions += 1
        self._retire(job)
        outputs = len(req.output_ids)
        fresh = self._job(req.all_token_ids, job.future[outputs:], req.extra_key)
        fresh.max_new = job.max_new if job.max_new is None else max(1, job.max_new - outputs)
        self.waiting.appendleft(fresh)

    def _retire(self, job: Job) -> None:
        self.running.remove(job)
        self.finished_reqs.append(job.req)

    # --------------------------------------------------------------------------------------- misuses
    def misuse(self) -> None:
        """One deliberate misuse, drawn among those that apply; each must raise the documented
        :class:`InvalidArgument` and change nothing."""
        rng, cache = self.rng, self.cache
        if not self.running:
            return
        job = rng.choice(self.running)
        req = job.req
        probes: list[Callable[[], None]] = [self._misuse_pending]
        if job.committed is not None:
            stale = job.committed
            probes.append(
                lambda: self.expect_refusal(
                    lambda: cache.commit(stale), "not request .* pending one", "stale commit"
                )
            )
        if not job.done and req.kv_len >= len(req.origin_input_ids):
            probes.append(lambda: self._misuse_boundary(job))
            probes.append(
                lambda: self.expect_refusal(
                    lambda: cache.extend(req, req.seq_len - req.kv_len + 1),
                    "append the sampled token",
                    "extend over tokens not sampled yet",
                )
            )
        if (
            not job.done
            and req.kv_len < len(req.origin_input_ids)
            and req.seq_len == len(req.origin_input_ids)
        ):
            probes.append(
                lambda: self.expect_refusal(
                    lambda: cache.extend(req, len(req.origin_input_ids) - req.kv_len + 1),
                    "append the sampled token|prompt's end",
                    "prefill extend past the prompt",
                )
            )
        probes.append(
            lambda: self.expect_refusal(
                lambda: cache.admit(req, job.max_new), "already admitted", "admit twice"
            )
        )
        probes.append(lambda: self.expect_refusal(lambda: cache.extend(req, 0), "num_tokens", "extend of 0"))
        if self.finished_reqs:
            old = rng.choice(self.finished_reqs)
            probes.append(
                lambda: self.expect_refusal(
                    lambda: cache.finish(old), "holds no request row", "finish twice", [old]
                )
            )
            probes.append(
                lambda: self.expect_refusal(
                    lambda: cache.extend(old, 1), "holds no request row", "extend after finish", [old]
                )
            )
        rng.choice(probes)()

    def _misuse_pending(self) -> None:
        """With a plan pending: extend again, finish with insert, ``cache_finished_req`` with insert; all
        refused. Then the plan is committed or the request aborted."""
        ready = [j for j in self.running if not j.done]
        if not ready:
            return
        job = self.rng.choice(ready)
        plan = self._extend(job)
        if plan is None:
            return
        req, cache = job.req, self.cache
        self.expect_refusal(lambda: cache.extend(req, 1), "uncommitted plan", "extend with a plan pending")
        self.expect_refusal(
            lambda: cache.finish(req), "uncommitted plan", "finish(insert=True) with a plan pending"
        )
        self.expect_refusal(
            lambda: cache.cache_finished_req(req),
            "uncommitted plan",
            "cache_finished_req with a plan pending",
        )
        self._run_model(job, plan)
        if self.rng.random() < 0.3:
            self.abort(job)
        else:
            self.commit(job, plan)

    def _misuse_boundary(self, job: Job) -> None:
        """A decode extend one token past the next decode boundary (tracking strategies)."""
        req = job.req
        boundary = self.cache.buffer.next_decode_boundary(req.kv_len)
        if boundary is None or boundary + 1 > job.final_kv_len:
            return
        known = len(req.output_ids)
        self._know(job, boundary + 1)  # the tokens must be known, or another check refuses first
        self.expect_refusal(
            lambda: self.cache.extend(req, boundary + 1 - req.kv_len),
            "crosses the decode boundary",
            "a decode extend crossing the boundary",
        )
        del req.output_ids[known:]  # the engine had not sampled them yet

    # ------------------------------------------------------------------------------------------- end
    def drain(self) -> None:
        """End of the configuration: finish (or abort) every running request, check the invariants, evict
        the whole tree and check that every pool is whole again."""
        for job in list(self.running):
            if job.done or (job.req.kv_len >= len(job.req.origin_input_ids) and self.rng.random() < 0.5):
                self.finish(job)
            else:
                self.abort(job)
        self.check()
        cache = self.cache
        # the evictions the run itself made (the final one below empties the tree on purpose)
        self.counts.tokens_evicted = cache.stats.tokens_evicted
        self.counts.states_evicted = cache.stats.states_evicted
        free_before = self._pool_sizes()
        cache.evict(cache.token_to_kv_pool_allocator.size, cache.mamba_pool.size)
        if cache.tree.num_nodes != 1 or cache.full_evictable_size() or cache.mamba_evictable_size():
            raise Violation(f"the tree is not empty after evicting everything:\n{cache.pretty_print()}")
        if self._pool_sizes() != self.whole or cache.reserved_kv_tokens:
            raise Violation(
                f"pools not whole at the end (free KV, slots, rows): {self._pool_sizes()} (before the final "
                f"eviction {free_before}), built with {self.whole}; reserved_kv_tokens={cache.reserved_kv_tokens}"
            )
        cache.check_invariants([])
        self.counts.invariant_checks += 1


# ------------------------------------------------------------------------------------------------ the run
@dataclass
class Failure:
    """Where a run found its first violation."""

    spec: StressConfig
    seed: int
    op_index: int  # the configuration's operation at or before which it was found
    budget: int  # the configuration's operations before its final drain
    total_ops: int  # operations of the whole run so far
    message: str


def run_config(
    spec: StressConfig, seed: int, ops: int, check_every: int, progress: Callable[[int], None] | None = None
) -> tuple[Counts, Failure | None]:
    """Drive one configuration for ``ops`` operations then drain it. Returns its counts and the
    violation, if any (a :class:`Violation` or any exception the cache raised where none was due)."""
    start = time.perf_counter()
    driver = Driver(spec, random.Random(config_seed(seed, spec.name)), check_every)
    reported = 0
    try:
        while driver.ops_done < ops:
            driver.step()
            if progress is not None and driver.ops_done - reported >= 256:
                progress(driver.ops_done - reported)
                reported = driver.ops_done
        driver.drain()
    except Exception as err:  # every exception here is a finding, reported with its trace
        if isinstance(err, Violation):
            detail = str(err)
        elif isinstance(err, InvariantError):  # its message carries the tree dump; say who raised it
            frames = [f.name for f in traceback.extract_tb(err.__traceback__)[1:]]
            detail = f"InvariantError in {' > '.join(frames[:6])}{' > ...' if len(frames) > 6 else ''}: {err}"
        else:  # a cache call raised where nothing was due: where, with the trace
            detail = f"unexpected {type(err).__name__}: " + "".join(traceback.format_exception(err)).rstrip()
        driver.counts.wall_s = time.perf_counter() - start
        return driver.counts, Failure(spec, seed, driver.ops_done, ops, 0, detail)
    if progress is not None:
        progress(driver.ops_done - reported)
    driver.counts.wall_s = time.perf_counter() - start
    return driver.counts, None


_COLUMNS = (
    ("configuration", 40, "<"),
    ("ops", 9, ">"),
    ("admits", 7, ">"),
    ("aborts (plan/partial)", 21, ">"),
    ("retract", 7, ">"),
    ("refusals", 8, ">"),
    ("restores", 8, ">"),
    ("inv chk", 7, ">"),
    ("evicted tok/st", 15, ">"),
    ("wall s", 7, ">"),
)


def _row(cells: Sequence[str]) -> str:
    return "  ".join(
        f"{c:{align}{width}}" for c, (_, width, align) in zip(cells, _COLUMNS, strict=True)
    ).rstrip()


def _cells(name: str, c: Counts) -> list[str]:
    return [
        name,
        f"{c.ops:,}",
        f"{c.admits:,}",
        f"{c.aborts:,} ({c.aborts_with_plan:,}/{c.aborts_partial_page:,})",
        f"{c.retractions:,}",
        f"{c.refusals:,}",
        f"{c.restores:,}",
        f"{c.invariant_checks:,}",
        f"{c.tokens_evicted:,}/{c.states_evicted:,}",
        f"{c.wall_s:.1f}",
    ]


def peak_rss_mib() -> float:
    """This process's peak resident set size, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    names = "\n".join(f"  {spec.name}" for spec in stress_configs())
    parser = _Parser(
        prog="stress_lifecycle.py",
        description="Seeded lifecycle stress over tiny pools: the engine's protocol and its misuses, "
        "checked by stamps, snapshots and invariants. Exit 0 ok, 1 violation, 2 bad usage.",
        epilog="configuration names: preset/strategy (nb no_buffer, eb extra_buffer, lazy "
        "extra_buffer_lazy)/overlap (ov, no-ov)/page size/per-path cap (cap- none)/decode insert (dins) or "
        f"tracking only (track):\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--ops",
        type=int,
        help=f"lifecycle operations in all (default {DEFAULT_OPS:,}; "
        f"--quick: {QUICK_OPS:,}), split evenly over the configurations",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the run's seed; each configuration derives its own"
    )
    parser.add_argument(
        "--check-every",
        type=int,
        metavar="K",
        help="cache.check_invariants every K "
        f"operations (default {DEFAULT_CHECK_EVERY}; --quick: {QUICK_CHECK_EVERY})",
    )
    parser.add_argument(
        "--configs",
        metavar="PATTERNS",
        help="comma-separated names or fnmatch patterns (e.g. '*/p16/*,0.5.20/nb/*'); default: all",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: a few thousand operations")
    parser.add_argument("--list", action="store_true", help="print the configuration names and exit")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s (mamba_radix {mamba_radix.__version__})"
    )
    return parser


def select_configs(patterns: str | None) -> list[StressConfig]:
    """The configurations whose names match one of the comma-separated ``patterns`` (all if ``None``)."""
    configs = stress_configs()
    if patterns is None:
        return configs
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    return [s for s in configs if any(s.name == p or fnmatch.fnmatchcase(s.name, p) for p in wanted)]


def main(argv: Sequence[str] | None = None, out: object = None) -> int:
    """Run the stress; print the table (or the first violation) to ``out`` (stdout). Returns the exit
    code: 0 ok, 1 violation, 2 bad usage (argparse exits with 2 itself)."""
    stream = sys.stdout if out is None else out
    parser = build_parser()
    args = parser.parse_args(argv)

    def say(line: str = "") -> None:
        print(line, file=stream, flush=True)  # type: ignore[call-overload]

    if args.list:
        for spec in stress_configs():
            say(spec.name)
        return EXIT_OK
    ops = args.ops if args.ops is not None else (QUICK_OPS if args.quick else DEFAULT_OPS)
    check_every = args.check_every or (QUICK_CHECK_EVERY if args.quick else DEFAULT_CHECK_EVERY)
    if ops < 1 or (args.check_every is not None and args.check_every < 1):
        print(f"{parser.prog}: error: --ops and --check-every must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    configs = select_configs(args.configs)
    if not configs:
        print(
            f"{parser.prog}: error: --configs {args.configs!r} matches no configuration (see --list)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    per_config = max(1, ops // len(configs))
    torch.set_num_threads(1)  # a shared machine; the pools are tiny anyway

    command = shlex.join([SCRIPT, *(sys.argv[1:] if argv is None else argv)])
    say(f"# {command}")
    say(
        f"# mamba_radix {mamba_radix.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{per_config * len(configs):,} operations over {len(configs)} configurations ({per_config:,} each), "
        f"seed {args.seed}, invariants every {check_every} operations"
    )
    say()
    say(_row([name for name, _, _ in _COLUMNS]))
    say(_row(["-" * width for _, width, _ in _COLUMNS]))
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=per_config * len(configs), unit="op", unit_scale=True, smoothing=0.05)
    totals = Counts()
    started = time.perf_counter()
    try:
        for spec in configs:
            counts, failure = run_config(
                spec, args.seed, per_config, check_every, None if bar is None else bar.update
            )
            totals.add(counts)
            if failure is not None:
                failure.total_ops = totals.ops
                if bar is not None:
                    bar.close()
                report_failure(failure, check_every, say)
                return EXIT_VIOLATION
            say(_row(_cells(spec.name, counts)))
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - started
    say(_row(["-" * width for _, width, _ in _COLUMNS]))
    totals.wall_s = wall
    say(_row(_cells(f"total ({len(configs)} configurations)", totals)))
    say()
    say(
        f"{totals.ops:,} operations in {wall:.1f} s: {totals.ops / wall:,.0f} ops/s; peak RSS "
        f"{peak_rss_mib():.0f} MiB; violations: 0"
    )
    say(
        f"also: {totals.admit_refusals:,} admit refusals ({totals.too_long:,} too long), {totals.finishes:,} "
        f"finishes, {totals.live_checks:,} live-slot checks before a forward, {totals.tree_stamps:,} tree "
        "checkpoint stamps checked"
    )
    return EXIT_OK


def report_failure(failure: Failure, check_every: int, say: Callable[[str], None]) -> None:
    """The violation block: configuration, seeds, operation index, message and a replay command."""
    spec = failure.spec
    replay = shlex.join(
        [
            ".venv/bin/python",
            SCRIPT,
            "--configs",
            spec.name,
            "--seed",
            str(failure.seed),
            # the same operations up to the violation (or the whole budget, when the drain found it)
            "--ops",
            str(min(failure.op_index, failure.budget)),
            "--check-every",
            "1",
        ]
    )
    say()
    say(
        f"VIOLATION in configuration {spec.name} (seed {failure.seed}, its own seed "
        f"{config_seed(failure.seed, spec.name)}) at operation {failure.op_index:,} of the configuration "
        f"({failure.total_ops:,} operations into the run; invariants every {check_every})"
    )
    say(f"config: {spec.config}")
    say(failure.message)
    say(f"replay: {replay}")


if __name__ == "__main__":
    sys.exit(main())
