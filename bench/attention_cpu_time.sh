#!/usr/bin/env bash
# Builds bench/attention_cpu_time.cc against build/lib/libtessel.so and runs it.
# Usage: bash bench/attention_cpu_time.sh [threads=2] [dtype=bf16] [seq=4096] [runs=7] [dense]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${TMPDIR:-/tmp}/tessel_attention_cpu_time
g++ -std=c++20 -O2 -fopenmp -I"$root/include" "$root/bench/attention_cpu_time.cc" -o "$exe" \
  -L"$root/build/lib" -ltessel -Wl,-rpath,"$root/build/lib"
"$exe" "${1:-2}" "${2:-bf16}" "${3:-4096}" "${4:-7}" ${5:-}
