"""The policy registry (:data:`POLICIES`): every policy the experiment compares, by name, with what it
models and what it does not, and :func:`run_policy` to replay a trace under one of them.

A policy is a config (the SGLang release preset it starts from, plus its own knobs) and optionally a
:class:`~mamba_radix.policy.CachePolicy` object. Offline ones (``oracle``) and tuned ones (``marconi``) need
the trace: they get a :class:`PolicyContext` (the requests, the pools, memoised pre-passes).

Equal memory: every policy of a comparison runs on the same :class:`~mamba_radix.sim.budget.PoolSizes`
(the same bytes split the same way), with the same buffer strategy, so the slots per running request and
the pool sizes are equal; only eviction and admission differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mamba_radix.config import CacheConfig
from mamba_radix.errors import ConfigError
from mamba_radix.peers import apply_peer
from mamba_radix.policies.future import FutureIndex, demand_hits
from mamba_radix.policies.marconi import Marconi, tune_alpha, with_marconi_admission
from mamba_radix.policies.oracle import Oracle

if TYPE_CHECKING:  # pragma: no cover
    from mamba_radix.sim.split import SplitOptions
from mamba_radix.policies.ours import Sift
from mamba_radix.policies.sift2 import Sift2
from mamba_radix.policies.sift2_sessions import Sift2Sessions
from mamba_radix.policies.sift3 import Sift3
from mamba_radix.policies.thinning import CoverageThinning
from mamba_radix.policies.vllm_sparse import SparseRetention
from mamba_radix.policy import CachePolicy
from mamba_radix.sim.budget import PoolSizes
from mamba_radix.sim.traces import TraceRequest

__all__ = [
    "POLICIES",
    "REFERENCES",
    "VARIANTS",
    "PolicyContext",
    "PolicySpec",
    "find_spec",
    "policy_names",
    "run_policy",
]

# Marconi's warm-up prefix: this fraction of the trace (at least MIN_WARMUP requests)
WARMUP_FRACTION = 0.2
MIN_WARMUP = 10


@dataclass
class PolicyContext:
    """What offline and tuned policies may know: the whole trace and the pools of the run.

    ``demands``: the infinite-capacity hits (:func:`demand_hits`) if already known (one pass per workload
    and config, shared by every run of an experiment); computed on first use otherwise.
    """

    requests: Sequence[TraceRequest]
    pools: PoolSizes
    model: str = "kimi-k3"
    demands: dict[CacheConfig, list[int]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)  # what a policy chose (marconi's alpha), for results

    def future(self, config: CacheConfig) -> FutureIndex:
        """The future-use index of the trace under ``config`` (its demand pass is memoised). O(trace)."""
        hits = self.demands.get(config)
        if hits is None:
            hits = demand_hits(config, self.requests, self.model)
            self.demands[config] = hits
        return FutureIndex(self.requests, hits, config.mamba_checkpoint_grid)


@dataclass(frozen=True)
class PolicySpec:
    """One comparable policy: ``configure(base)`` gives its config, ``make(config, context)`` its policy
    object (``None``: the config alone). ``family``: ``sglang``, ``peer``, ``ours`` or ``offline``.
    ``host_tier_problem``: why it cannot run with the host tier on (its class's, readable without building
    it: the makers need the trace), or None."""

    name: str
    family: str
    description: str
    equivalence: str
    configure: Callable[[CacheConfig], CacheConfig]
    make: Callable[[CacheConfig, PolicyContext], CachePolicy | None] = lambda config, ctx: None
    host_tier_problem: str | None = None


def _preset(name: str) -> Callable[[CacheConfig], CacheConfig]:
    return lambda base: apply_peer(base, name)


def _current(base: CacheConfig) -> CacheConfig:
    return apply_peer(base, "sglang-0.5.23")


def _make_marconi(config: CacheConfig, ctx: PolicyContext) -> CachePolicy:
    warmup = ctx.requests[: max(MIN_WARMUP, int(len(ctx.requests) * WARMUP_FRACTION))]
    alpha, saved = tune_alpha(config, ctx.pools, warmup)
    ctx.notes["marconi_alpha"] = alpha
    ctx.notes["marconi_flops_saved_by_alpha"] = saved
    return Marconi(
        alpha, ctx.pools.bytes_per_kv_token, ctx.pools.bytes_per_state_slot, config.mamba_flop_crossover
    )


def _make_oracle(config: CacheConfig, ctx: PolicyContext) -> CachePolicy:
    return Oracle(ctx.future(config))


def _by_name(*specs: PolicySpec) -> dict[str, PolicySpec]:
    return {spec.name: spec for spec in specs}


POLICIES: dict[str, PolicySpec] = _by_name(
    PolicySpec(
        "sglang-0.5.20",
        "sglang",
        "SGLang 0.5.20's MambaRadixCache: LRU over checkpoints (leaf-first ties), 3 free slots before "
        "every prefill chunk, stateless ancestors deleted with a leaf.",
        "Per request identical to SGLang's own cache in sequential replay (experiments/sglang_parity.py).",
        _preset("sglang-0.5.20"),
    ),
    PolicySpec(
        "sglang-0.5.23",
        "sglang",
        "SGLang 0.5.23's UnifiedRadixCache, the current release and the baseline: LRU, exact-slot "
        "eviction, KV-only leaves.",
        "As sglang-0.5.20 (mamba_radix.peers).",
        _current,
    ),
    PolicySpec(
        "sglang-cap3",
        "peer",
        "SGLang 0.5.23 with the per-path cap of PR #31230 at 3 (the PR's benchmark setting): after an "
        "insert, a path's shallowest checkpoints beyond 3 are dropped (not the tail, forks or locked).",
        "The cap is SGLang's rule (tree._enforce_path_cap); the value 3 is the PR's benchmark choice.",
        lambda base: _current(base).replace(mamba_max_states_per_path=3),
    ),
    PolicySpec(
        "thinning",
        "peer",
        "SGLang's coverage thinning (open PR #38000): the victim is the checkpoint whose removal "
        "merges the smallest gap on its chain; locks, forks, reused states and chain tails stay.",
        "See mamba_radix.policies.thinning: no session pins; thins globally.",
        _current,
        lambda config, ctx: CoverageThinning(),
    ),
    PolicySpec(
        "vllm-sparse",
        "peer",
        "vLLM's sparse retention at prefix_cache_retention_interval=0: only the latest replay boundary, "
        "shared-prefix junctions and prompt ends are kept; LRU.",
        "See mamba_radix.policies.vllm_sparse: our 64-token grid, two pools, interval 0 only.",
        _current,
        lambda config, ctx: SparseRetention(),
    ),
    PolicySpec(
        "marconi",
        "peer",
        "Marconi (MLSys'25): branch-and-end admission, utility norm(recency) + alpha * norm(FLOP "
        "efficiency) renormalised at every eviction, alpha by grid search on the first 20% of the trace.",
        "See mamba_radix.policies.marconi: tombstones instead of merges, coarser alpha grid, offline "
        "warm-up replay instead of an online bootstrap window, our grid positions. Not the peer preset "
        "'marconi-static' (--peer marconi-static: the same admission, our static flop_weighted eviction key).",
        lambda base: with_marconi_admission(_current(base)),
        _make_marconi,
    ),
    PolicySpec(
        "sift",
        "ours",
        "Ours: learned kind-aware admission (branch / prompt end / mid-prefill / decode, each kind's "
        "hit ratio learned online), supersession (an older checkpoint on a fork-free path below which a "
        "newer one landed goes first, unless such checkpoints prove to be hit), GreedyDual inside a class "
        "(a checkpoint's priority is the tokens it saves over its fallback, aged by the victims) and "
        "GreedyDual-Size-Frequency for KV leaves (tokens saved per KV token, x64(1+hits) at junctions).",
        "Online (no future knowledge); SGLang 0.5.23's rules otherwise.",
        _current,
        lambda config, ctx: Sift(),
    ),
    PolicySpec(
        "sift2",
        "ours",
        "Sift's successor: seven checkpoint kinds (decode; chunk end, and the chunk end before the last "
        "chunk; branch point, and one in the last chunk; prompt end on and off the block boundary, the "
        "block size learned from KV-match lengths), each kind's hit ratio counting live never-hit "
        "checkpoints as misses, a checkpoint's GreedyDual gain weighted by its kind's ratio.",
        "Online (no future knowledge); SGLang 0.5.23's rules otherwise.",
        _current,
        lambda config, ctx: Sift2(),
    ),
    PolicySpec(
        "sift3",
        "ours",
        "Sift2 with one value estimate for checkpoints and KV (issue 31): a checkpoint's chance of a hit, "
        "learned online per kind and per request feature (prompt-length octave, continued a cached "
        "prefix or not; live never-hit checkpoints counted as misses), orders the KV leaves that hold it "
        "(GreedyDual: the KV clock at the leaf's last touch plus that chance relative to the best kind's) "
        "and sets the checkpoints' eviction classes, after 256 hand-overs (Sift2's order before).",
        "Online (no future knowledge); SGLang 0.5.23's rules otherwise.",
        _current,
        lambda config, ctx: Sift3(),
    ),
    PolicySpec(
        "oracle",
        "offline",
        "Offline reference: Belady's MIN over checkpoints and KV leaves with oracle admission (a "
        "hand-over is kept only if a later request uses it, or its KV shows a later demand's branch).",
        "Optimal only for one equal-value demand per request, sequential, KV not binding (see "
        "mamba_radix.policies.oracle); a strong reference elsewhere.",
        _current,
        _make_oracle,
        Oracle.host_tier_problem,
    ),
)


# Variants of our policy that need what not every trace has (session ids); runnable by name (run_policy)
# and in a definition that names them, but not part of the comparisons over "all" policies (the main job):
# on a trace without the information they are one of the registered policies again.
VARIANTS: dict[str, PolicySpec] = _by_name(
    PolicySpec(
        "sift2-sessions",
        "ours",
        "Sift2 that reads each request's session id: the gap between a session's turns is learned online, "
        "and the checkpoints and KV leaves of a session idle past the 95th percentile of those gaps are "
        "evicted first. Sift2 exactly on traces without session ids.",
        "Online (the session id of a request is known when it arrives); SGLang 0.5.23's rules otherwise.",
        _current,
        lambda config, ctx: Sift2Sessions([r.session_id for r in ctx.requests]),
    ),
)


# Offline references that decompose the oracle's lead; runnable by name (run_policy) but not part of the
# comparisons over "all" policies (the main job), which stay the registry above.
REFERENCES: dict[str, PolicySpec] = _by_name(
    PolicySpec(
        "oracle-death",
        "offline",
        "Offline reference that knows only which candidates are used again, not when: the oracle's "
        "admission, never-used-again checkpoints and KV leaves evicted first, LRU among the rest.",
        "Oracle(knows_order=False) (mamba_radix.policies.oracle): between an online policy and the "
        "oracle, it splits the oracle's lead into predicting death and knowing the order of future uses.",
        _current,
        lambda config, ctx: Oracle(ctx.future(config), knows_order=False),
        Oracle.host_tier_problem,
    ),
)


def find_spec(name: str) -> PolicySpec | None:
    """The spec of ``name`` among :data:`POLICIES`, :data:`VARIANTS` and :data:`REFERENCES` (None if
    unknown). O(1)."""
    return POLICIES.get(name) or VARIANTS.get(name) or REFERENCES.get(name)


def policy_names(family: str | None = None) -> list[str]:
    """Registered names, in registry order (optionally one family's)."""
    return [n for n, s in POLICIES.items() if family is None or s.family == family]


def run_policy(
    name: str,
    base: CacheConfig,
    ctx: PolicyContext,
    *,
    mode: str = "sequential",
    on_finish: Callable[[int], None] | None = None,
    verify_states: bool = False,
    split: SplitOptions | None = None,
    loss_demands: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Replay ``ctx.requests`` under policy ``name`` on ``ctx.pools`` and return its summary: the token hit
    rate, the ideal, the cache's counters and what the policy chose. Raises :class:`ConfigError` for an
    unknown name. ``split``: one byte budget for both pools, the line between them adaptive
    (:mod:`mamba_radix.sim.split`; ``ctx.pools`` is where it starts). Side effects: none outside the
    process. Cost: one simulator run (plus the policy's pre-passes: the oracle's demand run, Marconi's
    warm-up grid). ``loss_demands`` (each request's infinite-capacity hit): the policy runs under
    :func:`~mamba_radix.policies.loss_probe.probe` (no decision changes) and the result gains ``loss``,
    where the hits it missed went."""
    from mamba_radix.sim.engine import Engine, EngineOptions

    spec = find_spec(name)
    if spec is None:
        known = ", ".join([*POLICIES, *VARIANTS, *REFERENCES])
        raise ConfigError(f"unknown policy {name!r}; known: {known}")
    config = spec.configure(base)
    policy = spec.make(config, ctx)
    if loss_demands is not None:
        from mamba_radix.policies.loss_probe import probe

        policy = probe(policy, loss_demands)
    requests = ctx.requests
    max_len = max(r.input_len + r.output_len for r in requests)
    options = EngineOptions(mode=mode, verify_states=verify_states, split=split)  # type: ignore[arg-type]
    engine = Engine(config, ctx.pools, max_len, options, policy=policy)  # the cache sets policy.cache
    metrics = engine.run(requests, total=len(requests), on_finish=on_finish)
    summary = metrics.summary()
    result = {
        "policy": name,
        "token_hit_rate": summary["token_hit_rate"],
        "ideal_hit_rate": summary["ideal_hit_rate"],
        "stats": engine.cache_stats(),
        "notes": dict(ctx.notes),
    }
    if loss_demands is not None:
        result["loss"] = policy.loss_summary()  # type: ignore[union-attr]
    if engine.split is not None:  # the line's path: one SplitStep per decision
        result["split"] = list(engine.split.history)
    return result
