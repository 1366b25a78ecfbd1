#!/usr/bin/env python3
"""PyTorch's side of the FP8 linear comparison: the Wan transformer block's linear layers at a
given token count, in bf16 (F.linear) and in row-wise FP8 (torch._scaled_mm with one fp32 scale per
token and per output channel, bf16 out, bias fused), the same arithmetic as tessel's
`--weights fp8`. Prints, per layer shape, the median time of each, with and without the per-token
quantisation of the input, and the FP8 output's rel-L2 against the bf16 one on random data scaled
as a trained layer's (weights ~ N(0, 1/k)); `--outliers` plants outlier channels (weight rows x1000)
and one outlier token (x1000), and reports the error on the ordinary channels, as tessel's
fp8_linear_gpu_test does.

  python bench/torch_fp8_linear.py --tokens 151200 --dim 5120 --ffn 13824 --iters 20

Needs a GPU with FP8 tensor cores (sm_89+) and PyTorch 2.4+ (row-wise _scaled_mm).
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0


def quantize_rows(x):
    """Per-row e4m3 with the row's absmax mapped to 448, as tessel's launch_quantize_rows_fp8."""
    absmax = x.abs().amax(dim=1, keepdim=True).float()
    scale = torch.where(absmax > 0, absmax / E4M3_MAX, torch.ones_like(absmax))
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def time_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel_l2(a, b, columns=None):
    a, b = a.double(), b.double()
    if columns is not None:
        a, b = a[:, columns], b[:, columns]
    return ((a - b).norm() / b.norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=151200, help="rows of the input (batch x tokens)")
    p.add_argument("--dim", type=int, default=5120)
    p.add_argument("--ffn", type=int, default=13824)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--outliers", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    # (k, n, gelu, count per block): q, k, v, o and the cross-attention's q and o; the FFN's two.
    shapes = [(a.dim, a.dim, False, 6), (a.dim, a.ffn, True, 1), (a.ffn, a.dim, False, 1)]
    rows = []
    for k, n, gelu, count in shapes:
        x = torch.randn(a.tokens, k, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(n, k, device=dev) / k**0.5).to(torch.bfloat16)
        bias = (0.1 * torch.randn(n, device=dev)).to(torch.bfloat16)
        ordinary = None
        if a.outliers:
            outlier_channels = torch.arange(3, n, 37, device=dev)
            w[outlier_channels] *= 1000
            x[a.tokens // 2] *= 1000
            keep = torch.ones(n, dtype=torch.bool, device=dev)
            keep[outlier_channels] = False
            ordinary = keep.nonzero().squeeze(1)
        wq, ws = quantize_rows(w)
        ws_row = ws.t().contiguous()  # (1, n)
        act = (lambda y: F.gelu(y, approximate="tanh")) if gelu else (lambda y: y)

        def bf16():
            return act(F.linear(x, w, bias))

        xq, xs = quantize_rows(x)

        def fp8_gemm():
            return act(torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_row, bias=bias, out_dtype=torch.bfloat16))

        def fp8_with_quantisation():
            q, s = quantize_rows(x)
            return act(torch._scaled_mm(q, wq.t(), scale_a=s, scale_b=ws_row, bias=bias, out_dtype=torch.bfloat16))

        reference = act(F.linear(x.double(), w.double(), bias.double()))
        row = {
            "k": k, "n": n, "gelu": gelu, "per_block": count, "tokens": a.tokens,
            "bf16_ms": time_ms(bf16, a.iters),
            "fp8_gemm_ms": time_ms(fp8_gemm, a.iters),
            "fp8_with_quantisation_ms": time_ms(fp8_with_quantisation, a.iters),
            "fp8_rel_l2": rel_l2(fp8_gemm(), reference, ordinary),
            "bf16_rel_l2": rel_l2(bf16(), reference, ordinary),
        }
        row["speedup_gemm"] = row["bf16_ms"] / row["fp8_gemm_ms"]
        row["speedup_with_quantisation"] = row["bf16_ms"] / row["fp8_with_quantisation_ms"]
        rows.append(row)
        del x, w, wq, xq, reference
        torch.cuda.empty_cache()
    block_bf16 = sum(r["bf16_ms"] * r["per_block"] for r in rows)
    block_fp8 = sum(r["fp8_with_quantisation_ms"] * r["per_block"] for r in rows)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "outliers": a.outliers, "rows": rows, "block_bf16_ms": block_bf16, "block_fp8_ms": block_fp8,
               "block_speedup": block_bf16 / block_fp8}
    if a.json:
        print(json.dumps(summary))
        return
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {summary['device']}, {a.tokens} tokens"
          f"{', planted outliers (error on ordinary channels)' if a.outliers else ''}")
    print("| k x n | bf16 ms | fp8 GEMM ms | fp8 + quantise ms | speed-up (GEMM / with quantise) | rel-L2 fp8 / bf16 vs fp64 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} x {r['n']}{' +GELU' if r['gelu'] else ''} | {r['bf16_ms']:.3f} | {r['fp8_gemm_ms']:.3f} | "
              f"{r['fp8_with_quantisation_ms']:.3f} | {r['speedup_gemm']:.2f} / {r['speedup_with_quantisation']:.2f} | "
              f"{r['fp8_rel_l2']:.2e} / {r['bf16_rel_l2']:.2e} |")
    print(f"a block's linears (x{[r['per_block'] for r in rows]}): bf16 {block_bf16:.1f} ms, fp8 with quantisation "
          f"{block_fp8:.1f} ms, {summary['block_speedup']:.2f}x")


if __name__ == "__main__":
    main()
