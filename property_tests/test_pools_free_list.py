"""FreeList: need_sort merge regressions, the unchecked free, and a differential check of the two
implementations (numpy views on CPU, plain torch for devices) against each other and a set model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mamba_radix.errors import InvalidIndex
from mamba_radix.pools import MambaPool, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from mamba_radix.pools.free_list import FreeList
from mamba_radix.pools.free_lists import make_free_list
from mamba_radix.pools.host_free_list import HostFreeList

CPU = torch.device("cpu")
BACKENDS = ["host", "torch"]


def state(fl: FreeList) -> tuple:
    return (
        fl.available,
        fl.free_pages.tolist(),
        fl.release_pages.tolist(),
        fl.allocated_ids().tolist(),
    )


def test_make_free_list_picks_by_device_and_rejects_unknown_backends():
    assert type(make_free_list(4, CPU, True, "id")) is HostFreeList
    assert type(make_free_list(4, CPU, True, "id", backend="torch")) is FreeList
    with pytest.raises(ValueError, match="backend"):
        make_free_list(4, CPU, True, "id", backend="numpy")


# ------------------------------------------------------------------------------- need_sort merges
# A merge either sorts (free list small against the pool) or scans the bitmap (large); both must hand
# out every free id exactly once. An early version duplicated an id in the merge.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_ids", [64, 4096])  # with 30 free ids: 64 scans, 4096 sorts
def test_ids_after_a_need_sort_merge_are_unique(backend, num_ids):
    fl = make_free_list(num_ids, CPU, True, "id", backend=backend)
    held = fl.alloc(num_ids).tolist()
    freed = held[:30:3] + held[-20:][::-1]  # out of order, some adjacent
    fl.free(torch.tensor(freed[:18]))
    fl.free_group_begin()
    fl.free(torch.tensor(freed[18:]))  # an open group is merged too
    assert fl.free_pages.numel() == 0
    got = fl.alloc(len(freed)).tolist()  # needs every released id: forces the merge
    assert got == sorted(freed), "merge must hand out each released id once, ascending"
    assert len(set(got)) == len(got)
    assert fl.available == 0 and fl.alloc(1) is None
    fl.free_group_end()
    assert fl.release_pages.numel() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_keeps_the_unmerged_head_and_stays_disjoint_from_allocated(backend):
    fl = make_free_list(32, CPU, True, "id", backend=backend)
    a = fl.alloc(20)
    fl.free(a[5:15])
    fl.merge()
    free = fl.free_pages.tolist()
    assert free == sorted(set(range(6, 16)) | set(range(21, 33)))
    assert not set(free) & set(fl.allocated_ids().tolist())
    # a second allocation round after the merge still never repeats an id
    out = fl.alloc(22).tolist()
    assert sorted(out) == free and len(set(out)) == 22


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_allocations_after_a_merge_are_unique(backend):
    a = PagedTokenToKVPoolAllocator(64 * 4, 4, backend=backend)
    spans = [a.alloc(16) for _ in range(16)]
    for span in spans[::2]:
        a.free(span)
    got = torch.cat([a.alloc(16) for _ in range(8)]).tolist()
    assert len(set(got)) == len(got) == 128
    assert sorted(got) == sorted(torch.cat(spans[::2]).tolist())


# ----------------------------------------------------------------------------------- check=False
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [1, 5, 40])  # the Python and the vectorised path of the host backend
def test_unchecked_free_has_the_checked_result(backend, k):
    checked = TokenToKVPoolAllocator(64, backend=backend)
    unchecked = TokenToKVPoolAllocator(64, backend=backend)
    x, y = checked.alloc(50), unchecked.alloc(50)
    checked.free(x[3 : 3 + k])
    unchecked.free(y[3 : 3 + k], check=False)
    assert unchecked.available_size() == checked.available_size() == 14 + k
    assert unchecked.release_pages.tolist() == checked.release_pages.tolist()
    assert unchecked.allocated_indices().tolist() == checked.allocated_indices().tolist()
    # checked is the default: the same double free is refused
    with pytest.raises(InvalidIndex, match="not allocated"):
        checked.free(x[3:4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_free_of_pages_and_slots(backend):
    paged = PagedTokenToKVPoolAllocator(64, 4, backend=backend)
    span = paged.alloc(32)
    paged.free(span[:20], check=False)  # 5 pages, given token by token
    assert paged.available_size() == 32 + 20
    with pytest.raises(InvalidIndex, match="not allocated"):
        paged.free(span[:4])
    pool = MambaPool(8, 1, [(2, 2)], (2,), backend=backend)
    slots = pool.alloc(3)
    pool.free(slots[1:], check=False)
    assert pool.available_size() == 7 and pool.is_allocated(slots).tolist() == [True, False, False]


# ------------------------------------------------------------------------------------ the errors
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", [2, 17, 40])  # both sides of the host backend's small-free cut-off
@pytest.mark.parametrize(
    ("bad", "message"),
    [(0, "padding"), (65, "out of range"), (-4, "out of range"), (60, "not allocated"), ("dup", "twice")],
)
def test_bad_free_raises_the_precise_error_and_changes_nothing(backend, k, bad, message):
    fl = make_free_list(64, CPU, True, "slot", backend=backend)
    ids = fl.alloc(50)
    fl.free(ids[45:])
    before = state(fl)
    good = ids[:k].tolist()
    good[k // 2] = good[0] if bad == "dup" else bad
    with pytest.raises(InvalidIndex, match=message):
        fl.free(torch.tensor(good))
    assert state(fl) == before


# ----------------------------------------------------------------------------- differential model
class FreeListDifferential(RuleBasedStateMachine):
    """Both implementations driven by the same calls give the same answers (ids, errors and their
    messages, free list, pending frees, bitmap), and both agree with a set model."""

    N = 40  # frees of up to 40 ids cross the host backend's small-free cut-off

    def __init__(self) -> None:
        super().__init__()
        self.restart(True)

    @rule(need_sort=st.booleans())
    def restart(self, need_sort):
        self.lists = [make_free_list(self.N, CPU, need_sort, "id", backend=b) for b in BACKENDS]
        self.held: list[int] = []

    def both(self, call) -> object:
        """Apply ``call`` to each list; the results, or the errors' types and messages, must agree."""
        out = []
        for fl in self.lists:
            try:
                res = call(fl)
                out.append(("ok", None if res is None else res.tolist()))
            except InvalidIndex as exc:
                out.append(("error", str(exc)))
        assert out[0] == out[1], out
        return out[0]

    @rule(n=st.integers(0, N + 1))
    def alloc(self, n):
        kind, got = self.both(lambda fl: fl.alloc(n))
        assert kind == "ok"
        if n > self.N - len(self.held):
            assert got is None
        else:
            assert len(set(got)) == n and not set(got) & set(self.held)
            self.held += got

    @rule(data=st.data(), check=st.booleans())
    def free(self, data, check):
        if not self.held:
            return
        ids = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        assert self.both(lambda fl: fl.free(torch.tensor(ids), check=check))[0] == "ok"
        self.held = [i for i in self.held if i not in ids]

    @rule(data=st.data())
    def bad_free(self, data):
        ids = data.draw(st.lists(st.integers(-2, self.N + 2), min_size=1, max_size=self.N))
        if len(set(ids)) == len(ids) and set(ids) <= set(self.held):
            return  # a valid free; the rule above covers those
        before = [state(fl) for fl in self.lists]
        assert self.both(lambda fl: fl.free(torch.tensor(ids, dtype=torch.int64)))[0] == "error"
        assert [state(fl) for fl in self.lists] == before

    @rule(data=st.data(), divisor=st.sampled_from([1, 2, 4]))
    def free_containing(self, data, divisor):
        """Free the ids that ``ids // divisor`` name, each given once or several times."""
        if not self.held:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique=True))
        tokens = data.draw(st.lists(st.sampled_from(chosen), min_size=len(chosen), max_size=3 * len(chosen)))
        tokens = [*chosen, *tokens]
        tokens = [t * divisor + data.draw(st.integers(0, divisor - 1)) for t in tokens]
        kind, _ = self.both(lambda fl: fl.free_containing(torch.tensor(tokens), divisor))
        assert kind == "ok"
        self.held = [i for i in self.held if i not in chosen]

    @rule()
    def group_begin(self):
        self.both(lambda fl: fl.free_group_begin())

    @rule()
    def group_end(self):
        self.both(lambda fl: fl.free_group_end())

    @rule()
    def merge(self):
        self.both(lambda fl: fl.merge())

    @rule()
    def clear(self):
        """Every id free again, handed out from 1 (the host list: lazily, clearing only the bitmap bytes
        of ids it ever listed)."""
        self.both(lambda fl: fl.clear())
        self.held = []

    @invariant()
    def agree_with_each_other_and_the_model(self):
        host, dev = (state(fl) for fl in self.lists)
        if self.lists[0].need_sort:
            assert host == dev
        else:  # pending frees in one call may be parked in either order; the multiset must agree
            assert host[0] == dev[0] and host[3] == dev[3]
        available, free_list, pending, allocated = host
        assert allocated == sorted(self.held)
        listed = free_list + pending
        assert len(listed) == len(set(listed)) == available == self.N - len(self.held)
        assert set(listed) == set(range(1, self.N + 1)) - set(self.held)


TestFreeListDifferential = FreeListDifferential.TestCase
