#!/usr/bin/env python3
"""Writes the sparse-estimator parity fixtures under tests/fixtures/sparse_parity/.

    python scripts/make_sparse_parity_fixtures.py [--out tests/fixtures/sparse_parity]

Needs torch (CPU is enough) and safetensors. For several shapes (odd lengths included) it makes
structured q/k (fp16, layout (B, S, H, D)) and the block masks of the two official estimators:

  SpargeAttn (thu-ml/SpargeAttn, spas_sage_attn/utils.py: get_block_map_meansim_fuse_quant, as the
  public spas_sage2_attn_meansim_cuda / spas_sage2_attn_meansim_topk_cuda call it, 128x64 blocks);
  XAttention (mit-han-lab/x-attention, xattn/src/Xattention.py: xattn_estimate with causal=False,
  select_mode "inverse", norm 1, and the chunk size Xattention_prefill derives from the length;
  xattn/src/utils.py: find_blocks_chunked; 128x128 blocks).

Both official estimators run only on CUDA (SpargeAttn's pooling/similarity and block fill are
Triton kernels; XAttention's estimate moves its tensors to "cuda"), so this script re-implements
their reference math in plain torch on the CPU, step by step from their source, including the
roundings to fp16 that the CUDA code performs (cuBLAS and reductions accumulate in fp32 and store
fp16; softmax of fp16 is computed in fp32). Where the official code is undefined or relies on an
artifact, the script does what it does on a GPU:

  * SpargeAttn loads the rows past the end of a partial block as zeros (K: explicitly, after the
    mean is subtracted; Q: by the masked load), and divides each row by its norm, so a zero row
    gives 0/0 = NaN, its block's similarity is NaN and the block counts as not self-similar
    (kept whole). A zero token inside a block does the same.
  * SpargeAttn sorts with the GPU's stable radix sort: ties keep the lower block first.
  * XAttention pads q and k with zero tokens to a multiple of the chunk size; without a causal
    mask the zero keys take part in every softmax (logit 0) and their mass lands in the padding
    blocks, which count in each row's total and compete in the selection before the mask is cut
    back to the real blocks. The selection's `torch.where(index_mask, index, 0)` keeps block 0 in
    every row.

File per shape: <name>.safetensors with q, k (fp16) and one uint8 mask (B, H, Qb, KVb) per
setting; the settings are written into the file's metadata as JSON.
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

SHAPES = [  # name, batch, seq, heads, head dim
    ("s640", 1, 640, 2, 64),
    ("s1000", 1, 1000, 2, 64),
    ("s1543", 1, 1543, 2, 64),
]

SPARGE_SETTINGS = {
    "sparge_topk": dict(topk=0.2, cdf=None, simthreshd1=0.1, smooth_k=True),
    "sparge_cdf": dict(topk=None, cdf=0.9, simthreshd1=0.1, smooth_k=True),
    "sparge_cdf_loose_sim": dict(topk=None, cdf=0.98, simthreshd1=-0.1, smooth_k=True),
    "sparge_topk_unsmoothed": dict(topk=0.3, cdf=None, simthreshd1=0.1, smooth_k=False),
}
XATTN_SETTINGS = {
    "xattn_t08_s8": dict(threshold=0.8, stride=8),
    "xattn_t09_s16": dict(threshold=0.9, stride=16),
}


def structured_qk(batch, seq, heads, dim, seed):
    """q/k whose attention is local and banded, with a large shared offset in k (what K smoothing
    removes), some heads sharper than others; fp16 like the activations the estimators see."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(seq, dtype=torch.float64)[:, None]
    freqs = torch.exp(-torch.arange(dim // 2, dtype=torch.float64) / (dim // 2) * math.log(500.0))[None, :]
    angle = pos * freqs
    rope = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)  # (seq, dim): similar near positions
    q = torch.empty(batch, seq, heads, dim, dtype=torch.float64)
    k = torch.empty_like(q)
    for h in range(heads):
        sharp = 1.4 + 0.8 * h
        offset = torch.randn(dim, generator=g, dtype=torch.float64) * 0.8
        q[:, :, h] = sharp * rope + 0.6 * torch.randn(batch, seq, dim, generator=g, dtype=torch.float64)
        k[:, :, h] = sharp * rope + offset + 0.6 * torch.randn(batch, seq, dim, generator=g, dtype=torch.float64)
    return q.half(), k.half()


def sparge_pool_sim(x, block, simthreshd1, x_mean):
    """triton_bmm_pool_sim_simmean(_fuse_quant): per block the mean row (stored in x's dtype) and
    whether the mean pairwise cosine exceeds simthreshd1. x (B, H, N, D) fp16."""
    b, h, n, d = x.shape
    nblock = (n + block - 1) // block
    if x_mean is not None:
        x = x - x_mean  # fp16 - fp16 in the kernel: rounded to fp16
    x = F.pad(x, (0, 0, 0, nblock * block - n))  # masked rows read as zeros
    xb = x.view(b, h, nblock, block, d)
    counts = torch.full((nblock,), block, dtype=torch.float32)
    counts[-1] = n - (nblock - 1) * block
    xf = xb.float()
    pool = (xf.sum(dim=3) / counts[None, None, :, None]).to(x.dtype)
    norm = torch.sqrt((xf * xf).sum(dim=-1, keepdim=True))
    unit = (xf / norm).half().float()  # 0/0 = NaN for a zero row
    grams = unit @ unit.transpose(-1, -2)
    sim = grams.sum(dim=(-1, -2)) / (counts * counts)[None, None, :]
    return pool, sim > simthreshd1  # NaN compares false


def sparge_block_map(q, k, topk, cdf, simthreshd1, smooth_k, blkq=128, blkk=64):
    """get_block_map_meansim_fuse_quant (is_causal False, no attention sink); q, k (B, H, N, D)."""
    km = k.float().mean(dim=-2, keepdim=True).to(k.dtype) if smooth_k else None
    pooled_q, sim_q = sparge_pool_sim(q, blkq, simthreshd1, None)
    pooled_k, sim_k = sparge_pool_sim(k, blkk, simthreshd1, km)
    nq, nk = pooled_q.shape[-2], pooled_k.shape[-2]
    sim_k = sim_k.unsqueeze(-2).expand(-1, -1, nq, -1)
    sim_q = sim_q.unsqueeze(-1).expand(-1, -1, -1, nk)
    score = (pooled_q.float() @ pooled_k.float().transpose(-1, -2)).half()
    score = (score.float() * q.shape[-1] ** -0.5).half()
    score[~sim_k] = -torch.inf
    score = torch.softmax(score.float(), dim=-1).half()
    sorted_score = torch.sort(score, dim=-1, descending=True, stable=True)
    cdf_values = torch.cumsum(sorted_score.values.float(), dim=-1).half()
    b, h, qn, kn = cdf_values.shape
    if cdf is not None:
        thresholds = torch.full((b, h, qn, 1), float(cdf), dtype=torch.float32)
        num = torch.searchsorted(cdf_values, thresholds, right=True).squeeze(-1)
    else:
        num = torch.full((b, h, qn), int(torch.tensor(topk, dtype=torch.float32) * kn), dtype=torch.int64)
    final = torch.zeros(b, h, qn, kn, dtype=torch.bool)
    final[~sim_k] = True
    final[~sim_q] = True
    num = torch.clamp(num, min=1)  # triton_fill_block_map_kernel selects one when the count is 0
    for bi in range(b):
        for hi in range(h):
            for r in range(qn):
                final[bi, hi, r, sorted_score.indices[bi, hi, r, : int(num[bi, hi, r])]] = True
    return final


def xattn_chunk_size(k_len):
    """Xattention_prefill's default chunk size."""
    p2 = 1 << (k_len - 1).bit_length()
    return int(max(min(max(2048, p2), 128 * 1024 * 2048 // p2), 2048))


def xattn_block_map(q, k, threshold, stride, block_size=128):
    """xattn_estimate(causal=False, select_mode="inverse", kdb=1, norm=1) then the cut to the real
    blocks of Xattention_prefill; q, k (B, H, N, D) fp16."""
    b, h, q_len, d = q.shape
    k_len = k.shape[2]
    chunk = xattn_chunk_size(k_len)
    k_pad = (k_len + chunk - 1) // chunk * chunk - k_len
    q_pad = (q_len + chunk - 1) // chunk * chunk - q_len
    pk = F.pad(k, (0, 0, 0, k_pad))
    pq = F.pad(q, (0, 0, 0, q_pad))
    rk = torch.cat([pk[:, :, i::stride, :] for i in range(stride)], dim=-1)
    rq = torch.cat([pq[:, :, (stride - 1 - i)::stride, :] for i in range(stride)], dim=-1)
    w = (rq.float() @ rk.float().transpose(-1, -2)).half()
    w = (w.float() / math.sqrt(d)).half()
    w = (w.float() / stride).half()
    w = torch.softmax(w.float(), dim=-1).half()
    q_groups_pad = q_pad // stride
    if q_groups_pad:
        w[:, :, -q_groups_pad:, :] = 0
    rb = block_size // stride
    sums = w.float().view(b, h, w.shape[2] // rb, rb, w.shape[3] // rb, rb).sum(dim=-1).half()
    sums = sums.float().sum(dim=-2).half().double()
    required = sums.sum(dim=-1, keepdim=True) * threshold
    values, index = torch.sort(sums, dim=-1, descending=True, stable=True)
    before = torch.cat([torch.zeros_like(values[..., :1]), values[..., :-1]], dim=-1).cumsum(dim=-1)
    index = torch.where(before < required, index, 0)
    mask = torch.zeros_like(sums, dtype=torch.bool)
    mask.scatter_(-1, index, True)
    qb = (q_len + block_size - 1) // block_size
    kb = (k_len + block_size - 1) // block_size
    return mask[:, :, :qb, :kb].contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "sparse_parity"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for index, (name, batch, seq, heads, dim) in enumerate(SHAPES):
        q, k = structured_qk(batch, seq, heads, dim, seed=100 + index)
        qh, kh = q.transpose(1, 2), k.transpose(1, 2)  # the official code's (B, H, N, D)
        tensors = {"q": q.contiguous(), "k": k.contiguous()}
        settings = {}
        for key, s in SPARGE_SETTINGS.items():
            tensors[key] = sparge_block_map(qh, kh, s["topk"], s["cdf"], s["simthreshd1"], s["smooth_k"]).to(torch.uint8)
            settings[key] = dict(s, method="spargeattn", block_q=128, block_kv=64)
        for key, s in XATTN_SETTINGS.items():
            tensors[key] = xattn_block_map(qh, kh, s["threshold"], s["stride"]).to(torch.uint8)
            settings[key] = dict(s, method="xattention", block_q=128, block_kv=128, chunk=xattn_chunk_size(seq))
        path = os.path.join(args.out, name + ".safetensors")
        save_file(tensors, path, metadata={"settings": json.dumps(settings, sort_keys=True)})
        densities = ", ".join(f"{key} {tensors[key].float().mean().item():.3f}" for key in settings)
        print(f"{path}: {densities}")


if __name__ == "__main__":
    main()
