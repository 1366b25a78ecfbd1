"""Block-sparse attention and the merge of partial states through numpy against the fp64 reference:
partial last blocks, mask head/batch broadcast, empty rows."""
import numpy as np
import pytest

import tessel
from reference import expand_block_mask, random_qkv, reference_attention


def keep_map(rng, mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv, density):
    q_blocks, kv_blocks = -(-seq_q // block_q), -(-seq_kv // block_kv)
    return rng.random((mask_batch, mask_heads, q_blocks, kv_blocks)) < density


@pytest.mark.parametrize("mask_batch,mask_heads", [(1, 1), (2, 1), (1, 2), (2, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_matches_masked_reference(mask_batch, mask_heads, causal):
    batch, seq_q, seq_kv, heads, kv_heads, head_dim, block_q, block_kv = 2, 75, 93, 4, 2, 16, 16, 8
    rng = np.random.default_rng(mask_batch * 10 + mask_heads + causal)
    q, k, v = random_qkv(rng, batch, seq_q, seq_kv, heads, kv_heads, head_dim)
    keep = keep_map(rng, mask_batch, mask_heads, seq_q, seq_kv, block_q, block_kv, 0.4)
    mask = tessel.BlockMask.from_dense(keep, seq_q=seq_q, seq_kv=seq_kv, block_q=block_q, block_kv=block_kv)
    out, lse = tessel.block_sparse_attention(q, k, v, mask, causal=causal, return_lse=True)
    tokens = expand_block_mask(keep, seq_q, seq_kv, block_q, block_kv)
    ref_out, ref_lse = reference_attention(q, k, v, causal=causal, token_mask=tokens)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)


def test_full_mask_equals_dense():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 1, 130, 70, 2, 1, 32)
    mask = tessel.BlockMask.full(seq_q=130, seq_kv=70)
    np.testing.assert_allclose(tessel.block_sparse_attention(q, k, v, mask), tessel.attention(q, k, v),
                               atol=1e-6, rtol=1e-5)


def test_empty_mask_rows():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, 1, 32, 32, 1, 1, 8)
    keep = np.zeros((1, 1, 2, 4), dtype=bool)
    keep[0, 0, 1, 2] = True
    mask = tessel.BlockMask.from_dense(keep, seq_q=32, seq_kv=32, block_q=16, block_kv=8)
    out, lse = tessel.block_sparse_attention(q, k, v, mask, return_lse=True)
    assert np.all(out[:, :16] == 0) and np.all(np.isneginf(lse[:, :, :16]))
    assert np.all(np.isfinite(lse[:, :, 16:]))


def test_merge_of_two_key_halves_equals_full_attention():
    rng = np.random.default_rng(9)
    q, k, v = random_qkv(rng, 2, 41, 64, 4, 2, 16)
    out_a, lse_a = tessel.attention(q, k[:, :27], v[:, :27], return_lse=True)
    out_b, lse_b = tessel.attention(q, k[:, 27:], v[:, 27:], return_lse=True)
    out, lse = tessel.merge_states(out_a, lse_a, out_b, lse_b)
    ref_out, ref_lse = reference_attention(q, k, v)
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)
