"""The engine's fast stamps (:mod:`mamba_radix.sim.stamps`) against the reference
:mod:`mamba_radix.state_stamp`: same fingerprints, same bytes, and a check that really checks."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from mamba_radix.pools import MambaPool
from mamba_radix.sim.stamps import StampIO
from mamba_radix.sim.traces import OUTPUT_TOKEN_BASE
from mamba_radix.state_stamp import (
    EMPTY_FINGERPRINT,
    PrefixFingerprints,
    fingerprint,
    read_stamp,
    write_stamp,
)


@pytest.mark.parametrize("length", [0, 1, 2, 7, 64, 1000, 5000])
def test_prefix_fingerprints_equal_the_reference_at_every_checked_length(length: int) -> None:
    rng = random.Random(length)
    # input-like ids and output-like ids above 2**40, as block traces produce them
    tokens = [rng.randrange(0, 1 << 20) for _ in range(length // 2)]
    tokens += [OUTPUT_TOKEN_BASE + rng.randrange(0, 1 << 30) for _ in range(length - len(tokens))]
    prefix = PrefixFingerprints(np.array(tokens, dtype=np.int64))
    lengths = {0, length, *(rng.randrange(0, length + 1) for _ in range(25))}
    for n in sorted(lengths):
        assert prefix.at(n) == fingerprint(tokens[:n]), n
    assert prefix.at(0) == EMPTY_FINGERPRINT
    with pytest.raises(IndexError):
        prefix.at(length + 1)


def test_prefix_fingerprints_tell_neighbouring_prefixes_and_token_zero_apart() -> None:
    prefix = PrefixFingerprints(np.array([0, 0, 5, 0], dtype=np.int64))
    values = [prefix.at(n) for n in range(5)]
    assert len(set(values)) == 5


def _pool(layers: int = 2) -> MambaPool:
    return MambaPool(
        6, layers, [(8,), (3, 8)], (4,), conv_dtypes=torch.bfloat16, temporal_dtype=torch.float32
    )


def test_stampio_writes_what_read_stamp_reads_and_checks_what_write_stamp_wrote() -> None:
    pool = _pool()
    io = StampIO(pool)
    io.write(3, 0x1234_5678_9ABC, 77)
    assert read_stamp(pool, 3) == (0x1234_5678_9ABC, 77)
    write_stamp(pool, 4, 99, 5)
    assert io.holds(4, 99, 5)
    assert not io.holds(4, 99, 6) and not io.holds(4, 98, 5) and not io.holds(3, 99, 5)


def test_stampio_catches_a_partial_copy() -> None:
    """A copy that forgot one layer of one tensor is not the stamp any more."""
    pool = _pool()
    io = StampIO(pool)
    io.write(2, 42, 10)
    pool.temporal[1, 2].zero_()
    assert not io.holds(2, 42, 10)


def test_stampio_follows_a_pool_that_replaced_its_tensors() -> None:
    pool = _pool()
    io = StampIO(pool)
    io.write(1, 7, 1)
    pool.temporal = torch.zeros_like(pool.temporal)  # e.g. a pool that reallocates on reset
    assert not io.holds(1, 7, 1)  # the new tensor does not hold it: the view was rebuilt
    io.write(1, 7, 1)
    assert read_stamp(pool, 1) == (7, 1)
