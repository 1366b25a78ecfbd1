#!/usr/bin/env bash
# The main job (`make demo`): tessel bench on the default device (CUDA when a GPU is present),
# dense and block-sparse attention at several densities, checked against the fp64 reference.
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
