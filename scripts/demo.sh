#!/usr/bin/env bash
# The main job (`make demo`): tessel bench on the default device (CUDA when a GPU is present),
# dense and block-sparse attention at several densities, checked against the fp64 reference; then
# the whole text-to-video path (tokenizer, text encoder, transformer, scheduler, VAE, video file) on
# a tiny model with random weights, on the CPU.
set -euo pipefail
build_dir=${1:-build}
tessel="$build_dir/bin/tessel"
"$tessel" version
if "$tessel" version | grep -q "cuda available: yes"; then
  # A Wan-2.1-like attention layer (40 heads, head_dim 128) at 6,630 tokens.
  "$tessel" bench --device cuda --dtype bf16 --batch 1 --heads 40 --head-dim 128 --seq 6630 \
    --density 1,0.5,0.25,0.1 --iters 20 --warmup 5
else
  # Sized to finish well under a minute on 2 CPU cores.
  "$tessel" bench --device cpu --dtype bf16 --batch 1 --heads 8 --head-dim 128 --seq 2048 \
    --density 1,0.5,0.25,0.1 --iters 5 --warmup 1
fi

# A tiny Wan model with RANDOM weights: the path is the real one, the picture is noise.
model_dir="$build_dir/demo-tiny-wan"
"$tessel" init-model --preset tiny --out "$model_dir"
if "$tessel" version | grep -q "mp4 output: no"; then video="$build_dir/demo-tiny-wan.png"; else video="$build_dir/demo-tiny-wan.mp4"; fi
"$tessel" generate --model "$model_dir" --prompt "a cat walking through a neon city at night" --size 64x64 \
  --frames 9 --steps 4 --threads 1 --cache teacache --out "$video"
echo "demo: $video was generated from RANDOM weights (tessel init-model): expect noise, not a cat"
cat <<NEXT
Next, with real weights (README.md, "Real Wan weights"): on a machine with network,
  pip install -U "huggingface_hub[cli]" && hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers --local-dir Wan2.1-T2V-1.3B-Diffusers
then
  $tessel generate --model Wan2.1-T2V-1.3B-Diffusers --device cuda --prompt "a cat walking through a neon city at night" \\
      --size 832x480 --frames 81 --steps 50 --out cat.mp4
NEXT
