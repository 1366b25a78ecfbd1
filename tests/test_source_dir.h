// Where a test finds the repository's files (fixtures): the checkout it was built from
// (TESSEL_SOURCE_DIR, compiled in), unless TESSEL_SOURCE_DIR is set in the environment, for test
// binaries built on one machine and run from another checkout (the GPU tests staged to a GPU machine).
#pragma once

#include <cstdlib>
#include <filesystem>

namespace tessel::test_support {

inline std::filesystem::path source_dir() {
  const char* from_environment = std::getenv("TESSEL_SOURCE_DIR");
  return from_environment != nullptr && *from_environment != '\0' ? from_environment : TESSEL_SOURCE_DIR;
}

}  // namespace tessel::test_support
