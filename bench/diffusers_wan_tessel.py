#!/usr/bin/env python3
"""diffusers' WanTransformer3DModel with tessel attention against its own SDPA processor.

    python bench/diffusers_wan_tessel.py [--model wan-1.3b] [--frames 81 --height 480 --width 832]
        [--patterns dense,dynamic_topk] [--topk-ratio 0.2] [--steps 5] [--json FILE]

Random weights at the preset's config, one forward (batch 1, 512 text tokens) per measurement, CUDA.
Measures, on the same weights and inputs:
  - the fp32 output with SDPA (the reference), and the bf16 outputs of SDPA and of tessel's processor
    (`tessel.integrations.diffusers.enable`) for each pattern: rel-L2 against the fp32 output;
  - the median step time of each bf16 variant (CUDA events, untimed warm-up first).
FlashAttention's rule for the dense processor: its error is at most 2x SDPA bf16's.
"""
import argparse
import json
import statistics

import torch
from diffusers import WanTransformer3DModel

from tessel.integrations import diffusers as tessel_diffusers

PRESETS = {
    "wan-1.3b": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "wan-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40),
}


def rel_l2(x: torch.Tensor, reference: torch.Tensor) -> float:
    x, reference = x.double(), reference.double()
    return float((x - reference).norm() / reference.norm())


def median_step_ms(model, inputs, steps: int, warmup: int, call=None):
    """Median CUDA-event time of `steps` calls after `warmup`, and the last call's result.

    call(model, inputs) runs one forward (default: model(**inputs))."""
    call = call or (lambda m, x: m(**x))
    with torch.no_grad():
        for _ in range(warmup):
            out = call(model, inputs)
        times = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call(model, inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="wan-1.3b")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--patterns", default="dense,dynamic_topk,radial")
    parser.add_argument("--topk-ratio", type=float, default=0.2)
    # Random weights make incoherent tokens: SpargeAttn's self-similarity rule (default 0.1) would
    # judge every block dissimilar and attend densely. -1 applies top-k to every row.
    parser.add_argument("--similarity-threshold", type=float, default=-1.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = WanTransformer3DModel(**PRESETS[args.model]).eval().cuda()
    latent = (16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    inputs32 = dict(
        hidden_states=torch.randn((1, *latent), device="cuda", generator=generator),
        timestep=torch.tensor([500.0], device="cuda"),
        encoder_hidden_states=torch.randn((1, 512, 4096), device="cuda", generator=generator),
        return_dict=False,
    )
    tokens = latent[1] * (latent[2] // 2) * (latent[3] // 2)
    print(f"diffusers-wan: {args.model}, {args.frames}x{args.height}x{args.width} -> {tokens} tokens, batch 1", flush=True)

    with torch.no_grad():
        reference = model(**inputs32)[0].float()
    model = model.to(torch.bfloat16)
    inputs16 = {k: (v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v)
                for k, v in inputs32.items()}

    rows = []

    def measure(name: str) -> None:
        with torch.no_grad():
            out = model(**inputs16)[0].float()
        ms, _ = median_step_ms(model, inputs16, args.steps, args.warmup)
        rows.append({"variant": name, "rel_l2_vs_fp32": rel_l2(out, reference), "step_ms": ms})
        print(f"{name:<28} rel-L2 vs fp32 {rows[-1]['rel_l2_vs_fp32']:.5f}   step {ms:9.2f} ms", flush=True)

    measure("sdpa bf16")
    for pattern in args.patterns.split(","):
        config = {"pattern": pattern}
        if pattern == "dynamic_topk":
            config["topk_ratio"] = args.topk_ratio
            config["similarity_threshold"] = args.similarity_threshold
        tessel_diffusers.enable(model, config)
        tessel_diffusers.set_step(model, 0)
        measure(f"tessel {pattern}" + (f" {args.topk_ratio}" if pattern == "dynamic_topk" else ""))
        states, _ = getattr(model, "_tessel_sparse_attention")
        report = states[0].runner.last_report
        if report is not None:
            rows[-1]["report"] = str(report)
            print(f"    last layer's report: {report}", flush=True)
        tessel_diffusers.disable(model)

    sdpa = rows[0]
    print("\n== side by side (H100 bf16, one forward, median step)")
    print(f"{'variant':<28} {'rel-L2 vs fp32':>15} {'x SDPA error':>13} {'step ms':>10} {'speedup vs SDPA':>16}")
    for row in rows:
        print(f"{row['variant']:<28} {row['rel_l2_vs_fp32']:>15.5f} {row['rel_l2_vs_fp32'] / sdpa['rel_l2_vs_fp32']:>13.2f} "
              f"{row['step_ms']:>10.2f} {sdpa['step_ms'] / row['step_ms']:>16.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "tokens": tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
