"""The host tier's pools (issue 25): :class:`HostStatePool` and :class:`HostKVPool`.

Contents are random bytes (NaN payloads included), so round trips are compared on the bytes. Every refusal
is checked to change nothing in either pool: the tensors byte for byte and the free lists. A Hypothesis
state machine drives backups, loads and frees against a plain model of which host slot holds which bytes.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_cpu_copy import fill_random_bytes, raw

from mamba_radix.errors import InvalidArgument, InvalidIndex, OutOfMemory, OutOfSlots
from mamba_radix.pools import MambaPool, MHATokenToKVPool, MLATokenToKVPool
from mamba_radix.pools.host_kv_pool import HostKVPool
from mamba_radix.pools.host_state_pool import HostStatePool

SLOTS = 6
HOST_SLOTS = 4
KV_ROWS = 32
HOST_ROWS = 20


def state_pool(seed: int = 0) -> MambaPool:
    pool = MambaPool(SLOTS, 2, [(3, 4), (2, 4)], (2, 4, 4), [torch.bfloat16, torch.float32], torch.float32)
    for i, t in enumerate(pool.tensors):
        fill_random_bytes(t, seed * 17 + i)
    return pool


def slot_bytes(tensors: list[torch.Tensor], slot: int) -> list[torch.Tensor]:
    return [raw(t[:, slot]) for t in tensors]


def snapshot(host: HostStatePool) -> tuple:
    dev = host.device_pool
    return (
        host.available_size(),
        host.allocated_slots().tolist(),
        dev.available_size(),
        [raw(t) for t in (*host.tensors, *dev.tensors)],
    )


def assert_same(a: tuple, b: tuple) -> None:
    assert a[:3] == b[:3]
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3], strict=True))


# ------------------------------------------------------------------------------------ state pool
def test_state_round_trip_is_byte_exact_into_other_slots() -> None:
    dev = state_pool()
    slots = dev.alloc(3).tolist()
    before = [slot_bytes(dev.tensors, s) for s in slots]
    host = HostStatePool(dev, HOST_SLOTS)
    host_slots, event = host.backup(slots)
    assert event is None and host.used == 3
    for s, h in zip(slots, host_slots.tolist(), strict=True):  # host slot i holds device slot i
        assert all(
            torch.equal(a, b)
            for a, b in zip(slot_bytes(host.tensors, h), slot_bytes(dev.tensors, s), strict=True)
        )
    dev.free(slots)
    for t in dev.tensors:  # the device slots are reused and overwritten before the load-back
        t.zero_()
    targets = dev.alloc(3).tolist()
    assert host.load(host_slots, targets) is None
    for t, b in zip(targets, before, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(slot_bytes(dev.tensors, t), b, strict=True))
    assert host.used == 3  # a load keeps the backup
    host.free(host_slots)
    assert host.used == 0
    host.audit()


def test_host_pool_has_its_own_capacity_and_device_layout() -> None:
    dev = state_pool()
    host = HostStatePool(dev, 9)
    assert host.size == 9 and host.available_size() == 9
    assert host.bytes_per_slot == dev.bytes_per_slot
    assert [t.shape[1] for t in host.tensors] == [10] * len(dev.tensors)  # + slot 0
    assert [t.dtype for t in host.tensors] == [t.dtype for t in dev.tensors]
    assert all(t.device.type == "cpu" for t in host.tensors)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda h, d: h.backup(d.alloc(HOST_SLOTS + 1)), OutOfSlots),  # more than the host holds
        (lambda h, d: h.backup([5]), InvalidIndex),  # a device slot not allocated
        (lambda h, d: h.backup([d.alloc(1).item()] * 2), InvalidArgument),  # repeated
        (lambda h, d: h.load([1], d.alloc(1)), InvalidIndex),  # a host slot holding nothing
        (lambda h, d: h.free([1]), InvalidIndex),  # freeing a host slot never taken
        (lambda h, d: h.free([99]), InvalidIndex),
    ],
)
def test_state_refusals_change_nothing(call, error) -> None:
    dev = state_pool(seed=3)
    host = HostStatePool(dev, HOST_SLOTS)
    before = snapshot(host)
    with pytest.raises(error):
        call(host, dev)
    after = snapshot(host)
    assert after[:2] == before[:2]
    assert all(torch.equal(x, y) for x, y in zip(after[3], before[3], strict=True))


def test_state_load_refusals_change_nothing() -> None:
    dev = state_pool(seed=5)
    host = HostStatePool(dev, HOST_SLOTS)
    host_slots, _ = host.backup(dev.alloc(2))
    target = dev.alloc(2).tolist()
    for bad in ([target[0]], [target[0], target[0]], [target[0], 6]):
        before = snapshot(host)
        with pytest.raises(InvalidArgument):
            host.load(host_slots, bad)
        assert_same(before, snapshot(host))
    host.free(host_slots)
    before = snapshot(host)
    with pytest.raises(InvalidIndex):  # a host copy freed twice
        host.free(host_slots)
    assert_same(before, snapshot(host))


def test_bad_construction_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        HostStatePool(object(), 4)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        HostStatePool(state_pool(), 0)
    with pytest.raises(InvalidArgument):
        HostKVPool(0)
    with pytest.raises(InvalidArgument):
        HostKVPool(4, object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------- KV pool
def mha(seed: int = 0) -> MHATokenToKVPool:
    pool = MHATokenToKVPool(KV_ROWS, 1, torch.bfloat16, 2, 4, 3)
    for i, t in enumerate([*pool.k_buffer, *pool.v_buffer]):
        fill_random_bytes(t, seed * 13 + i)
    return pool


def mla(seed: int = 0) -> MLATokenToKVPool:
    pool = MLATokenToKVPool(KV_ROWS, 1, torch.float32, 8, 4, 2)
    for i, t in enumerate(pool.kv_buffer):
        fill_random_bytes(t, seed * 13 + i)
    return pool


def buffers(pool) -> list[torch.Tensor]:
    return [*pool.k_buffer, *pool.v_buffer] if isinstance(pool, MHATokenToKVPool) else list(pool.kv_buffer)


@pytest.mark.parametrize("make", [mha, mla])
def test_kv_round_trip_is_byte_exact(make) -> None:
    dev = make()
    rows = [3, 9, 4, 17, 30]
    before = [raw(b[rows]) for b in buffers(dev)]
    host = HostKVPool(HOST_ROWS, dev)
    host_rows = host.backup(rows)
    assert host.used == 5 and host.bytes_per_token * 5 <= host.total_bytes
    for b in buffers(dev):
        b.zero_()
    targets = [20, 5, 6, 7, 8]
    host.load(host_rows, targets)
    after = [raw(b[targets]) for b in buffers(dev)]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    host.free(host_rows)
    assert host.used == 0
    host.audit()


def test_kv_index_only_pool_keeps_the_accounting() -> None:
    host = HostKVPool(HOST_ROWS)
    assert host.total_bytes == 0
    host_rows = host.backup(list(range(1, 8)))
    assert host.used == 7 and bool(host.is_allocated(host_rows).all())
    host.load(host_rows, list(range(10, 17)))
    with pytest.raises(OutOfMemory):
        host.backup(list(range(1, HOST_ROWS)))
    assert host.used == 7
    host.free(host_rows)
    with pytest.raises(InvalidIndex):
        host.free(host_rows)
    assert host.used == 0


def test_kv_refusals_change_nothing() -> None:
    dev = mha(seed=2)
    host = HostKVPool(HOST_ROWS, dev)
    host_rows = host.backup([1, 2, 3])
    calls = [
        (lambda: host.backup(list(range(1, HOST_ROWS))), OutOfMemory),  # more than is free on the host
        (lambda: host.backup([KV_ROWS + 5]), InvalidIndex),  # outside the device rows
        (lambda: host.load([15], [4]), InvalidIndex),  # a host row holding nothing
        (lambda: host.load(host_rows, [4, 4, 5]), InvalidIndex),  # a device row twice
        (lambda: host.load(host_rows, [4, 5]), InvalidArgument),  # lengths differ
    ]
    for call, error in calls:
        used, dev_bytes = host.used, [raw(b) for b in buffers(dev)]
        host_bytes = [raw(b) for b in host._buffers]
        with pytest.raises(error):
            call()
        assert host.used == used
        assert all(torch.equal(x, raw(y)) for x, y in zip(dev_bytes, buffers(dev), strict=True))
        assert all(torch.equal(x, raw(y)) for x, y in zip(host_bytes, host._buffers, strict=True))


# ----------------------------------------------------------------------------- state machine
class HostStateMachine(RuleBasedStateMachine):
    """Backups, loads and frees in any order; each host slot's bytes match what was backed up."""

    def __init__(self) -> None:
        super().__init__()
        self.dev = state_pool(seed=11)
        self.host = HostStatePool(self.dev, HOST_SLOTS)
        self.model: dict[int, list[torch.Tensor]] = {}  # host slot -> the bytes backed up into it
        self.seed = 100

    @rule(n=st.integers(0, HOST_SLOTS + 1))
    def backup(self, n: int) -> None:
        if self.dev.available_size() < n:
            return
        slots = self.dev.alloc(n).tolist()
        for t in self.dev.tensors:  # new contents each time
            self.seed += 1
            fill_random_bytes(t, self.seed)
        expected = [slot_bytes(self.dev.tensors, s) for s in slots]
        if n > self.host.available_size():
            used = self.host.used
            with pytest.raises(OutOfSlots):
                self.host.backup(slots)
            assert self.host.used == used
        else:
            host_slots, _ = self.host.backup(slots)
            for h, e in zip(host_slots.tolist(), expected, strict=True):
                assert h not in self.model
                self.model[h] = e
        self.dev.free(slots)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def load(self, data) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True))
        if self.dev.available_size() < len(chosen):
            return
        targets = self.dev.alloc(len(chosen)).tolist()
        self.host.load(chosen, targets)
        for h, t in zip(chosen, targets, strict=True):
            assert all(
                torch.equal(a, b) for a, b in zip(slot_bytes(self.dev.tensors, t), self.model[h], strict=True)
            )
        self.dev.free(targets)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data) -> None:
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True))
        self.host.free(chosen)
        for h in chosen:
            del self.model[h]
        with pytest.raises(InvalidIndex):  # freed exactly once
            self.host.free(chosen[:1])

    @invariant()
    def conservation(self) -> None:
        assert sorted(self.model) == self.host.allocated_slots().tolist()
        assert self.host.used + self.host.available_size() == HOST_SLOTS
        for h, e in self.model.items():
            assert all(torch.equal(a, b) for a, b in zip(slot_bytes(self.host.tensors, h), e, strict=True))


HostStateMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
TestHostStateMachine = HostStateMachine.TestCase
