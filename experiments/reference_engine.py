"""A few conversations served by the reference engine with and without the cache, on real model code.

Tiny random-weight Kimi Linear (KDA + MLA) and Qwen3-Next (Gated DeltaNet + GQA) models (transformers,
fp32, CPU) serve ``--conversations`` multi-turn chats that share a system prompt, one turn of every chat
in flight per round. Each model runs once with the radix cache disabled (every prompt token computed)
and once per buffer strategy. Per run: prompt tokens, hit tokens (restored from the cache at admission),
prefill tokens computed and saved, forwards, model and wall time, checkpoints left in the tree, and
whether every greedy token equals the uncached run's.

Writes one JSON line per run (``--out``, default ``experiments/results/reference_engine.jsonl``) and
prints a table. Needs transformers (``pip install 'mamba-radix[engine]'``); nothing is fetched from a
hub. Example: ``python experiments/reference_engine.py`` (about 30 s on one core with 3 repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mamba_radix import CacheConfig
from mamba_radix.reference_engine import tiny_model
from mamba_radix.reference_engine.engine import ReferenceEngine

MODES = ("no_cache", "no_buffer", "extra_buffer", "extra_buffer_lazy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=["kimi_linear", "qwen3_next"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-len", type=int, default=32, help="tokens of the shared system prompt")
    p.add_argument("--user-len", type=int, default=16, help="tokens of each user message")
    p.add_argument("--max-new", type=int, default=8, help="greedy tokens per turn")
    p.add_argument("--chunked-prefill-size", type=int, default=32)
    p.add_argument("--mamba-cache-chunk-size", type=int, default=8)
    p.add_argument("--mamba-track-interval", type=int, default=8)
    p.add_argument("--max-running-requests", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the whole run (the cache's ops are tiny too)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per row; times are the fastest run's")
    p.add_argument("--out", type=Path, default=Path("experiments/results/reference_engine.jsonl"))
    return p.parse_args(argv)


def conversations(engine: ReferenceEngine, args: argparse.Namespace) -> list[list[int]]:
    """Serve the chats round by round (one turn of every chat in flight); returns every turn's outputs."""
    rng = random.Random(args.seed)
    vocab = engine.model.vocab_size
    system = [rng.randrange(3, vocab) for _ in range(args.system_len)]
    chats = [list(system) for _ in range(args.conversations)]
    outputs = []
    for _turn in range(args.turns):
        rids = []
        for chat in chats:
            chat += [rng.randrange(3, vocab) for _ in range(args.user_len)]
            rids.append(engine.submit(list(chat), args.max_new))
        engine.run()
        for chat, rid in zip(chats, rids, strict=True):
            outputs.append(engine.finished[rid])
            chat += engine.finished[rid]
    return outputs


def run_one(family: str, mode: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[list[int]]]:
    model = tiny_model(family, seed=args.seed)
    config = CacheConfig(
        mamba_radix_cache_strategy="no_buffer" if mode == "no_cache" else mode,
        disable_radix_cache=mode == "no_cache",
        chunked_prefill_size=args.chunked_prefill_size,
        mamba_cache_chunk_size=args.mamba_cache_chunk_size,
        mamba_track_interval=args.mamba_track_interval,
    )
    longest = args.system_len + args.turns * (args.user_len + args.max_new)
    engine = ReferenceEngine.build(
        model,
        config,
        num_tokens=max(1024, 2 * args.conversations * longest),
        num_slots=16 * args.max_running_requests,
        max_running_requests=args.max_running_requests,
        max_context_len=longest + 8,
    )
    t0 = time.perf_counter()
    outputs = conversations(engine, args)
    wall_s = time.perf_counter() - t0
    s = engine.stats
    model_s = s.model_s
    for _ in range(args.repeats - 1):  # the same run again on fresh pools: only the times can differ
        again = ReferenceEngine.build(
            model,
            config,
            num_tokens=engine.kv_pool.size,
            num_slots=engine.cache.mamba_pool.size,
            max_running_requests=args.max_running_requests,
            max_context_len=longest + 8,
        )
        t0 = time.perf_counter()
        if conversations(again, args) != outputs:
            raise RuntimeError(f"{family} {mode}: a repeated run generated other tokens")
        wall_s = min(wall_s, time.perf_counter() - t0)
        model_s = min(model_s, again.stats.model_s)
    row = {
        "family": family,
        "mode": mode,
        "requests": s.requests,
        "prompt_tokens": s.prompt_tokens,
        "hit_tokens": s.hit_tokens,
        "prefill_tokens": s.prefill_tokens,
        "decode_tokens": s.decode_tokens,
        "forwards": s.forwards,
        "checkpoints_in_tree": sum(1 for n in engine.cache.tree.nodes() if n.mamba_slot is not None),
        "model_s": round(model_s, 4),
        "wall_s": round(wall_s, 4),
        "chunked_prefill_size": args.chunked_prefill_size,
        "mamba_cache_chunk_size": args.mamba_cache_chunk_size,
        "mamba_track_interval": args.mamba_track_interval,
        "seed": args.seed,
        "repeats": args.repeats,
    }
    return row, outputs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for family in args.families:
        baseline: list[list[int]] | None = None
        base_prefill: int | None = None
        for mode in ["no_cache", *[m for m in args.modes if m != "no_cache"]]:
            row, outputs = run_one(family, mode, args)
            if mode == "no_cache":
                baseline, base_prefill = outputs, row["prefill_tokens"]
            row["prefill_tokens_saved"] = (base_prefill or 0) - row["prefill_tokens"]
            row["tokens_equal_uncached"] = outputs == baseline
            if mode in args.modes:
                rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    header = (
        f"{'family':<12} {'mode':<18} {'prompt':>6} {'hit':>5} {'prefill':>7} {'saved':>6} "
        f"{'ckpts':>5} {'model s':>8} {'wall s':>7}  same tokens"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['family']:<12} {r['mode']:<18} {r['prompt_tokens']:>6} {r['hit_tokens']:>5} "
            f"{r['prefill_tokens']:>7} {r['prefill_tokens_saved']:>6} {r['checkpoints_in_tree']:>5} "
            f"{r['model_s']:>8.3f} {r['wall_s']:>7.3f}  {r['tokens_equal_uncached']}"
        )
    print(f"\n{len(rows)} rows -> {args.out}")
    return 0 if all(r["tokens_equal_uncached"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
