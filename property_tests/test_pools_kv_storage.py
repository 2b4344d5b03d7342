"""KV storage: MHA and MLA buffers, exact bytes, validated writes, and the hybrid layer mapping."""

from __future__ import annotations

import pytest
import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.pools import HybridLinearKVPool, MambaPool, MHATokenToKVPool, MLATokenToKVPool


def test_mha_layout_bytes_and_writes():
    pool = MHATokenToKVPool(size=8, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=4, layer_num=3)
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    assert tuple(pool.k_buffer[0].shape) == (9, 2, 4) and pool.k_buffer[0].dtype == torch.bfloat16
    assert pool.bytes_per_token == 3 * 2 * 2 * 4 * 2
    assert pool.get_kv_size_bytes() == 9 * pool.bytes_per_token
    k = torch.arange(16, dtype=torch.float32).reshape(2, 2, 4)
    pool.set_kv_buffer(1, torch.tensor([3, 5]), k, -k)
    got_k, got_v = pool.get_kv_buffer(1)
    assert torch.equal(got_k[torch.tensor([3, 5])], k.to(torch.bfloat16))
    assert torch.equal(got_v[5], -k[1].to(torch.bfloat16))
    assert int(pool.get_key_buffer(0).abs().sum()) == 0  # other layers untouched


def test_paged_storage_has_a_padding_page():
    pool = MHATokenToKVPool(size=8, page_size=4, dtype=torch.float16, head_num=1, head_dim=2, layer_num=1)
    assert pool.k_buffer[0].shape[0] == 12
    pool.set_kv_buffer(0, [11], torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    with pytest.raises(InvalidArgument, match="loc 12"):
        pool.set_kv_buffer(0, [12], torch.ones(1, 1, 2), torch.ones(1, 1, 2))


@pytest.mark.parametrize(
    ("layer", "loc", "k_shape", "dtype", "message"),
    [
        (3, [1], (1, 2, 4), torch.float32, "layer_id 3"),
        (0, [9], (1, 2, 4), torch.float32, "loc 9"),
        (0, [1, 2], (1, 2, 4), torch.float32, "shape"),
        (0, [1], (1, 2, 4), torch.int32, "floating"),
    ],
)
def test_mha_bad_writes_write_nothing(layer, loc, k_shape, dtype, message):
    pool = MHATokenToKVPool(8, 1, torch.float32, 2, 4, 3)
    k = torch.ones(k_shape).to(dtype)
    with pytest.raises(InvalidArgument, match=message):
        pool.set_kv_buffer(layer, loc, k, k)
    assert all(int(t.abs().sum()) == 0 for t in [*pool.k_buffer, *pool.v_buffer])


def test_mla_layout_and_writes():
    pool = MLATokenToKVPool(
        size=6, page_size=1, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    assert tuple(pool.kv_buffer[0].shape) == (7, 1, 12)
    assert pool.bytes_per_token == 2 * 12 * 2
    nope, rope = torch.full((2, 1, 8), 1.0), torch.full((2, 1, 4), 2.0)
    pool.set_mla_kv_buffer(1, torch.tensor([2, 4]), nope, rope)
    row = pool.get_key_buffer(1)[4, 0]
    assert row[:8].tolist() == [1.0] * 8 and row[8:].tolist() == [2.0] * 4
    assert tuple(pool.get_value_buffer(1).shape) == (7, 1, 8)
    pool.set_kv_buffer(0, [1], torch.full((1, 1, 12), 3.0))
    assert pool.get_key_buffer(0)[1].flatten().tolist() == [3.0] * 12
    with pytest.raises(InvalidArgument, match="cache_k_rope"):
        pool.set_mla_kv_buffer(0, [1], nope[:1], torch.ones(1, 1, 5))


def test_hybrid_linear_kv_pool_maps_layers():
    full = MHATokenToKVPool(8, 1, torch.float32, 1, 2, layer_num=2)
    mamba = MambaPool(4, 3, [(3, 4)], (2, 2))
    hybrid = HybridLinearKVPool(
        full, full_attention_layer_ids=[3, 7], mamba_pool=mamba, linear_layer_ids=[0, 1, 2]
    )
    assert hybrid.full_attention_layer_id_mapping == {3: 0, 7: 1}
    hybrid.set_kv_buffer(7, [2], torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    assert int(full.k_buffer[1][2].sum()) == 2 and int(full.k_buffer[0].sum()) == 0
    assert hybrid.get_key_buffer(3) is full.k_buffer[0]
    cache = hybrid.mamba2_layer_cache(2)
    cache.temporal[1] = 5.0
    assert float(mamba.temporal[2, 1, 0, 0]) == 5.0  # a view into the MambaPool's layer 2
    assert tuple(cache.conv[0].shape) == (5, 3, 4)
    with pytest.raises(InvalidArgument, match="linear layer"):
        hybrid.get_kv_buffer(1)
    with pytest.raises(InvalidArgument, match="not a linear layer"):
        hybrid.mamba2_layer_cache(3)
    with pytest.raises(InvalidArgument, match="neither"):
        hybrid.get_value_buffer(9)
    assert hybrid.bytes_per_token == full.bytes_per_token


@pytest.mark.parametrize(
    ("full_ids", "linear_ids", "message"),
    [
        ([0], [1, 2, 3], "full-attention layer ids"),
        ([0, 1], [2, 3], "linear layer ids"),
        ([0, 1], [1, 2, 3], "distinct"),
    ],
)
def test_hybrid_linear_kv_pool_checks_ids(full_ids, linear_ids, message):
    full = MHATokenToKVPool(8, 1, torch.float32, 1, 2, layer_num=2)
    mamba = MambaPool(4, 3, [(3, 4)], (2, 2))
    with pytest.raises(InvalidArgument, match=message):
        HybridLinearKVPool(full, full_ids, mamba, linear_ids)
