"""tessel.WanPipeline on tiny random Wan model directories (CPU): output shapes and determinism, the
same latents as `tessel generate` bit for bit (one expert, and Wan 2.2's two experts with
guidance_scale_2 and a low-noise sparse config), and errors naming the argument."""
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tessel
from tessel.testing import write_random_wan_model

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = REPO_ROOT / "build" / "bin" / "tessel"
# Small enough that a generation takes well under a second on one core.
SMALL = dict(height=64, width=64, num_inference_steps=4, guidance_scale=5.0)
LOW_NOISE_SPARSE = {"pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.25},
                    "geometry": {"block_q": 2, "block_kv": 2}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan_models")
    paths = {}
    for preset in ("tiny", "tiny-a14b"):
        paths[preset] = root / preset
        assert write_random_wan_model(paths[preset], preset, seed=11) == 0
    return paths


@pytest.fixture(scope="module")
def pipe(models):
    return tessel.WanPipeline.from_pretrained(models["tiny"], device="cpu", num_threads=1)


def read_safetensors(path: Path, name: str) -> np.ndarray:
    """One float32 tensor of a safetensors file: 8-byte little-endian header length, JSON header, data."""
    data = path.read_bytes()
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_length])
    entry = header[name]
    assert entry["dtype"] == "F32"
    begin, end = entry["data_offsets"]
    start = 8 + header_length
    return np.frombuffer(data[start + begin:start + end], dtype=np.float32).reshape(entry["shape"])


def test_properties(pipe, models):
    assert pipe.task == "t2v"
    assert not pipe.two_experts
    assert pipe.vae_spatial_stride == 8
    assert pipe.device == "cpu"
    two = tessel.WanPipeline.from_pretrained(models["tiny-a14b"], load_vae=False, load_text_encoder=False)
    assert two.two_experts and two.task == "t2v"


def test_output_types_and_seeds(pipe):
    frames = pipe("a cat walking", negative_prompt="", num_frames=5, seed=42, output_type="np", **SMALL)
    assert frames.dtype == np.uint8 and frames.shape == (5, 64, 64, 3)
    latents = pipe("a cat walking", num_frames=5, seed=42, output_type="latent", **SMALL)
    assert latents.dtype == np.float32 and latents.shape == (1, 16, 2, 8, 8)
    assert np.isfinite(latents).all()
    assert pipe.last_info["steps_done"] == 4 and not pipe.last_info["cancelled"]
    again = pipe("a cat walking", num_frames=5, seed=42, output_type="latent", **SMALL)
    assert np.array_equal(latents, again)
    assert np.array_equal(frames, pipe("a cat walking", num_frames=5, seed=42, **SMALL))
    other = pipe("a cat walking", num_frames=5, seed=43, output_type="latent", **SMALL)
    assert not np.array_equal(latents, other)


def test_embeddings_and_noise(pipe):
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((1, 8, 32), dtype=np.float32)
    negative = rng.standard_normal((1, 8, 32), dtype=np.float32)
    noise = rng.standard_normal((1, 16, 1, 8, 8), dtype=np.float32)
    kwargs = dict(prompt_embeds=embeds, negative_prompt_embeds=negative, num_frames=1, output_type="latent", **SMALL)
    first = pipe(noise=noise, seed=1, **kwargs)
    # Given noise replaces the seed's.
    assert np.array_equal(first, pipe(noise=noise, seed=2, **kwargs))
    assert not np.array_equal(first, pipe(seed=1, **kwargs))
    with pytest.raises(tessel.TesselError, match="negative_prompt_embeds"):
        pipe(prompt_embeds=embeds, num_frames=1, **SMALL)
    with pytest.raises(tessel.TesselError, match="noise"):
        pipe(noise=noise[:, :, :, :4], seed=1, **kwargs)


def run_cli_generate(model: Path, out: Path, extra: list) -> np.ndarray:
    command = [str(CLI), "generate", "--model", str(model), "--prompt", "a red cube", "--seed", "3", "--guidance", "5",
               "--size", "64x64", "--frames", "1", "--steps", "4", "--threads", "1", "--out", str(out), *extra]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return read_safetensors(out, "latents")


@pytest.mark.skipif(not CLI.is_file(), reason=f"the tessel CLI is not built at {CLI} (make builds it)")
@pytest.mark.parametrize("preset", ["tiny", "tiny-a14b"])
def test_latents_equal_tessel_generate(models, tmp_path, preset):
    model = models[preset]
    if preset == "tiny":
        cli_flags, load, call = [], {}, {}
    else:  # the low-noise expert's guidance and sparse config reach it the same way from both doors
        cli_flags = ["--guidance-2", "2.5", "--sparse-attn-config-2", json.dumps(LOW_NOISE_SPARSE)]
        load = dict(sparse_attention_2=LOW_NOISE_SPARSE, sparse_layout_size=(1, 64, 64))
        call = dict(guidance_scale_2=2.5)
    expected = run_cli_generate(model, tmp_path / "cli.safetensors", cli_flags)
    pipe = tessel.WanPipeline.from_pretrained(model, device="cpu", num_threads=1, load_vae=False, **load)
    latents = pipe("a red cube", num_frames=1, seed=3, output_type="latent", **SMALL, **call)
    assert latents.shape == expected.shape
    assert latents.tobytes() == expected.tobytes()
    if preset == "tiny-a14b":
        assert set(pipe.last_info["experts"]) == {0, 1}


def test_errors_name_the_argument(pipe, models, tmp_path):
    with pytest.raises(tessel.TesselError, match="guidance_scale_2: expected unset"):
        pipe("a cat", num_frames=1, guidance_scale_2=2.5, output_type="latent", **SMALL)
    with pytest.raises(tessel.TesselError, match="height: expected a multiple of 16"):
        pipe("a cat", num_frames=1, height=72, width=64, num_inference_steps=1)
    with pytest.raises(tessel.TesselError, match="width"):
        pipe("a cat", num_frames=1, height=64, width=40, num_inference_steps=1)
    with pytest.raises(tessel.TesselError, match="num_frames"):
        pipe("a cat", num_frames=4, height=64, width=64, num_inference_steps=1)
    with pytest.raises(tessel.TesselError, match="num_inference_steps"):
        pipe("a cat", num_frames=1, height=64, width=64, num_inference_steps=0)
    with pytest.raises(tessel.TesselError, match="prompt"):
        pipe(num_frames=1, **SMALL)
    with pytest.raises(ValueError, match="output_type"):
        pipe("a cat", num_frames=1, output_type="pil", **SMALL)
    with pytest.raises(tessel.TesselError, match="model directory"):
        tessel.WanPipeline.from_pretrained(tmp_path / "missing")
    with pytest.raises(tessel.TesselError, match="transformer_2"):
        tessel.WanPipeline.from_pretrained(models["tiny"], sparse_attention_2=LOW_NOISE_SPARSE)
    with pytest.raises(tessel.TesselError, match="sparse_attention"):
        tessel.WanPipeline.from_pretrained(models["tiny"], sparse_attention='{"no_such_key": 1}')
    with pytest.raises(tessel.TesselError, match="cache"):
        tessel.WanPipeline.from_pretrained(models["tiny"], cache="nope")
    with pytest.raises(tessel.TesselError, match="device"):
        tessel.WanPipeline.from_pretrained(models["tiny"], device="tpu")


def write_f32_safetensors(path: Path, tensors: dict) -> None:
    """float32 arrays by name as a safetensors file."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_diff_lora(model: Path, path: Path, scale: float = 0.05) -> None:
    """A LightX2V-style weight diff of the first block's self-attention query and a kohya-style
    low-rank pair on its FFN output, sized from the model's config.json."""
    config = json.loads((model / "transformer" / "config.json").read_text())
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    rng = np.random.default_rng(5)
    tensors = {
        "diffusion_model.blocks.0.self_attn.q.diff": scale * rng.standard_normal((dim, dim), dtype=np.float32),
        "lora_unet_blocks_0_ffn_2.lora_down.weight": rng.standard_normal((2, config["ffn_dim"]), dtype=np.float32),
        "lora_unet_blocks_0_ffn_2.lora_up.weight": scale * rng.standard_normal((dim, 2), dtype=np.float32),
    }
    write_f32_safetensors(path, tensors)


def test_loras_merge_at_load_and_load_lora_reloads(pipe, models, tmp_path):
    lora = tmp_path / "lora.safetensors"
    write_diff_lora(models["tiny"], lora)
    call = dict(num_frames=1, seed=3, output_type="latent", **SMALL)
    plain = pipe("a red cube", **call)
    merged_pipe = tessel.WanPipeline.from_pretrained(models["tiny"], num_threads=1, load_vae=False, loras=[(lora, 0.5)])
    merged = merged_pipe("a red cube", **call)
    assert not np.array_equal(plain, merged)
    assert len(merged_pipe.lora_summary) == 1 and "2 modules" in merged_pipe.lora_summary[0]
    reloaded = tessel.WanPipeline.from_pretrained(models["tiny"], num_threads=1, load_vae=False)
    reloaded.load_lora(lora, 0.5)
    assert reloaded("a red cube", **call).tobytes() == merged.tobytes()
    if CLI.is_file():  # the CLI's --lora is the same door
        expected = run_cli_generate(models["tiny"], tmp_path / "cli.safetensors", ["--lora", f"{lora}:0.5"])
        assert expected.tobytes() == merged.tobytes()
    with pytest.raises(TypeError, match="loras"):
        tessel.WanPipeline.from_pretrained(models["tiny"], loras=str(lora))
    with pytest.raises(tessel.TesselError, match="loras_2"):
        tessel.WanPipeline.from_pretrained(models["tiny"], loras_2=[lora])
    other = tmp_path / "other.safetensors"  # a safetensors file of something else
    text = json.dumps({"latents": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    other.write_bytes(struct.pack("<Q", len(text)) + text + b"\0\0\0\0")
    with pytest.raises(tessel.TesselError, match="no key matched"):
        reloaded.load_lora(other)
    assert reloaded("a red cube", **call).tobytes() == merged.tobytes()  # a failed load_lora left it as it was


def test_lora_adapters_apply_per_call_unmerged(pipe, models, tmp_path):
    """A call naming an adapter kept unmerged (lora_adapters) gives what the same call gives from a
    pipeline that merged it (the same sums in another order: fp32 rounding), and no name, the plain
    model; a full diff only merges, and unknown names are errors naming the argument."""
    config = json.loads((models["tiny"] / "transformer" / "config.json").read_text())
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    rng = np.random.default_rng(7)
    tensors = {"lora_unet_blocks_0_ffn_2.lora_down.weight": rng.standard_normal((2, config["ffn_dim"]), dtype=np.float32),
               "lora_unet_blocks_0_ffn_2.lora_up.weight": 0.05 * rng.standard_normal((dim, 2), dtype=np.float32)}
    lora = tmp_path / "pair.safetensors"
    write_f32_safetensors(lora, tensors)
    call = dict(num_frames=1, seed=3, output_type="latent", **SMALL)
    adapters = tessel.WanPipeline.from_pretrained(models["tiny"], num_threads=1, load_vae=False, lora_adapters={"style": (lora, 0.5)})
    merged = tessel.WanPipeline.from_pretrained(models["tiny"], num_threads=1, load_vae=False, loras=[(lora, 0.5)])("a red cube", **call)
    unmerged = adapters("a red cube", lora="style", **call)
    assert np.linalg.norm(unmerged - merged) <= 1e-5 * np.linalg.norm(merged)
    plain = pipe("a red cube", **call)
    assert np.linalg.norm(unmerged - plain) > 1e-3 * np.linalg.norm(plain)
    assert adapters("a red cube", **call).tobytes() == plain.tobytes()
    assert any("style" in line for line in adapters.lora_summary)
    with pytest.raises(tessel.TesselError, match="lora"):
        adapters("a red cube", lora="nope", **call)
    with pytest.raises(tessel.TesselError, match="lora"):
        pipe("a red cube", lora="style", **call)
    diff = tmp_path / "diff.safetensors"
    write_diff_lora(models["tiny"], diff)
    with pytest.raises(tessel.TesselError, match=r"diff\.safetensors.*self_attn\.q\.diff"):
        tessel.WanPipeline.from_pretrained(models["tiny"], load_vae=False, lora_adapters={"fast": diff})
    with pytest.raises(TypeError, match="lora_adapters"):
        tessel.WanPipeline.from_pretrained(models["tiny"], lora_adapters=[lora])
