# Two entry points (see README.md): `make demo` and `make test`. Both install missing Debian
# packages first, then build with CMake into build/.
#   make test       build + every ctest test, then the sanitizer stages (scripts/sanitize.sh:
#                   AddressSanitizer+UBSan over the CPU tests, ThreadSanitizer over the
#                   *_concurrency_test files), then every fuzzer for FUZZ_SECONDS (scripts/fuzz.sh).
#                   Then the Python package: pip install . and pytest python/tests (scripts/python-test.sh).
#   make sanitize   the sanitizer stages alone;  make fuzz   the fuzzers alone;  make python-test  the Python tests alone.
BUILD_DIR ?= build
# ccache (when installed) caches every compile of every stage: the main build, the sanitizer and fuzzer
# builds and the Python package's build. CMake reads these launchers from the environment. The base
# directory makes cache entries independent of where the checkout lives.
ifneq ($(shell command -v ccache 2>/dev/null),)
export CMAKE_C_COMPILER_LAUNCHER ?= ccache
export CMAKE_CXX_COMPILER_LAUNCHER ?= ccache
export CMAKE_CUDA_COMPILER_LAUNCHER ?= ccache
export CCACHE_BASEDIR ?= $(CURDIR)
endif
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60

.PHONY: deps build demo test unit-test sanitize fuzz python-test clean

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD_DIR)

unit-test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

sanitize: deps
	JOBS=$(JOBS) bash scripts/sanitize.sh all

fuzz: deps
	JOBS=$(JOBS) bash scripts/fuzz.sh --seconds $(FUZZ_SECONDS)

python-test: deps
	JOBS=$(JOBS) bash scripts/python-test.sh

test: unit-test
	$(MAKE) sanitize
	$(MAKE) fuzz
	$(MAKE) python-test

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
