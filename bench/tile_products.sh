#!/usr/bin/env bash
# Builds and runs bench/tile_products_bench.cc (tessel micro-kernels vs OpenBLAS sgemm, 1 thread).
# Needs libopenblas-dev (Debian). Usage: bash bench/tile_products.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${TMPDIR:-/tmp}/tessel_tile_products_bench
g++ -std=c++20 -O3 -march=native -I"$root/include" -I"$root/src" -I/usr/include/x86_64-linux-gnu/openblas-pthread \
  "$root/bench/tile_products_bench.cc" "$root/src/kernels/cpu/tile_kernels.cc" -o "$out" -lopenblas
"$out"
