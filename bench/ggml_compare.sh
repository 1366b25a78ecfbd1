#!/usr/bin/env bash
# Dense CPU attention: tessel vs ggml's flash_attn_ext on the same shape and thread count.
# ggml is never part of this repository: build it elsewhere first, e.g.
#   git clone https://github.com/ggml-org/ggml /tmp/ggml
#   cmake -S /tmp/ggml -B /tmp/ggml/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON
#   cmake --build /tmp/ggml/build -j
# Usage: bash bench/ggml_compare.sh /tmp/ggml [threads=2] [heads=8] [seq=4096] [head_dim=128] [runs=10]
set -euo pipefail
ggml=${1:?path to a ggml checkout with a build/ directory}
threads=${2:-2} heads=${3:-8} seq=${4:-4096} dim=${5:-128} runs=${6:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${TMPDIR:-/tmp}/ggml_flash_attn_bench
libdir=$(dirname "$(find "$ggml/build" -name 'libggml-base.so' | head -1)")
g++ -std=c++17 -O2 -I"$ggml/include" "$root/bench/ggml_flash_attn_bench.cc" -o "$exe" \
  -L"$libdir" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$libdir"
for kv in f16 f32; do "$exe" "$threads" "$heads" "$seq" "$dim" "$kv" "$runs"; done
for dtype in fp16 bf16 fp32; do
  "$root/build/bin/tessel" bench --device cpu --threads "$threads" --dtype "$dtype" --heads "$heads" --seq "$seq" \
    --head-dim "$dim" --density 1 --iters "$runs" --warmup 1 | tail -1 | sed "s/^/tessel $dtype: /"
done
