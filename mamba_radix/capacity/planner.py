"""Workload-aware recommendation: what the official calculator leaves out (seed 000's list of gaps).

Seed 000 lists what SGLang's Kimi-K3 calculator ignores: the checkpoints chunked prefill stores per request
(so the right ratio depends on ``--chunked-prefill-size``), ``--mamba-max-states-per-path``, the 4-5 slots
reserved per running request, and that DCP removes the KV replication TP leaves (the ratio must then be
multiplied by the TP size). This module adds them on top of :mod:`mamba_radix.capacity.sizing`:

- :class:`Workload`: request shapes from fixed lengths, SGLang bench's random range, or a trace file;
- :func:`expected_checkpoints`: checkpoints one request takes and keeps, per strategy (also the function the
  simulator's measurements are compared with, see :func:`expected_workload_checkpoints`);
- :func:`balance`: the ``mamba_full_memory_ratio`` / ``max_mamba_cache_size`` at which both pools fill
  together at a target concurrency, and the highest concurrency a budget allows;
- :func:`compare_dcp`: the same for every DCP size the model allows at a TP size;
- :func:`plan`: all of it for one configuration (what ``mamba-radix plan`` prints), with the official
  calculator's answer beside it and the named steps between the two (:mod:`mamba_radix.capacity.official`).

Assumptions, stated once: a running request holds at its peak the KV of its whole sequence but the last
output token (``input + output - 1``: the last sampled token is never fed back, so its KV is never
computed; the simulator reserves exactly that at admission); requests start cold (a cached prefix can be
given per request to :func:`expected_checkpoints`). ``experiments/plan_vs_sim.py`` and
``property_tests/test_capacity_vs_sim.py`` check these predictions against the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mamba_radix.capacity.formats import FormatSizing, resolve_checkpoints
from mamba_radix.capacity.memory import GIB, Parallelism, kv_token_bytes
from mamba_radix.capacity.official import Comparison, compare
from mamba_radix.capacity.sizing import PoolResolution, SizingInputs, resolve_pools
from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError, TraceFileError, TraceFormatError
from mamba_radix.jsonl import iter_json_objects

__all__ = [
    "Balance",
    "CheckpointCount",
    "DcpOption",
    "Plan",
    "RequestShape",
    "Workload",
    "WorkloadCheckpoints",
    "balance",
    "compare_dcp",
    "decode_checkpoint_positions",
    "decode_slots_in_use",
    "expected_checkpoints",
    "expected_workload_checkpoints",
    "plan",
    "prefill_checkpoint_positions",
]

RANGE_POINTS = 65  # grid points per length for bench's random range (exact for fixed lengths)
# The longest request the planner takes, input + output tokens: SGLang's req_to_token table holds int32
# KV indices, so a sequence of 2**31 tokens or more cannot be served (and planning one would only loop).
MAX_REQUEST_TOKENS = 2**31 - 1
MAX_CONCURRENCY = 2**31 - 1


def _check_int(name: str, value: object, minimum: int, maximum: int) -> int:
    """``value`` as an int in ``[minimum, maximum]``, or :class:`ConfigError` naming argument ``name``. O(1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be in {minimum}..{maximum:,}, got {value:,}")
    return value


def _check_config(config: object) -> CacheConfig:
    if not isinstance(config, CacheConfig):
        raise ConfigError(f"config must be a CacheConfig, got {type(config).__name__}")
    return config


def _check_concurrency(concurrency: object) -> int:
    return _check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)


@dataclass(frozen=True)
class RequestShape:
    """One request's prompt and output lengths, in tokens."""

    input_len: int
    output_len: int

    def __post_init__(self) -> None:
        for name, value in (("input_len", self.input_len), ("output_len", self.output_len)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(
                    f"{name} must be an integer number of tokens, got {type(value).__name__} {value!r}"
                )
        if self.input_len < 1 or self.output_len < 0:
            raise ConfigError(
                f"a request needs input_len >= 1 and output_len >= 0, got {self.input_len} / {self.output_len}"
            )
        if self.input_len + self.output_len > MAX_REQUEST_TOKENS:
            raise ConfigError(
                f"input_len + output_len is {self.input_len + self.output_len:,} tokens, above the "
                f"{MAX_REQUEST_TOKENS:,} a request can have (SGLang indexes KV with int32)"
            )

    @property
    def total_len(self) -> int:
        return self.input_len + self.output_len

    @property
    def peak_kv_len(self) -> int:
        """KV tokens the request holds at its peak: ``input + output - 1`` (the last sampled token is never
        fed back, so its KV is never computed; the same last position as
        :func:`decode_checkpoint_positions`), ``input`` when nothing is generated."""
        return self.input_len + max(self.output_len - 1, 0)


@dataclass(frozen=True)
class Workload:
    """Request shapes with equal weight, and where they came from."""

    requests: tuple[RequestShape, ...]
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple) or not self.requests:
            raise ConfigError(f"workload {self.source!r} has no request (requests must be a non-empty tuple)")
        bad = next((r for r in self.requests if not isinstance(r, RequestShape)), None)
        if bad is not None:
            raise ConfigError(f"workload {self.source!r}: requests must be RequestShape objects, got {bad!r}")

    @classmethod
    def fixed(cls, input_len: int, output_len: int) -> Workload:
        return cls((RequestShape(input_len, output_len),), f"in {input_len} / out {output_len}")

    @classmethod
    def random_range(cls, input_len: int, output_len: int, range_ratio: float | None) -> Workload:
        """SGLang bench's random dataset (``compute_random_lens``): each length uniform, independently, in
        ``[max(1, floor(len * ratio)), len]``; an output length of 0 stays 0.

        Taken as an even grid of :data:`RANGE_POINTS` points per length (deterministic). Ratio 1 gives the
        fixed lengths; ratio 0 (bench_serving's default) lengths from 1 up. ``None`` is **not** bench's
        default: it means fixed lengths, like ratio 1 (pass 0.0 for bench's default). Raises
        :class:`ConfigError` for a ratio outside [0, 1] or lengths :class:`RequestShape` refuses.
        """
        if range_ratio is None:  # a library caller asking for fixed lengths (documented above)
            range_ratio = 1.0
        ok = isinstance(range_ratio, (int, float)) and not isinstance(range_ratio, bool)
        if not ok or not 0 <= range_ratio <= 1:
            raise ConfigError(f"range_ratio must be in [0, 1] (None means 1), got {range_ratio!r}")
        RequestShape(input_len, output_len)  # the largest shape: types and bounds
        if range_ratio == 1:
            return cls.fixed(input_len, output_len)

        def grid(n: int) -> list[int]:
            if n == 0:  # bench draws no output tokens for a zero length
                return [0]
            lo = max(int(n * range_ratio), 1)
            return sorted({lo + round(i * (n - lo) / (RANGE_POINTS - 1)) for i in range(RANGE_POINTS)})

        shapes = tuple(RequestShape(i, o) for i in grid(input_len) for o in grid(output_len))
        return cls(shapes, f"in {input_len} / out {output_len}, range ratio {range_ratio:g}")

    @classmethod
    def from_trace(cls, path: str | Path) -> Workload:
        """Lengths from a trace file, one JSON object a line.

        Mooncake block format ``{"timestamp", "input_length", "output_length", "hash_ids"}`` (only the two
        lengths are read), or the token format ``{"input_ids", "output_ids"}`` (their lengths).
        """
        if not isinstance(path, (str, Path)):
            raise ConfigError(f"trace path must be a str or Path, got {type(path).__name__}")
        path = Path(path)
        shapes: list[RequestShape] = []
        try:
            for number, row in iter_json_objects(path):
                lengths = tuple(_trace_len(row, key, str(path), number) for key in ("input", "output"))
                if sum(lengths) > MAX_REQUEST_TOKENS:
                    raise TraceFormatError(
                        str(path),
                        number,
                        "input_length",
                        f"input + output is {sum(lengths):,} tokens, above "
                        f"the {MAX_REQUEST_TOKENS:,} a request can have",
                    )
                shapes.append(RequestShape(*lengths))
        except TraceFileError as exc:
            raise ConfigError(f"trace file {str(path)!r}: cannot read ({exc.reason})") from None
        if not shapes:
            raise ConfigError(
                f"trace file {str(path)!r} holds no request; give a trace with at least one row"
            )
        return cls(tuple(shapes), str(path))

    @property
    def mean_input_len(self) -> float:
        return sum(r.input_len for r in self.requests) / len(self.requests)

    @property
    def mean_output_len(self) -> float:
        return sum(r.output_len for r in self.requests) / len(self.requests)

    @property
    def mean_total_len(self) -> float:
        return self.mean_input_len + self.mean_output_len

    @property
    def mean_peak_kv_len(self) -> float:
        """Mean of :attr:`RequestShape.peak_kv_len`: the KV a running request needs at its peak."""
        return sum(r.peak_kv_len for r in self.requests) / len(self.requests)


def _trace_len(row: dict[str, Any], which: str, path: str, line: int) -> int:
    length_key, ids_key = f"{which}_length", f"{which}_ids"
    if length_key in row:
        value = row[length_key]
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if which == "input" else 0):
            raise TraceFormatError(
                path, line, length_key, f"expected a non-negative token count, got {value!r}"
            )
        if which == "input" and value < 1:
            raise TraceFormatError(path, line, length_key, "a request needs at least one input token")
        if value > MAX_REQUEST_TOKENS:
            raise TraceFormatError(
                path,
                line,
                length_key,
                f"{value:,} tokens is above the {MAX_REQUEST_TOKENS:,} a request can have",
            )
        return value
    if ids_key in row and isinstance(row[ids_key], list):
        if which == "input" and not row[ids_key]:
            raise TraceFormatError(path, line, ids_key, "a request needs at least one input token")
        return len(row[ids_key])
    raise TraceFormatError(path, line, length_key, f"missing (need {length_key!r} or {ids_key!r})")


# ---------------------------------------------------------------------------------------------- checkpoints
def prefill_checkpoint_positions(config: CacheConfig, input_len: int, cached_len: int = 0) -> list[int]:
    """Sequence lengths at which prefill stores a state, for a prompt of ``input_len`` whose first
    ``cached_len`` tokens came from a checkpoint hit.

    Chunks cover ``[cached_len, input_len)`` in steps of ``chunked_prefill_size`` (-1: one chunk).
    ``extra_buffer``: per chunk, the last multiple of the checkpoint grid counted from the chunk start,
    none for a chunk shorter than the grid (reference §7.1). ``no_buffer``: the live state is copied at
    every chunk end. Seed 000: "输入13600, chunked prefill=6144, 总共进行3次prefill计算, 存3个state".
    """
    _check_config(config)
    _check_lengths(input_len, 0, cached_len)
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else input_len - cached_len
    grid = config.mamba_checkpoint_grid
    positions: list[int] = []
    for start in range(cached_len, input_len, chunk):
        extend = min(chunk, input_len - start)
        if config.uses_extra_buffer:
            if extend >= grid:
                positions.append(start + extend // grid * grid)
        else:
            positions.append(start + extend)
    return positions


def _check_lengths(input_len: object, output_len: object, cached_len: object = 0) -> None:
    RequestShape(input_len, output_len)  # type: ignore[arg-type]  # types and MAX_REQUEST_TOKENS
    if isinstance(cached_len, bool) or not isinstance(cached_len, int):
        raise ConfigError(f"cached prefix must be an integer, got {type(cached_len).__name__} {cached_len!r}")
    if not 0 <= cached_len < input_len:  # type: ignore[operator]
        raise ConfigError(f"cached prefix {cached_len} must be in [0, input_len={input_len})")


def _count_prefill_checkpoints(config: CacheConfig, input_len: int, cached_len: int) -> int:
    """``len(prefill_checkpoint_positions(...))`` in O(1): full chunks, then the last partial one."""
    todo = input_len - cached_len
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else todo
    full, tail = divmod(todo, chunk)
    if not config.uses_extra_buffer:
        return full + (tail > 0)
    grid = config.mamba_checkpoint_grid
    return full * (chunk >= grid) + (tail >= grid)


def _count_decode_checkpoints(config: CacheConfig, input_len: int, output_len: int) -> int:
    """``len(decode_checkpoint_positions(...))`` in O(1)."""
    last = input_len + output_len - 1
    if config.uses_extra_buffer:
        interval = config.mamba_track_interval
        first = (input_len // interval + 1) * interval
        return 0 if last < first else (last - first) // interval + 1
    return 1 if last > input_len else 0


def decode_checkpoint_positions(config: CacheConfig, input_len: int, output_len: int) -> list[int]:
    """Sequence lengths at which decode tracks a state (inserted: only the newest, at finish, unless
    ``mamba_decode_insert``; see :func:`expected_checkpoints`).

    ``extra_buffer``: every multiple of ``mamba_track_interval`` the KV length reaches during decode,
    i.e. in ``(input_len, input_len + output_len - 1]`` (the last output token is never fed back). Seed 000:
    "prompt 长度为1000、interval 为256, decode checkpoint 会在总长度 1024、1280、1536……". ``no_buffer``:
    the live state is donated once at finish, at the whole sequence.
    """
    _check_config(config)
    _check_lengths(input_len, output_len)
    if config.uses_extra_buffer:
        interval = config.mamba_track_interval
        last = input_len + output_len - 1
        first = (input_len // interval + 1) * interval
        return list(range(first, last + 1, interval))
    finish = input_len + output_len - 1
    # at finish the live state is donated; with a single output token it sits where prefill already stored one
    return [finish] if finish > input_len else []


@dataclass(frozen=True)
class CheckpointCount:
    """Checkpoints one request stores under a strategy.

    ``prefill`` checkpoints are taken (inserted into the tree) and ``decode`` ones tracked, of which
    ``decode_inserted`` are taken (the newest, at finish; every one with ``mamba_decode_insert``); ``kept``
    is what the request leaves
    worth keeping: its prefill checkpoints and only the newest decode one (older decode ones are superseded:
    seed 000 "只offload最终的那一个mamba state"), cut to ``mamba_max_states_per_path`` when set (soft cap;
    the tail is always kept). ``seed_bound`` is seed 000's ``in_len // chunked_prefill_size + 2``.
    """

    prefill: int
    decode: int
    kept: int
    seed_bound: int
    decode_inserted: int = 0

    @property
    def taken(self) -> int:
        return self.prefill + self.decode_inserted


def expected_checkpoints(
    config: CacheConfig, input_len: int, output_len: int, cached_len: int = 0
) -> CheckpointCount:
    """Checkpoints of one request of ``input_len`` / ``output_len`` tokens (see :class:`CheckpointCount`).
    O(1): the positions are counted, not listed."""
    _check_config(config)
    _check_lengths(input_len, output_len, cached_len)
    if config.disable_radix_cache:
        return CheckpointCount(0, 0, 0, 0, 0)
    prefill = _count_prefill_checkpoints(config, input_len, cached_len)
    decode = _count_decode_checkpoints(config, input_len, output_len)
    # SGLang only tracks decode states and inserts the newest one at finish; mamba_decode_insert inserts
    # every one at its boundary
    inserted = decode if config.mamba_decode_insert else min(decode, 1)
    kept = prefill + min(decode, 1)
    if config.mamba_max_states_per_path > 0:
        kept = min(kept, config.mamba_max_states_per_path)
    chunk = config.chunked_prefill_size if config.chunked_prefill_size > 0 else input_len
    return CheckpointCount(
        prefill=prefill, decode=decode, kept=kept, seed_bound=input_len // chunk + 2, decode_inserted=inserted
    )


@dataclass(frozen=True)
class WorkloadCheckpoints:
    """Checkpoint counts over a workload: totals (for the simulator) and per-request means."""

    num_requests: int
    prefill_total: int
    decode_total: int
    kept_total: int
    max_kept: int
    decode_inserted_total: int = 0

    @property
    def taken_total(self) -> int:
        return self.prefill_total + self.decode_inserted_total

    @property
    def mean_taken(self) -> float:
        return self.taken_total / self.num_requests

    @property
    def mean_kept(self) -> float:
        return self.kept_total / self.num_requests


def expected_workload_checkpoints(
    config: CacheConfig, workload: Workload | Iterable[RequestShape], cached_lens: Iterable[int] | None = None
) -> WorkloadCheckpoints:
    """Expected checkpoints for every request of a workload, summed.

    Comparable with the simulator run on the same requests in sequential mode with capacity to spare (no
    checkpoint skipped or evicted): ``taken_total`` should equal the checkpoints it inserted. ``cached_lens`` gives each request's reused prefix (the simulator's per-request hit length);
    omitted, every request starts cold.
    """
    _check_config(config)
    if isinstance(workload, Workload):
        requests = workload.requests
    elif isinstance(workload, Iterable):
        requests = Workload(tuple(workload), "requests").requests
    else:
        raise ConfigError(f"workload must be a Workload or RequestShapes, got {type(workload).__name__}")
    cached = list(cached_lens) if cached_lens is not None else [0] * len(requests)
    if len(cached) != len(requests):
        raise ConfigError(f"{len(cached)} cached lengths for {len(requests)} requests")
    counts = [
        expected_checkpoints(config, r.input_len, r.output_len, c)
        for r, c in zip(requests, cached, strict=False)
    ]
    return WorkloadCheckpoints(
        num_requests=len(counts),
        prefill_total=sum(c.prefill for c in counts),
        decode_total=sum(c.decode for c in counts),
        kept_total=sum(c.kept for c in counts),
        max_kept=max(c.kept for c in counts),
        decode_inserted_total=sum(c.decode_inserted for c in counts),
    )


def decode_slots_in_use(config: CacheConfig) -> int:
    """State slots a decoding request actually occupies (its reservation keeps one spare on top).

    Live state, the track slots it holds (``extra_buffer``: the ping-pong pair with overlap, one without;
    lazy: one, the second is borrowed only at a boundary) and the locked checkpoint it continues from
    (unlocked under skip-decode-lock). Seed 000's log "#running-req: 16, ... mamba num: 64": 16 x 4.
    """
    return config.slot_budget.decode_slots_in_use


# -------------------------------------------------------------------------------------------------- balance
@dataclass(frozen=True)
class Balance:
    """Pool split at which KV and state fill together for a workload at ``concurrency`` running requests.

    Two state demands: ``admission`` (the slots reserved per running request, the least SGLang admits
    with) and ``with_checkpoints`` (plus every running request's kept checkpoints resident in the tree, so
    prefix reuse is not cut by eviction). ``ratio_*`` is ``--mamba-full-memory-ratio`` (state bytes : KV
    bytes, as SGLang splits ``rest`` into ``r/(1+r)`` and ``1/(1+r)``); ``slots_*`` is
    ``--max-mamba-cache-size``.
    """

    concurrency: int
    kv_tokens_per_request: float
    kv_bytes_per_request: float  # per GPU
    slot_bytes: int  # per GPU, incl. rings
    slots_per_request: int
    kept_checkpoints_per_request: float
    draft_states_per_request: int = 0

    @property
    def draft_states(self) -> int:
        """Intermediate states of the running requests (0 without plain speculative decoding)."""
        return self.concurrency * self.draft_states_per_request

    @property
    def slots_admission(self) -> int:
        return self.concurrency * self.slots_per_request

    @property
    def slots_with_checkpoints(self) -> int:
        return math.ceil(self.concurrency * (self.slots_per_request + self.kept_checkpoints_per_request))

    @property
    def kv_tokens(self) -> int:
        return math.ceil(self.concurrency * self.kv_tokens_per_request)

    @property
    def kv_bytes(self) -> float:
        return self.concurrency * self.kv_bytes_per_request

    @property
    def ratio_admission(self) -> float:
        return (self.slots_admission + self.draft_states) * self.slot_bytes / self.kv_bytes

    @property
    def ratio_with_checkpoints(self) -> float:
        return (self.slots_with_checkpoints + self.draft_states) * self.slot_bytes / self.kv_bytes

    def bytes_needed(self, with_checkpoints: bool = False) -> float:
        slots = self.slots_with_checkpoints if with_checkpoints else self.slots_admission
        return self.kv_bytes + (slots + self.draft_states) * self.slot_bytes


def balance(resolution: PoolResolution, workload: Workload, concurrency: int | None = None) -> Balance:
    """The balanced split for ``workload`` at ``concurrency`` (default: the most the budget holds with
    the admission demand in the pools' memory, else the resolved ``max_running_requests``)."""
    _check_plan_args(resolution, workload)
    if concurrency is not None:
        _check_concurrency(concurrency)
    cache = resolution.inputs.cache
    counts = expected_workload_checkpoints(cache, workload)
    tokens = workload.mean_peak_kv_len
    per_request_kv = tokens * float(resolution.kv.bytes_per_token)
    slot = resolution.bytes_per_slot
    draft = _draft_states_per_request(resolution)
    if concurrency is None:
        rest = resolution.rest_bytes
        if rest is not None:
            concurrency = max(1, int(rest // (per_request_kv + (cache.slots_per_request + draft) * slot)))
        else:
            concurrency = resolution.max_running_requests
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    return Balance(
        concurrency=concurrency,
        kv_tokens_per_request=tokens,
        kv_bytes_per_request=per_request_kv,
        slot_bytes=slot,
        slots_per_request=cache.slots_per_request,
        kept_checkpoints_per_request=counts.mean_kept,
        draft_states_per_request=draft,
    )


def _draft_states_per_request(resolution: PoolResolution) -> int:
    """D: the intermediate states SGLang reserves per running request under plain speculative decoding
    (0 without it, and with ReplaySSM, whose rings replace them)."""
    inputs = resolution.inputs
    return (inputs.verify_tokens or 0) if inputs.reserves_intermediate_states else 0


def _check_plan_args(resolution: object, workload: object) -> None:
    if not isinstance(resolution, PoolResolution):
        raise ConfigError(
            f"resolution must be a PoolResolution (from resolve_pools), got {type(resolution).__name__}"
        )
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload must be a Workload, got {type(workload).__name__}")


def max_balanced_concurrency(
    resolution: PoolResolution, workload: Workload, with_checkpoints: bool
) -> int | None:
    """Most requests the pools' memory runs at once when the split is balanced (None if unknown)."""
    rest = resolution.rest_bytes
    if rest is None:
        return None
    one = balance(resolution, workload, concurrency=1)
    return int(rest // one.bytes_needed(with_checkpoints))


@dataclass(frozen=True)
class DcpOption:
    """One DCP size at a fixed TP size: per-GPU KV cost and the balanced ratio for the workload."""

    dcp_size: int
    kv_bytes_per_token: float  # per GPU
    ratio_admission: float
    ratio_with_checkpoints: float
    max_concurrency: int | None  # balanced, admission demand, within the budget


def compare_dcp(resolution: PoolResolution, workload: Workload, concurrency: int = 1) -> list[DcpOption]:
    """TP versus DCP (seed 000: "开启DCP时... 这个mem ratio要乘以TP数"), for every DCP size dividing the KV
    replication at this TP size, in the same pool memory as ``resolution``.

    State bytes per GPU do not change with DCP (TP already splits the linear heads); KV bytes per token per
    GPU fall by ``dcp_size``, so the balanced ratio grows by that factor and more requests fit.
    """
    _check_plan_args(resolution, workload)
    _check_concurrency(concurrency)
    inputs = resolution.inputs
    tp = inputs.parallelism.tp_size
    replication = Parallelism(tp, 1).check_dcp(inputs.model)
    rest = resolution.rest_bytes
    counts = expected_workload_checkpoints(inputs.cache, workload)
    options: list[DcpOption] = []
    for dcp in (d for d in range(1, replication + 1) if replication % d == 0):
        kv = kv_token_bytes(inputs.model, Parallelism(tp, dcp), inputs.kv_cache_dtype)
        bal = Balance(
            concurrency=concurrency,
            kv_tokens_per_request=workload.mean_peak_kv_len,
            kv_bytes_per_request=workload.mean_peak_kv_len * float(kv.bytes_per_token),
            slot_bytes=resolution.bytes_per_slot,
            slots_per_request=inputs.cache.slots_per_request,
            kept_checkpoints_per_request=counts.mean_kept,
            draft_states_per_request=_draft_states_per_request(resolution),
        )
        per_request = bal.bytes_needed() / concurrency
        options.append(
            DcpOption(
                dcp_size=dcp,
                kv_bytes_per_token=float(kv.bytes_per_token),
                ratio_admission=bal.ratio_admission,
                ratio_with_checkpoints=bal.ratio_with_checkpoints,
                max_concurrency=None if rest is None else int(rest // per_request),
            )
        )
    return options


# ----------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Plan:
    """A full plan: the SGLang resolution and, given a workload, the recommendation on top of it."""

    resolution: PoolResolution
    workload: Workload | None
    checkpoints: WorkloadCheckpoints | None
    per_request: CheckpointCount | None  # for a single-shape workload
    balance: Balance | None
    max_concurrency_admission: int | None
    max_concurrency_with_checkpoints: int | None
    kv_usage_at_max_running: float | None  # KV tokens the running requests hold at their peak / pool
    workload_kv_limit: int | None  # requests of this workload the KV pool holds at their peak
    workload_binding: str | None  # which pool runs out first for this workload
    state_usage_at_max_running: float  # slots in use by decoding requests / pool
    dcp_options: tuple[DcpOption, ...]
    official: Comparison | None = None  # the official calculator and the steps from it to ``balance``
    # the state budget under the inputs' checkpoint format: working and checkpoint slots at equal bytes
    formats: FormatSizing | None = None

    def to_dict(self) -> dict[str, Any]:
        return _plan_dict(self)


def plan(inputs: SizingInputs, workload: Workload | None = None, concurrency: int | None = None) -> Plan:
    """Resolve the pools and, with a workload, recommend a split (module docstring)."""
    if workload is not None and not isinstance(workload, Workload):
        raise ConfigError(f"workload must be a Workload, got {type(workload).__name__}")
    if concurrency is not None:
        _check_concurrency(concurrency)
    resolution = resolve_pools(inputs)
    cache = inputs.cache
    state_usage = resolution.max_running_requests * decode_slots_in_use(cache) / resolution.num_slots
    formats = resolve_checkpoints(resolution)
    if workload is None:
        return Plan(
            resolution, None, None, None, None, None, None, None, None, None, state_usage, (), formats=formats
        )
    counts = expected_workload_checkpoints(cache, workload)
    single = workload.requests[0] if len(workload.requests) == 1 else None
    per_request = expected_checkpoints(cache, single.input_len, single.output_len) if single else None
    bal = balance(resolution, workload, concurrency)
    kv_usage = kv_limit = binding = None
    if resolution.num_tokens:
        kv_usage = resolution.max_running_requests * workload.mean_peak_kv_len / resolution.num_tokens
        kv_limit = int(resolution.num_tokens // workload.mean_peak_kv_len)
        # SGLang admits max_running_requests; the workload's sequences may exhaust the KV pool first
        binding = "full KV tokens" if kv_limit < resolution.max_running_requests else resolution.binding
    return Plan(
        resolution=resolution,
        workload=workload,
        checkpoints=counts,
        per_request=per_request,
        balance=bal,
        max_concurrency_admission=max_balanced_concurrency(resolution, workload, with_checkpoints=False),
        max_concurrency_with_checkpoints=max_balanced_concurrency(
            resolution, workload, with_checkpoints=True
        ),
        kv_usage_at_max_running=kv_usage,
        workload_kv_limit=kv_limit,
        workload_binding=binding,
        state_usage_at_max_running=state_usage,
        dcp_options=tuple(compare_dcp(resolution, workload, concurrency or 1)),
        official=_official_vs_corrected(resolution, workload, counts, bal),
        formats=formats,
    )


def _official_vs_corrected(
    resolution: PoolResolution, workload: Workload, counts: WorkloadCheckpoints, bal: Balance
) -> Comparison:
    """The official calculator beside :func:`balance`'s keep-checkpoints answer (see
    :func:`mamba_radix.capacity.official.compare`). Counts the workload's checkpoints once more without
    the per-path cap: O(shapes)."""
    cache = resolution.inputs.cache
    uncapped = (
        counts
        if cache.mamba_max_states_per_path < 0
        else expected_workload_checkpoints(cache.replace(mamba_max_states_per_path=-1), workload)
    )
    return compare(
        resolution,
        context_len=workload.mean_total_len,
        peak_kv_len=workload.mean_peak_kv_len,
        kept_uncapped=uncapped.mean_kept,
        kept=counts.mean_kept,
        max_states_per_path=cache.mamba_max_states_per_path,
        concurrency=bal.concurrency,
        corrected_ratio=bal.ratio_with_checkpoints,
        corrected_slots=bal.slots_with_checkpoints,
    )


def _plan_dict(p: Plan) -> dict[str, Any]:
    r = p.resolution
    inputs = r.inputs
    out: dict[str, Any] = {
        "model": inputs.model.name,
        "tp_size": inputs.parallelism.tp_size,
        "dcp_size": inputs.parallelism.dcp_size,
        "strategy": inputs.cache.strategy,
        "overlap": inputs.cache.overlap,
        "kv_cache_dtype": r.kv.dtype,
        "mamba_ssm_dtype": r.state.ssm_dtype,
        "mamba_conv_dtype": r.state.conv_dtype,
        "kv_bytes_per_token_per_gpu": float(r.kv.bytes_per_token),
        "state_conv_bytes_per_slot_per_gpu": r.state.conv_bytes,
        "state_temporal_bytes_per_slot_per_gpu": r.state.temporal_bytes,
        "conv_shape_per_layer": list(r.state.conv_shape),
        "temporal_shape_per_layer": list(r.state.temporal_shape),
        "ring_bytes_per_slot_per_gpu": (
            {name: r.rings.ring_bytes(name) for name in r.rings.shapes} if r.rings else None
        ),
        "bytes_per_slot_per_gpu": r.bytes_per_slot,
        "budget_gib": inputs.budget.rest_gib if inputs.budget else None,
        "max_mamba_cache_size": r.num_slots,
        "allocated_slots": r.num_slots + 1,
        "conv_state_gib": r.state.pool_conv_bytes(r.num_slots) / GIB,
        "ssm_state_gib": r.state.pool_temporal_bytes(r.num_slots) / GIB,
        "ring_gib": (
            {n: r.rings.pool_bytes(n, r.num_slots) / GIB for n in r.rings.shapes} if r.rings else None
        ),
        "num_tokens": r.num_tokens,
        "kv_gib": (r.kv_pool_bytes / GIB) if r.kv_pool_bytes is not None else None,
        "intermediate_state_gib": r.intermediate_bytes / GIB,
        "slots_per_request": r.slots_per_request,
        "max_running_requests": r.max_running_requests,
        "binding": r.binding,
        "limits": dict(r.limits),
        "message": r.message,
        "state_usage_at_max_running": p.state_usage_at_max_running,
    }
    if p.formats is not None:
        out["checkpoints"] = p.formats.to_dict()
    if p.workload is not None:
        assert p.checkpoints is not None and p.balance is not None
        b = p.balance
        out["workload"] = {
            "source": p.workload.source,
            "num_shapes": len(p.workload.requests),
            "mean_input_len": p.workload.mean_input_len,
            "mean_output_len": p.workload.mean_output_len,
            "checkpoints_mean_taken": p.checkpoints.mean_taken,
            "checkpoints_mean_kept": p.checkpoints.mean_kept,
            "checkpoints_max_kept": p.checkpoints.max_kept,
            "per_request": (
                {
                    "prefill": p.per_request.prefill,
                    "decode": p.per_request.decode,
                    "kept": p.per_request.kept,
                    "seed_bound": p.per_request.seed_bound,
                }
                if p.per_request
                else None
            ),
            "kv_usage_at_max_running": p.kv_usage_at_max_running,
            "kv_limit_requests": p.workload_kv_limit,
            "binding": p.workload_binding,
        }
        out["recommendation"] = {
            "concurrency": b.concurrency,
            "mamba_full_memory_ratio_admission": b.ratio_admission,
            "mamba_full_memory_ratio_with_checkpoints": b.ratio_with_checkpoints,
            "max_mamba_cache_size_admission": b.slots_admission,
            "max_mamba_cache_size_with_checkpoints": b.slots_with_checkpoints,
            "kv_tokens_needed": b.kv_tokens,
            "max_concurrency_admission": p.max_concurrency_admission,
            "max_concurrency_with_checkpoints": p.max_concurrency_with_checkpoints,
        }
        out["dcp_options"] = [
            {
                "dcp_size": o.dcp_size,
                "kv_bytes_per_token_per_gpu": o.kv_bytes_per_token,
                "mamba_full_memory_ratio_admission": o.ratio_admission,
                "mamba_full_memory_ratio_with_checkpoints": o.ratio_with_checkpoints,
                "max_concurrency": o.max_concurrency,
            }
            for o in p.dcp_options
        ]
        if p.official is not None:
            out["official_vs_corrected"] = p.official.to_dict()
    return out
