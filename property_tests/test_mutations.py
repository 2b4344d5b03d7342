"""Mutation check: plant known bugs in the tree or cache and show that the state machine catches each.

Every mutant is installed with ``monkeypatch`` (undone after the test) as a thin wrapper around the real
method, so it keeps tracking the real code. The cache's own ``check_invariants`` is switched off for the
run: the suite's independent checks (oracle, conservation against the pools, accounting, state stamps,
eviction amounts, teardown) must find the bug by themselves. Runs are deterministic (``derandomize``, no
example database) and bounded (a fixed example budget, no shrinking), so this file costs
about a minute.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from mamba_radix.cache import MambaRadixCache
from mamba_radix.lifecycle import RequestLifecycle
from mamba_radix.testing import MambaRadixAdapter, make_machine, radix_params
from mamba_radix.tree import Freed, RadixTree

AnyConfigMachine = make_machine(MambaRadixAdapter, radix_params(), "AnyConfigMachine")
# the cap's policy only matters with a cap, and is judged in steps that evict nothing: the cap mutant is
# searched for among capped configurations with roomy pools
CappedMachine = make_machine(
    MambaRadixAdapter,
    radix_params(caps=(1, 2), kv_tokens=(48, 64), spare_slots=(6, 12)),
    "CappedMachine",
)

BUDGET = settings(
    max_examples=300,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # finding is enough; shrinking would only cost time
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
)
# The cap mutant shows only in capped runs that evict nothing at a shared fork: over 12 random seeds it took
# 10 to 398 examples (median ~90). The derandomized stream is fixed for one set of imported test modules, not
# across sets: with test_reference_engine.py collected too, 300 examples missed it. So capped runs get a
# budget with a margin over that tail, and the control runs the same one.
CAPPED_BUDGET = settings(BUDGET, max_examples=1500)


# --------------------------------------------------------------------------------------------- mutants
def leaf_eviction_keeps_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing a leaf forgets to hand back its checkpoint slot (a slot leak)."""
    original = RadixTree._remove_leaf

    def mutant(self: RadixTree, leaf, freed: Freed) -> None:
        first = len(freed.slots)
        original(self, leaf, freed)
        del freed.slots[first : first + 1]  # the leaf's own checkpoint is the first slot it releases

    monkeypatch.setattr(RadixTree, "_remove_leaf", mutant)


def split_copies_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A split gives the new parent the child's checkpoint slot (a state valid only at the child's end)."""
    original = RadixTree._split

    def mutant(self: RadixTree, child, num_tokens: int, now: int):
        parent = original(self, child, num_tokens, now)
        parent.mamba_slot = child.mamba_slot
        return parent

    monkeypatch.setattr(RadixTree, "_split", mutant)


def unlock_skips_ancestor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dec_lock_ref`` forgets to release the parent of the unlocked node."""
    original = RadixTree.dec_lock_ref

    def mutant(self: RadixTree, node, **kind: bool) -> Freed | None:
        freed = original(self, node, **kind)
        parent = node.parent
        if parent is not None and parent is not self.root:
            parent.full_lock_ref += 1  # the decrement that was skipped
        return freed

    monkeypatch.setattr(RadixTree, "dec_lock_ref", mutant)


def cow_skips_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy-on-write of a hit allocates the request's slot but never copies the checkpoint into it."""
    original = MambaRadixCache._copy_on_write

    def mutant(self: MambaRadixCache, req, node) -> bool:
        self.mamba_pool.copy_slot = lambda src, dst: None  # type: ignore[method-assign]
        try:
            return original(self, req, node)
        finally:
            del self.mamba_pool.copy_slot  # back to the class's method

    monkeypatch.setattr(MambaRadixCache, "_copy_on_write", mutant)


def unfinished_req_never_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cache_unfinished_req`` only refreshes the request and never inserts (a silent non-cache)."""

    def mutant(self: RequestLifecycle, req) -> None:
        req.mamba_last_track_seqlen = None

    monkeypatch.setattr(RequestLifecycle, "cache_unfinished_req", mutant)


def cap_drops_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-path cap drops forks too (it skips only the tail and locked nodes): the bound still holds,
    so only the cap's policy check can tell (a shared prefix loses its checkpoint)."""

    def mutant(self: RadixTree, tail) -> list[int]:
        cap = self.config.mamba_max_states_per_path
        if cap < 0:
            return []
        holders = [node for node in self.path_to_root(tail) if node.mamba_slot is not None]
        excess = len(holders) - cap
        freed = Freed()
        for node in reversed(holders):
            if excess <= 0:
                break
            if node is tail or node.mamba_lock_ref > 0:  # the fork test (children != 1) is gone
                continue
            self._drop_checkpoint(node, freed)
            excess -= 1
        return freed.slots

    monkeypatch.setattr(RadixTree, "_enforce_path_cap", mutant)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "cap_drops_forks": cap_drops_forks,
    "leaf_eviction_keeps_slot": leaf_eviction_keeps_slot,
    "split_copies_checkpoint": split_copies_checkpoint,
    "unlock_skips_ancestor": unlock_skips_ancestor,
    "cow_skips_copy": cow_skips_copy,
    "unfinished_req_never_caches": unfinished_req_never_caches,
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_suite_catches_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    MUTANTS[name](monkeypatch)
    monkeypatch.setattr(MambaRadixCache, "check_invariants", lambda self, running_reqs=None: None)
    start = time.perf_counter()
    machine, budget = (
        (CappedMachine, CAPPED_BUDGET) if name.startswith("cap_") else (AnyConfigMachine, BUDGET)
    )
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(machine, settings=budget)
    print(
        f"{name}: caught in {time.perf_counter() - start:.1f}s: {(str(caught.value).splitlines() or [type(caught.value).__name__])[0]}"
    )


@pytest.mark.parametrize(
    ("machine", "budget"), [(AnyConfigMachine, BUDGET), (CappedMachine, CAPPED_BUDGET)], ids=["any", "capped"]
)
def test_unmutated_cache_passes_the_same_budget(machine, budget) -> None:  # type: ignore[no-untyped-def]
    """The control: the same bounded runs without a mutant find nothing, so a mutant's failure is its own."""
    run_state_machine_as_test(machine, settings=budget)
