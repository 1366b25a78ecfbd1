#include "tessel/core/io/bounded_read.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tessel/core/error.h"

namespace tessel {
namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void require_regular_file(const std::string& path, const std::string& argument) {
  struct stat info {};
  if (path.empty()) fail_argument(argument, "a file path", "''");
  if (::stat(path.c_str(), &info) != 0)
    fail_argument(argument, "a readable file", quoted_excerpt(path, 200) + " (cannot open: " + std::strerror(errno) + ")");
  if (!S_ISREG(info.st_mode)) fail_argument(argument, "a regular file", quoted_excerpt(path, 200) + " (" + file_kind(info.st_mode) + ")");
}

std::string read_file_bounded(const std::string& path, uint64_t max_bytes, const std::string& argument) {
  require_regular_file(path, argument);
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail_argument(argument, "a readable file", quoted_excerpt(path, 200) + " (cannot open: " + std::strerror(errno) + ")");
  std::string content;
  char buffer[1 << 16];
  size_t n = 0;
  // Read one chunk past the limit at most: the file may have grown since stat.
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    content.append(buffer, n);
    if (content.size() > max_bytes)
      fail_argument(argument, detail::concat("a file of at most ", max_bytes, " bytes"),
                    quoted_excerpt(path, 200) + " (larger)");
  }
  if (std::ferror(file.get())) fail_argument(argument, "a readable file", quoted_excerpt(path, 200) + " (read error)");
  return content;
}

}  // namespace tessel
