#!/usr/bin/env python3
"""Hostile-input sweep of the `tessel` generation commands.

The second part of hostile_sweep.py (same case table format, same classes, same runner: it imports
them): careless or malicious command lines against the commands added since that sweep, `generate`,
`init-model`, `dit-bench`, `sp-bench`, `vae-bench`, `serve`, `calibrate`, `eval --config` and
`engine-worker`. Every outcome falls in one class:

  clear_error     the command failed with a message naming the input (expected)
  correct         the command succeeded and its output passed the case's check (expected)
  crash           killed by a signal, or a sanitizer report
  hang            did not finish within the timeout
  silent          a bad input was accepted (exit 0), or a good-looking run printed nan/inf or
                  wrote a bad result
  vague           failed, but the message does not name the input (or is an internal error)
  false_error     a valid input was refused

What it covers: valid runs on the tiny models of `tessel init-model --preset tiny` and `tiny-a14b`
(each well under a second on one thread; the generate runs check the latents file they write), bad
numbers for every numeric flag, bad WxH sizes and FxHxW grids, comma lists with empty elements,
options that only mean something next to another one given alone, TESSEL_RANK without
TESSEL_WORLD_SIZE, broken model directories (invalid, deeply nested or foreign model_index.json, a
symlink loop, missing components, truncated or NaN weights), broken embeddings / noise / inputs /
latents / capture / calibration files, LoRA files in every way they can be wrong (missing, no key
matched, one key unmatched, wrong shapes, NaN, half a low-rank pair, bad PATH:SCALE), bad --out
paths and --device cuda on a machine without a GPU; the weights' flags: --transformer-file and
--transformer-2-file (missing, a directory, a symlink loop, empty, garbage, truncated, a header
without its data, foreign names, wrong shapes, a config given as weights, an empty path; FP8 files
of both layouts init-model writes, which must run), --weights, --fp8-format (alone, with bf16),
serve's --lora-adapter NAME=PATH[:SCALE] and dit-bench's --lora-rank / --lora-adapters.

`serve` is only given start-up errors, and as a guard every serve command line also names a port
this script holds open on every address (--port BUSY): a check tessel forgets then ends in "cannot
listen" (classified vague) instead of a server that stays up.

Usage: hostile_sweep_generation.py --tessel build/bin/tessel [--timeout 20] [--jobs 2]
       [--list] [--only SUBSTRING] [--verbose] [--json FILE]
Exit status 0 when every case is clear_error or correct, 1 otherwise.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).parent))
import hostile_sweep as hs  # noqa: E402
from hostile_sweep import Case  # noqa: E402

NAN, INF = float("nan"), float("inf")
# Sockets held open for the whole sweep (serve's guard port).
_HELD_SOCKETS: list[socket.socket] = []


# ---- fixtures ---------------------------------------------------------------------------------

def wave(count: int, scale: float = 1.0, phase: float = 0.0) -> list[float]:
    """Deterministic, finite, not-constant values."""
    return [scale * math.sin(0.37 * i + phase) for i in range(count)]


def tensors_bytes(tensors: dict[str, tuple[list[int], list[float]]]) -> bytes:
    """A safetensors file of F32 tensors: name -> (shape, values)."""
    header: dict = {}
    blobs, offset = [], 0
    for name, (shape, values) in tensors.items():
        assert len(values) == math.prod(shape), name
        blob = hs.f32(values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    return hs.safetensors_bytes(header, b"".join(blobs))


def read_f32_tensor(path: Path, name: str) -> tuple[list[int], list[float]]:
    raw = path.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8:8 + header_len])[name]
    if entry["dtype"] != "F32":
        raise ValueError(f"{name} is {entry['dtype']}, not F32")
    begin, end = entry["data_offsets"]
    data = raw[8 + header_len + begin:8 + header_len + end]
    return entry["shape"], list(struct.unpack(f"<{len(data) // 4}f", data))


def latents_check(path: Path, shape: list[int], baseline: Optional[Path] = None,
                  differs: bool = True) -> Callable[[str], Optional[str]]:
    """ok check: `path` holds finite latents of `shape`; with `baseline`, they differ from (or equal)
    the baseline run's."""
    def check(stdout: str) -> Optional[str]:
        if complaint := hs.no_nonfinite(stdout):
            return complaint
        try:
            got_shape, values = read_f32_tensor(path, "latents")
        except (OSError, KeyError, ValueError, struct.error) as e:
            return f"cannot read the latents of {path.name}: {e}"
        if got_shape != shape:
            return f"latents of shape {got_shape}, expected {shape}"
        if not all(math.isfinite(v) for v in values):
            return "non-finite latents"
        if baseline is not None:
            _, base = read_f32_tensor(baseline, "latents")
            if (values != base) != differs:
                return "latents equal to the run without it" if differs else "latents differ from the run without it"
        return None
    return check


def files_check(paths: list[Path], magic: bytes) -> Callable[[str], Optional[str]]:
    """ok check: every path exists and starts with `magic`."""
    def check(stdout: str) -> Optional[str]:
        for path in paths:
            if not path.is_file() or not path.read_bytes().startswith(magic):
                return f"{path.name} missing or not a {magic!r} file"
        return hs.no_nonfinite(stdout)
    return check


def png_bytes(width: int, height: int, claimed: Optional[tuple[int, int]] = None) -> bytes:
    """An 8-bit RGB PNG of a colour ramp; `claimed` writes another size into its header."""
    import zlib
    rows = b"".join(b"\x00" + bytes((x * 7 + y * 3) % 256 for x in range(width) for _ in range(3)) for y in range(height))
    w, h = claimed or (width, height)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


I2V_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "diffusion" / "wan21_i2v"
I2V_LATENT_SHAPE = [1, 16, 2, 4, 6]  # 5 frames of 48x32 through the fixture's Wan 2.1 VAE


def generate_args(model: str, out: str) -> list[str]:
    """The valid generate run every generate case starts from (64x64, one frame, two steps)."""
    return ["--model", model, "--prompt", "a cat", "--size", "64x64", "--frames", "1", "--steps", "2",
            "--threads", "1", "--out", out]


LATENT_SHAPE = [1, 16, 1, 8, 8]  # generate_args' latents (64x64 pixels / 8, one frame)


def make_fixtures(root: Path, tessel: str) -> dict[str, str]:
    fx: dict[str, str] = {}
    put = hs.fixture_writer(root, fx)

    def tessel_run(*args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSEL_") and not k.startswith("DIFFUSION_")}
        subprocess.run([tessel, *args], cwd=root, env=env, check=True, capture_output=True, timeout=120)

    # The models, and what their configs say.
    for preset, name in (("tiny", "tiny"), ("tiny-a14b", "a14b")):
        tessel_run("init-model", "--preset", preset, "--out", str(root / name), "--threads", "1")
        fx[name] = str(root / name)
    config = json.loads((root / "tiny" / "transformer" / "config.json").read_text())
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    text_dim = config["text_dim"]
    channels = config["in_channels"]
    assert [1, channels, 1, 8, 8] == LATENT_SHAPE, "the tiny model's latent channels changed"

    # Broken model directories.
    def model_copy(name: str, source: str = "tiny") -> Path:
        path = root / name
        shutil.copytree(root / source, path)
        fx[name] = str(path)
        return path

    (root / "m_empty").mkdir()
    fx["m_empty"] = str(root / "m_empty")
    put("m_file", "not a directory")
    os.symlink("m_loop", root / "m_loop")
    fx["m_loop"] = str(root / "m_loop")
    fx["m_missing"] = str(root / "no_such_model")
    (model_copy("m_bad_json") / "model_index.json").write_text('{"_class_name": "WanPipeline", ')
    (model_copy("m_deep_json") / "model_index.json").write_text(hs.nested(100000, '{"a":', "}", "1"))
    index = json.loads((root / "tiny" / "model_index.json").read_text())
    (model_copy("m_class") / "model_index.json").write_text(json.dumps(dict(index, _class_name="StableDiffusionPipeline")))
    (model_copy("m_index_array") / "model_index.json").write_text("[1, 2]")
    path = model_copy("m_index_dir")
    (path / "model_index.json").unlink()
    (path / "model_index.json").mkdir()
    shutil.rmtree(model_copy("m_no_transformer") / "transformer")
    shutil.rmtree(model_copy("m_no_scheduler") / "scheduler")
    shutil.rmtree(model_copy("m_no_vae") / "vae")
    shutil.rmtree(model_copy("m_no_tokenizer") / "tokenizer")
    (model_copy("m_bad_tconfig") / "transformer" / "config.json").write_text(json.dumps(dict(config, num_layers=-1)))
    (model_copy("m_tconfig_heads") / "transformer" / "config.json").write_text(
        json.dumps(dict(config, num_attention_heads=3)))  # 3 x 16 = 48: the weights are 32 wide
    weights = root / "m_truncated" / "transformer" / "diffusion_pytorch_model.safetensors"
    model_copy("m_truncated")
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    weights = root / "m_nan_weights" / "transformer" / "diffusion_pytorch_model.safetensors"
    model_copy("m_nan_weights")
    raw = bytearray(weights.read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    entry = json.loads(raw[8:8 + header_len])["blocks.0.attn1.to_q.weight"]
    begin = 8 + header_len + entry["data_offsets"][0]
    raw[begin + 8:begin + 12] = struct.pack("<f", NAN)
    weights.write_bytes(bytes(raw))
    a14b_index = json.loads((root / "a14b" / "model_index.json").read_text())
    (model_copy("m_no_ratio", "a14b") / "model_index.json").write_text(
        json.dumps({k: v for k, v in a14b_index.items() if k != "boundary_ratio"}))
    (model_copy("m_ratio_2", "a14b") / "model_index.json").write_text(json.dumps(dict(a14b_index, boundary_ratio=2)))

    # Images for image to video (the committed diffusers fixture models take them).
    put("img_good.png", png_bytes(40, 30))
    put("img_claims_huge.png", png_bytes(4, 4, claimed=(100000, 100000)))
    put("img_truncated.png", png_bytes(40, 30)[:60])
    put("img_empty.png", b"")
    put("img_gif.png", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")
    put("img_jpeg_header_only.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")

    # The generate run every LoRA case is compared with.
    fx["baseline"] = str(root / "baseline.safetensors")
    tessel_run("generate", *generate_args(fx["tiny"], fx["baseline"]))

    # Text embeddings (1, L, text_dim), starting noise (the latents' shape).
    emb = lambda tokens, dim_=text_dim: ([1, tokens, dim_], wave(tokens * dim_, 0.5))  # noqa: E731
    put("emb_good.safetensors", tensors_bytes({"prompt_embeds": emb(8), "negative_prompt_embeds": emb(8)}))
    put("emb_positive_only.safetensors", tensors_bytes({"prompt_embeds": emb(8)}))
    put("emb_names.safetensors", tensors_bytes({"prompt": emb(8), "negative": emb(8)}))
    nan_emb = emb(8)
    nan_emb[1][17] = NAN
    put("emb_nan.safetensors", tensors_bytes({"prompt_embeds": nan_emb, "negative_prompt_embeds": emb(8)}))
    put("emb_empty.safetensors", tensors_bytes({"prompt_embeds": emb(0), "negative_prompt_embeds": emb(0)}))
    put("emb_dim.safetensors", tensors_bytes({"prompt_embeds": emb(8, 16), "negative_prompt_embeds": emb(8, 16)}))
    put("emb_rank2.safetensors", tensors_bytes({"prompt_embeds": ([8, text_dim], wave(8 * text_dim)),
                                                "negative_prompt_embeds": ([8, text_dim], wave(8 * text_dim))}))
    put("emb_batch2.safetensors", tensors_bytes({"prompt_embeds": ([2, 8, text_dim], wave(16 * text_dim)),
                                                 "negative_prompt_embeds": ([2, 8, text_dim], wave(16 * text_dim))}))
    put("emb_lengths.safetensors", tensors_bytes({"prompt_embeds": emb(8), "negative_prompt_embeds": emb(4)}))
    put("not_safetensors.safetensors", "this is a text file, not safetensors\n")
    latent_count = math.prod(LATENT_SHAPE)
    put("noise_good.safetensors", tensors_bytes({"noise": (LATENT_SHAPE, wave(latent_count))}))
    put("noise_shape.safetensors", tensors_bytes({"noise": ([1, channels, 1, 4, 4], wave(channels * 16))}))
    put("noise_name.safetensors", tensors_bytes({"latents": (LATENT_SHAPE, wave(latent_count))}))
    put("noise_nan.safetensors", tensors_bytes({"noise": (LATENT_SHAPE, wave(latent_count)[:-1] + [NAN])}))
    put("noise_inf.safetensors", tensors_bytes({"noise": (LATENT_SHAPE, [INF] + wave(latent_count)[1:])}))

    # dit-bench --inputs and vae-bench --latents.
    hidden = (LATENT_SHAPE, wave(latent_count))
    text = ([1, 8, text_dim], wave(8 * text_dim, 0.5))
    put("inputs_good.safetensors", tensors_bytes({"hidden_states": hidden, "timestep": ([1], [500.0]), "encoder_hidden_states": text}))
    put("inputs_no_timestep.safetensors", tensors_bytes({"hidden_states": hidden, "encoder_hidden_states": text}))
    put("inputs_nan.safetensors", tensors_bytes({"hidden_states": (LATENT_SHAPE, [NAN] + hidden[1][1:]), "timestep": ([1], [500.0]),
                                                 "encoder_hidden_states": text}))
    put("inputs_timestep_nan.safetensors", tensors_bytes({"hidden_states": hidden, "timestep": ([1], [NAN]),
                                                          "encoder_hidden_states": text}))
    put("inputs_channels.safetensors", tensors_bytes({"hidden_states": ([1, 8, 1, 8, 8], wave(512)), "timestep": ([1], [500.0]),
                                                      "encoder_hidden_states": text}))
    put("inputs_text_dim.safetensors", tensors_bytes({"hidden_states": hidden, "timestep": ([1], [500.0]),
                                                      "encoder_hidden_states": ([1, 8, 7], wave(56))}))
    put("latents_good.safetensors", tensors_bytes({"latents": hidden}))
    put("latents_nan.safetensors", tensors_bytes({"latents": (LATENT_SHAPE, hidden[1][:-1] + [NAN])}))
    put("latents_zdim.safetensors", tensors_bytes({"latents": ([1, 8, 1, 8, 8], wave(512))}))
    put("latents_rank4.safetensors", tensors_bytes({"latents": ([16, 1, 8, 8], wave(1024))}))
    put("latents_name.safetensors", tensors_bytes({"noise": hidden}))

    # LoRA files: a LightX2V full diff and a kohya low-rank pair on blocks.0.self_attn.q, and broken ones.
    diff_key = "diffusion_model.blocks.0.self_attn.q.diff"
    diff = ([dim, dim], wave(dim * dim, 0.05))
    kohya = "lora_unet_blocks_0_self_attn_q"
    down, up = ([4, dim], wave(4 * dim, 0.1)), ([dim, 4], wave(4 * dim, 0.1, 1.0))
    put("lora_diff.safetensors", tensors_bytes({diff_key: diff}))
    put("lora_kohya.safetensors", tensors_bytes({f"{kohya}.lora_down.weight": down, f"{kohya}.lora_up.weight": up,
                                                 f"{kohya}.alpha": ([], [4.0])}))
    put("lora_peft.safetensors", tensors_bytes({"transformer.blocks.1.attn1.to_v.lora_A.weight": down,
                                                "transformer.blocks.1.attn1.to_v.lora_B.weight": up}))
    put("lora_nomatch.safetensors", tensors_bytes({"text_model.encoder.layers.0.q.weight": ([2, 2], [1.0, 2.0, 3.0, 4.0])}))
    put("lora_unmatched.safetensors", tensors_bytes({diff_key: diff, "diffusion_model.blocks.0.frobnicate.diff": diff}))
    put("lora_block9.safetensors", tensors_bytes({diff_key: diff, "diffusion_model.blocks.9.self_attn.q.diff": diff}))
    put("lora_shape.safetensors", tensors_bytes({diff_key: ([dim // 2, dim // 2], wave(dim * dim // 4, 0.05))}))
    put("lora_nan.safetensors", tensors_bytes({diff_key: (diff[0], diff[1][:-1] + [NAN])}))
    put("lora_half.safetensors", tensors_bytes({f"{kohya}.lora_down.weight": down}))
    put("lora_rank.safetensors", tensors_bytes({f"{kohya}.lora_down.weight": down,
                                                f"{kohya}.lora_up.weight": ([dim, 2], wave(2 * dim, 0.1))}))
    put("lora_alpha_nan.safetensors", tensors_bytes({f"{kohya}.lora_down.weight": down, f"{kohya}.lora_up.weight": up,
                                                     f"{kohya}.alpha": ([], [NAN])}))
    put("lora_empty.safetensors", tensors_bytes({}))
    (root / "lora_dir").mkdir()
    fx["lora_dir"] = str(root / "lora_dir")
    fx["lora_colon"] = put("lora:colon.safetensors", tensors_bytes({diff_key: diff}))

    # calibrate / eval --config: q/k/v captures, and configs of `tessel calibrate --out`.
    for i in range(3):
        hs.qkv_file(root / f"cap{i}.safetensors", seq=64, heads=2, dim=16)
        fx[f"cap{i}"] = str(root / f"cap{i}.safetensors")
    hs.qkv_file(root / "cap_nan.safetensors", seq=64, heads=2, dim=16, poison=("k", 9, NAN))
    hs.qkv_file(root / "cap_heads3.safetensors", seq=64, heads=3, dim=16)
    hs.qkv_file(root / "cap_seq32.safetensors", seq=32, heads=2, dim=16)
    for name in ("cap_nan", "cap_heads3", "cap_seq32"):
        fx[name] = str(root / f"{name}.safetensors")
    fx["cal_synth.json"] = str(root / "cal_synth.json")
    tessel_run("calibrate", "--grid", "2x8x8", "--synthetic-layers", "2", "--heads", "2", "--head-dim", "32", "--block-q", "16",
               "--block-kv", "16", "--iterations", "3", "--threads", "1", "--out", fx["cal_synth.json"])
    fx["cal_layers.json"] = str(root / "cal_layers.json")
    tessel_run("calibrate", "--layer", fx["cap0"] + "," + fx["cap1"], "--layer", fx["cap1"], "--block-q", "16", "--block-kv", "16",
               "--iterations", "3", "--threads", "1", "--out", fx["cal_layers.json"])
    cal = json.loads(Path(fx["cal_synth.json"]).read_text())
    with_layer = lambda **change: dict(cal, layers=[dict(cal["layers"][0], **change)] + cal["layers"][1:])  # noqa: E731
    sparse = cal["layers"][0]["sparse_attn"]
    with_per_head = lambda value: with_layer(sparse_attn=dict(sparse, options=dict(sparse["options"], per_head=value)))  # noqa: E731
    put("cal_no_layers.json", json.dumps(dict(cal, layers=[])))
    put("cal_layers_string.json", json.dumps(dict(cal, layers="all")))
    put("cal_per_head_3.json", json.dumps(with_per_head("0.5,0.5,0.5")))  # the captures have 2 heads
    put("cal_per_head_str.json", json.dumps(with_per_head("abc,0.5")))
    put("cal_per_head_big.json", json.dumps(with_per_head("7.5,0.5")))
    put("cal_per_head_empty.json", json.dumps(with_per_head("0.5,,0.5")))
    put("cal_sparse_missing.json", json.dumps(with_layer(sparse_attn=None)))
    put("cal_sparse_bogus.json", json.dumps(with_layer(sparse_attn={"pattern": {"type": "bogus"}})))
    put("cal_target.json", json.dumps(dict(cal, target=-1)))
    put("cal_metric.json", json.dumps(dict(cal, metric="psnr")))
    put("cal_heads.json", json.dumps(dict(cal, shape=dict(cal["shape"], heads=0))))
    put("cal_deep.json", '{"layers": ' + hs.nested(100000) + "}")
    put("cal_bad.json", '{"layers": [')
    put("cal_empty_object.json", "{}")
    put("sparse_config.json", '{"pattern_type": "radial"}')
    (root / "cal_dir.json").mkdir()
    fx["cal_dir.json"] = str(root / "cal_dir.json")

    # Paths to write to that cannot be written, a directory named like an output.
    (root / "outdir.safetensors").mkdir()
    fx["outdir.safetensors"] = str(root / "outdir.safetensors")
    (root / "init_existing_dir").mkdir()
    (root / "init_existing_dir" / "notes.txt").write_text("someone's file")
    fx["init_existing_dir"] = str(root / "init_existing_dir")

    # Weight files for --transformer-file, --transformer-2-file and --lora-adapter: FP8 files in both
    # layouts init-model writes, and broken ones (each named after what is wrong with it).
    for layout in ("lightx2v", "comfyui"):
        tessel_run("init-model", "--preset", "tiny", "--out", str(root / f"fp8_{layout}"), "--threads", "1", "--weights", "fp8",
                   "--fp8-format", layout)
        fx[f"fp8_{layout}"] = str(root / f"fp8_{layout}" / f"transformer_fp8_{layout}.safetensors")
    weights_bytes = (root / "tiny" / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()
    put("w_empty.safetensors", b"")
    put("w_garbage.safetensors", b"garbage, not a safetensors file\n" * 4)
    put("w_truncated.safetensors", weights_bytes[:len(weights_bytes) // 2])
    put("w_header_only.safetensors", weights_bytes[:100])
    put("w_other_names.safetensors", tensors_bytes({"some.other.weight": ([2, 2], [1.0, 2.0, 3.0, 4.0])}))
    put("w_wrong_shape.safetensors", tensors_bytes({"blocks.0.self_attn.q.weight": ([2, 2], [1.0, 2.0, 3.0, 4.0])}))
    (root / "w_dir.safetensors").mkdir()
    fx["w_dir.safetensors"] = str(root / "w_dir.safetensors")
    os.symlink("w_loop.safetensors", root / "w_loop.safetensors")
    fx["w_loop.safetensors"] = str(root / "w_loop.safetensors")

    # serve's guard: a port this process listens on, on every address (IPv6 and IPv4 where the
    # machine has both), so that tessel's own bind fails on it whatever --host says.
    try:
        busy = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            busy.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            busy.bind(("::", 0))
        except OSError:
            busy.close()
            raise
    except OSError:  # no IPv6 here
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    _HELD_SOCKETS.append(busy)
    fx["busy_port"] = str(busy.getsockname()[1])
    return fx


# ---- the case table ---------------------------------------------------------------------------

def build_cases(fx: dict[str, str], root: Path) -> list[Case]:
    cases: list[Case] = []
    out_dir = root / "out"
    out_dir.mkdir(exist_ok=True)
    outputs = iter(range(1, 10**6))

    def out(suffix: str = ".safetensors") -> Path:
        """A fresh output path, so that runs in parallel never share one."""
        return out_dir / f"run{next(outputs)}{suffix}"

    def ok(name: str, args: list[str], check=None, env=None) -> None:
        cases.append(Case(name, args, "ok", check=check, env=env or {}))

    def err(name: str, args: list[str], names: list[str], env=None) -> None:
        cases.append(Case(name, args, "error", names, env=env or {}))

    def either(name: str, args: list[str], names: list[str], check=None) -> None:
        cases.append(Case(name, args, "either", names, check=check))

    def opts(command: str, base: list[str], option: str, values: list[str], names: Optional[list[str]] = None) -> None:
        cases.extend(hs.option_cases(command, base, option, values, names))

    def short(value: str) -> str:
        """A value for a case name: paths in the temporary folder without it (names stay the same between runs)."""
        return repr(value.replace(str(root / "fixtures") + "/", "").replace(str(root) + "/", ""))[:100]

    bad_int = ["0", "-1", "abc", "1.5", "99999999999999999999", ""]
    bad_float = ["nan", "inf", "-inf", "abc", "-1", "1e308", ""]
    bad_size = ["64x", "x64", "64x64x", "0x64", "65x64", "64x64junk", "99999999x64", "", "64", "-64x64", "64X64", " 64x64",
                "1e2x64"]
    no_rank = {"TESSEL_RANK": "1"}
    rank_names = ["TESSEL_RANK", "TESSEL_WORLD_SIZE"]

    # ---- generate --------------------------------------------------------------------------
    tiny, a14b = fx["tiny"], fx["a14b"]
    baseline = Path(fx["baseline"])

    def gen(model: str = tiny, extra: Optional[list[str]] = None, suffix: str = ".safetensors",
            no_prompt: bool = False) -> tuple[list[str], Path]:
        """A generate command line writing to a fresh path (without --prompt for --embeddings)."""
        path = out(suffix)
        args = hs.merged(generate_args(model, str(path)), extra or [])
        return ["generate"] + (hs.strip_option(args, "--prompt") if no_prompt else args), path

    def gen_ok(name: str, extra: list[str], model: str = tiny, differs: Optional[bool] = None, no_prompt: bool = False) -> None:
        """A run that must write finite latents (differs: that they differ from / equal the baseline's)."""
        args, path = gen(model, extra, no_prompt=no_prompt)
        ok(name, args, latents_check(path, LATENT_SHAPE, baseline if differs is not None else None, bool(differs)))

    gbase = generate_args(tiny, str(root / "err.safetensors"))  # error cases: nothing is written
    g = lambda extra: ["generate"] + hs.merged(gbase, extra)  # noqa: E731
    gen_ok("generate baseline", [], differs=False)
    gen_ok("generate euler", ["--scheduler", "euler"])
    gen_ok("generate flow shift", ["--flow-shift", "3"])
    gen_ok("generate guidance 1", ["--guidance", "1"])
    gen_ok("generate negative prompt", ["--negative-prompt", "blurry"])
    gen_ok("generate unicode prompt", ["--prompt", "ein Kätzchen im Schnee 🐱, 夜"])
    gen_ok("generate largest seed", ["--seed", "9223372036854775807"])
    gen_ok("generate teacache", ["--steps", "3", "--cache", "teacache", "--teacache-thresh", "0.1"])
    gen_ok("generate dbcache", ["--steps", "3", "--cache", "dbcache", "--dbcache-fn", "1", "--dbcache-warmup", "1"])
    gen_ok("generate sparse dynamic_topk", ["--sparse-attn-pattern", "dynamic_topk", "--sparse-attn-topk", "0.5"])
    gen_ok("generate embeddings", ["--embeddings", fx["emb_good.safetensors"]], no_prompt=True)
    gen_ok("generate embeddings without negative at guidance 1",
           ["--embeddings", fx["emb_positive_only.safetensors"], "--guidance", "1"], no_prompt=True)
    gen_ok("generate noise file", ["--noise", fx["noise_good.safetensors"]])
    gen_ok("generate two experts", [], model=a14b)
    gen_ok("generate two experts guidance-2", ["--guidance-2", "3"], model=a14b)
    gen_ok("generate two experts sparse-attn-config-2", ["--sparse-attn-config-2", '{"pattern_type": "dynamic_topk", "topk_ratio": 0.5}'],
           model=a14b)
    gen_ok("generate lora diff", ["--lora", fx["lora_diff.safetensors"]], differs=True)
    gen_ok("generate lora kohya", ["--lora", fx["lora_kohya.safetensors"] + ":0.5"], differs=True)
    gen_ok("generate lora peft", ["--lora", fx["lora_peft.safetensors"]], differs=True)
    gen_ok("generate two loras", ["--lora", fx["lora_diff.safetensors"] + ":0.5", "--lora", fx["lora_kohya.safetensors"]], differs=True)
    gen_ok("generate lora with a colon in its name", ["--lora", fx["lora_colon"] + ":1"], differs=True)
    gen_ok("generate lora unmatched key ignored", ["--lora", fx["lora_unmatched.safetensors"], "--lora-ignore-unmatched"],
           differs=True)
    gen_ok("generate lora-2 on two experts", ["--lora-2", fx["lora_diff.safetensors"]], model=a14b)
    args, path = gen(extra=["--lora", fx["lora_diff.safetensors"] + ":0"])
    either("generate lora scale 0", args, ["--lora", "scale"], latents_check(path, LATENT_SHAPE, baseline, differs=False))
    args, path = gen(suffix=".png")
    ok("generate one png frame", args, files_check([path], b"\x89PNG"))
    args, path = gen(extra=["--frames", "5"], suffix=".png")
    ok("generate png frames", args, files_check([path.with_name(f"{path.stem}_{i:05d}.png") for i in range(5)], b"\x89PNG"))
    args, path = gen(extra=["--frames", "5"], suffix=".mp4")
    either("generate mp4 (needs libav)", args, ["--out", "mp4"], files_check([path], b""))

    # an output path that cannot be written fails before any work, naming --out
    opts("generate", gbase, "--out", [str(root / "no-such-dir" / "x.safetensors"), str(root)])

    # numbers
    for opt in ("--steps", "--frames", "--threads"):
        opts("generate", gbase, opt, bad_int)
    opts("generate", gbase, "--frames", ["2", "65537", "4101"], ["--frames", "frames"])
    opts("generate", gbase, "--steps", ["100001"])
    opts("generate", gbase, "--seed", ["-1", "abc", "9223372036854775808"])
    opts("generate", gbase, "--num-outputs", ["0", "65", "abc", "2x"])
    opts("generate", gbase, "--guidance", bad_float)
    opts("generate", gbase, "--flow-shift", ["0", "nan", "inf", "-1"])
    opts("generate", gbase, "--size", bad_size)
    opts("generate", gbase + ["--cache", "teacache"], "--teacache-thresh", ["nan", "-1", "inf", "101"])
    dbc = gbase + ["--cache", "dbcache", "--dbcache-fn", "1"]  # the tiny model has 2 blocks: Fn + Bn < 2
    opts("generate", dbc, "--dbcache-fn", ["0", "-1", "abc"])
    opts("generate", dbc, "--dbcache-fn", ["2"], ["--dbcache-fn", "Fn + Bn"])
    opts("generate", dbc, "--dbcache-bn", ["-1"])
    opts("generate", dbc, "--dbcache-bn", ["1"], ["--dbcache-bn", "Fn + Bn"])
    opts("generate", dbc, "--dbcache-thresh", ["nan", "-0.5"])
    opts("generate", dbc, "--dbcache-warmup", ["-1"])
    opts("generate", dbc, "--dbcache-max-cached", ["-2"])
    opts("generate", dbc, "--dbcache-max-consecutive", ["-2"])
    opts("generate", gbase, "--ulysses", ["0", "2"])
    opts("generate", gbase, "--ring", ["0", "2"])
    opts("generate", gbase, "--sparse-attn-topk", ["nan", "0", "1.5"])
    opts("generate", gbase, "--scheduler", ["bogus", ""])
    opts("generate", gbase, "--cache", ["bogus", ""])
    opts("generate", gbase, "--dtype", ["bf16", "fp16", ""])
    opts("generate", gbase, "--device", ["cuda", "cuda:1", "tpu", "", "cuda:-1"])
    a14b_base = hs.merged(gbase, ["--model", a14b])
    opts("generate", a14b_base, "--guidance-2", ["nan", "-1", "inf"])
    opts("generate", a14b_base, "--sparse-attn-config-2", ["{not json", '{"frobnicate": 1}'])
    opts("generate", gbase, "--sparse-attn-config", ['{"pattern_type": "radial", "spatial_layout": {"frames": 9, "height": 60, '
                                                     '"width": 104}}'], ["spatial_layout", "layout", "frames"])

    # image to video (the committed diffusers fixtures: Wan 2.1 I2V and FLF2V)
    i2v, flf2v = str(I2V_FIXTURES / "i2v"), str(I2V_FIXTURES / "flf2v")

    def i2v_args(model: str, out_path: Path, extra: list[str]) -> list[str]:
        return ["generate", "--model", model, "--embeddings", model + "/io.safetensors", "--size", "48x32", "--frames", "5",
                "--steps", "2", "--threads", "1", "--out", str(out_path)] + extra

    path = out()
    ok("generate i2v", i2v_args(i2v, path, ["--image", fx["img_good.png"]]), latents_check(path, I2V_LATENT_SHAPE))
    path = out()
    ok("generate flf2v", i2v_args(flf2v, path, ["--image", fx["img_good.png"], "--last-image", fx["img_good.png"]]),
       latents_check(path, I2V_LATENT_SHAPE))
    # Sparse attention and step caches work unchanged in image to video.
    for name, extra in (("sparse dynamic_topk", ["--sparse-attn-pattern", "dynamic_topk", "--sparse-attn-topk", "0.5"]),
                        ("teacache", ["--cache", "teacache", "--teacache-thresh", "0.1"])):
        path = out()
        ok(f"generate i2v {name}", i2v_args(i2v, path, ["--image", fx["img_good.png"]] + extra), latents_check(path, I2V_LATENT_SHAPE))
    ierr = lambda extra, model=i2v: i2v_args(model, root / "err.safetensors", extra)  # noqa: E731
    err("generate i2v without --image", ierr([]), ["--image"])
    for name in ("img_claims_huge.png", "img_truncated.png", "img_empty.png", "img_gif.png", "img_jpeg_header_only.jpg"):
        err(f"generate i2v --image {name}", ierr(["--image", fx[name]]), ["--image"])
    err("generate i2v --image missing", ierr(["--image", str(root / "no_such.png")]), ["--image"])
    err("generate i2v --image directory", ierr(["--image", str(root)]), ["--image"])
    err("generate i2v --image empty", ierr(["--image", ""]), ["--image"])
    err("generate i2v --last-image on a one-image branch", ierr(["--image", fx["img_good.png"], "--last-image", fx["img_good.png"]]),
        ["--last-image"])
    err("generate flf2v without --last-image", ierr(["--image", fx["img_good.png"]], flf2v), ["--last-image"])
    err("generate flf2v bad --last-image", ierr(["--image", fx["img_good.png"], "--last-image", fx["img_gif.png"]], flf2v),
        ["--last-image"])
    err("generate --image on a text-to-video model", g(["--image", fx["img_good.png"]]), ["--image"])
    err("generate --last-image on a text-to-video model", g(["--last-image", fx["img_good.png"]]), ["--last-image"])

    # options that need another
    err("generate teacache-thresh without teacache", g(["--teacache-thresh", "0.1"]), ["--teacache-thresh"])
    err("generate dbcache-fn without dbcache", g(["--dbcache-fn", "2"]), ["--dbcache-fn"])
    err("generate dbcache-thresh with teacache", g(["--cache", "teacache", "--dbcache-thresh", "0.2"]), ["--dbcache-thresh"])
    err("generate guidance-2 on one expert", g(["--guidance-2", "3"]), ["--guidance-2"])
    err("generate sparse-attn-config-2 on one expert", g(["--sparse-attn-config-2", "{}"]), ["--sparse-attn-config-2"])
    err("generate lora-2 on one expert", g(["--lora-2", fx["lora_diff.safetensors"]]), ["--lora-2"])
    err("generate lora-ignore-unmatched alone", g(["--lora-ignore-unmatched"]), ["--lora-ignore-unmatched"])
    err("generate cfg-parallel at guidance 1", g(["--cfg-parallel", "--guidance", "1"]), ["--cfg-parallel"])
    err("generate cfg-parallel without mpirun", g(["--cfg-parallel"]), ["--cfg-parallel", "mpirun", "processes"])
    err("generate negative prompt with embeddings",
        hs.strip_option(g(["--embeddings", fx["emb_good.safetensors"], "--negative-prompt", "x"]), "--prompt"),
        ["--negative-prompt"])
    err("generate prompt and embeddings", g(["--embeddings", fx["emb_good.safetensors"]]), ["--prompt", "--embeddings"])
    err("generate neither prompt nor embeddings", hs.strip_option(g([]), "--prompt"), ["--prompt", "--embeddings"])
    err("generate without --out", hs.strip_option(g([]), "--out"), ["--out"])
    err("generate without --model", hs.strip_option(g([]), "--model"), ["--model"])
    err("generate empty prompt", g(["--prompt", ""]), ["prompt"])
    err("generate prompt not UTF-8", g(["--prompt", "caf\udce9"]), ["--prompt", "UTF-8"])
    err("generate rank without world size", g([]), rank_names, env=no_rank)
    err("generate world size 0", g([]), rank_names, env={"TESSEL_RANK": "0", "TESSEL_WORLD_SIZE": "0"})
    err("generate rank past world size", g([]), rank_names, env={"TESSEL_RANK": "3", "TESSEL_WORLD_SIZE": "2"})
    err("generate rank not a number", g([]), rank_names, env={"TESSEL_RANK": "abc", "TESSEL_WORLD_SIZE": "1"})
    # the model directory
    for key, names in (("m_missing", ["no_such_model"]), ("m_file", ["m_file"]), ("m_empty", ["model_index.json"]),
                       ("m_loop", ["m_loop"]), ("m_bad_json", ["model_index.json"]),
                       ("m_deep_json", ["model_index.json", "depth", "nest"]), ("m_class", ["_class_name", "StableDiffusionPipeline"]),
                       ("m_index_array", ["model_index.json"]), ("m_index_dir", ["model_index.json"]),
                       ("m_no_transformer", ["transformer"]), ("m_no_scheduler", ["scheduler"]),
                       ("m_bad_tconfig", ["num_layers"]), ("m_tconfig_heads", ["shape", "num_attention_heads", "to_q"]),
                       ("m_truncated", ["diffusion_pytorch_model.safetensors"]),
                       ("m_nan_weights", ["blocks.0.attn1.to_q.weight", "non-finite", "nan"]),
                       ("m_no_ratio", ["boundary_ratio"]), ("m_ratio_2", ["boundary_ratio"])):
        err(f"generate model {key}", g(["--model", fx[key]]), names)
    err("generate model empty string", g(["--model", ""]), ["--model", "model directory"])
    err("generate png without vae", g(["--model", fx["m_no_vae"], "--out", str(root / "e.png")]), ["vae"])
    gen_ok("generate latents without vae", ["--model", fx["m_no_vae"]])
    err("generate prompt without tokenizer", g(["--model", fx["m_no_tokenizer"]]), ["tokenizer"])
    # embeddings and noise
    emb_base = ["generate"] + hs.strip_option(gbase, "--prompt")
    # Each names the file (an empty tensor used to be reported without it).
    for key in ("emb_names", "emb_nan", "emb_empty", "emb_dim", "emb_rank2", "emb_batch2", "emb_positive_only", "not_safetensors"):
        err(f"generate embeddings {key}", emb_base + ["--embeddings", fx[f"{key}.safetensors"]], [f"{key}.safetensors"])
    err("generate embeddings missing", emb_base + ["--embeddings", "/nonexistent/e.safetensors"], ["/nonexistent/e.safetensors"])
    err("generate embeddings directory", emb_base + ["--embeddings", fx["lora_dir"]], ["lora_dir"])
    err("generate embeddings empty string", emb_base + ["--embeddings", ""], ["--embeddings"])
    args, path = gen(extra=["--embeddings", fx["emb_lengths.safetensors"]])
    either("generate embeddings of two lengths", hs.strip_option(args, "--prompt"), ["negative_prompt_embeds", "length"],
           latents_check(path, LATENT_SHAPE))
    for key, names in (("noise_shape", ["noise", "shape"]), ("noise_name", ["noise"]), ("noise_nan", ["noise", "non-finite", "nan"]),
                       ("noise_inf", ["noise", "non-finite", "inf"]), ("not_safetensors", ["not_safetensors.safetensors"])):
        err(f"generate noise {key}", g([]) + ["--noise", fx[f"{key}.safetensors"]], names)
    err("generate noise missing", g([]) + ["--noise", "/nonexistent/n.safetensors"], ["/nonexistent/n.safetensors"])
    err("generate over the CPU memory budget", g(["--size", "4096x4096", "--frames", "801"]),
        ["--size 4096x4096", "--frames 801", "memory budget"])
    err("generate several outputs from one noise", g(["--num-outputs", "2", "--noise", fx["noise_good.safetensors"]]),
        ["--num-outputs", "--noise"])
    err("generate noise for another size", g(["--size", "32x32", "--noise", fx["noise_good.safetensors"]]),
        ["noise", "shape"])
    # LoRA
    lora = lambda value, names, extra=(): err(f"generate --lora {short(value)}",  # noqa: E731
                                              g([]) + ["--lora", value] + list(extra), names)
    lora("/nonexistent/l.safetensors", ["/nonexistent/l.safetensors"])
    lora(fx["lora_diff.safetensors"] + ":nan", ["--lora", "scale", "nan"])
    lora(fx["lora_diff.safetensors"] + ":inf", ["--lora", "scale", "inf"])
    lora(fx["lora_diff.safetensors"] + ":abc", ["--lora", "scale", "abc"])
    lora(fx["lora_diff.safetensors"] + ":", ["--lora", "scale", "lora_diff.safetensors:'"])  # or a file named so
    # 1e39 overflows fp32: the merged weights are inf; the error must point at the LoRA (not "scale" or
    # "lora": the "lora: ... (scale 1e+39)" summary line on stderr has both).
    lora(fx["lora_diff.safetensors"] + ":1e39", ["--lora", "1e39", "merg"])
    lora(":0.5", ["--lora"])
    lora("", ["--lora"])
    lora(fx["lora_dir"], ["lora_dir"])
    lora(fx["not_safetensors.safetensors"], ["not_safetensors.safetensors"])
    lora(fx["lora_empty.safetensors"], ["lora_empty.safetensors"])
    lora(fx["lora_nomatch.safetensors"], ["no key matched"])
    lora(fx["lora_unmatched.safetensors"], ["frobnicate"])
    cases[-1].name += " (names the key)"
    lora(fx["lora_unmatched.safetensors"], ["--lora-ignore-unmatched"])
    cases[-1].name += " (names the flag)"
    lora(fx["lora_block9.safetensors"], ["blocks.9", "blocks_9"])
    lora(fx["lora_shape.safetensors"], ["shape", "self_attn.q"])
    lora(fx["lora_nan.safetensors"], ["non-finite", "nan"])
    lora(fx["lora_half.safetensors"], ["lora_up", "lora_down"])
    lora(fx["lora_rank.safetensors"], ["rank", "lora_up", "shape"])
    lora(fx["lora_alpha_nan.safetensors"], ["alpha"])
    either("generate --lora matching nothing, ignore unmatched",
           g([]) + ["--lora", fx["lora_nomatch.safetensors"], "--lora-ignore-unmatched"],
           ["no key matched", "lora_nomatch"])
    err("generate --lora-2 broken on two experts",
        g(["--model", a14b]) + ["--lora-2", fx["lora_nan.safetensors"]], ["non-finite", "nan"])
    # --out
    for value, names in (("", ["--out"]), ("/nonexistent/dir/x.safetensors", ["/nonexistent/dir"]),
                         (str(root / "x.txt"), ["--out", "x.txt"]), (str(root / "noextension"), ["--out", "noextension"]),
                         (fx["outdir.safetensors"], ["outdir.safetensors"]), (str(root / "out"), ["--out"]),
                         (fx["m_file"] + "/x.safetensors", ["m_file"]), ("/proc/x.safetensors", ["/proc/x.safetensors"])):
        err(f"generate --out {short(value)}", g(["--out", value]), names)

    # ---- init-model ------------------------------------------------------------------------
    ok("init-model tiny", ["init-model", "--preset", "tiny", "--out", str(out("")), "--threads", "1"])
    ok("init-model tiny-a14b seed", ["init-model", "--preset", "tiny-a14b", "--seed", "7", "--out", str(out("")), "--threads", "1"])
    ok("init-model tiny-ti2v", ["init-model", "--preset", "tiny-ti2v", "--out", str(out("")), "--threads", "1"])
    ok("init-model into a missing parent", ["init-model", "--preset", "tiny", "--out", str(out("") / "a" / "b")])
    ibase = ["--preset", "tiny", "--out", str(root / "init_err"), "--threads", "1"]
    opts("init-model", ibase, "--preset", ["bogus", "", "TINY"])
    opts("init-model", ibase, "--seed", ["-1", "abc", "1.5", "9223372036854775808"])
    opts("init-model", ibase, "--threads", ["0", "-1", "abc", "5000"])
    for value, names in (("", ["--out"]), (fx["m_file"], ["m_file"]), (fx["m_file"] + "/sub", ["m_file"]),
                         ("/proc/tessel_model", ["/proc/tessel_model"])):
        err(f"init-model --out {short(value)}", ["init-model"] + hs.merged(ibase, ["--out", value]), names)
    err("init-model wan-14b into a file's child", ["init-model", "--preset", "wan-14b", "--out", "/dev/null/x"], ["/dev/null/x"])
    either("init-model over someone's folder", ["init-model", "--preset", "tiny", "--out", fx["init_existing_dir"]],
           ["init_existing_dir"])

    # ---- dit-bench -------------------------------------------------------------------------
    dbase = ["--from-dir", tiny + "/transformer", "--frames", "1", "--height", "64", "--width", "64", "--text-tokens", "8",
             "--threads", "1", "--json"]
    dit = lambda extra: ["dit-bench"] + hs.merged(dbase, extra)  # noqa: E731
    ok("dit-bench tiny", dit([]))
    ok("dit-bench steps and warmup", dit(["--steps", "2", "--warmup", "1", "--batch", "1"]))
    ok("dit-bench wan-1.3b one layer", ["dit-bench"] + hs.strip_option(dbase, "--from-dir") + ["--model", "wan-1.3b", "--layers", "1"])
    ok("dit-bench sparse compare dense", dit(["--sparse-attn-pattern", "dynamic_topk", "--sparse-attn-topk", "0.5", "--compare-dense"]))
    ok("dit-bench per-layer configs", dit(["--sparse-attn-pattern", "dynamic_topk", "--sparse-attn-layers",
                                           '{"1": {"topk_ratio": 0.25}}']))
    ok("dit-bench inputs file", ["dit-bench", "--from-dir", tiny + "/transformer", "--inputs", fx["inputs_good.safetensors"],
                                 "--threads", "1", "--json"])
    save = out()
    ok("dit-bench save output", dit(["--save-output", str(save)]), files_check([save], b""))
    for opt in ("--frames", "--height", "--width", "--batch", "--text-tokens", "--layers", "--steps"):
        opts("dit-bench", dbase, opt, ["0", "-1", "abc"])
    opts("dit-bench", dbase, "--save-output", [str(root / "no-such-dir" / "o.safetensors")])
    opts("dit-bench", dbase, "--frames", ["2", "1.5"], ["--frames", "frames"])
    opts("dit-bench", dbase, "--height", ["60", "65"], ["--height", "height"])
    opts("dit-bench", dbase, "--width", ["8"], ["--width", "width"])
    opts("dit-bench", dbase, "--batch", ["65"])
    opts("dit-bench", dbase, "--layers", ["1", "3"])  # a checkpoint has all its layers
    opts("dit-bench", dbase, "--warmup", ["-1"])
    opts("dit-bench", dbase, "--threads", ["0", "5000"])
    opts("dit-bench", dbase, "--seed", ["-1"])
    opts("dit-bench", dbase, "--device", ["cuda", "tpu", ""])
    opts("dit-bench", dbase, "--ulysses", ["2", "0"])
    opts("dit-bench", dbase, "--sparse-attn-topk", ["nan", "2"])
    err("dit-bench huge latent", dit(["--frames", "65533", "--height", "65536", "--width", "65536"]),
        ["--frames", "--height", "--width", "memory"])
    err("dit-bench rank without world size", dit([]), rank_names, env=no_rank)
    err("dit-bench cfg-parallel without mpirun", dit(["--cfg-parallel"]), ["--cfg-parallel", "mpirun", "processes"])
    err("dit-bench check without parallel", dit(["--check"]), ["--check"])
    err("dit-bench ring-sm-margin without ring", dit(["--ring-sm-margin", "32"]), ["--ring-sm-margin", "--ring"])
    opts("dit-bench", dbase, "--ring-sm-margin", ["-1", "1025", "x"])
    err("dit-bench ulysses-head-groups without ulysses", dit(["--ulysses-head-groups", "2"]), ["--ulysses-head-groups", "--ulysses"])
    opts("dit-bench", dbase, "--ulysses-head-groups", ["0", "1025", "x"])
    err("dit-bench model and from-dir", dit(["--model", "wan-1.3b"]), ["--model", "--from-dir"])
    err("dit-bench model bogus", ["dit-bench"] + hs.strip_option(dbase, "--from-dir") + ["--model", "bogus"], ["--model"])
    for value, names in (("/nonexistent/t", ["/nonexistent/t"]), (fx["m_file"], ["m_file"]), (fx["m_empty"], ["m_empty", "config.json"]),
                         (fx["m_loop"], ["m_loop"]), (tiny, ["config.json", "transformer"]),
                         (fx["m_bad_tconfig"] + "/transformer", ["num_layers"]),
                         (fx["m_truncated"] + "/transformer", ["diffusion_pytorch_model.safetensors"])):
        err(f"dit-bench --from-dir {short(value)}", dit(["--from-dir", value]), names)
    # --layers 1: should --from-dir "" fall back to --model wan-1.3b, one layer of it is quick.
    err("dit-bench --from-dir ''", dit(["--from-dir", "", "--layers", "1"]), ["--from-dir"])
    layers = lambda value, names: err(f"dit-bench --sparse-attn-layers {value[:60]!r}",  # noqa: E731
                                      dit(["--sparse-attn-pattern", "dynamic_topk", "--sparse-attn-layers", value]), names)
    layers('{"5": {"topk_ratio": 0.5}}', ["5", "block"])
    layers('{"-1": {}}', ["-1", "block"])
    layers('{"a": {}}', ["'a'", '"a"', "block"])
    layers('{"0": {"topk_ratio": 2}}', ["topk_ratio"])
    layers('{"0": ' + hs.nested(10000, '{"options":', "}", "{}") + "}", ["--sparse-attn-layers", "depth", "nest"])
    layers("[1]", ["--sparse-attn-layers", "object"])
    layers("{not json", ["--sparse-attn-layers", "JSON"])
    layers("@/nonexistent/layers.json", ["/nonexistent/layers.json"])
    err("dit-bench sparse-attn-layers without a pattern", dit(["--sparse-attn-layers", '{"0": {"topk_ratio": 0.5}}']),
        ["--sparse-attn-layers"])
    inputs = ["dit-bench", "--from-dir", tiny + "/transformer", "--threads", "1", "--json", "--inputs"]
    for key, names in (("inputs_no_timestep", ["timestep"]), ("inputs_nan", ["hidden_states", "non-finite", "nan"]),
                       ("inputs_timestep_nan", ["timestep"]), ("inputs_channels", ["hidden_states", "in_channels", "channels"]),
                       ("inputs_text_dim", ["encoder_hidden_states", "text_dim"]), ("not_safetensors", ["not_safetensors.safetensors"])):
        err(f"dit-bench inputs {key}", inputs + [fx[f"{key}.safetensors"]], names)
    err("dit-bench inputs missing", inputs + ["/nonexistent/i.safetensors"], ["/nonexistent/i.safetensors"])
    err("dit-bench inputs with --frames", inputs + [fx["inputs_good.safetensors"], "--frames", "1"], ["--inputs", "--frames"])
    for value, names in (("", ["--save-output"]), ("/nonexistent/dir/o.safetensors", ["/nonexistent/dir"]),
                         (fx["outdir.safetensors"], ["outdir.safetensors"])):
        err(f"dit-bench --save-output {short(value)}", dit(["--save-output", value]), names)

    # ---- sp-bench --------------------------------------------------------------------------
    sbase = ["--seq", "256", "--heads", "2", "--head-dim", "32", "--steps", "1", "--warmup", "0", "--threads", "1", "--json"]
    sp = lambda extra: ["sp-bench"] + hs.merged(sbase, extra)  # noqa: E731
    ok("sp-bench dense", sp([]))
    ok("sp-bench check", sp(["--check"]))
    ok("sp-bench block_sparse", sp(["--mask", "block_sparse", "--density", "0.5", "--block-q", "32", "--block-kv", "32"]))
    ok("sp-bench radial grid", sp(["--mask", "radial", "--grid", "2x8x8", "--block-q", "16", "--block-kv", "16"]))
    ok("sp-bench dynamic_topk gqa", sp(["--mask", "dynamic_topk", "--density", "0.3", "--kv-heads", "1", "--block-q", "32",
                                        "--block-kv", "32"]))
    for opt in ("--seq", "--heads", "--head-dim", "--batch", "--block-q", "--block-kv", "--steps"):
        opts("sp-bench", sbase, opt, ["0", "-1", "abc"])
    opts("sp-bench", sbase, "--seq", ["16777217", "1.5", ""])
    opts("sp-bench", sbase, "--kv-heads", ["0", "3"], ["--kv-heads", "--heads"])
    opts("sp-bench", sbase, "--head-dim", ["1025"])
    ok("sp-bench odd head dim", sp(["--head-dim", "7", "--check"]))
    opts("sp-bench", sbase + ["--mask", "block_sparse"], "--density", ["nan", "0", "1.5", "inf", "-inf"])
    opts("sp-bench", sbase, "--warmup", ["-1"])
    opts("sp-bench", sbase, "--mask", ["bogus", ""])
    opts("sp-bench", sbase, "--dtype", ["bf16", "bogus"])
    opts("sp-bench", sbase, "--device", ["cuda"])
    for value in ("tpu", "cuda:abc"):
        opts("sp-bench", sbase, "--device", [value], ["--device", value])
    opts("sp-bench", sbase + ["--mask", "radial"], "--grid", ["2x2x2junk", "0x2x2", "", "x", "2x-8x8", "99999999x99999999x99999999"])
    either("sp-bench --grid 2x2 (HxW)", sp(["--mask", "radial", "--grid", "2x2", "--block-q", "4", "--block-kv", "4"]), ["--grid"])
    err("sp-bench grid without radial", sp(["--grid", "2x8x8"]), ["--grid", "--mask"])
    err("sp-bench radial without grid", sp(["--mask", "radial"]), ["--grid"])
    err("sp-bench density with dense mask", sp(["--density", "0.5"]), ["--density"])
    # 8 TB of q, k and v: the budget refuses it before any allocation, naming the flags that asked for it
    err("sp-bench out of memory names its size flags", sp(["--seq", "2000000", "--heads", "64", "--head-dim", "256", "--batch", "64"]),
        ["memory", "--seq 2000000", "--heads 64", "--head-dim 256", "--batch 64"])
    err("sp-bench ring-sm-margin without ring", sp(["--ring-sm-margin", "16"]), ["--ring-sm-margin", "--ring"])
    err("sp-bench ulysses-head-groups without ulysses", sp(["--ulysses-head-groups", "2"]), ["--ulysses-head-groups", "--ulysses"])
    opts("sp-bench", sbase, "--ulysses-head-groups", ["0", "x"])
    err("sp-bench ulysses-sm-margin without head groups", sp(["--ulysses-sm-margin", "16"]), ["--ulysses-sm-margin", "--ulysses-head-groups"])
    opts("sp-bench", sbase, "--ulysses-sm-margin", ["-1", "1025", "x"])
    opts("sp-bench", sbase, "--ulysses", ["2", "0"])
    opts("sp-bench", sbase, "--ring", ["2"])
    err("sp-bench cfg-parallel without mpirun", sp(["--cfg-parallel"]), ["--cfg-parallel", "mpirun", "processes"])
    err("sp-bench rank without world size", sp([]), rank_names, env=no_rank)
    err("sp-bench world size without rank", sp([]), rank_names, env={"TESSEL_WORLD_SIZE": "2"})
    err("sp-bench over memory", sp(["--seq", "16777216", "--heads", "1024", "--head-dim", "1024"]), ["--seq", "memory"])

    # ---- vae-bench -------------------------------------------------------------------------
    vbase = ["--device", "cpu", "--preset", "tiny", "--frames", "1", "--height", "64", "--width", "64", "--iters", "1",
             "--warmup", "0", "--threads", "1", "--json"]
    vae = lambda extra: ["vae-bench"] + hs.merged(vbase, extra)  # noqa: E731
    ok("vae-bench tiny", vae([]))
    ok("vae-bench from dir", ["vae-bench"] + hs.strip_option(vbase, "--preset") + ["--from-dir", tiny + "/vae"])
    ok("vae-bench five frames", vae(["--frames", "5", "--height", "32", "--width", "48"]))
    ok("vae-bench latents file", ["vae-bench", "--device", "cpu", "--preset", "tiny", "--latents", fx["latents_good.safetensors"],
                                  "--iters", "1", "--warmup", "0", "--threads", "1"])
    save = out()
    ok("vae-bench save video", vae(["--save-video", str(save)]), files_check([save], b""))
    for opt in ("--frames", "--iters"):
        opts("vae-bench", vbase, opt, ["0", "-1", "abc"])
    opts("vae-bench", vbase, "--frames", ["2"], ["--frames", "frames"])
    opts("vae-bench", vbase, "--height", ["7", "65", "abc", "-64"], ["--height", "height"])
    opts("vae-bench", vbase, "--width", ["0", "12", "1e3"], ["--width", "width"])
    opts("vae-bench", vbase, "--warmup", ["-1"])
    opts("vae-bench", vbase, "--threads", ["0"])
    opts("vae-bench", vbase, "--preset", ["bogus", ""])
    opts("vae-bench", vbase, "--device", ["cuda", "cuda:3", "tpu", ""])
    err("vae-bench default device without a GPU", ["vae-bench"] + hs.strip_option(vbase, "--device"), ["--device"])
    err("vae-bench no-tf32 on the CPU", vae(["--no-tf32"]), ["--no-tf32"])
    ok("vae-bench encode", vae(["--encode", "--frames", "5", "--height", "32", "--width", "48"]))
    err("vae-bench encode on cuda without a GPU", vae(["--encode", "--device", "cuda"]), ["--device"])
    err("vae-bench encode frames", vae(["--encode", "--frames", "3"]), ["--frames", "4k + 1"])
    err("vae-bench encode height", vae(["--encode", "--height", "36"]), ["--height", "8"])
    err("vae-bench encode with latents", vae(["--encode", "--latents", fx["latents_good.safetensors"]]), ["--encode", "--latents"])
    err("vae-bench huge video", vae(["--preset", "tiny", "--frames", "65533", "--height", "65536", "--width", "65536"]),
        ["--frames", "--height", "--width", "memory"])
    for value, names in (("/nonexistent/vae", ["/nonexistent/vae"]), (fx["m_file"], ["m_file"]),
                         (fx["m_empty"], ["m_empty", "config.json"]), (tiny, ["config.json", "vae"]), (fx["m_loop"], ["m_loop"]),
                         (tiny + "/transformer", ["AutoencoderKLWan", "config"])):
        err(f"vae-bench --from-dir {short(value)}", ["vae-bench"] + hs.strip_option(vbase, "--preset") + ["--from-dir", value], names)
    vlat = ["vae-bench", "--device", "cpu", "--preset", "tiny", "--iters", "1", "--warmup", "0", "--threads", "1", "--latents"]
    for key, names in (("latents_nan", ["latents", "non-finite", "nan"]), ("latents_zdim", ["latents", "z_dim", "channels"]),
                       ("latents_rank4", ["latent", "rank"]), ("latents_name", ["latents"]),
                       ("not_safetensors", ["not_safetensors.safetensors"])):
        err(f"vae-bench latents {key}", vlat + [fx[f"{key}.safetensors"]], names)
    err("vae-bench latents missing", vlat + ["/nonexistent/l.safetensors"], ["/nonexistent/l.safetensors"])
    for value, names in (("", ["--save-video"]), ("/nonexistent/dir/v.safetensors", ["/nonexistent/dir"]),
                         (fx["outdir.safetensors"], ["outdir.safetensors"])):
        err(f"vae-bench --save-video {short(value)}", vae(["--save-video", value]), names)

    # ---- budgets: --max-memory / --force / --dry-run on every command that estimates -----------
    budgeted = {"generate": lambda: gen()[0], "dit-bench": lambda: dit([]), "sp-bench": lambda: sp([]), "vae-bench": lambda: vae([]),
                "vae-bench --encode": lambda: vae(["--encode", "--frames", "5"])}
    shape_flag = {"generate": "--size", "dit-bench": "--frames", "sp-bench": "--seq", "vae-bench": "--frames",
                  "vae-bench --encode": "--frames"}
    for command, args in budgeted.items():
        for value in ("0", "-1", "12Q", "", "nan", "inf", "1e400", "64GG"):
            err(f"{command} --max-memory {short(value)}", args() + ["--max-memory", value], ["--max-memory"])
        err(f"{command} over --max-memory 1K", args() + ["--max-memory", "1K"], [shape_flag[command], "--max-memory", "--force"])
        ok(f"{command} --max-memory 1K --force", args() + ["--max-memory", "1K", "--force"])
        ok(f"{command} --dry-run", args() + ["--dry-run"])
        err(f"{command} --dry-run over --max-memory", args() + ["--dry-run", "--max-memory", "1K"], ["--max-memory"])
        if command != "vae-bench --encode":  # the encoder runs on the CPU only
            ok(f"{command} --dry-run on an absent GPU", hs.merged(args(), ["--device", "cuda:3", "--dry-run"]))
    err("dit-bench past the hour", ["dit-bench", "--model", "wan-14b", "--steps", "100000", "--dry-run", "--max-memory", "1T"],
        ["--model wan-14b", "--steps 100000", "hour", "--force"])
    err("sp-bench past the hour", sp(["--seq", "1000000", "--steps", "10000", "--dry-run", "--max-memory", "1T"]),
        ["--seq 1000000", "--steps 10000", "hour", "--force"])
    err("vae-bench past the hour", vae(["--preset", "wan2.1", "--height", "4096", "--width", "4096", "--frames", "81", "--iters", "1000",
                                        "--dry-run", "--max-memory", "1T"]), ["--height 4096", "--iters 1000", "hour"])
    err("dit-bench --dry-run with a malformed device", dit(["--device", "cuda:x", "--dry-run"]), ["--device"])

    # ---- the weights' flags: --transformer-file, --transformer-2-file, --weights, --fp8-format,
    # --lora-adapter, --lora-rank/--lora-adapters ---------------------------------------------------
    bad_weight_files = [("missing", str(root / "no_such.safetensors"), ["no_such.safetensors"]),
                        ("directory", fx["w_dir.safetensors"], ["w_dir.safetensors"]),
                        ("symlink loop", fx["w_loop.safetensors"], ["w_loop.safetensors"]),
                        ("empty", fx["w_empty.safetensors"], ["w_empty.safetensors"]),
                        ("garbage", fx["w_garbage.safetensors"], ["w_garbage.safetensors"]),
                        ("truncated", fx["w_truncated.safetensors"], ["w_truncated.safetensors"]),
                        ("header only", fx["w_header_only.safetensors"], ["w_header_only.safetensors"]),
                        ("other names", fx["w_other_names.safetensors"], ["w_other_names.safetensors"]),
                        ("wrong shape", fx["w_wrong_shape.safetensors"], ["w_wrong_shape.safetensors"]),
                        ("a config", tiny + "/transformer/config.json", ["config.json"]),
                        ("empty path", "", ["--transformer-file"])]
    for what, path, names in bad_weight_files:
        err(f"generate --transformer-file {what}", g(["--transformer-file", path]),
            names if what != "empty path" else ["--transformer-file"])
        err(f"generate two experts --transformer-2-file {what}",
            ["generate"] + hs.merged(generate_args(a14b, str(root / "err.safetensors")), ["--transformer-2-file", path]),
            names if what != "empty path" else ["--transformer-2-file"])
        err(f"dit-bench --transformer-file {what}", dit(["--transformer-file", path]),
            names if what != "empty path" else ["--transformer-file"])
    for layout in ("lightx2v", "comfyui"):
        gen_ok(f"generate --transformer-file fp8 {layout} (dequantised on the CPU)", ["--transformer-file", fx[f"fp8_{layout}"]])
        ok(f"dit-bench --transformer-file fp8 {layout}", dit(["--transformer-file", fx[f"fp8_{layout}"]]))
    gen_ok("generate --transformer-file the directory's own weights",
           ["--transformer-file", tiny + "/transformer/diffusion_pytorch_model.safetensors"], differs=False)
    err("generate --transformer-2-file on a one-expert model", g(["--transformer-2-file", fx["fp8_lightx2v"]]),
        ["--transformer-2-file"])
    err("dit-bench --transformer-file without --from-dir",
        ["dit-bench"] + hs.strip_option(dbase, "--from-dir") + ["--model", "wan-1.3b", "--layers", "1", "--transformer-file",
                                                                fx["fp8_lightx2v"]], ["--transformer-file", "--from-dir"])
    err("dit-bench --transformer-2-file (one transformer)", dit(["--transformer-2-file", fx["fp8_lightx2v"]]),
        ["--transformer-2-file"])
    for value in ("fp16", "FP8", "", "int8", "bf16,fp8"):
        err(f"generate --weights {value!r}", g(["--weights", value]), ["--weights"])
        err(f"dit-bench --weights {value!r}", dit(["--weights", value]), ["--weights"])
        err(f"init-model --weights {value!r}", ["init-model"] + hs.merged(ibase, ["--weights", value]), ["--weights"])
    err("generate --weights fp8 on the CPU", g(["--weights", "fp8"]), ["--weights fp8", "cuda"])
    err("dit-bench --weights fp8 on the CPU", dit(["--weights", "fp8"]), ["--weights fp8", "cuda"])
    for value in ("bogus", "", "LIGHTX2V", "comfy"):
        err(f"init-model --fp8-format {value!r}", ["init-model"] + hs.merged(ibase, ["--weights", "fp8", "--fp8-format", value]),
            ["--fp8-format"])
    err("init-model --fp8-format without --weights fp8", ["init-model"] + hs.merged(ibase, ["--fp8-format", "comfyui"]),
        ["--fp8-format", "--weights fp8"])
    err("init-model --fp8-format with --weights bf16", ["init-model"] + hs.merged(ibase, ["--weights", "bf16", "--fp8-format", "lightx2v"]),
        ["--fp8-format", "--weights fp8"])
    ok("dit-bench --lora-rank 4", dit(["--lora-rank", "4", "--batch", "2"]))
    ok("dit-bench --lora-rank 4 --lora-adapters 2", dit(["--lora-rank", "4", "--lora-adapters", "2", "--batch", "2"]))
    err("dit-bench --lora-adapters without --lora-rank", dit(["--lora-adapters", "2"]), ["--lora-adapters", "--lora-rank"])
    err("dit-bench --lora-adapters 1 without --lora-rank", dit(["--lora-adapters", "1"]), ["--lora-adapters", "--lora-rank"])
    err("dit-bench --lora-adapters not dividing the batch", dit(["--lora-rank", "4", "--lora-adapters", "3", "--batch", "2"]),
        ["--lora-adapters", "batch"])
    opts("dit-bench", dbase, "--lora-rank", ["-1", "4097", "abc", "1.5", "nan", ""])
    opts("dit-bench", dbase + ["--lora-rank", "4"], "--lora-adapters", ["0", "-1", "65", "abc", ""])

    # ---- serve (start-up errors only; the busy port stops any server that slips through) --------
    port = fx["busy_port"]
    vbase_serve = ["--model", tiny, "--host", "127.0.0.1", "--port", port, "--threads", "1", "--size", "64x64", "--frames", "1",
                   "--steps", "2"]
    serve = lambda extra: ["serve"] + hs.merged(vbase_serve, extra)  # noqa: E731
    err("serve on a busy port", serve([]), [port, "listen"])
    for what, path, names in bad_weight_files:
        err(f"serve --transformer-file {what}", serve(["--transformer-file", path]),
            names if what != "empty path" else ["--transformer-file"])
        if what != "empty path":
            err(f"serve --lora-adapter {what}", serve(["--lora-adapter", "style=" + path]),
                ["--lora-adapter style"] if what in ("missing", "directory", "symlink loop") else names)
    err("serve --transformer-2-file on a one-expert model", serve(["--transformer-2-file", fx["fp8_lightx2v"]]), ["--transformer-2-file"])
    for value in ("fp16", "", "FP8"):
        err(f"serve --weights {value!r}", serve(["--weights", value]), ["--weights"])
    err("serve --weights fp8 on the CPU", serve(["--weights", "fp8"]), ["--weights fp8", "cuda"])
    for value in ("style", "=" + fx["lora_peft.safetensors"], "style=", "a b=" + fx["lora_peft.safetensors"],
                  "x" * 65 + "=" + fx["lora_peft.safetensors"], "style=" + fx["lora_peft.safetensors"] + ":nan",
                  "style=" + fx["lora_peft.safetensors"] + ":inf", "style=" + fx["lora_peft.safetensors"] + ":1e39"):
        err(f"serve --lora-adapter {short(value)}", serve(["--lora-adapter", value]), ["--lora-adapter"])
    err("serve --lora-adapter twice by name", serve(["--lora-adapter", "style=" + fx["lora_peft.safetensors"],
                                                    "--lora-adapter", "style=" + fx["lora_kohya.safetensors"]]),
        ["--lora-adapter", "'style' twice"])
    err("serve --lora-adapter on two experts",
        ["serve"] + hs.merged(hs.merged(vbase_serve, ["--model", a14b]), ["--lora-adapter", "style=" + fx["lora_peft.safetensors"]]),
        ["--lora-adapter", "one expert"])
    opts("serve", vbase_serve, "--port", ["65536", "-1", "abc", ""])
    opts("serve", vbase_serve, "--max-queue", ["0", "-1", "abc"])
    opts("serve", vbase_serve, "--num-gpus", ["0", "2", "65"])
    opts("serve", vbase_serve, "--ulysses", ["0", "65"])
    opts("serve", vbase_serve, "--ring", ["0"])
    opts("serve", vbase_serve, "--max-connections", ["0", "15", "65537"])
    opts("serve", vbase_serve, "--keep-alive-timeout", ["0", "3601"])
    opts("serve", vbase_serve, "--worker-stall-timeout", ["1", "86401", "ten"])
    opts("serve", vbase_serve, "--max-body-bytes", ["100", "-1", "1073741825"])
    opts("serve", vbase_serve, "--request-timeout", ["-1", "abc"])
    opts("serve", vbase_serve, "--image-timeout", ["0"])
    opts("serve", vbase_serve, "--drain-timeout", ["-1"])
    opts("serve", vbase_serve, "--fps", ["0", "nan", "inf", "121"])
    opts("serve", vbase_serve, "--guidance", ["nan", "-1"])
    opts("serve", vbase_serve, "--steps", ["0", "abc"])
    opts("serve", vbase_serve, "--frames", ["0", "2"], ["--frames", "frames"])
    opts("serve", vbase_serve, "--size", ["65x64", "64x", "", "99999999x64"])
    opts("serve", vbase_serve, "--threads", ["0"])
    opts("serve", vbase_serve, "--flow-shift", ["0", "nan"])
    opts("serve", vbase_serve, "--scheduler", ["bogus"])
    opts("serve", vbase_serve, "--cache", ["bogus"])
    opts("serve", vbase_serve, "--device", ["cuda", "tpu"])
    opts("serve", vbase_serve, "--host", ["", "not a host"], ["--host", "host"])
    opts("serve", vbase_serve, "--host", ["999.1.1.1"], ["--host", "999.1.1.1"])
    opts("serve", vbase_serve, "--sparse-attn-allow", ["noequals", "=dense", "default=dense", "a b=dense", "x={not json",
                                                       "x=@/nonexistent/c.json"])
    opts("serve", vbase_serve, "--sparse-attn-topk", ["nan"])
    err("serve teacache-thresh without teacache", serve(["--teacache-thresh", "0.1"]), ["--teacache-thresh"])
    err("serve lora-2 on one expert", serve(["--lora-2", fx["lora_diff.safetensors"]]), ["--lora-2"])
    err("serve sparse-attn-config-2 on one expert", serve(["--sparse-attn-config-2", "{}"]), ["--sparse-attn-config-2"])
    err("serve lora-ignore-unmatched alone", serve(["--lora-ignore-unmatched"]), ["--lora-ignore-unmatched"])
    err("serve cfg-parallel at guidance 1", serve(["--cfg-parallel", "--guidance", "1"]), ["--cfg-parallel"])
    err("serve lora missing", serve(["--lora", "/nonexistent/l.safetensors"]), ["/nonexistent/l.safetensors"])
    err("serve lora scale nan", serve(["--lora", fx["lora_diff.safetensors"] + ":nan"]), ["--lora", "scale"])
    err("serve lora matching nothing", serve(["--lora", fx["lora_nomatch.safetensors"]]), ["no key matched"])
    err("serve lora with NaN", serve(["--lora", fx["lora_nan.safetensors"]]), ["non-finite", "nan"])
    for key, names in (("m_missing", ["no_such_model"]), ("m_file", ["m_file"]), ("m_loop", ["m_loop"]),
                       ("m_bad_json", ["model_index.json"]), ("m_class", ["_class_name"]), ("m_no_transformer", ["transformer"])):
        err(f"serve model {key}", serve(["--model", fx[key]]), names)
    err("serve embeddings missing", serve(["--embeddings", "/nonexistent/e.safetensors"]), ["/nonexistent/e.safetensors"])
    err("serve embeddings NaN", serve(["--embeddings", fx["emb_nan.safetensors"]]), ["prompt_embeds", "non-finite", "nan"])
    err("serve embeddings wrong names", serve(["--embeddings", fx["emb_names.safetensors"]]), ["prompt_embeds"])
    for key in ("emb_empty", "emb_dim", "emb_rank2"):  # refused at start-up, naming the file
        err(f"serve embeddings {key}", serve(["--embeddings", fx[f"{key}.safetensors"]]), [f"{key}.safetensors"])

    # ---- calibrate -------------------------------------------------------------------------
    cbase = ["--grid", "2x8x8", "--synthetic-layers", "2", "--heads", "2", "--head-dim", "32", "--block-q", "16", "--block-kv", "16",
             "--iterations", "3", "--threads", "1"]
    cal = lambda extra: ["calibrate"] + hs.merged(cbase, extra)  # noqa: E731
    cal_layers = ["calibrate", "--layer", fx["cap0"] + "," + fx["cap1"], "--block-q", "16", "--block-kv", "16", "--iterations", "3",
                  "--threads", "1"]
    ok("calibrate synthetic", cal([]))
    ok("calibrate --dry-run", cal(["--dry-run"]))
    ok("calibrate --dry-run for an absent GPU", cal(["--dry-run", "--device", "cuda:2"]))
    err("calibrate --dry-run over --max-memory", cal(["--dry-run", "--max-memory", "1K"]), ["--grid 2x8x8", "--max-memory"])
    err("calibrate --dry-run with a malformed device", cal(["--dry-run", "--device", "gpu"]), ["--device"])
    ok("calibrate threshold", cal(["--method", "threshold", "--stride", "8"]))
    ok("calibrate cdf cosine", cal(["--method", "cdf", "--metric", "cosine", "--similarity-threshold", "0.2"]))
    ok("calibrate compare global json", cal(["--compare-global", "--json"]))
    saved = out(".json")
    ok("calibrate out", cal(["--out", str(saved)]), files_check([saved], b"{"))
    ok("calibrate HxW grid", cal(["--grid", "8x8"]))
    ok("calibrate layer files", cal_layers)
    ok("calibrate layer files heldout", cal_layers + ["--heldout", fx["cap2"]])
    opts("calibrate", cbase, "--grid", ["0x8x8", "2x8x8junk", "", "x", "2x8x8x8", "-2x8x8"])
    for opt in ("--synthetic-layers", "--synthetic-steps", "--heads", "--iterations", "--block-q", "--block-kv"):
        opts("calibrate", cbase, opt, ["0", "abc"])
    opts("calibrate", cbase, "--synthetic-layers", ["1001", "-1"])
    opts("calibrate", cbase, "--synthetic-heldout", ["-1"])
    opts("calibrate", cbase, "--head-dim", ["5", "7", "0"])
    opts("calibrate", cbase, "--iterations", ["31"])
    opts("calibrate", cbase, "--target", ["0", "nan", "11", "-1", "inf"])
    opts("calibrate", cbase, "--margin", ["0", "1.5", "nan"])
    opts("calibrate", cbase, "--method", ["bogus", ""])
    opts("calibrate", cbase, "--metric", ["psnr"])
    opts("calibrate", cbase + ["--method", "threshold"], "--stride", ["4", "0"])
    opts("calibrate", cbase, "--similarity-threshold", ["nan", "2"])
    opts("calibrate", cbase, "--device", ["cuda"])
    opts("calibrate", cbase, "--device", ["tpu"], ["--device", "tpu"])
    opts("calibrate", cbase, "--threads", ["0"])
    err("calibrate stride with topk", cal(["--stride", "8"]), ["--stride"])
    err("calibrate similarity with threshold", cal(["--method", "threshold", "--similarity-threshold", "0.2"]), ["--similarity-threshold"])
    err("calibrate neither grid nor layer", ["calibrate", "--threads", "1"], ["--grid", "--layer"])
    err("calibrate grid and layer", cal(["--layer", fx["cap0"]]), ["--grid", "--layer"])
    err("calibrate synthetic flags with layer files", cal_layers + ["--synthetic-layers", "2"], ["--synthetic-layers"])
    err("calibrate grid without synthetic layers", ["calibrate"] + hs.strip_option(cbase, "--synthetic-layers"),
        ["--synthetic-layers"])
    for label, value, names in (("a,,b", fx["cap0"] + ",," + fx["cap1"], ["--layer", "empty"]), ("''", "", ["--layer"]),
                                (",", ",", ["--layer"]), ("a,", fx["cap0"] + ",", ["--layer", "empty"]),
                                ("missing", "/nonexistent/c.safetensors", ["/nonexistent/c.safetensors"]),
                                ("not safetensors", fx["not_safetensors.safetensors"], ["not_safetensors.safetensors"]),
                                ("NaN", fx["cap_nan"], ["non-finite", "nan"]),
                                ("heads differ", fx["cap0"] + "," + fx["cap_heads3"], ["cap_heads3", "heads", "shape"]),
                                ("tokens differ", fx["cap0"] + "," + fx["cap_seq32"], ["cap_seq32", "shape", "tokens"])):
        err(f"calibrate --layer {label}", ["calibrate", "--layer", value, "--block-q", "16", "--block-kv", "16", "--threads", "1"], names)
    err("calibrate heldout count", cal_layers + ["--layer", fx["cap2"], "--heldout", fx["cap2"]], ["--heldout"])
    err("calibrate heldout without layer", cal(["--heldout", fx["cap2"]]), ["--heldout"])
    err("calibrate heldout empty element", cal_layers + ["--heldout", fx["cap2"] + ",,"], ["--heldout", "empty"])
    err("calibrate heldout of another shape", cal_layers + ["--heldout", fx["cap_heads3"]], ["cap_heads3", "heads", "shape"])
    for value, names in (("", ["--out"]), ("/nonexistent/dir/c.json", ["/nonexistent/dir"]), (fx["cal_dir.json"], ["cal_dir.json"])):
        err(f"calibrate --out {short(value)}", cal(["--out", value]), names)

    # ---- eval --config ---------------------------------------------------------------------
    ebase = ["--config", fx["cal_synth.json"], "--grid", "2x8x8", "--threads", "1"]
    ev = lambda extra: ["eval"] + hs.merged(ebase, extra)  # noqa: E731
    ev_layers = ["eval", "--config", fx["cal_layers.json"], "--layer", fx["cap2"], "--layer", fx["cap2"], "--threads", "1"]
    ok("eval --config synthetic", ev([]))
    ok("eval --config --dry-run", ev(["--dry-run"]))
    ok("eval --config --dry-run for an absent GPU", ev(["--dry-run", "--device", "cuda:2"]))
    err("eval --config --dry-run over --max-memory", ev(["--dry-run", "--max-memory", "1K"]), ["--grid 2x8x8", "--max-memory"])
    ok("eval --config json", ev(["--json"]))
    ok("eval --config cosine", ev(["--metric", "cosine", "--target", "0.5"]))
    ok("eval --config two held-out steps", ev(["--synthetic-heldout", "2", "--seed", "3"]))
    ok("eval --config report only", ev(["--target", "0.0001", "--report-only"]))
    ok("eval --config layer files", ev_layers)
    err("eval --config target missed", ev(["--target", "0.0001"]), ["target", "layer"])
    for key, names in (("cal_no_layers.json", ["layers"]), ("cal_layers_string.json", ["layers"]),
                       ("cal_per_head_3.json", ["per_head", "heads"]), ("cal_per_head_str.json", ["per_head"]),
                       ("cal_per_head_big.json", ["per_head"]), ("cal_per_head_empty.json", ["per_head"]),
                       ("cal_sparse_missing.json", ["sparse_attn"]),
                       ("cal_sparse_bogus.json", ["bogus", "type", "pattern"]), ("cal_target.json", ["target"]),
                       ("cal_metric.json", ["metric", "psnr"]), ("cal_heads.json", ["heads", "shape"]),
                       ("cal_deep.json", ["cal_deep.json", "depth", "nest"]), ("cal_bad.json", ["cal_bad.json", "JSON"]),
                       ("cal_empty_object.json", ["layers"]), ("sparse_config.json", ["layers", "sparse_config.json"]),
                       ("cal_dir.json", ["cal_dir.json"]), ("not_safetensors.safetensors", ["not_safetensors.safetensors", "JSON"])):
        err(f"eval --config {key}", ev(["--config", fx[key]]), names)
    err("eval --config missing", ev(["--config", "/nonexistent/cal.json"]), ["/nonexistent/cal.json"])
    err("eval --config empty", ev(["--config", ""]), ["--config"])
    err("eval --config /dev/zero", ev(["--config", "/dev/zero"]), ["/dev/zero"])
    opts("eval", ebase, "--target", ["0", "nan", "11"])
    opts("eval", ebase, "--metric", ["psnr", ""])
    opts("eval", ebase, "--synthetic-heldout", ["0", "-1", "abc"])
    opts("eval", ebase, "--device", ["cuda"])
    opts("eval", ebase, "--device", ["tpu"], ["--device", "tpu"])
    opts("eval", ebase, "--grid", ["0x8x8", "2x8x8junk", ""])
    # The per-head values are ratios: checking them on another grid than calibrate's is a choice.
    either("eval --config on another grid", ev(["--grid", "4x8x8"]), ["--grid", "tokens", "shape"])
    err("eval --config layer count", ev_layers + ["--layer", fx["cap2"]], ["--layer"])
    for label, value, names in (("a,,b", fx["cap2"] + ",," + fx["cap2"], ["--layer", "empty"]), ("''", "", ["--layer"]),
                                ("missing", "/nonexistent/c.safetensors", ["/nonexistent/c.safetensors"]),
                                ("NaN", fx["cap_nan"], ["non-finite", "nan"]),
                                ("heads differ", fx["cap_heads3"], ["cap_heads3"])):
        err(f"eval --config --layer {label}", ["eval", "--config", fx["cal_layers.json"], "--layer", fx["cap2"], "--layer", value,
                                               "--threads", "1"], names)
    err("eval --config with --methods", ev(["--methods", "random"]), ["--methods", "--config"])
    err("eval --config with --qkv", ev(["--qkv", fx["cap0"]]), ["--qkv", "--config"])
    err("eval --config with grid and layers", ev(["--layer", fx["cap2"]]), ["--grid", "--layer"])
    err("eval --config without grid or layers", ["eval", "--config", fx["cal_synth.json"], "--threads", "1"], ["--grid", "--layer"])
    err("eval --report-only without --config", ["eval", "--grid", "2x8x8", "--report-only"], ["--report-only"])
    err("eval --metric without --config", ["eval", "--grid", "2x8x8", "--metric", "cosine"], ["--metric"])
    err("eval --layer without --config", ["eval", "--grid", "2x8x8", "--layer", fx["cap0"]], ["--layer"])
    err("eval --synthetic-heldout without --config", ["eval", "--grid", "2x8x8", "--synthetic-heldout", "2"], ["--synthetic-heldout"])

    # ---- engine-worker (started by serve; by hand it must fail at once) --------------------
    err("engine-worker missing channel", ["engine-worker", "--channel", "tessel_no_such_channel", "--rank", "0"],
        ["tessel_no_such_channel"])
    err("engine-worker empty channel", ["engine-worker", "--channel", "", "--rank", "0"], ["--channel"])
    err("engine-worker long channel", ["engine-worker", "--channel", "c" * 5000, "--rank", "0"], ["--channel", "ccccc"])
    err("engine-worker channel with slashes", ["engine-worker", "--channel", "/a/../b", "--rank", "0"], ["/a/../b"])
    opts("engine-worker", ["--channel", "tessel_no_such_channel"], "--rank", ["64", "-1", "abc", ""])
    err("engine-worker without rank", ["engine-worker", "--channel", "x"], ["--rank"])
    err("engine-worker without channel", ["engine-worker", "--rank", "0"], ["--channel"])
    return cases


def main() -> int:
    args = hs.sweep_parser(__doc__).parse_args()
    tessel = str(Path(args.tessel).resolve())
    try:
        return hs.run_sweep(args, lambda root: make_fixtures(root, tessel), build_cases)
    finally:
        for sock in _HELD_SOCKETS:
            sock.close()


if __name__ == "__main__":
    sys.exit(main())
