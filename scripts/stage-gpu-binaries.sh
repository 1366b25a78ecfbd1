#!/usr/bin/env bash
# Copies binaries built here for sm_90a (build dir, default build-cuda) and the shared libraries a
# bare GPU machine lacks into one folder (default .stage-gpu), to carry there and run with
#   LD_LIBRARY_PATH=.stage-gpu/lib scripts/gpu-check.sh --bin .stage-gpu/bin
# Usage: scripts/stage-gpu-binaries.sh [BUILD_DIR] [STAGE_DIR] [binary names...] (default: tessel
# backend_conformance_test and every *_gpu_test binary).
set -euo pipefail
BUILD="${1:-build-cuda}" STAGE="${2:-.stage-gpu}"
shift $(( $# < 2 ? $# : 2 ))
rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib"
if [[ $# -gt 0 ]]; then names=("$@"); else
  names=(tessel backend_conformance_test); for f in "$BUILD"/bin/*_gpu_test; do names+=("$(basename "$f")"); done
fi
# A binary older than the library was linked against an earlier build of it (its target was not
# rebuilt since): running it against this library can crash for reasons that are not bugs. Refuse.
stale=()
for n in "${names[@]}"; do
  [[ "$BUILD/bin/$n" -ot "$BUILD/lib/libtessel.so" ]] && stale+=("$n")
done
if [[ ${#stale[@]} -gt 0 ]]; then
  echo "stage-gpu-binaries: older than $BUILD/lib/libtessel.so (rebuild them first): ${stale[*]}" >&2
  exit 1
fi
for n in "${names[@]}"; do cp "$BUILD/bin/$n" "$STAGE/bin/"; done
cp "$BUILD/lib/libtessel.so" "$STAGE/lib/"
[[ -d "$BUILD/lib/plugins" ]] && cp -r "$BUILD/lib/plugins" "$STAGE/lib/" || true
# Libraries the device image may lack (it has CUDA and Python, not Debian's libpng/libgomp).
for lib in libcudart.so.13 libpng16.so.16 libgomp.so.1 libz.so.1; do
  path="$(ldd "$STAGE/bin/tessel" "$STAGE/lib/libtessel.so" | awk -v l="$lib" '$1 == l {print $3; exit}')"
  [[ -n "$path" ]] && cp -L "$path" "$STAGE/lib/"
done
du -sh "$STAGE"
