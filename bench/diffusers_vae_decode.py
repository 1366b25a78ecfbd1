#!/usr/bin/env python3
"""The peer of `tessel vae-bench`: diffusers' AutoencoderKLWan.decode (Wan 2.1's VAE, random
weights) at the same video size, timed the same way (median of timed decodes after untimed ones),
and, with --tessel, `tessel vae-bench` on the same shape right after it for a side-by-side table.
With --encode both time the encoder instead: AutoencoderKLWan.encode of a random video and the
posterior's mode, as WanImageToVideoPipeline's retrieve_latents(..., sample_mode="argmax") takes it,
against `tessel vae-bench --encode`.

    python bench/diffusers_vae_decode.py --frames 81 --height 480 --width 832 \
        [--encode] [--iters 3] [--warmup 1] [--no-tf32] [--tessel build/bin/tessel] [--parity DIR] [--json out.json]

diffusers runs the VAE in fp32 (WanPipeline's default); PyTorch lets its cuDNN convolutions use
TF32 unless torch.backends.cudnn.allow_tf32 is off, which --no-tf32 does here and passes on to
tessel. The latents are de-normalized first as WanPipeline does (tessel's decode includes that).
Prints the median decode, the time per frame and the peak memory PyTorch allocated.

--parity DIR (with --tessel): also saves the random model (DIR/vae, diffusers' layout) and the
latents, has tessel decode them (`vae-bench --from-dir --latents --save-video`) and reports the
rel-L2 and PSNR of tessel's video against diffusers' (values in [-1, 1], peak-to-peak 2).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import time

import torch
from diffusers import AutoencoderKLWan


def time_diffusers(args: argparse.Namespace, keep: dict) -> dict:
    torch.backends.cudnn.allow_tf32 = not args.no_tf32
    torch.manual_seed(0)
    vae = AutoencoderKLWan().to(args.device).eval()  # fp32; Wan 2.1's config is the default
    latent_shape = (1, vae.config.z_dim, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    latents = torch.randn(latent_shape, device=args.device, dtype=torch.float32)
    mean = torch.tensor(vae.config.latents_mean, device=args.device).view(1, -1, 1, 1, 1)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std, device=args.device).view(1, -1, 1, 1, 1)
    if args.encode:
        video = 0.5 * torch.randn((1, 3, args.frames, args.height, args.width), device=args.device, dtype=torch.float32)
    seconds = []
    on_cuda = torch.device(args.device).type == "cuda"
    synchronize = torch.cuda.synchronize if on_cuda else (lambda: None)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        for i in range(args.warmup + args.iters):
            synchronize()
            start = time.perf_counter()
            if args.encode:
                latents = vae.encode(video).latent_dist.mode()
            else:
                video = vae.decode(latents / inverse_std + mean, return_dict=False)[0]
            synchronize()
            if i >= args.warmup:
                seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    keep.update(vae=vae, latents=latents, video=video)
    return {
        "peer": "diffusers AutoencoderKLWan." + ("encode" if args.encode else "decode"),
        "latents": list(latents.shape),
        "video": list(video.shape),
        "tf32_convolutions": torch.backends.cudnn.allow_tf32,
        "median_s": median,
        "min_s": min(seconds),
        "per_frame_ms": median * 1000.0 / video.shape[2],
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_cuda else float("nan"),
    }


def time_tessel(args: argparse.Namespace) -> dict:
    command = [args.tessel, "vae-bench", "--device", args.device, "--frames", str(args.frames), "--height", str(args.height),
               "--width", str(args.width), "--iters", str(args.iters), "--warmup", str(args.warmup), "--json"]
    if args.no_tf32:
        command.append("--no-tf32")
    if args.encode:
        command.append("--encode")
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def parity(args: argparse.Namespace, kept: dict) -> dict:
    from safetensors.torch import load_file, save_file

    os.makedirs(args.parity, exist_ok=True)
    model_dir, latents_file = os.path.join(args.parity, "vae"), os.path.join(args.parity, "latents.safetensors")
    video_file = os.path.join(args.parity, "tessel_video.safetensors")
    kept["vae"].save_pretrained(model_dir)
    save_file({"latents": kept["latents"].detach().cpu().contiguous()}, latents_file)
    expected = kept["video"].detach().float().cpu()
    del kept["vae"], kept["video"]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    command = [args.tessel, "vae-bench", "--device", args.device, "--from-dir", model_dir, "--latents", latents_file, "--save-video",
               video_file, "--iters", "1", "--warmup", "0", "--json"]
    if args.no_tf32:
        command.append("--no-tf32")
    subprocess.run(command, check=True, capture_output=True, text=True)
    actual = load_file(video_file)["video"]
    if actual.shape != expected.shape:
        raise SystemExit(f"parity: tessel's video is {tuple(actual.shape)}, diffusers' {tuple(expected.shape)}")
    mse = torch.mean((actual.double() - expected.double()) ** 2).item()
    rel_l2 = math.sqrt(torch.sum((actual.double() - expected.double()) ** 2).item() / torch.sum(expected.double() ** 2).item())
    psnr = float("inf") if mse == 0 else 10.0 * math.log10(4.0 / mse)
    return {"rel_l2": rel_l2, "psnr_db": psnr, "frames": expected.shape[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--iters", type=int, default=3, help="timed decodes")
    parser.add_argument("--warmup", type=int, default=1, help="untimed decodes first")
    parser.add_argument("--no-tf32", action="store_true", help="fp32 products in the convolutions too")
    parser.add_argument("--encode", action="store_true", help="time the encoder of a random video instead")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tessel", help="a tessel binary: also run `tessel vae-bench` on the same shape")
    parser.add_argument("--parity", help="a folder: also compare tessel's video with diffusers' on the same weights")
    parser.add_argument("--json", help="write both results to this file")
    args = parser.parse_args()
    if (args.frames - 1) % 4 or args.height % 8 or args.width % 8:
        parser.error("--frames must be 4k + 1 and --height, --width multiples of 8")

    if args.parity and not args.tessel:
        parser.error("--parity needs --tessel")
    if args.parity and args.encode:
        parser.error("--parity compares decodes: not with --encode")
    kept = {}
    peer = time_diffusers(args, kept)
    print(f"diffusers: median {peer['median_s']:.3f} s ({peer['per_frame_ms']:.1f} ms per frame), "
          f"peak memory {peer['peak_memory_bytes'] / 2**30:.2f} GiB, TF32 convolutions {peer['tf32_convolutions']}", flush=True)
    results = {"diffusers": peer}
    if args.parity:
        results["parity"] = parity(args, kept)
    kept.clear()
    if args.tessel:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # give the memory back before tessel's process takes its own
        results["tessel"] = time_tessel(args)
    print(f"== side by side: Wan VAE {'encode' if args.encode else 'decode'}, {args.frames} frames {args.width}x{args.height}, fp32"
          f"{'' if args.no_tf32 else ' (TF32 convolutions)'}")
    print(f"{'':10} {'median s':>9} {'ms/frame':>9} {'memory GiB':>11}")
    print(f"{'diffusers':10} {peer['median_s']:9.3f} {peer['per_frame_ms']:9.1f} {peer['peak_memory_bytes'] / 2**30:11.2f}")
    if "tessel" in results:
        t = results["tessel"]
        memory = t.get("device_memory_bytes", float("nan")) / 2**30
        print(f"{'tessel':10} {t['median_s']:9.3f} {t['per_frame_ms']:9.1f} {memory:11.2f}")
        print(f"tessel / diffusers time: {t['median_s'] / peer['median_s']:.2f}")
    if "parity" in results:
        p = results["parity"]
        print(f"tessel vs diffusers, same weights and latents, {p['frames']} frames: rel-L2 {p['rel_l2']:.3g}, "
              f"PSNR {p['psnr_db']:.1f} dB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
