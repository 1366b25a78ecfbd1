#!/usr/bin/env python3
"""A diffusers DiT other than Wan at a real size with tessel attention against SDPA pinned to cuDNN.

    python bench/diffusers_any_bench.py [--model hunyuan_video|flux] [--frames 129 --height 544
        --width 960] [--double-layers N --single-layers N] [--topk-ratio 0.2] [--static radial] [--steps 3]
        [--json FILE]

Random bf16 weights at the model's published config (HunyuanVideo 13B: 24 heads of 128, 20 double
and 40 single blocks; Flux.1 12B: 24 heads of 128, 19 double and 38 single blocks; fewer blocks with
--double-layers / --single-layers keep the token and head shapes), one transformer forward with
batch 1 and the model's text length, CUDA. On the same weights and inputs, median forward time
(CUDA events, after an untimed warm-up) of:
  - diffusers with SDPA pinned to cuDNN (torch.nn.attention.sdpa_kernel(CUDNN_ATTENTION); the
    default SDPA dispatch where cuDNN refuses a call, named in the output),
  - tessel dense (tessel.integrations.diffusers.enable(model)),
  - tessel dynamic_topk at --topk-ratio (every row ranked: random weights make incoherent tokens),
  - with --static, a static pattern (radial, local or sliding_window, the config's defaults) on the
    latent grid the forward's arguments give,
the sparse ones with joint text rows and columns dense (the MMDiT arrow); each output's rel-L2
against the SDPA output, and the image x image density of the sparse ones.
"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import diffusers
from diffusers_wan_tessel import median_step_ms
from tessel.integrations import diffusers as tessel_diffusers

TEXT_TOKENS = {"hunyuan_video": 256, "flux": 512}


def hunyuan_video(args):
    model = diffusers.HunyuanVideoTransformer3DModel(num_layers=args.double_layers or 20,
                                                     num_single_layers=args.single_layers or 40)
    latent = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    inputs = dict(hidden_states=torch.randn(latent), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, TEXT_TOKENS["hunyuan_video"], 4096),
                  encoder_attention_mask=torch.ones(1, TEXT_TOKENS["hunyuan_video"], dtype=torch.bool),
                  pooled_projections=torch.randn(1, 768), guidance=torch.tensor([6000.0]))
    tokens = latent[2] * (latent[3] // 2) * (latent[4] // 2)
    return model, inputs, tokens


def flux(args):
    model = diffusers.FluxTransformer2DModel(num_layers=args.double_layers or 19, num_single_layers=args.single_layers or 38,
                                             guidance_embeds=True)
    h, w = args.height // 16, args.width // 16
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij"), -1)
    inputs = dict(hidden_states=torch.randn(1, h * w, 64), encoder_hidden_states=torch.randn(1, TEXT_TOKENS["flux"], 4096),
                  pooled_projections=torch.randn(1, 768), timestep=torch.tensor([0.5]), guidance=torch.tensor([3.5]),
                  img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(TEXT_TOKENS["flux"], 3))
    return model, inputs, h * w


MODELS = {"hunyuan_video": hunyuan_video, "flux": flux}


def rel_l2(x: torch.Tensor, reference: torch.Tensor) -> float:
    x, reference = x.double(), reference.double()
    return float((x - reference).norm() / reference.norm())


def timed(model, inputs, steps: int, warmup: int):
    """Median step ms and the last output (fp32), timed as the Wan benchmark times."""
    ms, out = median_step_ms(model, inputs, steps, warmup, call=lambda m, x: m(**x, return_dict=False)[0])
    return ms, out.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="hunyuan_video")
    parser.add_argument("--frames", type=int, default=129)
    parser.add_argument("--height", type=int, default=544)
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--double-layers", type=int, default=0)
    parser.add_argument("--single-layers", type=int, default=0)
    parser.add_argument("--topk-ratio", type=float, default=0.2)
    parser.add_argument("--static", choices=("radial", "local", "sliding_window"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()

    torch.manual_seed(0)
    with torch.device("cuda"):
        model, inputs, image_tokens = MODELS[args.model](args)
    model = model.to(torch.bfloat16).eval()
    inputs = {k: v.cuda().to(torch.bfloat16) if v.is_floating_point() else v.cuda() for k, v in inputs.items()}
    text = TEXT_TOKENS[args.model]
    print(f"{args.model}: {image_tokens} image tokens + {text} text tokens, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, diffusers {diffusers.__version__}, "
          f"torch {torch.__version__}", flush=True)

    rows = {}
    sdpa_backend = "cuDNN"
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            rows["sdpa"] = timed(model, inputs, args.steps, args.warmup)
    except RuntimeError as error:  # cuDNN refused a call (a mask, a shape): the default dispatch
        sdpa_backend = f"default dispatch (cuDNN refused: {str(error).splitlines()[0][:80]})"
        rows["sdpa"] = timed(model, inputs, args.steps, args.warmup)
    reference = rows["sdpa"][1]
    print(f"sdpa ({sdpa_backend}): {rows['sdpa'][0]:.1f} ms", flush=True)
    tessel_diffusers.enable(model)
    rows["tessel dense"] = timed(model, inputs, args.steps, args.warmup)
    configs = {f"tessel dynamic_topk {args.topk_ratio}": {"pattern": {"type": "dynamic_topk"},
                                                         "selection": {"topk_ratio": args.topk_ratio},
                                                         "options": {"similarity_threshold": "-2"}}}
    if args.static:
        configs[f"tessel {args.static}"] = {"pattern": {"type": args.static}}
    densities = {}
    for name, config in configs.items():
        tessel_diffusers.enable(model, config)
        rows[name] = timed(model, inputs, args.steps, args.warmup)
        densities[name] = getattr(model, "_tessel_sparse_attention")[0][0].model.last_density
    tessel_diffusers.disable(model)

    base = rows["sdpa"][0]
    report = {"model": args.model, "image_tokens": image_tokens, "text_tokens": text, "sdpa_backend": sdpa_backend,
              "frames": args.frames, "height": args.height, "width": args.width, "rows": {}}
    print("\n== side by side (median forward ms; speedup over SDPA; rel-L2 vs the SDPA output)")
    for name, (ms, out) in rows.items():
        error = rel_l2(out, reference)
        density = densities.get(name)
        report["rows"][name] = {"ms": ms, "speedup": base / ms, "rel_l2_vs_sdpa": error, "density": density}
        extra = f", image x image density {density:.3f}" if density is not None else ""
        print(f"{name:28s} {ms:10.1f} ms  {base / ms:5.2f}x  rel-L2 {error:.2e}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
