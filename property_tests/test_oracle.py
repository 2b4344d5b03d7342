"""Unit tests of the suite's own parts: the oracle, the pool checks and the fault injectors.

The state machine trusts these to flag a broken cache, so each check is shown both accepting a correct
picture and rejecting each kind of wrong one, on small hand-built snapshots.
"""

from __future__ import annotations

import pytest
import torch

from mamba_radix.pools import MambaPool
from mamba_radix.state_stamp import write_stamp
from mamba_radix.testing import (
    FailNextAllocs,
    OracleViolation,
    Ownership,
    PrefixOracle,
    SuiteViolation,
    TreeSnapshot,
)
from mamba_radix.testing.checks import (
    check_accounting,
    check_conservation,
    check_path_cap,
    check_pools_full,
    check_stamps,
    expected_stamp,
)

N = None  # the default namespace


def snap_of(
    paths: dict[tuple[int, ...], list[int]], checkpoints: dict[tuple[int, ...], int], page: int = 1
) -> TreeSnapshot:
    """A snapshot from whole root paths (tokens -> one KV index per token) and checkpoint slots."""
    s = TreeSnapshot()
    for toks, idx in paths.items():
        for n in range(page, len(toks) + 1, page):
            s.kv[(N, toks[:n])] = tuple(idx[n - page : n])
    s.checkpoints = {(N, t): slot for t, slot in checkpoints.items()}
    return s


def oracle_with(paths: dict, checkpoints: dict, page: int = 1) -> PrefixOracle:
    o = PrefixOracle(page, page)
    snap = snap_of(paths, checkpoints, page)
    for (e, t), idx in snap.kv.items():
        o.allow_kv(e, t, [0] * (len(t) - page) + list(idx), len(t) - page)
    for e, t in snap.checkpoints:
        o.allow_checkpoints(e, t, [len(t)])
    o.observe(snap, [])
    return o


# ------------------------------------------------------------------------------------------------ oracle
def test_expect_match_stops_at_deepest_checkpoint() -> None:
    o = oracle_with({(1, 2, 3, 4): [11, 12, 13, 14]}, {(1, 2): 1, (1, 2, 3, 4): 2})
    m = o.expect_match(N, (1, 2, 3, 9))
    assert (m.hit_len, m.kv_indices, m.full_kv_hit_len) == (2, (11, 12), 3)
    assert o.expect_match(N, (1, 2, 3, 4, 5)).hit_len == 4
    assert o.expect_match("other", (1, 2, 3, 4)).hit_len == 0


def test_expect_match_compares_whole_pages() -> None:
    o = oracle_with({(1, 2, 3, 4): [4, 5, 6, 7]}, {(1, 2, 3, 4): 1, (1, 2): 2}, page=2)
    m = o.expect_match(N, (1, 2, 3, 9))
    assert (m.hit_len, m.full_kv_hit_len) == (2, 2)  # the second page differs in its last token


def test_observe_rejects_unannounced_content() -> None:
    o = oracle_with({(1, 2): [5, 6]}, {(1, 2): 1})
    with pytest.raises(OracleViolation, match="never inserted"):
        o.observe(snap_of({(1, 2, 3): [5, 6, 7]}, {(1, 2, 3): 2}), [])


def test_observe_rejects_changed_index_and_accepts_announced_one() -> None:
    o = oracle_with({(1, 2): [5, 6]}, {(1, 2): 1})
    with pytest.raises(OracleViolation, match="held index"):
        o.observe(snap_of({(1, 2): [5, 9]}, {(1, 2): 1}), [])
    o.allow_kv(N, (1, 2), [5, 9], start=1)
    o.observe(snap_of({(1, 2): [5, 9]}, {(1, 2): 1}), [])


def test_observe_rejects_tombstone_leaf_and_orphan_checkpoint() -> None:
    o = oracle_with({(1, 2): [5, 6]}, {(1, 2): 1, (1,): 2})
    with pytest.raises(OracleViolation, match="tombstone"):
        o.observe(snap_of({(1, 2): [5, 6]}, {(1,): 2}), [])
    with pytest.raises(OracleViolation, match="no resident KV"):
        o.observe(snap_of({(1,): [5]}, {(1,): 2, (1, 2): 1}), [])


def test_observe_rejects_lost_locked_data() -> None:
    o = oracle_with({(1, 2): [5, 6], (3,): [7]}, {(1, 2): 1, (3,): 2})
    o.observe(snap_of({(1, 2): [5, 6]}, {(1, 2): 1}), [(N, (1, 2))])  # unlocked (3,) may go
    with pytest.raises(OracleViolation, match="lost"):
        o.observe(snap_of({}, {}), [(N, (1, 2))])


def test_branching_point_rules() -> None:
    o = PrefixOracle(1, 4)
    o.check_branching(9, 2, 8)
    o.check_branching(9, 8, None)  # nothing past the hit on the grid
    with pytest.raises(OracleViolation):
        o.check_branching(9, 2, None)
    with pytest.raises(OracleViolation):
        o.check_branching(9, 2, 9)


# ------------------------------------------------------------------------------------------------ checks
def own(
    owners: dict[str, list[int]], allocated: list[int], available: int, capacity: int = 8, page: int = 1
) -> Ownership:
    return Ownership("KV", owners, allocated, available, capacity, page)


def test_conservation_accepts_exact_ownership() -> None:
    check_conservation(own({"tree": [1, 2], "req 1": [3]}, [1, 2, 3], 5))
    # a request's partly filled last page belongs to it whole
    check_conservation(own({"tree": [2, 3], "req 1": [4]}, [2, 3, 4, 5], 4, capacity=8, page=2))


@pytest.mark.parametrize(
    ("owners", "allocated", "available", "what"),
    [
        ({"tree": [1, 2]}, [1, 2, 3], 5, "leaked"),
        ({"tree": [1, 2], "req 1": [2]}, [1, 2], 6, "owned by both"),
        ({"tree": [1, 1]}, [1], 7, "twice"),
        ({"tree": [1, 4]}, [1], 7, "free in the pool"),
        ({"tree": [1]}, [1], 6, "capacity"),
        ({"tree": [0]}, [], 8, "padding"),
    ],
)
def test_conservation_rejects(owners: dict, allocated: list[int], available: int, what: str) -> None:
    with pytest.raises(SuiteViolation, match=what):
        check_conservation(own(owners, allocated, available))


def test_accounting_counts_locked_paths() -> None:
    snap = snap_of({(1, 2, 3): [5, 6, 7], (4,): [8]}, {(1, 2): 1, (1, 2, 3): 2, (4,): 3})
    snap.counters = {"full_protected": 2, "full_evictable": 2, "mamba_protected": 1, "mamba_evictable": 2}
    check_accounting(snap, [(N, (1, 2))], 1)
    snap.counters["full_protected"] = 3
    with pytest.raises(SuiteViolation, match="full_protected"):
        check_accounting(snap, [(N, (1, 2))], 1)


def test_stamps_must_match_their_prefix() -> None:
    pool = MambaPool(4, 2, [(2, 4)], (2, 2), conv_dtypes=torch.bfloat16)
    write_stamp(pool, 1, *expected_stamp((1, 2)))
    write_stamp(pool, 2, *expected_stamp((1,)))
    snap = snap_of({(1, 2): [5, 6]}, {(1, 2): 1})
    from mamba_radix.state_stamp import read_stamp

    check_stamps(snap, lambda s: read_stamp(pool, s))
    snap.checkpoints[(N, (1, 2))] = 2
    with pytest.raises(SuiteViolation, match="1-token prefix"):
        check_stamps(snap, lambda s: read_stamp(pool, s))


def test_path_cap_allows_forks_and_locks_only() -> None:
    paths = {(1, 2, 3): [1, 2, 3]}
    snap = snap_of(paths, {(1,): 1, (1, 2, 3): 2})
    with pytest.raises(SuiteViolation, match="per-path cap"):
        check_path_cap(snap, [(N, (1, 2, 3))], 1, [], 1)
    check_path_cap(snap, [(N, (1, 2, 3))], 1, [(N, (1,))], 1)  # locked holder stays
    forked = snap_of({(1, 2, 3): [1, 2, 3], (1, 5): [1, 4]}, {(1,): 1, (1, 2, 3): 2, (1, 5): 3})
    check_path_cap(forked, [(N, (1, 2, 3))], 1, [], 1)  # a fork stays
    check_path_cap(snap, [(N, (1, 2, 3))], 2, [], 1)


def test_pools_full_after_teardown() -> None:
    check_pools_full([own({"tree": []}, [], 8)])
    with pytest.raises(SuiteViolation, match="teardown"):
        check_pools_full([own({"tree": [1]}, [1], 7)])


# ------------------------------------------------------------------------------------------------ faults
def test_fail_next_allocs_fails_then_restores() -> None:
    pool = MambaPool(4, 1, [(2, 4)], (2, 2))
    fault = FailNextAllocs(pool, "alloc")
    fault.arm(2)
    assert pool.alloc(1) is None and pool.alloc(1) is None
    assert pool.alloc(1) is not None and "alloc" not in vars(pool)
    fault.arm(1)
    fault.disarm()
    assert pool.alloc(1) is not None
