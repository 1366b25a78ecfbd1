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
"""
import argparse
import os

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from safetensors.torch import load_file, save_file

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="tests/fixtures/wan/checkpoint")
    parser.add_argument("--out", default="tests/fixtures/diffusion/wan_pipeline.safetensors")
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
        latents = []

        def keep(pipeline, step, timestep, outputs):
            latents.append(outputs["latents"].detach().clone())
            return {}

        with torch.no_grad():
            pipe(prompt_embeds=tensors["prompt_embeds"], negative_prompt_embeds=tensors["negative_prompt_embeds"],
                 latents=tensors["noise"].clone(), height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                 num_inference_steps=steps, guidance_scale=guidance, output_type="latent",
                 callback_on_step_end=keep)
        tensors[f"{name}.latents"] = torch.stack(latents).float()
        tensors[f"{name}.timesteps"] = pipe.scheduler.timesteps.to(torch.float32)
        print(name, "timesteps", pipe.scheduler.timesteps.tolist())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out,
              metadata={"diffusers_version": diffusers.__version__})


if __name__ == "__main__":
    main()
