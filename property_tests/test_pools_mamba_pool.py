"""MambaPool: layout, exact bytes, slot alloc/free, copy/fork/clear, and a stateful content model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mamba_radix.errors import InvalidArgument, InvalidIndex
from mamba_radix.pools import MambaPool


def make_pool(size: int = 6) -> MambaPool:
    # two conv tensors of different dtypes (bf16 and fp16), fp32 temporal: the typical mix
    return MambaPool(size, 2, [(3, 8), (3, 4)], (2, 4, 4), [torch.bfloat16, torch.float16], torch.float32)


def fill(pool: MambaPool, slot: int, value: float) -> None:
    for t in pool.tensors:
        t[:, slot] = value


def slot_values(pool: MambaPool, slot: int) -> list[float]:
    """One value per tensor and layer; asserts the slot is uniform inside each (tensor, layer)."""
    out = []
    for t in pool.tensors:
        for layer in range(t.shape[0]):
            row = t[layer, slot].float()
            assert bool((row == row.flatten()[0]).all())
            out.append(float(row.flatten()[0]))
    return out


def snapshot(pool: MambaPool) -> tuple:
    return (pool.available_size(), pool.allocated_slots().tolist(), [t.clone() for t in pool.tensors])


def assert_same(a: tuple, b: tuple) -> None:
    assert a[:2] == b[:2]
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2], strict=True))


# ------------------------------------------------------------------------------------------ layout
def test_layout_dtypes_and_exact_bytes():
    pool = make_pool(6)
    assert [tuple(t.shape) for t in pool.conv] == [(2, 7, 3, 8), (2, 7, 3, 4)]
    assert tuple(pool.temporal.shape) == (2, 7, 2, 4, 4)
    assert [t.dtype for t in pool.conv] == [torch.bfloat16, torch.float16]
    assert pool.temporal.dtype == torch.float32
    assert pool.conv_bytes_per_slot == 2 * (3 * 8 * 2 + 3 * 4 * 2)
    assert pool.temporal_bytes_per_slot == 2 * (2 * 4 * 4 * 4)
    assert pool.bytes_per_slot == pool.conv_bytes_per_slot + pool.temporal_bytes_per_slot == 400
    assert pool.total_bytes == 7 * pool.bytes_per_slot  # size + the padding slot


def test_single_conv_dtype_applies_to_all_conv_tensors():
    pool = MambaPool(2, 1, [(3, 4), (3, 2)], (4,), torch.float16, torch.bfloat16)
    assert [t.dtype for t in pool.conv] == [torch.float16, torch.float16]
    assert pool.bytes_per_slot == (12 + 6) * 2 + 4 * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "size"),
        ({"num_layers": 0}, "num_layers"),
        ({"conv_shapes": []}, "conv_shapes"),
        ({"conv_shapes": [(3, 0)]}, "conv_shapes"),
        ({"temporal_shape": ()}, "temporal_shape"),
        ({"conv_dtypes": [torch.bfloat16]}, "one dtype per conv tensor"),
        ({"conv_dtypes": torch.int32}, "conv_dtypes"),
        ({"temporal_dtype": torch.int64}, "temporal_dtype"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, message):
    args = {
        "size": 4,
        "num_layers": 2,
        "conv_shapes": [(3, 8), (3, 4)],
        "temporal_shape": (2, 4, 4),
        "conv_dtypes": torch.bfloat16,
        "temporal_dtype": torch.float32,
    }
    args.update(kwargs)
    with pytest.raises(InvalidArgument, match=message):
        MambaPool(**args)


# -------------------------------------------------------------------------------------- alloc/free
def test_alloc_free_and_padding_slot():
    pool = make_pool(4)
    slots = pool.alloc(3)
    assert slots.tolist() == [1, 2, 3] and pool.used == 3 and pool.available_size() == 1
    assert pool.alloc(2) is None and pool.used == 3
    pool.free(slots[1:])
    assert pool.used == 1
    assert pool.is_allocated(torch.tensor([0, 1, 2, 5])).tolist() == [False, True, False, False]
    assert pool.allocated_slots().tolist() == [1]


@pytest.mark.parametrize(
    ("slots", "message"), [(0, "padding"), (5, "out of range"), (3, "not allocated"), ([1, 1], "twice")]
)
def test_bad_free_changes_nothing(slots, message):
    pool = make_pool(4)
    pool.alloc(2)
    before = snapshot(pool)
    with pytest.raises(InvalidIndex, match=message):
        pool.free(slots)
    assert_same(snapshot(pool), before)


def test_double_free_of_a_slot_raises():
    pool = make_pool(4)
    s = pool.alloc(1)
    pool.free(s)
    with pytest.raises(InvalidIndex, match="state slot 1"):
        pool.free(s)


# ---------------------------------------------------------------------------------- state movement
def test_copy_from_copies_every_layer_and_tensor():
    pool = make_pool(6)
    a, b, c, d = pool.alloc(4).tolist()
    fill(pool, a, 1.0)
    fill(pool, b, 2.0)
    fill(pool, c, 7.0)
    fill(pool, d, 7.0)
    pool.copy_from([a, b], [c, d])
    assert slot_values(pool, c) == [1.0] * 6 and slot_values(pool, d) == [2.0] * 6
    assert slot_values(pool, a) == [1.0] * 6  # the source is untouched


@pytest.mark.parametrize(
    ("src", "dst", "error", "message"),
    [
        ([1], [3], InvalidIndex, "state slot 3 is not allocated"),
        ([4], [1], InvalidIndex, "state slot 4 is not allocated"),
        ([0], [1], InvalidIndex, "padding"),
        ([1, 2], [2], InvalidArgument, "equal lengths"),
        ([1, 1], [2, 2], InvalidIndex, "twice"),
        ([1], [1], InvalidArgument, "both read"),  # source and destination overlap (refused by state_ops)
    ],
)
def test_bad_copy_writes_nothing(src, dst, error, message):
    pool = make_pool(6)
    a, b = pool.alloc(2).tolist()
    fill(pool, a, 1.0)
    fill(pool, b, 2.0)
    before = snapshot(pool)
    with pytest.raises(error, match=message):
        pool.copy_from(src, dst)
    assert_same(snapshot(pool), before)


def test_fork_allocates_copies_and_refuses_when_short():
    pool = make_pool(4)
    src = int(pool.alloc(1)[0])
    fill(pool, src, 3.0)
    forks = pool.fork(src, 2)
    assert forks.numel() == 2 and pool.used == 3
    assert all(slot_values(pool, s) == [3.0] * 6 for s in forks.tolist())
    before = snapshot(pool)
    assert pool.fork(src, 2) is None
    assert_same(snapshot(pool), before)
    with pytest.raises(InvalidIndex, match="state slot 4 is not allocated"):
        pool.fork(4, 1)
    assert pool.fork(src, 0).numel() == 0


def test_clear_slots_zeroes_only_those_slots():
    pool = make_pool(4)
    a, b = pool.alloc(2).tolist()
    fill(pool, a, 5.0)
    fill(pool, b, 6.0)
    pool.clear([a])
    assert slot_values(pool, a) == [0.0] * 6 and slot_values(pool, b) == [6.0] * 6
    with pytest.raises(InvalidIndex):
        pool.clear_slots([3])


def test_clear_without_slots_frees_everything():
    pool = make_pool(4)
    pool.alloc(3)
    pool.clear()
    assert pool.available_size() == 4 and pool.alloc(4).tolist() == [1, 2, 3, 4]


# ----------------------------------------------------------------------------------- stateful model
class MambaPoolMachine(RuleBasedStateMachine):
    """Slots against a model of {slot: value}: allocation is a set, contents follow copies and forks,
    refused calls change neither."""

    SIZE = 8
    BACKEND = "auto"  # the free list implementation; the subclass below runs the device one on CPU

    def __init__(self) -> None:
        super().__init__()
        self.pool = MambaPool(
            self.SIZE, 2, [(2, 4)], (2, 2), torch.bfloat16, torch.float32, backend=self.BACKEND
        )
        self.values: dict[int, float] = {}
        self.counter = 0.0

    @rule(n=st.integers(0, 4))
    def alloc_and_write(self, n):
        got = self.pool.alloc(n)
        if n > self.SIZE - len(self.values):
            assert got is None
            return
        assert got is not None and not set(got.tolist()) & set(self.values)
        for s in got.tolist():
            self.counter += 1
            fill(self.pool, s, self.counter)
            self.values[s] = self.counter

    @precondition(lambda self: self.values)
    @rule(data=st.data())
    def free(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.values)), min_size=1, unique=True))
        self.pool.free(chosen)
        for s in chosen:
            del self.values[s]

    @precondition(lambda self: len(self.values) >= 2)
    @rule(data=st.data())
    def copy(self, data):
        slots = sorted(self.values)
        dst = data.draw(st.lists(st.sampled_from(slots), min_size=1, max_size=3, unique=True))
        src = data.draw(
            st.lists(
                st.sampled_from([s for s in slots if s not in dst] or slots),
                min_size=len(dst),
                max_size=len(dst),
            )
        )
        if set(src) & set(dst):
            return
        self.pool.copy_from(src, dst)
        for s, d in zip(src, dst, strict=True):
            self.values[d] = self.values[s]

    @precondition(lambda self: self.values)
    @rule(data=st.data(), n=st.integers(0, 3))
    def fork(self, data, n):
        src = data.draw(st.sampled_from(sorted(self.values)))
        got = self.pool.fork(src, n)
        if n > self.SIZE - len(self.values):
            assert got is None
            return
        for s in got.tolist():
            assert s not in self.values
            self.values[s] = self.values[src]

    @rule(data=st.data())
    def misuse_is_refused(self, data):
        unallocated = [s for s in range(self.SIZE + 2) if s not in self.values]
        bad = data.draw(st.sampled_from(unallocated))
        before = snapshot(self.pool)
        with pytest.raises(InvalidIndex):
            self.pool.free([*sorted(self.values)[:1], bad])
        with pytest.raises(InvalidIndex):
            self.pool.copy_from([bad], [bad])
        assert_same(snapshot(self.pool), before)

    @invariant()
    def model_matches(self):
        assert self.pool.available_size() + self.pool.used == self.SIZE
        assert self.pool.allocated_slots().tolist() == sorted(self.values)
        for s, v in self.values.items():
            assert slot_values(self.pool, s) == [v] * 4


TestMambaPoolMachine = MambaPoolMachine.TestCase


class MambaPoolMachineTorchBackend(MambaPoolMachine):
    BACKEND = "torch"


TestMambaPoolMachineTorchBackend = MambaPoolMachineTorchBackend.TestCase
