"""Static planners against their token rules rounded up to blocks, and the estimators' selection."""
import numpy as np
import pytest

import tessel
from tessel import planners


def blocks_from_tokens(keep_tokens, block_q, block_kv):
    """A block is kept when any of its token pairs is."""
    seq_q, seq_kv = keep_tokens.shape
    q_blocks, kv_blocks = -(-seq_q // block_q), -(-seq_kv // block_kv)
    padded = np.zeros((q_blocks * block_q, kv_blocks * block_kv), dtype=bool)
    padded[:seq_q, :seq_kv] = keep_tokens
    return padded.reshape(q_blocks, block_q, kv_blocks, block_kv).any(axis=(1, 3))


def grid_coordinates(frames, height, width):
    n = np.arange(frames * height * width)
    return n // (height * width), (n // width) % height, n % width


def test_sliding_window_3d_is_the_box_rule_rounded_to_blocks():
    grid = (3, 5, 6)
    f, y, x = grid_coordinates(*grid)
    keep = ((abs(f[:, None] - f[None]) <= 1) & (abs(y[:, None] - y[None]) <= 2) & (abs(x[:, None] - x[None]) <= 1))
    mask = tessel.plan_sliding_window_3d(grid, frame_radius=1, height_radius=2, width_radius=1, block_q=16, block_kv=8)
    assert mask.geometry() == (1, 1, 90, 90, 16, 8)
    np.testing.assert_array_equal(mask.to_dense()[0, 0], blocks_from_tokens(keep, 16, 8))


def test_local_is_the_centred_frame_window():
    frames, window = 7, 3
    f, _, _ = grid_coordinates(frames, 2, 4)
    start = np.clip(f - (window - 1) // 2, 0, frames - window)
    keep = (f[None] >= start[:, None]) & (f[None] <= start[:, None] + window - 1)
    mask = tessel.plan_local((frames, 2, 4), local_window_size=window, block_q=8, block_kv=8)
    np.testing.assert_array_equal(mask.to_dense()[0, 0], blocks_from_tokens(keep, 8, 8))


def test_radial_keeps_neighbour_frames_and_the_sink_and_is_sparse():
    grid = (16, 8, 8)
    mask = tessel.plan_radial(grid, block_q=64, block_kv=64)
    dense = mask.to_dense()[0, 0]  # one block = one frame here
    for frame in range(16):
        assert dense[frame, max(frame - 1, 0):frame + 2].all()
        assert dense[frame, 0]
    assert mask.density() < 0.8
    no_sink = tessel.plan_radial(grid, frame0_sink=False, block_q=64, block_kv=64)
    assert no_sink.nnz < mask.nnz


def test_arrow_makes_text_rows_and_columns_dense():
    grid, text = (4, 4, 4), 16
    mask = tessel.plan_arrow(grid, inner=planners.sliding_window_3d(0, 1, 1), text_tokens=text, block_q=16,
                             block_kv=16)
    dense = mask.to_dense()[0, 0]
    assert mask.seq_q == 64 + text
    assert dense[0].all() and dense[:, 0].all()  # text first: block 0 is the text
    assert not dense.all()


def test_planner_errors():
    with pytest.raises(tessel.TesselError):
        tessel.plan_radial((0, 4, 4))
    with pytest.raises(tessel.TesselError):
        tessel.plan_arrow((2, 2, 2), inner=planners.radial(), text_tokens=0)
    assert "radial" in repr(planners.radial())


def test_topk_keeps_the_highest_pooled_scores():
    rng = np.random.default_rng(0)
    batch, seq, heads, dim, block = 1, 96, 2, 16, 16
    q = rng.standard_normal((batch, seq, heads, dim)).astype(np.float32)
    k = rng.standard_normal((batch, seq, heads, dim)).astype(np.float32)
    mask = tessel.estimate_topk(q, k, topk_ratio=0.5, similarity_threshold=-1.0, block_q=block, block_kv=block)
    assert (mask.mask_batch, mask.mask_heads) == (batch, heads)
    pooled_q = q.reshape(batch, seq // block, block, heads, dim).mean(axis=2)
    pooled_k = k.reshape(batch, seq // block, block, heads, dim).mean(axis=2)
    scores = np.einsum("brhd,bchd->bhrc", pooled_q, pooled_k)
    expected = np.zeros_like(scores, dtype=bool)
    top = np.argsort(-scores, axis=-1, kind="stable")[..., :3]
    np.put_along_axis(expected, top, True, axis=-1)
    np.testing.assert_array_equal(mask.to_dense(), expected)


def test_threshold_grows_with_the_threshold_and_keeps_the_diagonal():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 128, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 128, 2, 16)).astype(np.float32)
    low, ms = tessel.estimate_threshold(q, k, threshold=0.3, block_q=16, block_kv=16, return_time=True)
    high = tessel.estimate_threshold(q, k, threshold=0.99, block_q=16, block_kv=16)
    assert ms >= 0 and low.nnz < high.nnz
    for mask in (low, high):
        dense = mask.to_dense()
        assert all(dense[0, h].diagonal().all() and dense[0, h][:, 0].all() for h in range(2))
    voted = tessel.estimate_threshold(q, k, threshold=0.5, block_q=16, block_kv=16, vote="heads")
    assert voted.mask_heads == 1
    with pytest.raises(tessel.TesselError, match="vote"):
        tessel.estimate_threshold(q, k, vote="everyone")
    with pytest.raises(tessel.TesselError, match="stride"):
        tessel.estimate_threshold(q, k, block_q=12, block_kv=16)
