"""The records :class:`~mamba_radix.cache.MambaRadixCache` hands back: what a match found
(:class:`MatchResult`), what a read-only peek found (:class:`PrefixPeek`), what an insert and an eviction
did (:class:`InsertResult`, :class:`EvictResult`), and the cache's counters (:class:`CacheStats`). Plain
records, re-exported from :mod:`mamba_radix.cache`, where callers import them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from mamba_radix.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.node import TreeNode
    from mamba_radix.tree import TreeMatch

__all__ = ["CacheStats", "EvictResult", "InsertResult", "MatchResult", "PrefixPeek"]


class MatchResult:
    """What :meth:`MambaRadixCache.match_prefix` found:

    - ``device_indices``: int64 KV indices of the usable hit, ``[0, hit_len)``, one fresh tensor (never a
      node's storage), concatenated from the matched nodes on first access and then kept: the lifecycle's
      admission writes the hit into the request row from the nodes' chunks and usually never reads it;
    - ``last_node``: deepest node with a checkpoint on the matched path (root if none);
    - ``mamba_slot``: that node's checkpoint slot (None at the root);
    - ``full_kv_hit_len``: KV matched, possibly deeper than the usable hit;
    - ``mamba_branching_seqlen``: ``full_kv_hit_len`` rounded down to the grid, if deeper than the hit.

    Read like the NamedTuple it was: fields by name, unpacking and indexing in that order, ``_fields``,
    ``_asdict()``. Late reads are exact: the tree never changes a node's indices in place.
    """

    __slots__ = (
        "_indices",
        "_match",
        "full_kv_hit_len",
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
