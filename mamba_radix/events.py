"""Cache events for a router: which KV blocks and which checkpoints a cache holds, as a stream.

A KV-aware router keeps a copy of each engine's prefix tree from its events and sends a prompt where
its prefix is cached. SGLang's events say where KV blocks are (:class:`BlockStored`,
:class:`BlockRemoved`, SGLang's field names), but for a hybrid model a block's KV is reusable only up to
the deepest *checkpoint* (a Mamba state) on its path: a router that sees only KV counts hits the engine
then throws away. So the stream here also says where checkpoints are (:class:`CheckpointStored`,
:class:`CheckpointRemoved`), each at the hash of the block it sits at, with its depth and tier.

The contract (``property_tests/test_events.py`` checks it over a state machine that drives the whole
lifecycle with eviction, ``property_tests/test_events_host.py`` with the host tier on): replaying every
event taken so far (:class:`PrefixIndex`) gives exactly the cache's KV blocks and exactly its
checkpoints, block for block, on each tier; a checkpoint is always announced after the blocks of its
prefix and retracted before them, so the stream never advertises a prefix whose state is gone. Schema
and a router's use: ``docs/events.md``.

The host tier (``config.host_tier``) publishes per medium, as SGLang's HiCache does: a block's KV events
carry ``medium`` (:data:`DEVICE_MEDIUM` or :data:`HOST_MEDIUM`, SGLang's ``StorageMedium`` values), a
checkpoint's events their ``tier``. A backup stores the host block or host checkpoint; a demotion
removes the device ones, the host copies stay; a load-back (or an insert through host-only nodes)
stores the device blocks again, and the load-back the device checkpoint; host eviction and the per-path
cap under ``host_path_cap="drop"`` remove host copies. A host checkpoint sits on a host block, except
under ``write_back``, which copies an internal checkpoint alone when the device drops it (a load-back
then copies the state only, the KV is on the device): that checkpoint's block is a device block.

Blocks: one block per page (``page_size`` tokens; page size 1: one block per token, as SGLang does). A
block's hash chains its tokens onto its parent block's hash (the first block of a prefix onto a seed of
its namespace, the key's ``extra_key``), so equal prefixes get equal hashes on every engine and a router
computes a prompt's hashes itself (:func:`chain_block_hashes`). The hash is 64-bit BLAKE2b as a signed
int (SGLang's events carry signed int64 too); its own scheme, not SGLang's SHA-256 one, so a consumer
treats the values as opaque ids, as SGLang's documentation asks. A block has the same hash on both tiers.

:class:`EventLog` is what the cache feeds: :meth:`~EventLog.inserted` with each insert's
:class:`~mamba_radix.tree_results.TreeInsert`, :meth:`~EventLog.released` with each eviction's
:class:`~mamba_radix.tree_results.Freed` (the tree decides, the cache frees, the log observes what the
cache frees), and, with the host tier, each backup, load-back and capped host copy. A cache built
without events holds no log and pays one attribute test per insert, eviction, backup and load-back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal

import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.node import TreeNode
from mamba_radix.token_ids import as_token_ids
from mamba_radix.tree_results import Freed, TreeInsert

__all__ = [
    "DEVICE_MEDIUM",
    "HOST_MEDIUM",
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

# the media SGLang's KV events name (the values of its StorageMedium: GPU for device memory, CPU_PINNED for
# host memory, what its HiCache publishes); the checkpoint events' ``tier`` is this project's own word for
# the same places
DEVICE_MEDIUM = "GPU"
HOST_MEDIUM = "CPU_PINNED"
Tier = Literal["device", "host"]
_TIER_OF_MEDIUM: dict[str | None, Tier] = {DEVICE_MEDIUM: "device", HOST_MEDIUM: "host"}
# why a checkpoint went: "evicted" (state eviction took it, its block's KV stays: a tombstone), "dropped"
# (its block's KV went in the same eviction), "capped" (the per-path cap, mamba_max_states_per_path)
# With the host tier the same words per tier: a stale host checkpoint that host eviction takes is
# "evicted" (its host KV stays), one that leaves with its node "dropped", one the cap frees "capped".
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
    ``medium`` (``"GPU"``: device memory; ``"CPU_PINNED"``: the host tier's copy)."""

    kind: ClassVar[str] = "BlockStored"
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = DEVICE_MEDIUM

    def to_dict(self) -> dict[str, object]:
        """The event as a tagged map (``type`` is the class name), as SGLang encodes its events."""
        return {"type": self.kind, **asdict(self)}


@dataclass(slots=True)
class BlockRemoved:
    """KV blocks the cache no longer holds on ``medium`` (SGLang's shape). Every checkpoint that needed
    them there was retracted before, in the same batch or earlier."""

    kind: ClassVar[str] = "BlockRemoved"
    block_hashes: list[int]
    medium: str | None = DEVICE_MEDIUM

    def to_dict(self) -> dict[str, object]:
        return {"type": self.kind, **asdict(self)}


@dataclass(slots=True)
class CheckpointStored:
    """A checkpoint (the recurrent state after ``depth_tokens`` tokens) now sits at the end of block
    ``block_hash`` on ``tier``: the prefix ending with that block is reusable (from the host: after a
    load-back). Announced after the block itself on that tier (see the module docstring for
    ``write_back``'s host checkpoints on device blocks)."""

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


def _page_starts(indices: torch.Tensor, page_size: int) -> list[int]:
    """The first index of each page of ``indices`` (one node's KV indices or host rows: whole pages).
    O(len(indices) / page_size)."""
    return indices[::page_size].tolist() if page_size > 1 else indices.tolist()


class EventLog:
    """The events of one cache since the last :meth:`take`, and what it needs to name what is freed.

    Per tier it keeps two maps, exact while the tree changes only through the cache (inserts, evictions,
    backups, load-backs): the first KV index of each block (a device KV index; on the host, a host KV
    row) to the block's hash, and each checkpoint's slot (a device slot; a host slot) to its block and
    depth. An eviction hands back only indices and slots (``Freed``), so these maps are how a removal is
    named; a backup names its host blocks by the device blocks it copies, a load-back its device blocks
    by the host blocks it copies (no hashing). Memory: one entry per block and per checkpoint on each
    tier.
    """

    __slots__ = (
        "_block_of_kv",
        "_checkpoint_of_slot",
        "_host_block_of_row",
        "_host_checkpoint_of_slot",
        "_queue",
        "page_size",
    )

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._queue: list[CacheEvent] = []
        self._block_of_kv: dict[int, int] = {}
        self._checkpoint_of_slot: dict[int, _Checkpoint] = {}
        self._host_block_of_row: dict[int, int] = {}
        self._host_checkpoint_of_slot: dict[int, _Checkpoint] = {}

    def take(self) -> list[CacheEvent]:
        """The events since the last call, oldest first; the log is empty after. O(1)."""
        events, self._queue = self._queue, []
        return events

    def __len__(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------------------------- observers
    def inserted(self, done: TreeInsert) -> None:
        """Record what an insert added (host-only nodes it revived with the caller's KV, then a new leaf's
        blocks and checkpoint, or a checkpoint on a tombstone) and the checkpoints the per-path cap took.
        ``done.node`` is still attached. O(new tokens + revived tokens / page_size + capped)."""
        node = done.node
        if done.revived_kv is not None:  # the revived nodes end the path: the new leaf hangs below them
            bottom = node if done.new_kv is None else node.parent
            assert bottom is not None
            self._store_revived(bottom, done.revived_kv.numel())
        if done.new_kv is not None:  # a new leaf: its blocks, then its checkpoint
            self._store_blocks(node, done.new_kv.tolist())
            self._store_checkpoint(node)
        elif not done.mamba_exists and node.parent is not None:  # a tombstone took the checkpoint
            self._store_checkpoint(node)
        for slot in done.capped_slots:
            self._remove_checkpoint(slot, "capped")

    def released(self, freed: Freed) -> None:
        """Record what an eviction released, on either tier: each checkpoint first (``dropped`` if its
        block went too, else ``evicted``), then the device blocks in one :class:`BlockRemoved`, the host
        blocks in another. O(freed tokens / page_size + freed slots)."""
        device_gone = self._pop_blocks(freed.kv, self._block_of_kv) if freed.kv else []
        host_gone = self._pop_blocks(freed.host_kv, self._host_block_of_row) if freed.host_kv else []
        if freed.slots or freed.host_slots:
            gone = {*device_gone, *host_gone}
            for slot in freed.slots:
                self._retract(self._checkpoint_of_slot.pop(slot), gone, "device")
            for slot in freed.host_slots:
                self._retract(self._host_checkpoint_of_slot.pop(slot), gone, "host")
        if device_gone:
            self._queue.append(BlockRemoved(device_gone))
        if host_gone:
            self._queue.append(BlockRemoved(host_gone, HOST_MEDIUM))

    def backed_up_kv(self, node: TreeNode) -> None:
        """Record a host copy of device-resident ``node``'s KV (``node.host_kv``, just set; its parent's KV
        is on the host, or it is the root): its blocks on the host, chained onto the parent's last host
        block. O(tokens / page_size)."""
        page, parent = self.page_size, node.parent
        assert parent is not None and node.value is not None and node.host_kv is not None
        parent_hash = None
        if parent.parent is not None:  # not the root: the host tier is a subtree, the parent's KV is there
            assert parent.host_kv is not None
            parent_hash = self._host_block_of_row[int(parent.host_kv[-page])]
        blocks, host = self._block_of_kv, self._host_block_of_row
        hashes = [blocks[first] for first in _page_starts(node.value, page)]
        for row, block_hash in zip(_page_starts(node.host_kv, page), hashes, strict=True):
            host[row] = block_hash
        self._queue.append(BlockStored(hashes, parent_hash, node.key.tolist(), page, medium=HOST_MEDIUM))

    def backed_up_state(self, node: TreeNode) -> None:
        """Record a host copy of ``node``'s checkpoint (``node.host_slot``, just set): at its last host
        block, or at its last device block when its KV has no host copy (``write_back`` copies an internal
        checkpoint alone). O(1)."""
        slot, page = node.host_slot, self.page_size
        assert slot is not None
        if node.host_kv is not None:
            block_hash = self._host_block_of_row[int(node.host_kv[-page])]
        else:
            assert node.value is not None
            block_hash = self._block_of_kv[int(node.value[-page])]
        self._host_checkpoint_of_slot[slot] = _Checkpoint(block_hash, node.depth)
        self._queue.append(CheckpointStored(block_hash, node.depth, "host"))

    def host_capped(self, host_slots: Iterable[int]) -> None:
        """Record host checkpoints the per-path cap freed (``host_path_cap="drop"``); the nodes stay.
        O(slots)."""
        marks = self._host_checkpoint_of_slot
        for slot in host_slots:
            mark = marks.pop(slot)
            self._queue.append(CheckpointRemoved(mark.block_hash, mark.depth_tokens, "capped", "host"))

    def loaded(self, nodes: Sequence[TreeNode], target: TreeNode) -> None:
        """Record a load-back: ``nodes`` (top-down; host-only before, device-resident now) are device
        blocks again, then ``target`` holds a device checkpoint. O(tokens / page_size)."""
        self._promote(nodes)
        self._store_checkpoint(target)

    # ------------------------------------------------------------------------------------- internals
    def _last_block(self, node: TreeNode) -> int | None:
        """The hash of device-resident ``node``'s last device block; None for the root."""
        if node.parent is None:
            return None
        assert node.value is not None
        return self._block_of_kv[int(node.value[-self.page_size])]

    def _store_blocks(self, leaf: TreeNode, kv: list[int]) -> None:
        page = self.page_size
        parent = leaf.parent
        assert parent is not None
        parent_hash = self._last_block(parent)
        view = memoryview(leaf.key).cast("B")
        hashes = _chain(_start_bytes(parent_hash, leaf.extra_key), view, page)
        blocks = self._block_of_kv
        for first, block_hash in zip(kv[::page], hashes, strict=True):
            blocks[first] = block_hash
        self._queue.append(BlockStored(hashes, parent_hash, leaf.key.tolist(), page))

    def _store_revived(self, bottom: TreeNode, num_tokens: int) -> None:
        """The chain of nodes an insert revived, ``num_tokens`` in all, ending at ``bottom``."""
        chain = []
        while num_tokens > 0:
            chain.append(bottom)
            num_tokens -= len(bottom.key)
            bottom = bottom.parent  # type: ignore[assignment]
        assert num_tokens == 0
        self._promote(chain[::-1])

    def _promote(self, nodes: Iterable[TreeNode]) -> None:
        """Device blocks again for ``nodes`` (top-down), named by their host blocks: one
        :class:`BlockStored` each."""
        page, host, blocks = self.page_size, self._host_block_of_row, self._block_of_kv
        for node in nodes:
            assert node.value is not None and node.host_kv is not None and node.parent is not None
            hashes = [host[row] for row in _page_starts(node.host_kv, page)]
            for first, block_hash in zip(_page_starts(node.value, page), hashes, strict=True):
                blocks[first] = block_hash
            self._queue.append(BlockStored(hashes, self._last_block(node.parent), node.key.tolist(), page))

    def _store_checkpoint(self, node: TreeNode) -> None:
        slot = node.mamba_slot
        assert slot is not None
        block_hash = self._last_block(node)
        assert block_hash is not None
        self._checkpoint_of_slot[slot] = _Checkpoint(block_hash, node.depth)
        self._queue.append(CheckpointStored(block_hash, node.depth))

    def _remove_checkpoint(self, slot: int, reason: RemovedReason) -> None:
        mark = self._checkpoint_of_slot.pop(slot)
        self._queue.append(CheckpointRemoved(mark.block_hash, mark.depth_tokens, reason))

    def _retract(self, mark: _Checkpoint, gone: set[int], tier: Tier) -> None:
        reason: RemovedReason = "dropped" if mark.block_hash in gone else "evicted"
        self._queue.append(CheckpointRemoved(mark.block_hash, mark.depth_tokens, reason, tier))

    def _pop_blocks(self, chunks: list[torch.Tensor], blocks: dict[int, int]) -> list[int]:
        """Forget the blocks of ``chunks`` (one node's indices each: whole pages); their hashes."""
        page = self.page_size
        firsts: list[int] = []
        for kv in chunks:
            firsts += _page_starts(kv, page)
        pop = blocks.pop
        return [pop(first) for first in firsts]


# --------------------------------------------------------------------------------------------- replay
@dataclass
class PrefixIndex:
    """A router's copy of one cache, rebuilt from its events (:meth:`apply`): the blocks per tier (hash ->
    parent hash; ``blocks`` on the device, ``host_blocks`` on the host) and the checkpoints per tier (hash
    -> depth in tokens). A device checkpoint needs its block on the device, a host checkpoint its block on
    either tier (on the device: a ``write_back`` copy of an internal checkpoint). Strict: an event that
    does not fit what came before (a block stored twice on a tier or removed unknown, a block stored
    under a parent its tier does not hold, a checkpoint on a block it cannot sit at, a block removed
    under a checkpoint that needs it, an unknown medium) raises :class:`InvalidArgument`, so a lost or
    reordered event shows."""

    blocks: dict[int, int | None] = field(default_factory=dict)
    host_blocks: dict[int, int | None] = field(default_factory=dict)
    checkpoints: dict[Tier, dict[int, int]] = field(default_factory=lambda: {"device": {}, "host": {}})

    def apply(self, events: Iterable[CacheEvent]) -> None:
        """Apply ``events`` in order. O(blocks named)."""
        for event in events:
            if isinstance(event, BlockStored):
                blocks = self._blocks_on(event.medium)
                parent = event.parent_block_hash
                if parent is not None and parent not in blocks:
                    raise InvalidArgument(
                        f"BlockStored under unknown parent block {parent} on {event.medium}"
                    )
                for block_hash in event.block_hashes:
                    if block_hash in blocks:
                        raise InvalidArgument(f"block {block_hash} stored twice on {event.medium}")
                    blocks[block_hash] = parent
                    parent = block_hash
            elif isinstance(event, BlockRemoved):
                blocks = self._blocks_on(event.medium)
                on_device = blocks is self.blocks
                other = self.host_blocks if on_device else self.blocks
                device_held, host_held = self.checkpoints["device"], self.checkpoints["host"]
                for block_hash in event.block_hashes:
                    if block_hash not in blocks:
                        raise InvalidArgument(f"BlockRemoved of unknown block {block_hash} on {event.medium}")
                    if (on_device and block_hash in device_held) or (
                        block_hash in host_held and block_hash not in other
                    ):
                        raise InvalidArgument(f"block {block_hash} removed under a live checkpoint")
                    del blocks[block_hash]
            elif isinstance(event, CheckpointStored):
                held = self.checkpoints[event.tier]
                known = event.block_hash in self.blocks or (
                    event.tier == "host" and event.block_hash in self.host_blocks
                )
                if not known or event.block_hash in held:
                    raise InvalidArgument(
                        f"CheckpointStored at unknown or checkpointed block {event.block_hash} ({event.tier})"
                    )
                held[event.block_hash] = event.depth_tokens
            elif isinstance(event, CheckpointRemoved):
                if self.checkpoints[event.tier].pop(event.block_hash, None) is None:
                    raise InvalidArgument(
                        f"CheckpointRemoved of unknown checkpoint {event.block_hash} ({event.tier})"
                    )
            else:
                raise InvalidArgument(f"not a cache event: {type(event).__name__}")

    def _blocks_on(self, medium: str | None) -> dict[int, int | None]:
        tier = _TIER_OF_MEDIUM.get(medium)
        if tier is None:
            raise InvalidArgument(
                f"unknown medium {medium!r}; this index keeps {DEVICE_MEDIUM!r} and {HOST_MEDIUM!r} blocks"
            )
        return self.blocks if tier == "device" else self.host_blocks

    def reusable_tokens(
        self, tokens: Sequence[int], page_size: int, extra_key: str | None = None, *, with_host: bool = False
    ) -> int:
        """How many leading tokens of a prompt the cache could reuse: the depth of the deepest checkpoint
        on the prompt's block path (0 if none). What a router ranks engines by. ``with_host``: after a
        load-back, so blocks and checkpoints on either tier count (the difference to the device's answer
        is what the engine loads from the host instead of recomputing). O(len(tokens))."""
        device_held, host_held = self.checkpoints["device"], self.checkpoints["host"]
        blocks, host_blocks = self.blocks, self.host_blocks
        best = 0
        for i, block_hash in enumerate(chain_block_hashes(tokens, page_size, extra_key=extra_key)):
            if block_hash not in blocks and not (with_host and block_hash in host_blocks):
                break
            if block_hash in device_held or (with_host and block_hash in host_held):
                best = (i + 1) * page_size
        return best
