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
    check_cap_policy,
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


# ------------------------------------------------------------------------------ issue 15 additions
def test_conservation_by_counts_when_the_pool_cannot_list() -> None:
    ok = Ownership("slots", {"tree": [1, 2], "req 1": [3]}, None, 2, 5, 1, 1)
    check_conservation(ok)
    with pytest.raises(SuiteViolation, match="a leak"):
        check_conservation(Ownership("slots", {"tree": [1]}, None, 2, 5, 1, 1))
    with pytest.raises(SuiteViolation, match="owned but free"):
        check_conservation(Ownership("slots", {"tree": [1, 2, 3, 4]}, None, 2, 5, 1, 1))
    rows = Ownership("rows", {"req 1": [0]}, None, 1, 2, 1, 0)  # a pool whose first index is 0
    check_conservation(rows)


def test_cap_policy_allows_only_non_fork_unlocked_drops_on_a_new_path() -> None:
    # chain 1-2-3-4 with checkpoints at 1, 2 and 4; the 2-token node forks (2 -> 3 and 2 -> 9)
    paths = {(1, 2, 3, 4): [1, 2, 3, 4], (1, 2, 9): [1, 2, 5]}
    before = snap_of(paths, {(1,): 1, (1, 2): 2, (1, 2, 3, 4): 3})
    new = [(N, (1, 2, 3, 4))]
    dropped_chain = snap_of(paths, {(1, 2): 2, (1, 2, 3, 4): 3})
    check_cap_policy(before, dropped_chain, new, 2, [], 1)  # the shallow non-fork may go
    dropped_fork = snap_of(paths, {(1,): 1, (1, 2, 3, 4): 3})
    with pytest.raises(SuiteViolation, match="a fork"):
        check_cap_policy(before, dropped_fork, new, 2, [], 1)
    with pytest.raises(SuiteViolation, match="was locked"):
        check_cap_policy(before, dropped_chain, new, 2, [(N, (1,))], 1)
    with pytest.raises(SuiteViolation, match="no cap is set"):
        check_cap_policy(before, dropped_chain, new, -1, [], 1)
    with pytest.raises(SuiteViolation, match="on no path"):
        check_cap_policy(before, dropped_chain, [], 2, [], 1)
    lost_kv = snap_of({(1, 2, 3, 4): [1, 2, 3, 4]}, {(1,): 1, (1, 2): 2, (1, 2, 3, 4): 3})
    with pytest.raises(SuiteViolation, match="left the tree although nothing was evicted"):
        check_cap_policy(before, lost_kv, new, 2, [], 1)


def test_stamp_store_copies_and_clears() -> None:
    from mamba_radix.state_stamp import fingerprint
    from mamba_radix.testing import StampStore
    from mamba_radix.testing.stamps import EMPTY_STAMP

    store = StampStore()
    assert store.read(3) == EMPTY_STAMP == expected_stamp(())
    store.write(3, [1, 2])
    store.copy(3, 4)
    assert store.read(4) == expected_stamp((1, 2)) == (fingerprint([1, 2]), 2)
    store.clear(3)
    assert store.read(3) == EMPTY_STAMP
    assert fingerprint([1, 2]) != fingerprint([2, 1])


def test_known_failures_are_matched_by_type_and_message() -> None:
    from mamba_radix.testing import FailureLog, KnownFailure, KnownIssue

    issue = KnownIssue("x-1", "https://example.org/1", "demo", ("AssertionError",), "Can not alloc")
    assert issue.matches(AssertionError("Can not alloc mamba cache"))
    assert not issue.matches(AssertionError("other"))
    assert not issue.matches(ValueError("Can not alloc"))
    failure = KnownFailure(issue, "detail")
    assert not isinstance(failure, AssertionError)  # never read as a failed check
    log = FailureLog(examples=4)
    log.record(failure, step=7)
    assert log.counts == {"x-1": 1} and "1 of 4 examples" in log.summary()


def test_profiles_live_in_the_package() -> None:
    from hypothesis import settings

    from mamba_radix.errors import ConfigError
    from mamba_radix.testing.profiles import PROFILES, load_profile

    current = settings.default
    try:
        assert load_profile("dev") == "dev" and settings.default.max_examples == 15
        assert set(PROFILES) == {"ci", "dev", "thorough"}
        with pytest.raises(ConfigError, match="not a profile"):
            load_profile("fast")
    finally:
        settings.register_profile("_restore", current)
        settings.load_profile("_restore")


def test_suite_params_are_consistent() -> None:
    from hypothesis import given

    from mamba_radix.testing import suite_params

    @given(suite_params())
    def check(p) -> None:  # type: ignore[no-untyped-def]
        assert p.strategy != "no_buffer" or (p.page_size == 1 and not p.overlap)
        assert p.strategy != "extra_buffer_lazy" or p.overlap
        assert p.track_interval % p.page_size == 0 and p.prefill_chunk % p.page_size == 0

    check()


def test_suite_imports_without_the_cache_or_torch() -> None:
    """``import mamba_radix.testing`` imports neither our cache nor torch (another engine's adapter needs
    neither): the parent package resolves its names lazily."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import mamba_radix.testing as t\n"
        "bad = sorted(n for n in sys.modules if n == 'torch' or n in ('mamba_radix.cache', 'mamba_radix.tree'))\n"
        "assert not bad, bad\n"
        "assert t.make_machine and t.StampStore and t.suite_params\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
