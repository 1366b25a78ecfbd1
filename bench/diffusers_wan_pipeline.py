#!/usr/bin/env python3
"""End-to-end Wan text-to-video: diffusers' WanPipeline against `tessel generate --device cuda`.

    python bench/diffusers_wan_pipeline.py --tessel BUILD/bin/tessel [--model DIR] [--preset wan-1.3b]
        [--size 832x480] [--frames 81] [--steps 10] [--guidance 5.0] [--seed 42]
        [--variants dense,topk,topk+teacache] [--topk-ratio 0.2] [--skip-diffusers] [--out DIR] [--json FILE]

Both run the same random-weight model directory (`tessel init-model --preset wan-1.3b`, written
first when --model does not exist), from the same text embeddings and the same starting latents:
  - the embeddings come from diffusers' own text encoder on the GPU (timed) when the directory's
    tokenizer loads in transformers, otherwise seeded random numbers at UMT5's output scale; tessel
    reads them with --embeddings (its text encoder is then not part of the comparison);
  - the starting latents are torch.randn(seed), handed to diffusers as `latents` and to tessel as
    --noise (a safetensors file with the tensor "noise").
diffusers runs in bf16 with SDPA attention, its VAE in fp32 (as Wan's examples load it); tessel runs
each variant: dense, dynamic_topk at --topk-ratio (every row, from step 0; random weights give no
self-similar blocks for SpargeAttn's rule to keep dense), and that plus TeaCache.
Reported per run: the time of each denoising step, the denoising total, the text encoder and VAE
decode (diffusers) or decode-and-setup (tessel), the end-to-end wall time of the process step, the
peak device memory, and for tessel the PSNR of its frames against diffusers' frames (uint8 RGB, as
output_type "pil" rounds them).
Peak memory: diffusers' is torch's allocator peak (torch.cuda.max_memory_allocated); tessel's is the
device memory in use at the step boundaries minus that before the model loaded (cudaMemGetInfo).
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

VARIANTS = ("dense", "topk", "topk+teacache")


def parse_size(text: str):
    width, height = (int(v) for v in text.lower().split("x"))
    return width, height


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0.0 else 10.0 * math.log10(255.0 * 255.0 / mse)


def tessel_env():
    """The environment for tessel: cuDNN (its CUDA VAE decoder opens libcudnn at run time) from
    PyTorch's nvidia-cudnn wheel when that is installed."""
    env = os.environ.copy()
    try:
        import nvidia.cudnn

        lib = os.path.join(list(nvidia.cudnn.__path__)[0], "lib")
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    except ImportError:
        pass
    return env


def run(cmd, log: Path) -> str:
    print("$ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=tessel_env())
        f.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} {cmd[1]} failed ({proc.returncode}), see {log}:\n{proc.stdout[-3000:]}")
    return proc.stdout


def load_pipeline(model: Path):
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae", torch_dtype=torch.float32)
    try:
        pipe = WanPipeline.from_pretrained(model, vae=vae, torch_dtype=torch.bfloat16)
        has_text = True
    except Exception as error:  # the tiny tokenizer may not convert to a fast tokenizer
        print(f"diffusers: the text encoder/tokenizer did not load ({error!r}); random embeddings", flush=True)
        pipe = WanPipeline.from_pretrained(model, vae=vae, text_encoder=None, tokenizer=None, torch_dtype=torch.bfloat16)
        has_text = False
    return pipe.to("cuda"), has_text


def embeddings(pipe, has_text: bool, prompt: str, negative: str, seed: int):
    """(prompt_embeds, negative_prompt_embeds, seconds or None), fp32 (1, 512, 4096) on the GPU."""
    if has_text:
        try:
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                p, n = pipe.encode_prompt(prompt, negative, do_classifier_free_guidance=True, max_sequence_length=512,
                                          device="cuda")
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            pipe.text_encoder.to("cpu")  # out of the way of the denoising loop's memory
            torch.cuda.empty_cache()
            return p.float(), n.float(), seconds
        except Exception as error:
            print(f"diffusers: encode_prompt failed ({error!r}); random embeddings", flush=True)
    g = torch.Generator("cpu").manual_seed(seed + 1)
    # UMT5's outputs after its final RMSNorm are of order 0.1; the exact scale does not matter here.
    p = (0.1 * torch.randn(1, 512, 4096, generator=g)).cuda()
    n = (0.1 * torch.randn(1, 512, 4096, generator=g)).cuda()
    return p, n, None


def run_diffusers(pipe, args, width, height, prompt_embeds, negative_embeds, noise, steps):
    step_marks = []

    def on_step(_pipe, _step, _t, kwargs):
        torch.cuda.synchronize()
        step_marks.append(time.perf_counter())
        return kwargs

    # VAE decode timed apart: the loop returns latents, then the pipeline's own decode path runs.
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        latents = pipe(prompt_embeds=prompt_embeds.to(torch.bfloat16), negative_prompt_embeds=negative_embeds.to(torch.bfloat16),
                       latents=noise.clone(), height=height, width=width, num_frames=args.frames,
                       num_inference_steps=steps, guidance_scale=args.guidance, output_type="latent",
                       callback_on_step_end=on_step).frames
    torch.cuda.synchronize()
    loop_end = time.perf_counter()
    with torch.no_grad():
        vae = pipe.vae
        z = latents.to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        video = vae.decode(z / inv_std + mean, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(video, output_type="np")[0]  # (F, H, W, 3) in [0, 1]
    torch.cuda.synchronize()
    end = time.perf_counter()
    steps = [b - a for a, b in zip([start] + step_marks[:-1], step_marks)]
    frames_u8 = (frames * 255).round().astype(np.uint8)
    return {
        "step_s": steps,
        "denoise_s": step_marks[-1] - start if step_marks else loop_end - start,
        "vae_decode_s": end - loop_end,
        "total_s": end - start,
        "peak_device_memory_bytes": torch.cuda.max_memory_allocated(),
    }, frames_u8


def read_tessel_frames(pattern_dir: Path, count: int) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(pattern_dir / f"frames_{i:05d}.png").convert("RGB")) for i in range(count)])


def tessel_variant_flags(variant: str, ratio: float):
    flags = []
    if variant.startswith("topk"):
        config = {"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": ratio},
                  "options": {"similarity_threshold": "-1"}}
        flags += ["--sparse-attn-config", json.dumps(config)]
    if variant.endswith("teacache"):
        flags += ["--cache", "teacache"]
    return flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tessel", required=True, help="the tessel binary (a CUDA build)")
    parser.add_argument("--model", default="wan-1.3b-random", help="model directory (written by init-model when missing)")
    parser.add_argument("--preset", default="wan-1.3b", choices=("wan-1.3b", "wan-14b"))
    parser.add_argument("--size", default="832x480", help="WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompt", default="a cat walking through a neon-lit city at night, cinematic")
    parser.add_argument("--negative-prompt", default="blurry, low quality")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--topk-ratio", type=float, default=0.2)
    parser.add_argument("--skip-diffusers", action="store_true", help="tessel only (no PSNR)")
    parser.add_argument("--out", default="wan-pipeline-bench", help="folder for inputs, frames and logs")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    width, height = parse_size(args.size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model)
    if not (model / "model_index.json").exists():
        start = time.perf_counter()
        print(run([args.tessel, "init-model", "--preset", args.preset, "--out", model], out / "init_model.log").strip())
        print(f"init-model: {time.perf_counter() - start:.1f} s", flush=True)

    from safetensors.torch import save_file

    latent_shape = (1, 16, (args.frames - 1) // 4 + 1, height // 8, width // 8)
    noise = torch.randn(latent_shape, generator=torch.Generator("cpu").manual_seed(args.seed), dtype=torch.float32)
    results = {"config": {k: getattr(args, k) for k in ("preset", "size", "frames", "steps", "guidance", "seed", "topk_ratio")}}

    pipe, has_text = load_pipeline(model)
    prompt_embeds, negative_embeds, text_seconds = embeddings(pipe, has_text, args.prompt, args.negative_prompt, args.seed)
    save_file({"noise": noise.contiguous()}, str(out / "noise.safetensors"))
    save_file({"prompt_embeds": prompt_embeds.cpu().contiguous(), "negative_prompt_embeds": negative_embeds.cpu().contiguous()},
              str(out / "embeddings.safetensors"))
    reference = None
    if not args.skip_diffusers:
        # A one-step warm-up (kernel selection, the allocator's pool, the VAE's first decode), then the timed run.
        run_diffusers(pipe, args, width, height, prompt_embeds, negative_embeds, noise.cuda(), 1)
        stats, reference = run_diffusers(pipe, args, width, height, prompt_embeds, negative_embeds, noise.cuda(), args.steps)
        stats["text_encoder_s"] = text_seconds
        results["diffusers"] = stats
        print(f"diffusers: {len(stats['step_s'])} steps in {stats['denoise_s']:.2f} s, VAE {stats['vae_decode_s']:.2f} s, "
              f"peak {stats['peak_device_memory_bytes'] / 2**30:.2f} GiB", flush=True)
    del pipe
    torch.cuda.empty_cache()

    for variant in variants:
        frames_dir = out / variant.replace("+", "_")
        frames_dir.mkdir(exist_ok=True)
        cmd = [args.tessel, "generate", "--model", model, "--device", "cuda", "--dtype", "bf16",
               "--embeddings", out / "embeddings.safetensors", "--noise", out / "noise.safetensors",
               "--size", args.size, "--frames", args.frames, "--steps", args.steps, "--guidance", args.guidance,
               "--out", frames_dir / "frames.png"] + tessel_variant_flags(variant, args.topk_ratio)
        start = time.perf_counter()
        try:
            text = run(cmd, frames_dir / "generate.log")
        except RuntimeError as error:
            print(f"tessel {variant}: FAILED: {error}", flush=True)
            results[f"tessel {variant}"] = {"error": str(error)[-2000:]}
            continue
        wall = time.perf_counter() - start
        line = next(l for l in text.splitlines() if l.startswith("generate-timings "))
        stats = json.loads(line[len("generate-timings "):])
        stats["process_wall_s"] = wall
        stats["cache"] = next((l for l in text.splitlines() if "blocks skipped" in l), "")
        if reference is not None:
            stats["psnr_vs_diffusers_db"] = psnr(read_tessel_frames(frames_dir, args.frames), reference)
        results[f"tessel {variant}"] = stats
        print(f"tessel {variant}: {stats['steps']} steps in {stats['denoise_s']:.2f} s, "
              f"PSNR {stats.get('psnr_vs_diffusers_db', float('nan')):.2f} dB {stats['cache']}", flush=True)

    print(f"\n== side by side: Wan {args.preset} random weights, {args.size}, {args.frames} frames, {args.steps} steps, "
          f"guidance {args.guidance}, bf16")
    print(f"{'run':<24}{'s/step':>9}{'denoise s':>11}{'text s':>9}{'decode s':>10}{'peak GiB':>10}{'PSNR dB':>9}{'speedup':>9}")
    base = results.get("diffusers", {}).get("denoise_s")
    for name, r in results.items():
        if name == "config":
            continue
        if "error" in r:
            print(f"{name:<24} FAILED")
            continue
        steps = r["step_s"]
        per_step = sum(steps) / len(steps) if steps else float("nan")
        decode = r.get("vae_decode_s", r.get("decode_and_setup_s", float("nan")))
        text = r.get("text_encoder_s")
        peak = r.get("peak_device_memory_bytes", float("nan")) / 2**30
        speedup = base / r["denoise_s"] if base else float("nan")
        print(f"{name:<24}{per_step:>9.3f}{r['denoise_s']:>11.2f}{(text if text is not None else float('nan')):>9.2f}"
              f"{decode:>10.2f}{peak:>10.2f}{r.get('psnr_vs_diffusers_db', float('nan')):>9.2f}{speedup:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
