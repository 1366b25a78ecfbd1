#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/vae/: a tiny random diffusers AutoencoderKLWan (Wan 2.1 layout)
and its outputs, the reference for tessel's Wan VAE.

Needs torch and diffusers:
    python3 scripts/make_vae_fixture.py [--out tests/fixtures/diffusion/vae]

Writes config.json and diffusion_pytorch_model.safetensors (save_pretrained, fp32: the file layout
of a pipeline's vae/ folder, encoder included) and io.safetensors with
  latents (1, 16, 3, 5, 7)   normalized latents, as the denoising loop hands them to the VAE;
  video   (1, 3, 9, 40, 56)  what WanPipeline decodes from them: latents / (1 / std) + mean, then
                             AutoencoderKLWan.decode (frame by frame with the feature cache), clamped;
  moments (1, 32, 3, 5, 7)   AutoencoderKLWan.encode(video): the posterior's mean then log-variance.
The outputs come from a float64 copy of the model (the stored fp32 weights, widened), so they carry
no fp32 rounding of their own. Every weight is random, the RMS norm gains and biases too, scaled so
that activations stay of order one and few output pixels reach the clamp.
"""
import argparse
import os

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/vae")
    args = parser.parse_args()
    torch.manual_seed(17)
    z_dim = 16
    config = dict(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 3, 3], num_res_blocks=1, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0,
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
                gain = 0.5 if name.startswith("decoder.conv_out") else 1.0
                parameter.copy_(gain * torch.randn(parameter.shape) / fan_in**0.5)
    model.save_pretrained(args.out, safe_serialization=True)

    latents = torch.randn(1, z_dim, 3, 5, 7)
    reference = model.double()
    with torch.no_grad():
        mean = torch.tensor(config["latents_mean"], dtype=torch.float64).view(1, z_dim, 1, 1, 1)
        inverse_std = 1.0 / torch.tensor(config["latents_std"], dtype=torch.float64).view(1, z_dim, 1, 1, 1)
        video = reference.decode(latents.double() / inverse_std + mean, return_dict=False)[0]
        moments = reference._encode(video)
    clamped = (video.abs() >= 1.0).double().mean().item()
    print(f"video {tuple(video.shape)}, {clamped:.1%} of the values at the clamp; moments {tuple(moments.shape)}")
    save_file({"latents": latents.contiguous(), "video": video.float().contiguous(), "moments": moments.float().contiguous()},
              os.path.join(args.out, "io.safetensors"))


if __name__ == "__main__":
    main()
