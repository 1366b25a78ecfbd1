#!/usr/bin/env bash
# Builds and runs bench/tile_products_bench.cc (tessel micro-kernels vs OpenBLAS sgemm, 1 thread).
# Needs libopenblas-dev (Debian). Usage: bash bench/tile_products.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${TMPDIR:-/tmp}/tessel_tile_products_bench
flags=(-std=c++20 -O3 -march=native -I"$root/include" -I"$root/src/kernels")
# The tile kernels for this machine (the "native" variant) and the dispatcher that selects it.
g++ "${flags[@]}" -DTESSEL_CPU_ISA=native -c "$root/src/kernels/cpu/tile_kernels.cc" -o "$out.kernels.o"
g++ "${flags[@]}" -DTESSEL_TILE_KERNELS_NATIVE=1 -c "$root/src/kernels/cpu/tile_kernels_dispatch.cc" -o "$out.dispatch.o"
g++ "${flags[@]}" -I/usr/include/x86_64-linux-gnu/openblas-pthread "$root/bench/tile_products_bench.cc" \
  "$out.kernels.o" "$out.dispatch.o" -o "$out" -lopenblas
"$out"
