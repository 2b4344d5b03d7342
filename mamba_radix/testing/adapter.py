"""The adapter protocol: the small surface through which the invariant suite drives any prefix cache.

The state machine (:mod:`mamba_radix.testing.machine`) never touches a cache directly. It talks to a
:class:`CacheAdapter`, which turns the suite's engine-neutral operations (insert a token sequence, match,
lock, evict, run a request) into the cache's own calls, and which exposes what the checks need to see:
a :class:`TreeSnapshot` (the resident prefixes, read by walking the tree, not by asking ``match``), an
:class:`Ownership` record (who holds which KV index and state slot, next to what the pools say is
allocated) and the stamp a state slot holds (:mod:`mamba_radix.state_stamp`).

Writing an adapter for another engine's cache
----------------------------------------------
README.md, section "Test your own cache", has a complete adapter for a toy cache in under 150 lines.

1. Build the cache and its pools from :class:`SuiteParams` in a factory ``f(params) -> adapter``, and give
   the machine a strategy of configurations your engine accepts (:func:`mamba_radix.testing.suite_params`
   draws consistent ones; filter or map it through your engine's configurator). Declare in
   :attr:`CacheAdapter.capabilities` what the cache can do and what it reports (:data:`CAPABILITIES`); the
   machine skips the rules and checks that need a missing one.
2. ``insert``: allocate KV for the tokens and one state slot, write the stamp of the tokens into the slot
   (:func:`mamba_radix.testing.stamps.expected_stamp`: a stand-in for the model's forward; a
   :class:`~mamba_radix.testing.stamps.StampStore` when the pools hold no state memory), call the cache's
   insert, return an :class:`InsertOutcome`; ``None`` if memory could not be had even after eviction.
3. ``match``: call the cache's lookup; with ``cow`` also let the cache copy the checkpoint into a fresh slot,
   read that slot's stamp into ``cow_stamp`` and give the slot back. A :class:`MatchOutcome` carries an
   opaque ``node`` handle that ``lock``/``unlock`` accept. Return ``None`` to refuse a copy-on-write match
   the engine's scheduler would not make now (no slot could be had): nothing may change then.
4. ``snapshot``: walk the tree from the root and report every resident page-aligned prefix with the KV
   indices of its last page, every checkpoint with its slot, and the prefix every node ends at, keyed by
   the node's ``id`` attribute (or ``id(node)`` if it has none; an int handle is its own id), so locks
   can be named. Plus the cache's
   own evictable/protected counters.
5. ``ownership``: for KV, state slots and request rows, the indices held by the tree, by each running
   request and by the fault injector, plus what the pool reports as allocated (``None`` if it cannot
   list them: the checks then compare counts) and free. The checks compare them; the adapter only reports.
6. Requests (capability ``"requests"``): ``admit``/``prefill_chunk``/``decode``/``finish`` drive the
   engine's request protocol, with the engine's own admission control, and stamp states as a model would.
7. Known engine bugs: recognise them and raise :class:`~mamba_radix.testing.known.KnownFailure`; the
   machine counts them and discards the example.
8. Run :func:`mamba_radix.testing.machine.make_machine` with your factory and params strategy, and expose
   the resulting ``TestCase`` to pytest.
9. Lifecycle steps (capability ``"lifecycle_steps"``, :class:`LifecycleAdapter`): an engine whose request
   protocol splits a forward into "extend" (allocate, plan) and "commit" (the model ran) lets
   :class:`mamba_radix.testing.machine.LifecycleMachine` drive the two halves separately: chunk lengths
   on and off page boundaries, aborts between them, retraction when KV is short, and every misuse the
   engine must refuse. A refused call returns :class:`Refused` and must change nothing:
   ``lifecycle_state()`` is compared before and after it.

Keys are ``(extra_key, tokens)`` pairs with ``tokens`` a tuple, so a snapshot is plain data and a failing
run prints values that are valid Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CAPABILITIES",
    "AdmitOutcome",
    "CacheAdapter",
    "EvictOutcome",
    "InsertOutcome",
    "Key",
    "LifecycleAdapter",
    "LifecycleView",
    "MatchOutcome",
    "Offer",
    "Ownership",
    "PendingForward",
    "Refused",
    "RunningView",
    "SuiteParams",
    "TreeSnapshot",
    "snapshot_tree",
]

Key = tuple[Any, tuple[int, ...]]
"""``(extra_key, tokens)``: a prefix in one namespace. ``(None, ())`` is the root."""

Offer = tuple[Any, tuple[int, ...], tuple[int, ...], int]
"""``(extra_key, tokens, kv_indices, start)``: what a request handed to the cache in one call: its tokens,
its row of KV indices (as it was *before* the cache call) and the first position that was its own."""


CAPABILITIES: dict[str, str] = {
    "requests": "admit / prefill_chunk / decode / finish / running / in_prefill are implemented",
    "cow": "match(cow=True) copies the hit's state into a fresh slot",
    "extra_key": "keys in separate namespaces (extra_key) never share prefixes",
    "faults": "hold / release_holds / fail_next_allocs inject allocation failures",
    "branching": "match reports mamba_branching_seqlen (SGLang's rule: KV match rounded to the grid)",
    "full_kv_hit_len": "match reports full_kv_hit_len, the KV matched past the hit",
    "exact_evict_report": "evict reports exactly the tokens and states that left the tree (without it: "
    "never more than left)",
    "partial_page_keys": "match accepts keys that end inside a page (without it the machine draws "
    "page-aligned match keys)",
    "eviction_totals": "eviction_totals() gives the tokens and states evicted so far, evictions inside "
    "other calls included (enables the policy checks of the per-path cap)",
    "lifecycle_steps": "the LifecycleAdapter methods: a forward's extend and commit as separate steps "
    "(start_forward / commit_forward), aborts with a forward pending, prefill_chunk_len (SGLang's page "
    "cut), can_admit, and refused misuse returned as Refused with lifecycle_state() unchanged. Contract: "
    "a prefill chunk ends on a page boundary or at the prompt's end; a decode forward does not cross "
    "the next decode boundary; one forward pending per request; finish(insert=True) refuses a pending "
    "forward; a plan commits once, and never after its request finished",
}
"""Capability names an adapter may declare, and what each promises."""


@dataclass(frozen=True)
class SuiteParams:
    """One configuration of the cache under test, drawn by the machine. Small on purpose: tiny pools make
    eviction, tombstoning and allocation failure happen in almost every run.

    ``kv_pages`` is the KV capacity in pages (tokens = ``kv_pages * page_size``); ``state_slots`` the usable
    slots of the state pool; ``req_rows`` the request rows (the bound on running requests);
    ``state_chunk`` the prefill checkpoint grid before the lcm with the page size; ``prefill_chunk`` the
    chunked-prefill size; ``track_interval`` the decode checkpoint period; ``kv_only_leaves`` whether the
    cache keeps a deleted leaf's stateless ancestors as KV-only leaves (SGLang 0.5.23), so a tombstone
    leaf is allowed; ``max_states_per_path`` the soft per-path checkpoint cap (-1: none).

    Only knobs every Mamba-aware radix cache of the SGLang family has; an engine's own knobs go into a
    subclass (:class:`mamba_radix.testing.radix_adapter.RadixSuiteParams`), drawn by its own strategy.
    """

    page_size: int = 1
    strategy: str = "no_buffer"
    overlap: bool = False
    max_states_per_path: int = -1
    kv_pages: int = 48
    state_slots: int = 12
    req_rows: int = 3
    state_chunk: int = 2
    prefill_chunk: int = 4
    track_interval: int = 4
    kv_only_leaves: bool = False


@dataclass(frozen=True)
class InsertOutcome:
    """What a raw insert did. ``kv_indices`` are the indices the adapter allocated and handed over (the
    cache frees the duplicates at positions below ``prefix_len``); ``slot`` the stamped state slot."""

    prefix_len: int
    mamba_exists: bool
    kv_indices: tuple[int, ...]
    slot: int
    evicted: bool = False  # the adapter evicted to find memory, so the tree changed before the insert


@dataclass(frozen=True)
class MatchOutcome:
    """What a match returned. ``node`` is an opaque handle for ``lock``/``unlock``; ``slot`` the checkpoint
    slot of the hit (``None`` at the root); ``cow_stamp`` the stamp of the copy-on-write slot, if asked."""

    hit_len: int
    kv_indices: tuple[int, ...]
    node: Any
    slot: int | None
    full_kv_hit_len: int | None  # None: the cache does not report it (capability "full_kv_hit_len")
    branching_seqlen: int | None
    cow_stamp: tuple[int, int] | None = None
    cow_skipped: bool = False  # no slot for the copy-on-write even after eviction: the hit was dropped


@dataclass(frozen=True)
class EvictOutcome:
    num_tokens: int
    num_states: int


@dataclass(frozen=True)
class AdmitOutcome:
    """An admitted request: its id, the hit length of its admission match and the stamp of its live slot
    right after admission (copy-on-write of the hit, or the cleared slot)."""

    rid: int
    hit_len: int
    live_stamp: tuple[int, int]
    cow_skipped: bool = False


@dataclass(frozen=True)
class RunningView:
    """A running request as the checks see it.

    ``tokens``: input + output so far; ``kv_len``: tokens whose KV is written; ``protected_len``: the
    tree-owned, locked prefix; ``row``: the request's ``req_to_token`` row up to ``kv_len``; ``lock_node``:
    the ``id`` of the node it holds locked; ``live_slot``/``track_slots``: its state slots;
    ``lock_covers_checkpoint``: whether that lock also holds the node's checkpoint (False for a KV-only
    lock, SGLang's ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` hand-over lock: the checkpoint may then be
    evicted, the node turning tombstone, while the KV stays).
    """

    rid: int
    extra_key: Any
    tokens: tuple[int, ...]
    kv_len: int
    protected_len: int
    row: tuple[int, ...]
    lock_node: int
    live_slot: int | None
    track_slots: tuple[int, ...]
    lock_covers_checkpoint: bool = True


@dataclass(frozen=True)
class Refused:
    """A lifecycle call the cache refused as misuse (capability ``"lifecycle_steps"``): ``call`` names the
    cache call, ``reason`` is its error message. A refused call must have changed nothing."""

    call: str
    reason: str


@dataclass(frozen=True)
class PendingForward:
    """A forward extended and not yet committed: tokens ``[start, end)`` of request ``rid``."""

    rid: int
    start: int
    end: int
    is_prefill: bool


@dataclass(frozen=True)
class LifecycleView:
    """Where a running request stands in its lifecycle (capability ``"lifecycle_steps"``).

    ``prompt_len``: its prompt's length (prefill while ``kv_len < prompt_len``); ``kv_len``: tokens whose
    KV is committed; ``seq_len``: tokens known (prompt and sampled outputs); ``pending``: its uncommitted
    forward, if any; ``decode_boundary``: the next decode boundary above ``kv_len`` a decode forward may
    end on but not cross (``None``: decode tracks nothing, or still in prefill).
    """

    rid: int
    prompt_len: int
    kv_len: int
    seq_len: int
    pending: PendingForward | None
    decode_boundary: int | None


@dataclass
class TreeSnapshot:
    """The resident content of a cache, read by walking its tree.

    ``kv``: every resident prefix key whose length is a multiple of the page size -> the KV indices of its
    last page (one index when unpaged). Pages, not tokens: in a paged tree two siblings may share their
    first tokens (children are keyed by whole pages), so a token-level map would be ambiguous.
    ``checkpoints``: every prefix key with a checkpoint -> its slot; ``node_keys``: ``id(node)`` -> the
    prefix key the node ends at (root included); ``counters``: the cache's own
    ``full_evictable``/``full_protected``/``mamba_evictable``/``mamba_protected`` sizes.
    """

    kv: dict[Key, tuple[int, ...]] = field(default_factory=dict)
    checkpoints: dict[Key, int] = field(default_factory=dict)
    node_keys: dict[int, Key] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)


def snapshot_tree(
    cache: Any,
    root: Any,
    page_size: int,
    edge: Callable[[Any], tuple[Any, Sequence[int]]],
    slot: Callable[[Any], int | None],
) -> TreeSnapshot:
    """The :class:`TreeSnapshot` of a radix tree whose nodes have ``id``, ``children`` (a dict) and
    ``value`` (a tensor of KV indices): ``edge(node)`` gives its ``(extra_key, edge tokens)``, ``slot(node)``
    its checkpoint slot or ``None``; the counters are ``cache``'s four SGLang-named sizes. Shared by the
    adapters of caches whose nodes name these fields differently. O(resident tokens x depth)."""
    snap = TreeSnapshot()
    snap.node_keys[root.id] = (None, ())
    stack: list[tuple[Any, tuple[int, ...]]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            extra, tokens = edge(child)
            toks = prefix + tuple(tokens)
            values = child.value.tolist()
            for i in range(0, len(values), page_size):
                snap.kv[(extra, toks[: len(prefix) + i + page_size])] = tuple(values[i : i + page_size])
            snap.node_keys[child.id] = (extra, toks)
            held = slot(child)
            if held is not None:
                snap.checkpoints[(extra, toks)] = held
            stack.append((child, toks))
    snap.counters = {
        "full_evictable": cache.full_evictable_size(),
        "full_protected": cache.full_protected_size(),
        "mamba_evictable": cache.mamba_evictable_size(),
        "mamba_protected": cache.mamba_protected_size(),
    }
    return snap


@dataclass
class Ownership:
    """Who holds what, for one pool (KV indices or state slots).

    ``owners``: owner name (``"tree"``, ``"req 3"``, ``"fault"``...) -> the indices it holds, duplicates
    kept (a duplicate is a bug the checks report); ``allocated``: what the pool says is allocated;
    ``available``: what the pool says it can still hand out; ``capacity``: usable entries;
    ``page_size``: ownership is checked per page (an index ``i`` lies in page ``i // page_size``);
    ``first_index``: the lowest index the pool hands out (default ``page_size``: page 0 is padding).
    ``allocated=None``: the pool cannot list its allocations; conservation then compares counts only.
    """

    name: str
    owners: dict[str, list[int]]
    allocated: list[int] | None
    available: int
    capacity: int
    page_size: int = 1
    first_index: int | None = None


@runtime_checkable
class CacheAdapter(Protocol):
    """What the state machine needs from a cache. See the module docstring for how to write one.

    Optional members the machine looks for with ``getattr``: ``max_raw_locks`` (an int: the most locks
    the machine may hold outside requests at once, for engines whose scheduler bounds them; default
    unbounded) and ``eviction_totals()`` (capability ``"eviction_totals"``).
    """

    params: SuiteParams
    capabilities: frozenset[str]

    # ---------------------------------------------------------------------------------------- tree ops
    def insert(self, extra_key: Any, tokens: Sequence[int]) -> InsertOutcome | None:
        """Allocate KV and a stamped slot for ``tokens`` and insert them; ``None`` if memory ran out."""
        ...

    def match(self, extra_key: Any, tokens: Sequence[int], cow: bool) -> MatchOutcome | None:
        """Look ``tokens`` up (with copy-on-write of the hit); ``None``: a copy-on-write match refused by
        the engine's admission control, nothing changed."""
        ...

    def lock(self, node: Any) -> None: ...

    def unlock(self, node: Any) -> None: ...

    def evict(self, num_tokens: int, num_states: int) -> EvictOutcome: ...

    # ------------------------------------------------------------------------------------ requests
    def admit(
        self, rid: int, extra_key: Any, input_ids: Sequence[int], max_new_tokens: int | None = None
    ) -> AdmitOutcome | None:
        """Match, allocate and lock a new request that will decode at most ``max_new_tokens`` tokens
        (its output KV can be reserved); ``None`` (and nothing held) if it cannot be admitted now."""
        ...

    def prefill_chunk(self, rid: int) -> list[Offer] | None:
        """Run the next prefill chunk and cache it. Returns what was offered to the cache, or ``None``
        (nothing changed) if KV could not be had even after eviction."""
        ...

    def decode(self, rid: int, token: int) -> list[Offer] | None:
        """Append one output token, checkpointing at a decode boundary. Returns the offers (empty when no
        cache call was made), or ``None`` (nothing changed) if KV ran out."""
        ...

    def finish(self, rid: int, insert: bool) -> list[Offer]:
        """``cache_finished_req`` (``insert=False``: an abort) and release the request's row."""
        ...

    def running(self) -> list[RunningView]: ...

    def in_prefill(self, rid: int) -> bool: ...

    # --------------------------------------------------------------------------------------- faults
    def hold(self, pool: str, num: int) -> int:
        """Take up to ``num`` entries of ``pool`` (``"kv"`` or ``"state"``) away; returns how many."""
        ...

    def release_holds(self) -> None: ...

    def fail_next_allocs(self, pool: str, count: int) -> None:
        """Make the next ``count`` allocations from ``pool`` return ``None``."""
        ...

    # -------------------------------------------------------------------------------------- observe
    def snapshot(self) -> TreeSnapshot: ...

    def ownership(self) -> list[Ownership]:
        """One record per pool (KV indices, state slots, request rows)."""
        ...

    def read_stamp(self, slot: int) -> tuple[int, int]: ...

    def check_invariants(self, idle: bool = False) -> None:
        """The cache's own structural check; raises on a violation. ``idle``: no request runs and the
        machine holds no lock, so nothing in the tree is locked (checks that assume it may run)."""
        ...

    def dump(self) -> str:
        """A readable dump of the tree for failure messages."""
        ...


@runtime_checkable
class LifecycleAdapter(CacheAdapter, Protocol):
    """The extra surface of capability ``"lifecycle_steps"`` (driven by
    :class:`mamba_radix.testing.machine.LifecycleMachine`). Requests are named by ``rid``; a finished
    request stays nameable (the misuse probes call it again), so an adapter keeps finished requests.

    Every call that the cache refuses as misuse returns :class:`Refused` and must change nothing, which
    the machine checks by comparing :meth:`lifecycle_state` before and after it.
    """

    def lifecycle_view(self, rid: int) -> LifecycleView: ...

    def prefill_chunk_len(self, rid: int, budget: int) -> int:
        """The next prefill chunk's length with at most ``budget`` tokens (SGLang's cut): the rest of the
        prompt if it fits, else up to the last page boundary within the budget, ``0`` if there is none."""
        ...

    def can_admit(
        self, extra_key: Any, input_ids: Sequence[int], max_new_tokens: int | None
    ) -> tuple[bool, str | None]:
        """Whether a request of ``input_ids`` would be admitted now, and why not. Read-only."""
        ...

    def start_forward(
        self, rid: int, num_tokens: int, sampled: Sequence[int] = ()
    ) -> PendingForward | Refused | None:
        """Append the ``sampled`` output tokens, then extend the request over its next ``num_tokens``
        tokens, leaving the forward pending (the model has not run). ``None``: KV is short even after
        eviction; the request is unchanged (the sampled tokens are taken back, as on a refusal)."""
        ...

    def commit_forward(self, rid: int) -> list[Offer]:
        """Run the model for the pending forward (stamp its states) and commit it; returns the offers."""
        ...

    def finish_step(self, rid: int, insert: bool) -> list[Offer] | Refused:
        """``finish`` (``insert=False``: an abort, a pending forward's KV freed with the request's), or
        :class:`Refused` (``insert=True`` with a forward pending; a request finished already)."""
        ...

    def recommit(self, rid: int) -> list[Offer] | Refused | None:
        """Commit the newest plan request ``rid`` extended; the machine calls it only with no forward of
        ``rid`` pending, so the plan is stale (committed already, or its request finished since, the plan
        of a forward aborted in flight included) and a correct cache refuses. ``None``: it extended none."""
        ...

    def lifecycle_state(self) -> dict[str, Any]:
        """Everything a refused call must leave alone, as plain comparable data: the tree, the pools, the
        cache's counters and stats, and every request's fields (finished ones included)."""
        ...
