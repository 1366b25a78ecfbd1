#!/usr/bin/env bash
# FP8 against bf16 attention on a Hopper GPU under every kernel variant of both (docs/cuda-kernels.md,
# "Kernel variants" and "FP8 variants"): B=1, H=40, D=128, dense and block-sparse at density 0.2,
# one `tessel bench` run per length, so that all variants are timed in interleaved rounds (median
# ms, TFLOP/s) and each row carries its max_rel_err against the fp64 reference. Rows read
# dense@wide, dense_fp8@fp8+smoothk+lazy, block_sparse_fp8@fp8, ...
# Usage: bash bench/fp8_attention_variants.sh [TESSEL_BINARY]   (default build-cuda/bin/tessel)
# Environment: SEQS (default "6630 12870 29700"), ITERS (default 20).
set -euo pipefail
tessel=${1:-build-cuda/bin/tessel}
for s in ${SEQS:-6630 12870 29700}; do
  echo "== tessel bench --fp8 --kernel-variants all S=$s"
  "$tessel" bench --device cuda --dtype bf16 --batch 1 --heads 40 --head-dim 128 --seq "$s" --density 1,0.2 --fp8 \
    --kernel-variants all --iters "${ITERS:-20}" --warmup 3
done
