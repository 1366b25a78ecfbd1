#!/usr/bin/env python3
"""The peer of `tessel dit-bench`: diffusers' WanTransformer3DModel forward on random weights at
the same sizes, shapes and batch, timed the same way (median step, untimed warm-up steps first).

    python bench/wan_diffusers_peer.py --model wan-1.3b --frames 81 --height 480 --width 832 \
        --device cuda --dtype bf16 [--sdpa default|flash|cudnn|math] [--layers N] [--json]

Needs torch and diffusers==0.42.1. Sizes and the pixel -> latent mapping are dit-bench's: frames
4k + 1 -> k + 1 latent frames, pixels / 8; batch 2 (classifier-free guidance in one call), 512
text tokens. Prints the median and mean step, and on CUDA the peak memory. wan-i2v-14b also takes
random CLIP features of --image-tokens tokens (257: ViT-H/14's patches and class token), as
WanImageToVideoPipeline passes them (it runs its two guidance branches as two calls of batch 1; this
runs them as one call of batch 2, as dit-bench does).
"""
import argparse
import json
import statistics
import time

import torch
from diffusers import WanTransformer3DModel

PRESETS = {
    "wan-1.3b": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "wan-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40),
    # Wan2.1-I2V-14B's transformer config: the mask and the encoded condition video on 20 more input
    # channels, and the image branch (CLIP ViT-H/14 features, 1280 wide, into add_k/add_v).
    "wan-i2v-14b": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, in_channels=36, image_dim=1280,
                        added_kv_proj_dim=5120),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="wan-1.3b")
    parser.add_argument("--layers", type=int, default=0, help="transformer blocks to run (default: the model's)")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--image-tokens", type=int, default=257, help="CLIP tokens of an image-to-video model")
    parser.add_argument("--steps", type=int, default=1, help="timed steps")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--sdpa", choices=["default", "flash", "cudnn", "efficient", "math"], default="default")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if (args.frames - 1) % 4 or args.height % 16 or args.width % 16:
        parser.error("--frames must be 4k + 1, --height and --width multiples of 16")
    if args.threads:
        torch.set_num_threads(args.threads)

    config = dict(PRESETS[args.model])
    if args.layers:
        config["num_layers"] = args.layers
    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype]
    model = WanTransformer3DModel(**config).to(device=args.device, dtype=dtype).eval()
    latent = (args.batch, config.get("in_channels", 16), (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    hidden_states = torch.randn(latent, device=args.device, dtype=dtype)
    text = torch.randn((args.batch, args.text_tokens, 4096), device=args.device, dtype=dtype)
    tokens = latent[2] * (latent[3] // 2) * (latent[4] // 2)
    extra = {}
    if "image_dim" in config:
        extra["encoder_hidden_states_image"] = torch.randn((args.batch, args.image_tokens, config["image_dim"]), device=args.device,
                                                           dtype=dtype)

    backends = {
        "flash": [torch.nn.attention.SDPBackend.FLASH_ATTENTION],
        "cudnn": [torch.nn.attention.SDPBackend.CUDNN_ATTENTION],
        "efficient": [torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION],
        "math": [torch.nn.attention.SDPBackend.MATH],
    }
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    total = args.warmup + args.steps
    times = []
    with torch.no_grad():
        for step in range(total):
            timestep = torch.full((args.batch,), 1000.0 * (1.0 - step / total), device=args.device, dtype=dtype)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            if args.sdpa == "default":
                model(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=text, return_dict=False, **extra)
            else:
                with torch.nn.attention.sdpa_kernel(backends[args.sdpa]):
                    model(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=text, return_dict=False, **extra)
            if cuda:
                torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)

    report = {
        "peer": "diffusers WanTransformer3DModel",
        "model": args.model,
        "layers": config["num_layers"],
        "batch": args.batch,
        "latent": list(latent[2:]),
        "tokens": tokens,
        "text_tokens": args.text_tokens,
        "device": args.device,
        "dtype": args.dtype,
        "sdpa": args.sdpa,
        "threads": torch.get_num_threads(),
        "step_s_median": statistics.median(times),
        "step_s_mean": statistics.fmean(times),
    }
    if cuda:
        report["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"diffusers {args.model}: {report['layers']} layers, {args.device} {args.dtype}, sdpa {args.sdpa}; "
            f"batch {args.batch}, {tokens} tokens, {args.text_tokens} text tokens; "
            f"step median {report['step_s_median']:.4f} s, mean {report['step_s_mean']:.4f} s over {args.steps}"
            + (f"; peak {report['peak_memory_gib']:.2f} GiB" if cuda else "")
        )


if __name__ == "__main__":
    main()
