#!/usr/bin/env bash
# Sanitizer stages of CI, each in its own CPU-only build folder (no CUDA: the sanitizers cover
# host code; device code is checked by compute-sanitizer in scripts/gpu-check.sh):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer build; runs every CPU test (ctest -L cpu).
#         Any UB report aborts the test (-fno-sanitize-recover=undefined, halt_on_error).
#   tsan  ThreadSanitizer build; runs every test whose file is named *_concurrency_test.cc
#         (skipped with a message when none exists).
# Usage: scripts/sanitize.sh [asan|tsan|all]   (default all)
# Environment: SANITIZE_BUILD_ROOT (folder holding build-asan/ and build-tsan/; default the
#              repository root), JOBS (parallel compile jobs; default nproc).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_ROOT="${SANITIZE_BUILD_ROOT:-$ROOT}"
JOBS="${JOBS:-$(nproc)}"
STAGE="${1:-all}"
case "$STAGE" in asan|tsan|all) ;; *) echo "sanitize: unknown stage '$STAGE' (expected asan, tsan or all)" >&2; exit 2 ;; esac

# clang-14 (the fuzzers' compiler too): it builds this code base several times faster than g++
# with sanitizers on. -O2 keeps the tests fast; line tables are enough for file:line in reports.
# TESSEL_NATIVE=OFF: the sanitizer build must run on any x86-64 runner.
configure() {  # configure <build dir> <sanitizer flags>
  local flags="$2 -fno-omit-frame-pointer -gline-tables-only"
  cmake -S "$ROOT" -B "$1" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DTESSEL_CUDA=OFF \
    -DTESSEL_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$2" -DCMAKE_SHARED_LINKER_FLAGS="$2" -DCMAKE_MODULE_LINKER_FLAGS="$2" >/dev/null
}

# Test executables built from *_concurrency_test.cc files (one executable per test file).
concurrency_tests() {
  find "$ROOT/tests" -name '*_concurrency_test.cc' -exec basename {} .cc \; | sort
}

run_asan() {
  local build="$BUILD_ROOT/build-asan"
  echo "== sanitize asan: AddressSanitizer + UndefinedBehaviorSanitizer ($build)"
  configure "$build" "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  cmake --build "$build" -j "$JOBS"
  # detect_leaks stays on (default on Linux); plugins are dlclose'd, so keep their symbols for reports.
  ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1:fast_unwind_on_malloc=0" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    ctest --test-dir "$build" -L cpu --output-on-failure -j "$JOBS"
}

run_tsan() {
  local build="$BUILD_ROOT/build-tsan"
  local tests
  tests="$(concurrency_tests)"
  if [[ -z "$tests" ]]; then
    echo "== sanitize tsan: skipped: no tests/**/*_concurrency_test.cc exists yet"
    return 0
  fi
  echo "== sanitize tsan: ThreadSanitizer ($build): $(echo $tests)"
  configure "$build" "-fsanitize=thread"
  # shellcheck disable=SC2086
  cmake --build "$build" -j "$JOBS" --target $tests
  # OMP_NUM_THREADS=1: the OpenMP runtime (libomp with clang, libgomp with g++) is not built with
  # ThreadSanitizer, so TSan cannot see the barriers and locks of its worker threads and reports
  # every parallel region's hand-off as a race (false positives that would hide real ones). With one OpenMP thread each parallel region runs on the
  # calling thread, and what is left to check is exactly what these tests are about: the threads
  # the tests start themselves sharing modules, plans and caches.
  local failed=0 t
  for t in $tests; do
    echo "-- $t"
    OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" "$build/bin/$t" || failed=1
  done
  return $failed
}

# Plain `if` calls: a function called as part of `a && f` would run with errexit ignored.
if [[ "$STAGE" == asan || "$STAGE" == all ]]; then run_asan; fi
if [[ "$STAGE" == tsan || "$STAGE" == all ]]; then run_tsan; fi
echo "== sanitize $STAGE: passed"
