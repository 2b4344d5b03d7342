"""Value stamps survive a quantized checkpoint bit for bit (mamba_radix/testing/value_stamps.py).

A stamp written by :class:`~mamba_radix.testing.value_stamps.StateStamps` into a state slot is quantized
into a real :class:`~mamba_radix.pools.checkpoint_pool.CheckpointPool` and dequantized into another state
slot, for int8 and fp8 e4m3, fp32 and bf16 states, through the torch reference and the Triton kernels (on
a CPU machine under ``TRITON_INTERPRET=1``, conftest.py): the restored slot equals the stamped one bit for
bit and reads back the same stamp. Raw int64 stamps do not (the reason value stamps exist), a restore that
skips a tensor or a layer is reported, and shapes too small for a stamp are refused.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mamba_radix_kernels import slot_move

from mamba_radix.errors import InvalidArgument
from mamba_radix.pools import CheckpointPool, MambaPool
from mamba_radix.state_stamp import fingerprint, read_stamp, write_stamp
from mamba_radix.testing.value_stamps import NIBBLES, StateStamps, decode_rows, encode_rows

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ["torch"] + (["triton"] if slot_move.triton_usable(DEVICE) else [])
FORMATS = ("int8", "fp8_e4m3")
DTYPES = (torch.float32, torch.bfloat16)
# (conv shapes, temporal shape): one quantization row per layer's slot, several rows, and rows of the
# default rule's merged trailing dims (row_len_for), every one with >= 32 payload elements
LAYOUTS = (
    ([(2, 32)], (4, 16)),
    ([(4, 64)], (2, 3, 64)),
    ([(3, 40), (1, 33)], (2, 2, 2, 16)),
)
STAMPS = st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def build(fmt: str, dtype: torch.dtype, layout: int, backend: str) -> tuple[MambaPool, CheckpointPool]:
    conv, temporal = LAYOUTS[layout]
    pool = MambaPool(4, 2, conv, temporal, conv_dtypes=dtype, temporal_dtype=dtype, device=DEVICE)
    return pool, CheckpointPool(pool, fmt, 3, quant_backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=5)
@given(stamp=STAMPS, layout=st.integers(0, len(LAYOUTS) - 1))
def test_a_value_stamp_survives_quantize_and_dequantize_bit_for_bit(
    fmt: str, dtype: torch.dtype, backend: str, stamp: tuple[int, int], layout: int
) -> None:
    pool, ckpt_pool = build(fmt, dtype, layout, backend)
    stamps = StateStamps(fmt, pool)
    src, dst = pool.alloc(2, as_list=True)  # type: ignore[misc]
    stamps.write(src, *stamp)
    ckpt = ckpt_pool.store_from(pool, src)  # validated: the stamp's values are finite
    assert ckpt is not None
    ckpt_pool.load_into(pool, [ckpt], [dst])
    for t in pool.tensors:
        assert torch.equal(bits(t[:, dst]), bits(t[:, src])), f"{fmt} {dtype} {backend}: not bit-exact"
    assert stamps.read(dst) == stamps.read(src) == stamp
    assert stamps.read_checkpoint(ckpt_pool, ckpt) == stamp


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_empty_stamp_is_a_zeroed_slot_and_survives_too(fmt: str) -> None:
    pool, ckpt_pool = build(fmt, torch.float32, 0, "torch")
    stamps = StateStamps(fmt, pool)
    (slot,) = pool.alloc(1, as_list=True)  # type: ignore[misc]
    assert stamps.read(slot) == (0, 0)  # a fresh slot is zeroed: the state of no tokens
    ckpt = ckpt_pool.store_from(pool, slot)
    assert ckpt is not None and stamps.read_checkpoint(ckpt_pool, ckpt) == (0, 0)
    stamps.write(slot, fingerprint([5, 6, 7]), 3)
    assert stamps.read(slot) == (fingerprint([5, 6, 7]), 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_raw_int64_stamps_do_not_survive_quantization(fmt: str) -> None:
    """Why value stamps: the raw bytes of state_stamp come back as other bytes (or as NaN, refused)."""
    pool, ckpt_pool = build(fmt, torch.float32, 0, "torch")
    src, dst = pool.alloc(2, as_list=True)  # type: ignore[misc]
    want = (fingerprint([1, 2, 3, 4]), 4)
    write_stamp(pool, src, *want)
    ckpt = ckpt_pool.store_from(pool, src, check=False)
    assert ckpt is not None
    ckpt_pool.load_into(pool, [ckpt], [dst])
    assert read_stamp(pool, dst) != want


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_restore_that_skips_a_tensor_or_a_layer_is_reported(fmt: str) -> None:
    pool, _ = build(fmt, torch.bfloat16, 2, "torch")
    stamps = StateStamps(fmt, pool)
    a, b = pool.alloc(2, as_list=True)  # type: ignore[misc]
    stamps.write(a, fingerprint([1, 2]), 2)
    stamps.write(b, fingerprint([1, 2, 3]), 3)
    pool.temporal[:, b] = pool.temporal[:, a]  # the temporal state copied, the conv states not
    with pytest.raises(InvalidArgument, match="inconsistent or unreadable value stamps"):
        stamps.read(b)
    stamps.write(b, fingerprint([1, 2, 3]), 3)
    pool.conv[0][1, b] = pool.conv[0][1, a]  # one layer of one tensor
    with pytest.raises(InvalidArgument, match="inconsistent"):
        stamps.read(b)


def test_rows_hold_the_stamp_exactly_and_refuse_what_they_cannot_hold() -> None:
    rows = encode_rows(2**63 - 1, 12345, 128, 64, 127.0)
    assert rows.shape == (2, 64) and bool((rows[:, 0] == 127.0).all())
    assert decode_rows(rows, 127.0) == (2**63 - 1, 12345)
    assert decode_rows(rows, 448.0) is None  # another format's pin: not a stamp of this format
    bad = rows.clone()
    bad[0, 5] = 0.5  # not a nibble
    assert decode_rows(bad, 127.0) is None
    assert decode_rows(torch.zeros(2, 64), 127.0) == (0, 0)
    with pytest.raises(InvalidArgument, match="needs 32"):
        encode_rows(1, 1, 62, 2, 127.0)  # 31 rows of a pin and one payload element: one short
    with pytest.raises(InvalidArgument, match="does not divide"):
        encode_rows(1, 1, 64, 5, 127.0)
    with pytest.raises(InvalidArgument, match="use larger state shapes"):
        StateStamps("int8", MambaPool(2, 1, [(2, 4)], (2, 2, 2)))
    assert decode_rows(encode_rows(3, 4, 64, 2, 448.0), 448.0) == (3, 4)  # 32 rows of 2: just enough
    with pytest.raises(InvalidArgument, match="keeps checkpoints in state slots"):
        StateStamps("model", MambaPool(2, 1, [(2, 4)], (2, 2, 2))).read_checkpoint(None, 1)  # type: ignore[arg-type]
    assert NIBBLES == 32
