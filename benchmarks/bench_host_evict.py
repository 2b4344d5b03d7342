"""Host eviction: the host index (a lazy heap of host-only leaves) against the scan it replaced, one run.

Builds a tree of ``--leaves`` host-only leaves (``--fanout`` leaves under each of ``leaves / fanout``
host-only forks; every edge ``--edge-tokens`` tokens, every leaf a host checkpoint), all demoted from the
device the way device eviction does it, then matches a random ``--touched`` fraction of the leaves again
(their stamps move after they were listed, so the index re-keys them lazily, as after a host hit). Two
twin trees are built from the same seed:

- the index: ``RadixTree.evict_host(num_tokens=1)`` until the host is empty, one victim a call
  (a fork left without children and without a host checkpoint goes with its last leaf);
- the scan: the same calls with each victim picked by ``RadixTree._scan_host_victim`` (every host-only
  node visited per victim, the code before the index), for the first ``--scan-victims`` victims only
  (a full drain is quadratic: about an hour at 50,000 leaves).

Both twins must free the same host slots in the same order over the victims both take (checked; the
run stops with an error otherwise). Prints the microseconds per victim of each over those first victims,
and their ratio; then the index's per-victim time over the whole drain. Wall-clock, this run only::

    .venv/bin/python benchmarks/bench_host_evict.py                     # 10,000 and 50,000 leaves
    .venv/bin/python benchmarks/bench_host_evict.py --leaves 20000 --scan-victims 200
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from mamba_radix import CacheConfig, RadixKey
from mamba_radix.tree import RadixTree


def build(num_leaves: int, fanout: int, edge_tokens: int, touched: float, seed: int) -> RadixTree:
    """The tree of host-only leaves described in the module docstring. O(leaves * edge_tokens)."""
    num_forks = max(1, num_leaves // fanout)
    leaves_tokens = num_leaves * edge_tokens
    config = CacheConfig(host_kv_tokens=leaves_tokens + num_forks * edge_tokens, host_state_slots=num_leaves)
    tree = RadixTree(config)
    keys = []
    for i in range(num_leaves):
        fork = i % num_forks
        prefix = [1_000_000_000 + fork * edge_tokens + j for j in range(edge_tokens)]
        keys.append(RadixKey(prefix + [i * edge_tokens + j for j in range(edge_tokens)]))
    for slot, key in enumerate(keys, start=1):  # slot 0 is padding
        tree.insert(key, torch.arange(len(key), dtype=torch.int64), slot)
    # host copies top-down (a node's parent first, as the cache's backup makes them), then demote all
    next_row = 0
    for node in tree.nodes():
        if node is tree.root:
            continue
        rows = torch.arange(next_row, next_row + len(node.key), dtype=torch.int64)
        next_row += len(node.key)
        tree.set_host_copy(node, host_kv=rows, host_slot=node.mamba_slot)
    tree.evict(num_tokens=next_row)
    assert len(tree.host_only_nodes) == tree.num_nodes - 1, "every node is host-only"
    rng = random.Random(seed)
    for key in rng.sample(keys, int(touched * num_leaves)):
        tree.match(key)  # a host hit's match: the path's stamps move, the listed entries do not
    return tree


def scan_instead(tree: RadixTree) -> None:
    """Make ``tree``'s host eviction pick each victim by the scan (the reference), as before the index."""

    def scan(held: list[object]) -> object:
        return tree._scan_host_victim()

    tree._next_host_victim = scan  # type: ignore[assignment,method-assign]


def drain(tree: RadixTree, victims: int | None) -> tuple[float, list[list[int]]]:
    """Host-evict one victim a call, ``victims`` times or until the host is empty; the seconds taken and the
    host slots each call freed."""
    freed_slots = []
    start = time.perf_counter()
    while tree.host_only_nodes and (victims is None or len(freed_slots) < victims):
        freed_slots.append(tree.evict_host(num_tokens=1).host_slots)
    return time.perf_counter() - start, freed_slots


def run(num_leaves: int, args: argparse.Namespace) -> None:
    shape = (num_leaves, args.fanout, args.edge_tokens, args.touched, args.seed)
    indexed, scanned = build(*shape), build(*shape)
    scan_instead(scanned)
    scan_s, scan_slots = drain(scanned, args.scan_victims)
    head_s, head_slots = drain(indexed, len(scan_slots))
    if head_slots != scan_slots:
        raise SystemExit(f"{num_leaves} leaves: the index and the scan freed different host slots")
    rest_s, rest_slots = drain(indexed, None)
    n = len(scan_slots)
    all_n = n + len(rest_slots)
    print(
        f"| {num_leaves:,} | {n} | {scan_s / n * 1e6:,.1f} | {head_s / n * 1e6:,.1f} | "
        f"{scan_s / head_s:,.0f}x | {all_n:,} | {(head_s + rest_s) / all_n * 1e6:,.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--fanout", type=int, default=8, help="host-only leaves per host-only fork")
    parser.add_argument("--edge-tokens", type=int, default=4)
    parser.add_argument("--touched", type=float, default=0.25, help="fraction of leaves matched again")
    parser.add_argument("--scan-victims", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        "| host-only leaves | victims compared | scan us/victim | index us/victim | scan/index "
        "| index: whole drain, victims | index us/victim (drain) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for num_leaves in args.leaves:
        run(num_leaves, args)


if __name__ == "__main__":
    main()
