#!/usr/bin/env python3
"""Writes the Wan LoRA fixture under tests/fixtures/wan_lora/ with diffusers and peft.

    python scripts/make_lora_fixture.py [--out tests/fixtures/wan_lora]

Needs torch (CPU is enough), diffusers==0.42.1 and peft (0.17.1 works; see _let_peft_import). Reads
the committed tiny model of make_wan_fixture.py (tests/fixtures/wan/checkpoint/) and its inputs
(tests/fixtures/wan/io.safetensors) without regenerating them, draws ONE random rank-4 LoRA
(lora_alpha 8, so alpha/r = 2) on every nn.Linear of the model with a fixed seed, and writes it in
the forms people publish for Wan:

  peft/adapter_model.safetensors  diffusers/PEFT form, fp32: transformer.<diffusers module>.lora_A.weight
                                  and .lora_B.weight, no alpha tensors; r and lora_alpha in the
                                  safetensors metadata key lora_adapter_metadata, as diffusers'
                                  WanPipeline.save_lora_weights writes it: a JSON object whose keys
                                  carry the "transformer." prefix ("transformer.r", "transformer.lora_alpha")
  peft/adapter_config.json        the LoraConfig as PEFT writes it (r, lora_alpha, target_modules, peft_type)
  kohya.safetensors               kohya/musubi form, bf16: lora_unet_<Wan module, dots as underscores>
                                  .lora_down.weight (= lora_A), .lora_up.weight (= lora_B),
                                  .alpha (0-d fp32, 8)
  comfy.safetensors               ComfyUI form, fp16: diffusion_model.<Wan module>.lora_A.weight,
                                  .lora_B.weight, .alpha (0-d fp16, 8)
  diff.safetensors                LightX2V-style full deltas, fp32, for blocks 0 and 1:
                                  diffusion_model.blocks.{i}.self_attn.q.diff / .diff_b   (attn1.to_q weight / bias)
                                  diffusion_model.blocks.{i}.ffn.2.diff / .diff_b          (ffn.net.2 weight / bias)
                                  diffusion_model.blocks.{i}.norm3.diff                    (norm2.weight: cross-attn norm)
                                  diffusion_model.blocks.{i}.modulation.diff               (scale_shift_table, (1, 6, dim))
  expected.safetensors            float64 forwards of the merged models, rounded to fp32:
                                  output_base, output_peft, output_kohya, output_comfy (LoRA scale 0.75),
                                  output_diff (scale 1.0), output_peft_and_diff (both at once)

Wan module names are the original Wan repo's (blocks.{i}.self_attn.q, blocks.{i}.cross_attn.o,
blocks.{i}.ffn.0, time_embedding.0, time_projection.1, text_embedding.2, head.head, ...), as diffusers'
_convert_non_diffusers_wan_lora_to_diffusers reads them.

The references are merged by hand in float64 from the values as each file stores them (the bf16 and
fp16 roundings included): W += scale * (alpha / r) * B @ A, and for the diffs W += diff,
bias += diff_b, norm weight += diff, scale_shift_table += diff. The script then loads each LoRA file
through diffusers' own path (WanLoraLoaderMixin.lora_state_dict, load_lora_adapter, set_adapters at
0.75), forwards it in float64 and asserts it agrees with the hand merge to 1e-9 rel-L2. diffusers
refuses the kohya and comfy files (its converters take no LoRA outside the blocks, or no alpha
there): the script reports that and checks what they do take instead, the blocks-only part of
each, and the comfy file with the alphas outside the blocks folded into lora_A. It cannot check the
full diffs (diffusers' converter ignores .diff keys).

"float64" is diffusers' forward with everything cast to float64, as make_wan_fixture.py runs it;
the blocks' .float() casts still round the hidden states to fp32 at each norm and residual.
Rerunning writes the same bytes.
"""
import argparse
import json
import os
import re


def _let_peft_import() -> None:
    """peft 0.17 imports transformers.HybridCache, which transformers 5 removed, and diffusers
    imports peft: alias it to DynamicCache (peft uses it only for Gemma generation). The alias
    goes on the lazy module's class, as transformers replaces its module object while peft loads."""
    try:
        import transformers
        from transformers.utils import import_utils
    except ImportError:
        return
    if hasattr(transformers, "HybridCache"):
        return
    getattr_ = import_utils._LazyModule.__getattr__

    def with_hybrid_cache(self, name):
        if name == "HybridCache" and self.__name__ == "transformers":
            return getattr_(self, "DynamicCache")
        return getattr_(self, name)

    import_utils._LazyModule.__getattr__ = with_hybrid_cache


_let_peft_import()

import torch  # noqa: E402
from diffusers import WanTransformer3DModel  # noqa: E402
from diffusers.loaders import WanLoraLoaderMixin  # noqa: E402
from diffusers.utils import logging as diffusers_logging  # noqa: E402
from peft import LoraConfig  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

# Every float64 forward casts with .to(), as make_wan_fixture.py's does; quiet diffusers' warning about
# that (it concerns bf16/fp16 loads) and its progress bars.
diffusers_logging.get_logger("diffusers.models.modeling_utils").addFilter(
    lambda record: "kept in float32" not in record.getMessage()
)
diffusers_logging.disable_progress_bar()

RANK = 4
ALPHA = 8  # an int, so the JSON says 8 as PEFT users write it
LORA_SCALE = 0.75
DIFF_SCALE = 1.0
SEED = 20251126
TARGET_MODULES = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "ffn.net.0.proj",
    "ffn.net.2",
    "condition_embedder.time_embedder.linear_1",
    "condition_embedder.time_embedder.linear_2",
    "condition_embedder.time_proj",
    "condition_embedder.text_embedder.linear_1",
    "condition_embedder.text_embedder.linear_2",
    "proj_out",
]
# diffusers module name -> the Wan repo's
WAN_TOP = {
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "proj_out": "head.head",
}
WAN_BLOCK = {
    "attn1.to_q": "self_attn.q",
    "attn1.to_k": "self_attn.k",
    "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o",
    "attn2.to_q": "cross_attn.q",
    "attn2.to_k": "cross_attn.k",
    "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
}
# The full diffs: Wan name (after diffusion_model.) -> diffusers parameter, per block
DIFF_TARGETS = {
    "self_attn.q.diff": "attn1.to_q.weight",
    "self_attn.q.diff_b": "attn1.to_q.bias",
    "ffn.2.diff": "ffn.net.2.weight",
    "ffn.2.diff_b": "ffn.net.2.bias",
    "norm3.diff": "norm2.weight",  # Wan's norm3 is the cross-attention norm, diffusers' norm2
    "modulation.diff": "scale_shift_table",
}
DIFF_EPS = 0.03
# Why diffusers 0.42.1 refuses the kohya and comfy files: its converters cover less than the files hold.
REFUSALS = {
    "kohya": "_convert_musubi_wan_lora_to_diffusers takes blocks_ modules only",
    "comfy": "_convert_non_diffusers_wan_lora_to_diffusers reads no .alpha outside the blocks",
}


def wan_name(name: str) -> str:
    if name.startswith("blocks."):
        _, i, rest = name.split(".", 2)
        return f"blocks.{i}.{WAN_BLOCK[rest]}"
    return WAN_TOP[name]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def save(tensors: dict, path: str, metadata: dict | None = None) -> None:
    """save_file with the header's metadata in sorted order: safetensors writes it from a hash map,
    in an order that changes from run to run (and so would the committed bytes)."""
    save_file(tensors, path, metadata=metadata)
    if not metadata:
        return
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":")).encode()
        assert len(text) <= size, (len(text), size)
        f.seek(8)
        f.write(text.ljust(size, b" "))


def load_base(checkpoint: str) -> WanTransformer3DModel:
    return WanTransformer3DModel.from_pretrained(checkpoint).eval()


def forward(model: WanTransformer3DModel, inputs: dict) -> torch.Tensor:
    """make_wan_fixture.py's forward() in float64, the output left in float64."""
    model = model.to(torch.float64)
    with torch.no_grad():
        out = model(
            hidden_states=inputs["hidden_states"].to(torch.float64),
            timestep=inputs["timestep"].to(torch.float64),
            encoder_hidden_states=inputs["encoder_hidden_states"].to(torch.float64),
            return_dict=False,
        )[0]
    return out.contiguous()


def draw_adapter(checkpoint: str) -> tuple[LoraConfig, dict]:
    """The one adapter, made the way diffusers users train one: add_adapter, then every lora_A and
    lora_B redrawn at a scale that moves the output noticeably. Returns the config and peft's state
    dict (keys <module>.lora_A.weight / .lora_B.weight, fp32)."""
    model = load_base(checkpoint)
    linears = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    config = LoraConfig(
        r=RANK, lora_alpha=ALPHA, init_lora_weights=False, target_modules=TARGET_MODULES, lora_bias=False
    )
    model.add_adapter(config, adapter_name="style")
    generator = torch.Generator().manual_seed(SEED)
    wrapped = set()
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            wrapped.add(name)
            a = module.lora_A["style"].weight
            b = module.lora_B["style"].weight
            a.copy_(torch.randn(a.shape, generator=generator) / a.shape[1] ** 0.5)
            b.copy_(0.1 * torch.randn(b.shape, generator=generator) / RANK**0.5)
    assert wrapped == linears, f"LoRA on {sorted(wrapped)}, the model's Linears are {sorted(linears)}"
    state = get_peft_model_state_dict(model, adapter_name="style")
    assert len(state) == 2 * len(linears), sorted(state)
    return config, {k: v.detach().float().contiguous() for k, v in state.items()}


def adapter_metadata(config: LoraConfig) -> dict:
    """config.to_dict() as JSON-able, target_modules sorted (a set, which would reorder between runs)."""
    meta = config.to_dict()
    for key, value in meta.items():
        if isinstance(value, set):
            meta[key] = sorted(value)
    return json.loads(json.dumps(meta, default=str))


def write_files(out: str, config: LoraConfig, state: dict, diff: dict) -> None:
    os.makedirs(os.path.join(out, "peft"), exist_ok=True)
    meta = adapter_metadata(config)
    # As WanPipeline.save_lora_weights -> _save_lora_weights -> write_lora_layers writes it.
    packed = {f"transformer.{k}": v for k, v in meta.items()}
    save(
        {f"transformer.{k}": v for k, v in state.items()},
        os.path.join(out, "peft", "adapter_model.safetensors"),
        metadata={"format": "pt", "lora_adapter_metadata": json.dumps(packed, indent=2, sort_keys=True)},
    )
    with open(os.path.join(out, "peft", "adapter_config.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")

    kohya, comfy = {}, {}
    for key, value in state.items():
        module, kind = key.rsplit(".lora_", 1)  # kind: "A.weight" / "B.weight"
        wan = wan_name(module)
        up_down = "lora_down" if kind.startswith("A") else "lora_up"
        kohya[f"lora_unet_{wan.replace('.', '_')}.{up_down}.weight"] = value.to(torch.bfloat16)
        kohya[f"lora_unet_{wan.replace('.', '_')}.alpha"] = torch.tensor(float(ALPHA), dtype=torch.float32)
        comfy[f"diffusion_model.{wan}.lora_{kind}"] = value.to(torch.float16)
        comfy[f"diffusion_model.{wan}.alpha"] = torch.tensor(float(ALPHA), dtype=torch.float16)
    save(kohya, os.path.join(out, "kohya.safetensors"))
    save(comfy, os.path.join(out, "comfy.safetensors"))
    save(diff, os.path.join(out, "diff.safetensors"))


def draw_diff(checkpoint: str) -> dict:
    model = load_base(checkpoint)
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(SEED + 1)
    diff = {}
    for i in range(model.config.num_layers):
        for wan, ours in DIFF_TARGETS.items():
            shape = params[f"blocks.{i}.{ours}"].shape
            fan_in = shape[-1] if len(shape) == 2 else 1
            diff[f"diffusion_model.blocks.{i}.{wan}"] = DIFF_EPS * torch.randn(shape, generator=generator) / fan_in**0.5
    return diff


def read_lora(path: str) -> dict:
    """Any of the three LoRA files, as stored -> {diffusers module: (A, B, alpha)} in float64."""
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    if any(k.startswith("transformer.") for k in tensors):
        meta = json.loads(metadata["lora_adapter_metadata"])
        alpha = float(meta["transformer.lora_alpha"])
        assert int(meta["transformer.r"]) == RANK
        modules = {k.removeprefix("transformer.").rsplit(".lora_", 1)[0] for k in tensors}
        return {
            m: tuple(tensors[f"transformer.{m}.lora_{ab}.weight"].double() for ab in "AB") + (alpha,) for m in modules
        }
    ours = {}
    blocks = sorted({int(i) for i in re.findall(r"blocks[._](\d+)[._]", " ".join(tensors))})
    for module in list(WAN_TOP) + [f"blocks.{i}.{b}" for i in blocks for b in WAN_BLOCK]:
        wan = wan_name(module)
        kohya, comfy = f"lora_unet_{wan.replace('.', '_')}", f"diffusion_model.{wan}"
        if f"{kohya}.alpha" in tensors:
            a, b, alpha = (tensors[f"{kohya}.{k}"] for k in ("lora_down.weight", "lora_up.weight", "alpha"))
        elif f"{comfy}.alpha" in tensors:
            a, b, alpha = (tensors[f"{comfy}.{k}"] for k in ("lora_A.weight", "lora_B.weight", "alpha"))
        else:
            continue
        ours[module] = (a.double(), b.double(), alpha.item())
    assert 3 * len(ours) == len(tensors), f"{path}: unread keys"
    return ours


def merged(checkpoint: str, lora: dict | None = None, scale: float = LORA_SCALE, diff: dict | None = None):
    """The base model in float64 with the LoRA (values as stored) and/or the diffs merged by hand."""
    model = load_base(checkpoint).to(torch.float64)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for module, (a, b, alpha) in (lora or {}).items():
            params[f"{module}.weight"] += scale * (alpha / a.shape[0]) * (b @ a)
        for key, delta in (diff or {}).items():
            block, rest = key.removeprefix("diffusion_model.blocks.").split(".", 1)
            params[f"blocks.{block}.{DIFF_TARGETS[rest]}"] += DIFF_SCALE * delta.double()
    return model


def via_diffusers(checkpoint: str, source, inputs: dict, name: str) -> torch.Tensor:
    """diffusers' own loading: lora_state_dict (which converts kohya/musubi and diffusion_model.
    keys), load_lora_adapter with the file's metadata, set_adapters at LORA_SCALE."""
    if isinstance(source, str):
        state, metadata = WanLoraLoaderMixin.lora_state_dict(
            os.path.dirname(source), weight_name=os.path.basename(source), return_lora_metadata=True
        )
    else:  # copies: the converter scales some of the tensors it is given in place
        state, metadata = WanLoraLoaderMixin.lora_state_dict(
            {k: v.clone() for k, v in source.items()}, return_lora_metadata=True
        )
    model = load_base(checkpoint).to(torch.float64)
    model.load_lora_adapter(state, prefix="transformer", adapter_name=name, metadata=metadata)
    model.set_adapters([name], weights=[LORA_SCALE])
    return forward(model, inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: tests/fixtures/wan_lora")
    args = parser.parse_args()
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    out = args.out or os.path.join(fixtures, "wan_lora")
    checkpoint = os.path.join(fixtures, "wan", "checkpoint")
    inputs = load_file(os.path.join(fixtures, "wan", "io.safetensors"))
    inputs = {k: inputs[k].double() for k in ("hidden_states", "timestep", "encoder_hidden_states")}

    config, state = draw_adapter(checkpoint)
    diff = draw_diff(checkpoint)
    write_files(out, config, state, diff)

    files = {
        "peft": os.path.join(out, "peft", "adapter_model.safetensors"),
        "kohya": os.path.join(out, "kohya.safetensors"),
        "comfy": os.path.join(out, "comfy.safetensors"),
    }
    loras = {form: read_lora(path) for form, path in files.items()}
    stored_diff = load_file(os.path.join(out, "diff.safetensors"))

    outputs = {"output_base": forward(load_base(checkpoint), inputs)}
    for form, lora in loras.items():
        outputs[f"output_{form}"] = forward(merged(checkpoint, lora), inputs)
    outputs["output_diff"] = forward(merged(checkpoint, diff=stored_diff), inputs)
    outputs["output_peft_and_diff"] = forward(merged(checkpoint, loras["peft"], diff=stored_diff), inputs)

    base = outputs["output_base"]
    for key, value in outputs.items():
        if key != "output_base":
            print(f"{key} vs output_base rel-L2: {rel_l2(value, base):.4e}")
    for form in ("kohya", "comfy"):
        rounding = rel_l2(outputs[f"output_{form}"], outputs["output_peft"])
        print(f"output_{form} vs output_peft rel-L2 (its storage's rounding): {rounding:.4e}")
    change = rel_l2(outputs["output_peft"], base)
    assert 0.05 < change < 0.5, f"the LoRA moves the output by {change:.3e}"
    change = rel_l2(outputs["output_diff"], base)
    assert 0.01 < change < 0.2, f"the diffs move the output by {change:.3e}"

    # diffusers' own loading against the hand merge. The blocks round their hidden states to fp32
    # even in a float64 forward (diffusers' .float() casts), which can hide float64-level differences
    # there entirely (rel-L2 exactly 0); the modules outside the blocks stay float64.
    for form, path in files.items():
        try:
            checks = [("whole file", via_diffusers(checkpoint, path, inputs, form), outputs[f"output_{form}"])]
        except Exception as refusal:  # noqa: BLE001 - reported, then what diffusers does take is checked
            print(f"diffusers refuses {form} ({os.path.relpath(path, out)}; {REFUSALS[form]}): "
                  f"{type(refusal).__name__}: {str(refusal)[:300]}")
            tensors = load_file(path)
            prefix = "lora_unet_blocks_" if form == "kohya" else "diffusion_model.blocks."
            part = {k: v for k, v in tensors.items() if k.startswith(prefix)}
            lora = {m: v for m, v in loras[form].items() if m.startswith("blocks.")}
            checks = [(
                f"its blocks-only part ({len(part)} of {len(tensors)} tensors)",
                via_diffusers(checkpoint, part, inputs, f"{form}_blocks"),
                forward(merged(checkpoint, lora), inputs),
            )]
            if form == "comfy":
                # diffusers' converter reads no alpha outside the blocks (taking alpha = r there):
                # fold alpha / r (2, exact in fp16) into lora_A of those modules.
                folded = dict(tensors)
                for key in [k for k in tensors if k.endswith(".alpha") and not k.startswith(prefix)]:
                    module = key.removesuffix(".alpha")
                    down = folded[f"{module}.lora_A.weight"]
                    folded[f"{module}.lora_A.weight"] = down * (folded.pop(key).item() / down.shape[0])
                checks.append((
                    "the whole file, the alphas outside the blocks folded into lora_A",
                    via_diffusers(checkpoint, folded, inputs, f"{form}_folded"),
                    outputs[f"output_{form}"],
                ))
        for what, theirs, ours in checks:
            error = rel_l2(theirs, ours)
            print(f"{form}, {what}: diffusers vs manual merge rel-L2 {error:.3e}")
            assert error < 1e-9, f"{form}, {what}: diffusers and the manual merge disagree ({error:.3e})"
    try:
        converted = WanLoraLoaderMixin.lora_state_dict({k: v.clone() for k, v in stored_diff.items()})
        print(f"diff: diffusers' converter keeps only {sorted(converted)} (it ignores .diff and drops norm diffs);"
              " manual reference only")
    except Exception as refusal:  # noqa: BLE001
        print(f"diff: diffusers refuses it: {type(refusal).__name__}: {str(refusal)[:200]}; manual reference only")

    save(
        {k: v.float().contiguous() for k, v in outputs.items()},
        os.path.join(out, "expected.safetensors"),
        metadata={"lora_scale": str(LORA_SCALE), "diff_scale": str(DIFF_SCALE)},
    )
    total = 0
    for root, _, names in sorted(os.walk(out)):
        for name in sorted(names):
            size = os.path.getsize(os.path.join(root, name))
            total += size
            print(f"  {os.path.relpath(os.path.join(root, name), out)}: {size} bytes")
    print(f"wrote {out}: {total} bytes")


if __name__ == "__main__":
    main()
