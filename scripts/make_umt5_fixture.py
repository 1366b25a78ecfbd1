#!/usr/bin/env python3
"""Writes tests/fixtures/diffusion/umt5/: a tiny random transformers UMT5EncoderModel and its
output on fixed token ids, the reference for tessel's UMT5 text encoder.

Needs torch and transformers:
    python3 scripts/make_umt5_fixture.py [--out tests/fixtures/diffusion/umt5]

Writes config.json and model.safetensors (save_pretrained, fp32) and io.safetensors with
input_ids (2, 9) int32, attention_mask (2, 9) int32 (the second row padded after 5 tokens, as the
pipeline pads to its maximum length) and last_hidden_state (2, 9, 32) from the float64 forward.
Every weight is random (layer norms too, which transformers initializes to 1).
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import UMT5Config, UMT5EncoderModel


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/diffusion/umt5")
    args = parser.parse_args()
    config = UMT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                        relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)
    torch.manual_seed(5)
    model = UMT5EncoderModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape))
            else:
                parameter.copy_(torch.randn(parameter.shape) / max(parameter.shape[-1], 1) ** 0.5)
    model.save_pretrained(args.out, safe_serialization=True)
    input_ids = torch.randint(1, 64, (2, 9))
    attention_mask = torch.ones(2, 9, dtype=torch.int64)
    attention_mask[1, 5:] = 0
    input_ids[1, 5:] = 0
    with torch.no_grad():
        out = model.double()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    save_file({"input_ids": input_ids.to(torch.int32), "attention_mask": attention_mask.to(torch.int32),
               "last_hidden_state": out.float().contiguous()}, os.path.join(args.out, "io.safetensors"))


if __name__ == "__main__":
    main()
