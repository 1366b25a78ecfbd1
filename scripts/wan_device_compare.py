#!/usr/bin/env python3
"""Device parity and timing of tessel's CUDA Wan transformer against diffusers, on one GPU.

    python scripts/wan_device_compare.py --tessel build/bin/tessel [--model wan-1.3b] [--batch 1]
        [--frames 81 --height 480 --width 832] [--layers N] [--patterns dense,dynamic_topk,radial,xattention]
        [--steps 2] [--warmup 1] [--work /tmp/wan-device-compare] [--json] [--device cuda]

Needs torch with CUDA, diffusers==0.42.1 (and its pure-Python dependencies) and a tessel CLI built
with CUDA. It
  1. builds diffusers' WanTransformer3DModel at the preset's config with diffusers' random
     initialization on the GPU, and rounds every weight to bf16 once, so that every run below
     uses exactly the same weights;
  2. saves them as a diffusers checkpoint directory (config.json and
     diffusion_pytorch_model.safetensors, bf16) and random inputs (io.safetensors) under --work;
  3. runs diffusers in fp32 (the reference) and in bf16 as from_pretrained(torch_dtype=bfloat16)
     runs it (rotary tables, time embedder, modulation tables and AdaLN norms kept in fp32);
  4. runs `tessel dit-bench --device cuda --from-dir ... --inputs ... --save-output ...` for each
     pattern (dense; dynamic_topk at 0.2 ranking every block; radial; XAttention's threshold at 0.9);
  5. prints each output's rel-L2 against diffusers fp32 (and the sparse ones against tessel dense),
     the median step times and the peak memory.
Pass: tessel dense's error at most 2x diffusers bf16's (FlashAttention's rule, the issue's
device-parity criterion). Exit status 1 when it fails. `--device cpu` runs the same steps on the
CPU (tessel fp32; for trying the script at tiny sizes, e.g. --layers 1 --frames 5 --height 64
--width 64 --text-tokens 16 --patterns dense).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from make_wan_fixture import as_loaded_in_bf16, rel_l2  # noqa: E402
from wan_diffusers_peer import PRESETS  # noqa: E402

SPARSE_CONFIGS = {
    "dense": None,
    # Random weights make blocks whose tokens are not alike: rank every block (docs/patterns.md).
    "dynamic_topk": {"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.2},
                     "options": {"similarity_threshold": "-2"}},
    "radial": {"backend": "radial", "pattern": {"type": "radial"}},
    "xattention": {"backend": "threshold", "pattern": {"type": "threshold"}, "selection": {"threshold": 0.9}},
}


def timed_forward(model, inputs: dict, dtype: torch.dtype, steps: int, warmup: int):
    """Median seconds per forward, peak memory in bytes (CUDA; 0 on the CPU), and the last output
    (fp32, on the host)."""
    cuda = inputs["hidden_states"].is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    with torch.no_grad():
        for step in range(warmup + steps):
            sync()
            start = time.perf_counter()
            out = model(hidden_states=inputs["hidden_states"].to(dtype), timestep=inputs["timestep"],
                        encoder_hidden_states=inputs["encoder_hidden_states"].to(dtype), return_dict=False)[0]
            sync()
            if step >= warmup:
                times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() if cuda else 0, out.float().cpu()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tessel", required=True, help="the tessel CLI, built with CUDA")
    parser.add_argument("--model", choices=sorted(PRESETS), default="wan-1.3b")
    parser.add_argument("--layers", type=int, default=0, help="transformer blocks (default: the model's)")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--timestep", type=float, default=700.0)
    parser.add_argument("--patterns", default=",".join(SPARSE_CONFIGS), help="comma-separated: " + ", ".join(SPARSE_CONFIGS))
    parser.add_argument("--steps", type=int, default=2, help="timed forwards per run (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed forwards first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="/tmp/wan-device-compare", help="folder for the checkpoint, inputs and outputs")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: try the script at tiny sizes")
    args = parser.parse_args()
    patterns = args.patterns.split(",")
    for pattern in patterns:
        if pattern not in SPARSE_CONFIGS:
            parser.error(f"--patterns: unknown {pattern!r}; known: {', '.join(SPARSE_CONFIGS)}")
    if (args.frames - 1) % 4 or args.height % 16 or args.width % 16:
        parser.error("--frames must be 4k + 1, --height and --width multiples of 16")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch")

    config = dict(PRESETS[args.model])
    if args.layers:
        config["num_layers"] = args.layers
    checkpoint = os.path.join(args.work, "checkpoint")
    os.makedirs(checkpoint, exist_ok=True)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = WanTransformer3DModel(**config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
    model.save_config(checkpoint)
    save_file({name: tensor.to(torch.bfloat16).cpu().contiguous() for name, tensor in model.state_dict().items()},
              os.path.join(checkpoint, "diffusion_pytorch_model.safetensors"))

    latent = (args.batch, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    generator = torch.Generator().manual_seed(args.seed + 1)
    inputs = {
        "hidden_states": torch.randn(latent, generator=generator),
        "timestep": torch.full((args.batch,), args.timestep),
        "encoder_hidden_states": torch.randn((args.batch, args.text_tokens, 4096), generator=generator),
    }
    io_path = os.path.join(args.work, "io.safetensors")
    save_file(inputs, io_path)
    device_inputs = {name: tensor.to(args.device) for name, tensor in inputs.items()}
    tokens = latent[2] * (latent[3] // 2) * (latent[4] // 2)
    print(f"{args.model}: {config['num_layers']} layers, batch {args.batch}, latent {latent[2:]} -> {tokens} tokens, "
          f"{args.text_tokens} text tokens; weights in {checkpoint}", flush=True)

    results = {}
    seconds, peak, reference = timed_forward(model, device_inputs, torch.float32, args.steps, args.warmup)
    results["diffusers_fp32"] = {"step_s": seconds, "peak_memory_bytes": peak}
    seconds, peak, diffusers_bf16 = timed_forward(as_loaded_in_bf16(model), device_inputs, torch.bfloat16, args.steps, args.warmup)
    results["diffusers_bf16"] = {"step_s": seconds, "peak_memory_bytes": peak, "rel_l2_vs_fp32": rel_l2(diffusers_bf16, reference)}
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()

    outputs = {}
    for pattern in patterns:
        out_path = os.path.join(args.work, f"tessel_{pattern}.safetensors")
        command = [args.tessel, "dit-bench", "--device", args.device, "--from-dir", checkpoint, "--inputs", io_path, "--save-output",
                   out_path, "--steps", str(args.steps), "--warmup", str(args.warmup), "--json"]
        if SPARSE_CONFIGS[pattern] is not None:
            command += ["--sparse-attn-config", json.dumps(SPARSE_CONFIGS[pattern])]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"tessel {pattern} failed ({run.returncode}): {' '.join(command)}\n{run.stderr}", file=sys.stderr)
            results[f"tessel_{pattern}"] = {"error": run.stderr.strip()[-2000:]}
            continue
        report = json.loads(run.stdout.strip().splitlines()[-1])
        outputs[pattern] = load_file(out_path)["output"]
        entry = {"step_s": report["step_s_median"], "breakdown_s": report["breakdown_s_per_step"],
                 "density": report["self_attention_density"], "peak_memory_bytes": report.get("peak_device_memory_bytes"),
                 "rel_l2_vs_fp32": rel_l2(outputs[pattern], reference)}
        if pattern != "dense" and "dense" in outputs:
            entry["rel_l2_vs_tessel_dense"] = rel_l2(outputs[pattern], outputs["dense"])
        results[f"tessel_{pattern}"] = entry

    print(f"{'run':<22}{'step s':>10}{'peak GiB':>10}{'rel-L2 vs fp32':>16}{'vs dense':>10}{'density':>9}")
    for name, entry in results.items():
        if "error" in entry:
            print(f"{name:<22} failed")
            continue
        peak = entry.get("peak_memory_bytes")
        print(f"{name:<22}{entry['step_s']:>10.4f}{(peak or 0) / 2**30:>10.2f}{entry.get('rel_l2_vs_fp32', 0.0):>16.3e}"
              f"{entry.get('rel_l2_vs_tessel_dense', float('nan')):>10.3e}{entry.get('density', 1.0):>9.3f}")
        if "breakdown_s" in entry:
            print("    " + ", ".join(f"{kind} {seconds:.4f}" for kind, seconds in entry["breakdown_s"].items()))
    passed = None
    if "dense" in outputs:
        ratio = results["tessel_dense"]["rel_l2_vs_fp32"] / results["diffusers_bf16"]["rel_l2_vs_fp32"]
        passed = ratio <= 2.0
        print(f"tessel dense error / diffusers bf16 error = {ratio:.2f} (pass: <= 2): {'PASS' if passed else 'FAIL'}")
    if args.json:
        print(json.dumps(results))
    return 0 if passed is not False else 1


if __name__ == "__main__":
    sys.exit(main())
