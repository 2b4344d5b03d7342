"""Fidelity of quantized checkpoints on real model code: restore from an int8 / fp8 checkpoint vs uncached fp32.

Serves multi-turn conversations and a branching prompt set with the reference engine (transformers' Kimi
Linear and Qwen3-Next, tiny random-weight configs, fp32 on the CPU) and stores every checkpoint the cache
hands to the tree in a checkpoint format, as the state pool would: quantized when it reaches the tree,
dequantized when a hit restores it. Measured against plain transformers forwards of the whole sequence
(no cache of any kind), per format, with and without error feedback:

- ``restores``: requests admitted with a hit (each restores one checkpoint);
- ``max/mean |dlogit| restore``: over the first forward after every restore, the max and the mean of the
  absolute logit difference (max: over all restores and positions; mean: over all logits of those forwards);
- ``max |dlogit| after``: the max over every later forward of the restored requests (decode steps, chunks);
- ``token agreement``: over every sampled token of every request, the engine's greedy token equals the
  argmax of the uncached forward of the same tokens (teacher-forced, so one flip is counted once);
- ``exact outputs``: requests whose whole output equals uncached greedy generation from their prompt.

How a format is applied (this script changes no library code): after every ``commit``/``finish`` the
cache's tree is scanned; every slot that newly appears there is quantized into a one-slot
:class:`~mamba_radix.checkpoint_format.CheckpointStore` (the package's kernels, ``quantize_slots``) and
dequantized back into the same slot (``dequantize_slots``). A tree slot is never read as a live state, only
copied into one at a hit, so this equals storing the quantized checkpoint and dequantizing on restore.
Error feedback: one fp32 residual per live slot, zeroed at admission (a new lineage), carried from one
hand-over of that request to the next (definition: :mod:`mamba_radix_kernels.quant_naive`).

Usage: ``python benchmarks/fidelity_quant.py`` (about a minute on one core); ``--help`` for options.
``--json FILE`` also writes the measurements as JSON lines, one per model, format and error feedback,
each with the command that made it (the ``memory_options`` experiment's report reads
``mamba_radix/data/experiments/memory_options.fidelity.jsonl``, made this way).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mamba_radix import CacheConfig
from mamba_radix.checkpoint_format import (
    CHECKPOINT_FORMATS,
    dequantize_slots,
    new_checkpoint_store,
    quantize_slots,
)
from mamba_radix.reference_engine import tiny_model
from mamba_radix.reference_engine.engine import ReferenceEngine, greedy_reference

FAMILIES = ("kimi_linear", "qwen3_next")
VOCAB = 128


@dataclass
class Result:
    family: str
    fmt: str
    feedback: bool
    restores: int = 0
    restore_max: float = 0.0
    restore_sum: float = 0.0
    restore_count: int = 0
    after_max: float = 0.0
    tokens: int = 0
    tokens_agree: int = 0
    requests: int = 0
    exact: int = 0
    handovers: int = 0
    logit_abs_mean: float = 0.0
    seconds: float = 0.0
    per_restore: list[float] = field(default_factory=list)


class QuantizedHandover:
    """Applies a checkpoint format to an engine's cache: wraps ``admit``, ``commit`` and ``finish`` of
    ``engine.cache`` (instance attributes only) so that every slot newly in the tree is stored in ``fmt``."""

    def __init__(self, engine: ReferenceEngine, fmt: str, feedback: bool) -> None:
        self.engine = engine
        self.fmt = fmt
        self.pool = engine.cache.mamba_pool
        self.store = new_checkpoint_store(fmt, self.pool.tensors, 1) if fmt != "model" else None
        self.residuals = (
            [torch.zeros(t.shape, dtype=torch.float32) for t in self.pool.tensors] if feedback else None
        )
        self.quantized: set[int] = set()
        self.handovers = 0
        cache = engine.cache
        admit, commit, finish = cache.admit, cache.commit, cache.finish

        def admit_hook(req: Any, *args: Any, **kw: Any) -> bool:
            ok = admit(req, *args, **kw)
            if ok and req.mamba_pool_idx is not None:
                self._reset(req.mamba_pool_idx)  # a new lineage: hit or not, no residual is stored with it
            return ok

        def commit_hook(plan: Any, *args: Any, **kw: Any) -> None:
            live = plan.req.mamba_pool_idx
            commit(plan, *args, **kw)
            self._scan(live)

        def finish_hook(req: Any, *args: Any, **kw: Any) -> None:
            live = req.mamba_pool_idx
            finish(req, *args, **kw)
            self._scan(live)

        cache.admit, cache.commit, cache.finish = admit_hook, commit_hook, finish_hook

    def _reset(self, slot: int) -> None:
        if self.residuals is not None:
            for r in self.residuals:
                r[:, slot] = 0

    def _scan(self, live_slot: int | None) -> None:
        in_tree = {n.mamba_slot for n in self.engine.cache.tree.nodes() if n.mamba_slot is not None}
        self.quantized &= in_tree  # slots freed (evicted) since: a later owner is a new checkpoint
        for slot in sorted(in_tree - self.quantized):
            self.quantized.add(slot)
            self.handovers += 1
            if self.store is None:
                continue
            res = self.residuals
            if res is not None and live_slot is not None and live_slot != slot:
                for r in res:  # the lineage's residual lives with the live slot; the kernel indexes by source
                    r[:, slot] = r[:, live_slot]
            quantize_slots(self.pool.tensors, [slot], self.store, [0], residuals=res)
            dequantize_slots(self.store, [0], self.pool.tensors, [slot])
            if res is not None and live_slot is not None and live_slot != slot:
                for r in res:
                    r[:, live_slot] = r[:, slot]
                    r[:, slot] = 0


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def multi_turn(engine: ReferenceEngine, conversations: int, turns: int, seed: int) -> None:
    """``conversations`` conversations sharing a system prompt, ``turns`` turns each, all in flight each
    round: turn k's prompt is turn k-1's prompt + its answer + a new user message (each turn restores the
    previous turn's checkpoint: errors can compound along the conversation)."""
    rng = random.Random(seed)
    system = tokens(rng, 12)
    convs = [list(system) for _ in range(conversations)]
    for _ in range(turns):
        rids = []
        for c in convs:
            c += tokens(rng, 7)
            rids.append(engine.submit(list(c), 6))
        engine.run()
        for c, rid in zip(convs, rids, strict=True):
            c += engine.finished[rid]


def branching(engine: ReferenceEngine, seed: int) -> None:
    """A 24-token stem, four branches, two of which fork again, all at once; then every prompt again."""
    rng = random.Random(seed)
    stem = tokens(rng, 24)
    branches = [stem + tokens(rng, 9 + 3 * i) for i in range(4)]
    forks = [branches[0][:29] + tokens(rng, 6), branches[1][:35] + tokens(rng, 10)]
    for _ in range(2):
        for p in branches + forks:
            engine.submit(p, 6)
        engine.run()


def config() -> CacheConfig:
    return CacheConfig(chunked_prefill_size=16, mamba_cache_chunk_size=8, mamba_track_interval=8)


@torch.no_grad()
def measure(family: str, fmt: str, feedback: bool, args: argparse.Namespace) -> Result:
    t0 = time.perf_counter()
    model = tiny_model(family, seed=args.seed)
    engine = ReferenceEngine.build(model, config(), max_running_requests=3, num_slots=48, record=True)
    hook = QuantizedHandover(engine, fmt, feedback)
    multi_turn(engine, args.conversations, args.turns, args.seed + 1)
    branching(engine, args.seed + 2)
    res = Result(family, fmt, feedback, handovers=hook.handovers)
    firsts: dict[Any, Any] = {}
    abs_sum, abs_n = 0.0, 0
    assert engine.records is not None
    for rec in engine.records:
        seq = engine.requests[rec.rid].all_token_ids
        want = model.reference_logits(seq[: rec.end])[rec.start :]
        diff = (rec.logits - want).abs()
        abs_sum += float(want.abs().sum())
        abs_n += want.numel()
        hit = rec.hit_len > 0
        if rec.rid not in firsts:
            firsts[rec.rid] = rec
            if hit:
                res.restores += 1
                res.restore_max = max(res.restore_max, float(diff.max()))
                res.restore_sum += float(diff.sum())
                res.restore_count += diff.numel()
                res.per_restore.append(float(diff.max()))
        elif hit:
            res.after_max = max(res.after_max, float(diff.max()))
        if rec.end >= len(engine.requests[rec.rid].origin_input_ids):
            # this forward sampled token seq[rec.end]; the uncached forward's choice at the same position
            res.tokens += 1
            res.tokens_agree += int(int(want[-1].argmax()) == seq[rec.end])
    for req in engine.requests.values():
        res.requests += 1
        want_out = greedy_reference(model, req.origin_input_ids, len(req.output_ids))
        res.exact += int(list(req.output_ids) == want_out)
    res.logit_abs_mean = abs_sum / max(abs_n, 1)
    res.seconds = time.perf_counter() - t0
    return res


def table(results: list[Result]) -> str:
    head = (
        "| model | format | error feedback | restores | max \\|Δlogit\\| at restore | mean \\|Δlogit\\| at restore "
        "| max \\|Δlogit\\| after restore | token agreement | exact outputs |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in results:
        mean = r.restore_sum / max(r.restore_count, 1)
        lines.append(
            f"| {r.family} | {r.fmt} | {'on' if r.feedback else 'off'} | {r.restores} | {r.restore_max:.2e} "
            f"| {mean:.2e} | {r.after_max:.2e} | {r.tokens_agree}/{r.tokens} | {r.exact}/{r.requests} |"
        )
    return "\n".join(lines)


def json_rows(results: list[Result], command: str) -> list[dict[str, Any]]:
    """One JSON object per result: the table's columns under stable names, and the command."""
    return [
        {
            "model": r.family,
            "format": r.fmt,
            "error_feedback": r.feedback,
            "restores": r.restores,
            "max_abs_dlogit_restore": r.restore_max,
            "mean_abs_dlogit_restore": r.restore_sum / max(r.restore_count, 1),
            "max_abs_dlogit_after": r.after_max,
            "mean_abs_logit": r.logit_abs_mean,
            "tokens": r.tokens,
            "tokens_agree": r.tokens_agree,
            "requests": r.requests,
            "exact_outputs": r.exact,
            "handovers": r.handovers,
            "seconds": round(r.seconds, 1),
            "command": command,
        }
        for r in results
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Prints a markdown table.")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--formats", nargs="+", default=list(CHECKPOINT_FORMATS), choices=CHECKPOINT_FORMATS)
    p.add_argument("--conversations", type=int, default=3, help="multi-turn conversations (default 3)")
    p.add_argument("--turns", type=int, default=5, help="turns per conversation (default 5)")
    p.add_argument("--seed", type=int, default=0, help="model weights and prompt seed (default 0)")
    p.add_argument(
        "--json", metavar="FILE", help="also write the results as JSON lines to FILE (overwritten)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for family in args.families:
        for fmt in args.formats:
            for feedback in (False, True) if fmt != "model" else (False,):
                r = measure(family, fmt, feedback, args)
                results.append(r)
                print(
                    f"# {family} {fmt} feedback={'on' if feedback else 'off'}: {r.handovers} hand-overs, "
                    f"mean |logit| {r.logit_abs_mean:.3f}, {r.seconds:.1f} s",
                    file=sys.stderr,
                )
    print(table(results))
    if args.json:
        command = " ".join(["python benchmarks/fidelity_quant.py", *(sys.argv[1:] if argv is None else argv)])
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in json_rows(results, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
