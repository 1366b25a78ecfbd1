"""Bad input raises a Python exception carrying tessel's message and never crashes the process."""
import numpy as np
import pytest

import tessel
from reference import random_qkv


@pytest.fixture
def qkv():
    return random_qkv(np.random.default_rng(0), 1, 16, 16, 2, 2, 8)


def test_rank_dtype_and_shape_errors(qkv):
    q, k, v = qkv
    with pytest.raises(tessel.TesselError, match="q: expected rank 4"):
        tessel.attention(q[0], k, v)
    with pytest.raises(tessel.TesselError, match="dtype"):
        tessel.attention(q.astype(np.float64), k, v)
    with pytest.raises(tessel.TesselError, match="k: expected dtype"):
        tessel.attention(q, k.astype(np.float16), v)
    with pytest.raises(tessel.TesselError, match="head_dim"):
        tessel.attention(q, k[..., :4], v)
    with pytest.raises(tessel.TesselError, match="heads"):
        tessel.attention(q, np.concatenate([k, k, k], axis=2), np.concatenate([v, v, v], axis=2))
    with pytest.raises(tessel.TesselError, match="dtype"):
        tessel.attention(q.astype(np.int32), k, v)


def test_stride_errors(qkv):
    q, k, v = qkv
    with pytest.raises(tessel.TesselError, match="head_dim stride 1"):
        tessel.attention(q[..., ::2], k[..., ::2], v[..., ::2])
    with pytest.raises(tessel.TesselError, match="non-negative strides"):
        tessel.attention(q[:, ::-1], k, v)


def test_scale_and_window_errors(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="softmax_scale"):
        tessel.attention(q, k, v, softmax_scale=0)
    with pytest.raises(tessel.TesselError, match="scale"):
        tessel.attention(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(tessel.TesselError, match="window_left"):
        tessel.attention(q, k, v, window=(-5, 0))


def test_mask_errors(qkv):
    q, k, v = qkv
    wrong_length = tessel.BlockMask.full(seq_q=32, seq_kv=16, block_q=8, block_kv=8)
    with pytest.raises(tessel.TesselError, match="mask"):
        tessel.block_sparse_attention(q, k, v, wrong_length)
    too_many_heads = tessel.BlockMask.full(mask_heads=3, seq_q=16, seq_kv=16, block_q=8, block_kv=8)
    with pytest.raises(tessel.TesselError, match="mask_heads"):
        tessel.block_sparse_attention(q, k, v, too_many_heads)
    with pytest.raises(TypeError, match="BlockMask"):
        tessel.block_sparse_attention(q, k, v, np.ones((1, 1, 2, 2), bool))


def test_merge_errors(qkv):
    q, k, v = qkv
    out, lse = tessel.attention(q, k, v, return_lse=True)
    with pytest.raises(tessel.TesselError, match="lse_b"):
        tessel.merge_states(out, lse, out, lse[:, :1])
    with pytest.raises(tessel.TesselError, match="out_b"):
        tessel.merge_states(out, lse, out[:, :8], lse)


def test_not_an_array():
    with pytest.raises(TypeError):
        tessel.attention("q", "k", "v")
