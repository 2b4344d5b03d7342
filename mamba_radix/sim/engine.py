"""The engine loop: replays a trace through the real :class:`~mamba_radix.cache.MambaRadixCache` and pools
with SGLang's scheduler rules (``docs/architecture.md`` "Engine protocol"; ``reference/sglang-semantics.md``
§4.7-4.8, §7).

Per request, through the cache's request lifecycle (:mod:`mamba_radix.lifecycle`; the engine only
plays the model):

1. admission (FCFS): running requests are capped at ``slots // slots_per_request`` (and
   ``max_running_requests``); ``cache.can_admit(req, max_new_tokens)`` checks, read-only, that the KV
   tokens (with every running request's reservation) and the state slots fit; then ``cache.admit``. A
   refused request leaves no trace. A request that can never fit (longer than the KV pool or a request
   row) is rejected and counted (``rejected_requests``; the CLI warns);
2. chunked prefill: per chunk ``cache.extend`` (KV allocated, evicting; the plan says where the model
   tracks a state), "run the model" (stamps), ``cache.commit`` (the chunk's checkpoint goes to the tree);
   the last chunk yields the first token (TTFT);
3. decode: ``extend`` / ``commit`` from event to event (below); a decode boundary is tracked, not
   inserted (SGLang; ``mamba_decode_insert`` inserts it);
4. finish: ``cache.finish`` (the newest checkpoint to the tree, the rest and the request row freed).

The model's forward is replaced by state stamps (:mod:`mamba_radix.state_stamp`, written through the
fast :mod:`mamba_radix.sim.stamps`): the live slot is stamped with the fingerprint of the tokens it
summarises at every chunk end and decode event, the track slot at the tracked length. Each request's
prefix fingerprints are computed once at admission (vectorised), so a stamp costs O(1) whatever the chunk
length. With ``verify_states`` every prefill chunk and decode segment first checks that the live slot
holds the stamp of exactly the tokens before it: a hit that returned the wrong checkpoint, a copy-on-write
that copied the wrong slot or a donation that lost a state is caught at once. Without ``verify_states``
no fingerprint is computed and no stamp written (nothing would read them), which saves the simulator
its largest cost per token.

**Quantized checkpoints** (``checkpoint_format`` int8 / fp8_e4m3): the tree's checkpoints live in the
cache's checkpoint pool (sized by the budget's ``PoolSizes.checkpoint_slots`` when the config leaves it
None), the state pool holds running requests' slots only, and the pool metrics say so (state slots in
use = ``mamba_pool.used``; no tree slot among them). A hit restores ``dequantize(quantize(state))``, so
right after one the live slot holds the format's round trip of the prefix's stamp bytes, not the bytes:
:meth:`Engine._verify_live` then compares it with that round trip of the expected stamp, computed through
the format's reference arithmetic (:mod:`mamba_radix_kernels.quant_naive`), bit for bit. That check names
the prefix by its fingerprint words as the format keeps them (7 bits of int8 or 3 mantissa bits of e4m3
per element, and a stamp word whose bits read as a NaN or infinity poisons its row): weaker than the raw
stamp's identity, but a restore of another prefix's checkpoint still differs in almost every case.

**Decode jumps.** Decode is not simulated token by token. Every decoding request advances one token per
global decode step, but the engine only touches a request at its own events (the next track boundary or
its last token): the KV of all the steps since its previous event is allocated in one segment, and the
state stamped once. This is exact for the tree, the checkpoints and the time model (lockstep steps), and
approximates only *when* decode KV is taken from the pool: a real engine allocates one token per step,
so between two events of a request its KV usage grows smoothly while here it grows in one jump at the
event. The admission rule reserves those tokens in advance, so the jump never overcommits the pool; it
can shift which cached entry gets evicted first by a few steps. Pool samples count the owed KV as used.

**Modes.** ``timed``: arrivals at trace timestamps (times ``arrival_time_scale``), requests run
concurrently; a prefill batch (the chunked request first, then new admissions, at most
``chunked_prefill_size`` tokens) takes ``overhead + tokens / prefill_tokens_per_s`` seconds and pauses
decode; a decode step takes ``decode_step_s + decode_step_per_req_s * batch``. ``sequential``: one request
at a time, arrivals ignored (exact, order-only comparisons); the same cost model still gives TTFTs.

**The client** (timed mode; :mod:`mamba_radix.sim.client`). ``max_concurrency`` is ``bench_serving``'s
semaphore: at most N requests outstanding (queued at the server or running); one that arrives while N are
outstanding waits at the client and is sent when one leaves (finishes, or is rejected). A request's TTFT,
queue time and latency are measured from its *send*, as bench_serving measures them. Sequential mode
ignores it (one request at a time anyway).

**The scheduler log** (:mod:`mamba_radix.sim.scheduler_view`). With ``log_every`` N > 0, ``log`` gets a
``Decode batch`` line at every global decode step that is a multiple of N and a ``Prefill batch`` line
for every prefill batch, in SGLang's format, the values read from the real pools. A decode line at step
k inside a decode jump is exact for that step: the running set is the one of the whole jump (no request
joins or leaves between two events), ``mamba num`` is the state slots in use then (pool slots - free -
evictable checkpoints: constant between events), ``#full token`` is the KV in use (allocated - evictable)
plus the decode KV each running request owes at step k (``k - sync_step`` tokens, page-rounded as the
allocator would take them), i.e. what a token-by-token engine would hold; unlike the pool samples it does
not count the rest of each request's reservation (SGLang's line does not). ``#queue-req`` counts the
requests the client would have sent by that step's time even if the engine queues them only at the jump's
end. The time of step k is the jump's start plus ``k - start`` step times. A prefill line is written when
its batch is scheduled, with the batch's KV allocated. With ``log_every`` 0 nothing is computed (one
``is None`` test per prefill batch and per decode jump).

**The host tier** (``host_kv_tokens`` / ``host_state_slots``, or ``EngineOptions.host_memory_ratio`` x the
device pools; off by default, and then nothing here runs). The cache demotes, backs up and loads back
(:mod:`mamba_radix.cache`, ``docs/host-tier.md``); the engine times it. Every prefill batch waits for the
host->device bytes loaded since the previous batch (the cache's ``host_stats`` times the run's bytes per KV
token and state slot) at the link's speed (:class:`~mamba_radix.cost_model.HostLink`), less the part that
fits in the previous forward's compute time (the load was issued during it); that part is counted as
overlapped, the rest lengthens the batch and so its requests' TTFT. After an idle gap nothing overlaps.
Backups are counted in bytes and delay nothing. Each admission peeks the device hit first (O(L)), so a
load-back's share of the hit is counted as a host hit (:class:`~mamba_radix.sim.metrics.HostTierMetrics`).
``EngineOptions.host_split`` ``"planned"`` keeps the host tier's bytes and splits them by the planner's rule
(:mod:`mamba_radix.capacity.host`: one host state slot per KV tokens a host copy covers on the run's
workload); the workload is ``Engine(..., workload=)``, or the requests :meth:`Engine.run` gets, read once
before the first (the cache is then built again with the planned pools).

**Serving metrics** (timed mode; :class:`~mamba_radix.sim.metrics.RunMetrics`): duration from the first
send to the last finish, request and token throughputs, TTFT, TPOT (``(latency - TTFT) / (output_len -
1)``, requests with at least 2 output tokens), mean ITL and end-to-end latency, bench_serving's
definitions. Sequential mode leaves them None (its time has no arrivals: not a load test).
"""

from __future__ import annotations

import heapq
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mamba_radix.capacity.host import HOST_SPLITS, planned_split, ratio_split, workload_coverage
from mamba_radix.config import CacheConfig
from mamba_radix.cost_model import DEFAULT_HOST_LINK, HOST_LINK_PRESETS, CostModel, HostLink
from mamba_radix.errors import ConfigError, InvalidArgument, MambaRadixError
from mamba_radix.lifecycle import ForwardPlan
from mamba_radix.policy import CachePolicy
from mamba_radix.pools import KVAllocator
from mamba_radix.radix_key import RadixKey
from mamba_radix.request import Req
from mamba_radix.sim.budget import PoolSizes, request_rows, unified_pools
from mamba_radix.sim.capacity_limit import LimitedMambaPool, limited_kv_allocator
from mamba_radix.sim.client import Arrival, Client
from mamba_radix.sim.ideal import IdealHit, ideal_for
from mamba_radix.sim.memory import LARGE_KV_TOKENS, release_memory
from mamba_radix.sim.metrics import HostTierMetrics, PoolSample, RunMetrics
from mamba_radix.sim.scheduler_view import PoolView, SchedulerLog
from mamba_radix.sim.split import AdaptiveSplit, SplitOptions
from mamba_radix.sim.stamps import StampIO
from mamba_radix.sim.traces import TraceRequest
from mamba_radix.state_stamp import PrefixFingerprints, read_stamp

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "CostModel",
    "Engine",
    "EngineOptions",
    "SimulationError",
    "StateMismatchError",
    "check_simulable",
]

Mode = Literal["timed", "sequential"]

# Tiny state shapes for the simulator's MambaPool (bf16 conv and float32 temporal, MambaPool's default
# dtypes): 16 bytes per tensor per slot, just what a stamp needs. The bytes a real model moves come from
# the model spec (PoolSizes.bytes_per_state_slot).
SIM_STATE_LAYERS = 1
SIM_CONV_SHAPES = [(8,)]  # bf16: 16 bytes
SIM_TEMPORAL_SHAPE = (4,)  # float32: 16 bytes


def _host_sized(config: CacheConfig, pools: PoolSizes, options: EngineOptions) -> CacheConfig:
    """``config`` with its host pools at ``options.host_memory_ratio`` x the device pools (KV tokens
    rounded down to whole pages, at least one page and one slot:
    :func:`~mamba_radix.capacity.host.ratio_split`), or as it is without a ratio. Raises
    :class:`ConfigError` for a ratio together with explicit host pool sizes. O(1)."""
    ratio = options.host_memory_ratio
    if ratio is None:
        return config
    if config.host_tier:
        raise ConfigError(
            "host_memory_ratio sizes the host pools itself; drop it or host_kv_tokens / host_state_slots"
        )
    if ratio == 0:
        return config
    split = ratio_split(
        pools.kv_tokens,
        pools.state_slots,
        ratio,
        config.page_size,
        pools.bytes_per_kv_token,
        pools.bytes_per_state_slot,
    )
    return config.replace(host_kv_tokens=split.kv_tokens, host_state_slots=split.state_slots)


def _host_planned(config: CacheConfig, pools: PoolSizes, requests: Sequence[TraceRequest]) -> CacheConfig:
    """``config`` with the same host bytes as its host pools (``host_kv_tokens x bytes_per_kv_token +
    host_state_slots x bytes_per_state_slot``, the model's bytes) split by the planner's rule
    (:func:`~mamba_radix.capacity.host.planned_split`: one host slot per KV tokens a host copy covers on
    ``requests``: a resumable point under the ``resumable`` placement, any checkpoint of the tree, prefill
    chunks' included, under SGLang's write policies, which copy every one). Raises :class:`ConfigError` without a host tier to split. O(workload symbols x log
    requests), once per run."""
    if not config.host_tier:
        raise ConfigError(
            "host_split='planned' splits the host tier's bytes; set host_memory_ratio > 0 (or host_kv_tokens "
            "and host_state_slots), or drop host_split"
        )
    bkv, bslot = pools.bytes_per_kv_token, pools.bytes_per_state_slot
    host_bytes = config.host_kv_tokens * bkv + config.host_state_slots * bslot
    chunk = config.chunked_prefill_size if config.uses_extra_buffer else None
    per_copy = workload_coverage(requests, chunk).tokens_per_copy(config.host_write_policy)
    try:
        split = planned_split(host_bytes, bkv, bslot, per_copy, config.page_size)
    except InvalidArgument as err:
        raise ConfigError(f"host_split='planned': {err}") from None
    return config.replace(host_kv_tokens=split.kv_tokens, host_state_slots=split.state_slots)


def _merged_tiers(config: CacheConfig, pools: PoolSizes) -> tuple[CacheConfig, PoolSizes]:
    """The tier-aware reference's pools (``EngineOptions.host_merged``): the host pools' KV tokens and state
    slots added to the device pools, and the tier off. With loads and backups free, a request hits when its
    prefix is in either tier, so what two tiers can hit is what one tier of their summed capacity can hit
    (``property_tests/test_tier_oracle.py`` checks this exhaustively on small traces); the offline oracle on
    these pools is then the two-tier optimum where it is exact, a strong reference elsewhere. Raises
    :class:`ConfigError` without a host tier to merge. O(1)."""
    if not config.host_tier:
        raise ConfigError(
            "host_merged adds the host pools to the device's; set host_memory_ratio > 0 (or host_kv_tokens and "
            "host_state_slots), or drop host_merged"
        )
    merged = replace(
        pools,
        kv_tokens=pools.kv_tokens + config.host_kv_tokens,
        state_slots=pools.state_slots + config.host_state_slots,
    )
    return config.replace(host_kv_tokens=0, host_state_slots=0), merged


def _host_link(config: CacheConfig, options: EngineOptions) -> HostLink | None:
    """The link that times load-backs (None without the host tier). Raises :class:`ConfigError` for link
    options without the tier (they would do nothing). O(1)."""
    if not config.host_tier:
        if options.host_link is not None or options.host_link_gbps is not None:
            raise ConfigError(
                "host_link and host_link_gbps time the host tier's transfers; set host_kv_tokens and "
                "host_state_slots (or host_memory_ratio) > 0, or drop them"
            )
        return None
    preset = HOST_LINK_PRESETS[options.host_link or DEFAULT_HOST_LINK]
    if options.host_link_gbps is None:
        return preset
    name = options.host_link or "custom"
    return HostLink(name, float(options.host_link_gbps))


def check_simulable(config: CacheConfig) -> None:
    """Every valid :class:`CacheConfig` simulates (any page size since the lifecycle API); kept for
    callers that check before building an engine. O(1)."""
    if not isinstance(config, CacheConfig):
        raise ConfigError(f"the simulator needs a CacheConfig, got {type(config).__name__}")


class SimulationError(MambaRadixError):
    """The simulation cannot go on: a pool ran out although admission reserved room (an engine bug)."""


class StateMismatchError(SimulationError, AssertionError):
    """A state slot does not hold the state of the tokens it should summarise (a cache bug)."""


@dataclass(frozen=True)
class EngineOptions:
    """How to run (not what to cache: that is the :class:`CacheConfig`)."""

    mode: Mode = "timed"
    cost: CostModel = field(default_factory=CostModel)
    arrival_time_scale: float = 1.0
    max_running_requests: int | None = None
    verify_states: bool = True
    check_invariants_every: int = 0  # run cache.check_invariants() every N finished requests; 0 = never
    num_samples: int = 400
    keep_per_request: bool = False
    # Debug: touch every decoding request at every step (token by token, slow) instead of jumping from
    # event to event; for checking the decode-jump approximation.
    decode_step_events: bool = False
    # one byte budget for both pools (the pools' sizes in bytes), the line between them adaptive
    split: SplitOptions | None = None
    # bench_serving's client semaphore: at most N requests outstanding (timed mode; None = no cap)
    max_concurrency: int | None = None
    # SGLang's scheduler log: a Decode batch line every N decode steps and a Prefill batch line per
    # prefill batch, written to ``log`` (None: print); 0 = no log
    log_every: int = 0
    log: Callable[[str], None] | None = None
    # the host tier's link (mamba_radix.cost_model.HOST_LINK_PRESETS; None: the default preset) and its
    # GB/s per direction (None: the preset's); only with the tier on
    host_link: str | None = None
    host_link_gbps: float | None = None
    # both host pools at this multiple of the device pools (KV tokens, state slots); None: the config's
    # host_kv_tokens / host_state_slots; 0: no host tier
    host_memory_ratio: float | None = None
    # how the host bytes split between the host pools (mamba_radix.capacity.host.HOST_SPLITS): "ratio" (each
    # pool sized alone, as above and as SGLang) or "planned" (the same bytes, one host slot per KV tokens a
    # resumable point covers on the run's workload); None: "ratio", and the run's record has no such key
    host_split: str | None = None
    # the tier-aware reference (_merged_tiers): the host pools merged into the device pools, the tier off, as
    # many requests at once as the device pools alone admit; None: off, and the run's record has no such key
    host_merged: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.split, dict):  # from a JSON definition or a result record's params
            try:
                object.__setattr__(self, "split", SplitOptions(**self.split))
            except TypeError as err:
                known = ", ".join(f.name for f in fields(SplitOptions))
                raise ConfigError(f"split: {err}; known: {known}") from err
        if self.mode not in ("timed", "sequential"):
            raise ConfigError(f"mode must be 'timed' or 'sequential', got {self.mode!r}")
        if self.arrival_time_scale <= 0:
            raise ConfigError(f"arrival_time_scale must be > 0, got {self.arrival_time_scale}")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ConfigError(
                f"max_running_requests must be >= 1 (or None: no cap), got {self.max_running_requests}"
            )
        if self.max_concurrency is not None and (
            not isinstance(self.max_concurrency, int) or self.max_concurrency < 1
        ):
            raise ConfigError(f"max_concurrency must be >= 1 (or None: no cap), got {self.max_concurrency!r}")
        if not isinstance(self.log_every, int) or self.log_every < 0:
            raise ConfigError(f"log_every must be >= 0 decode steps (0 = no log), got {self.log_every!r}")
        if self.log is not None and not callable(self.log):
            raise ConfigError(f"log must be a callable taking one line (str), got {type(self.log).__name__}")
        if self.host_link is not None and self.host_link not in HOST_LINK_PRESETS:
            raise ConfigError(
                f"host_link must be one of {', '.join(HOST_LINK_PRESETS)}, got {self.host_link!r}"
            )
        gbps = self.host_link_gbps
        if gbps is not None and not (isinstance(gbps, (int, float)) and math.isfinite(gbps) and gbps > 0):
            raise ConfigError(f"host_link_gbps must be a number > 0 (GB/s per direction), got {gbps!r}")
        ratio = self.host_memory_ratio
        if ratio is not None and not (
            isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 0
        ):
            raise ConfigError(
                f"host_memory_ratio must be a number >= 0 (host pools / device pools; 0: no host tier), got {ratio!r}"
            )
        if self.host_split is not None and self.host_split not in HOST_SPLITS:
            raise ConfigError(f"host_split must be one of {', '.join(HOST_SPLITS)}, got {self.host_split!r}")
        if self.host_merged not in (None, True, False):
            raise ConfigError(f"host_merged must be true or false, got {self.host_merged!r}")
        if self.cost.prefill_tokens_per_s <= 0 or self.cost.decode_step_s < 0:
            raise ConfigError(
                "cost.prefill_tokens_per_s must be > 0 and cost.decode_step_s >= 0, "
                f"got {self.cost.prefill_tokens_per_s} and {self.cost.decode_step_s}"
            )


@dataclass
class _ScratchStates:
    """A one-slot stand-in for a state pool (its ``conv`` and ``temporal`` tensors) that
    :func:`~mamba_radix.state_stamp.write_stamp` writes into (:meth:`Engine._holds_restored`)."""

    conv: list[Any]
    temporal: Any


@dataclass(eq=False)
class _SimReq:
    """A request inside the engine: the cache's :class:`Req` plus the simulator's bookkeeping."""

    trace: TraceRequest
    req: Req
    arrival_s: float
    input_ids: array  # int64, the prompt as the Req holds it
    output_ids: list[int]
    final_kv_len: int  # KV committed at finish: input + output - 1 (the last token's KV is never computed)
    # fingerprint of every prefix of input + output: the stamps' contents (None without verify_states:
    # nothing reads a stamp then, so none is computed or written)
    prefix_fp: PrefixFingerprints | None
    admitted_s: float = 0.0
    first_token_s: float = 0.0
    sync_step: int = 0  # global decode step at which kv_len was last brought up to date
    event_step: int = 0  # global decode step of this request's next event
    in_decode: bool = False


@dataclass(frozen=True)
class _Expanded:
    """The waiting head's tokens, expanded once however often its admission is retried."""

    index: int
    input_ids: array  # int64: the Req takes it as is (no Python list of the prompt is ever built)
    input_array: np.ndarray


class Engine:
    """One simulation: pools sized by ``pools``, the cache built over them, a trace replayed through it.
    ``policy``: a research policy (:mod:`mamba_radix.policy`) for the cache; its requests' ``rid`` is the
    trace index.

    Side effects: allocates the pools (the request table is ``rows x max_context_len`` int32, on the
    CPU resident only in the rows and positions written); over pools of at least
    :data:`~mamba_radix.sim.memory.LARGE_KV_TOKENS` KV tokens, first runs a full garbage collection
    (:func:`~mamba_radix.sim.memory.release_memory`: earlier engines' trees are cyclic garbage).
    """

    def __init__(
        self,
        config: CacheConfig,
        pools: PoolSizes,
        max_context_len: int,
        options: EngineOptions | None = None,
        policy: CachePolicy | None = None,
        *,
        workload: Sequence[TraceRequest] | None = None,
    ) -> None:
        pool_checkpoints = getattr(pools, "checkpoint_slots", None)
        if config.checkpoint_format != "model" and config.checkpoint_slots is None and pool_checkpoints:
            # the budget divided the state bytes into working and checkpoint slots: the cache's pool gets
            # the checkpoint part (None: the cache's default, twice the state slots)
            config = config.replace(checkpoint_slots=pool_checkpoints)
        self.options = options or EngineOptions()
        config = _host_sized(config, pools, self.options)
        # host_split "planned" needs the workload: given here, or read by run() (the cache is then built
        # with the ratio's sizes first and rebuilt with the same bytes split, before any request)
        self._host_plan_pending = False
        if self.options.host_split == "planned":
            if workload is not None:
                config = _host_planned(config, pools, workload)
            elif not config.host_tier:
                config = _host_planned(config, pools, ())  # raises: no host tier to split
            elif policy is not None:  # run() would build a second cache, and a policy serves one
                raise ConfigError(
                    "host_split='planned' with a research policy needs the workload up front: "
                    "Engine(..., workload=requests)"
                )
            else:
                self._host_plan_pending = True
        # the tiered sizes, which a pending planned split starts from in run(); the device pools bound how
        # many requests run at once, merged or not
        self._tiered = (config, pools)
        device_slots = pools.state_slots
        if self.options.host_merged:
            config, pools = _merged_tiers(config, pools)
        self.config = config
        self.pools = pools
        check_simulable(config)
        if pools.kv_tokens >= LARGE_KV_TOKENS:
            # an engine built in a loop (Marconi's warm-up grid, a demand pass before the run) would
            # otherwise allocate beside its predecessors' trees, still uncollected (see sim.memory)
            release_memory()
        self.max_running, self.rows_bound = request_rows(
            config, device_slots, self.options.max_running_requests
        )
        if self.max_running < 1:
            raise ConfigError(
                f"{pools.state_slots} state slots admit no request ({config.slots_per_request} per request); "
                "give pools with more state slots (raise max_mamba_cache_size or mamba_full_memory_ratio)"
            )
        self.max_context_len = max_context_len
        self._policy = policy
        self._build_cache(config)
        self.metrics = RunMetrics(keep_per_request=self.options.keep_per_request)
        # the host tier's transfer model: the link, the host->device bytes already timed, and the compute
        # time of the last forward (a load issued during it overlaps it)
        self._loaded_bytes_timed = 0
        self._prev_forward_s = 0.0
        self._attach_host_tier(config)
        # scheduler state
        self.now_s = 0.0
        self.global_step = 0
        self.waiting: deque[tuple[TraceRequest, float]] = deque()
        self.prefilling: deque[_SimReq] = deque()
        self.decoding: set[_SimReq] = set()
        self._events: list[tuple[int, int, _SimReq]] = []
        self._event_seq = 0
        self.finished = 0
        self.rejected = 0
        # admission is retried only after resources changed (a request finished) or the head changed
        self._resource_epoch = 0
        self._blocked: tuple[int, int] | None = None
        self._ideal: IdealHit | None = None
        self._ideal_hits: dict[int, int] = {}
        self._precomputed_ideal: Sequence[int] | None = None
        self._head: _Expanded | None = None
        self._sample_every = 1
        self._on_finish: Callable[[int], None] | None = None
        self._client: Client | None = None
        self._log: SchedulerLog | None = (
            SchedulerLog(self.options.log_every, self.options.log or print)
            if self.options.log_every
            else None
        )

    def _build_cache(self, config: CacheConfig) -> None:
        """Build the pools and the cache over them for ``config`` (``__init__``, and again at the start of
        :meth:`run` when a planned host split changes the host pools). Side effects: allocates the pools
        and sets ``cache``, the pool attributes, ``split`` and ``unified_bytes``. O(pool sizes)."""
        from mamba_radix.cache import MambaRadixCache  # the cache lands later than the pools

        pools, max_context_len, policy = self.pools, self.max_context_len, self._policy
        self.split: AdaptiveSplit | None = None
        self.unified_bytes: int | None = None  # unified memory: the byte budget both pools share
        # the pools: as sized, or, with an adaptive split, at the physical sizes the whole budget buys as
        # the capacity-limited pools of sim.capacity_limit (the split lends each part of the budget)
        kv_tokens, state_slots = pools.allocator_kv_tokens(config.page_size), pools.state_slots
        factories: dict[str, Any] = {}
        if self.options.split is not None and config.host_tier:
            raise ConfigError(
                "the simulator does not model the host tier with an adaptive split; drop the split or set "
                "host_kv_tokens=0"
            )
        if self.options.split is not None:
            floor = max(self.options.split.min_kv_tokens, max_context_len + 1)
            self.split = AdaptiveSplit(
                replace(self.options.split, min_kv_tokens=floor),
                pools.kv_tokens * pools.bytes_per_kv_token + pools.state_slots * pools.bytes_per_state_slot,
                pools.bytes_per_kv_token,
                pools.bytes_per_state_slot,
                pools.kv_tokens,
                pools.state_slots,
                page_size=config.page_size,
            )
            kv_tokens, state_slots = self.split.physical_kv_tokens, self.split.physical_state_slots
            factories = {"mamba_pool_factory": LimitedMambaPool, "kv_allocator_factory": limited_kv_allocator}
        cache_class: type[MambaRadixCache] = MambaRadixCache
        if config.enable_unified_memory:
            from mamba_radix.sim.unified import UnifiedMemoryCache  # imports the cache, as above

            if self.split is not None:
                raise ConfigError(
                    "unified memory and an adaptive split both move the KV/state line; choose one"
                )
            physical, self.unified_bytes = unified_pools(pools)
            # paged: the KV allocator holds whole pages (the budget's bytes short of a page hold states)
            kv_tokens, state_slots = physical.allocator_kv_tokens(config.page_size), physical.state_slots
            # as many rows as the whole budget's slots admit: the byte budget, not the start-up ratio, bounds
            # the running requests (max_running_requests caps them as under a static split)
            self.max_running, self.rows_bound = request_rows(
                config, state_slots, self.options.max_running_requests
            )
            factories = {"mamba_pool_factory": LimitedMambaPool, "kv_allocator_factory": limited_kv_allocator}
            cache_class = UnifiedMemoryCache
        self.cache = cache_class.build(
            config,
            num_tokens=kv_tokens,
            num_slots=state_slots,
            max_running_requests=self.max_running,
            max_context_len=max_context_len + 1,
            num_layers=SIM_STATE_LAYERS,
            conv_shapes=SIM_CONV_SHAPES,
            temporal_shape=SIM_TEMPORAL_SHAPE,
            policy=policy,
            **factories,
        )
        if self.split is not None:
            self.split.attach(self.cache)
        if self.unified_bytes is not None:
            from mamba_radix.sim.unified import UNIFIED_FLOOR_FRACTION

            floors = {
                "kv": int(pools.kv_tokens * pools.bytes_per_kv_token * UNIFIED_FLOOR_FRACTION),
                "state": int(pools.state_slots * pools.bytes_per_state_slot * UNIFIED_FLOOR_FRACTION),
            }
            self.cache.attach_budget(  # type: ignore[attr-defined]
                self.unified_bytes, pools.bytes_per_kv_token, pools.bytes_per_state_slot, floors
            )
        self.mamba_pool = self.cache.mamba_pool
        self.req_pool = self.cache.req_to_token_pool
        self.kv_pool: KVAllocator = self.cache.token_to_kv_pool_allocator
        self.stamps = StampIO(self.mamba_pool)
        # quantized formats: checkpoints are not state slots (metrics, and the restored-state check)
        self.checkpoint_pool = self.cache.checkpoint_pool

    def _attach_host_tier(self, config: CacheConfig) -> None:
        """The host tier's transfer model for ``config``: the link and the host-tier metrics (neither
        without the tier). O(1)."""
        self.host_link = _host_link(config, self.options)
        self.metrics.host_tier = None
        if self.host_link is not None:
            self.metrics.host_tier = HostTierMetrics(
                self.host_link.name,
                self.host_link.gb_per_s,
                config.host_kv_tokens,
                config.host_state_slots,
                config.host_write_policy,
            )

    def _plan_host(self, requests: Sequence[TraceRequest]) -> None:
        """Split the host bytes by the planner's rule on ``requests`` and rebuild the cache when the
        sizes change (before any request: nothing to carry over). O(workload) plus a rebuild."""
        self._host_plan_pending = False
        tiered_config, device_pools = self._tiered
        config, pools = _host_planned(tiered_config, device_pools, requests), device_pools
        if self.options.host_merged:
            config, pools = _merged_tiers(config, device_pools)
        if config == self.config and pools == self.pools:
            return
        self.config, self.pools = config, pools
        self._build_cache(config)
        self._attach_host_tier(config)

    # ----------------------------------------------------------------------------------------- running
    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def run(
        self,
        requests: Iterable[TraceRequest],
        total: int | None = None,
        on_finish: Callable[[int], None] | None = None,
        ideal_hits: Sequence[int] | None = None,
    ) -> RunMetrics:
        """Replay ``requests`` (in trace order) to the end. ``total`` (if known) spaces the pool samples;
        ``on_finish(n)`` is called after each finished request (progress bars); ``ideal_hits[i]`` is the
        ideal hit of request index ``i`` if already known (a sweep computes it once per trace), else the
        engine computes it as it goes.

        Side effects: mutates the cache and pools. Cost: dominated by the cache's operations, O(tokens)
        per request plus O(log n) per decode event.
        """
        if self._host_plan_pending:  # host_split "planned" without a workload at construction
            requests = list(requests)
            self._plan_host(requests)
        if total:
            self._sample_every = max(1, total // max(1, self.options.num_samples))
        self._on_finish = on_finish
        self._precomputed_ideal = ideal_hits
        source = iter(requests)
        sequential = self.options.mode == "sequential"
        client = Client(lambda: self._pull(source), None if sequential else self.options.max_concurrency)
        self._client = client
        self._sample()
        while True:
            # arrivals
            if sequential:  # the next request "arrives" when the previous one is done: no queueing
                if not client.done and not self.waiting and self.running == 0:
                    self.waiting.append((client.take_next()[0], self.now_s))
                    self._prev_forward_s = 0.0  # the device idled: no forward to hide a load behind
            else:
                client.send_due(self.now_s, self.waiting)
            # a prefill batch has priority over decode (SGLang without mixed chunks)
            if self._prefill_step():
                continue
            if self.decoding:
                limit = None
                next_send_s = None if self.waiting or sequential else client.next_send_s()
                if next_send_s is not None:
                    step_s = self.options.cost.decode_step_time_s(len(self.decoding))
                    limit = (
                        self.global_step + max(1, math.ceil((next_send_s - self.now_s) / step_s))
                        if step_s
                        else None
                    )
                self._decode_until_event(limit)
                continue
            if self.waiting:  # nothing runs and the head still does not fit: it never will
                self._reject(self.waiting.popleft()[0])
                continue
            next_arrival_s = client.next_arrival_s()
            if next_arrival_s is not None:
                if next_arrival_s > self.now_s:
                    self._prev_forward_s = 0.0  # the device idles until the arrival
                self.now_s = max(self.now_s, next_arrival_s)
                continue
            if client.held:  # nothing outstanding, so every permit is free: an engine bug
                raise SimulationError(
                    f"{len(client.held)} requests held at the client with nothing outstanding"
                )
            break
        self.metrics.sim_time_s = self.now_s
        self._host_counters()
        if not sequential and client.first_send_s is not None:
            self.metrics.duration_s = self.now_s - client.first_send_s
        self._sample(force=True)
        return self.metrics

    def _reject(self, trace: TraceRequest) -> None:
        """Drop a request that can never run (counted in ``rejected_requests``; the CLI warns)."""
        self._ideal_hits.pop(trace.index, None)
        self.rejected += 1
        if self._client is not None:
            self._client.release(self.now_s)
        self.metrics.record_blocked("too_long")

    def _pull(self, source: Iterator[TraceRequest]) -> Arrival | None:
        trace = next(source, None)
        if trace is None:
            return None
        if self._precomputed_ideal is not None:
            self._ideal_hits[trace.index] = self._precomputed_ideal[trace.index]
        else:
            if self._ideal is None:
                self._ideal = ideal_for(trace)
            self._ideal_hits[trace.index] = self._ideal.observe(trace)
        if self.options.mode == "sequential":
            return trace, 0.0
        return trace, trace.timestamp_ms / 1000.0 * self.options.arrival_time_scale

    # --------------------------------------------------------------------------------------- admission
    def _expand(self, trace: TraceRequest) -> _Expanded:
        """The head's tokens and match key, built once per request (admission may be retried)."""
        if self._head is None or self._head.index != trace.index:
            arr = trace.input_array()
            ids = array("q")
            ids.frombytes(arr.tobytes())  # memcpys (a list of the prompt's ints cost ~100 us a request)
            self._head = _Expanded(trace.index, ids, arr)
        return self._head

    def _try_admit(self, trace: TraceRequest, arrival_s: float) -> _SimReq | str:
        """Admit one request or return why not (``req_rows``, ``state_slots``, ``kv_tokens``, ``too_long``).

        ``cache.admit`` checks before anything changes, so a refusal leaves the tree, its recency order,
        the pools and the cache's stats exactly as they were; ``can_admit`` then says why. O(L + path).
        """
        if self.running >= self.max_running:
            return self.rows_bound
        head = self._expand(trace)
        output_ids = trace.output_ids
        req = Req(rid=trace.index, origin_input_ids=head.input_ids, extra_key=trace.extra_key)
        max_new_tokens = max(len(output_ids), 1)
        device_hit = 0
        if self.host_link is not None:  # the device hit before a load-back, to tell the tiers' hits apart
            key = RadixKey.trusted(memoryview(head.input_ids)[: len(head.input_ids) - 1], trace.extra_key)  # type: ignore[arg-type]
            device_hit = self.cache.peek_prefix(key).hit_len
        if not self.cache.admit(req, max_new_tokens):  # refused: nothing changed; ask why
            check = self.cache.can_admit(req, max_new_tokens)
            if check.ok:
                raise SimulationError(
                    f"request {trace.index}: cache.admit refused although can_admit agrees (a cache bug)"
                )
            return check.reason  # type: ignore[return-value]
        sim = _SimReq(
            trace=trace,
            req=req,
            arrival_s=arrival_s,
            input_ids=head.input_ids,
            output_ids=output_ids,
            final_kv_len=len(head.input_ids) + max(len(output_ids) - 1, 0),
            prefix_fp=(
                PrefixFingerprints(np.concatenate([head.input_array, trace.output_array()]))
                if self.options.verify_states
                else None
            ),
            admitted_s=self.now_s,
        )
        self._head = None
        self.metrics.record_admission(
            trace.index,
            trace.input_len,
            trace.output_len,
            req.cache_protected_len,
            req.full_kv_hit_len,
            self._ideal_hits.pop(trace.index, 0),
        )
        if self.host_link is not None and self.cache.take_load_plan(req) is not None:
            self.metrics.record_host_hit(trace.index, req.cache_protected_len - device_hit)
        return sim

    # ------------------------------------------------------------------------------------------ prefill
    def _prefill_step(self) -> bool:
        """Form and run one prefill batch. Returns False if there was nothing to prefill."""
        chunk = self.config.chunked_prefill_size
        budget = math.inf if chunk < 0 else chunk
        batch: list[tuple[_SimReq, int]] = []
        for sim in self.prefilling:  # the chunked request(s) in flight go first
            n = self._chunk_len(sim, budget)
            if n <= 0:
                break
            batch.append((sim, n))
            budget -= n
        while budget > 0 and self.waiting:
            trace, arrival_s = self.waiting[0]
            if self._blocked == (self._resource_epoch, trace.index):
                break
            got = self._try_admit(trace, arrival_s)
            if got == "too_long":  # it never fits, however empty the pools get: reject it now
                self.waiting.popleft()
                self._reject(trace)
                continue
            if isinstance(got, str):
                self.metrics.record_blocked(got)
                self.metrics.record_running(self.running, got)
                self._blocked = (self._resource_epoch, trace.index)
                break
            self.waiting.popleft()
            self.prefilling.append(got)
            self.metrics.record_running(self.running, None)
            n = self._chunk_len(got, budget)
            if n <= 0:  # admitted; its first chunk waits for the next batch (it then goes first)
                break
            batch.append((got, n))
            budget -= n
        if not batch:
            return False
        tokens = sum(n for _, n in batch)
        log = self._log
        cached = 0
        if log is not None:  # SGLang's #cached-token: the hits of the requests starting in this batch
            cached = sum(
                s.req.cache_protected_len for s, _ in batch if s.req.kv_len == s.req.cache_protected_len
            )
        for sim, n in batch:
            self._prefill_chunk(sim, n)
        if log is not None:
            log.prefill(
                self.now_s,
                len(batch),
                tokens,
                cached,
                self._pool_view(),
                len(self.decoding),
                len(self.waiting),
            )
        if self.host_link is not None:
            self.now_s += self._load_wait_s()  # the forward waits for its load-backs
        self._prev_forward_s = self.options.cost.prefill_s(tokens)
        self.now_s += self._prev_forward_s
        for sim, _ in batch:
            if sim.req.kv_len == len(sim.input_ids):
                self.prefilling.remove(sim)
                self._first_token(sim)
        return True

    def _load_wait_s(self) -> float:
        """The host tier's transfer model for one prefill batch: the host->device bytes loaded since the
        last batch (the cache's counters times the run's bytes per KV token and state slot) take
        ``bytes / link`` seconds; the part that fits in the previous forward's compute time overlaps it, the
        rest is returned (the batch waits for it). Counts both parts in the metrics. O(1)."""
        assert self.host_link is not None and self.metrics.host_tier is not None
        loaded = self._host_bytes()[0]
        moved = loaded - self._loaded_bytes_timed
        if moved <= 0:
            return 0.0
        self._loaded_bytes_timed = loaded
        load_s = self.host_link.transfer_s(moved)
        overlap_s = min(load_s, self._prev_forward_s)
        self._prev_forward_s -= overlap_s  # a later load cannot hide behind the same compute again
        host = self.metrics.host_tier
        host.load_s += load_s
        host.load_overlapped_s += overlap_s
        host.load_overlapped_bytes += round(moved * overlap_s / load_s)
        host.load_exposed_s += load_s - overlap_s
        return load_s - overlap_s

    def _host_bytes(self) -> tuple[int, int]:
        """(host->device, device->host) bytes the host tier has moved so far on the model: the cache's
        counters times the run's bytes per KV token and per state slot. O(1)."""
        st = self.cache.host_stats
        assert st is not None
        kv_b, slot_b = self.pools.bytes_per_kv_token, self.pools.bytes_per_state_slot
        return (
            st.kv_loaded * kv_b + st.states_loaded * slot_b,
            st.kv_backed_up * kv_b + st.states_backed_up * slot_b,
        )

    def _host_counters(self) -> None:
        """Copy the cache's host counters and the bytes they moved into the run's metrics (end of run)."""
        host, st = self.metrics.host_tier, self.cache.host_stats
        if host is None or st is None:
            return
        host.load_backs, host.kv_tokens_loaded, host.states_loaded = (
            st.host_hits,
            st.kv_loaded,
            st.states_loaded,
        )
        host.loads_skipped, host.backups_skipped = st.loads_skipped, st.backups_skipped
        host.kv_tokens_backed_up, host.states_backed_up = st.kv_backed_up, st.states_backed_up
        host.host_tokens_evicted = st.host_tokens_evicted
        host.bytes_host_to_device, host.bytes_device_to_host = self._host_bytes()

    def _chunk_len(self, sim: _SimReq, budget: float) -> int:
        """The next chunk of ``sim`` within ``budget`` tokens, cut as SGLang's scheduler cuts it (the rest
        of the prompt, or up to a page boundary: the cache's rule); 0 when the budget reaches none."""
        rest = len(sim.input_ids) - sim.req.kv_len
        if budget >= rest:
            return rest
        return self.cache.prefill_chunk_len(sim.req, int(budget)) if budget > 0 else 0

    def _prefill_chunk(self, sim: _SimReq, n: int) -> None:
        """One chunk ``[kv_len, kv_len + n)``: extend, play the model, commit (the chunk's checkpoint goes
        to the tree unless the request finishes right away)."""
        req = sim.req
        self._verify_live(sim)
        plan = self._extend(sim, n)
        self._run_model(sim, plan)
        self.metrics.prefill_chunks += 1
        last = plan.end == len(sim.input_ids)
        if last and sim.output_ids:
            req.output_ids = sim.output_ids[:1]  # the token the last prefill chunk samples
        self.cache.commit(plan, finished=last and plan.end >= sim.final_kv_len)

    def _extend(self, sim: _SimReq, n: int) -> ForwardPlan:
        plan = self.cache.extend(sim.req, n)
        if plan is None:
            raise SimulationError(
                f"request {sim.trace.index}: {n} KV tokens could not be had although admission reserved them "
                f"(free {self.kv_pool.available_size()}, evictable {self.cache.full_evictable_size()})"
            )
        return plan

    def _run_model(self, sim: _SimReq, plan: ForwardPlan) -> None:
        """The model's part of a forward: the state at ``plan.end`` into the live slot, the tracked state
        into the track slot. O(1) (stamps). Without ``verify_states`` nothing is written: no stamp would
        ever be read (the slots' contents do not change what the cache does)."""
        fps = sim.prefix_fp
        if fps is not None:
            self.stamps.write(plan.live_slot, fps.at(plan.end), plan.end)
        if plan.track_slot is not None:
            assert plan.track_len is not None
            if fps is not None:
                self.stamps.write(plan.track_slot, fps.at(plan.track_len), plan.track_len)
            if not plan.is_prefill:
                self.metrics.decode_boundaries += 1

    def _verify_live(self, sim: _SimReq) -> None:
        """With ``verify_states``: the live slot must hold the state of exactly ``kv_len`` tokens. O(1)."""
        if not self.options.verify_states:
            return
        slot, kv_len = sim.req.mamba_pool_idx, sim.req.kv_len
        assert sim.prefix_fp is not None  # computed whenever verify_states is on
        want = (sim.prefix_fp.at(kv_len), kv_len)
        if not self.stamps.holds(slot, *want):  # type: ignore[arg-type]
            if self.checkpoint_pool is not None and self._holds_restored(slot, *want):  # type: ignore[arg-type]
                return  # restored from a quantized checkpoint of exactly this prefix
            got = read_stamp(self.mamba_pool, slot)  # the slow reader, for the message
            raise StateMismatchError(
                f"request {sim.trace.index}: live slot {sim.req.mamba_pool_idx} holds the state of "
                f"{got[1]} tokens (fingerprint {got[0]:#x}) but should hold {want[1]} tokens ({want[0]:#x})"
            )

    def _holds_restored(self, slot: int, fp: int, num_tokens: int) -> bool:
        """Quantized formats: whether state slot ``slot`` holds, bit for bit, what a checkpoint of the
        stamp ``(fp, num_tokens)`` restores to: the stamp written into a one-slot scratch of the pool's
        layout, quantized and dequantized by the format's reference arithmetic (which the Triton kernels
        match bit for bit) with the checkpoint store's rows. Only when the raw stamp check failed (right
        after a hit). O(slot elements)."""
        import torch
        from mamba_radix_kernels import quant_naive

        from mamba_radix.checkpoint_format import new_checkpoint_store
        from mamba_radix.state_stamp import write_stamp

        pool, store = self.mamba_pool, self.checkpoint_pool
        assert store is not None
        scratch = _ScratchStates(
            [torch.zeros_like(t[:, :1]) for t in pool.conv], torch.zeros_like(pool.temporal[:, :1])
        )
        write_stamp(scratch, 0, fp, num_tokens)
        tensors = [*scratch.conv, scratch.temporal]
        row_lens = [int(q.shape[-1]) for q in store.storage.qs]
        one = torch.zeros(1, dtype=torch.int64)
        roundtrip = new_checkpoint_store(store.fmt, tensors, 1, row_lens=row_lens)
        quant_naive.quantize_gather_ref(tensors, one, roundtrip.qs, roundtrip.scales, one)
        quant_naive.dequantize_scatter_ref(roundtrip.qs, roundtrip.scales, one, tensors, one)
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return all(
            torch.equal(t[:, slot].view(width[t.element_size()]), r[:, 0].view(width[r.element_size()]))
            for t, r in zip(pool.tensors, tensors, strict=True)
        )

    def _first_token(self, sim: _SimReq) -> None:
        sim.first_token_s = self.now_s
        self.metrics.record_first_token(
            sim.trace.index, self.now_s - sim.arrival_s, sim.admitted_s - sim.arrival_s
        )
        if sim.req.kv_len >= sim.final_kv_len:
            self._finish(sim)
            return
        sim.in_decode = True
        sim.sync_step = self.global_step
        self.decoding.add(sim)
        self._schedule_event(sim)

    # ------------------------------------------------------------------------------------------- decode
    def _schedule_event(self, sim: _SimReq) -> None:
        kv = sim.req.kv_len
        target = sim.final_kv_len
        boundary = self.cache.buffer.next_decode_boundary(kv)
        if boundary is not None:
            target = min(target, boundary)
        if self.options.decode_step_events:
            target = min(target, kv + 1)
        sim.event_step = sim.sync_step + (target - kv)
        self._event_seq += 1
        heapq.heappush(self._events, (sim.event_step, self._event_seq, sim))

    def _decode_until_event(self, limit: int | None) -> None:
        """Advance every decoding request in lockstep to the next event (or ``limit``), then handle the
        requests whose event it is. O(log n) per event plus the cache's work."""
        target = self._events[0][0]
        if limit is not None:
            target = min(target, limit)
        steps = target - self.global_step
        step_s = self.options.cost.decode_step_time_s(len(self.decoding))
        if self._log is not None and steps > 0:
            self._log.decode_run(
                self.global_step, target, self.now_s, step_s, len(self.decoding), self._log_line_at
            )
        self.now_s += steps * step_s
        if steps > 0:
            self._prev_forward_s = step_s
        self.global_step = target
        while self._events and self._events[0][0] <= target:
            step, _, sim = heapq.heappop(self._events)
            if sim not in self.decoding or step != sim.event_step:
                continue
            self._decode_event(sim)

    def _decode_event(self, sim: _SimReq) -> None:
        """Catch ``sim`` up to the current step: one extend over the steps since its last event (ending at
        its next decode boundary or its last token), one stamp, then the boundary's track or the finish."""
        req = sim.req
        steps = self.global_step - sim.sync_step
        n_in = len(sim.input_ids)
        self._verify_live(sim)
        end = req.kv_len + steps
        req.output_ids = sim.output_ids[: end - n_in]  # the tokens whose KV this segment computes
        plan = self._extend(sim, steps)
        self._run_model(sim, plan)
        req.output_ids = sim.output_ids[: end - n_in + 1]  # and the token it samples
        sim.sync_step = self.global_step
        self.metrics.decode_segments += 1
        finishing = end >= sim.final_kv_len
        # SGLang's prefix-cache update runs before its finish check: a boundary in the step that samples
        # the last token is tracked, and finish inserts it.
        self.cache.commit(plan, finished=finishing)
        if finishing:
            self.decoding.discard(sim)
            self._finish(sim)
            return
        self._schedule_event(sim)

    # ------------------------------------------------------------------------------------------- finish
    def _finish(self, sim: _SimReq) -> None:
        req = sim.req
        self.cache.finish(req)
        self.finished += 1
        self.metrics.record_finish(
            self.now_s - sim.arrival_s, sim.first_token_s - sim.arrival_s, sim.trace.output_len
        )
        if self._client is not None:
            self._client.release(self.now_s)
        self._resource_epoch += 1
        if self.split is not None:
            self.split.after_finish(self.cache)
        every = self.options.check_invariants_every
        if every and self.finished % every == 0:
            running = [s.req for s in self.prefilling] + [s.req for s in self.decoding]
            self.cache.check_invariants(running)  # with conservation: every KV index / slot has one owner
        if self.finished % self._sample_every == 0:
            self._sample()
        if self._on_finish is not None:
            self._on_finish(self.finished)

    # ------------------------------------------------------------------------------------------ metrics
    def _sample(self, force: bool = False) -> None:
        samples = self.metrics.samples
        if not force and samples and samples[-1].finished == self.finished:
            return
        kv_tree = self.cache.full_evictable_size() + self.cache.full_protected_size()
        self.metrics.sample(
            PoolSample(
                time_s=round(self.now_s, 4),
                finished=self.finished,
                running=self.running,
                waiting=len(self.waiting),
                kv_used_tokens=int(self.kv_pool.used) + self.cache.reserved_kv_tokens,
                kv_tree_tokens=int(kv_tree),
                kv_capacity_tokens=self._capacity()[0],
                slots_used=int(self.mamba_pool.used),
                # quantized formats: the tree holds checkpoint-pool slots, none of the state slots counted
                slots_tree=0
                if self.checkpoint_pool is not None
                else int(self.cache.mamba_evictable_size() + self.cache.mamba_protected_size()),
                slots_reserved=int(self.req_pool.num_reserved_slots()),
                slot_capacity=self._capacity()[1],
            )
        )

    def _pool_view(self, step: int | None = None) -> PoolView:
        """The pools as SGLang's log reports them at global decode step ``step`` (default: now): KV in use
        (allocated - evictable) plus the decode KV owed at that step, state slots in use (allocated -
        evictable checkpoints). O(running requests) when KV is owed, else O(1)."""
        step = self.global_step if step is None else step
        page = self.config.page_size
        owed = 0
        for sim in self.decoding:
            behind = step - sim.sync_step
            if behind > 0:
                kv = sim.req.kv_len
                owed += behind if page == 1 else -(-(kv + behind) // page) * page - -(-kv // page) * page
        kv_capacity, slot_capacity = self._capacity()
        return PoolView(
            full_tokens=int(self.kv_pool.used) - self.cache.full_evictable_size() + owed,
            full_capacity_tokens=kv_capacity,
            # state slots in use: allocated minus evictable checkpoints; quantized formats keep checkpoints
            # in their own pool, so every allocated state slot is a running request's
            mamba_slots=int(self.mamba_pool.used)
            - (0 if self.checkpoint_pool is not None else self.cache.mamba_evictable_size()),
            mamba_capacity_slots=slot_capacity,
        )

    def capacity(self) -> tuple[int, int]:
        """(KV tokens, state slots) the pools may hold now: as sized; the adaptive split's current line;
        under unified memory what each holds plus what the unspent bytes would buy it (both move with
        load). O(1)."""
        return self._capacity()

    def _capacity(self) -> tuple[int, int]:
        if self.split is not None:
            return self.split.kv_tokens, self.split.state_slots
        if self.unified_bytes is not None:
            kv, slots = self.kv_pool, self.mamba_pool
            return int(kv.used) + kv.available_size(), int(slots.used) + slots.available_size()
        return self.pools.kv_tokens, self.pools.state_slots

    def _log_line_at(self, step: int, time_s: float) -> tuple[PoolView, int]:
        """A decode line's pools and queue at ``step`` (``time_s``) inside a decode jump. O(running)."""
        assert self._client is not None
        sent = 0 if self.options.mode == "sequential" else self._client.sent_by(time_s)
        return self._pool_view(step), len(self.waiting) + sent

    def cache_stats(self) -> dict[str, Any]:
        """The cache's own counters (:class:`~mamba_radix.cache.CacheStats`), the bytes its state copies
        would move on the model, and the engine's admission counts. O(1).

        ``state_copies`` is the one copy count: every state copy in a run is the cache's (a copy-on-write
        of a hit, a no_buffer hand-over), counted by the cache where it copies."""
        stats = self.cache.stats
        out: dict[str, Any] = asdict(stats)
        out["state_copy_bytes"] = stats.state_copies * self.pools.bytes_per_state_slot
        out["rejected_requests"] = self.rejected
        out["max_running_requests"] = self.max_running
        return out


def wall_clock() -> float:
    """Seconds from a monotonic clock (for reporting wall time only; never used by the simulation)."""
    return time.perf_counter()
