#!/usr/bin/env python3
"""Emulates the numerics of the Hopper kernel's FP8 attention mode (docs/cuda-kernels.md, "FP8
attention") on the CPU and reports its error against an fp64 reference, per variant: e4m3 q and k
with one scale per 64 tokens (K first smoothed: its channel means subtracted), e4m3 v with one
scale per channel, scores in fp32, the online softmax over 128-key stages with P rounded to e4m3
(scaled to 448, or 448 / 2^threshold with lazy rescaling, whose rows keep a stale maximum until it
grows by more than the threshold), fp32 sums and accumulators. The polynomial exp2's relative
error (7.5e-5) is far below P's e4m3 rounding and is not modelled. Errors are the relative L2
norm and the max error over the largest output (`tessel bench`'s max_rel_err).

    python3 scripts/fp8_attention_emulation.py [--seq 2048] [--seq-kv 0] [--heads 4] [--causal]
        [--window L,R] [--k-bias 0,4] [--thresholds 0,8] [--v normal|uniform]
    python3 scripts/fp8_attention_emulation.py --test-cases   # the GPU tests' shapes, many draws
    python3 scripts/fp8_attention_emulation.py --wan-grid 8,16,16 [--k-bias 0,4]
        # q and k as the Wan runtime makes them: RMSNorm across all heads of a token (weights
        # around 1), then Wan's 3-D RoPE on a frames x height x width grid, the channel offsets
        # added before the norm (what its fused FP8 path, which does not smooth K, quantizes)

`tessel bench` fills v from a standard normal, the GPU tests (tests/kernels/attention_fp8_gpu_test.cc,
whose bounds come from --test-cases) from a uniform on [-1, 1].
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


def visible(s, sk, causal, window, n0=0, n1=None):
    """(s, keys n0..n1) visibility, bottom-right aligned as tessel's causal and window limits."""
    i = torch.arange(s)[:, None] + (sk - s)
    j = torch.arange(n0, sk if n1 is None else n1)[None, :]
    vis = torch.ones(s, j.shape[1], dtype=torch.bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= (j >= i - window[0]) & (j <= i + window[1])
    return vis


def fp8_attention(q, k, v, smooth_k, threshold, causal=False, window=None):
    """q (H, S, D), k and v (H, S_kv, D): float32 holding bf16 values. threshold None: rescale
    at every max change."""
    scale_log2 = math.log2(math.e) / math.sqrt(q.shape[-1])
    if smooth_k:
        k = k - k.mean(dim=1, keepdim=True)
    qd, kd = quantize_blocks(q), quantize_blocks(k)  # dequantized e4m3 values
    vmax = v.abs().amax(dim=1, keepdim=True)
    vscale = torch.where(vmax > 0, vmax / E4M3_MAX, torch.ones_like(vmax))
    v8 = e4m3(v / vscale)
    h, s, d = q.shape
    sk = k.shape[1]
    log2_p_factor = math.log2(E4M3_MAX) - (threshold or 0.0)
    m = torch.full((h, s, 1), -math.inf)
    l = torch.zeros((h, s, 1))
    o = torch.zeros((h, s, d))
    for n0 in range(0, sk, STAGE):
        n1 = min(n0 + STAGE, sk)
        sc = (qd @ kd[:, n0:n1].transpose(1, 2)) * scale_log2
        sc = sc.masked_fill(~visible(s, sk, causal, window, n0, n1), -math.inf)
        mx = torch.maximum(m, sc.amax(dim=2, keepdim=True))
        if threshold is not None:
            mx = torch.where(mx - m <= threshold, m, mx)
        alpha = torch.where(mx == m, torch.ones_like(m), torch.exp2(m - mx))
        shift = torch.where(mx == -math.inf, torch.zeros_like(mx), mx)
        p = torch.exp2(sc - (shift - log2_p_factor))
        assert p.max() <= E4M3_MAX * 1.0001, "P past e4m3's range"
        l = l * alpha + p.sum(dim=2, keepdim=True)
        o = o * alpha + e4m3(p) @ v8[:, n0:n1]
        m = mx
    return torch.where(l > 0, o / l, torch.zeros_like(o)) * vscale


def reference(q, k, v, causal=False, window=None):
    q, k, v = q.double(), k.double(), v.double()
    sc = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    sc = sc.masked_fill(~visible(q.shape[1], k.shape[1], causal, window), -math.inf)
    return torch.nan_to_num(torch.softmax(sc, dim=-1)) @ v  # rows that see nothing: 0


def errors(out, ref):
    diff = out.double() - ref
    return (diff.norm() / ref.norm()).item(), (diff.abs().max() / ref.abs().max()).item()


def inputs(g, heads, seq, seq_kv, bias, v_dist):
    d = 128
    q = torch.randn(heads, seq, d, generator=g).bfloat16().float()
    offsets = bias * torch.randn(heads, 1, d, generator=g)
    k = (torch.randn(heads, seq_kv, d, generator=g) + offsets).bfloat16().float()
    v = torch.randn(heads, seq_kv, d, generator=g) if v_dist == "normal" else torch.rand(heads, seq_kv, d, generator=g) * 2 - 1
    return q, k, v.bfloat16().float()


def wan_norm_rope(x, grid, g):
    """x (H, S, 128) with S = frames * height * width: RMSNorm over each token's H * 128 values
    times weights drawn in [0.5, 1.5), then each pair (2i, 2i+1) rotated by Wan's 3-D RoPE angle
    (44 channels for frames, 42 each for height and width), rounded to bf16 as the kernel stores."""
    h, s, d = x.shape
    t = x.permute(1, 0, 2).reshape(s, h * d).double()
    w = 0.5 + torch.rand(h * d, generator=g, dtype=torch.float64)
    t = t * torch.rsqrt(t.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w
    t = t.view(s, h, d // 2, 2)
    frames, height, width = grid
    f = torch.arange(s) // (height * width)
    y = (torch.arange(s) // width) % height
    xpos = torch.arange(s) % width
    spatial = 2 * (d // 6)
    frame_dim = d - 2 * spatial
    angles = []
    for pos, axis_dim in ((f, frame_dim), (y, spatial), (xpos, spatial)):
        j = torch.arange(axis_dim // 2, dtype=torch.float64)
        angles.append(pos[:, None].double() / torch.pow(10000.0, 2 * j / axis_dim))
    angle = torch.cat(angles, dim=1)[:, None, :]  # (S, 1, 64)
    c, sn = torch.cos(angle), torch.sin(angle)
    a, b = t[..., 0], t[..., 1]
    out = torch.stack((a * c - b * sn, a * sn + b * c), dim=-1).view(s, h, d)
    return out.permute(1, 0, 2).float().bfloat16().float()


def wan_cases(grid, heads, biases, seed):
    """Smoothing's effect on q and k made by Wan's norm + RoPE from projections with channel
    offsets (fp8 without lazy rescaling, as the fused path runs it by default)."""
    g = torch.Generator().manual_seed(seed)
    seq = grid[0] * grid[1] * grid[2]
    for bias in biases:
        q, k, v = inputs(g, heads, seq, seq, bias, "normal")
        q = q + bias * torch.randn(heads, 1, 128, generator=g)
        q, k = wan_norm_rope(q, grid, g), wan_norm_rope(k, grid, g)
        ref = reference(q, k, v)
        kmean = k.mean(dim=1).norm(dim=1).mean() / k.norm(dim=2).mean()  # per head
        line = f"Wan norm + RoPE, grid {grid[0]}x{grid[1]}x{grid[2]}, H={heads}, channel offsets std {bias:g} before the norm " \
               f"(|mean k| / mean |k| after it: {kmean:.3f}):"
        for smooth in (False, True):
            l2, mx = errors(fp8_attention(q, k, v, smooth, None), ref)
            line += f" smooth_k={int(smooth)} rel-L2 {l2:.4f} max {mx:.4f};"
        print(line.rstrip(";"))


def test_cases(draws):
    """The ranges over the GPU tests' kinds of shapes (uniform v), per (key offsets, smoothing,
    lazy rescaling)."""
    shapes = [(63, 65, False, None), (130, 333, False, None), (257, 257, False, None), (300, 100, True, None),
              (777, 777, True, None), (1100, 1100, False, (300, 20)), (2049, 1531, False, None)]
    ranges = {}
    for draw in range(draws):
        g = torch.Generator().manual_seed(draw)
        for seq, seq_kv, causal, window in shapes:
            for bias in (0.0, 4.0):
                q, k, v = inputs(g, 2, seq, seq_kv, bias, "uniform")
                ref = reference(q, k, v, causal, window)
                for smooth in (False, True):
                    for t in (None, 8.0):
                        l2, mx = errors(fp8_attention(q, k, v, smooth, t, causal, window), ref)
                        r = ranges.setdefault((bias, smooth, t), [1e9, 0.0, 1e9, 0.0])
                        r[0], r[1], r[2], r[3] = min(r[0], l2), max(r[1], l2), min(r[2], mx), max(r[3], mx)
    for (bias, smooth, t), r in sorted(ranges.items(), key=str):
        print(f"K offset std {bias:g} smooth_k={int(smooth)} lazy threshold={t or 0:g}: "
              f"rel-L2 {r[0]:.4f}-{r[1]:.4f} max_rel_err {r[2]:.4f}-{r[3]:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seq-kv", type=int, default=0, help="0: --seq")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", default="", help="L,R: keys i-L..i+R")
    ap.add_argument("--k-bias", default="0,4", help="std of K's per-channel offsets (DiT keys carry large ones)")
    ap.add_argument("--thresholds", default="0,8", help="lazy rescaling thresholds (log2); 0: none")
    ap.add_argument("--v", choices=("normal", "uniform"), default="normal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--test-cases", action="store_true", help="the GPU tests' shapes over --draws draws")
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--wan-grid", default="", help="F,H,W: q and k through Wan's RMSNorm + 3-D RoPE on this grid")
    a = ap.parse_args()
    if a.test_cases:
        return test_cases(a.draws)
    if a.wan_grid:
        return wan_cases(tuple(int(x) for x in a.wan_grid.split(",")), a.heads, [float(x) for x in a.k_bias.split(",")], a.seed)
    window = tuple(int(x) for x in a.window.split(",")) if a.window else None
    seq_kv = a.seq_kv or a.seq
    g = torch.Generator().manual_seed(a.seed)
    for bias in [float(x) for x in a.k_bias.split(",")]:
        q, k, v = inputs(g, a.heads, a.seq, seq_kv, bias, a.v)
        ref = reference(q, k, v, a.causal, window)
        bf16_l2, bf16_max = errors(ref.bfloat16(), ref)
        print(f"S={a.seq} S_kv={seq_kv} H={a.heads} v {a.v} K channel offset std {bias}: "
              f"bf16 output rounding rel-L2 {bf16_l2:.5f} max {bf16_max:.5f}")
        for smooth in (False, True):
            for t in [float(x) for x in a.thresholds.split(",")]:
                l2, mx = errors(fp8_attention(q, k, v, smooth, t if t > 0 else None, a.causal, window), ref)
                print(f"  smooth_k={int(smooth)} lazy threshold={t:g}: rel-L2 {l2:.4f} max_rel_err {mx:.4f}")


if __name__ == "__main__":
    main()
