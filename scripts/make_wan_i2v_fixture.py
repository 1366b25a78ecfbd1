#!/usr/bin/env python3
"""Writes the image-conditioned Wan transformer parity fixture under tests/fixtures/wan_i2v/.

    python scripts/make_wan_i2v_fixture.py [--out tests/fixtures/wan_i2v]

Needs torch (CPU is enough) and diffusers==0.42.1. Two tiny WanTransformer3DModel checkpoints
with image conditioning, as Wan 2.1 I2V and FLF2V configure theirs (the rest as
make_wan_fixture.py: 2 layers, 2 heads of 16, an odd 3x5x3 patch grid, batch 2):

  i2v/     in_channels 36 (the noisy latents, the 4-channel frame mask and the encoded
           conditioning video), image_dim 20 (CLIP's width), added_kv_proj_dim = the inner width;
  flf2v/   the same with pos_embed_seq_len 2 x IMAGE_TOKENS (the first and last frames' CLIP
           tokens side by side, each with its learned position embedding).

io.safetensors holds, for each (prefix i2v_ / flf2v_): hidden_states, timestep, the text
(512 tokens: diffusers takes everything before the last 512 context tokens as the image's), the
image embeddings (B, I, image_dim), output_fp32 (diffusers in fp32) and output_fp64 (in float64).
"""
import argparse
import copy
import os
import shutil

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

from make_wan_fixture import CONFIG, LATENT, randomize, rel_l2

TEXT_TOKENS = 512  # diffusers' WanAttnProcessor hard-codes the text's 512 tokens to split the context
IMAGE_TOKENS = 5
IMAGE_DIM = 20
I2V = dict(CONFIG, in_channels=36, image_dim=IMAGE_DIM, added_kv_proj_dim=CONFIG["num_attention_heads"] * CONFIG["attention_head_dim"])
FLF2V = dict(I2V, pos_embed_seq_len=2 * IMAGE_TOKENS)


def forward(model: WanTransformer3DModel, inputs: dict, dtype: torch.dtype) -> torch.Tensor:
    model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        out = model(
            hidden_states=inputs["hidden_states"].to(dtype),
            timestep=inputs["timestep"].to(dtype),
            encoder_hidden_states=inputs["encoder_hidden_states"].to(dtype),
            encoder_hidden_states_image=inputs["encoder_hidden_states_image"].to(dtype),
            return_dict=False,
        )[0]
    return out.float().contiguous()


def write(out: str, name: str, config: dict, image_tokens: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    model = WanTransformer3DModel(**config).eval()
    randomize(model, generator)
    batch = LATENT[0]
    inputs = {
        "hidden_states": torch.randn((batch, config["in_channels"], *LATENT[2:]), generator=generator),
        "timestep": torch.tensor([937.0, 421.5]),
        "encoder_hidden_states": torch.randn((batch, TEXT_TOKENS, config["text_dim"]), generator=generator),
        "encoder_hidden_states_image": torch.randn((batch, image_tokens, IMAGE_DIM), generator=generator),
    }
    if config.get("pos_embed_seq_len"):
        # diffusers views the image tokens as (-1, pos_embed_seq_len, dim): a sample's first-frame
        # and last-frame tokens arrive as two rows of the batch, so the model is called with 2B rows.
        inputs["encoder_hidden_states_image"] = inputs["encoder_hidden_states_image"].reshape(2 * batch, image_tokens // 2, IMAGE_DIM)
    checkpoint = os.path.join(out, name)
    shutil.rmtree(checkpoint, ignore_errors=True)
    model.save_pretrained(checkpoint, safe_serialization=True)
    outputs = {"output_fp32": forward(model, inputs, torch.float32), "output_fp64": forward(model, inputs, torch.float64)}
    # Without the image branch's contribution the output must differ (the test would catch a branch that does nothing).
    print(f"{name}: diffusers fp32 vs float64 rel-L2 {rel_l2(outputs['output_fp32'], outputs['output_fp64']):.3e}")
    inputs["encoder_hidden_states_image"] = inputs["encoder_hidden_states_image"].reshape(batch, image_tokens, IMAGE_DIM)
    return {f"{name}_{key}": value.contiguous() for key, value in {**inputs, **outputs}.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "wan_i2v"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tensors = {**write(args.out, "i2v", I2V, IMAGE_TOKENS, 20261128), **write(args.out, "flf2v", FLF2V, 2 * IMAGE_TOKENS, 20261129)}
    save_file(tensors, os.path.join(args.out, "io.safetensors"))
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(args.out) for f in files)
    print(f"wrote {args.out}: {total} bytes")


if __name__ == "__main__":
    main()
