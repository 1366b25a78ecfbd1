"""BlockMask construction, validation and the interop layouts (dense, CSR, FlashInfer, Flex)."""
import numpy as np
import pytest

import tessel


def sample_mask(seed=0, mask_batch=2, mask_heads=3, seq_q=100, seq_kv=77, block_q=32, block_kv=16):
    rng = np.random.default_rng(seed)
    keep = rng.random((mask_batch, mask_heads, -(-seq_q // block_q), -(-seq_kv // block_kv))) < 0.5
    return keep, tessel.BlockMask.from_dense(keep, seq_q=seq_q, seq_kv=seq_kv, block_q=block_q, block_kv=block_kv)


def test_dense_round_trip_and_geometry():
    keep, mask = sample_mask()
    assert mask.geometry() == (2, 3, 100, 77, 32, 16)
    assert (mask.q_blocks, mask.kv_blocks) == (4, 5)
    np.testing.assert_array_equal(mask.to_dense(), keep)
    assert mask.nnz == keep.sum()
    assert mask.density() == pytest.approx(keep.mean())
    assert mask.indptr.dtype == np.int32 and mask.indptr.shape == (2 * 3 * 4 + 1,)


def test_csr_flashinfer_and_flex_round_trips():
    _, mask = sample_mask(1)
    geometry = dict(mask_batch=2, mask_heads=3, seq_q=100, seq_kv=77, block_q=32, block_kv=16)
    assert tessel.BlockMask.from_csr(mask.indptr, mask.indices, **geometry) == mask
    assert tessel.BlockMask.from_flashinfer(mask.to_flashinfer(), **geometry) == mask
    kv_num_blocks, kv_indices = mask.to_flex()
    assert kv_num_blocks.shape == (2, 3, 4) and kv_indices.shape == (2, 3, 4, 5)
    assert tessel.BlockMask.from_flex(kv_num_blocks, kv_indices, seq_q=100, seq_kv=77, block_q=32,
                                      block_kv=16) == mask


def test_random_keeps_the_diagonal():
    mask = tessel.BlockMask.random(density=0.3, seed=5, seq_q=256, seq_kv=256, block_q=64, block_kv=64)
    dense = mask.to_dense()[0, 0]
    assert np.all(np.diag(dense))


@pytest.mark.parametrize("indptr,indices,message", [
    ([0, 2, 3], [1, 0, 2], "not sorted"),
    ([0, 2, 3], [1, 1, 2], "duplicate"),
    ([0, 1, 2], [0, 9], "out of range"),
    ([0, 2], [0, 1], "entries"),
    ([0, 2, 1], [0, 1], "indptr"),
])
def test_invalid_csr_is_rejected_naming_the_row(indptr, indices, message):
    with pytest.raises(tessel.TesselError, match=message):
        tessel.BlockMask.from_csr(indptr, indices, mask_batch=1, mask_heads=1, seq_q=64, seq_kv=96, block_q=32,
                                  block_kv=32)


def test_bad_dense_map_shape():
    with pytest.raises(tessel.TesselError, match="kv_blocks"):
        tessel.BlockMask.from_dense(np.ones((1, 1, 2, 7), bool), seq_q=64, seq_kv=64, block_q=32, block_kv=32)
    with pytest.raises(tessel.TesselError, match="rank"):
        tessel.BlockMask.from_dense(np.ones((2, 7), bool), seq_q=64, seq_kv=64, block_q=32, block_kv=32)
    with pytest.raises(tessel.TesselError, match="block_q"):
        tessel.BlockMask.from_dense(np.ones((1, 1, 2, 2), bool), seq_q=64, seq_kv=64, block_q=0, block_kv=32)


def test_constructor_is_not_public():
    with pytest.raises(TypeError):
        tessel.BlockMask("not a mask")
