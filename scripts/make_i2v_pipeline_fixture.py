#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/wan21_i2v/: diffusers' WanImageToVideoPipeline (Wan 2.1 I2V's
layout, and FLF2V's with a last image) on tiny random components, 2 UniPC steps with guidance 5.

Needs torch, transformers 5.24 and diffusers==0.42.1:
    python3 scripts/make_i2v_pipeline_fixture.py [--out tests/fixtures/diffusion/wan21_i2v]

Components: the tiny Wan 2.1 VAE of tests/fixtures/diffusion/vae/ (16 latent channels) and the tiny
CLIPVisionModel of tests/fixtures/diffusion/clip_vision/ (width 32, image 42, patch 14: 10 tokens),
the VAE linked (vae/ -> ../../vae), the CLIP copied in; a 2-layer WanTransformer3DModel with 36 input channels and image_dim 32 (i2v/, and
flf2v/ with pos_embed_seq_len 20); image_processor/ (CLIPImageProcessor at 42). Each of i2v/ and
flf2v/ is a whole model directory (model_index.json, scheduler/, transformer/, vae/,
image_encoder/, image_processor/) and holds io.safetensors:
  prompt_embeds, negative_prompt_embeds (1, 512, 24)  given directly (no text encoder): diffusers'
      attention splits the context at 512 text tokens, so the text is that long
  image (40, 56, 3) uint8, last_image (flf2v) (24, 40, 3) uint8: sizes other than the video's, so
      the Lanczos resize and CLIP's own resize and crop run
  noise (1, 16, 2, 4, 6)        the starting latents of 5 frames of 32 x 48
  image_embeds                  the CLIP features diffusers computed
  condition (1, 20, 2, 4, 6)    mask + normalized latents of the conditioning video
  latents (2, 1, 16, 2, 4, 6)   after each step
  frames (5, 32, 48, 3) uint8   the decoded video as output_type "pil" gives it
a14b/ is Wan 2.2 I2V-A14B's layout (two experts, boundary_ratio 0.9, no CLIP; first and last image),
without image_embeds.
"""
import argparse
import json
import os
import shutil

import diffusers
import numpy as np
import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanTransformer3DModel
from PIL import Image
from safetensors.torch import save_file
from transformers import CLIPImageProcessor, CLIPVisionModel

from make_wan_fixture import randomize

UNIPC = dict(num_train_timesteps=1000, solver_order=2, prediction_type="flow_prediction", predict_x0=True, solver_type="bh2",
             lower_order_final=True, use_flow_sigmas=True, flow_shift=3.0, final_sigmas_type="zero", timestep_spacing="linspace")
FRAMES, HEIGHT, WIDTH, STEPS, GUIDANCE, TEXT = 5, 32, 48, 2, 5.0, 512


def write(out: str, name: str, vae_dir: str, clip_dir: str, flf2v: bool, seed: int, two_experts: bool = False) -> None:
    """Wan 2.1 I2V (flf2v False), FLF2V (flf2v True) or, with two_experts, Wan 2.2 I2V-A14B's layout:
    two transformers without an image branch or CLIP, boundary_ratio 0.9 (the 2 steps' timesteps
    999 and 833 fall on either side of it), a last image in the mask and the conditioning video."""
    root = os.path.join(out, name)
    shutil.rmtree(root, ignore_errors=True)
    vae = AutoencoderKLWan.from_pretrained(vae_dir).float().eval()
    clip = CLIPVisionModel.from_pretrained(clip_dir).float().eval()
    side = clip.config.image_size
    processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    tokens = (side // clip.config.patch_size) ** 2 + 1
    z = vae.config.z_dim
    generator = torch.Generator().manual_seed(seed)

    def make_transformer(image_branch: bool) -> WanTransformer3DModel:
        model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=2 * z + 4,
                                      out_channels=z, text_dim=24, freq_dim=16, ffn_dim=64, num_layers=2, rope_max_seq_len=32,
                                      image_dim=clip.config.hidden_size if image_branch else None,
                                      added_kv_proj_dim=32 if image_branch else None,
                                      pos_embed_seq_len=2 * tokens if flf2v and image_branch else None)
        randomize(model, generator)
        return model.float().eval()

    transformer = make_transformer(not two_experts)
    scheduler = UniPCMultistepScheduler(**UNIPC)
    if two_experts:
        pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer,
                                       transformer_2=make_transformer(False), boundary_ratio=0.9)
    else:
        pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, image_processor=processor,
                                       image_encoder=clip, transformer=transformer)
    pipe.save_pretrained(root, safe_serialization=True)
    with open(os.path.join(root, "model_index.json")) as f:  # no text encoder or tokenizer: requests bring embeddings
        index = json.load(f)

    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    last_image = rng.integers(0, 256, size=(24, 40, 3), dtype=np.uint8) if flf2v else None
    tensors = {
        "prompt_embeds": torch.randn(1, TEXT, 24, generator=generator),
        "negative_prompt_embeds": torch.randn(1, TEXT, 24, generator=generator),
        "noise": torch.randn(1, z, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8, generator=generator),
        "image": torch.from_numpy(image.copy()),
    }
    if flf2v:
        tensors["last_image"] = torch.from_numpy(last_image.copy())
    latents, seen = [], {}

    def keep(pipeline, step, timestep, outputs):
        latents.append(outputs["latents"].detach().clone())
        return {}

    original_forward = transformer.forward

    def spy(*args, **kwargs):  # the first call's image features and condition channels
        if "condition" not in seen:
            if kwargs["encoder_hidden_states_image"] is not None:
                seen["image_embeds"] = kwargs["encoder_hidden_states_image"].detach().clone()
            seen["condition"] = kwargs["hidden_states"][:, z:].detach().clone()
        return original_forward(*args, **kwargs)

    transformer.forward = spy
    with torch.no_grad():
        frames = pipe(image=Image.fromarray(image), last_image=Image.fromarray(last_image) if flf2v else None,
                      prompt_embeds=tensors["prompt_embeds"], negative_prompt_embeds=tensors["negative_prompt_embeds"],
                      latents=tensors["noise"].clone(), height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
                      guidance_scale=GUIDANCE, output_type="np", callback_on_step_end=keep).frames[0]
    if "image_embeds" in seen:
        tensors["image_embeds"] = seen["image_embeds"].reshape(1, -1, clip.config.hidden_size).float()
    tensors["condition"] = seen["condition"].float()
    tensors["latents"] = torch.stack(latents).float()
    tensors["frames"] = torch.from_numpy((frames * 255).round().astype(np.uint8))
    # The VAE is the one the fixture was built from, unchanged: a link instead of a second copy (1.6 MB).
    shutil.rmtree(os.path.join(root, "vae"))
    os.symlink(os.path.relpath(os.path.abspath(vae_dir), root), os.path.join(root, "vae"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(root, "io.safetensors"),
              metadata={"diffusers_version": diffusers.__version__})
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(root) for f in files)
    print(f"{name}: index {index['_class_name']}, experts {1 + two_experts}, {total} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vae", default="tests/fixtures/diffusion/vae")
    parser.add_argument("--clip", default="tests/fixtures/diffusion/clip_vision")
    parser.add_argument("--out", default="tests/fixtures/diffusion/wan21_i2v")
    args = parser.parse_args()
    if diffusers.__version__ != "0.42.1":
        raise SystemExit(f"diffusers 0.42.1 expected, found {diffusers.__version__}")
    write(args.out, "i2v", args.vae, args.clip, False, 41)
    write(args.out, "flf2v", args.vae, args.clip, True, 43)
    write(args.out, "a14b", args.vae, args.clip, True, 47, two_experts=True)


if __name__ == "__main__":
    main()
