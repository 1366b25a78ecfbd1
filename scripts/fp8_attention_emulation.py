#!/usr/bin/env python3
"""Emulates the numerics of the Hopper kernel's FP8 attention mode (docs/cuda-kernels.md, "FP8
attention") on the CPU and reports its error against an fp64 reference, per variant: e4m3 q and k
with one scale per 64 tokens (K first smoothed: its channel means subtracted), e4m3 v with one
scale per channel, scores in fp32, the online softmax over 128-key stages with P rounded to e4m3
(scaled to 448, or 448 / 2^threshold with lazy rescaling, whose rows keep a stale maximum until it
grows by more than the threshold), fp32 sums and accumulators. The bounds of
tests/kernels/attention_fp8_gpu_test.cc come from its output.

    python3 scripts/fp8_attention_emulation.py [--seq 2048] [--heads 4] [--k-bias 0,4] [--thresholds 0,8]
        [--v normal|uniform]

(`tessel bench` fills v from a standard normal, the GPU tests from a uniform on [-1, 1].)
"""
import argparse
import math

import torch

E4M3_MAX = 448.0
STAGE = 128
BLOCK = 64


def e4m3(x):
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def quantize_blocks(x):  # (H, S, D): one scale per 64 tokens per head
    h, s, d = x.shape
    pad = (-s) % BLOCK
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(h, -1, BLOCK, d)
    absmax = xp.abs().amax(dim=(2, 3), keepdim=True)
    scale = torch.where(absmax > 0, absmax / E4M3_MAX, torch.ones_like(absmax))
    return (e4m3(xp / scale) * scale).view(h, -1, d)[:, :s]


def fp8_attention(q, k, v, smooth_k, threshold):
    """q, k, v: (H, S, D) float32 (bf16 values). threshold None: rescale at every max change."""
    scale_log2 = math.log2(math.e) / math.sqrt(q.shape[-1])
    if smooth_k:
        k = k - k.mean(dim=1, keepdim=True)
    qd, kd = quantize_blocks(q), quantize_blocks(k)  # dequantized e4m3 values
    vmax = v.abs().amax(dim=1, keepdim=True)
    vscale = torch.where(vmax > 0, vmax / E4M3_MAX, torch.ones_like(vmax))
    v8 = e4m3(v / vscale)
    h, s, d = q.shape
    log2_p_factor = math.log2(E4M3_MAX) - (threshold or 0.0)
    m = torch.full((h, s, 1), -math.inf)
    l = torch.zeros((h, s, 1))
    o = torch.zeros((h, s, d))
    for n0 in range(0, k.shape[1], STAGE):
        sc = (qd @ kd[:, n0:n0 + STAGE].transpose(1, 2)) * scale_log2
        mx = torch.maximum(m, sc.amax(dim=2, keepdim=True))
        if threshold is not None:
            mx = torch.where(mx - m <= threshold, m, mx)
        alpha = torch.where(mx == m, torch.ones_like(m), torch.exp2(m - mx))
        p = torch.exp2(sc - (mx - log2_p_factor))
        assert p.max() <= E4M3_MAX * 1.0001, "P past e4m3's range"
        l = l * alpha + p.sum(dim=2, keepdim=True)
        o = o * alpha + e4m3(p) @ v8[:, n0:n0 + STAGE]
        m = mx
    return o / l * vscale


def reference(q, k, v):
    q, k, v = q.double(), k.double(), v.double()
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def errors(out, ref):
    diff = out.double() - ref
    return (diff.norm() / ref.norm()).item(), (diff.abs().max() / ref.abs().max()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--k-bias", default="0,4", help="std of K's per-channel offsets (DiT keys carry large ones)")
    ap.add_argument("--thresholds", default="0,8", help="lazy rescaling thresholds (log2); 0: none")
    ap.add_argument("--v", choices=("normal", "uniform"), default="normal")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(a.seed)
    d = 128
    for bias in [float(x) for x in a.k_bias.split(",")]:
        q = torch.randn(a.heads, a.seq, d, generator=g).bfloat16().float()
        offsets = bias * torch.randn(a.heads, 1, d, generator=g)
        k = (torch.randn(a.heads, a.seq, d, generator=g) + offsets).bfloat16().float()
        if a.v == "normal":
            v = torch.randn(a.heads, a.seq, d, generator=g)
        else:
            v = torch.rand(a.heads, a.seq, d, generator=g) * 2 - 1
        v = v.bfloat16().float()
        ref = reference(q, k, v)
        bf16_l2, bf16_max = errors(reference(q, k, v).bfloat16(), ref)
        print(f"S={a.seq} H={a.heads} v {a.v} K channel bias std {bias}: "
              f"bf16 output rounding rel-L2 {bf16_l2:.5f} max {bf16_max:.5f}")
        for smooth in (False, True):
            for t in [float(x) for x in a.thresholds.split(",")]:
                l2, mx = errors(fp8_attention(q, k, v, smooth, t if t > 0 else None), ref)
                print(f"  smooth_k={int(smooth)} lazy threshold={t:g}: rel-L2 {l2:.4f} max_rel_err {mx:.4f}")


if __name__ == "__main__":
    main()
