"""tessel.WanPipeline image to video on the committed diffusers fixture (tests/fixtures/diffusion/wan21_i2v/,
scripts/make_i2v_pipeline_fixture.py): the latents diffusers' WanImageToVideoPipeline reaches from the
same noise, embeddings and images (Wan 2.1 I2V and FLF2V), images as numpy or PIL, and errors naming
the argument."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

import tessel

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "diffusion" / "wan21_i2v"
_DTYPES = {"F32": np.float32, "U8": np.uint8}


def read_safetensors(path: Path) -> dict:
    """Every F32 or U8 tensor of a safetensors file: 8-byte little-endian header length, JSON header, data."""
    data = path.read_bytes()
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_length])
    start = 8 + header_length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(data[start + begin:start + end], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def generate(pipe, io, **images):
    return pipe(prompt_embeds=io["prompt_embeds"], negative_prompt_embeds=io["negative_prompt_embeds"], noise=io["noise"],
                height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0, output_type="latent", **images)


@pytest.mark.parametrize("layout", ["i2v", "flf2v"])
def test_latents_match_diffusers(layout):
    directory = FIXTURES / layout
    io = read_safetensors(directory / "io.safetensors")
    pipe = tessel.WanPipeline.from_pretrained(directory, load_text_encoder=False, num_threads=1)
    assert pipe.task == "i2v"
    images = {"image": io["image"]}
    if layout == "flf2v":
        images["last_image"] = io["last_image"]
    latents = generate(pipe, io, **images)
    expected = io["latents"][-1]
    error = np.linalg.norm(latents - expected) / np.linalg.norm(expected)
    assert error <= 1e-5, error


def test_pil_images_are_converted_as_diffusers_loads_them():
    pil = pytest.importorskip("PIL.Image")
    directory = FIXTURES / "i2v"
    io = read_safetensors(directory / "io.safetensors")
    pipe = tessel.WanPipeline.from_pretrained(directory, load_text_encoder=False, num_threads=1)
    from_array = generate(pipe, io, image=io["image"])
    # An RGBA image: convert("RGB") drops the alpha, so the latents are the RGB array's.
    rgba = np.concatenate([io["image"], np.full(io["image"].shape[:2] + (1,), 7, np.uint8)], axis=2)
    from_pil = generate(pipe, io, image=pil.fromarray(rgba, "RGBA"))
    np.testing.assert_array_equal(from_array, from_pil)


def test_bad_images_name_the_argument():
    directory = FIXTURES / "i2v"
    io = read_safetensors(directory / "io.safetensors")
    pipe = tessel.WanPipeline.from_pretrained(directory, load_text_encoder=False, num_threads=1)
    with pytest.raises(tessel.TesselError, match="image"):
        generate(pipe, io)  # an image-to-video model without an image
    with pytest.raises(TypeError, match="image"):
        generate(pipe, io, image=io["image"].astype(np.float32))
    with pytest.raises(TypeError, match="last_image"):
        generate(pipe, io, image=io["image"], last_image=io["image"][..., :2])
    with pytest.raises(tessel.TesselError, match="last_image"):
        generate(pipe, io, image=io["image"], last_image=io["image"])  # Wan 2.1 I2V's branch takes one image
