// Reading files named by a user (config files, model headers) without trusting them: only a
// regular file is read (not a directory, FIFO or device such as /dev/zero, which would block or
// never end), and never more than a stated number of bytes.
#pragma once

#include <cstdint>
#include <string>

namespace tessel {

// The whole content of the regular file `path`. Throws Error naming `argument` and the path when it
// does not exist, is not a regular file, cannot be read, or holds more than `max_bytes` bytes.
std::string read_file_bounded(const std::string& path, uint64_t max_bytes, const std::string& argument);

// Throws Error naming `argument` and the path unless `path` is an existing regular file.
void require_regular_file(const std::string& path, const std::string& argument);

}  // namespace tessel
