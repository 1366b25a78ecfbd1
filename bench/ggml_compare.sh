#!/usr/bin/env bash
# Dense CPU attention: tessel vs ggml's flash_attn_ext on the same shape and thread count, in
# interleaved rounds (the machine may be shared: both see the same load). Each line gives the
# median wall time and the median process CPU time (GFLOP/s per CPU-second).
# ggml is never part of this repository: build it elsewhere first, e.g.
#   git clone https://github.com/ggml-org/ggml /tmp/ggml
#   cmake -S /tmp/ggml -B /tmp/ggml/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON
#   cmake --build /tmp/ggml/build -j
# Usage: bash bench/ggml_compare.sh /tmp/ggml [threads=2] [seq=4096] [runs=5] [rounds=2]   (B=1, H=8, D=128)
set -euo pipefail
ggml=${1:?path to a ggml checkout with a build/ directory}
threads=${2:-2} seq=${3:-4096} runs=${4:-5} rounds=${5:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${TMPDIR:-/tmp}/ggml_flash_attn_bench
libdir=$(dirname "$(find "$ggml/build" -name 'libggml-base.so' | head -1)")
g++ -std=c++17 -O2 -I"$ggml/include" "$root/bench/ggml_flash_attn_bench.cc" -o "$exe" \
  -L"$libdir" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$libdir"
tessel_exe=${TMPDIR:-/tmp}/tessel_attention_cpu_time
g++ -std=c++20 -O2 -fopenmp -I"$root/include" "$root/bench/attention_cpu_time.cc" -o "$tessel_exe" \
  -L"$root/build/lib" -ltessel -Wl,-rpath,"$root/build/lib"
for round in $(seq "$rounds"); do
  echo "round $round"
  "$exe" "$threads" 8 "$seq" 128 f16 "$runs"
  for dtype in fp16 bf16; do "$tessel_exe" "$threads" "$dtype" "$seq" "$runs" dense | tail -1 | sed "s/^/tessel $dtype /"; done
  "$exe" "$threads" 8 "$seq" 128 f32 "$runs"
  "$tessel_exe" "$threads" fp32 "$seq" "$runs" dense | tail -1 | sed "s/^/tessel fp32 /"
done
