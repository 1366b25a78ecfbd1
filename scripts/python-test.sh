#!/usr/bin/env bash
# The Python package's tests: `pip install .` from this checkout (CPU kernels, portable flags), torch
# and diffusers from PyPI when they install (their tests skip cleanly otherwise), then pytest over
# python/tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2}
"$PYTHON" -m pip install --disable-pip-version-check --progress-bar off ".[test]"
if [ "${TESSEL_TEST_TORCH:-1}" = 1 ]; then
  "$PYTHON" -m pip install --disable-pip-version-check --progress-bar off torch ||
    echo "python-test: torch did not install; the torch tests will be skipped"
  "$PYTHON" -m pip install --disable-pip-version-check --progress-bar off diffusers ||
    echo "python-test: diffusers did not install; the diffusers tests will be skipped"
fi
# Run from the repository root so `import tessel` finds the installed package, not python/tessel.
"$PYTHON" -m pytest -q -p no:cacheprovider python/tests
