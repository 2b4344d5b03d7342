"""The Hypothesis state machine that drives a prefix cache through a :class:`CacheAdapter`.

Rules (each one a step; Hypothesis picks, shrinks and prints them):

- ``insert``: a sequence built from an earlier one (``Bundle`` ``sequences``) cut somewhere plus new
  tokens, so shared prefixes, mid-edge splits, branch points and repeats are the common case;
- ``match``: with or without copy-on-write, optionally locking the returned node (``Bundle`` ``locks``);
  ``unlock`` consumes a lock;
- ``evict``: tokens, states or both;
- requests (capability ``"requests"``): ``admit`` (match on ``input[:-1]``, copy-on-write, allocate, lock),
  ``prefill`` (one chunk, then ``cache_unfinished_req``), ``decode`` (tokens, checkpoints at the track
  interval), ``finish`` (with insert, or as an abort);
- faults (capability ``"faults"``): hold pool capacity away, release it, make the next allocations fail.

After every step (:meth:`CacheMachine.check_everything`): the cache's own ``check_invariants`` (told
whether the tree is idle); the oracle (resident content changes only as announced; locked prefixes stay);
the accounting counters; every checkpoint's stamp; every running request's locked prefix and live state;
conservation of KV indices, state slots and request rows; the per-path cap's bound and, for adapters that
report eviction totals, its policy (a step that evicted nothing dropped only non-fork, unlocked
checkpoints on the path of a new one, and no KV). Each rule additionally checks its own result against the
oracle's expectation computed before it ran (exact hit length, indices, full-KV length, branching point,
the state a hit or a copy-on-write hands out, eviction amounts). At teardown every request is finished,
every lock released, everything evicted, and every pool must be whole again.

A documented engine failure raised by the adapter (:class:`~mamba_radix.testing.known.KnownFailure`) is
counted in ``Machine.known_failures`` and discards its example (:mod:`mamba_radix.testing.known`).

Use :func:`make_machine` to bind an adapter factory and a :class:`SuiteParams` strategy; run the result with
``run_state_machine_as_test`` or expose ``Machine.TestCase`` to pytest.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from mamba_radix.testing.adapter import CacheAdapter, Key, SuiteParams, TreeSnapshot
from mamba_radix.testing.checks import (
    SuiteViolation,
    check_accounting,
    check_cap_policy,
    check_conservation,
    check_path_cap,
    check_pools_full,
    check_running,
    check_stamps,
)
from mamba_radix.testing.known import FailureLog, KnownFailure
from mamba_radix.testing.oracle import ROOT_KEY, ExpectedMatch, OracleViolation, PrefixOracle
from mamba_radix.testing.sequences import build_sequence, cuts, suffixes
from mamba_radix.testing.stamps import expected_stamp

__all__ = ["CacheMachine", "LockHandle", "make_machine"]

MAX_INPUT = 20  # tokens per inserted sequence / request input: deep enough for several chunks and pages
EXTRA_KEYS = (None, None, None, "ns")  # mostly the default namespace; sometimes a second one


def _step(rule_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the machine as inside a step until the after-step checks pass, so that teardown can tell a
    failed run (leave the broken cache alone: the original error is what matters) from a clean one.
    A known engine failure is counted and discards the example."""

    @functools.wraps(rule_fn)
    def wrapper(self: CacheMachine, *args: Any, **kwargs: Any) -> Any:
        self.in_step = True
        try:
            return rule_fn(self, *args, **kwargs)
        except KnownFailure as failure:
            type(self).known_failures.record(failure, self.steps)
            if not currently_in_test_context():
                raise  # a replayed example outside Hypothesis (a regression test): the failure is the result
            reject()

    return wrapper


@dataclass(frozen=True)
class LockHandle:
    """A lock the machine holds: the adapter's node handle and the prefix it ends at."""

    node: Any
    key: Key

    def __repr__(self) -> str:  # the node is opaque; the key is what a reader needs
        return f"LockHandle(key={self.key!r})"


class CacheMachine(RuleBasedStateMachine):
    """Base machine; :func:`make_machine` fills in ``adapter_factory`` and ``params_strategy``."""

    adapter_factory: ClassVar[Callable[[SuiteParams], CacheAdapter]]
    params_strategy: ClassVar[st.SearchStrategy[SuiteParams]]
    known_failures: ClassVar[FailureLog] = FailureLog()  # make_machine gives each class its own

    sequences = Bundle("sequences")
    locks = Bundle("locks")

    def __init__(self) -> None:
        super().__init__()
        self.adapter: CacheAdapter | None = None
        self.oracle: PrefixOracle | None = None
        self.raw_locks: list[LockHandle] = []
        self.next_rid = 1
        self.plans: dict[int, int] = {}  # rid -> output tokens still to decode
        self.snap = TreeSnapshot()
        self.locked: list[Key] = []  # lock keys at the last observation
        self.steps = 0
        self.in_step = False
        self.totals: tuple[int, int] | None = None  # eviction totals at the last observation

    # ------------------------------------------------------------------------------------------ set-up
    @initialize(target=sequences, data=st.data())
    def setup(self, data: st.DataObject) -> Any:
        """Draw a configuration, build the cache; the empty sequence seeds the ``sequences`` bundle."""
        self.start(data.draw(self.params_strategy, label="params"))
        return (None, ())

    def start(self, params: SuiteParams) -> None:
        """Build the cache for ``params`` and check the empty state (regression tests call this directly)."""
        type(self).known_failures.examples += 1
        self.adapter = type(self).adapter_factory(params)
        self.params = params
        self.page = params.page_size
        self.oracle = PrefixOracle(
            params.page_size, math.lcm(params.state_chunk, params.page_size), params.kv_only_leaves
        )
        self.check_everything()

    def _caps(self, name: str) -> bool:
        return self.adapter is not None and name in self.adapter.capabilities

    def _eviction_totals(self) -> tuple[int, int] | None:
        if not self._caps("eviction_totals"):
            return None
        return tuple(self.adapter.eviction_totals())  # type: ignore[union-attr, return-value]

    def _new_tokens(
        self, base: tuple[Any, tuple[int, ...]], cut: int, suffix: list[int], multiple_of: int
    ) -> tuple[int, ...]:
        return build_sequence(base[1], cut, suffix, max_len=MAX_INPUT, multiple_of=multiple_of)

    # -------------------------------------------------------------------------------------- tree rules
    @rule(target=sequences, base=sequences, cut=cuts(), suffix=suffixes(), extra=st.sampled_from(EXTRA_KEYS))
    @_step
    def insert(self, base: Key, cut: int, suffix: list[int], extra: Any) -> Any:
        """Insert a sequence with a stamped checkpoint at its end."""
        assert self.adapter is not None and self.oracle is not None
        extra = base[0] if extra is None or not self._caps("extra_key") else extra
        tokens = self._new_tokens(base, cut, suffix, self.page)
        if not tokens:
            return multiple()
        return self._run_insert(extra, tokens)

    def _run_insert(self, extra: Any, tokens: tuple[int, ...]) -> Any:
        assert self.adapter is not None and self.oracle is not None
        key = (extra, tokens)
        before = self.oracle.expect_match(extra, tokens)
        had_checkpoint = key in self.oracle.checkpoints
        out = self.adapter.insert(extra, tokens)
        if out is None:
            return multiple()  # no memory even after eviction: nothing may have been added
        self.oracle.allow_kv(extra, tokens, out.kv_indices, start=out.prefix_len)
        self.oracle.allow_checkpoints(extra, tokens, [len(tokens)])
        snap = self._observe()
        if key not in snap.checkpoints:
            raise SuiteViolation(f"insert {key}: no checkpoint at the inserted end afterwards")
        if out.mamba_exists and snap.checkpoints[key] == out.slot:
            raise SuiteViolation(
                f"insert {key}: reported mamba_exists but adopted the caller's slot {out.slot}"
            )
        if not out.mamba_exists and snap.checkpoints[key] != out.slot:
            raise SuiteViolation(
                f"insert {key}: reported a new checkpoint but holds slot {snap.checkpoints[key]}"
            )
        if not out.evicted:
            # nothing was evicted to make room, so the tree before the insert is the oracle's content
            if out.prefix_len != before.full_kv_hit_len:
                raise SuiteViolation(
                    f"insert {key}: prefix_len {out.prefix_len}, but {before.full_kv_hit_len} tokens were cached"
                )
            if out.mamba_exists != had_checkpoint:
                raise SuiteViolation(
                    f"insert {key}: mamba_exists={out.mamba_exists}, expected {had_checkpoint}"
                )
        elif out.prefix_len > before.full_kv_hit_len or (out.mamba_exists and not had_checkpoint):
            raise SuiteViolation(f"insert {key}: reports more cached ({out}) than was inserted before")
        return key

    @rule(
        target=locks,
        base=sequences,
        cut=cuts(),
        suffix=suffixes(),
        cow=st.booleans(),
        lock=st.booleans(),
    )
    @_step
    def match(self, base: Key, cut: int, suffix: list[int], cow: bool, lock: bool) -> Any:
        """Match a key (optionally with copy-on-write) and check the hit against the oracle."""
        assert self.adapter is not None and self.oracle is not None
        extra = base[0]
        # an engine that cannot match keys ending inside a page gets whole pages
        tokens = self._new_tokens(base, cut, suffix, 1 if self._caps("partial_page_keys") else self.page)
        cow = cow and self._caps("cow")
        want = self.oracle.expect_match(extra, tokens)
        got = self.adapter.match(extra, tokens, cow)
        if got is None:
            if not cow:
                raise SuiteViolation(f"match {(extra, tokens)}: refused, but only a copy-on-write may be")
            return multiple()  # the engine's admission control refused the copy-on-write: nothing changed
        where = f"match {(extra, tokens)}"
        if got.cow_skipped and cow and got.hit_len == 0:
            want = ExpectedMatch(0, (), want.full_kv_hit_len)  # no slot for the copy: the hit is dropped
        if got.hit_len != want.hit_len:
            raise OracleViolation(
                f"{where}: hit {got.hit_len} tokens, expected {want.hit_len} (deepest checkpoint)"
            )
        if got.kv_indices != want.kv_indices:
            raise OracleViolation(f"{where}: indices {got.kv_indices}, expected {want.kv_indices}")
        if got.full_kv_hit_len is not None and got.full_kv_hit_len != want.full_kv_hit_len:
            raise OracleViolation(
                f"{where}: full_kv_hit_len {got.full_kv_hit_len}, expected {want.full_kv_hit_len}"
            )
        if self._caps("branching"):
            self.oracle.check_branching(want.full_kv_hit_len, got.hit_len, got.branching_seqlen)
        stamp = expected_stamp(tokens[: got.hit_len])
        if got.hit_len and (got.slot is None or self.adapter.read_stamp(got.slot) != stamp):
            raise SuiteViolation(
                f"{where}: the hit's checkpoint slot {got.slot} does not hold the state {stamp}"
            )
        if cow and got.hit_len and got.cow_stamp != stamp:
            raise SuiteViolation(f"{where}: copy-on-write gave the state {got.cow_stamp}, expected {stamp}")
        if not lock or len(self.raw_locks) >= (getattr(self.adapter, "max_raw_locks", None) or 1 << 30):
            return multiple()
        key = (extra, tokens[: got.hit_len]) if got.hit_len else ROOT_KEY
        self.adapter.lock(got.node)
        handle = LockHandle(got.node, key)
        self.raw_locks.append(handle)
        return handle

    @rule(handle=consumes(locks))
    @_step
    def unlock(self, handle: LockHandle) -> None:
        assert self.adapter is not None
        self.adapter.unlock(handle.node)
        self.raw_locks.remove(handle)

    @rule(num_tokens=st.integers(0, 6), num_states=st.integers(0, 2))
    @_step
    def evict(self, num_tokens: int, num_states: int) -> None:
        """Evict and check that as much went as the unlocked content allowed, and as was reported."""
        assert self.adapter is not None
        before = self.snap
        out = self.adapter.evict(num_tokens, num_states)
        after = self._observe()
        gone_tokens = self.page * (len(before.kv) - len(after.kv))
        gone_states = len(before.checkpoints) - len(after.checkpoints)
        if gone_tokens < min(num_tokens, before.counters["full_evictable"]):
            raise SuiteViolation(
                f"evict({num_tokens}, {num_states}): freed {gone_tokens} tokens although "
                f"{before.counters['full_evictable']} were evictable"
            )
        if gone_states < min(num_states, before.counters["mamba_evictable"]):
            raise SuiteViolation(
                f"evict({num_tokens}, {num_states}): freed {gone_states} states although "
                f"{before.counters['mamba_evictable']} were evictable"
            )
        exact = self._caps("exact_evict_report")
        if (out.num_tokens, out.num_states) != (gone_tokens, gone_states) and (
            exact or out.num_tokens > gone_tokens or out.num_states > gone_states
        ):
            raise SuiteViolation(
                f"evict({num_tokens}, {num_states}) reported {out}, but {gone_tokens} tokens and "
                f"{gone_states} states left the tree" + ("" if exact else " (it reported more than it freed)")
            )

    # ----------------------------------------------------------------------------------- request rules
    def _rids(self, in_prefill: bool | None) -> list[int]:
        assert self.adapter is not None
        rids = sorted(self.plans)
        if in_prefill is None:
            return rids
        return [r for r in rids if self.adapter.in_prefill(r) == in_prefill]

    @precondition(lambda self: self._caps("requests"))
    @rule(
        target=sequences,
        base=sequences,
        cut=cuts(),
        suffix=suffixes(),
        out_len=st.integers(0, 12),
    )
    @_step
    def admit(self, base: Key, cut: int, suffix: list[int], out_len: int) -> Any:
        """Admit a request: admission match on ``input[:-1]``, copy-on-write, allocation, lock."""
        assert self.adapter is not None and self.oracle is not None
        extra = base[0]
        tokens = self._new_tokens(base, cut, suffix, 1)
        if not tokens:
            return multiple()
        want = self.oracle.expect_match(extra, tokens[:-1])
        rid = self.next_rid
        self.next_rid += 1
        # every output token's KV is written (the machine decodes over each one): out_len + 1 tokens
        out = self.adapter.admit(rid, extra, tokens, max_new_tokens=out_len + 1)
        if out is None:
            return multiple()
        self.plans[rid] = out_len
        if out.cow_skipped and out.hit_len == 0:
            want = ExpectedMatch(0, (), want.full_kv_hit_len)
        if out.hit_len != want.hit_len:
            raise OracleViolation(f"admit {(extra, tokens)}: hit {out.hit_len}, expected {want.hit_len}")
        stamp = expected_stamp(tokens[: out.hit_len])
        if out.live_stamp != stamp:
            raise SuiteViolation(
                f"admit {(extra, tokens)}: the live state starts as {out.live_stamp}, expected {stamp}"
            )
        return (extra, tokens)

    @precondition(lambda self: self._caps("requests") and bool(self._rids(True)))
    @rule(pick=st.integers(0, 7), chunks=st.integers(1, 3))
    @_step
    def prefill(self, pick: int, chunks: int) -> None:
        """Run up to ``chunks`` prefill chunks of a request still in prefill, each followed by
        ``cache_unfinished_req``."""
        assert self.adapter is not None
        rids = self._rids(True)
        rid = rids[pick % len(rids)]
        for _ in range(chunks):
            if not self.adapter.in_prefill(rid):
                break
            offers = self.adapter.prefill_chunk(rid)
            if offers is None:
                break  # out of KV: the request waits
            self._announce(offers)

    @precondition(lambda self: self._caps("requests") and any(self.plans[r] > 0 for r in self._rids(False)))
    @rule(pick=st.integers(0, 7), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    @_step
    def decode(self, pick: int, tokens: list[int]) -> None:
        """Decode a few tokens of a request past prefill (checkpoints at the track interval)."""
        assert self.adapter is not None
        rids = [r for r in self._rids(False) if self.plans[r] > 0]
        rid = rids[pick % len(rids)]
        for t in tokens[: self.plans[rid]]:
            offers = self.adapter.decode(rid, t)
            if offers is None:
                break  # out of KV: the request waits
            self.plans[rid] -= 1
            self._announce(offers)

    @precondition(lambda self: self._caps("requests") and bool(self.plans))
    @rule(pick=st.integers(0, 7), insert=st.booleans())
    @_step
    def finish(self, pick: int, insert: bool) -> None:
        """Finish a request (``cache_finished_req``), or abort it without inserting."""
        assert self.adapter is not None
        rids = self._rids(None)
        rid = rids[pick % len(rids)]
        self._announce(self.adapter.finish(rid, insert))
        del self.plans[rid]

    def _announce(self, offers: list[tuple[Any, tuple[int, ...], tuple[int, ...], int]] | None) -> None:
        """Tell the oracle what a request handed to the cache: its KV from ``start`` on and a checkpoint
        at any of its prefix lengths (the stamp check decides whether the checkpoint is right)."""
        assert self.oracle is not None
        for extra, tokens, indices, start in offers or []:
            self.oracle.allow_kv(extra, tokens, indices, start)
            self.oracle.allow_checkpoints(extra, tokens, range(1, len(tokens) + 1))

    # ------------------------------------------------------------------------------------------ faults
    @precondition(lambda self: self._caps("faults"))
    @rule(
        kind=st.sampled_from(["hold", "release", "fail_next"]),
        pool=st.sampled_from(["kv", "state"]),
        num=st.integers(1, 6),
    )
    @_step
    def inject_fault(self, kind: str, pool: str, num: int) -> None:
        """Take ``num`` entries of a pool away, give every held entry back, or fail the next ``num // 2 + 1``
        allocations of a pool."""
        assert self.adapter is not None
        if kind == "hold":
            self.adapter.hold(pool, num)
        elif kind == "release":
            self.adapter.release_holds()
        else:
            self.adapter.fail_next_allocs(pool, num // 2 + 1)

    # ------------------------------------------------------------------------ scripted use (scenarios)
    def put(self, tokens: tuple[int, ...], extra: Any = None) -> None:
        """Insert ``tokens`` (a raw insert through the ``insert`` rule's checks), then check everything."""
        self._run_insert(extra, tuple(tokens))
        self.check_everything()

    def lookup(self, tokens: tuple[int, ...], extra: Any = None) -> int:
        """Match ``tokens`` without copy-on-write (the ``match`` rule's checks); returns the hit length."""
        assert self.adapter is not None and self.oracle is not None
        want = self.oracle.expect_match(extra, tuple(tokens))
        got = self.adapter.match(extra, tuple(tokens), False)
        assert got is not None
        if (got.hit_len, got.kv_indices) != (want.hit_len, want.kv_indices):
            raise OracleViolation(f"lookup {(extra, tokens)}: hit {got.hit_len}, expected {want.hit_len}")
        if got.hit_len and self.adapter.read_stamp(got.slot) != expected_stamp(tuple(tokens)[: got.hit_len]):  # type: ignore[arg-type]
            raise SuiteViolation(f"lookup {(extra, tokens)}: the hit's slot holds another state")
        self.check_everything()
        return got.hit_len

    def run_request(
        self, tokens: tuple[int, ...], outputs: tuple[int, ...] = (), extra: Any = None, insert: bool = True
    ) -> int | None:
        """Admit one request, prefill it, decode ``outputs`` and finish it (``insert=False``: abort), with
        the rules' checks and every after-step check between steps. Returns the admission hit, or
        ``None`` if the request was not admitted. Raises :class:`SuiteViolation` if a lone running
        request runs out of KV. For scenarios (:mod:`mamba_radix.testing.scenarios`)."""
        assert self.adapter is not None and self.oracle is not None
        tokens = tuple(tokens)
        want = self.oracle.expect_match(extra, tokens[:-1])
        rid = self.next_rid
        self.next_rid += 1
        out = self.adapter.admit(rid, extra, tokens, max_new_tokens=len(outputs) + 1)
        if out is None:
            return None
        self.plans[rid] = len(outputs)
        if not (out.cow_skipped and out.hit_len == 0) and out.hit_len != want.hit_len:
            raise OracleViolation(f"admit {(extra, tokens)}: hit {out.hit_len}, expected {want.hit_len}")
        self.check_everything()
        while self.adapter.in_prefill(rid):
            offers = self.adapter.prefill_chunk(rid)
            if offers is None:
                raise SuiteViolation(f"request {rid}: a prefill chunk found no KV")
            self._announce(offers)
            self.check_everything()
        for t in outputs:
            offers = self.adapter.decode(rid, t)
            if offers is None:
                raise SuiteViolation(f"request {rid}: a decode step found no KV")
            self.plans[rid] -= 1
            self._announce(offers)
            self.check_everything()
        self._announce(self.adapter.finish(rid, insert))
        del self.plans[rid]
        self.check_everything()
        return out.hit_len

    def checkpoint_lengths(self, extra: Any = None) -> list[int]:
        """Sorted lengths of the checkpoints in namespace ``extra`` at the last observation."""
        return sorted(len(t) for e, t in self.snap.checkpoints if e == extra)

    # ------------------------------------------------------------------------------------------ checks
    def _observe(self) -> TreeSnapshot:
        """Snapshot, check running requests and the oracle, adopt the snapshot. Returns it."""
        assert self.adapter is not None and self.oracle is not None
        adapter = self.adapter
        snap = adapter.snapshot()
        req_keys = check_running(adapter.running(), snap, adapter.read_stamp, self.page)
        raw_keys = []
        for h in self.raw_locks:
            key = snap.node_keys.get(_node_id(h.node))
            if key != h.key:
                raise OracleViolation(f"locked node {h.key} is gone or moved (now {key})")
            raw_keys.append(key)
        locked = raw_keys + req_keys
        # Locks held across the whole step must have kept their data; a lock taken or moved during the step
        # may sit on data that step (re)inserted. The soft per-path cap ran while either set was held.
        held_throughout = list((Counter(self.locked) & Counter(locked)).elements())
        held_at_some_point = self.locked + locked
        self.locked = locked
        new_checkpoints = [k for k in snap.checkpoints if k not in self.oracle.checkpoints]
        self.oracle.observe(snap, held_throughout)
        cap = self.params.max_states_per_path
        check_path_cap(snap, new_checkpoints, cap, held_at_some_point, self.page)
        totals = self._eviction_totals()
        if totals is not None and totals == self.totals:
            # nothing was evicted since the last observation: whatever left the tree, the cap dropped;
            # only a lock held across the whole step surely covered the moment the cap ran
            check_cap_policy(self.snap, snap, new_checkpoints, cap, held_throughout, self.page)
        self.totals = totals
        self.snap = snap
        return snap

    @invariant()
    def check_everything(self) -> None:
        """All checks, after every step. Failures carry the cache's own dump."""
        if self.adapter is None:
            return
        adapter = self.adapter
        self.steps += 1
        self.in_step = True
        try:
            adapter.check_invariants(idle=not self.plans and not self.raw_locks)
            snap = self._observe()
            check_accounting(snap, self.locked, self.page)
            check_stamps(snap, adapter.read_stamp)
            for record in adapter.ownership():
                check_conservation(record)
        except AssertionError as exc:
            raise type(exc)(f"{exc}\n{adapter.dump()}") from exc
        self.in_step = False

    def teardown(self) -> None:
        """Release everything; then every pool must be whole again."""
        adapter = self.adapter
        if adapter is None or self.in_step:
            self.adapter = None  # a step failed: its error is the report, the cache may be inconsistent
            return
        try:
            self._release_everything(adapter)
        except KnownFailure as failure:
            type(self).known_failures.record(failure, self.steps)
        finally:
            self.adapter = None

    def _release_everything(self, adapter: CacheAdapter) -> None:
        """Finish every request, drop every lock, evict everything; then every pool must be whole."""
        adapter.release_holds()
        for rid in sorted(self.plans):
            self._announce(adapter.finish(rid, True))
            self.plans.pop(rid)
            self.check_everything()
        for handle in list(self.raw_locks):
            adapter.unlock(handle.node)
            self.raw_locks.remove(handle)
        adapter.evict(10**9, 10**9)
        self.check_everything()
        if self.snap.kv or self.snap.checkpoints:
            raise SuiteViolation(
                f"teardown: after evicting everything the tree still holds {len(self.snap.kv)} tokens "
                f"and {len(self.snap.checkpoints)} checkpoints\n{adapter.dump()}"
            )
        check_pools_full(adapter.ownership())


def _node_id(node: Any) -> int:
    """A node handle's key in ``TreeSnapshot.node_keys``: an int handle is its own id; otherwise the
    handle's ``id`` attribute, or ``id(handle)``."""
    if isinstance(node, int) and not isinstance(node, bool):
        return node
    return getattr(node, "id", id(node))


def make_machine(
    adapter_factory: Callable[[SuiteParams], CacheAdapter],
    params_strategy: st.SearchStrategy[SuiteParams],
    name: str = "CacheMachine",
) -> type[CacheMachine]:
    """A :class:`CacheMachine` subclass bound to an adapter factory and a params strategy, with its own
    :class:`~mamba_radix.testing.known.FailureLog` (``known_failures``)."""
    return type(
        name,
        (CacheMachine,),
        {
            "adapter_factory": staticmethod(adapter_factory),
            "params_strategy": params_strategy,
            "known_failures": FailureLog(),
        },
    )
