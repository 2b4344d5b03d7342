"""Buffer strategies as objects: where a running request's states live, where they are tracked, and which
slot goes to the tree (DESIGN.md §6, ``reference/sglang-semantics.md`` §4.7-4.8, §7).

One class per strategy, plus :class:`DisabledCache` for ``--disable-radix-cache``, chosen by
:func:`buffer_strategy` from the :data:`BUFFER_STRATEGIES` registry. The request lifecycle
(:mod:`mamba_radix.lifecycle`) asks the object and never branches on the strategy's name:

=====================  ==========================  ================================================
strategy               slots per running request   states handed to the tree
=====================  ==========================  ================================================
``no_buffer``          3                           the live slot, copied at every prefill chunk end;
                                                   donated without a copy at finish
``extra_buffer``       3 + P (P = 2 with overlap)  the ping-pong slot the model tracked into (one per
                                                   prefill chunk; decode boundaries are only tracked,
                                                   the newest is inserted at finish); no copy
``extra_buffer_lazy``  3 + 1                       as extra_buffer; the second ping-pong slot is
                                                   borrowed at a decode boundary, without eviction,
                                                   and the state is tracked in place when none is free
disabled               1                           none: nothing is matched or inserted (the null
                                                   strategy: the cache asks it like any other)
=====================  ==========================  ================================================

Positions come from the pure rules in :mod:`mamba_radix.strategies`; this module decides which slot.
Every method is O(1) (O(P) for the ping-pong bookkeeping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

from mamba_radix import strategies
from mamba_radix.cache_results import MatchResult, PrefixPeek
from mamba_radix.errors import ConfigError, InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.config import CacheConfig
    from mamba_radix.node import TreeNode
    from mamba_radix.pools import HybridReqToTokenPool
    from mamba_radix.request import Req
    from mamba_radix.tree import RadixKey, Walk

__all__ = [
    "BUFFER_STRATEGIES",
    "BufferStrategy",
    "CacheLookups",
    "DisabledCache",
    "ExtraBuffer",
    "LazyExtraBuffer",
    "NoBuffer",
    "buffer_strategy",
]


class CacheLookups(Protocol):
    """The cache's lookups a strategy answers a match or a peek with (:class:`~mamba_radix.cache.
    MambaRadixCache` implements them): the tree's own, and the root and device a null answer needs."""

    device: torch.device

    @property
    def root_node(self) -> TreeNode: ...

    def match_tree(
        self, radix_key: RadixKey, walk: Walk | None, cow_mamba: bool, req: Req | None
    ) -> tuple[MatchResult, int]: ...

    def peek_tree(self, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]: ...


class BufferStrategy:
    """The rules of one buffer strategy for one :class:`~mamba_radix.config.CacheConfig`.

    Subclasses override the hooks; the defaults here are the no-tracking behaviour of ``no_buffer``.
    :class:`DisabledCache` is the null strategy: the cache and the lifecycle call it like any other, and
    its answers are those of a cache that holds nothing.
    """

    name: ClassVar[str]
    tracks: ClassVar[bool] = False  # True: the model writes checkpoints into ping-pong track slots

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        # The frozen config's derived counts, read once: its properties recompute them on every read
        # (~1 us each through the chain), and admission reads them per request.
        budget = config.slot_budget
        self._track_slots = budget.track_slots_held
        self.per_chunk_headroom_slots = budget.per_chunk_headroom

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config.strategy!r})"

    # ------------------------------------------------------------------------------------- admission
    def admission_slots(self, req: Req) -> int:
        """State slots admission takes for ``req``: :func:`strategies.admission_slots`, from the counts
        read at construction (a test checks the two agree). O(1)."""
        live = 1 if req.mamba_pool_idx is None else 0
        return live if req.mamba_ping_pong_track_buffer is not None else live + self._track_slots

    # ---------------------------------------------------------------------------------------- lookup
    def match_prefix(
        self, cache: CacheLookups, radix_key: RadixKey, walk: Walk | None, cow_mamba: bool, req: Req | None
    ) -> tuple[MatchResult, int]:
        """What ``cache.match_prefix`` finds, and the usable hit's length: the tree's match
        (:meth:`~mamba_radix.cache.MambaRadixCache.match_tree`). Its side effects and cost."""
        return cache.match_tree(radix_key, walk, cow_mamba, req)

    def peek_prefix(self, cache: CacheLookups, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]:
        """What ``cache.peek_with_walk`` finds, and the walk: the tree's
        (:meth:`~mamba_radix.cache.MambaRadixCache.peek_tree`). No side effects. O(L + path)."""
        return cache.peek_tree(radix_key)

    # -------------------------------------------------------------------------------------- tracking
    def prefill_track_len(self, req: Req, start: int, num_tokens: int) -> int | None:
        """The sequence length at which the prefill chunk ``[start, start + num_tokens)`` tracks its
        state into a track slot, or ``None``."""
        return None

    def next_decode_boundary(self, seq_len: int) -> int | None:
        """The smallest decode boundary (a KV length whose state decode tracks) above ``seq_len``, or
        ``None`` if decode tracks nothing."""
        return None

    def decode_track_slot(self, req: Req, pool: HybridReqToTokenPool) -> int | None:
        """At a decode boundary: the slot the model tracks into (lazy: borrows the second entry if a slot
        is free; side effect on the pool and ``req``), or ``None``."""
        return None

    def prefill_track_slot(self, req: Req) -> int:
        """The slot a prefill chunk tracks into: the ping-pong entry ``next_track_idx``."""
        buffer = req.mamba_ping_pong_track_buffer
        assert buffer is not None, "only tracking strategies track"
        return buffer[req.mamba_next_track_idx]

    def after_track(self, req: Req, pool: HybridReqToTokenPool, *, decode: bool) -> None:
        """The model wrote a tracked state: advance the ping-pong bookkeeping (eager: flip to the other
        entry; lazy decode: release the old slot)."""

    # ------------------------------------------------------------------------------------- hand-over
    def checkpoint_len(self, req: Req, pending: tuple[int, int | None] | None = None) -> int | None:
        """The length of the newest state ``req`` can hand to the tree now, or ``None``. ``pending``:
        ``(end, track_len)`` of ``req``'s uncommitted forward, to ask for the state it could hand over once
        that forward is committed (a commit checks the hand-over before it changes anything). No side
        effects. O(1)."""
        return req.kv_len if pending is None else pending[0]

    def finish_insert_skipped(self, req: Req) -> bool:
        """Whether a finish asked to insert must not: the lazy boundary slot was not had
        (``req.mamba_lazy_is_insert`` False; the lifecycle counts it in ``stats.lazy_inserts_skipped``).
        No side effects. O(1)."""
        return not req.mamba_lazy_is_insert

    def check_hand_over(self, req: Req, pool: HybridReqToTokenPool, verb: str) -> None:
        """Raise :class:`InvalidArgument` if :meth:`unfinished_tree_slot` would refuse ``req`` (checked
        before the caller allocates the fresh slot, so that a refusal leaks nothing). No side effects.
        O(1)."""

    def unfinished_tree_slot(
        self, req: Req, pool: HybridReqToTokenPool, new_slot: int, check: bool = True
    ) -> tuple[int, bool]:
        """Mid-request hand-over, given a fresh slot ``new_slot``: returns ``(slot for the tree, copied)``.
        ``copied``: the live state must be copied into the returned slot (no_buffer); otherwise the
        tracked slot is donated and ``new_slot`` takes its place in the request's buffer. ``check``:
        passed on to the pool (``False``: the caller validated ``req`` and allocated ``new_slot``)."""
        return new_slot, True

    def checkpoint_slot(self, req: Req, pool: HybridReqToTokenPool) -> int:
        """The request's slot holding the state at :meth:`checkpoint_len`: the live slot (tracking
        strategies: the ping-pong keep entry). Read, not given away: a quantized hand-over
        (``checkpoint_format`` int8 / fp8_e4m3) quantizes it and the request keeps it. No side effects."""
        assert req.mamba_pool_idx is not None
        return req.mamba_pool_idx

    def finished_tree_slot(self, req: Req, pool: HybridReqToTokenPool) -> int:
        """At finish: the request's slot holding the state at :meth:`checkpoint_len`, donated as is."""
        return self.checkpoint_slot(req, pool)


class NoBuffer(BufferStrategy):
    """``no_buffer``: the live slot is the only state; it is copied at chunk ends, donated at finish."""

    name = "no_buffer"


class DisabledCache(BufferStrategy):
    """``--disable-radix-cache``, the null strategy: one live slot per request; nothing is matched,
    tracked or inserted. Its answers are a cache's that holds nothing: a match finds the root (nothing
    split, stamped or counted), a request has no checkpoint to hand over, so no finish skips one."""

    name = "disabled"

    def match_prefix(
        self, cache: CacheLookups, radix_key: RadixKey, walk: Walk | None, cow_mamba: bool, req: Req | None
    ) -> tuple[MatchResult, int]:
        empty = torch.empty(0, dtype=torch.int64, device=cache.device)
        return MatchResult(empty, cache.root_node, None, 0, None), 0

    def peek_prefix(self, cache: CacheLookups, radix_key: RadixKey) -> tuple[PrefixPeek, Walk | None]:
        return PrefixPeek(0, 0, cache.root_node, 0, False), None

    def checkpoint_len(self, req: Req, pending: tuple[int, int | None] | None = None) -> int | None:
        return None

    def finish_insert_skipped(self, req: Req) -> bool:
        return False


class ExtraBuffer(BufferStrategy):
    """``extra_buffer``: the model tracks checkpoints into ``P`` ping-pong slots, donated without copy."""

    name = "extra_buffer"
    tracks = True

    def prefill_track_len(self, req: Req, start: int, num_tokens: int) -> int | None:
        return strategies.prefill_track_len(
            self.config, start, num_tokens, req.mamba_branching_seqlen, input_len=len(req.origin_input_ids)
        )

    def next_decode_boundary(self, seq_len: int) -> int | None:
        interval = self.config.mamba_track_interval
        return (seq_len // interval + 1) * interval

    def decode_track_slot(self, req: Req, pool: HybridReqToTokenPool) -> int | None:
        return self.prefill_track_slot(req)

    def after_track(self, req: Req, pool: HybridReqToTokenPool, *, decode: bool) -> None:
        req.mamba_next_track_idx = pool.ping_pong_other_idx(req.mamba_next_track_idx)

    def checkpoint_len(self, req: Req, pending: tuple[int, int | None] | None = None) -> int | None:
        if pending is not None and pending[1] is not None:
            return pending[1]
        return req.mamba_last_track_seqlen

    def check_hand_over(self, req: Req, pool: HybridReqToTokenPool, verb: str) -> None:
        buffer = req.mamba_ping_pong_track_buffer
        keep = pool.ping_pong_keep_idx(req)
        if buffer is None or not 0 <= keep < len(buffer) or buffer[keep] < 0:
            raise InvalidArgument(
                f"{verb}: request {req.rid!r} has no tracked slot in ping-pong entry {keep} to hand over "
                f"(track buffer {buffer}); leave mamba_next_track_idx to the cache (under "
                f"{self.name} it {'stays on the held entry' if self.config.is_lazy else 'flips after each track'})"
            )

    def unfinished_tree_slot(
        self, req: Req, pool: HybridReqToTokenPool, new_slot: int, check: bool = True
    ) -> tuple[int, bool]:
        return pool.donate_ping_pong_slot(req, new_slot, check), False

    def checkpoint_slot(self, req: Req, pool: HybridReqToTokenPool) -> int:
        buffer = req.mamba_ping_pong_track_buffer
        assert buffer is not None
        return buffer[pool.ping_pong_keep_idx(req)]


class LazyExtraBuffer(ExtraBuffer):
    """``extra_buffer_lazy``: one track slot held; the second is borrowed only at a decode boundary.

    The borrow never evicts (SGLang: a transient slot is not worth a cached checkpoint); when no slot is
    free the state is tracked in place, over the held slot. Its previous state is lost, which is safe
    here: decode boundaries are inserted only at finish, where only the newest tracked state counts.
    (SGLang also skips the finish insert in one overlap race, a lookahead this sequential model does not
    have.)
    """

    name = "extra_buffer_lazy"

    def decode_track_slot(self, req: Req, pool: HybridReqToTokenPool) -> int | None:
        pool.lazy_alloc_boundary_slot(req)  # points next_track_idx at the borrowed slot, if it got one
        return self.prefill_track_slot(req)

    def after_track(self, req: Req, pool: HybridReqToTokenPool, *, decode: bool) -> None:
        if decode:
            pool.lazy_release_old_slot(req)


BUFFER_STRATEGIES: dict[str, type[BufferStrategy]] = {
    cls.name: cls for cls in (NoBuffer, ExtraBuffer, LazyExtraBuffer, DisabledCache)
}


def buffer_strategy(config: CacheConfig) -> BufferStrategy:
    """The strategy object for ``config``: the disabled cache under ``--disable-radix-cache``, else the
    resolved ``--mamba-radix-cache-strategy``. Raises :class:`ConfigError` for a name not registered."""
    name = "disabled" if config.disable_radix_cache else config.strategy
    cls = BUFFER_STRATEGIES.get(name)
    if cls is None:  # pragma: no cover - CacheConfig validates the names
        raise ConfigError(f"no buffer strategy registered as {name!r}; known: {', '.join(BUFFER_STRATEGIES)}")
    return cls(config)
