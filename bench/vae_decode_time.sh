#!/usr/bin/env bash
# Builds bench/vae_decode_time.cc against build/lib/libtessel.so and runs it.
# Usage: bash bench/vae_decode_time.sh [preset=wan21|tiny] [latent frames=1] [latent height=60]
#        [latent width=104] [threads=2]      (60 x 104 latents are 480 x 832 pixels)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${TMPDIR:-/tmp}/tessel_vae_decode_time
g++ -std=c++20 -O2 -fopenmp -I"$root/include" "$root/bench/vae_decode_time.cc" -o "$exe" \
  -L"$root/build/lib" -ltessel -Wl,-rpath,"$root/build/lib"
"$exe" "${1:-wan21}" "${2:-1}" "${3:-60}" "${4:-104}" "${5:-2}"
