#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/clip_vision/: a tiny random transformers CLIPVisionModel, its
penultimate hidden states on fixed pixels, and CLIPImageProcessor's output on small random images,
the references for tessel's CLIP vision encoder and its preprocessing.

Needs torch, transformers and Pillow:
    python3 scripts/make_clip_vision_fixture.py [--out tests/fixtures/diffusion/clip_vision]

Writes config.json and model.safetensors (save_pretrained, fp32; hidden 32, 3 layers, 4 heads,
patch 14, image 42: 10 tokens) and io.safetensors with
  pixel_values (2, 3, 42, 42) fp32,
  hidden_states (2, 10, 32): hidden_states[-2] of the float64 forward (gelu, as Wan's encoder),
  hidden_states_quick_gelu: the same weights with hidden_act quick_gelu,
  image_<name> (H, W, 3) uint8 and pixels_<name> (1, 3, 42, 42) fp32: CLIPImageProcessor(size
  {"shortest_edge": 42}, crop_size 42) on that image as a PIL image, through the PIL backend (the
  processor diffusers' WanImageToVideoPipeline runs when torchvision is absent), for an image
  upscaled, one downscaled by less than 2 and one by more than 3 (PIL widens its filter then).
Every weight is random (layer norms too, which transformers initializes to 1).
"""
import argparse
import os

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import CLIPVisionConfig, CLIPVisionModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

IMAGES = {"upscaled": (30, 45), "downscaled": (61, 50), "wide": (150, 200)}  # (height, width)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/clip_vision")
    args = parser.parse_args()
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                              num_channels=3, image_size=42, patch_size=14, hidden_act="gelu", layer_norm_eps=1e-5,
                              projection_dim=16)
    torch.manual_seed(7)
    model = CLIPVisionModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name or "layrnorm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(parameter.shape))
            else:
                parameter.copy_(torch.randn(parameter.shape) / max(parameter[0].numel(), 1) ** 0.5)
    model.save_pretrained(args.out, safe_serialization=True)

    tensors = {}
    pixel_values = torch.randn(2, 3, 42, 42)
    tensors["pixel_values"] = pixel_values
    with torch.no_grad():
        double = model.double()
        tensors["hidden_states"] = double(pixel_values.double(), output_hidden_states=True).hidden_states[-2].float()
        double.config.hidden_act = "quick_gelu"
        quick = CLIPVisionModel(double.config).double().eval()
        quick.load_state_dict(double.state_dict())
        tensors["hidden_states_quick_gelu"] = quick(pixel_values.double(),
                                                    output_hidden_states=True).hidden_states[-2].float()

    processor = CLIPImageProcessorPil(size={"shortest_edge": 42}, crop_size={"height": 42, "width": 42})
    rng = np.random.default_rng(3)
    for name, (height, width) in IMAGES.items():
        # Noise over a gradient: clipping and rounding both happen in PIL's 8-bit passes.
        gradient = np.linspace(0, 200, width)[None, :, None] + np.linspace(0, 55, height)[:, None, None]
        image = np.clip(gradient + rng.normal(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)
        tensors[f"image_{name}"] = torch.from_numpy(image)
        pixels = processor(images=Image.fromarray(image), return_tensors="pt")["pixel_values"]
        tensors[f"pixels_{name}"] = pixels.float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(args.out, "io.safetensors"))


if __name__ == "__main__":
    main()
