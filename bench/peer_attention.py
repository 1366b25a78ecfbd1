#!/usr/bin/env python3
"""Peer timings for `tessel bench --device cuda`: PyTorch SDPA (FlashAttention-2 and cuDNN
backends) and FlexAttention given the very block masks tessel used.

Masks come from `tessel bench --save-mask DIR`: for each mask NAME, DIR/NAME.json holds the shape
(seq_q, seq_kv, block_q, block_kv, mask_batch, mask_heads, q_blocks, kv_blocks, density) and
DIR/NAME.kv_num_blocks.i32 / DIR/NAME.kv_indices.i32 hold FlexAttention's tensors as raw
little-endian int32, (B_m, H_m, Qb) and (B_m, H_m, Qb, KVb). Flex's BlockMask is built from them
directly (BlockMask.from_kv_blocks, every kept block a whole block), not from an element mask.

Prints one line per measurement and a table last; --json writes all rows. With --tessel-json
(the output of `tessel bench --json`, one file per sequence length) the last table puts tessel's
times beside the peers' for each (S, density) and gives the two ratios the project's bars use:
tessel/flex and t(d) / (d * t_dense).
"""
import argparse
import glob
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warmup, reps):
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


def load_masks(mask_dir):
    masks = []
    for meta_path in sorted(glob.glob(os.path.join(mask_dir, "*.json"))):
        with open(meta_path) as f:
            meta = json.load(f)
        base = meta_path[: -len(".json")]
        meta["name"] = os.path.basename(base)
        meta["base"] = base
        masks.append(meta)
    return masks


def flex_block_mask(meta, device):
    from torch.nn.attention.flex_attention import BlockMask

    shape3 = (meta["mask_batch"], meta["mask_heads"], meta["q_blocks"])
    num = torch.from_file(meta["base"] + ".kv_num_blocks.i32", size=shape3[0] * shape3[1] * shape3[2],
                          dtype=torch.int32).reshape(shape3)
    idx = torch.from_file(meta["base"] + ".kv_indices.i32",
                          size=shape3[0] * shape3[1] * shape3[2] * meta["kv_blocks"], dtype=torch.int32)
    idx = idx.reshape(*shape3, meta["kv_blocks"])
    num, idx = num.to(device), idx.to(device)
    # Every kept block is whole: pass them as "full" blocks, so no mask_mod runs inside them.
    return BlockMask.from_kv_blocks(torch.zeros_like(num), idx, full_kv_num_blocks=num, full_kv_indices=idx,
                                    BLOCK_SIZE=(meta["block_q"], meta["block_kv"]),
                                    seq_lengths=(meta["seq_q"], meta["seq_kv"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[6630, 12870, 29700])
    parser.add_argument("--heads", type=int, default=40)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mask-dir", default=None, help="masks written by `tessel bench --save-mask DIR`")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tessel-json", nargs="*", default=[], help="`tessel bench --json` outputs to put beside")
    args = parser.parse_args()

    device = torch.device("cuda")
    dtype = torch.bfloat16
    rows = []
    masks = load_masks(args.mask_dir) if args.mask_dir else []
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)

    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    for seq in args.seq:
        gen = torch.Generator(device=device).manual_seed(seq)
        shape = (args.batch, args.heads, seq, args.dim)  # SDPA wants (B, H, S, D)
        q = torch.randn(shape, device=device, dtype=dtype, generator=gen)
        k = torch.randn(shape, device=device, dtype=dtype, generator=gen)
        v = torch.rand(shape, device=device, dtype=dtype, generator=gen)
        flops = 4.0 * args.batch * args.heads * seq * seq * args.dim
        for name, backend in (("sdpa_flash2", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), args.warmup, args.reps)
            except RuntimeError as error:  # a backend may be unavailable for this build/GPU
                print(f"{name} S={seq}: unavailable ({str(error).splitlines()[0]})", flush=True)
                continue
            row = {"peer": name, "seq": seq, "density": 1.0, "ms": ms, "tflops": flops / ms / 1e9}
            rows.append(row)
            print(f"{name} S={seq}: {ms:.3f} ms {row['tflops']:.1f} TFLOP/s", flush=True)
        if flex is None:
            continue
        for meta in masks:
            if meta["seq_q"] != seq or meta["seq_kv"] != seq or meta["mask_batch"] != args.batch:
                continue
            if meta["mask_heads"] not in (1, args.heads) or meta.get("causal", False):
                continue  # causal masks would need a token-level mask_mod: not a whole-block comparison
            block_mask = flex_block_mask(meta, device)
            ms = time_ms(lambda: flex(q, k, v, block_mask=block_mask), args.warmup, args.reps)
            row = {"peer": "flex", "seq": seq, "density": meta["density"], "block": f"{meta['block_q']}x{meta['block_kv']}",
                   "mask": meta["name"], "ms": ms, "tflops_dense_equiv": flops / ms / 1e9}
            rows.append(row)
            print(f"flex S={seq} d={meta['density']:.3f} {row['block']}: {ms:.3f} ms", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\npeer            S      density  ms")
    for r in rows:
        print(f"{r['peer']:<14} {r['seq']:>6}  {r['density']:>7.3f}  {r['ms']:.3f}")
    if args.tessel_json:
        print_side_by_side(args, rows)


def print_side_by_side(args, peer_rows):
    tessel = {}
    for path in args.tessel_json:
        with open(path) as f:
            report = json.load(f)
        seq = report["config"]["seq"]
        for r in report["results"]:
            tessel[(seq, round(r["density"], 2))] = r
    peers = {}
    for r in peer_rows:
        peers[(r["peer"], r["seq"], round(r["density"], 2))] = r["ms"]
    print("\n== side by side (B=%d, H=%d, D=%d, bf16; ms, median) ==" % (args.batch, args.heads, args.dim))
    print(f"{'S':>6} {'density':>7} {'tessel':>9} {'TFLOP/s':>8} {'flex':>9} {'sdpa_fa2':>9} {'cudnn':>9} "
          f"{'t/flex':>7} {'t/(d*t1)':>8}")
    for (seq, density), r in sorted(tessel.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        dense = tessel.get((seq, 1.0))
        flex = peers.get(("flex", seq, density))
        fa2 = peers.get(("sdpa_flash2", seq, 1.0)) if density == 1.0 else None
        cudnn = peers.get(("sdpa_cudnn", seq, 1.0)) if density == 1.0 else None
        scale = r["ms"] / (r["density"] * dense["ms"]) if dense else None
        cell = lambda x, fmt="{:9.3f}": fmt.format(x) if x is not None else f"{'-':>9}"
        print(f"{seq:>6} {r['density']:>7.3f} {r['ms']:>9.3f} {r['tflops_dense_equiv']:>8.1f} {cell(flex)} {cell(fa2)} "
              f"{cell(cudnn)} {cell(r['ms'] / flex if flex else None, '{:7.2f}'):>7} "
              f"{cell(scale, '{:8.3f}'):>8}")


if __name__ == "__main__":
    main()
