#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/vae_residual/: a tiny random diffusers AutoencoderKLWan in Wan 2.2's
residual, patched layout (is_residual, patch_size 2, 12 in/out channels: TI2V-5B's VAE at small
widths) and its decode, the reference for tessel's residual Wan VAE decoder.

Needs torch and diffusers (0.42.1):
    python3 scripts/make_residual_vae_fixture.py [--out tests/fixtures/diffusion/vae_residual]

Writes config.json and diffusion_pytorch_model.safetensors (save_pretrained, fp32: the file layout
of a pipeline's vae/ folder, encoder included) and io.safetensors with
  latents (1, 8, 3, 2, 3)    normalized latents, as the denoising loop hands them to the VAE;
  video   (1, 3, 9, 32, 48)  what WanPipeline decodes from them: latents / (1 / std) + mean, then
                             AutoencoderKLWan.decode (frame by frame with the feature cache, the
                             first chunk marked for DupUp3D), unpatchified, clamped.
The real model's structure is kept (dim_mult (1, 2, 4, 4), temporal upsampling in the first two up
blocks, a channel change with a shortcut convolution in the third, the duplicate-upsample shortcut
of every upsampling block) at base widths 2 (encoder) and 4 (decoder), z_dim 8 and one residual
block per stage, so the files stay small. The video comes from a float64 copy of the model (the
stored fp32 weights, widened), so it carries no fp32 rounding of its own. Every weight is random, the
RMS norm gains and biases too, scaled so that activations stay of order one; 3% of the output
values reach the clamp.
"""
import argparse
import os

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/vae_residual")
    args = parser.parse_args()
    torch.manual_seed(23)
    z_dim = 8
    config = dict(base_dim=2, decoder_base_dim=4, z_dim=z_dim, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0, is_residual=True, in_channels=12,
                  out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                  latents_mean=[round(float(v), 4) for v in torch.randn(z_dim) * 0.5],
                  latents_std=[round(float(v), 4) for v in torch.rand(z_dim) * 2.0 + 0.5])
    model = AutoencoderKLWan(**config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("gamma"):
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape))
            elif name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn(parameter.shape))
            else:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn(parameter.shape) / fan_in**0.5)
    model.save_pretrained(args.out, safe_serialization=True)

    latents = torch.randn(1, z_dim, 3, 2, 3)
    reference = model.double()
    with torch.no_grad():
        mean = torch.tensor(config["latents_mean"], dtype=torch.float64).view(1, z_dim, 1, 1, 1)
        inverse_std = 1.0 / torch.tensor(config["latents_std"], dtype=torch.float64).view(1, z_dim, 1, 1, 1)
        video = reference.decode(latents.double() / inverse_std + mean, return_dict=False)[0]
    clamped = (video.abs() >= 1.0).double().mean().item()
    print(f"video {tuple(video.shape)}, {clamped:.1%} of the values at the clamp")
    save_file({"latents": latents.contiguous(), "video": video.float().contiguous()},
              os.path.join(args.out, "io.safetensors"))


if __name__ == "__main__":
    main()
