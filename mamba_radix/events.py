"""Cache events for a router: which KV blocks and which checkpoints a cache holds, as a stream.

A KV-aware router keeps a copy of each engine's prefix tree from its events and sends a prompt where
its prefix is cached. SGLang's events say where KV blocks are (:class:`BlockStored`,
:class:`BlockRemoved`, SGLang's field names), but for a hybrid model a block's KV is reusable only up to
the deepest *checkpoint* (a Mamba state) on its path: a router that sees only KV counts hits the engine
then throws away. So the stream here also says where checkpoints are (:class:`CheckpointStored`,
:class:`CheckpointRemoved`), each at the hash of the block it sits at, with its depth and tier.

The contract (``property_tests/test_events.py`` checks it over a state machine that drives the whole
lifecycle with eviction): replaying every event taken so far (:class:`PrefixIndex`) gives exactly the
cache's KV blocks and exactly its checkpoints, block for block; a checkpoint is always announced after
the blocks of its prefix and retracted before them, so the stream never advertises a prefix whose state
is gone. Schema and a router's use: ``docs/events.md``.

Blocks: one block per page (``page_size`` tokens; page size 1: one block per token, as SGLang does). A
block's hash chains its tokens onto its parent block's hash (the first block of a prefix onto a seed of
its namespace, the key's ``extra_key``), so equal prefixes get equal hashes on every engine and a router
computes a prompt's hashes itself (:func:`chain_block_hashes`). The hash is 64-bit BLAKE2b as a signed
int (SGLang's events carry signed int64 too); its own scheme, not SGLang's SHA-256 one, so a consumer
treats the values as opaque ids, as SGLang's documentation asks.

:class:`EventLog` is what the cache feeds: :meth:`~EventLog.inserted` with each insert's
:class:`~mamba_radix.tree_results.TreeInsert`, :meth:`~EventLog.released` with each eviction's
:class:`~mamba_radix.tree_results.Freed` (the tree decides, the cache frees, the log observes what the
cache frees). A cache built without events holds no log and pays one attribute test per insert and per
eviction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal

from mamba_radix.errors import InvalidArgument
from mamba_radix.node import TreeNode
from mamba_radix.token_ids import as_token_ids
from mamba_radix.tree_results import Freed, TreeInsert

__all__ = [
    "BlockRemoved",
    "BlockStored",
    "CacheEvent",
    "CheckpointRemoved",
    "CheckpointStored",
    "EventLog",
    "PrefixIndex",
    "chain_block_hashes",
    "namespace_seed",
]

# the medium SGLang's KV events name for device memory (its StorageMedium.GPU); the checkpoint events'
# ``tier`` is this project's own word for the same place
KV_MEDIUM = "GPU"
Tier = Literal["device", "host"]
# why a checkpoint went: "evicted" (state eviction took it, its block's KV stays: a tombstone), "dropped"
# (its block's KV went in the same eviction), "capped" (the per-path cap, mamba_max_states_per_path)
RemovedReason = Literal["evicted", "dropped", "capped"]

_SEED_TAG = b"mamba-radix-block-hash-v1"
_TOKEN_BYTES = 8  # tokens are hashed as int64 little-endian, the tree's own buffer


# ------------------------------------------------------------------------------------------- the events
@dataclass(slots=True)
class BlockStored:
    """KV blocks the cache now holds, in SGLang's shape: ``block_hashes`` (one per page, in order, each
    chained onto the one before), ``parent_block_hash`` (the block just above the first; ``None`` at the
    root), ``token_ids`` (all the blocks' tokens), ``block_size`` (tokens a block, the page size),
    ``lora_id`` (always ``None``: adapters are namespaces, ``extra_key``, folded into the hashes),
    ``medium`` (``"GPU"``: device memory)."""

    kind: ClassVar[str] = "BlockStored"
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = KV_MEDIUM

    def to_dict(self) -> dict[str, object]:
        """The event as a tagged map (``type`` is the class name), as SGLang encodes its events."""
        return {"type": self.kind, **asdict(self)}


@dataclass(slots=True)
class BlockRemoved:
    """KV blocks the cache no longer holds (SGLang's shape). Every checkpoint on them was retracted
    before, in the same batch or earlier."""

    kind: ClassVar[str] = "BlockRemoved"
    block_hashes: list[int]
    medium: str | None = KV_MEDIUM

    def to_dict(self) -> dict[str, object]:
        return {"type": self.kind, **asdict(self)}


@dataclass(slots=True)
class CheckpointStored:
    """A checkpoint (the recurrent state after ``depth_tokens`` tokens) now sits at the end of block
    ``block_hash``: the prefix ending with that block is reusable. Announced after the block itself."""

    kind: ClassVar[str] = "CheckpointStored"
    block_hash: int
    depth_tokens: int
    tier: Tier = "device"

    def to_dict(self) -> dict[str, object]:
        return {"type": self.kind, **asdict(self)}


@dataclass(slots=True)
class CheckpointRemoved:
    """The checkpoint at block ``block_hash`` (depth ``depth_tokens``) is gone from ``tier``, for
    ``reason`` (:data:`RemovedReason`): the prefix ending there is no longer reusable from it."""

    kind: ClassVar[str] = "CheckpointRemoved"
    block_hash: int
    depth_tokens: int
    reason: RemovedReason
    tier: Tier = "device"

    def to_dict(self) -> dict[str, object]:
        return {"type": self.kind, **asdict(self)}


CacheEvent = BlockStored | BlockRemoved | CheckpointStored | CheckpointRemoved


# --------------------------------------------------------------------------------------------- hashing
def namespace_seed(extra_key: str | None) -> bytes:
    """The 8 bytes a prefix's first block chains onto: distinct per namespace (``extra_key``; ``None``
    and ``""`` differ). O(len(extra_key))."""
    digest = hashlib.blake2b(_SEED_TAG, digest_size=8)
    if extra_key is None:
        digest.update(b"\x00")
    else:
        encoded = extra_key.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.digest()


def _chain(start: bytes, tokens: memoryview, page_size: int) -> list[int]:
    """Block hashes of ``tokens`` (whole pages of int64 bytes) chained from ``start``. O(tokens)."""
    hashes = []
    prev = start
    step = page_size * _TOKEN_BYTES
    blake2b = hashlib.blake2b
    for offset in range(0, len(tokens), step):
        digest = blake2b(prev, digest_size=8)
        digest.update(tokens[offset : offset + step])
        prev = digest.digest()
        hashes.append(int.from_bytes(prev, "little", signed=True))
    return hashes


def _start_bytes(parent_block_hash: int | None, extra_key: str | None) -> bytes:
    if parent_block_hash is None:
        return namespace_seed(extra_key)
    return parent_block_hash.to_bytes(8, "little", signed=True)


def chain_block_hashes(
    tokens: Sequence[int],
    page_size: int,
    *,
    parent_block_hash: int | None = None,
    extra_key: str | None = None,
) -> list[int]:
    """The block hashes of ``tokens`` (whole pages only; a partial last page has no block), chained onto
    ``parent_block_hash`` (``None``: ``tokens`` start at the root, in namespace ``extra_key``). What a
    router computes for a prompt to look it up in a :class:`PrefixIndex`. Raises
    :class:`InvalidArgument` for a page size below 1. O(len(tokens))."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise InvalidArgument(f"page_size must be an int >= 1, got {page_size!r}")
    ids = as_token_ids(tokens)
    whole = len(ids) - len(ids) % page_size
    view = memoryview(ids).cast("B")[: whole * _TOKEN_BYTES]
    return _chain(_start_bytes(parent_block_hash, extra_key), view, page_size)


# ------------------------------------------------------------------------------------------- recording
@dataclass(slots=True)
class _Checkpoint:
    block_hash: int
    depth_tokens: int
    block_kv: int  # the first KV index of the block it sits at: is that block freed with it?


class EventLog:
    """The events of one cache since the last :meth:`take`, and what it needs to name what is freed.

    It keeps two maps, both exact while the tree changes only through the cache (inserts and
    evictions): the first KV index of each tree block to the block's hash, and each tree checkpoint's
    slot to its block and depth. An eviction hands back only indices and slots (``Freed``), so these maps
    are how a removal is named. Memory: one entry per tree block and per checkpoint.
    """

    __slots__ = ("_block_of_kv", "_checkpoint_of_slot", "_queue", "page_size", "tier")

    def __init__(self, page_size: int, tier: Tier = "device") -> None:
        self.page_size = page_size
        self.tier: Tier = tier
        self._queue: list[CacheEvent] = []
        self._block_of_kv: dict[int, int] = {}
        self._checkpoint_of_slot: dict[int, _Checkpoint] = {}

    def take(self) -> list[CacheEvent]:
        """The events since the last call, oldest first; the log is empty after. O(1)."""
        events, self._queue = self._queue, []
        return events

    def __len__(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------------------------- observers
    def inserted(self, done: TreeInsert) -> None:
        """Record what an insert added (a new leaf's blocks and checkpoint, or a checkpoint on a
        tombstone) and the checkpoints the per-path cap took. ``done.node`` is still attached. O(new
        tokens + capped)."""
        node = done.node
        if done.new_kv is not None:  # a new leaf: its blocks, then its checkpoint
            self._store_blocks(node, done.new_kv.tolist())
            self._store_checkpoint(node)
        elif not done.mamba_exists and node.parent is not None:  # a tombstone took the checkpoint
            self._store_checkpoint(node)
        for slot in done.capped_slots:
            self._remove_checkpoint(slot, "capped")

    def released(self, freed: Freed) -> None:
        """Record what an eviction released: each checkpoint first (``dropped`` if its block went too,
        else ``evicted``), then the blocks, in one :class:`BlockRemoved`. O(freed tokens / page_size +
        freed slots)."""
        page = self.page_size
        firsts: list[int] = []
        for kv in freed.kv:  # each chunk is one node's value: whole pages, so every page_size-th is a start
            firsts += kv[::page].tolist() if page > 1 else kv.tolist()
        if freed.slots:
            gone = set(firsts)
            for slot in freed.slots:
                mark = self._checkpoint_of_slot.get(slot)
                reason: RemovedReason = "dropped" if mark is not None and mark.block_kv in gone else "evicted"
                self._remove_checkpoint(slot, reason)
        if firsts:
            blocks = self._block_of_kv
            self._queue.append(BlockRemoved([blocks.pop(i) for i in firsts]))

    # ------------------------------------------------------------------------------------- internals
    def _store_blocks(self, leaf: TreeNode, kv: list[int]) -> None:
        page = self.page_size
        parent = leaf.parent
        assert parent is not None
        parent_hash = None
        if parent.parent is not None:  # not the root: chain onto the parent's last block
            parent_hash = self._block_of_kv[int(parent.value[-page])]
        view = memoryview(leaf.key).cast("B")
        hashes = _chain(_start_bytes(parent_hash, leaf.extra_key), view, page)
        blocks = self._block_of_kv
        for first, block_hash in zip(kv[::page], hashes, strict=True):
            blocks[first] = block_hash
        self._queue.append(BlockStored(hashes, parent_hash, leaf.key.tolist(), page))

    def _store_checkpoint(self, node: TreeNode) -> None:
        slot = node.mamba_slot
        assert slot is not None
        block_kv = int(node.value[-self.page_size])
        mark = _Checkpoint(self._block_of_kv[block_kv], node.depth, block_kv)
        self._checkpoint_of_slot[slot] = mark
        self._queue.append(CheckpointStored(mark.block_hash, mark.depth_tokens, self.tier))

    def _remove_checkpoint(self, slot: int, reason: RemovedReason) -> None:
        mark = self._checkpoint_of_slot.pop(slot)
        self._queue.append(CheckpointRemoved(mark.block_hash, mark.depth_tokens, reason, self.tier))


# --------------------------------------------------------------------------------------------- replay
@dataclass
class PrefixIndex:
    """A router's copy of one cache, rebuilt from its events (:meth:`apply`): the blocks (hash -> parent
    hash) and the checkpoints (hash -> depth in tokens) per tier. Strict: an event that does not fit what
    came before (a block stored twice or removed unknown, a checkpoint on an unknown block, a block
    removed under a checkpoint) raises :class:`InvalidArgument`, so a lost or reordered event shows."""

    blocks: dict[int, int | None] = field(default_factory=dict)
    checkpoints: dict[Tier, dict[int, int]] = field(default_factory=lambda: {"device": {}, "host": {}})

    def apply(self, events: Iterable[CacheEvent]) -> None:
        """Apply ``events`` in order. O(blocks named)."""
        for event in events:
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                if parent is not None and parent not in self.blocks:
                    raise InvalidArgument(f"BlockStored under unknown parent block {parent}")
                for block_hash in event.block_hashes:
                    if block_hash in self.blocks:
                        raise InvalidArgument(f"block {block_hash} stored twice")
                    self.blocks[block_hash] = parent
                    parent = block_hash
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    if block_hash not in self.blocks:
                        raise InvalidArgument(f"BlockRemoved of unknown block {block_hash}")
                    if any(block_hash in held for held in self.checkpoints.values()):
                        raise InvalidArgument(f"block {block_hash} removed under a live checkpoint")
                    del self.blocks[block_hash]
            elif isinstance(event, CheckpointStored):
                held = self.checkpoints[event.tier]
                if event.block_hash not in self.blocks or event.block_hash in held:
                    raise InvalidArgument(
                        f"CheckpointStored at unknown or checkpointed block {event.block_hash}"
                    )
                held[event.block_hash] = event.depth_tokens
            elif isinstance(event, CheckpointRemoved):
                if self.checkpoints[event.tier].pop(event.block_hash, None) is None:
                    raise InvalidArgument(f"CheckpointRemoved of unknown checkpoint {event.block_hash}")
            else:
                raise InvalidArgument(f"not a cache event: {type(event).__name__}")

    def reusable_tokens(self, tokens: Sequence[int], page_size: int, extra_key: str | None = None) -> int:
        """How many leading tokens of a prompt the cache could reuse: the depth of the deepest checkpoint
        on the prompt's block path (0 if none). What a router ranks engines by. O(len(tokens))."""
        held = self.checkpoints["device"]
        best = 0
        for i, block_hash in enumerate(chain_block_hashes(tokens, page_size, extra_key=extra_key)):
            if block_hash not in self.blocks:
                break
            if block_hash in held:
                best = (i + 1) * page_size
        return best
