#!/usr/bin/env bash
# The main job (`make demo`): tessel bench on the default device (CUDA when a GPU is present).
set -euo pipefail
build_dir=${1:-build}
"$build_dir/bin/tessel" version
