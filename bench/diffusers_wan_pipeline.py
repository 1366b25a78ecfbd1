#!/usr/bin/env python3
"""End-to-end Wan text-to-video: diffusers' WanPipeline against `tessel generate --device cuda`.

    python bench/diffusers_wan_pipeline.py --tessel BUILD/bin/tessel [--model DIR] [--preset wan-1.3b]
        [--size 832x480] [--frames 81] [--steps 10] [--guidance 5.0] [--seed 42]
        [--variants dense,topk,topk+teacache,radial,threshold,dense+teacache,dense+dbcache,dense+text]
        [--topk-ratio 0.2] [--threshold 0.9] [--dbcache-warmup N] [--skip-diffusers] [--dry-run]
        [--out DIR] [--json FILE]

Both run the same random-weight model directory (`tessel init-model --preset wan-1.3b`, written
first when --model does not exist), from the same text embeddings and the same starting latents:
  - the embeddings come from diffusers' own text encoder on the GPU (timed) when the directory's
    tokenizer loads in transformers, otherwise seeded random numbers at UMT5's output scale; tessel
    reads them with --embeddings, except in the +text variants;
  - the starting latents are torch.randn(seed), handed to diffusers as `latents` and to tessel as
    --noise (a safetensors file with the tensor "noise").
diffusers runs in bf16 with SDPA attention, its VAE in fp32 (as Wan's examples load it); tessel runs
each variant, named ATTENTION[+CACHE][+text]:
  ATTENTION  dense; topk: dynamic_topk at --topk-ratio (every row, from step 0; random weights give
             no self-similar blocks for SpargeAttn's rule to keep dense); radial: the radial static
             pattern with its defaults (decay 1, frame-0 sink) on the latent grid tessel derives
             from the model and --size/--frames; threshold: XAttention's threshold pattern at
             --threshold (cumulative row mass; stride 8, blocks 128 x 64);
  CACHE      teacache (threshold 0.08) or dbcache (DBCache: Fn 8, Bn 0, threshold 0.08, warm-up
             --dbcache-warmup or tessel's 8 steps), tessel's defaults otherwise;
  +text      tessel encodes --prompt and --negative-prompt itself with its UMT5 on the GPU (no
             --embeddings): its frames then also measure its text encoder against diffusers'.
Reported per run: the time of each denoising step, the denoising total, the text encoder and VAE
decode (diffusers) or decode-and-setup (tessel), the end-to-end wall time of the process step, the
peak device memory, for tessel the PSNR of its frames against diffusers' frames (uint8 RGB, as
output_type "pil" rounds them) and for cache runs the steps and blocks skipped per CFG branch.
A second table sets the text encoders side by side: diffusers' UMT5 load (from_pretrained and .to
cuda) and encode_prompt (first call, and a second warm call), tessel's from the +text run. tessel's
generate-timings text_encoder_s spans WanTextEncoder::load (the shards read to the GPU) and the
encode; when the line also carries text_encode_s / text_encoder_load_s those are shown apart.
Peak memory: diffusers' is torch's allocator peak (torch.cuda.max_memory_allocated); tessel's is the
device memory in use at the step boundaries minus that before the model loaded (cudaMemGetInfo).
--dry-run prints the tessel commands the run would make and exits (no GPU, nothing written).
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

VARIANTS = ("dense", "topk", "topk+teacache", "radial", "threshold", "dense+teacache", "dense+dbcache", "dense+text")
ATTENTIONS = ("dense", "topk", "radial", "threshold")
CACHES = ("teacache", "dbcache")


def parse_variant(name: str):
    """ATTENTION[+CACHE][+text] -> (attention, cache or None, text); ValueError naming what is wrong."""
    parts = name.split("+")
    attention, rest = parts[0], parts[1:]
    if attention not in ATTENTIONS:
        raise ValueError(f"{name!r}: the attention {attention!r} is not one of {', '.join(ATTENTIONS)}")
    text = "text" in rest
    if text and rest[-1] != "text":
        raise ValueError(f"{name!r}: +text comes last")
    caches = [p for p in rest if p != "text"]
    unknown = [p for p in caches if p not in CACHES]
    if unknown or len(caches) > 1 or rest.count("text") > 1:
        raise ValueError(f"{name!r}: after the attention come at most one of +{', +'.join(CACHES)}, then optionally +text")
    return attention, (caches[0] if caches else None), text


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


def command_line(cmd) -> str:
    return " ".join(shlex.quote(str(c)) for c in cmd)


def run(cmd, log: Path) -> str:
    print("$ " + command_line(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=tessel_env())
        f.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} {cmd[1]} failed ({proc.returncode}), see {log}:\n{proc.stdout[-3000:]}")
    return proc.stdout


def load_pipeline(model: Path):
    """(pipeline on the GPU, whether its text encoder loaded, seconds the tokenizer and text encoder took to
    load and reach the GPU or None). The text encoder is loaded apart, first, so that its load is timed."""
    from diffusers import AutoencoderKLWan, WanPipeline
    from transformers import AutoTokenizer, UMT5EncoderModel

    vae = AutoencoderKLWan.from_pretrained(model, subfolder="vae", torch_dtype=torch.float32)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(model, subfolder="tokenizer")
        text_encoder = UMT5EncoderModel.from_pretrained(model, subfolder="text_encoder", torch_dtype=torch.bfloat16).to("cuda")
        torch.cuda.synchronize()
        load_seconds = time.perf_counter() - start
    except Exception as error:  # the tiny tokenizer may not convert to a fast tokenizer
        print(f"diffusers: the text encoder/tokenizer did not load ({error!r}); random embeddings", flush=True)
        tokenizer = text_encoder = load_seconds = None
    pipe = WanPipeline.from_pretrained(model, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, torch_dtype=torch.bfloat16)
    return pipe.to("cuda"), text_encoder is not None, load_seconds


def embeddings(pipe, has_text: bool, prompt: str, negative: str, seed: int):
    """(prompt_embeds, negative_prompt_embeds, {"encode_s", "encode_warm_s"} or None), fp32 (1, 512, 4096) on
    the GPU. encode_s is encode_prompt's first call (as a fresh process meets it), encode_warm_s a second one."""
    if has_text:
        try:
            seconds = []
            for _ in range(2):
                torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.no_grad():
                    p, n = pipe.encode_prompt(prompt, negative, do_classifier_free_guidance=True,
                                              max_sequence_length=512, device="cuda")
                torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            pipe.text_encoder.to("cpu")  # out of the way of the denoising loop's memory
            torch.cuda.empty_cache()
            return p.float(), n.float(), {"encode_s": seconds[0], "encode_warm_s": seconds[1]}
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


def tessel_command(args, variant: str, model: Path, out: Path, frames_dir: Path):
    """The `tessel generate` command line of one variant (parse_variant's names)."""
    attention, cache, text = parse_variant(variant)
    cmd = [args.tessel, "generate", "--model", model, "--device", "cuda", "--dtype", "bf16"]
    if text:  # tessel's own tokenizer and UMT5 on the GPU, on the prompts diffusers encoded
        cmd += ["--prompt", args.prompt, "--negative-prompt", args.negative_prompt]
    else:
        cmd += ["--embeddings", out / "embeddings.safetensors"]
    cmd += ["--noise", out / "noise.safetensors", "--size", args.size, "--frames", args.frames, "--steps", args.steps,
            "--guidance", args.guidance, "--out", frames_dir / "frames.png"]
    if attention == "topk":
        config = {"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": args.topk_ratio},
                  "options": {"similarity_threshold": "-1"}}
        cmd += ["--sparse-attn-config", json.dumps(config)]
    elif attention == "radial":  # the latent grid (spatial_layout) comes from the model and --size/--frames
        cmd += ["--sparse-attn-backend", "radial", "--sparse-attn-pattern", "radial"]
    elif attention == "threshold":
        cmd += ["--sparse-attn-backend", "threshold", "--sparse-attn-pattern", "threshold",
                "--sparse-attn-config", json.dumps({"selection": {"threshold": args.threshold}})]
    if cache:
        cmd += ["--cache", cache]
    if cache == "dbcache" and args.dbcache_warmup is not None:
        cmd += ["--dbcache-warmup", args.dbcache_warmup]
    return cmd


def fmt(value, width: int, digits: int = 2) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'n/a':>{width}}"


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
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated ATTENTION[+CACHE][+text]: ATTENTION one of {', '.join(ATTENTIONS)}, "
                             f"CACHE one of {', '.join(CACHES)} (default: {','.join(VARIANTS)})")
    parser.add_argument("--topk-ratio", type=float, default=0.2, help="topk: kv blocks kept per row, in (0, 1]")
    parser.add_argument("--threshold", type=float, default=0.9, help="threshold: XAttention's cumulative row mass, in (0, 1]")
    parser.add_argument("--dbcache-warmup", type=int, help="dbcache: first steps always computed (default: tessel's, 8)")
    parser.add_argument("--skip-diffusers", action="store_true", help="tessel only (no PSNR)")
    parser.add_argument("--dry-run", action="store_true", help="print the tessel commands and exit")
    parser.add_argument("--out", default="wan-pipeline-bench", help="folder for inputs, frames and logs")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    variants = list(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    if not variants:
        parser.error("--variants: no variant named")
    for v in variants:
        try:
            parse_variant(v)
        except ValueError as error:
            parser.error(f"--variants: {error} (known: {', '.join(VARIANTS)}; the form is ATTENTION[+CACHE][+text])")
    try:
        width, height = parse_size(args.size)
    except ValueError:
        parser.error(f"--size: WIDTHxHEIGHT, e.g. 832x480, not {args.size!r}")
    if args.frames < 1 or args.frames % 4 != 1:
        parser.error(f"--frames: 4k + 1 (e.g. 81), not {args.frames}")
    if args.steps < 1:
        parser.error(f"--steps: at least 1, not {args.steps}")
    for flag, value in (("--topk-ratio", args.topk_ratio), ("--threshold", args.threshold)):
        if not 0.0 < value <= 1.0:
            parser.error(f"{flag}: in (0, 1], not {value}")
    if args.dbcache_warmup is not None and args.dbcache_warmup < 0:
        parser.error(f"--dbcache-warmup: at least 0, not {args.dbcache_warmup}")
    out = Path(args.out)
    model = Path(args.model)
    if args.dry_run:
        if not (model / "model_index.json").exists():
            print("$ " + command_line([args.tessel, "init-model", "--preset", args.preset, "--out", model]))
        for variant in variants:
            print(f"# {variant}\n$ " + command_line(tessel_command(args, variant, model, out, out / variant.replace("+", "_"))))
        return
    out.mkdir(parents=True, exist_ok=True)
    if not (model / "model_index.json").exists():
        start = time.perf_counter()
        print(run([args.tessel, "init-model", "--preset", args.preset, "--out", model], out / "init_model.log").strip())
        print(f"init-model: {time.perf_counter() - start:.1f} s", flush=True)

    from safetensors.torch import save_file

    latent_shape = (1, 16, (args.frames - 1) // 4 + 1, height // 8, width // 8)
    noise = torch.randn(latent_shape, generator=torch.Generator("cpu").manual_seed(args.seed), dtype=torch.float32)
    results = {"config": {k: getattr(args, k) for k in ("preset", "size", "frames", "steps", "guidance", "seed", "topk_ratio",
                                                         "threshold", "dbcache_warmup")}}
    results["config"]["variants"] = variants

    pipe, has_text, text_load_seconds = load_pipeline(model)
    prompt_embeds, negative_embeds, text_seconds = embeddings(pipe, has_text, args.prompt, args.negative_prompt, args.seed)
    results["config"]["diffusers_text_encoder"] = text_seconds is not None
    # Kept apart from the runs: the table of text encoders below reads it.
    results["text_encoders"] = {"diffusers": {"load_s": text_load_seconds, **(text_seconds or {})}}
    save_file({"noise": noise.contiguous()}, str(out / "noise.safetensors"))
    save_file({"prompt_embeds": prompt_embeds.cpu().contiguous(), "negative_prompt_embeds": negative_embeds.cpu().contiguous()},
              str(out / "embeddings.safetensors"))
    reference = None
    if not args.skip_diffusers:
        # A one-step warm-up (kernel selection, the allocator's pool, the VAE's first decode), then the timed run.
        run_diffusers(pipe, args, width, height, prompt_embeds, negative_embeds, noise.cuda(), 1)
        stats, reference = run_diffusers(pipe, args, width, height, prompt_embeds, negative_embeds, noise.cuda(), args.steps)
        stats["text_encoder_s"] = text_seconds["encode_s"] if text_seconds else None
        results["diffusers"] = stats
        print(f"diffusers: {len(stats['step_s'])} steps in {stats['denoise_s']:.2f} s, VAE {stats['vae_decode_s']:.2f} s, "
              f"peak {stats['peak_device_memory_bytes'] / 2**30:.2f} GiB", flush=True)
    del pipe
    torch.cuda.empty_cache()

    for variant in variants:
        frames_dir = out / variant.replace("+", "_")
        frames_dir.mkdir(exist_ok=True)
        cmd = tessel_command(args, variant, model, out, frames_dir)
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
        if parse_variant(variant)[2]:
            results["text_encoders"][f"tessel {variant}"] = {"load_s": stats.get("text_encoder_load_s"),
                                                             "encode_s": stats.get("text_encode_s"),
                                                             "load_and_encode_s": stats["text_encoder_s"]}
        results[f"tessel {variant}"] = stats
        print(f"tessel {variant}: {stats['steps']} steps in {stats['denoise_s']:.2f} s, "
              f"PSNR {stats.get('psnr_vs_diffusers_db', float('nan')):.2f} dB {stats['cache']}", flush=True)

    print(f"\n== side by side: Wan {args.preset} random weights, {args.size}, {args.frames} frames, {args.steps} steps, "
          f"guidance {args.guidance}, bf16")
    print(f"{'run':<24}{'s/step':>9}{'denoise s':>11}{'text s':>9}{'decode s':>10}{'peak GiB':>10}{'PSNR dB':>9}{'speedup':>9}")
    base = results.get("diffusers", {}).get("denoise_s")
    runs = {name: r for name, r in results.items() if name not in ("config", "text_encoders")}
    for name, r in runs.items():
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
    print("text s: diffusers' encode_prompt (first call, weights already on the GPU); tessel's generate-timings\n"
          "  text_encoder_s: reading --embeddings, or in +text runs WanTextEncoder::load (tokenizer, UMT5 shards to the\n"
          "  GPU) and the encode together, weight loading included (+text runs add a table of the text encoders below).")
    if not results["config"]["diffusers_text_encoder"] and any(parse_variant(v)[2] for v in variants):
        print("+text runs: diffusers used random embeddings (its tokenizer or text encoder did not load), so their PSNR "
              "compares different conditionings.")
    for name, r in runs.items():
        if r.get("cache"):
            print(f"{name}: {r['cache']}")

    tessel_text = {name: t for name, t in results["text_encoders"].items() if name != "diffusers"}
    if tessel_text:
        d = results["text_encoders"]["diffusers"]
        d_total = d["load_s"] + d["encode_s"] if d.get("load_s") is not None and d.get("encode_s") is not None else None
        print(f"\n== text encoder: the model directory's tokenizer and UMT5, --prompt and --negative-prompt (2 x 512 "
              f"tokens), bf16 on the GPU")
        print(f"{'run':<24}{'load s':>9}{'encode s':>10}{'warm encode s':>15}{'load+encode s':>15}")
        print(f"{'diffusers':<24}{fmt(d.get('load_s'), 9)}{fmt(d.get('encode_s'), 10)}{fmt(d.get('encode_warm_s'), 15)}"
              f"{fmt(d_total, 15)}")
        for name, t in tessel_text.items():
            print(f"{name:<24}{fmt(t['load_s'], 9)}{fmt(t['encode_s'], 10)}{fmt(None, 15)}{fmt(t['load_and_encode_s'], 15)}")
        print("diffusers: load = AutoTokenizer and UMT5EncoderModel.from_pretrained, .to(cuda); encode = encode_prompt's\n"
              "  first call (as a fresh process meets it), warm = its second call. tessel: generate-timings of the +text run,\n"
              "  text_encoder_s from the start of WanTextEncoder::load to the embeddings on the host; load s and encode s\n"
              "  only where the line carries text_encoder_load_s and text_encode_s.")
        for name, t in tessel_text.items():
            if t["encode_s"] is not None and d.get("encode_s") is not None:
                verdict = "met" if t["encode_s"] <= d["encode_s"] else "NOT met"
                print(f"{name}: encode {t['encode_s']:.3f} s against diffusers' {d['encode_s']:.3f} s: "
                      f"no slower than diffusers' is {verdict}")
            else:
                print(f"{name}: generate-timings has no text_encode_s (text_encoder_s = load + encode), so the encode alone "
                      f"is not compared; load+encode {t['load_and_encode_s']:.2f} s against diffusers' "
                      f"{fmt(d_total, 0)} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
