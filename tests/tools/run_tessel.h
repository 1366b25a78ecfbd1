// Runs the built `tessel` binary for CLI tests: arguments as shell text, the sparse-attention
// environment variables cleared (a developer's environment must not change a test), stdout and
// stderr captured together; a scratch folder per test.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

// Whether this test (and the `tessel` it starts, built alike) runs under a sanitizer: memory peaks
// are then the sanitizer's (shadow memory, redzones) and Open MPI's start-up leaks are reported.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kBuiltWithMemorySanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kBuiltWithMemorySanitizer = true;
#else
inline constexpr bool kBuiltWithMemorySanitizer = false;
#endif
#else
inline constexpr bool kBuiltWithMemorySanitizer = false;
#endif

namespace tessel {

struct TesselRun {
  int status = -1;  // the exit status, -1 when the process did not exit normally
  std::string out;
};

// The `tessel` binary: the build's (TESSEL_BINARY_DIR, compiled in), unless TESSEL_BINARY names
// another in the environment (test binaries staged to a GPU machine beside their own `tessel`).
inline std::string tessel_binary_path() {
  const char* from_environment = std::getenv("TESSEL_BINARY");
  return from_environment != nullptr && *from_environment != '\0' ? from_environment : std::string(TESSEL_BINARY_DIR) + "/bin/tessel";
}

inline TesselRun run_tessel_binary(const std::string& args, const std::filesystem::path& log) {
  const std::string command = "env -u TESSEL_SPARSE_ATTN_BACKEND -u DIFFUSION_SPARSE_ATTN_BACKEND -u TESSEL_SPARSE_ATTN_CONFIG '" +
                              tessel_binary_path() + "' " + args + " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return TesselRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

// A folder for the current test's files, <temp>/<prefix><test name>, created on first use.
inline std::filesystem::path test_scratch_dir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace tessel
