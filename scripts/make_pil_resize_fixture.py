#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/pil_resize.safetensors: a random 8-bit RGB image (23 x 37) and
Pillow's Image.resize of it with LANCZOS and BICUBIC, upscaled (40 x 64), downscaled (9 x 16) and
one axis each way (40 x 16: Pillow 13 runs some other mixed resizes vertical pass first),
the sizes and filters tessel's resize_pil reproduces byte for byte.

    python scripts/make_pil_resize_fixture.py
"""
import os

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "diffusion", "pil_resize.safetensors")


def main() -> None:
    rng = np.random.default_rng(20261128)
    image = rng.integers(0, 256, size=(23, 37, 3), dtype=np.uint8)
    tensors = {"image": torch.from_numpy(image.copy())}
    for name, resample in (("lanczos", Image.LANCZOS), ("bicubic", Image.BICUBIC)):
        for label, (height, width) in (("up", (40, 64)), ("down", (9, 16)), ("mixed", (40, 16))):
            resized = np.asarray(Image.fromarray(image).resize((width, height), resample=resample))
            tensors[f"{name}_{label}"] = torch.from_numpy(resized.copy())
    save_file(tensors, OUT)
    print(f"wrote {OUT}: {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
