#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/wan_pipeline.safetensors: diffusers' WanPipeline denoising loop
on the tiny random transformer of tests/fixtures/wan/checkpoint (made by make_wan_fixture.py).

Needs torch and diffusers==0.42.1:
    python3 scripts/make_pipeline_fixture.py [--out tests/fixtures/diffusion/wan_pipeline.safetensors]

Text embeddings are given directly (no text encoder), the starting noise is given as `latents`,
and output_type="latent" stops before the VAE. For each case the file holds the inputs and the
latents after every step (captured with callback_on_step_end), in float32:
    prompt_embeds (1, 7, 24), negative_prompt_embeds (1, 7, 24), noise (1, 16, 3, 10, 6)
    <case>.latents (steps, 1, 16, 3, 10, 6), <case>.timesteps (steps)
Cases: unipc_cfg (UniPC, Wan's scheduler config, 4 steps, guidance 5), euler_cfg
(FlowMatchEuler shift 3, 3 steps, guidance 3.5), unipc_nocfg (UniPC, 3 steps, guidance 1: one
conditional forward per step).

Wan 2.2's two-expert layout (A14B) goes to tests/fixtures/diffusion/wan22_two_experts/: a second
random transformer of the same config (`transformer_2/`, the low-noise expert; the checkpoint above
is the high-noise `transformer`) and `latents.safetensors` with WanPipeline(transformer,
transformer_2, boundary_ratio) run from the same embeddings and noise. Cases (<case>.latents,
<case>.timesteps as above, and <case>.experts: 0 high-noise, 1 low-noise per step):
two_experts_unipc (UniPC, 2 steps, boundary_ratio 0.875: timesteps 999 and 750, guidance 5 then
guidance_scale_2 3), two_experts_euler (Euler shift 3, 3 steps, boundary_ratio 0.6, guidance 4,
guidance_scale_2 unset: 4 for both experts).
"""
import argparse
import os

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from safetensors.torch import load_file, save_file

from make_wan_fixture import randomize

WAN_UNIPC = dict(
    num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", predict_x0=True,
    solver_type="bh2", lower_order_final=True, use_flow_sigmas=True, flow_shift=3.0,
    final_sigmas_type="zero", timestep_spacing="linspace",
)
CASES = [
    ("unipc_cfg", lambda: UniPCMultistepScheduler(**WAN_UNIPC), 4, 5.0),
    ("euler_cfg", lambda: FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0), 3, 3.5),
    ("unipc_nocfg", lambda: UniPCMultistepScheduler(**WAN_UNIPC), 3, 1.0),
]
TWO_EXPERT_CASES = [
    ("two_experts_unipc", lambda: UniPCMultistepScheduler(**WAN_UNIPC), 2, 0.875, 5.0, 3.0),
    ("two_experts_euler", lambda: FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0), 3, 0.6, 4.0, None),
]
# Latent (1, 16, 3, 10, 6) <- 9 frames of 80 x 48 pixels through Wan's VAE (4x time, 8x space).
FRAMES, HEIGHT, WIDTH = 9, 80, 48


def load_transformer(checkpoint):
    """The checkpoint's model, read shard by shard (from_pretrained wants accelerate for it)."""
    config = WanTransformer3DModel.load_config(checkpoint)
    model = WanTransformer3DModel.from_config(config)
    state = {}
    for file in sorted(os.listdir(checkpoint)):
        if file.endswith(".safetensors"):
            state.update(load_file(os.path.join(checkpoint, file)))
    model.load_state_dict(state, strict=True)
    return model.float().eval()


def run_pipeline(pipe, tensors, steps, **kwargs):
    """The latents after every step (callback_on_step_end), stacked."""
    latents = []

    def keep(pipeline, step, timestep, outputs):
        latents.append(outputs["latents"].detach().clone())
        return {}

    with torch.no_grad():
        pipe(prompt_embeds=tensors["prompt_embeds"], negative_prompt_embeds=tensors["negative_prompt_embeds"],
             latents=tensors["noise"].clone(), height=HEIGHT, width=WIDTH, num_frames=FRAMES,
             num_inference_steps=steps, output_type="latent", callback_on_step_end=keep, **kwargs)
    return torch.stack(latents).float()


def write_two_expert_fixture(transformer, tensors, out_dir):
    """Wan 2.2 A14B's layout: `transformer` above the boundary timestep, a second expert below."""
    transformer_2 = WanTransformer3DModel.from_config(transformer.config)
    randomize(transformer_2, torch.Generator().manual_seed(23))
    transformer_2 = transformer_2.float().eval()
    transformer_2.save_pretrained(os.path.join(out_dir, "transformer_2"), safe_serialization=True)
    results = {}
    for name, make_scheduler, steps, boundary_ratio, guidance, guidance_2 in TWO_EXPERT_CASES:
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=make_scheduler(),
                           transformer=transformer, transformer_2=transformer_2, boundary_ratio=boundary_ratio)
        results[f"{name}.latents"] = run_pipeline(pipe, tensors, steps, guidance_scale=guidance,
                                                  guidance_scale_2=guidance_2)
        timesteps = pipe.scheduler.timesteps
        results[f"{name}.timesteps"] = timesteps.to(torch.float32)
        boundary = boundary_ratio * pipe.scheduler.config.num_train_timesteps
        results[f"{name}.experts"] = (timesteps < boundary).to(torch.float32)
        print(name, "timesteps", timesteps.tolist(), "experts", results[f"{name}.experts"].tolist())
    save_file({k: v.contiguous() for k, v in results.items()}, os.path.join(out_dir, "latents.safetensors"),
              metadata={"diffusers_version": diffusers.__version__})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="tests/fixtures/wan/checkpoint")
    parser.add_argument("--out", default="tests/fixtures/diffusion/wan_pipeline.safetensors")
    parser.add_argument("--two-experts-out", default="tests/fixtures/diffusion/wan22_two_experts")
    args = parser.parse_args()
    if diffusers.__version__ != "0.42.1":
        raise SystemExit(f"diffusers 0.42.1 expected, found {diffusers.__version__}")
    transformer = load_transformer(args.checkpoint)
    generator = torch.Generator().manual_seed(17)
    text_dim = transformer.config.text_dim
    tensors = {
        "prompt_embeds": torch.randn(1, 7, text_dim, generator=generator),
        "negative_prompt_embeds": torch.randn(1, 7, text_dim, generator=generator),
        "noise": torch.randn(1, 16, 3, HEIGHT // 8, WIDTH // 8, generator=generator),
    }
    for name, make_scheduler, steps, guidance in CASES:
        pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=make_scheduler(),
                           transformer=transformer)
        tensors[f"{name}.latents"] = run_pipeline(pipe, tensors, steps, guidance_scale=guidance)
        tensors[f"{name}.timesteps"] = pipe.scheduler.timesteps.to(torch.float32)
        print(name, "timesteps", pipe.scheduler.timesteps.tolist())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out,
              metadata={"diffusers_version": diffusers.__version__})
    write_two_expert_fixture(transformer, tensors, args.two_experts_out)


if __name__ == "__main__":
    main()
