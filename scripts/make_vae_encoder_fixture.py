#!/usr/bin/env python3
"""Writes encode.safetensors into tests/fixtures/diffusion/vae/ and vae_residual/: diffusers' encode of
a random video by the tiny AutoencoderKLWan models already there (Wan 2.1's layout and Wan 2.2's
residual, patched one), the reference for tessel's Wan VAE encoder.

Needs torch and diffusers (0.42.1); run after make_vae_fixture.py / make_residual_vae_fixture.py:
    python3 scripts/make_vae_encoder_fixture.py [--fixtures tests/fixtures/diffusion]

Each encode.safetensors holds
  video   (1, 3, 9, H, W)        uniform in [-1, 1]: 40 x 24 for the Wan 2.1 model (8 pixels per
                                 latent pixel), 48 x 32 for the residual one (16, the patch included);
  mu      (1, z_dim, 3, h, w)    retrieve_latents(vae.encode(video), sample_mode="argmax"): the
                                 posterior's mode, its mean (first chunk of one frame, then two of
                                 four, with the feature cache);
  latents (1, z_dim, 3, h, w)    (mu - latents_mean) * (1 / latents_std), as WanImageToVideoPipeline
                                 normalizes its image's latents.
The outputs come from a float64 copy of the model, fed the stored fp32 video widened, so they carry no
fp32 rounding of their own. The models' weights are those committed, unchanged.
"""
import argparse
import os

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

# Frame size of each fixture's video: 3 x 5 (Wan 2.1) and 2 x 3 (residual) latent pixels, the last
# different from the decoder fixtures' so that height and width are not confused.
SIZES = {"vae": (24, 40), "vae_residual": (32, 48)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", default="tests/fixtures/diffusion")
    args = parser.parse_args()
    torch.manual_seed(29)
    for name, (height, width) in SIZES.items():
        folder = os.path.join(args.fixtures, name)
        model = AutoencoderKLWan.from_pretrained(folder, torch_dtype=torch.float32).eval().double()
        video = torch.rand(1, 3, 9, height, width) * 2.0 - 1.0
        z_dim = model.config.z_dim
        with torch.no_grad():
            mu = model.encode(video.double()).latent_dist.mode()
            mean = torch.tensor(model.config.latents_mean, dtype=torch.float64).view(1, z_dim, 1, 1, 1)
            inverse_std = 1.0 / torch.tensor(model.config.latents_std, dtype=torch.float64).view(1, z_dim, 1, 1, 1)
            latents = (mu - mean) * inverse_std
        print(f"{name}: video {tuple(video.shape)} -> mu {tuple(mu.shape)}, |mu| max {mu.abs().max().item():.3g}")
        save_file({"video": video.contiguous(), "mu": mu.float().contiguous(), "latents": latents.float().contiguous()},
                  os.path.join(folder, "encode.safetensors"))


if __name__ == "__main__":
    main()
