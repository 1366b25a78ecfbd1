#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang-14, -fsanitize=fuzzer,address,undefined, CPU-only
# library build in its own folder) and runs each for a fixed time on its committed seed corpus.
# Usage: scripts/fuzz.sh [--seconds N] [--build-only] [fuzzer names...]   (default: 60 s, all)
# Environment: FUZZ_BUILD_DIR (default <repo>/build-fuzz), JOBS (default nproc).
# New interesting inputs go to $FUZZ_BUILD_DIR/corpus/<fuzzer>/ (never into the committed seeds);
# a crash leaves its reproducer in $FUZZ_BUILD_DIR/artifacts/<fuzzer>/ and fails the script.
# To keep a reproducer as a regression seed, copy it into fuzz/corpus/<fuzzer>/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${JOBS:-$(nproc)}"
SECONDS_EACH=60 BUILD_ONLY=0 SELECTED=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
    *) SELECTED+=("$1"); shift ;;
  esac
done
if [[ ${#SELECTED[@]} -eq 0 ]]; then
  mapfile -t SELECTED < <(find "$ROOT/fuzz" -maxdepth 1 -name '*_fuzzer.cc' -exec basename {} .cc \; | sort)
fi

echo "== fuzz: build ($BUILD, clang-14)"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DTESSEL_FUZZ=ON \
  -DTESSEL_CUDA=OFF -DTESSEL_NATIVE=OFF -DTESSEL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${SELECTED[@]}"
[[ $BUILD_ONLY == 1 ]] && exit 0

# The fuzzers run JOBS at a time (each is single-threaded), so CI spends SECONDS_EACH per JOBS fuzzers.
run_one() {  # run_one <fuzzer>: exit status 0 when it ran its time without a finding
  local fuzzer="$1"
  local corpus="$BUILD/corpus/$fuzzer" artifacts="$BUILD/artifacts/$fuzzer" seeds="$ROOT/fuzz/corpus/$fuzzer"
  mkdir -p "$corpus" "$artifacts"
  [[ -d "$seeds" ]] || { echo "fuzz: no seed corpus $seeds" >&2; return 1; }
  # -rss_limit_mb: an input that makes the library allocate without bound is a finding too.
  "$BUILD/bin/$fuzzer" "$corpus" "$seeds" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$BUILD/$fuzzer.log" 2>&1
}
declare -A pid_of=()
for fuzzer in "${SELECTED[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do sleep 1; done
  echo "== fuzz: $fuzzer for ${SECONDS_EACH} s"
  run_one "$fuzzer" &
  pid_of[$fuzzer]=$!
done
failed=()
for fuzzer in "${SELECTED[@]}"; do
  if wait "${pid_of[$fuzzer]}"; then
    # The last "#N DONE" / "stat::" lines carry the executions and coverage.
    echo "$fuzzer: $(grep -E '^#[0-9]+.*DONE|^stat::number_of_executed_units|^stat::peak_rss_mb' "$BUILD/$fuzzer.log" | tr '\n' ' ')"
  else
    tail -40 "$BUILD/$fuzzer.log"
    echo "fuzz: $fuzzer FAILED; reproducer(s): $(ls "$BUILD/artifacts/$fuzzer" 2>/dev/null)" >&2
    failed+=("$fuzzer")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "== fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "== fuzz: passed (${#SELECTED[@]} fuzzers, ${SECONDS_EACH} s each)"
