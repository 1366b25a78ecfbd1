#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/wan22_ti2v/: diffusers' WanPipeline in Wan 2.2 TI2V-5B's
text-to-video layout (expand_timesteps: one timestep per token) on a tiny random transformer and the
residual, patched VAE of tests/fixtures/diffusion/vae_residual/ (make_residual_vae_fixture.py).

Needs torch and diffusers==0.42.1:
    python3 scripts/make_ti2v_pipeline_fixture.py [--out tests/fixtures/diffusion/wan22_ti2v]

Writes model_index.json (WanPipeline, expand_timesteps true), scheduler/ (UniPC, flow shift 5 as
TI2V-5B's), transformer/ (save_pretrained, fp32: a 2-layer WanTransformer3DModel with the VAE's 8
latent channels) and io.safetensors with
  prompt_embeds, negative_prompt_embeds (1, 7, 24), noise (1, 8, 2, 2, 4)
  latents (2, 1, 8, 2, 2, 4)   the latents after each of 2 UniPC steps with guidance 5
  timesteps (2)
  frames (5, 32, 64, 3) uint8  the decoded video as output_type "pil" gives it (5 frames of 64 x 32).
and io_i2v.safetensors, the image-to-video half (WanImageToVideoPipeline with expand_timesteps on
the same components: the image's latents as the first latent frame, its tokens at timestep 0):
  image (24, 56, 3) uint8 (resized to 32 x 64 with Lanczos), the same embeddings and noise,
  first_frame (1, 8, 1, 2, 4)  the image's normalized latents
  latents, frames              as above (the callback's latents are the loop's, before the first
                               frame is put back; the frames are decoded after it is)
Text embeddings are given directly (no text encoder); the VAE and the transformer run in fp32.
"""
import argparse
import json
import os

import diffusers
import numpy as np
import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
from PIL import Image
from safetensors.torch import save_file

from make_wan_fixture import randomize

TI2V_UNIPC = dict(
    num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", predict_x0=True,
    solver_type="bh2", lower_order_final=True, use_flow_sigmas=True, flow_shift=5.0,
    final_sigmas_type="zero", timestep_spacing="linspace",
)
# Latent (1, 8, 2, 2, 4) <- 5 frames of 32 x 64 pixels through Wan 2.2's VAE (4x time, 16x space).
FRAMES, HEIGHT, WIDTH, STEPS, GUIDANCE = 5, 32, 64, 2, 5.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vae", default="tests/fixtures/diffusion/vae_residual")
    parser.add_argument("--out", default="tests/fixtures/diffusion/wan22_ti2v")
    args = parser.parse_args()
    if diffusers.__version__ != "0.42.1":
        raise SystemExit(f"diffusers 0.42.1 expected, found {diffusers.__version__}")
    vae = AutoencoderKLWan.from_pretrained(args.vae).float().eval()
    z_dim = vae.config.z_dim
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                        in_channels=z_dim, out_channels=z_dim, text_dim=24, freq_dim=16, ffn_dim=64,
                                        num_layers=2, rope_max_seq_len=32)
    randomize(transformer, torch.Generator().manual_seed(29))
    transformer = transformer.float().eval()
    scheduler = UniPCMultistepScheduler(**TI2V_UNIPC)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer,
                       expand_timesteps=True)
    os.makedirs(args.out, exist_ok=True)
    transformer.save_pretrained(os.path.join(args.out, "transformer"), safe_serialization=True)
    scheduler.save_pretrained(os.path.join(args.out, "scheduler"))
    with open(os.path.join(args.out, "model_index.json"), "w") as f:
        json.dump({"_class_name": "WanPipeline", "_diffusers_version": diffusers.__version__, "boundary_ratio": None,
                   "expand_timesteps": True, "scheduler": ["diffusers", "UniPCMultistepScheduler"],
                   "text_encoder": ["transformers", "UMT5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
                   "transformer": ["diffusers", "WanTransformer3DModel"], "transformer_2": [None, None],
                   "vae": ["diffusers", "AutoencoderKLWan"]}, f, indent=2)

    generator = torch.Generator().manual_seed(31)
    tensors = {
        "prompt_embeds": torch.randn(1, 7, 24, generator=generator),
        "negative_prompt_embeds": torch.randn(1, 7, 24, generator=generator),
        "noise": torch.randn(1, z_dim, (FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16, generator=generator),
    }
    latents = []

    def keep(pipeline, step, timestep, outputs):
        latents.append(outputs["latents"].detach().clone())
        return {}

    with torch.no_grad():
        frames = pipe(prompt_embeds=tensors["prompt_embeds"], negative_prompt_embeds=tensors["negative_prompt_embeds"],
                      latents=tensors["noise"].clone(), height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                      num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="np",
                      callback_on_step_end=keep).frames[0]
    tensors["latents"] = torch.stack(latents).float()
    tensors["timesteps"] = pipe.scheduler.timesteps.to(torch.float32)
    # output_type "pil" is numpy_to_pil of these: (frames * 255).round() as uint8.
    tensors["frames"] = torch.from_numpy((frames * 255).round().astype(np.uint8))
    print("timesteps", pipe.scheduler.timesteps.tolist(), "frames", tuple(tensors["frames"].shape))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(args.out, "io.safetensors"),
              metadata={"diffusers_version": diffusers.__version__})

    # The image-to-video half on the same components and inputs.
    i2v = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=UniPCMultistepScheduler(**TI2V_UNIPC),
                                  transformer=transformer, expand_timesteps=True)
    image = np.random.default_rng(37).integers(0, 256, size=(24, 56, 3), dtype=np.uint8)
    i2v_tensors = {k: tensors[k] for k in ("prompt_embeds", "negative_prompt_embeds", "noise")}
    i2v_tensors["image"] = torch.from_numpy(image.copy())
    latents.clear()
    original_prepare = i2v.prepare_latents

    def keep_condition(*a, **kw):
        out = original_prepare(*a, **kw)
        i2v_tensors["first_frame"] = out[1].detach().clone().float()
        return out

    i2v.prepare_latents = keep_condition
    with torch.no_grad():
        frames = i2v(image=Image.fromarray(image), prompt_embeds=tensors["prompt_embeds"],
                     negative_prompt_embeds=tensors["negative_prompt_embeds"], latents=tensors["noise"].clone(), height=HEIGHT,
                     width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE, output_type="np",
                     callback_on_step_end=keep).frames[0]
    i2v_tensors["latents"] = torch.stack(latents).float()
    i2v_tensors["frames"] = torch.from_numpy((frames * 255).round().astype(np.uint8))
    save_file({k: v.contiguous() for k, v in i2v_tensors.items()}, os.path.join(args.out, "io_i2v.safetensors"),
              metadata={"diffusers_version": diffusers.__version__})
    print("i2v first frame", tuple(i2v_tensors["first_frame"].shape))


if __name__ == "__main__":
    main()
