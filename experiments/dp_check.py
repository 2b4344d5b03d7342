"""The static placement optimum (mamba_radix.policies.placement_dp) against the oracle and the online
policies, on small workloads. Prints two markdown tables.

Run it (about 2 minutes on 2 cores)::

    python experiments/dp_check.py                 # 30 random aligned tries, the 4 synthetic workloads
    python experiments/dp_check.py --tries 10 --no-synthetic
    python experiments/dp_check.py --conversation 2000   # and the 2,000-request conversation check (~5 min)

1. **Aligned tries** (12 requests on a random binary trie of depth <= 3 blocks of 64 tokens, ``no_buffer``,
   one chunk per block, KV ample, tree room ``K`` = slots - 1): here checkpoint positions never move, so
   the program's optimum runs in the simulator at exactly its value and the exhaustive search gives the
   dynamic optimum. Per ``K``: hit tokens summed over the tries for the static optimum, the oracle, each
   online policy and the dynamic optimum, and how often each order is broken.
2. **Synthetic workloads** (the generators' defaults, seed 0; the policy experiment's config: extra_buffer,
   SGLang 0.5.23's rules; the slots-bind points): the static optimum over the infinite replay's
   checkpoint positions (predicted), the same placement run in the simulator (realised: positions can
   move there), the oracle and two online policies, as token hit rates.
3. **Conversation** (``--conversation N``): the same columns on the first N Mooncake conversation
   requests at the target check's memory (8M KV tokens, 256 and 1024 slots).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from mamba_radix import CacheConfig
from mamba_radix.peers import apply_peer
from mamba_radix.policies.placement_dp import (
    StaticPlacement,
    aligned_trie_trace,
    exhaustive_dynamic_optimum,
    forest_from_trace,
    optimal_placement,
)
from mamba_radix.policies.registry import POLICIES, PolicyContext, run_policy
from mamba_radix.sim.budget import exact_pools
from mamba_radix.sim.engine import Engine, EngineOptions
from mamba_radix.sim.traces import TraceRequest

GRID = 64
ALIGNED = CacheConfig(
    mamba_radix_cache_strategy="no_buffer",
    disable_overlap_schedule=True,
    chunked_prefill_size=GRID,
    mamba_cache_chunk_size=GRID,
)
KV = 100_000
CAPACITIES = (2, 3, 4)
SYNTHETIC_SLOTS = (8, 12, 16, 32)  # as experiments/policies.py's slots-bind points


def random_paths(seed: int, n: int = 12) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 2, int(rng.integers(1, 4))).tolist()) for _ in range(n)]


def static_run(config: CacheConfig, reqs: Sequence[TraceRequest], keys: set, slots: int, kv: int) -> dict:
    engine = Engine(
        config,
        exact_pools(config, kv, slots),
        max(r.input_len + r.output_len for r in reqs),
        EngineOptions(mode="sequential"),
        StaticPlacement(keys),
    )
    engine.run(reqs)
    return engine.cache_stats()


def aligned_table(num_tries: int) -> str:
    online = [n for n, s in POLICIES.items() if s.family != "offline" and n != "marconi"]
    rows = []
    for capacity in CAPACITIES:
        total: dict[str, int] = {}
        broken = {"oracle < static": 0, "online > oracle": 0, "any > dynamic": 0, "run != static": 0}
        for seed in range(num_tries):
            paths = random_paths(seed)
            reqs = aligned_trie_trace(paths, GRID, seed)
            forest = forest_from_trace(ALIGNED, reqs)
            placement = optimal_placement(forest, capacity)
            real = static_run(ALIGNED, reqs, {forest.key[v] for v in placement.chosen}, capacity + 1, KV)  # type: ignore[index]
            got = {"ideal": int(forest.ideal_value), "static": int(placement.value)}
            got["dynamic"] = exhaustive_dynamic_optimum(paths, capacity, GRID)
            demands: dict = {}
            tokens = sum(r.input_len for r in reqs)
            for name in ["oracle", *online]:
                ctx = PolicyContext(reqs, exact_pools(ALIGNED, KV, capacity + 1), demands=demands)
                got[name] = round(run_policy(name, ALIGNED, ctx)["token_hit_rate"] * tokens)
            broken["oracle < static"] += got["oracle"] < got["static"]
            broken["online > oracle"] += max(got[n] for n in online) > got["oracle"]
            broken["any > dynamic"] += max(got[n] for n in ["static", "oracle", *online]) > got["dynamic"]
            broken["run != static"] += real["hit_tokens"] != got["static"]
            for k, v in got.items():
                total[k] = total.get(k, 0) + v
        rows.append((capacity, total, broken))
    cols = ["ideal", "dynamic", "oracle", "static", *online]
    out = [
        f"Aligned tries: {num_tries} random tries x 12 requests; hit tokens summed (fraction of the dynamic optimum)\n",
        "| K | "
        + " | ".join(cols)
        + " | oracle < static | online > oracle | any > dynamic | run != static |",
        "|---" * (len(cols) + 5) + "|",
    ]
    for capacity, total, broken in rows:
        cells = [f"{total[c]} ({total[c] / total['dynamic']:.3f})" for c in cols]
        flags = [
            str(broken[k]) for k in ("oracle < static", "online > oracle", "any > dynamic", "run != static")
        ]
        out.append(f"| {capacity} | " + " | ".join(cells) + " | " + " | ".join(flags) + " |")
    return "\n".join(out)


def synthetic_table() -> str:
    from mamba_radix.sim.synthetic import GENERATORS

    config = apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), "sglang-0.5.23")
    out = [
        "Synthetic workloads (extra_buffer, SGLang 0.5.23 rules, KV ample; token hit rate; K = slots beyond "
        f"the {config.slots_per_request} a running request holds)\n",
        "| workload | K | infinite | static (predicted) | static (run) | evicted | oracle | sglang-0.5.23 | sift |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("chat", "system-prompt", "agent", "tree"):
        reqs = GENERATORS[name](seed=0)
        tokens = sum(r.input_len for r in reqs)
        kv = sum(r.input_len + r.output_len for r in reqs) + 1
        forest = forest_from_trace(config, reqs)
        demands: dict = {}
        for k in SYNTHETIC_SLOTS:
            slots = k + config.slots_per_request
            placement = optimal_placement(forest, k)
            real = static_run(config, reqs, {forest.key[v] for v in placement.chosen}, slots, kv)  # type: ignore[index]
            rates = {}
            for policy in ("oracle", "sglang-0.5.23", "sift"):
                ctx = PolicyContext(reqs, exact_pools(config, kv, slots), demands=demands)
                rates[policy] = run_policy(policy, config, ctx)["token_hit_rate"]
            out.append(
                f"| {name} | {k} | {forest.ideal_value / tokens:.4f} | {placement.value / tokens:.4f} | "
                f"{real['hit_tokens'] / tokens:.4f} | {real['states_evicted']} | {rates['oracle']:.4f} | "
                f"{rates['sglang-0.5.23']:.4f} | {rates['sift']:.4f} |"
            )
    return "\n".join(out)


def conversation_table(requests: int, kv_tokens: int = 8_000_000, slots: Sequence[int] = (256, 1024)) -> str:
    from mamba_radix.data import trace_path
    from mamba_radix.experiment import Workload, base_config, load_requests

    reqs = load_requests(Workload("conversation", (), (), trace=str(trace_path()), limit=requests))
    config = base_config()
    tokens = sum(r.input_len for r in reqs)
    forest = forest_from_trace(config, reqs)
    demands: dict = {}
    out = [
        f"Conversation, first {requests:,} requests (extra_buffer, sequential, {kv_tokens:,} KV tokens; "
        f"token hit rate; K = slots - {config.slots_per_request})\n",
        "| slots | infinite | static (predicted) | static (run) | oracle | sglang-0.5.23 | sift |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in slots:
        placement = optimal_placement(forest, s - config.slots_per_request)
        real = static_run(config, reqs, {forest.key[v] for v in placement.chosen}, s, kv_tokens)  # type: ignore[index]
        rates = {}
        for policy in ("oracle", "sglang-0.5.23", "sift"):
            ctx = PolicyContext(reqs, exact_pools(config, kv_tokens, s), demands=demands)
            rates[policy] = run_policy(policy, config, ctx)["token_hit_rate"]
        infinite = sum(demands[config]) / tokens
        out.append(
            f"| {s} | {infinite:.4f} | {placement.value / tokens:.4f} | {real['hit_tokens'] / tokens:.4f} | "
            f"{rates['oracle']:.4f} | {rates['sglang-0.5.23']:.4f} | {rates['sift']:.4f} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=30, help="random aligned tries (default 30)")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the synthetic workloads")
    parser.add_argument(
        "--conversation",
        type=int,
        default=0,
        metavar="N",
        help="also the first N Mooncake conversation requests at 256 and 1024 slots (2,000: ~5 min)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print(aligned_table(args.tries))
    if not args.no_synthetic:
        print()
        print(synthetic_table())
    if args.conversation:
        print()
        print(conversation_table(args.conversation))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
