// The main() of a test program launched under mpirun (files named *_mpi_test.cc, see
// tests/CMakeLists.txt): an MPI session around the GoogleTest run, and the world communicator the
// tests reach through mpi_world(). Include it in exactly one file of the program.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "tessel/parallel/communicator.h"

namespace tessel::testing {

inline std::unique_ptr<Communicator>& mpi_world_slot() {
  static std::unique_ptr<Communicator> world;
  return world;
}
inline Communicator& mpi_world() { return *mpi_world_slot(); }

}  // namespace tessel::testing

int main(int argc, char** argv) {
  tessel::MpiSession mpi;
  ::testing::InitGoogleTest(&argc, argv);
  tessel::testing::mpi_world_slot() = tessel::make_mpi_world_communicator();
  const int status = RUN_ALL_TESTS();
  tessel::testing::mpi_world_slot().reset();  // before MPI_Finalize
  return status;
}
