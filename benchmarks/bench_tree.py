"""Tree benchmark: replay the Mooncake conversation trace through MambaRadixCache as match / insert / evict.

Each request of the trace (block format: every hash id is a 512-token block) is expanded to tokens
(block ``b`` -> ``b * 512 + j`` for ``j`` in ``[0, 512)``, the last block cut to ``input_length``), then:

1. ``match_prefix(input[:-1])`` (as SGLang's scheduler matches) and a lock on the matched node;
2. ``evict`` of just enough KV tokens for the uncached part;
3. for each checkpoint an extra_buffer engine would take (one per 8,192-token prefill chunk, at its last
   64-aligned position or at the branch point): ``evict`` of a checkpoint if no slot is free, then
   ``insert(input[:pos], KV, fresh slot, prev_prefix_len)`` with the lock moving to the new node, as
   ``cache_unfinished_req`` does; the KV past the last checkpoint is freed, as at finish.

It runs at several KV capacities (state slots scale with them) and prints requests/s, tokens/s and the
median time of each operation as a markdown table, plus the token hit rate. Timings are wall-clock,
measured in this run only; nothing is compared against stored numbers.

**Baseline, measured in the same run.** After each capacity, the exact sequence of operations our cache
performed (one ``match(input[:-1])`` per request, one ``insert(input[:pos])`` per checkpoint it inserted,
same keys, same order, the key sliced inside the timed call on both sides) is replayed through
:class:`BareTrie`, a
minimal plain-Python radix trie written below: dict children keyed by the first token, tuple edge keys,
an edge split when a match or insert ends inside it (as our match does). It omits everything else our
cache does: no KV index tensors (no ``torch.cat`` of the matched path, no value copies on split or leaf),
no checkpoints or slots, no locks, no recency clock or eviction order, no size counters, no argument
checks, no pools and no eviction (unlimited capacity: its tree only grows, so its matches can be longer
than ours at small capacities). So it measures the bare cost of prefix matching and inserting in Python. Our side gets the prompts as
int64 arrays (:class:`~mamba_radix.node.TokenIds`, built once before the replay, as a request holds its
tokens), the bare trie as tuples (its natural form); each slices its own form.
The table prints the bare trie's requests/s and median match / insert times next to ours, with
``ours/bare`` ratios: for requests/s below 1 means we are slower; for times above 1 means we are slower.

    .venv/bin/python benchmarks/bench_tree.py                       # default: 2,000 requests, 3 capacities
    .venv/bin/python benchmarks/bench_tree.py --num-requests 500 --capacities 262144
    .venv/bin/python benchmarks/bench_tree.py --keys 1024,131072,1048576   # key compares only
    .venv/bin/python benchmarks/bench_tree.py --large-tree 100000          # ~30 s; --profile lt.prof

The large-tree stage (``--large-tree NODES``) is ``bench_vs_sglang.py``'s tree case for our cache alone,
in seconds instead of minutes (no SGLang beside it): random branching keys (a prefix of an earlier key,
cut anywhere, plus 16-128 fresh tokens) inserted until the tree has ``NODES`` nodes, then
``--measured`` rounds of one ``match_prefix`` (a random prefix of an inserted key) and one ``insert`` of a
new key. It prints the median of each cache call and of the tree's part of it (``RadixTree.match``;
``RadixTree.insert``; the walk of the cache's pre-insert check), so the tree core's share and the cache's
glue are read apart; ``--profile FILE`` also writes a cProfile of the measured rounds (pstats format).
For the ratios against SGLang run ``bench_vs_sglang.py --stages tree``, whose medians are higher
(SGLang's tree, interleaved call by call, leaves the caches colder).

The key stage (``--keys``) times one edge compare, whole match and a mismatch in the middle, with tuple
keys (the representation before int64 keys, its compare kept here as the baseline) and with int64 keys,
and one tree walk, at each length, in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mamba_radix import CacheConfig, MambaRadixCache, RadixKey, walks
from mamba_radix.node import TokenIds, as_token_ids, prefix_len_in
from mamba_radix.strategies import prefill_track_len
from mamba_radix.tree import RadixTree

BLOCK_SIZE = 512
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "traces"
    / "mooncake_conversation_trace.jsonl"
)


def load_requests(path: Path, num_requests: int) -> list[tuple[int, ...]]:
    """The first ``num_requests`` prompts as token tuples. Block tuples are shared between requests."""
    blocks: dict[int, tuple[int, ...]] = {}
    prompts = []
    with path.open() as f:
        for line, _ in zip(f, range(num_requests), strict=False):
            row = json.loads(line)
            tokens: list[int] = []
            for b in row["hash_ids"]:
                block = blocks.get(b)
                if block is None:
                    block = blocks[b] = tuple(range(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE))
                tokens.extend(block)
            prompts.append(tuple(tokens[: row["input_length"]]))
    return prompts


# ---------------------------------------------------------------------------------------------- BASELINE
# A minimal plain-Python radix trie: the bare cost of prefix matching and inserting. NOT our cache: no KV
# tensors, no checkpoints, no locks, no eviction order, no capacity. Kept deliberately small.
class _BareNode:
    __slots__ = ("children", "key")

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key = key  # the edge's tokens
        self.children: dict[int, _BareNode] = {}  # first token of the child's edge -> child


def _bare_common_len(edge: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """Common prefix length of ``edge`` and ``tokens[start:]``: one C-level slice compare when the edge
    matches whole, else a binary search over slice compares (O(n) C work, O(log n) Python steps)."""
    n = min(len(edge), len(tokens) - start)
    if edge[:n] == tokens[start : start + n]:
        return n
    lo, hi = 0, n  # edge[:lo] matches, edge[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edge[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class BareTrie:
    """BASELINE: radix trie over token tuples. ``match`` and ``insert`` return the matched prefix length;
    both split an edge they end inside, as SGLang's (and our) match does."""

    def __init__(self) -> None:
        self.root = _BareNode(())
        self.num_nodes = 1

    def _walk(self, tokens: tuple[int, ...]) -> tuple[_BareNode, int]:
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _bare_common_len(child.key, tokens, pos)
            if n < len(child.key):  # ends inside the edge: split it
                mid = _BareNode(child.key[:n])
                child.key = child.key[n:]
                mid.children[child.key[0]] = child
                node.children[mid.key[0]] = mid
                self.num_nodes += 1
                return mid, pos + n
            node, pos = child, pos + n
        return node, pos

    def match(self, tokens: tuple[int, ...]) -> int:
        return self._walk(tokens)[1]

    def insert(self, tokens: tuple[int, ...]) -> int:
        node, pos = self._walk(tokens)
        if pos < len(tokens):
            node.children[tokens[pos]] = _BareNode(tokens[pos:])
            self.num_nodes += 1
        return pos


def replay_bare(prompts: list[tuple[int, ...]], ops: list[tuple[int, list[int]]]) -> dict[str, float]:
    """BASELINE replay: ``ops`` is what :func:`replay` did, (prompt index, insert lengths) per request,
    in order. The same calls with the same keys (sliced inside the timed region, as there)."""
    trie = BareTrie()
    times: dict[str, list[int]] = {"match": [], "insert": [], "slice": []}
    clock = time.perf_counter_ns
    input_tokens = 0
    start = clock()
    for i, positions in ops:
        tokens = prompts[i]
        t0 = clock()
        trie.match(tokens[:-1])
        times["match"].append(clock() - t0)
        for position in positions:
            t0 = clock()
            trie.insert(tokens[:position])
            times["insert"].append(clock() - t0)
        input_tokens += len(tokens)
    elapsed_s = (clock() - start) / 1e9
    for i, _ in ops:  # context, not part of the baseline's time: what slicing the match key alone costs
        t0 = clock()
        _ = prompts[i][:-1]
        times["slice"].append(clock() - t0)
    median_us = {op: statistics.median(t) / 1e3 if t else float("nan") for op, t in times.items()}
    return {
        "slice_us": median_us["slice"],
        "requests_per_s": len(ops) / elapsed_s,
        "tokens_per_s": input_tokens / elapsed_s,
        "match_us": median_us["match"],
        "insert_us": median_us["insert"],
        "matches": len(times["match"]),
        "inserts": len(times["insert"]),
        "nodes": trie.num_nodes,
    }


# ------------------------------------------------------------------------------------------------ ours
def checkpoint_positions(config: CacheConfig, hit: int, num_tokens: int, branching: int | None) -> list[int]:
    """Where an extra_buffer engine checkpoints a prefill of [hit, num_tokens): one per chunk."""
    chunk = config.chunked_prefill_size
    positions = []
    for start in range(hit, num_tokens, chunk):
        track = prefill_track_len(config, start, min(chunk, num_tokens - start), branching)
        if track is not None:
            positions.append(track)
    return positions


def replay(
    prompts: list[TokenIds], num_tokens: int, num_slots: int
) -> tuple[dict[str, float], list[tuple[int, list[int]]]]:
    """Our cache on the prompts as int64 arrays. Returns the metrics and the operations done, (prompt
    index, insert lengths) per request, for :func:`replay_bare`."""
    config = CacheConfig(mamba_radix_cache_strategy="extra_buffer")  # chunks of 8192, grid 64
    cache = MambaRadixCache.build(config, num_tokens=num_tokens, num_slots=num_slots, max_context_len=1)
    allocator, mamba_pool = cache.token_to_kv_pool_allocator, cache.mamba_pool
    times: dict[str, list[int]] = {"match": [], "insert": [], "evict": []}
    hit_tokens = input_tokens = skipped = 0
    clock = time.perf_counter_ns
    ops: list[tuple[int, list[int]]] = []

    def evict(short_tokens: int, short_states: int) -> None:
        t0 = clock()
        cache.evict(short_tokens, short_states)
        times["evict"].append(clock() - t0)

    start = clock()
    for i, tokens in enumerate(prompts):
        if len(tokens) > num_tokens:
            skipped += 1  # longer than the whole pool: an engine would reject it
            continue
        t0 = clock()
        m = cache.match_prefix(RadixKey(tokens[:-1]))
        times["match"].append(clock() - t0)
        inserted: list[int] = []
        ops.append((i, inserted))
        node = m.last_node
        cache.inc_lock_ref(node)
        hit = len(m.device_indices)
        short_tokens = len(tokens) - hit - allocator.available_size()
        if short_tokens > 0:
            evict(short_tokens, 0)
        fresh = allocator.alloc(len(tokens) - hit)
        if fresh is None:  # everything left is locked: cannot happen with one request at a time
            raise RuntimeError("KV pool exhausted with a single running request")
        kv = torch.cat([m.device_indices, fresh])
        protected = hit
        for position in checkpoint_positions(config, hit, len(tokens), m.mamba_branching_seqlen):
            if mamba_pool.available_size() == 0:
                evict(0, 1)
            slots = mamba_pool.alloc(1)
            if slots is None:
                continue  # no slot even after eviction: skip the checkpoint, as the cache does
            t0 = clock()
            result, done = cache._insert(RadixKey(tokens[:position]), kv[:position], int(slots[0]), protected)
            times["insert"].append(clock() - t0)
            inserted.append(position)
            if result.mamba_exists:
                mamba_pool.free(slots)
            kv[protected:position] = cache.tree.path_values(done.node)[protected:]  # the tree's copies
            cache.inc_lock_ref(done.node)  # the lock moves forward, as in cache_unfinished_req
            cache.dec_lock_ref(node)
            node, protected = done.node, position
        if protected < len(tokens):
            allocator.free(kv[protected:])  # no state past the last checkpoint: its KV goes
        cache.dec_lock_ref(node)
        hit_tokens += hit
        input_tokens += len(tokens)
    elapsed_s = (clock() - start) / 1e9
    cache.check_invariants([])
    done_requests = len(prompts) - skipped
    median_us = {op: statistics.median(t) / 1e3 if t else float("nan") for op, t in times.items()}
    metrics = {
        "requests": done_requests,
        "requests_per_s": done_requests / elapsed_s,
        "tokens_per_s": input_tokens / elapsed_s,
        "match_us": median_us["match"],
        "insert_us": median_us["insert"],
        "evict_us": median_us["evict"],
        "evict_calls": len(times["evict"]),
        "hit_rate": hit_tokens / max(input_tokens, 1),
        "tokens_evicted": cache.stats.tokens_evicted,
        "states_evicted": cache.stats.states_evicted,
        "elapsed_s": elapsed_s,
        "nodes": cache.tree.num_nodes,
    }
    return metrics, ops


# ------------------------------------------------------------------------------------------- key compare
def _tuple_common_len(edge: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    """BASELINE for the key stage: the comparison the tree ran on tuple keys before its keys became
    int64 buffers (one C-level tuple-slice compare, then 64-token blocks, then token by token)."""
    n = min(len(edge), len(tokens) - start)
    if edge[:n] == tokens[start : start + n]:
        return n
    i = 0
    while i < n:
        j = min(i + 64, n)
        if edge[i:j] != tokens[start + i : start + j]:
            while edge[i] == tokens[start + i]:
                i += 1
            return i
        i = j
    return n


def _median_us(repeats: int, fn: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(*args)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def bench_keys(lengths: list[int], repeats: int) -> None:
    """Median µs of one edge compare (a whole-edge match, and a mismatch in the middle) and of one tree
    walk of a key one edge long, for tuple keys (the former representation, baseline) and int64 keys
    (:class:`TokenIds`, what the tree holds), at each length. Prints a markdown table."""
    print(
        "| tokens | tuple compare, match (µs) | int64 compare, match (µs) | ratio | tuple compare, "
        "mismatch (µs) | int64 compare, mismatch (µs) | ratio | tree walk, int64 (µs) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        edge_t = tuple(range(10**9, 10**9 + n))
        query_t = (*edge_t, 1, 2, 3)
        bad_t = (*edge_t[: n // 2], -1, *edge_t[n // 2 + 1 :])
        edge, query, bad = as_token_ids(edge_t), as_token_ids(query_t), as_token_ids(bad_t)
        tree = RadixTree(CacheConfig())
        tree.insert(RadixKey(edge), torch.arange(n), 1)
        key = RadixKey(query)
        tm = _median_us(repeats, _tuple_common_len, edge_t, query_t, 0)
        scratch = bytearray(8 * walks.SCRATCH_TOKENS)  # the size of a tree walk's reused buffer
        fm = _median_us(repeats, prefix_len_in, edge, memoryview(query), 0, scratch)
        tb = _median_us(repeats, _tuple_common_len, edge_t, bad_t, 0)
        fb = _median_us(repeats, prefix_len_in, edge, memoryview(bad), 0, scratch)
        walk = _median_us(repeats, tree.walk, key)
        assert prefix_len_in(edge, memoryview(bad), 0) == _tuple_common_len(edge_t, bad_t, 0) == n // 2
        print(
            f"| {n:,} | {tm:,.1f} | {fm:,.1f} | {tm / fm:.0f}x | {tb:,.1f} | {fb:,.1f} | {tb / fb:.0f}x "
            f"| {walk:,.1f} |"
        )


class _Timed:
    """Wraps ``obj.name`` (an instance attribute shadowing the method): per-call wall ns while ``on``."""

    def __init__(self, obj: object, name: str) -> None:
        self.samples: list[int] = []
        self.on = False
        inner = getattr(obj, name)

        def timed(*args: object, **kwargs: object) -> object:
            if not self.on:
                return inner(*args, **kwargs)
            t0 = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                self.samples.append(time.perf_counter_ns() - t0)

        setattr(obj, name, timed)

    def median_us(self) -> float:
        return statistics.median(self.samples) / 1e3 if self.samples else float("nan")


def bench_large_tree(nodes: int, measured: int, seed: int, profile: Path | None) -> None:
    """``bench_vs_sglang.py``'s large-tree case, our cache alone: build a tree of ``nodes`` nodes from
    random branching keys, then ``measured`` rounds of one ``match_prefix`` and one ``insert``; print the
    median µs of the cache calls and of the tree's part of each (markdown). Same config and pools as
    there (extra_buffer, the sglang-0.5.20 preset)."""
    import cProfile
    import random

    from mamba_radix.peers import apply_peer

    rng = random.Random(seed)
    config = apply_peer(CacheConfig(mamba_radix_cache_strategy="extra_buffer"), "sglang-0.5.20")
    est_keys = nodes + 2 * measured + 2000
    cache = MambaRadixCache.build(
        config,
        num_tokens=est_keys * 80 + 1_000_000,
        num_slots=est_keys + 16,
        max_running_requests=2,
        max_context_len=4097,
        conv_shapes=((8,),),
        temporal_shape=(4,),
    )
    tree, alloc, slots = cache.tree, cache.token_to_kv_pool_allocator, cache.mamba_pool
    keys: list[list[int]] = []
    next_token = [1_000_000_000]

    def new_key() -> list[int]:
        head: list[int] = []
        if keys and rng.random() < 0.95:
            parent = keys[rng.randrange(len(keys))]
            head = parent[: rng.randint(1, len(parent))]
        n = rng.randint(16, 128)
        fresh = list(range(next_token[0], next_token[0] + n))
        next_token[0] += n
        return head + fresh

    def insert(key: list[int]) -> None:
        kv, slot = alloc.alloc(len(key)), slots.alloc(1)
        assert kv is not None and slot is not None, "large-tree pools too small"
        if cache.insert(RadixKey(key), kv, int(slot[0])).mamba_exists:
            slots.free([int(slot[0])])
        keys.append(key)

    t0 = time.perf_counter()
    while tree.num_nodes < nodes:
        insert(new_key())
    built_s = time.perf_counter() - t0
    rounds = []
    for _ in range(measured):
        key = keys[rng.randrange(len(keys))]
        rounds.append((RadixKey(key[: rng.randint(1, len(key))]), new_key()))
    timers = {
        "cache.match_prefix": _Timed(cache, "match_prefix"),
        "tree.match (walk, split, stamps)": _Timed(tree, "match"),
        "cache.insert": _Timed(cache, "insert"),
        "tree.insert": _Timed(tree, "insert"),
        "tree._walk (the walk loop: match's and insert's)": _Timed(tree, "_walk"),
    }
    for timer in timers.values():
        timer.on = True
    prof = cProfile.Profile() if profile is not None else None
    if prof is not None:
        prof.enable()
    for match_key, insert_key in rounds:
        cache.match_prefix(match_key)
        insert(insert_key)
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(profile))
    print(
        f"large tree: {tree.num_nodes:,} nodes from {len(keys) - measured:,} keys (built in {built_s:.1f} s), "
        f"{measured:,} rounds of match_prefix + insert\n"
    )
    print("| call | calls | median µs |\n|---|---:|---:|")
    for label, timer in timers.items():
        print(f"| {label} | {len(timer.samples):,} | {timer.median_us():.1f} |")
    print(
        f"\ntree._walk: the walk loop the tree chose at construction ({tree.walk_kind!r}, mamba_radix.walks), "
        "two a round: the walk of match and the walk of insert."
    )
    if profile is not None:
        print(f"cProfile of the measured rounds written to {profile}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE.resolve())
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument(
        "--capacities",
        default="262144,1048576,4194304",
        help="KV token capacities, comma-separated (state slots = capacity / --tokens-per-slot)",
    )
    parser.add_argument("--tokens-per-slot", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 by default: the index tensors here are small, and extra threads "
        "only add contention (25x slower per op on a loaded 2-core machine)",
    )
    parser.add_argument(
        "--keys",
        metavar="LENGTHS",
        help="only the key stage: edge compares and walks at these key lengths (comma-separated tokens), "
        "tuple keys (the former representation) against int64 keys",
    )
    parser.add_argument("--repeats", type=int, default=21, help="samples per key-stage median")
    parser.add_argument(
        "--large-tree",
        type=int,
        metavar="NODES",
        help="only the large-tree stage: our cache alone on bench_vs_sglang.py's tree case, built to NODES",
    )
    parser.add_argument("--measured", type=int, default=2000, help="large-tree rounds (match + insert)")
    parser.add_argument("--seed", type=int, default=0, help="large-tree key generator seed")
    parser.add_argument("--profile", type=Path, help="large-tree: write a cProfile of the rounds here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.large_tree:
        bench_large_tree(args.large_tree, args.measured, args.seed, args.profile)
        return
    if args.keys:
        bench_keys([int(x) for x in args.keys.split(",")], args.repeats)
        return

    t0 = time.perf_counter()
    prompts = load_requests(args.trace, args.num_requests)
    arrays = [as_token_ids(p) for p in prompts]  # ours: int64 arrays, as a request holds its tokens
    total = sum(len(p) for p in prompts)
    print(
        f"trace: {args.trace.name}, {len(prompts)} requests, {total:,} input tokens "
        f"(expanded in {time.perf_counter() - t0:.1f} s)\n"
    )
    print(
        "| KV capacity (tokens) | state slots | requests/s | tokens/s | match median (µs) | "
        "insert median (µs) | evict median (µs) | evict calls | token hit rate | nodes at end | "
        "bare trie requests/s | requests/s ours/bare | bare trie match (µs) | match ours/bare | "
        "bare trie insert (µs) | insert ours/bare |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summaries = []
    for capacity in (int(c) for c in args.capacities.split(",")):
        slots = max(4, capacity // args.tokens_per_slot)
        r, ops = replay(arrays, capacity, slots)
        b = replay_bare(prompts, ops)  # the baseline, right after, on the same operations
        assert b["matches"] == len(ops) == r["requests"] and b["inserts"] == sum(len(p) for _, p in ops)
        print(
            f"| {capacity:,} | {slots:,} | {r['requests_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
            f"{r['match_us']:.1f} | {r['insert_us']:.1f} | {r['evict_us']:.1f} | {r['evict_calls']:,} | "
            f"{r['hit_rate']:.3f} | {r['nodes']:,} | {b['requests_per_s']:,.0f} | "
            f"{r['requests_per_s'] / b['requests_per_s']:.2f}x | {b['match_us']:.1f} | "
            f"{r['match_us'] / b['match_us']:.1f}x | {b['insert_us']:.1f} | "
            f"{r['insert_us'] / b['insert_us']:.1f}x |",
            flush=True,
        )
        summaries.append(
            f"- {capacity:,} tokens ({b['matches']:,} matches, {b['inserts']:,} inserts on both sides): "
            f"match: ours {r['match_us']:.1f} µs, bare trie {b['match_us']:.1f} µs, "
            f"{r['match_us'] / b['match_us']:.1f}x (slicing the key alone: {b['slice_us']:.1f} µs); insert: ours {r['insert_us']:.1f} µs, bare trie "
            f"{b['insert_us']:.1f} µs, {r['insert_us'] / b['insert_us']:.1f}x; requests/s: ours "
            f"{r['requests_per_s']:,.0f}, bare trie {b['requests_per_s']:,.0f}, "
            f"{r['requests_per_s'] / b['requests_per_s']:.2f}x (bare trie: {b['nodes']:,} nodes, never evicts)"
        )
    print(
        "\nBaseline: a bare plain-Python radix trie (dict children, tuple keys) replaying the same match / "
        "insert calls with the same keys, unlimited capacity; it omits KV tensors, checkpoints, locks, "
        "recency and eviction order, eviction and argument checks. Our requests/s also includes the "
        "evictions and pool alloc/free that the bare trie does not do. Times: ours/bare > 1 = slower; "
        "requests/s: ours/bare < 1 = slower.\n"
    )
    print("\n".join(summaries))


if __name__ == "__main__":
    main()
