#include "tessel/core/io/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "tessel/core/error.h"

namespace tessel {

ShmRegion ShmRegion::create(const std::string& name, size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200)
    fail_argument("shared-memory name", "'/' followed by up to 199 characters without '/'", quoted_excerpt(name));
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw Error(detail::concat("shm_open(", name, ") failed: ", std::strerror(errno)));
  void* memory = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int saved_errno = errno;
  close(fd);
  if (memory == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw Error(detail::concat("cannot map ", bytes, " bytes of shared memory for ", name, ": ", std::strerror(saved_errno)));
  }
  ShmRegion region;
  region.name_ = name;
  region.data_ = memory;
  region.bytes_ = bytes;
  region.owner_ = true;
  return region;
}

ShmRegion ShmRegion::open(const std::string& name, size_t min_bytes, const char* what) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw Error(detail::concat("cannot open the ", what, " ", quoted_excerpt(name), ": ", std::strerror(errno)));
  struct stat st {};
  void* memory = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= min_bytes)
    memory = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED)
    throw Error(detail::concat(quoted_excerpt(name), ": expected a ", what, " of at least ", min_bytes, " bytes, got ",
                               st.st_size, " bytes"));
  ShmRegion region;
  region.name_ = name;
  region.data_ = memory;
  region.bytes_ = static_cast<size_t>(st.st_size);
  return region;
}

ShmRegion::ShmRegion(ShmRegion&& other) noexcept { *this = std::move(other); }

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    this->~ShmRegion();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (owner_) shm_unlink(name_.c_str());
  data_ = nullptr;
  owner_ = false;
}

bool process_alive(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || (line[close + 2] != 'Z' && line[close + 2] != 'X');
}

size_t remove_stale_shm_regions(const std::string& stem) {
  std::error_code error;
  size_t removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) != 0) continue;
    size_t digits = stem.size();
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
    if (digits == stem.size() || digits >= name.size() || name[digits] != '-' || digits - stem.size() > 9) continue;
    const int pid = std::stoi(name.substr(stem.size(), digits - stem.size()));
    if (pid <= 0 || pid == getpid() || process_alive(pid)) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace tessel
