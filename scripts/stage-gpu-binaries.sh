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
# Libraries the device image may lack (it has CUDA, Python and PyTorch, not Debian's packages):
# every shared library the binaries resolve here, except the C/C++ runtime that every Linux has,
# the driver, and NCCL (PyTorch's wheel ships it: add its lib folder to LD_LIBRARY_PATH there).
ldd "$STAGE"/bin/* "$STAGE/lib/libtessel.so" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libcuda.so*|libnccl.so*) ;;
      libtessel.so) ;;
      *) [[ -e "$STAGE/lib/$name" ]] || cp -L "$path" "$STAGE/lib/$name" ;;
    esac
  done
du -sh "$STAGE"
