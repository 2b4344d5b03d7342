"""The compiled one-slot state copy (``mamba_radix._cstate.copy_row``, issue 12: a compiled core keeps the
pure-Python path as the reference and a test checks the two agree) against the reference,
``mamba_radix_kernels.naive.copy_slot_ints`` over the pool's numpy byte views.

- on random pools (layers, several conv tensors, mixed dtypes, random bytes) and random slot pairs, the
  compiled copy and the reference leave every tensor byte for byte equal, and ``MambaPool.copy_from``'s
  trusted one-slot path gives the same tensors with the compiled copy on and off;
- everything outside its contract (not a list, a slot that is not an exact int or is out of range in some
  view, a read-only, non-contiguous or non-byte view) is handed back (False) with nothing written, so the
  reference decides it.

Skipped when the extension was not built (no C compiler at install time): the reference is then the only
copy, and the pool tests elsewhere cover it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mamba_radix_kernels import naive

from mamba_radix.pools import MambaPool
from mamba_radix.pools import mamba_pool as mamba_pool_mod

cstate = pytest.importorskip("mamba_radix._cstate", reason="the compiled state copy was not built")
copy_row = cstate.copy_row

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _pool(
    num_slots: int,
    layers: int,
    conv: list[tuple[int, ...]],
    dtypes: list[torch.dtype],
    seed: int,
    compiled_copy: bool | None = None,
) -> MambaPool:
    pool = MambaPool(
        num_slots,
        layers,
        conv,
        (3, 2),
        conv_dtypes=dtypes[:-1],
        temporal_dtype=dtypes[-1],
        compiled_copy=compiled_copy,
    )
    gen = torch.Generator().manual_seed(seed)
    for t in pool.tensors:  # random bytes, NaN patterns included: the comparison is of bytes, not values
        raw = t.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return pool


def _bytes(pool: MambaPool) -> list[bytes]:
    return [t.view(torch.uint8).numpy().tobytes() for t in pool.tensors]


pool_st = st.fixed_dictionaries(
    {
        "num_slots": st.integers(2, 9),
        "layers": st.integers(1, 3),
        "conv": st.lists(st.tuples(st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=3),
        "seed": st.integers(0, 2**16),
    }
)


@settings(deadline=None, max_examples=60)
@given(spec=pool_st, dtypes=st.data(), slots=st.data())
def test_compiled_copy_matches_the_reference_byte_for_byte(
    spec: dict, dtypes: st.DataObject, slots: st.DataObject
) -> None:
    n = len(spec["conv"]) + 1
    chosen = dtypes.draw(st.lists(st.sampled_from(DTYPES), min_size=n, max_size=n))
    size = spec["num_slots"]
    src = slots.draw(st.integers(0, size))  # slot 0 is the padding slot: a row like any other here
    dst = slots.draw(st.integers(0, size))
    compiled = _pool(size, spec["layers"], spec["conv"], chosen, spec["seed"])
    reference = _pool(size, spec["layers"], spec["conv"], chosen, spec["seed"])
    assert copy_row(compiled._host_byte_views(), src, dst) is True
    naive.copy_slot_ints(reference.tensors, src, dst, reference._host_byte_views())
    assert _bytes(compiled) == _bytes(reference)
    # and through the pool's trusted one-slot path, compiled on and off
    on = _pool(size, spec["layers"], spec["conv"], chosen, spec["seed"], compiled_copy=True)
    off = _pool(size, spec["layers"], spec["conv"], chosen, spec["seed"], compiled_copy=False)
    if src and dst and src != dst:
        a_on, a_off = on.alloc(2, as_list=True), off.alloc(2, as_list=True)
        assert a_on == a_off
        on.copy_from([a_on[0]], [a_on[1]], check=False)
        off.copy_from([a_off[0]], [a_off[1]], check=False)
        assert _bytes(on) == _bytes(off)
        for t in on.tensors:  # the copy happened: the destination row is the source row in every layer
            assert t[:, a_on[1]].view(torch.uint8).equal(t[:, a_on[0]].view(torch.uint8))


def test_the_copy_is_chosen_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compiled_copy`` (or ``MAMBA_RADIX_C`` when it is None) picks the copy when the pool is built: a
    pool built with the switch off keeps the reference after the switch is turned back on, and the
    other way round; both copy the same bytes."""
    assert mamba_pool_mod.compiled_copy_row(True) is copy_row
    assert mamba_pool_mod.compiled_copy_row(False) is None
    monkeypatch.setenv("MAMBA_RADIX_C", "0")
    off = _pool(4, 2, [(2, 3)], [torch.bfloat16, torch.float32], seed=3)
    monkeypatch.setenv("MAMBA_RADIX_C", "1")
    on = _pool(4, 2, [(2, 3)], [torch.bfloat16, torch.float32], seed=3)
    assert off._copy_row is None and on._copy_row is copy_row
    calls: list[tuple[int, int]] = []

    def counting(buffers: list, src: int, dst: int) -> bool:
        calls.append((src, dst))
        return copy_row(buffers, src, dst)

    monkeypatch.setattr(mamba_pool_mod, "_c_copy_row", counting)  # read by pools built from now on
    counted = _pool(4, 2, [(2, 3)], [torch.bfloat16, torch.float32], seed=3)
    for pool in (off, on, counted):
        a = pool.alloc(2, as_list=True)
        assert a is not None
        pool.copy_slot(a[0], a[1])
    assert calls == [tuple(a)] and _bytes(off) == _bytes(on) == _bytes(counted)


def test_a_copy_moves_exactly_one_row_of_every_layer() -> None:
    pool = _pool(4, 2, [(2, 3), (1, 2)], [torch.float32, torch.bfloat16, torch.float32], seed=7)
    before = [t.clone() for t in pool.tensors]
    assert copy_row(pool._host_byte_views(), 3, 1) is True
    for t, old in zip(pool.tensors, before, strict=True):
        expected = old.clone()
        expected[:, 1] = old[:, 3]
        assert t.view(torch.uint8).equal(expected.view(torch.uint8))
    assert copy_row(pool._host_byte_views(), 2, 2) is True  # onto itself: nothing changes
    for t, old in zip(pool.tensors, before, strict=True):
        assert t[:, 2].view(torch.uint8).equal(old[:, 2].view(torch.uint8))


@pytest.mark.parametrize(
    "case",
    [
        "tuple",
        "src_out_of_range",
        "dst_out_of_range",
        "dst_out_of_range_in_the_last_view",
        "negative",
        "numpy_int",
        "bool",
        "read_only",
        "not_contiguous",
        "not_bytes",
        "one_dimensional",
    ],
)
def test_outside_the_contract_nothing_is_written(case: str) -> None:
    pool = _pool(4, 2, [(2, 3)], [torch.float32, torch.float32], seed=3)
    views = list(pool._host_byte_views())
    src, dst = 1, 2
    if case == "tuple":
        views = tuple(views)
    elif case == "src_out_of_range":
        src = 5  # 4 slots + the padding slot: rows 0..4
    elif case == "dst_out_of_range":
        dst = 5
    elif case == "dst_out_of_range_in_the_last_view":
        views[-1] = np.zeros((2, 2, 24), dtype=np.uint8)  # fewer rows: refused before the first is written
    elif case == "negative":
        src = -1
    elif case == "numpy_int":
        src = np.int64(1)
    elif case == "bool":
        dst = True
    elif case == "read_only":
        ro = views[-1].view()
        ro.flags.writeable = False
        views[-1] = ro
    elif case == "not_contiguous":
        views[-1] = views[-1][:, :, ::2]
    elif case == "not_bytes":
        views[-1] = np.zeros((2, 5, 4), dtype=np.float32)
    elif case == "one_dimensional":
        views[-1] = np.zeros(8, dtype=np.uint8)
    before = _bytes(pool)
    assert copy_row(views, src, dst) is False
    assert _bytes(pool) == before


def test_wrong_arity_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="exactly 3 arguments"):
        copy_row([], 1)  # type: ignore[call-arg]
