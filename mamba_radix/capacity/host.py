"""The host tier's sizing: how host memory splits into host KV tokens and host state slots.

SGLang sizes both host pools from one number (``--hicache-ratio`` R: each host pool R x its device pool;
``--hicache-size`` G: G GB split in proportion to the device pools' bytes). That keeps the device's ratio
of KV tokens to state slots, which was chosen for *running* requests, not for what the host keeps: a host
checkpoint is worth something only where a later request resumes, and each one needs the KV of its whole
prefix on the host too. With too few host slots for the host KV, the KV is stranded (SGLang #39436: 565
host slots for 2.68M host KV tokens gave 0 of 8 host hits, 734 gave 8 of 8); with too many, the slots are.

The planner's rule (:func:`planned_split`): replay the workload's prefix tree once, uncapped
(:func:`workload_coverage`), count its distinct KV tokens and its *resumable points* (every distinct
sequence end, the state a follow-up request resumes from, and every branch point, where two sequences part),
and give the host one state slot per KV tokens a host copy covers under the write policy
(:meth:`WorkloadCoverage.tokens_per_copy`), the same bytes as the other split.
The bytes are exact: ``kv_tokens x bytes_per_kv_token + state_slots x bytes_per_state_slot``
(:attr:`HostSplit.total_bytes`), never more than the host bytes, less by under one KV page.

Use::

    cov = workload_coverage(requests)                        # one pass over the workload
    ratio = ratio_split(kv, slots, 4.0, page, kv_b, slot_b)   # SGLang's --hicache-ratio 4 (rounded down)
    ours = planned_split(ratio.total_bytes, kv_b, slot_b, cov.tokens_per_copy("resumable"), page)

No side effects; nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mamba_radix.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.sim.traces import TraceRequest

__all__ = [
    "HOST_SPLITS",
    "HostPlan",
    "HostSplit",
    "WorkloadCoverage",
    "hicache_size_split",
    "length_coverage",
    "plan_host",
    "planned_split",
    "ratio_split",
    "workload_coverage",
]

# how host bytes split between the host pools: SGLang's (each pool R x the device's) or the planner's
HOST_SPLITS: tuple[str, ...] = ("ratio", "planned")
GB = 10**9  # SGLang's --hicache-size unit (pool_host: host_size * 1e9 // size_per_token)

# symbols of a block trace's sequences beyond the block ids (which are < 2**63 / block_size): a partial last
# block and a request's own tail (its unshared tail tokens and output) each get a fresh one
_PARTIAL_BASE = 1 << 62
_SUFFIX_BASE = 1 << 63


@dataclass(frozen=True)
class WorkloadCoverage:
    """What a workload's prefix tree holds when nothing is evicted: ``kv_tokens`` distinct KV tokens,
    ``sequence_ends`` distinct cached sequences (each request's input and all but its last output token),
    ``branch_points`` nodes where two sequences part (the root excluded), ``resumable_points`` the union of
    the two (a sequence end may also be a branch point). ``chunk_points``: the prefill checkpoints besides
    those (one per prefill chunk of each request's uncached input, the input's end included unless it is
    the sequence's end): 0 when not counted (:func:`workload_coverage` without ``chunk_tokens``)."""

    requests: int
    kv_tokens: int
    sequence_ends: int
    branch_points: int
    resumable_points: int
    chunk_points: int = 0

    @property
    def tokens_per_point(self) -> float:
        """KV tokens a resumable checkpoint covers on this workload (>= 1 when there are points): what a
        host copy costs in KV under a placement that backs up resumable points only."""
        return self.kv_tokens / self.resumable_points if self.resumable_points else 0.0

    @property
    def tokens_per_checkpoint(self) -> float:
        """KV tokens a checkpoint of the tree covers (resumable points and prefill chunk checkpoints): what a
        host copy costs in KV under a placement that backs up every checkpoint (SGLang's write policies)."""
        points = self.resumable_points + self.chunk_points
        return self.kv_tokens / points if points else 0.0

    @property
    def tokens_per_resumable_copy(self) -> float:
        """KV tokens a host copy covers under our ``resumable`` placement: the geometric mean of
        :attr:`tokens_per_point` and :attr:`tokens_per_checkpoint`. It copies every resumable point and the
        other checkpoints only into free host memory, so the checkpoints it holds lie between the two
        counts, and how many of the others find room depends on the run; the geometric mean is off from
        either end by at most the square root of their ratio, the least worst-case factor. Measured on the
        Mooncake conversation trace (docs/host-tier.md): better than either end at 16 GiB and within 2% of
        the better one at 32 GiB, equal on chat. O(1)."""
        return math.sqrt(self.tokens_per_point * self.tokens_per_checkpoint)

    def tokens_per_copy(self, host_write_policy: str) -> float:
        """:attr:`tokens_per_resumable_copy` for the ``resumable`` placement, :attr:`tokens_per_checkpoint`
        for the policies that copy every checkpoint (``write_through``, ``write_through_selective``,
        ``write_back``). O(1)."""
        if host_write_policy == "resumable":
            return self.tokens_per_resumable_copy
        return self.tokens_per_checkpoint

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "tokens_per_point": self.tokens_per_point,
            "tokens_per_checkpoint": self.tokens_per_checkpoint,
            "tokens_per_resumable_copy": self.tokens_per_resumable_copy,
        }


@dataclass(frozen=True)
class HostSplit:
    """Host pool sizes and their bytes, exactly: ``total_bytes = kv_bytes + state_bytes``. ``rule`` says
    which split made them (``ratio``, ``hicache_size`` or ``planned``)."""

    rule: str
    kv_tokens: int
    state_slots: int
    bytes_per_kv_token: int
    bytes_per_state_slot: int

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.bytes_per_kv_token

    @property
    def state_bytes(self) -> int:
        return self.state_slots * self.bytes_per_state_slot

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.state_bytes

    @property
    def tokens_per_slot(self) -> float:
        """Host KV tokens per host state slot (the number #39436 got wrong)."""
        return self.kv_tokens / self.state_slots

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total_bytes": self.total_bytes, "tokens_per_slot": self.tokens_per_slot}


# ------------------------------------------------------------------------------------------- validation
def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _ratio(value: object) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgument(f"the host ratio must be a number > 0 (host pool / device pool), got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------------------------- splits
def ratio_split(
    device_kv_tokens: int,
    device_state_slots: int,
    ratio: float,
    page_size: int,
    bytes_per_kv_token: int,
    bytes_per_state_slot: int,
) -> HostSplit:
    """SGLang's ``--hicache-ratio``: each host pool ``ratio`` x its device pool, host KV rounded down to
    whole pages (at least one page and one slot; SGLang rounds up, one page more). Raises
    :class:`InvalidArgument` for a size or ratio out of range. O(1)."""
    kv, slots = (
        _positive_int("device_kv_tokens", device_kv_tokens),
        _positive_int("device_state_slots", device_state_slots),
    )
    r, page = _ratio(ratio), _positive_int("page_size", page_size)
    bkv, bslot = (
        _positive_int("bytes_per_kv_token", bytes_per_kv_token),
        _positive_int("bytes_per_state_slot", bytes_per_state_slot),
    )
    return HostSplit("ratio", max(page, int(r * kv) // page * page), max(1, int(r * slots)), bkv, bslot)


def hicache_size_split(
    host_bytes: int,
    device_kv_bytes: int,
    device_state_bytes: int,
    page_size: int,
    bytes_per_kv_token: int,
    bytes_per_state_slot: int,
) -> HostSplit:
    """SGLang's ``--hicache-size``: ``host_bytes`` split in proportion to the device pools' bytes, each
    part in whole rows (KV rounded down to pages). That is :func:`ratio_split` at ``host_bytes / device
    bytes``. Raises :class:`InvalidArgument` when a part holds no page or no slot. O(1)."""
    total = _positive_int("host_bytes", host_bytes)
    dkv, dst = (
        _positive_int("device_kv_bytes", device_kv_bytes),
        _positive_int("device_state_bytes", device_state_bytes),
    )
    page = _positive_int("page_size", page_size)
    bkv, bslot = (
        _positive_int("bytes_per_kv_token", bytes_per_kv_token),
        _positive_int("bytes_per_state_slot", bytes_per_state_slot),
    )
    kv = total * dkv // (dkv + dst) // bkv // page * page
    slots = total * dst // (dkv + dst) // bslot
    if kv < page or slots < 1:
        raise InvalidArgument(
            f"host memory of {total:,} B split as the device pools' bytes gives {kv} KV tokens and {slots} state "
            "slots; give at least one KV page and one state slot of host memory"
        )
    return HostSplit("hicache_size", kv, slots, bkv, bslot)


def planned_split(
    host_bytes: int,
    bytes_per_kv_token: int,
    bytes_per_state_slot: int,
    tokens_per_point: float,
    page_size: int = 1,
) -> HostSplit:
    """The planner's split of ``host_bytes``: one host state slot per ``tokens_per_point`` host KV tokens
    (:attr:`WorkloadCoverage.tokens_per_point`), so that neither pool strands the other. Slots are rounded
    to the nearest integer and clamped to [1, what leaves one KV page]; the KV pool gets the rest in whole
    pages, so ``host_bytes - total_bytes < page_size x bytes_per_kv_token``.

    Raises :class:`InvalidArgument` for host bytes that do not fit one KV page and one state slot, or a
    ``tokens_per_point`` that is not a number > 0. O(1)."""
    total = _positive_int("host_bytes", host_bytes)
    bkv, bslot = (
        _positive_int("bytes_per_kv_token", bytes_per_kv_token),
        _positive_int("bytes_per_state_slot", bytes_per_state_slot),
    )
    page = _positive_int("page_size", page_size)
    t = tokens_per_point
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        raise InvalidArgument(
            f"tokens_per_point must be a number > 0 (KV tokens one host copy covers), got {t!r}"
        )
    page_bytes = page * bkv
    if total < page_bytes + bslot:
        raise InvalidArgument(
            f"host memory of {total:,} B does not fit one KV page ({page_bytes:,} B) and one state slot "
            f"({bslot:,} B); give at least {page_bytes + bslot:,} B"
        )
    # the real-valued optimum: kv x bkv + (kv / t) x bslot = total
    slots = math.floor(total / (bkv * t + bslot) + 0.5)
    slots = min(max(slots, 1), (total - page_bytes) // bslot)
    kv = (total - slots * bslot) // bkv // page * page
    return HostSplit("planned", kv, slots, bkv, bslot)


# ------------------------------------------------------------------------------------------- coverage
def workload_coverage(requests: Iterable[TraceRequest], chunk_tokens: int | None = None) -> WorkloadCoverage:
    """The workload's prefix tree, uncapped: each request caches its input and all but its last output
    token (the last token's KV is never computed), as the engine inserts them.

    Token requests are compared token by token. A block request is a chain of block ids (its last block,
    if partial, a symbol of its own: exact unless two requests hold one block id at different lengths)
    followed by one symbol for its own tokens (unshared tail and output), weighted by their token counts.
    The sequences are sorted once; adjacent ones give the longest common prefixes, whose Cartesian tree
    gives the branch points. O(S log n) for n requests of S symbols in all (S = tokens for a token trace,
    blocks for a block trace); memory 8 bytes a symbol. Raises :class:`InvalidArgument` for no request.

    ``chunk_tokens`` (the prefill chunk, ``chunked_prefill_size``; -1: no chunking) also counts the prefill
    checkpoints, as extra_buffer takes them: each request prefills its input beyond the longest prefix an
    earlier request cached (:mod:`mamba_radix.sim.ideal`, in trace order) in chunks, one checkpoint at each
    chunk's end. O(S) more."""
    from mamba_radix.sim.ideal import ideal_for

    keys: list[bytes] = []
    weights: list[np.ndarray | None] = []  # cumulative token weight per symbol; None: one token a symbol
    partial: dict[tuple[int, int], int] = {}
    count = chunk_points = 0
    ideal = None
    for req in requests:
        count += 1
        if chunk_tokens is not None:
            ideal = ideal or ideal_for(req)
            new = req.input_len - ideal.observe(req)
            chunks = 1 if chunk_tokens <= 0 else -(-new // chunk_tokens)
            chunk_points += chunks - (1 if req.output_len <= 1 else 0)
        if req.block_ids is None:
            seq = np.asarray(list(req.input_ids) + list(req.output_ids)[:-1], dtype=np.uint64)
            keys.append(seq.astype(">u8").tobytes())
            weights.append(None)
            continue
        size = req.block_size
        chain = req.input_len - req.tail_len
        full, rest = divmod(chain, size)
        ids = [int(b) for b in req.block_ids[: full + (1 if rest else 0)]]
        w = [size] * full
        if rest:
            ids[-1] = partial.setdefault((ids[-1], rest), _PARTIAL_BASE + len(partial))
            w.append(rest)
        own = req.tail_len + max(req.output_len - 1, 0)
        if own:
            ids.append(_SUFFIX_BASE + req.index)
            w.append(own)
        keys.append(np.asarray(ids, dtype=">u8").tobytes())
        weights.append(np.concatenate(([0], np.cumsum(w, dtype=np.int64))))
    if count == 0:
        raise InvalidArgument("the workload has no request; give a trace or workload with at least one")
    order = sorted(range(count), key=keys.__getitem__)

    def weight(i: int, symbols: int) -> int:
        cum = weights[i]
        return symbols if cum is None else int(cum[symbols])

    tokens = distinct = interior = 0
    stack: list[list[int]] = []  # [depth in symbols, is_end, is_branch] of the nodes on the current path
    nodes: list[list[int]] = []
    prev = -1
    for i in order:
        key = keys[i]
        length = len(key) // 8
        if prev < 0:
            tokens += weight(i, length)
            distinct += 1
            prev = i
            continue
        pkey = keys[prev]
        plen = len(pkey) // 8
        n = min(plen, length)
        a = np.frombuffer(pkey, dtype=">u8", count=n)
        b = np.frombuffer(key, dtype=">u8", count=n)
        diff = np.flatnonzero(a != b)
        lcp = int(diff[0]) if len(diff) else n
        if lcp == plen == length:  # the same sequence again
            continue
        distinct += 1
        tokens += weight(i, length) - weight(i, lcp)
        while stack and stack[-1][0] > lcp:
            stack.pop()
        if not stack or stack[-1][0] < lcp:
            stack.append([lcp, 0, 0])
            nodes.append(stack[-1])
        if lcp == plen:  # prev ends where this one goes on: a sequence end inside the tree
            stack[-1][1] = 1
            interior += 1
        else:
            stack[-1][2] = 1
        prev = i
    inner = [node for node in nodes if node[0] > 0]
    branch = sum(node[2] for node in inner)
    branch_only = sum(1 for node in inner if node[2] and not node[1])
    return WorkloadCoverage(count, tokens, distinct, branch, distinct + branch_only, chunk_points)


def length_coverage(
    num_requests: int, mean_input_len: float, mean_output_len: float, chunk_tokens: int | None = None
) -> WorkloadCoverage:
    """The coverage of a workload known by its lengths only (``plan --input-len/--output-len``): unique
    random prompts, as bench_serving's random dataset, share nothing, so every request is one resumable
    point covering its whole sequence, and (with ``chunk_tokens``) its input prefills in
    ``ceil(input / chunk)`` chunks with a checkpoint each. O(1)."""
    n = _positive_int("num_requests", num_requests)
    per = max(1, round(mean_input_len + mean_output_len - 1))
    chunks = 0
    if chunk_tokens is not None:
        chunks = 1 if chunk_tokens <= 0 else max(1, math.ceil(mean_input_len / chunk_tokens))
        chunks -= 1 if mean_output_len <= 1 else 0
    return WorkloadCoverage(n, n * per, n, 0, n, n * chunks)


# ------------------------------------------------------------------------------------------- the planner
@dataclass(frozen=True)
class HostPlan:
    """``plan --host-memory-gb``: the host bytes, the workload's coverage, the planner's split for our
    ``resumable`` placement (a slot per :attr:`WorkloadCoverage.tokens_per_resumable_copy` KV tokens) and for
    SGLang's write policies (a slot per checkpoint's KV), and SGLang's ``--hicache-size`` split of the same bytes (None without device pools to
    take its proportion from)."""

    host_bytes: int
    coverage: WorkloadCoverage
    resumable: HostSplit
    every_checkpoint: HostSplit
    sglang: HostSplit | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_bytes": self.host_bytes,
            "coverage": self.coverage.to_dict(),
            "planned_resumable": self.resumable.to_dict(),
            "planned_every_checkpoint": self.every_checkpoint.to_dict(),
            "sglang_hicache_size": None if self.sglang is None else self.sglang.to_dict(),
        }


def plan_host(
    host_bytes: int,
    coverage: WorkloadCoverage,
    page_size: int,
    bytes_per_kv_token: int,
    bytes_per_state_slot: int,
    device_kv_bytes: int | None = None,
    device_state_bytes: int | None = None,
) -> HostPlan:
    """The planner's splits of ``host_bytes`` for ``coverage`` (both placements) and, given the device
    pools' bytes, SGLang's split of the same bytes beside them. Raises :class:`InvalidArgument` as
    :func:`planned_split` and :func:`hicache_size_split` do (host bytes that do not fit one page and one
    slot, ...). O(1)."""
    if not coverage.resumable_points:
        raise InvalidArgument(
            "the workload has no resumable point; give a workload with at least one request"
        )
    args = (host_bytes, bytes_per_kv_token, bytes_per_state_slot)
    resumable = planned_split(*args, coverage.tokens_per_resumable_copy, page_size)
    every = planned_split(*args, coverage.tokens_per_checkpoint, page_size)
    sglang = None
    if device_kv_bytes and device_state_bytes:
        sglang = hicache_size_split(
            host_bytes,
            device_kv_bytes,
            device_state_bytes,
            page_size,
            bytes_per_kv_token,
            bytes_per_state_slot,
        )
    return HostPlan(host_bytes, coverage, resumable, every, sglang)
