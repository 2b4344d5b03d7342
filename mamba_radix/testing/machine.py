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
- faults (capability ``"faults"``): hold pool capacity away, release it, make the next allocations fail;
- the paged lifecycle step by step (capability ``"lifecycle_steps"``, :class:`LifecycleMachine`): extend
  and commit apart, chunk ends on and off page boundaries, aborts with a forward pending, retraction and
  re-admission, and every misuse the engine must refuse with nothing changed.

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

Use :func:`make_machine` to bind an adapter factory and a :class:`SuiteParams` strategy (``base=LifecycleMachine``
for the lifecycle rules); run the result with ``run_state_machine_as_test`` or expose ``Machine.TestCase`` to
pytest.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from hypothesis import event, reject
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

from mamba_radix.testing.adapter import (
    CacheAdapter,
    Key,
    LifecycleAdapter,
    LifecycleView,
    PendingForward,
    Refused,
    SuiteParams,
    TreeSnapshot,
)
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
from mamba_radix.testing.sequences import ALPHABET, build_sequence, cuts, suffixes
from mamba_radix.testing.stamps import expected_stamp

__all__ = ["CacheMachine", "LifecycleMachine", "LockHandle", "make_machine"]

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
    coverage: ClassVar[Counter[str]] = Counter()  # events the rules reached, over all examples (make_machine)
    max_input: ClassVar[int] = MAX_INPUT  # the longest sequence a rule builds

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
        # of those, the keys of KV-only locks (skip_decode_lock hand-overs): their checkpoints may go
        self.kv_only: list[Key] = []
        # Locks requests held between two of their hand-overs inside one step (see _remember_lock): the
        # observations around the step never see them, yet the inserts made meanwhile ran under them.
        self.step_locks: list[Key] = []
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
        return build_sequence(base[1], cut, suffix, max_len=self.max_input, multiple_of=multiple_of)

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
        # every output token's KV is written (the machine decodes over each one): out_len + 1 tokens
        return self._admit(extra, tokens, out_len, out_len + 1)

    def _admit(self, extra: Any, tokens: tuple[int, ...], out_len: int, max_new_tokens: int | None) -> Any:
        """Admit a request of ``tokens`` that will decode ``out_len`` tokens, reserving KV for
        ``max_new_tokens`` outputs (``None``: the prompt only), and check the hit and the live state
        against the oracle. Returns its key for the ``sequences`` bundle, or ``multiple()`` if refused."""
        assert self.adapter is not None and self.oracle is not None
        want = self.oracle.expect_match(extra, tokens[:-1])
        rid = self.next_rid
        self.next_rid += 1
        out = self.adapter.admit(rid, extra, tokens, max_new_tokens=max_new_tokens)
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
            self._remember_lock(rid)

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
            if offers:  # a decode hand-over moved the lock
                self._remember_lock(rid)

    @precondition(lambda self: self._caps("requests") and bool(self._rids(None)))
    @rule(pick=st.integers(0, 7), insert=st.booleans())
    @_step
    def finish(self, pick: int, insert: bool) -> None:
        """Finish a request (``cache_finished_req``), or abort it without inserting."""
        assert self.adapter is not None
        rids = self._rids(None)
        rid = rids[pick % len(rids)]
        self._announce(self.adapter.finish(rid, insert))
        del self.plans[rid]

    def _remember_lock(self, rid: int) -> None:
        """Remember the lock request ``rid`` holds now, after a hand-over that may have moved it: a later
        hand-over in the same step moves it again, so neither observation around the step sees it, yet the
        soft per-path cap ran under it (a checkpoint it covered could not be dropped). O(running)."""
        assert self.adapter is not None
        for view in self.adapter.running():
            if view.rid == rid:
                protected = tuple(view.tokens[: view.protected_len])
                self.step_locks.append((view.extra_key, protected) if protected else ROOT_KEY)

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
        views = adapter.running()
        req_keys = check_running(views, snap, adapter.read_stamp, self.page)
        kv_only = [key for view, key in zip(views, req_keys, strict=True) if not view.lock_covers_checkpoint]
        raw_keys = []
        for h in self.raw_locks:
            key = snap.node_keys.get(_node_id(h.node))
            if key != h.key:
                raise OracleViolation(f"locked node {h.key} is gone or moved (now {key})")
            raw_keys.append(key)
        locked = raw_keys + req_keys
        # Locks held across the whole step must have kept their data; a lock taken or moved during the step
        # may sit on data that step (re)inserted. The soft per-path cap ran while any of them was held, the
        # ones held only between two hand-overs inside the step included.
        held_throughout = list((Counter(self.locked) & Counter(locked)).elements())
        # a checkpoint is held throughout only by a full lock before and after (KV-only locks leave it
        # evictable: a request's lock turns KV-only at its first hand-over under skip_decode_lock)
        full_throughout = (Counter(self.locked) - Counter(self.kv_only)) & (
            Counter(locked) - Counter(kv_only)
        )
        kv_only_throughout = list((Counter(held_throughout) - full_throughout).elements())
        held_at_some_point = self.locked + locked + self.step_locks
        self.locked = locked
        self.kv_only = kv_only
        self.step_locks = []
        new_checkpoints = [k for k in snap.checkpoints if k not in self.oracle.checkpoints]
        self.oracle.observe(snap, held_throughout, kv_only_throughout, kv_only)
        cap = self.params.max_states_per_path
        check_path_cap(snap, new_checkpoints, cap, held_at_some_point, self.page)
        totals = self._eviction_totals()
        if totals is not None and totals == self.totals:
            # nothing was evicted since the last observation: whatever left the tree, the cap dropped;
            # only a lock held across the whole step surely covered the moment the cap ran
            check_cap_policy(
                self.snap, snap, new_checkpoints, cap, list(full_throughout.elements()), self.page
            )
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
            check_accounting(snap, self.locked, self.page, self.kv_only)
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


# What the engine does with a forward it extended: commit it once the model ran, keep it pending across
# steps (committed or aborted by a later rule), or abort the request before the commit.
THEN = st.sampled_from(("commit", "hold", "abort"))


def _short(value: Any, width: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _changes(before: Any, after: Any, limit: int = 6) -> str:
    """What differs between two :meth:`LifecycleAdapter.lifecycle_state` results: up to ``limit`` paths
    with their old and new values (for a multi-line dump, its first differing line). O(state size)."""
    found: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(found) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=repr):
                walk(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}[{key!r}]")
            return
        if isinstance(a, str) and isinstance(b, str) and "\n" in a + b:
            pairs = zip([*a.splitlines(), "<end>"], [*b.splitlines(), "<end>"], strict=False)
            a, b = next(((x, y) for x, y in pairs if x != y), (a, b))
        found.append(f"{path}: {_short(a)} -> {_short(b)}")

    walk(before, after, "state")
    return "; ".join(found)


class LifecycleMachine(CacheMachine):
    """:class:`CacheMachine` plus the engine's paged request lifecycle, step by step (capability
    ``"lifecycle_steps"``, :class:`~mamba_radix.testing.adapter.LifecycleAdapter`). For an adapter without
    the capability it runs :class:`CacheMachine`'s rules and none of its own.

    With the capability the base machine's request rules, ``evict``, ``inject_fault``, ``match`` and
    ``unlock`` are off (subsumed below, or the base machine's business), and these run:

    - ``admit_request``: the read-only ``can_admit`` first (it must change nothing); its no must be a
      refusal of ``admit`` with nothing changed. ``reserve=False`` reserves the prompt's KV only, so the
      request's decode can run short (then retraction);
    - ``batch_step``: one scheduler iteration: extend every running request (prefill chunks cut from a
      shared budget by ``prefill_chunk_len``, one sampled token per decoding request; a request done
      decoding finishes), then commit, hold or abort each forward; a decoding request short of KV is
      retracted;
    - ``prefill_step``: prefill chunks of one request: SGLang's cut of each drawn budget (checked against
      the rule: the rest of the prompt if it fits, else up to the last page boundary; the uncut budget,
      where it differs, must be refused), or raw lengths, refused unless they end on a page boundary or at
      the prompt's end;
    - ``decode_step``: decode forwards of one request, one to three tokens each; refused when a token is
      not sampled yet or the span crosses the next decode boundary;
    - after an accepted extend the forward is committed, aborted with it pending (``finish(insert=False)``:
      its KV freed with the request's, each page once), or held pending for later steps and misused at
      once (extend again, ``finish(insert=True)``); ``commit_step`` commits a held forward,
      ``end_request`` aborts its request (or finishes or aborts one with none pending); after an abort the
      forward's plan is committed anyway (the model's result arriving late), which must be refused;
    - a KV shortage (``extend`` returned ``None``): the request waits, or is retracted (aborted and
      queued); ``readmit`` admits it again as a fresh request of its tokens so far;
    - ``probe``: one request misused in every way applicable now: a zero-token extend, a prefill chunk
      ending inside a page or past the prompt, a decode over a token not sampled, a decode span across the
      boundary, a stale commit; for a finished request, commit, finish and extend it again;
    - ``pressure``: eviction or a fault (hold capacity away, release it, fail the next allocation).

    Every call the contract refuses must come back :class:`~mamba_radix.testing.adapter.Refused` with the
    adapter's ``lifecycle_state()`` (tree dump, pools, counters, reservations, stats, every request's
    fields and row) unchanged; a call it allows must not be refused; after ``extend`` returned ``None`` the
    requests must be as before (eviction may have run). The base after-step checks then run with forwards
    pending: their KV is their requests'. Each event is counted in the class's ``coverage`` (and as a
    Hypothesis ``event``), so a test can assert that the rules reached every kind of step.
    """

    max_input: ClassVar[int] = 32  # two pages of 16 and a partial third: chunks on and off page boundaries

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, PendingForward] = {}  # rid -> its forward extended, not committed
        self.retracted: list[tuple[Any, tuple[int, ...], int]] = []  # (extra_key, tokens, outputs left)
        self.finished_rids: list[int] = []

    # ------------------------------------------------------------------------------------------ helpers
    @property
    def lc(self) -> LifecycleAdapter:
        assert self.adapter is not None
        return cast(LifecycleAdapter, self.adapter)

    def _lifecycle(self) -> bool:
        return self._caps("lifecycle_steps")

    def _rids(self, in_prefill: bool | None) -> list[int]:
        # a request with a forward pending is the lifecycle rules' own until it is committed or aborted
        return [r for r in super()._rids(in_prefill) if r not in self.pending]

    def _note(self, what: str) -> None:
        """Count an event in the class's ``coverage`` (and in Hypothesis' statistics)."""
        type(self).coverage[what] += 1
        if currently_in_test_context():
            event(what)

    def _observe(self) -> TreeSnapshot:
        before = self.totals
        snap = super()._observe()
        if (
            self._lifecycle()
            and before is not None
            and self.totals is not None
            and self.totals[0] > before[0]
        ):
            self._note(f"KV evicted (page={self.page})")
        if self._lifecycle() and any(key not in snap.checkpoints for key in self.kv_only):
            # skip_decode_lock: a running request's hand-over checkpoint went while its KV stayed locked
            self._note("checkpoint evicted under a KV-only lock")
        return snap

    def _call(
        self,
        why: str | None,
        where: str,
        call: Callable[[], Any],
        *,
        read_only: bool = False,
        absent_ok: bool = False,
    ) -> Any:
        """Run one lifecycle call that the contract refuses (``why``: the reason) or allows (``None``).

        A refusal must be predicted and must leave ``lifecycle_state()`` exactly as it was, as must any
        result of a ``read_only`` call, or a ``None`` that means "nothing to call" (``absent_ok``); an
        allowed call must not be refused; otherwise ``None`` (KV short) must leave every request as it was
        (eviction may have changed the tree). Raises :class:`SuiteViolation` otherwise. Returns the call's
        result. O(lifecycle state) on top of the call.
        """
        before = self.lc.lifecycle_state()
        out = call()
        if read_only or (absent_ok and out is None):
            after = self.lc.lifecycle_state()
            if after != before:
                raise SuiteViolation(f"{where}: a read-only call changed {_changes(before, after)}")
            if out is None:
                return None
        if isinstance(out, Refused):
            if why is None:
                raise SuiteViolation(f"{where}: the {out.call} was refused, but it is valid: {out.reason}")
            after = self.lc.lifecycle_state()
            if after != before:
                raise SuiteViolation(
                    f"{where}: the {out.call} was refused ({why}) but changed {_changes(before, after)}"
                )
            self._note(f"refused: {why}")
            return out
        if why is not None:
            raise SuiteViolation(f"{where}: accepted, but the contract refuses it: {why}")
        if out is None:
            after = self.lc.lifecycle_state()
            if after["requests"] != before["requests"]:
                raise SuiteViolation(
                    f"{where}: KV short, but the requests changed: "
                    f"{_changes(before['requests'], after['requests'])}"
                )
        return out

    def _refusal(self, view: LifecycleView, num_tokens: int, known: int) -> str | None:
        """Why the contract refuses extending ``view``'s request by ``num_tokens`` when ``known`` tokens
        are known, or ``None``. O(1)."""
        start, end = view.kv_len, view.kv_len + num_tokens
        if view.pending is not None:
            return "extend while a forward is pending"
        if num_tokens < 1:
            return "extend by zero tokens"
        if start < view.prompt_len:
            if end > view.prompt_len:
                return "prefill chunk past the prompt's end"
            if end != view.prompt_len and end % self.page:
                return "prefill chunk ending inside a page"
            return None
        if end > known:
            return "decode over a token not sampled yet"
        if view.decode_boundary is not None and end > view.decode_boundary:
            return "decode span across the decode boundary"
        return None

    def _start(self, view: LifecycleView, num_tokens: int, sampled: tuple[int, ...] = ()) -> Any:
        """``start_forward`` through :meth:`_call`, its refusal predicted by :meth:`_refusal`."""
        why = self._refusal(view, num_tokens, view.seq_len + len(sampled))
        where = (
            f"extend req {view.rid} by {num_tokens} at kv_len {view.kv_len} (prompt {view.prompt_len}, "
            f"page {self.page}, decode boundary {view.decode_boundary}, sampled {list(sampled)})"
        )
        return self._call(why, where, lambda: self.lc.start_forward(view.rid, num_tokens, sampled))

    def _started(self, rid: int, out: Any, retract: bool) -> bool:
        """After an extend: record its pending forward (``True``); after a refusal nothing; after a KV
        shortage the request waits, or is retracted (``retract``: aborted and queued again)."""
        if isinstance(out, Refused):
            return False
        if out is None:
            self._note("KV short")
            if retract:
                self._abort(rid, requeue=True)
                self._note("retracted when KV was short")
            return False
        self.pending[rid] = out
        self._note(f"forward: {'prefill' if out.is_prefill else 'decode'} (page={self.page})")
        return True

    def _resolve(self, rid: int, then: str, retract: bool) -> None:
        """What the engine does with ``rid``'s pending forward: commit it (``then="commit"``), abort the
        request with it pending (``"abort"``; ``retract``: queue it again), or keep it pending for a later
        step (``"hold"``), misusing it at once (:meth:`_misuse_pending`)."""
        if then == "commit":
            self._commit_pending(rid)
        elif then == "abort":
            self._abort_pending(rid, retract)
        else:
            self._misuse_pending(self.lc.lifecycle_view(rid))

    def _commit_pending(self, rid: int) -> None:
        forward = self.pending.pop(rid)
        self._announce(self.lc.commit_forward(rid))
        self._remember_lock(rid)
        if not forward.is_prefill:
            self.plans[rid] -= forward.end - forward.start

    def _finish(self, rid: int) -> None:
        """``finish(insert=True)`` of a request with no forward pending."""
        assert self.adapter is not None
        self._announce(self.adapter.finish(rid, True))
        del self.plans[rid]
        self.finished_rids.append(rid)

    def _abort(self, rid: int, requeue: bool) -> None:
        """``finish(insert=False)``, with or without a forward pending; ``requeue``: queue the request's
        tokens so far (and the outputs it has left) for :meth:`readmit`, as an engine's retraction does."""
        assert self.adapter is not None
        view = next(v for v in self.adapter.running() if v.rid == rid)
        forward = self.pending.pop(rid, None)
        left = self.plans.pop(rid)
        if forward is not None and not forward.is_prefill:
            left = max(left - (forward.end - forward.start), 0)  # its sampled tokens are in view.tokens
        self._announce(self.adapter.finish(rid, False))
        self.finished_rids.append(rid)
        if requeue:
            self.retracted.append((view.extra_key, view.tokens, left))

    def _release_everything(self, adapter: CacheAdapter) -> None:
        for rid in sorted(self.pending):  # pending forwards run to the end, then the base teardown
            self._commit_pending(rid)
            self.check_everything()
        super()._release_everything(adapter)

    @staticmethod
    def _cut(view: LifecycleView, budget: int, page: int) -> int:
        """SGLang's chunk cut, the contract of ``prefill_chunk_len``: the rest of the prompt if it fits in
        ``budget``, else the tokens up to the last page boundary within it (``0``: none). O(1)."""
        if view.kv_len + budget >= view.prompt_len:
            return view.prompt_len - view.kv_len
        return max((view.kv_len + budget) // page * page - view.kv_len, 0)

    # With the capability, the base machine's admit / prefill / decode rules are subsumed by
    # admit_request / prefill_step / decode_step (a reserved admission, a chunk of the configured size, one
    # decode token are among their draws), evict and inject_fault by pressure, finish by end_request; match
    # and unlock stay the base machine's business (every admission matches, checked against the oracle; a
    # lock held outside a request would switch the cache's exact conservation check off). They are off
    # then, so the engine's rules get those steps; without the capability they are the rules, as in
    # CacheMachine (precondition() on a rule adds to its preconditions).
    _without_steps = precondition(lambda self: not self._lifecycle())
    match = _without_steps(CacheMachine.match)
    unlock = _without_steps(CacheMachine.unlock)
    admit = _without_steps(CacheMachine.admit)
    prefill = _without_steps(CacheMachine.prefill)
    decode = _without_steps(CacheMachine.decode)
    finish = _without_steps(CacheMachine.finish)
    evict = _without_steps(CacheMachine.evict)
    inject_fault = _without_steps(CacheMachine.inject_fault)
    del _without_steps

    @precondition(lambda self: self._lifecycle())
    @rule(
        kind=st.sampled_from(["evict", "hold", "release", "fail_next"]),
        pool=st.sampled_from(["kv", "kv", "state"]),  # KV shortage is what retraction answers
        num=st.integers(0, 6),
    )
    @_step
    def pressure(self, kind: str, pool: str, num: int) -> None:
        """Memory pressure from outside the requests, one rule for the base machine's two (so the engine's
        rules get more of each example): evict ``num`` tokens and ``num // 3`` states (the ``evict`` rule's
        checks), or a fault (the ``inject_fault`` rule's; needs capability ``"faults"``): hold one to four
        entries of a pool away (more would starve every request of a tiny pool until the next release),
        give every held entry back, or fail the next allocation."""
        if kind == "evict" or not self._caps("faults"):
            CacheMachine.evict(self, num, num // 3)
        else:
            CacheMachine.inject_fault(self, kind, pool, 1 + num % 4)

    # ---------------------------------------------------------------------------------------- rules
    @precondition(lambda self: self._lifecycle())
    @rule(
        target=CacheMachine.sequences,
        base=CacheMachine.sequences,
        cut=cuts(),
        # never empty, and longer than the base machine's: two pages of 16 and chunks to cut
        suffix=st.lists(st.integers(0, ALPHABET - 1), min_size=1, max_size=20),
        out_len=st.integers(0, 12),
        reserve=st.booleans(),
    )
    @_step
    def admit_request(self, base: Key, cut: int, suffix: list[int], out_len: int, reserve: bool) -> Any:
        """Admit after the read-only admission check; ``reserve=False`` reserves the prompt's KV only."""
        tokens = self._new_tokens(base, cut, suffix, 1)
        if not tokens:
            return multiple()
        return self._admit_checked(base[0], tokens, out_len, reserve)

    def _admit_checked(self, extra: Any, tokens: tuple[int, ...], out_len: int, reserve: bool) -> Any:
        assert self.adapter is not None
        max_new = out_len + 1 if reserve else None
        where = f"admission of {(extra, tokens)} (max_new_tokens={max_new})"
        ok, reason = self._call(
            None, f"can_admit: {where}", lambda: self.lc.can_admit(extra, tokens, max_new), read_only=True
        )
        if ok:
            return self._admit(extra, tokens, out_len, max_new)
        rid = self.next_rid
        self.next_rid += 1

        def refused_admit() -> Refused | None:
            out = self.adapter.admit(rid, extra, tokens, max_new_tokens=max_new)  # type: ignore[union-attr]
            # admitted: None, which _call reports (the contract refuses what can_admit refused)
            return Refused("admit", f"can_admit: {reason}") if out is None else None

        self._call(f"admission ({reason})", where, refused_admit)
        return multiple()

    @precondition(lambda self: self._lifecycle() and bool(self._rids(True)))
    @rule(
        pick=st.integers(0, 7),
        budgets=st.lists(st.integers(0, 40), min_size=1, max_size=3),
        raw=st.sampled_from((False, False, True)),
        then=THEN,
        retract=st.booleans(),
    )
    @_step
    def prefill_step(self, pick: int, budgets: list[int], raw: bool, then: str, retract: bool) -> None:
        """Up to one prefill chunk per budget, each committed but the last, which is committed, left
        pending or aborted at once (``then``, see :meth:`_resolve`):
        SGLang's cut of the budget (the uncut budget, where it differs, is refused first), or with ``raw``
        the length ``budget % (tokens left + 2)``, refused unless it ends on a page boundary or at the
        prompt's end. Stops at a refusal, a shortage or the prompt's end."""
        rids = self._rids(True)
        rid = rids[pick % len(rids)]
        for i, budget in enumerate(budgets):
            view = self.lc.lifecycle_view(rid)
            if view.kv_len >= view.prompt_len:
                break
            num = budget % (view.prompt_len - view.kv_len + 2) if raw else self._cut_chunk(view, budget)
            if num == 0 and not raw:
                self._note("cut: no page boundary within the budget")
                continue  # the engine schedules the chunk later
            out = self._start(view, num)
            if self._started(rid, out, retract):
                self._resolve(rid, then if i == len(budgets) - 1 else "commit", retract)
            if rid in self.pending or not isinstance(out, PendingForward):
                break

    def _cut_chunk(self, view: LifecycleView, budget: int, probe: bool = True) -> int:
        """``prefill_chunk_len`` of ``budget``, checked against SGLang's cut (:meth:`_cut`). With ``probe``,
        the uncut budget, where it differs, ends inside a page or past the prompt (or is zero) and must be
        refused."""
        num = self.lc.prefill_chunk_len(view.rid, budget)
        want = self._cut(view, budget, self.page)
        if num != want:
            raise SuiteViolation(
                f"prefill_chunk_len(req {view.rid}, {budget}) at kv_len {view.kv_len} of a "
                f"{view.prompt_len}-token prompt (page {self.page}) is {num}, expected {want}"
            )
        if probe and num != budget:
            self._start(view, budget)
        return num

    @precondition(lambda self: self._lifecycle() and bool(self._rids(None)))
    @rule(
        budget=st.integers(0, 40),
        thens=st.lists(THEN, max_size=3),
        tokens=st.lists(st.integers(0, 2), min_size=3, max_size=3),
        retract=st.booleans(),
    )
    @_step
    def batch_step(self, budget: int, thens: list[str], tokens: list[int], retract: bool) -> None:
        """One scheduler iteration, as an engine runs it: extend every running request with no forward
        pending (a prefill chunk cut from what is left of ``budget``, or one sampled decode token; a
        request that decoded all its outputs finishes instead), and only then, request by request,
        commit, hold or abort each forward (``thens``, then commit). A KV shortage retracts a decoding
        request (SGLang's retract_decode) and leaves a prefilling one waiting, or retracts it too
        (``retract``)."""
        started: list[int] = []
        for i, rid in enumerate(self._rids(None)):
            view = self.lc.lifecycle_view(rid)
            sampled: tuple[int, ...] = ()
            if view.kv_len < view.prompt_len:
                num = self._cut_chunk(view, budget, probe=False)
                if num == 0:
                    continue  # no page boundary within the budget left: the chunk waits
                budget -= num
            elif self.plans[rid] > 0:
                num, sampled = 1, (tokens[i % len(tokens)],)
            else:
                self._finish(rid)  # all its outputs decoded
                continue
            if self._started(rid, self._start(view, num, sampled), retract or bool(sampled)):
                started.append(rid)
        for j, rid in enumerate(started):
            self._resolve(rid, thens[j] if j < len(thens) else "commit", retract)

    @precondition(lambda self: self._lifecycle() and any(self.plans[r] > 0 for r in self._rids(False)))
    @rule(
        pick=st.integers(0, 7),
        spans=st.lists(
            st.tuples(
                st.sampled_from((1, 1, 2, 3)),
                st.lists(st.integers(0, 2), min_size=3, max_size=3),
                st.sampled_from((0, 0, 0, 1)),
            ),
            min_size=1,
            max_size=4,
        ),
        then=THEN,
        retract=st.booleans(),
    )
    @_step
    def decode_step(
        self, pick: int, spans: list[tuple[int, list[int], int]], then: str, retract: bool
    ) -> None:
        """Decode forwards, one per ``(num, tokens, missing)``: sample ``num - missing`` of ``tokens`` and
        extend over ``num`` tokens, refused if one is missing or if the span crosses the next decode
        boundary (the engine then goes on with the next span); each forward is committed but the last,
        which is committed, left pending or aborted (``then``). Stops at a shortage or at the end of the
        request's outputs."""
        rids = [r for r in self._rids(False) if self.plans[r] > 0]
        rid = rids[pick % len(rids)]
        for i, (num, tokens, missing) in enumerate(spans):
            if self.plans[rid] == 0:
                break
            num = min(num, self.plans[rid])
            out = self._start(self.lc.lifecycle_view(rid), num, tuple(tokens[: num - missing]))
            if self._started(rid, out, retract):
                self._resolve(rid, then if i == len(spans) - 1 else "commit", retract)
            if rid in self.pending or out is None:
                break

    @precondition(lambda self: self._lifecycle() and bool(self.pending))
    @rule(pick=st.integers(0, 7))
    @_step
    def commit_step(self, pick: int) -> None:
        """The model ran a pending forward: commit it."""
        rids = sorted(self.pending)
        self._commit_pending(rids[pick % len(rids)])

    @precondition(lambda self: self._lifecycle() and bool(self.plans))
    @rule(pick=st.integers(0, 7), insert=st.booleans(), requeue=st.booleans())
    @_step
    def end_request(self, pick: int, insert: bool, requeue: bool) -> None:
        """End a running request early (the base machine's ``finish`` rule, which this one replaces here):
        with a forward pending, abort it between its extend and its commit (``finish(insert=False)``: the
        forward's KV is freed with the request's, each page once); otherwise finish it (``insert``) or
        abort it. ``requeue`` (aborts only): it may be admitted again later."""
        rids = sorted(self.plans)
        rid = rids[pick % len(rids)]
        if rid in self.pending:
            self._abort_pending(rid, requeue)
        elif insert:
            self._finish(rid)
        else:
            self._abort(rid, requeue)

    def _abort_pending(self, rid: int, requeue: bool) -> None:
        """Abort ``rid`` with its forward pending, counting which kind of forward it was."""
        forward = self.pending[rid]
        kind = "prefill" if forward.is_prefill else "decode"
        self._note(f"abort: pending {kind} forward (page={self.page})")
        if forward.start % self.page:
            self._note(f"abort: pending {kind} forward continuing a partial page (page={self.page})")
        if forward.end % self.page:
            self._note(f"abort: pending {kind} forward ending inside a page (page={self.page})")
        if forward.start < self.page:
            self._note(f"abort: pending forward in the first page (page={self.page})")
        self._abort(rid, requeue)
        # the model's result arrives after the abort: the engine must not be able to commit it
        self._probe_recommit(rid, "commit of a forward aborted in flight")

    @precondition(lambda self: self._lifecycle() and bool(self.retracted))
    @rule(target=CacheMachine.sequences, pick=st.integers(0, 7), reserve=st.booleans())
    @_step
    def readmit(self, pick: int, reserve: bool) -> Any:
        """Admit a retracted request again, as a fresh request of its tokens so far (queued again if it does
        not fit now)."""
        extra, tokens, left = self.retracted.pop(pick % len(self.retracted))
        key = self._admit_checked(extra, tokens, left, reserve)
        if isinstance(key, tuple):
            self._note("re-admitted after an abort")
        else:
            self.retracted.append((extra, tokens, left))
        return key

    @precondition(lambda self: self._lifecycle() and bool(self.plans or self.finished_rids))
    @rule(pick=st.integers(0, 7), insert=st.booleans())
    @_step
    def probe(self, pick: int, insert: bool) -> None:
        """Misuse one request (``pick``: a running one, or one of the four that finished last) in every way
        applicable now; the contract refuses each, and a refusal must change nothing."""
        rids = sorted(self.plans) + self.finished_rids[-4:]
        rid = rids[pick % len(rids)]
        if rid not in self.plans:
            self._misuse_finished(rid, insert)
            return
        view = self.lc.lifecycle_view(rid)
        if view.pending is not None:
            self._misuse_pending(view)
            return
        self._start(view, 0, () if view.kv_len < view.prompt_len else (0,))
        if view.kv_len < view.prompt_len:
            left = view.prompt_len - view.kv_len
            inside = [n for n in range(1, left) if (view.kv_len + n) % self.page]
            if inside:  # a chunk ending inside a page, short of the prompt's end
                self._start(view, inside[pick % len(inside)])
            self._start(view, left + 1 + pick % self.page)
        else:
            self._start(view, 1)  # no token sampled to decode over
            if view.decode_boundary is not None:
                across = view.decode_boundary - view.kv_len + 1
                self._start(view, across, (0,) * across)
        self._probe_recommit(rid, "commit of a plan committed already")

    def _misuse_pending(self, view: LifecycleView) -> None:
        """With a forward pending: extend again, and finish with an insert; both refused."""
        assert view.pending is not None
        self._start(view, 1, () if view.kv_len < view.prompt_len else (0,))
        self._call(
            "finish(insert=True) with a forward pending",
            f"finish req {view.rid} with insert while [{view.pending.start}, {view.pending.end}) is pending",
            functools.partial(self.lc.finish_step, view.rid, True),
        )

    def _misuse_finished(self, rid: int, insert: bool) -> None:
        """A finished request: commit its newest plan, finish it again, extend it; all refused."""
        self._probe_recommit(rid, "commit after its request finished")
        self._call(
            "finish of a finished request",
            f"finish req {rid} again (insert={insert})",
            functools.partial(self.lc.finish_step, rid, insert),
        )
        self._call(
            "extend of a finished request",
            f"extend req {rid} after it finished",
            functools.partial(self.lc.start_forward, rid, 1, (0,)),
        )

    def _probe_recommit(self, rid: int, why: str) -> None:
        """Commit the newest plan ``rid`` extended (none of its forwards pending: a stale plan); nothing to
        probe if it extended none."""
        self._call(
            why, f"commit req {rid}'s newest plan again", lambda: self.lc.recommit(rid), absent_ok=True
        )


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
    base: type[CacheMachine] = CacheMachine,
) -> type[CacheMachine]:
    """A subclass of ``base`` (:class:`CacheMachine`, or :class:`LifecycleMachine` for its paged-lifecycle
    rules) bound to an adapter factory and a params strategy, with its own
    :class:`~mamba_radix.testing.known.FailureLog` (``known_failures``) and ``coverage`` counter."""
    return type(
        name,
        (base,),
        {
            "adapter_factory": staticmethod(adapter_factory),
            "params_strategy": params_strategy,
            "known_failures": FailureLog(),
            "coverage": Counter(),
        },
    )
