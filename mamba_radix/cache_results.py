"""The records :class:`~mamba_radix.cache.MambaRadixCache` hands back: what a match found
(:class:`MatchResult`), what a read-only peek found (:class:`PrefixPeek`), what an insert and an eviction
did (:class:`InsertResult`, :class:`EvictResult`), and the cache's counters (:class:`CacheStats`). Plain
records, re-exported from :mod:`mamba_radix.cache`, where callers import them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from mamba_radix.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode
    from mamba_radix.tree import TreeMatch

__all__ = [
    "CacheStats",
    "EvictResult",
    "HostTierStats",
    "InsertResult",
    "LoadPlan",
    "MatchResult",
    "PrefixPeek",
]


class MatchResult:
    """What :meth:`MambaRadixCache.match_prefix` found:

    - ``device_indices``: int64 KV indices of the usable hit, ``[0, hit_len)``, one fresh tensor (never a
      node's storage), concatenated from the matched nodes on first access and then kept: the lifecycle's
      admission writes the hit into the request row from the nodes' chunks and usually never reads it;
    - ``last_node``: deepest node with a checkpoint on the matched path (root if none);
    - ``mamba_slot``: that node's checkpoint slot (None at the root);
    - ``full_kv_hit_len``: KV matched, possibly deeper than the usable hit;
    - ``mamba_branching_seqlen``: ``full_kv_hit_len`` rounded down to the grid, if deeper than the hit;
    - ``host_hit_len`` (host tier; not part of the tuple form): tokens beyond the device hit up to the
      deepest checkpoint whose KV and state are on the device or the host, a load-back's worth (0 without
      the tier); ``host_checkpoint``: whether that checkpoint is on the host only.

    Read like the NamedTuple it was: fields by name, unpacking and indexing in that order, ``_fields``,
    ``_asdict()``. Late reads are exact: the tree never changes a node's indices in place.
    """

    __slots__ = (
        "_indices",
        "_match",
        "full_kv_hit_len",
        "host_checkpoint",
        "host_hit_len",
        "last_node",
        "mamba_branching_seqlen",
        "mamba_slot",
    )
    _fields = ("device_indices", "last_node", "mamba_slot", "full_kv_hit_len", "mamba_branching_seqlen")

    def __init__(
        self,
        device_indices: torch.Tensor | None,
        last_node: TreeNode,
        mamba_slot: int | None,
        full_kv_hit_len: int,
        mamba_branching_seqlen: int | None,
        *,
        match: TreeMatch | None = None,
        host_hit_len: int = 0,
        host_checkpoint: bool = False,
    ) -> None:
        """``device_indices``, or ``None`` with ``match``: the tree match whose hit these are."""
        if device_indices is None and match is None:
            raise InvalidArgument("MatchResult needs device_indices or the tree match they come from")
        self._indices = device_indices
        self._match = match if device_indices is None else None
        self.last_node = last_node
        self.mamba_slot = mamba_slot
        self.full_kv_hit_len = full_kv_hit_len
        self.mamba_branching_seqlen = mamba_branching_seqlen
        self.host_hit_len = host_hit_len
        self.host_checkpoint = host_checkpoint

    @property
    def device_indices(self) -> torch.Tensor:
        """The hit's KV indices (concatenated on the first read, O(hit_len); then the same tensor)."""
        indices = self._indices
        if indices is None:
            indices = self._indices = self._match.device_indices  # type: ignore[union-attr]
            self._match = None
        return indices

    def kv_chunks(self) -> tuple[torch.Tensor, ...]:
        """The hit's KV as read-only chunks (the nodes' own values until ``device_indices`` is read):
        for a caller that copies the hit into a buffer of its own. O(1)."""
        match = self._match
        return match.kv_chunks if match is not None else (self.device_indices,)

    def __iter__(self) -> Iterator[object]:
        return iter(
            (
                self.device_indices,
                self.last_node,
                self.mamba_slot,
                self.full_kv_hit_len,
                self.mamba_branching_seqlen,
            )
        )

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, index: int | slice) -> object:
        return tuple(self)[index]

    def _asdict(self) -> dict[str, object]:
        return dict(zip(self._fields, self, strict=True))

    def __repr__(self) -> str:
        return "MatchResult(" + ", ".join(f"{k}={v!r}" for k, v in self._asdict().items()) + ")"


class PrefixPeek(NamedTuple):
    """What :meth:`MambaRadixCache.peek_prefix` found (read-only: nothing was split, stamped or counted)."""

    hit_len: int  # the usable hit match_prefix would return now (tokens up to last_node's end)
    full_kv_hit_len: int  # KV matched, possibly deeper than the usable hit
    last_node: TreeNode  # deepest node with a checkpoint on the matched path (root if none)
    unlocked_tokens: int  # KV tokens of [0, hit_len) that no lock holds: locking last_node takes them
    #                       out of full_evictable_size()
    unlocked_checkpoint: bool  # locking last_node takes its checkpoint out of mamba_evictable_size()


class InsertResult(NamedTuple):
    prefix_len: int  # tokens the tree held already
    mamba_exists: bool  # the end node had a checkpoint: the caller's slot stays the caller's


class EvictResult(NamedTuple):
    num_tokens: int  # KV tokens freed (leaves and the tombstone cascade)
    num_states: int  # checkpoints freed


@dataclass
class CacheStats:
    """Counters since construction (or :meth:`reset`). Plain ints, for the simulator's metrics."""

    matches: int = 0
    hit_tokens: int = 0  # usable hit tokens over all matches
    kv_only_tokens: int = 0  # KV matched beyond the usable hit (unusable without a state)
    checkpoints_inserted: int = 0  # new leaf or revived tombstone
    checkpoints_existing: int = 0  # insert found a checkpoint already there
    checkpoints_skipped: int = 0  # no slot even after eviction: the checkpoint was not taken
    checkpoints_capped: int = 0  # dropped by mamba_max_states_per_path
    checkpoints_declined: int = 0  # a hand-over the research policy did not admit (policy.admit_checkpoint)
    lazy_inserts_skipped: int = 0  # finish without insert: the lazy boundary slot was not had
    cow_skipped: int = 0  # a hit dropped because no slot was free for its copy-on-write
    state_copies: int = 0  # slot-to-slot copies (copy-on-write, no_buffer chunk ends)
    tokens_evicted: int = 0
    states_evicted: int = 0
    # of states_evicted: checkpoints of nodes a running request held KV-only locked (skip_decode_lock),
    # the hand-over checkpoints that switch leaves evictable while their requests decode
    checkpoints_evicted_while_decoding: int = 0

    def reset(self) -> None:
        for name in asdict(self):
            setattr(self, name, 0)


@dataclass
class HostTierStats:
    """The host tier's counters (``cache.host_stats``; None while the tier is off, so the device counters
    and every report built from them are unchanged). Tokens and slots, cumulative."""

    kv_backed_up: int = 0  # KV tokens copied to the host
    states_backed_up: int = 0  # checkpoints copied to the host
    backups_skipped: int = 0  # a backup with no host room even after host eviction
    host_hits: int = 0  # load-backs applied
    kv_loaded: int = 0  # KV tokens copied back to the device
    states_loaded: int = 0  # checkpoints copied back to the device
    loads_skipped: int = 0  # a host hit dropped: no device room for its load-back
    host_tokens_evicted: int = 0  # host KV tokens freed by host eviction


@dataclass(frozen=True)
class LoadPlan:
    """A load-back (host tier): which host KV rows go to which newly allocated device KV indices and which
    host state slot to which device slot, so that a host-resident prefix becomes a device hit.

    Made by :meth:`MambaRadixCache.plan_load_back` (device memory allocated, the path pinned) and applied
    once by :meth:`MambaRadixCache.apply_load_plan`, which returns it with ``applied`` set and ``event``:
    the CUDA event the state copy recorded on a side stream (None off CUDA or without a stream), for an
    engine that overlaps the copy with the previous forward. ``hit_len``: the device hit after the load
    (tokens up to the loaded checkpoint's node)."""

    plan_id: int
    host_kv: torch.Tensor  # host KV indices, in prefix order
    device_kv: torch.Tensor  # device KV indices they load into (now the tree's), pairwise
    host_slot: int  # the checkpoint's host slot
    device_slot: int  # the device slot it loads into (the node's checkpoint from then on)
    hit_len: int
    applied: bool = False
    event: object = None
    nodes: tuple[TreeNode, ...] = field(default=(), repr=False, compare=False)  # host-only path, top-down
    target: TreeNode | None = field(default=None, repr=False, compare=False)  # the checkpoint's node

    @property
    def num_tokens(self) -> int:
        """KV tokens the plan moves. O(1)."""
        return int(self.device_kv.numel())
