"""Every allocation point of a request lifecycle with the host tier on, failed once and for good (issue 25).

The discipline of ``test_fault_points.py`` (whose configurations and fault counter this file reuses), with
the host tier on (``docs/host-tier.md``): device pools small enough that eviction demotes nodes to the
host, and a workload whose later requests load a host-resident prefix back. The allocation points are
the device ones (KV, state slots, request rows; a load-back's device KV and slot among them) plus the host
pools' backups (:meth:`HostKVPool.backup`, :meth:`HostStatePool.backup`), which fail as the pools refuse
when short: ``OutOfMemory`` / ``OutOfSlots``, nothing taken. A run counts the calls, then repeats the
workload with call k failing once, and with every call from k on failing. The cache must degrade, never
break: a refused backup is skipped, a load-back without device room drops the host hit, an admission is
refused with nothing taken; afterwards the invariants with host conservation hold, every device
checkpoint's stamp and every host checkpoint's stamp is right (states loaded back from the host included),
the device KV rows of every node hold its prefix's tokens, and evicting everything (device, then host)
gives every pool back whole, both host pools included.

The write policy alternates over the configurations (every policy runs on at least one strategy), and one
configuration runs the per-path cap with ``host_path_cap="drop"``. The scenario is checked not to be
vacuous: the fault-free run demotes, backs up, and loads back, and its allocation points include host
backups and load-back allocations.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_fault_points import CONFIGS, SHAPES, SMALL, Faults

from mamba_radix import MambaRadixCache, Req
from mamba_radix.errors import OutOfMemory, OutOfSlots
from mamba_radix.pools import MHATokenToKVPool
from mamba_radix.state_stamp import fingerprint, read_stamp
from mamba_radix.testing.value_stamps import StateStamps

POLICIES = ("write_through", "write_through_selective", "write_back", "resumable")
# (configuration, write policy, per-path cap or None): the policies in turn, each on at least one strategy;
# the cap with host_path_cap="drop" on one (the cap then frees host slots through the cache)
CASES = [
    (name, POLICIES[i % len(POLICIES)], 1 if name == "extra_buffer_no_overlap" else None)
    for i, name in enumerate(CONFIGS)
]
NUM_TOKENS = 64  # device KV: OTHER (48 tokens) does not fit beside the shared prefix's requests
NUM_SLOTS = 10  # device state slots
HOST_KV_TOKENS = 160
HOST_STATE_SLOTS = 12


class HostFaults(Faults):
    """:class:`Faults` that also fails host backups the way the host pools refuse (an exception, nothing
    taken), and labels each call by kind for the vacuity checks."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []
        self.in_load_back = False
        self.cap_dropped = 0  # host slots the per-path cap freed (host_path_cap="drop")

    def wrap(self, obj: Any, name: str, refusal: type[Exception] | None = None) -> None:
        real = getattr(obj, name)
        kind = f"{type(obj).__name__}.{name}"

        def alloc(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.kinds.append(f"load_back:{kind}" if self.in_load_back else kind)
            if self.calls == self.fail_once or (self.fail_from is not None and self.calls >= self.fail_from):
                if refusal is not None:
                    raise refusal(f"injected: {kind} refused")
                return None
            return real(*args, **kwargs)

        setattr(obj, name, alloc)

    def mark_load_back(self, cache: MambaRadixCache) -> None:
        """Label the device allocations a load-back plan makes."""
        real = cache.plan_load_back

        def plan(*args: Any, **kwargs: Any) -> Any:
            self.in_load_back = True
            try:
                return real(*args, **kwargs)
            finally:
                self.in_load_back = False

        cache.plan_load_back = plan  # type: ignore[method-assign]

    def count_cap_drops(self, cache: MambaRadixCache) -> None:
        """Count the host slots the per-path cap frees through the cache (``release_host``)."""
        real = cache.release_host

        def release(freed: Any) -> None:
            self.cap_dropped += len(freed.host_slots)
            real(freed)

        cache.release_host = release  # type: ignore[method-assign]


def build(name: str, policy: str, cap: int | None) -> tuple[MambaRadixCache, HostFaults]:
    """Configuration ``name`` with the host tier on (write policy ``policy``; the per-path cap ``cap`` with
    ``host_path_cap="drop"``), a real KV storage whose rows the test writes, every allocation wrapped."""
    extra: dict[str, Any] = {}
    if cap is not None:
        extra = {"mamba_max_states_per_path": cap, "host_path_cap": "drop"}
    config = CONFIGS[name].replace(
        **SMALL,
        host_kv_tokens=HOST_KV_TOKENS,
        host_state_slots=HOST_STATE_SLOTS,
        host_write_policy=policy,
        **extra,
    )
    storage = MHATokenToKVPool(NUM_TOKENS, config.page_size, torch.float32, 1, 2, 1)
    cache = MambaRadixCache.build(
        config,
        num_tokens=NUM_TOKENS,
        num_slots=NUM_SLOTS,
        max_running_requests=3,
        max_context_len=96,
        kv_storage=storage,
        **SHAPES,
    )
    cache.stamps = StateStamps("model", cache.mamba_pool)  # type: ignore[attr-defined]  # the test's own
    cache.kv_storage = storage  # type: ignore[attr-defined]
    faults = HostFaults()
    allocator = cache.token_to_kv_pool_allocator
    for method in ("alloc", "alloc_extend"):
        if hasattr(allocator, method):
            faults.wrap(allocator, method)
    faults.wrap(cache.mamba_pool, "alloc")
    faults.wrap(cache.req_to_token_pool, "_take_rows")
    faults.wrap(cache.host_kv_pool, "backup", OutOfMemory)
    faults.wrap(cache.host_state_pool, "backup", OutOfSlots)
    faults.mark_load_back(cache)
    faults.count_cap_drops(cache)
    return cache, faults


def kv_tokens(cache: MambaRadixCache, indices: torch.Tensor) -> list[int]:
    """The tokens the device KV rows ``indices`` hold (each row is written ``(token, position)``), checking
    that row ``i`` holds position ``i``."""
    rows = cache.kv_storage.k_buffer[0][indices.to(torch.int64)]  # type: ignore[attr-defined]
    assert rows[:, 0, 1].to(torch.int64).tolist() == list(range(len(rows))), "a KV row holds another position"
    return rows[:, 0, 0].to(torch.int64).tolist()


def serve(cache: MambaRadixCache, rid: int, prompt: list[int], num_out: int) -> None:
    """One request; on any refusal the engine aborts it. Every new token's KV row is written
    ``(token, position)``, every state stamped; the admission's hit (loaded back or not) is checked."""
    stamps: StateStamps = cache.stamps  # type: ignore[attr-defined]
    k_buffer = cache.kv_storage.k_buffer[0]  # type: ignore[attr-defined]
    req = Req(rid=rid, origin_input_ids=prompt)
    if not cache.admit(req, max_new_tokens=num_out):
        assert req.req_pool_idx is None and req.mamba_pool_idx is None and req.last_node is None
        cache.take_load_plan(req)  # a load-back applied before the refusal stays in the tree; drop the plan
        return
    cache.take_load_plan(req)
    assert stamps.read(req.mamba_pool_idx) == (fingerprint(prompt[: req.kv_len]), req.kv_len)
    row = cache.req_to_token_pool.req_to_token[req.req_pool_idx][: req.kv_len]
    assert kv_tokens(cache, row) == prompt[: req.kv_len]
    last = len(prompt) + num_out - 1
    while len(req.output_ids) < num_out:
        start = req.kv_len
        n = min(8, len(prompt) - start) if start < len(prompt) else 1
        plan = cache.extend(req, n)
        if plan is None:
            cache.finish(req, insert=False)
            return
        tokens = req.token_ids(plan.end)
        rows = plan.kv_indices.to(torch.int64)
        k_buffer[rows, 0, 0] = torch.tensor(tokens[start : plan.end], dtype=k_buffer.dtype)
        k_buffer[rows, 0, 1] = torch.arange(start, plan.end, dtype=k_buffer.dtype)
        stamps.write(plan.live_slot, fingerprint(tokens), plan.end)
        if plan.track_slot is not None:
            stamps.write(plan.track_slot, fingerprint(tokens[: plan.track_len]), plan.track_len)
        cache.commit(plan, finished=plan.end == last)
        if plan.end >= len(prompt):
            req.output_ids.append(9000 + rid * 100 + len(req.output_ids))
    cache.finish(req)


SHARED = list(range(1, 21))
OTHER = list(range(500, 548))


def workload(cache: MambaRadixCache) -> None:
    first = [*SHARED, 30, 31, 32, 33]
    serve(cache, 1, first, 4)  # a prefill in chunks, then decode
    serve(cache, 2, [*SHARED, 40, 41], 1)  # copy-on-write of the shared prefix: a fork at its end
    if cache.config.host_write_policy == "write_through_selective":
        serve(cache, 3, first, 1)  # a repeat: the path's second hit backs it up
    serve(cache, 4, OTHER, 1)  # does not fit beside the others: evicts them, demoting to the host
    serve(cache, 5, [*first, 9100, 9101, 9102, 70], 1)  # the first's next turn: a host hit, loaded back
    serve(cache, 6, [*SHARED, 50, 51], 1)  # a third branch at the fork: a host hit again


def check_whole(cache: MambaRadixCache) -> None:
    """Invariants with conservation on both tiers, every stamp (device and host) and every device KV row,
    then everything evicted from both tiers: every pool back whole."""
    stamps: StateStamps = cache.stamps  # type: ignore[attr-defined]
    host_pool = cache.host_state_pool
    assert host_pool is not None and cache.host_kv_pool is not None
    *conv, temporal = host_pool.tensors
    host_states = SimpleNamespace(conv=conv, temporal=temporal)  # read_stamp reads a pool's tensors
    cache.check_invariants([])
    tree = cache.tree
    for node in tree.nodes():
        if node.is_root:
            continue
        tokens = [t for x in reversed(list(tree.path_to_root(node))) for t in x.key]
        if node.value is not None:
            assert kv_tokens(cache, tree.path_values(node)) == tokens
        if node.mamba_slot is not None:
            assert stamps.read(node.mamba_slot) == (fingerprint(tokens), node.depth)
        if node.host_slot is not None:
            assert read_stamp(host_states, node.host_slot) == (fingerprint(tokens), node.depth)
    cache.evict(num_tokens=10**6, num_states=10**6)
    cache.check_invariants([])
    cache.evict_host(num_tokens=10**6, num_slots=10**6)
    cache.check_invariants([])
    assert cache.tree.num_nodes == 1
    assert cache.token_to_kv_pool_allocator.used == 0
    assert cache.mamba_pool.used == 0
    assert cache.req_to_token_pool.used == 0
    assert cache.reserved_kv_tokens == 0
    assert cache.host_kv_pool.used == 0 and host_pool.used == 0
    assert not cache.tree.host_pinned


def count_calls(name: str, policy: str, cap: int | None) -> list[str]:
    """The fault-free run: its allocation points by kind, after checking the scenario is not vacuous."""
    cache, faults = build(name, policy, cap)
    workload(cache)
    stats = cache.host_stats
    assert stats is not None
    assert stats.states_backed_up >= 1 and stats.kv_backed_up >= 1, stats
    assert stats.host_hits >= 1 and stats.kv_loaded >= 1, stats  # demoted, then loaded back
    assert cap is None or faults.cap_dropped >= 1  # the cap freed host copies
    check_whole(cache)
    return faults.kinds


IDS = [f"{n}-{p}" + ("" if c is None else f"-cap{c}-drop") for n, p, c in CASES]


@pytest.mark.parametrize(("name", "policy", "cap"), CASES, ids=IDS)
def test_every_allocation_point_with_the_host_tier_failed_once_and_for_good(
    name: str, policy: str, cap: int | None
) -> None:
    kinds = count_calls(name, policy, cap)
    assert any(k.startswith("HostKVPool.") for k in kinds) and any(
        k.startswith("HostStatePool.") for k in kinds
    )
    assert any(k.startswith("load_back:") for k in kinds)
    for k in range(1, len(kinds) + 1):
        for mode in ("once", "from"):
            cache, faults = build(name, policy, cap)
            if mode == "once":
                faults.fail_once = k
            else:
                faults.fail_from = k
            workload(cache)
            check_whole(cache)
