#!/usr/bin/env bash
# Installs the Debian packages tessel needs, only those missing (idempotent: no-op when all present).
set -euo pipefail
packages=(
  build-essential   # g++ (C++20) and make
  cmake             # build system
  ccache            # compiler cache: repeated CI stages and reruns recompile only what changed
  libgtest-dev      # GoogleTest: unit tests
  nlohmann-json3-dev # JSON: config parsing, --json output, safetensors headers
  libcli11-dev      # CLI11: command-line parsing of the tessel CLI
  libpng-dev        # libpng: `tessel mask` pictures, PNG frames out and images into image-to-video
  libjpeg-dev       # libjpeg-turbo: JPEG images into image-to-video
  libcpp-httplib-dev # cpp-httplib: the HTTP server of `tessel serve` and its tests' client (thread pool)
  libsentencepiece-dev # sentencepiece: the UMT5 tokenizer of Wan's text encoder
  pkg-config        # finds sentencepiece, libav and cpp-httplib (with the defines it was built with) for CMake
  libavformat-dev   # libav: MP4 output (optional at build time; H.264 through Debian's libx264)
  libavcodec-dev
  libswscale-dev
  libomp-dev        # OpenMP runtime headers (g++ uses libgomp; kept for clang builds)
  libopenblas-dev   # BLAS: reference comparisons in CPU benchmarks
  libopenmpi-dev    # MPI: the parallel layer's CPU communicator
  openmpi-bin       # mpirun: launches the multi-process parallel tests
  clang-14          # libFuzzer targets (scripts/fuzz.sh)
  libclang-rt-14-dev # libFuzzer, AddressSanitizer and UBSan runtimes for clang-14
)
missing=()
for entry in "${packages[@]}"; do
  pkg=${entry%% *}
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
