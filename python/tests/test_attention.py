"""Dense attention through numpy (DLPack) against the fp64 reference: odd lengths, GQA, causal,
windows, explicit scale, LSE, strided inputs."""
import numpy as np
import pytest

import tessel
from reference import random_qkv, reference_attention

SHAPES = [
    # batch, seq_q, seq_kv, heads, kv_heads, head_dim
    (1, 1, 1, 1, 1, 8),
    (2, 37, 53, 4, 2, 16),
    (1, 129, 65, 6, 1, 32),
    (3, 70, 70, 2, 2, 64),
    (1, 200, 131, 8, 4, 24),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_dense_matches_reference(shape, causal):
    rng = np.random.default_rng(sum(shape) + causal)
    q, k, v = random_qkv(rng, *shape)
    out, lse = tessel.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = reference_attention(q, k, v, causal=causal)
    assert out.dtype == np.float32 and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (shape[0], shape[3], shape[1])
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [(5, 0), (3, 7), (-1, 4), (16, -1)])
def test_window_and_scale(window):
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, 2, 45, 61, 4, 2, 16)
    out, lse = tessel.attention(q, k, v, window=window, softmax_scale=0.3, return_lse=True)
    ref_out, ref_lse = reference_attention(q, k, v, window=window, scale=0.3)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)


def test_rows_without_keys_give_zero_and_minus_inf():
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 10, 4, 2, 2, 8)
    # causal with S_q > S_kv: the first S_q - S_kv queries see no key (bottom-right alignment).
    out, lse = tessel.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :6] == 0)
    assert np.all(np.isneginf(lse[:, :, :6]))
    ref_out, _ = reference_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)


def test_strided_inputs_are_read_in_place():
    rng = np.random.default_rng(11)
    packed = rng.standard_normal((2, 33, 3, 4, 16)).astype(np.float32)  # (B, S, qkv, H, D)
    q, k, v = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    assert not q.flags.c_contiguous
    out = tessel.attention(q, k, v)
    ref_out, _ = reference_attention(q, k, v)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)


def test_fp16_inputs():
    rng = np.random.default_rng(5)
    q, k, v = random_qkv(rng, 1, 40, 40, 2, 2, 32, dtype=np.float16)
    out = tessel.attention(q, k, v)
    assert out.dtype == np.float16
    ref_out, _ = reference_attention(q, k, v)
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=3e-3, rtol=1e-2)


def test_read_only_inputs():
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 9, 9, 1, 1, 8)
    for x in (q, k, v):
        x.flags.writeable = False
    ref_out, _ = reference_attention(q, k, v)
    np.testing.assert_allclose(tessel.attention(q, k, v), ref_out, atol=2e-5, rtol=1e-4)
