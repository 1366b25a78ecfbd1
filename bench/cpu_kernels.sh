#!/usr/bin/env bash
# The CPU kernel figures of docs/benchmarks.md: 2 threads, B=1, H=8, S=4096, D=128, dense and
# block-sparse at densities 0.25 and 0.1, fp32 and bf16. Usage: bash bench/cpu_kernels.sh [iters=10]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-10}
for dtype in fp32 bf16; do
  "$root/build/bin/tessel" bench --device cpu --threads 2 --dtype "$dtype" --batch 1 --heads 8 --seq 4096 \
    --head-dim 128 --density 1,0.25,0.1 --iters "$iters" --warmup 1
done
