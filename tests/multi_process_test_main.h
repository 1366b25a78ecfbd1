// The main() of a multi-process test program (files named *_mpi_test.cc, see tests/CMakeLists.txt),
// built twice: launched by mpirun over the MPI communicator, and (TESSEL_TEST_SHM_WORLD) as one
// process that forks its ranks and joins them through a shared-memory world (`--ranks N`, default
// 2), with staging slots of 64 KiB so that every collective also runs in several pieces. The tests
// reach the world communicator through test_world() and its engine's name through
// test_world_engine(). Include this file in exactly one file of the program.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tessel/parallel/communicator.h"

namespace tessel::testing {

inline std::unique_ptr<Communicator>& test_world_slot() {
  static std::unique_ptr<Communicator> world;
  return world;
}
inline Communicator& test_world() { return *test_world_slot(); }
inline std::string test_world_engine() {
#ifdef TESSEL_TEST_SHM_WORLD
  return "shm";
#else
  return "mpi";
#endif
}

}  // namespace tessel::testing

#ifdef TESSEL_TEST_SHM_WORLD

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int ranks = 2;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--ranks=", 8) == 0) ranks = std::atoi(argv[i] + 8);
  if (ranks < 1 || ranks > 64) {
    std::fprintf(stderr, "--ranks=N: 1..64\n");
    return 2;
  }
  const std::string name = "/tessel-test-world-" + std::to_string(getpid());
  const tessel::ShmWorld world = tessel::ShmWorld::create(name, ranks, size_t{64} << 10);
  // Fork before anything starts threads (OpenMP's pool): each rank runs the whole test program.
  std::vector<pid_t> children;
  int rank = 0;
  for (int r = 1; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      rank = r;
      break;
    }
    children.push_back(pid);
  }
  tessel::testing::test_world_slot() = tessel::make_shm_communicator(name, rank);
  int status = RUN_ALL_TESTS();
  tessel::testing::test_world_slot().reset();
  if (rank != 0) _exit(status);
  for (const pid_t child : children) {
    int child_status = 0;
    waitpid(child, &child_status, 0);
    if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) status = 1;
  }
  return status;
}

#else

int main(int argc, char** argv) {
  tessel::MpiSession mpi;
  ::testing::InitGoogleTest(&argc, argv);
  tessel::testing::test_world_slot() = tessel::make_mpi_world_communicator();
  const int status = RUN_ALL_TESTS();
  tessel::testing::test_world_slot().reset();  // before MPI_Finalize
  return status;
}

#endif
