#!/usr/bin/env python3
"""tessel from Python beside its peers, and the binding's cost per call.

1. Binding overhead (any device): per-call time of tessel.attention on small shapes (S <= 1,024)
   through numpy (DLPack, extension called directly), through torch (the torch.ops.tessel custom
   op), and through torch.ops.tessel.attention itself, minus the time of the same C++ call made in
   a loop inside the extension (tessel._tessel.time_attention_calls_us). CUDA calls are timed as
   issued on the host (the kernels run behind), so the difference is the binding's host cost.
2. Peers (--device cuda): on the RFC's shapes (40 heads, D 128, bf16; S = 6,630 / 12,870 / 29,700),
   tessel dense and block-sparse (random masks at the given densities) against PyTorch SDPA (flash
   and cuDNN backends) and FlexAttention given the very same blocks; median of CUDA-event timings.

Prints one line per measurement; --json FILE writes them all.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

import tessel
from tessel import _tessel


def host_us(fn, iterations, repeats=5):
    """Median over `repeats` of the mean host time per call of `iterations` calls, in µs."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(samples)


def overhead_rows(device, iterations):
    rows = []
    shapes = [(1, 1, 64), (16, 2, 64), (64, 8, 64)]
    if device == "cuda":
        shapes += [(256, 8, 64), (1024, 8, 64)]
    for seq, heads, dim in shapes:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        q, k, v = (torch.randn(1, seq, heads, dim, device=device, dtype=dtype) for _ in range(3))
        out = torch.empty_like(q)
        capsules = lambda: [torch.utils.dlpack.to_dlpack(t) for t in (q, k, v, out)]  # noqa: E731
        probe_us = _tessel.time_attention_calls_us(*capsules(), 3)
        iters = int(min(max(2e5 / probe_us, 20), iterations))  # about 0.2 s per sample
        cpp = statistics.median(_tessel.time_attention_calls_us(*capsules(), iters) for _ in range(5))
        paths = {"torch": lambda: tessel.attention(q, k, v),
                 "torch.ops": lambda: torch.ops.tessel.attention(q, k, v, 0.0, False, -1, -1, False)}
        if device == "cpu":
            qn, kn, vn = q.numpy(), k.numpy(), v.numpy()
            paths["numpy"] = lambda: tessel.attention(qn, kn, vn)
        for path, fn in paths.items():
            fn()
            python = host_us(fn, iters)
            rows.append(dict(kind="overhead", device=device, seq=seq, heads=heads, head_dim=dim, path=path,
                             python_us=round(python, 2), cpp_us=round(cpp, 2), overhead_us=round(python - cpp, 2)))
            print(f"overhead {device} S={seq:5d} H={heads} D={dim} {path:10s} python {python:9.2f} us  "
                  f"C++ {cpp:9.2f} us  overhead {python - cpp:7.2f} us", flush=True)
    return rows


def cuda_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def peer_rows(seqs, densities, heads=40, dim=128):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention)
    rows = []
    for seq in seqs:
        q, k, v = (torch.randn(1, seq, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4 * heads * seq * seq * dim

        def record(name, density, ms):
            rows.append(dict(kind="peer", seq=seq, name=name, density=density, ms=round(ms, 4),
                             dense_equivalent_tflops=round(flops / ms / 1e9, 1)))
            print(f"peer S={seq:6d} {name:22s} d={density:.2f} {ms:9.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s "
                  "(dense-equivalent)", flush=True)

        for backend, name in [(SDPBackend.FLASH_ATTENTION, "sdpa_flash"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn")]:
            with sdpa_kernel(backend):
                record(name, 1.0, cuda_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)))
        record("tessel_dense", 1.0, cuda_ms(lambda: tessel.attention(q, k, v)))
        for density in densities:
            mask = tessel.BlockMask.random(density=density, seq_q=seq, seq_kv=seq, block_q=128, block_kv=128)
            mask.csr_on("cuda")
            record("tessel_block_sparse", density, cuda_ms(lambda: tessel.block_sparse_attention(q, k, v, mask)))
            block_mask = mask.to_flex_attention("cuda")
            record("flex_attention", density, cuda_ms(lambda: flex(qt, kt, vt, block_mask=block_mask)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seqs", default="6630,12870,29700")
    parser.add_argument("--densities", default="0.2,0.5")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    rows = overhead_rows(args.device, args.iterations)
    if args.device == "cuda" and not args.no_peers:
        rows += peer_rows([int(s) for s in args.seqs.split(",")], [float(d) for d in args.densities.split(",")])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
