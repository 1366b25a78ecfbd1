#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/images/: small PNG and JPEG files in the colour layouts users
send (RGB, gray, palette, RGBA with transparent pixels, CMYK JPEG) and what PIL decodes each to
after Image.convert("RGB") (diffusers' load_image), in expected.safetensors (uint8 H x W x 3, keyed
by file name with the dot as underscore).

    python scripts/make_image_fixture.py
"""
import os

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "diffusion", "images")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261128)
    # Smooth content (JPEG's DCT round-trips it closely) with some noise.
    y, x = np.mgrid[0:24, 0:40]
    rgb = np.stack([x * 6, y * 10, (x + y) * 4], axis=-1) + rng.integers(0, 20, size=(24, 40, 3))
    rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    rgba = np.concatenate([rgb, rng.integers(0, 256, size=(24, 40, 1), dtype=np.uint8)], axis=-1)
    rgba[:4, :4, 3] = 0  # fully transparent corner: PIL keeps its colours
    images = {
        "rgb.png": Image.fromarray(rgb),
        "rgba.png": Image.fromarray(rgba, "RGBA"),
        "gray.png": Image.fromarray(rgb[..., 0]),
        "palette.png": Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=16),
        "rgb.jpg": Image.fromarray(rgb),
        "gray.jpg": Image.fromarray(rgb[..., 1]),
        "cmyk.jpg": Image.fromarray(rgb).convert("CMYK"),
    }
    expected = {}
    for name, image in images.items():
        path = os.path.join(OUT, name)
        image.save(path, quality=90) if name.endswith(".jpg") else image.save(path)
        decoded = Image.open(path)
        if decoded.mode != "CMYK":
            expected[name.replace(".", "_")] = torch.from_numpy(np.asarray(decoded.convert("RGB")).copy())
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
