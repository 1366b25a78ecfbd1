"""fp64 numpy reference of tessel's attention semantics, and random inputs, for the tests."""
from __future__ import annotations

import numpy as np


def random_qkv(rng, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype=np.float32):
    q = rng.standard_normal((batch, seq_q, heads, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, seq_kv, kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, seq_kv, kv_heads, head_dim)).astype(dtype)
    return q, k, v


def token_limits(seq_q, seq_kv, causal=False, window=(-1, -1)):
    """(S_q, S_kv) bool: which keys each query may see (bottom-right aligned causal and window)."""
    left, right = window
    i = np.arange(seq_q)[:, None] + (seq_kv - seq_q)
    j = np.arange(seq_kv)[None, :]
    allowed = np.ones((seq_q, seq_kv), dtype=bool)
    if causal:
        allowed &= j <= i
    if right >= 0:
        allowed &= j <= i + right
    if left >= 0:
        allowed &= j >= i - left
    return allowed


def expand_block_mask(dense, seq_q, seq_kv, block_q, block_kv):
    """(B_m, H_m, Qb, KVb) block map -> (B_m, H_m, S_q, S_kv) token map."""
    tokens = np.repeat(np.repeat(dense, block_q, axis=2), block_kv, axis=3)
    return tokens[:, :, :seq_q, :seq_kv]


def reference_attention(q, k, v, *, causal=False, window=(-1, -1), scale=None, token_mask=None):
    """out (B, S_q, H_q, D) float64 and lse (B, H_q, S_q); rows with no key give 0 and -inf.
    token_mask: optional (B_m, H_m, S_q, S_kv) with B_m in {1, B}, H_m in {1, H_kv, H_q}."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, seq_q, heads, head_dim = q.shape
    seq_kv, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    k_full = np.repeat(k, group, axis=2)
    v_full = np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k_full) * scale
    allowed = np.broadcast_to(token_limits(seq_q, seq_kv, causal, window), scores.shape).copy()
    if token_mask is not None:
        mask_heads = token_mask.shape[1]
        head_of = np.arange(heads) if mask_heads == heads else (
            np.arange(heads) // group if mask_heads == kv_heads and mask_heads > 1 else np.zeros(heads, dtype=int))
        allowed &= np.broadcast_to(token_mask[:, head_of], scores.shape)
    scores = np.where(allowed, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(row_max)
    shifted = np.exp(scores - np.where(empty, 0.0, row_max))
    total = shifted.sum(axis=-1, keepdims=True)
    probs = np.where(empty, 0.0, shifted / np.where(total == 0, 1.0, total))
    out = np.einsum("bhqk,bkhd->bqhd", probs, v_full)
    with np.errstate(divide="ignore"):
        lse = np.where(empty[..., 0], -np.inf, row_max[..., 0] + np.log(np.where(total[..., 0] == 0, 1.0, total[..., 0])))
    return out, lse
