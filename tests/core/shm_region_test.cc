// Shared-memory objects left behind by a process killed by a signal: remove_stale_shm_regions takes
// exactly those named "/<stem><pid>-..." whose pid has exited, and leaves a live process's, this
// process's and other names alone.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "tessel/core/io/shm_region.h"

namespace tessel {
namespace {

bool exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// A child that creates `name` with its own pid and then dies by SIGKILL (no destructor runs), or
// stays alive until killed when `stay` is set.
pid_t child_creating(const std::string& stem, const std::string& suffix, bool stay) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    const std::string name = "/" + stem + std::to_string(getpid()) + suffix;
    ShmRegion region = ShmRegion::create(name, 4096);
    const char done = 1;
    if (write(ready[1], &done, 1) != 1) _exit(1);
    if (!stay) raise(SIGKILL);
    for (;;) pause();
  }
  close(ready[1]);
  char done = 0;
  if (read(ready[0], &done, 1) != 1) done = 0;
  close(ready[0]);
  return done == 1 ? pid : -1;
}

TEST(ShmRegion, StaleRegionsOfExitedProcessesAreRemovedAndOthersKept) {
  const std::string stem = "tessel-sweeptest-" + std::to_string(getpid()) + "-";
  const pid_t dead = child_creating(stem, "-g0-control", false);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const pid_t alive = child_creating(stem, "-g0-control", true);
  ASSERT_GT(alive, 0);
  const std::string dead_name = "/" + stem + std::to_string(dead) + "-g0-control";
  const std::string alive_name = "/" + stem + std::to_string(alive) + "-g0-control";
  ShmRegion own = ShmRegion::create("/" + stem + std::to_string(getpid()) + "-own", 4096);
  ShmRegion other = ShmRegion::create("/" + stem + "notapid-x", 4096);
  ASSERT_TRUE(exists(dead_name));  // the killed child left it behind

  EXPECT_EQ(remove_stale_shm_regions(stem), 1u);
  EXPECT_FALSE(exists(dead_name));
  EXPECT_TRUE(exists(alive_name));
  EXPECT_TRUE(exists(own.name()));
  EXPECT_TRUE(exists(other.name()));

  kill(alive, SIGKILL);
  waitpid(alive, nullptr, 0);
  EXPECT_EQ(remove_stale_shm_regions(stem), 1u);  // now the other child's too
  EXPECT_FALSE(exists(alive_name));
  EXPECT_TRUE(process_alive(getpid()));
  EXPECT_FALSE(process_alive(alive));
}

}  // namespace
}  // namespace tessel
