#!/usr/bin/env python3
"""Writes the Wan transformer parity fixture under tests/fixtures/wan/ with diffusers.

    python scripts/make_wan_fixture.py [--out tests/fixtures/wan]
    python scripts/make_wan_fixture.py --gpu [--out tests/fixtures/wan_gpu]

Needs torch (CPU is enough) and diffusers==0.42.1. Builds a tiny WanTransformer3DModel with a
fixed seed (2 layers, 2 heads of 16, an odd 3x5x3 patch grid, batch 2 as classifier-free guidance
runs it) and writes:

  checkpoint/          save_pretrained in fp32, sharded (so the index is exercised)
  checkpoint_bf16/     the same weights stored as bf16, one file
  io.safetensors       inputs (hidden_states, timestep, encoder_hidden_states) and outputs:
                       output_fp32          diffusers' forward in fp32
                       output_fp64          the same forward in float64 (rounded to fp32 at the end)
                       output_bf16_weights  float64 forward of the bf16-stored weights
                       timestep_per_token   (2, 45): 0 on the first frame's tokens, as Wan 2.2
                                            conditions a given first frame, the batch's timestep
                                            elsewhere; output_per_token_fp64 is its float64 forward

output_fp64 carries no rounding of its own, so a forward's difference against it is that
forward's own error; the script prints diffusers' fp32 error against it, the yardstick for the
C++ fp32 forward's tolerance.

--gpu writes the fixture of the CUDA forward under tests/fixtures/wan_gpu/: the same inputs' shapes
with 2 heads of 64 (a head dim the CUDA attention kernels take), text width 32, FFN 256, the
weights stored once in bf16 (checkpoint_bf16/), and in io.safetensors:
  output_fp64   float64 forward of those bf16 weights (the exact result for them)
  output_bf16   diffusers' bf16 forward as from_pretrained(torch_dtype=bfloat16) runs it: the
                rotary tables, time embedder, modulation tables and AdaLN norms kept in fp32
The CUDA forward's error against output_fp64 must stay within 2x diffusers' bf16 error.
"""
import argparse
import copy
import os
import shutil

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=16,
    out_channels=16,
    text_dim=24,
    freq_dim=16,
    ffn_dim=64,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=32,
)
GPU_CONFIG = dict(CONFIG, attention_head_dim=64, text_dim=32, freq_dim=32, ffn_dim=256)
LATENT = (2, 16, 3, 10, 6)  # batch, channels, frames, height, width -> 3 x 5 x 3 patches
TEXT_TOKENS = 7


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Gives every parameter a random value of its init's scale, norm weights and biases included
    (diffusers initializes those to 1 and 0, which would leave them untested)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))


def forward(model: WanTransformer3DModel, inputs: dict, dtype: torch.dtype, timestep: str = "timestep") -> torch.Tensor:
    model = model.to(dtype)
    with torch.no_grad():
        out = model(
            hidden_states=inputs["hidden_states"].to(dtype),
            timestep=inputs[timestep].to(dtype),
            encoder_hidden_states=inputs["encoder_hidden_states"].to(dtype),
            return_dict=False,
        )[0]
    return out.float().contiguous()


def as_loaded_in_bf16(model: WanTransformer3DModel) -> WanTransformer3DModel:
    """The model in bf16 as from_pretrained(torch_dtype=torch.bfloat16) leaves it: parameters and
    buffers of the modules diffusers keeps in fp32 (_keep_in_fp32_modules: the rotary tables, the
    time embedder, the modulation tables, the AdaLN norms) stay fp32, the rest becomes bf16 (without
    needing accelerate, which from_pretrained needs for that)."""
    keep = set(model._keep_in_fp32_modules or [])
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for tensors in (module._parameters, module._buffers):
                for name, tensor in tensors.items():
                    full_name = f"{module_name}.{name}" if module_name else name
                    if tensor is not None and tensor.is_floating_point() and not keep & set(full_name.split(".")):
                        tensor.data = tensor.data.to(torch.bfloat16)
    return model


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def random_model_and_inputs(config: dict, seed: int):
    generator = torch.Generator().manual_seed(seed)
    model = WanTransformer3DModel(**config).eval()
    randomize(model, generator)
    inputs = {
        "hidden_states": torch.randn(LATENT, generator=generator),
        "timestep": torch.tensor([937.0, 421.5]),
        "encoder_hidden_states": torch.randn((LATENT[0], TEXT_TOKENS, config["text_dim"]), generator=generator),
    }
    return model, inputs


def write_gpu_fixture(out: str) -> None:
    model, inputs = random_model_and_inputs(GPU_CONFIG, 20251125)
    checkpoint = os.path.join(out, "checkpoint_bf16")
    shutil.rmtree(checkpoint, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(checkpoint, safe_serialization=True)
    with torch.no_grad():  # the stored weights, exactly (the rotary tables, no checkpoint's, stay exact)
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(parameter.dtype))
    exact = copy.deepcopy(model)
    as_users_load_it = as_loaded_in_bf16(copy.deepcopy(model))
    with torch.no_grad():
        bf16_out = as_users_load_it(
            hidden_states=inputs["hidden_states"].to(torch.bfloat16),
            timestep=inputs["timestep"],
            encoder_hidden_states=inputs["encoder_hidden_states"].to(torch.bfloat16),
            return_dict=False,
        )[0].float().contiguous()
    outputs = {"output_fp64": forward(exact, inputs, torch.float64), "output_bf16": bf16_out}
    save_file({**inputs, **outputs}, os.path.join(out, "io.safetensors"))
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(out) for f in files)
    print(f"wrote {out}: {total} bytes")
    print(f"diffusers bf16 vs float64 rel-L2: {rel_l2(outputs['output_bf16'], outputs['output_fp64']):.3e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="write the CUDA forward's fixture (head dim 64) instead")
    parser.add_argument("--out", default=None, help="default: tests/fixtures/wan, or tests/fixtures/wan_gpu with --gpu")
    args = parser.parse_args()
    fixtures = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    if args.gpu:
        write_gpu_fixture(args.out or os.path.join(fixtures, "wan_gpu"))
        return
    args.out = args.out or os.path.join(fixtures, "wan")

    model, inputs = random_model_and_inputs(CONFIG, 20251124)

    patches = LATENT[2] * (LATENT[3] // 2) * (LATENT[4] // 2)
    first_frame = patches // LATENT[2]
    inputs["timestep_per_token"] = inputs["timestep"][:, None].repeat(1, patches)
    inputs["timestep_per_token"][:, :first_frame] = 0.0

    os.makedirs(args.out, exist_ok=True)
    for sub in ("checkpoint", "checkpoint_bf16"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    model.save_pretrained(os.path.join(args.out, "checkpoint"), max_shard_size="40KB", safe_serialization=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(os.path.join(args.out, "checkpoint_bf16"), safe_serialization=True)
    # The reference for the bf16 file: its weights rounded to bf16, but the rotary tables (buffers
    # that .to(bfloat16) would round too, and that no checkpoint holds) left exact.
    bf16_weights = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in bf16_weights.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(parameter.dtype))

    outputs = {  # forward() casts its model in place, hence the copies
        "output_fp32": forward(copy.deepcopy(model), inputs, torch.float32),
        "output_fp64": forward(copy.deepcopy(model), inputs, torch.float64),
        "output_bf16_weights": forward(bf16_weights, inputs, torch.float64),
        "output_per_token_fp64": forward(copy.deepcopy(model), inputs, torch.float64, "timestep_per_token"),
    }
    save_file({**inputs, **outputs}, os.path.join(args.out, "io.safetensors"))

    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(args.out) for f in files)
    print(f"wrote {args.out}: {total} bytes; output rms {outputs['output_fp64'].pow(2).mean().sqrt():.4f}")
    print(f"diffusers fp32 vs float64 rel-L2: {rel_l2(outputs['output_fp32'], outputs['output_fp64']):.3e}")


if __name__ == "__main__":
    main()
