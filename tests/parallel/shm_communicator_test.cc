// The shared-memory communicator's own failure paths (its collectives run every multi-process test
// as the *_mpi_test_shm programs): a rank that exits while another waits for it, ranks that never
// join, a rank taken twice, regions that are not worlds, bad arguments.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/parallel/communicator.h"

namespace tessel {
namespace {

using testing::error_of;

std::string world_name(const char* what) { return detail::concat("/tessel-shm-test-", what, "-", getpid()); }

TEST(ShmCommunicator, OneRankWorldRunsEveryOperationLocally) {
  const ShmWorld world = ShmWorld::create(world_name("one"), 1);
  const auto comm = make_shm_communicator(world.name(), 0);
  EXPECT_EQ(comm->engine(), "shm");
  EXPECT_EQ(comm->size(), 1);
  const ExecContext ctx;
  Tensor a = Tensor::empty({3}, DType::kF32), b = Tensor::empty({3}, DType::kF32);
  for (int i = 0; i < 3; ++i) a.data_as<float>()[i] = static_cast<float>(i + 1);
  comm->ring_exchange(ctx, a, b);
  comm->all_reduce_sum(ctx, b);
  EXPECT_EQ(b.data_as<float>()[2], 3.0f);
  Tensor half = Tensor::empty({2}, DType::kF16);
  EXPECT_NE(error_of([&] { comm->all_reduce_sum(ctx, half); }).find("fp32 or fp64"), std::string::npos);
  EXPECT_NE(error_of([&] { comm->split(-1, 0); }).find("color"), std::string::npos);
  EXPECT_EQ(comm->split(3, 0)->size(), 1);
}

// A group that dies gives its barrier back: a long-lived world splits any number of times, and only
// more than 1023 groups alive at once is an error.
TEST(ShmCommunicator, SplitsReuseTheBarriersOfDeadGroups) {
  const ShmWorld world = ShmWorld::create(world_name("splits"), 1);
  const auto comm = make_shm_communicator(world.name(), 0);
  for (int i = 0; i < 3000; ++i) comm->split(i % 5, 0)->barrier(ExecContext{});
  std::vector<std::unique_ptr<Communicator>> alive;
  for (int i = 0; i < 1023; ++i) alive.push_back(comm->split(0, 0));
  EXPECT_NE(error_of([&] { comm->split(0, 0); }).find("more than 1023 groups of one world alive at once"), std::string::npos);
  alive.pop_back();
  EXPECT_EQ(comm->split(0, 0)->size(), 1);
}

TEST(ShmCommunicator, ARankThatExitsMakesTheWaitingRankFailNamingIt) {
  const ShmWorld world = ShmWorld::create(world_name("dead"), 2);
  const pid_t child = fork();
  if (child == 0) {
    const auto comm = make_shm_communicator(world.name(), 1);
    _exit(0);  // joined, then gone before the barrier rank 0 waits in
  }
  const auto comm = make_shm_communicator(world.name(), 0);
  const auto started = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { comm->barrier(ExecContext{}); });
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("exited"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  waitpid(child, nullptr, 0);
}

TEST(ShmCommunicator, RanksThatNeverJoinTimeOut) {
  const ShmWorld world = ShmWorld::create(world_name("late"), 3);
  const std::string error = error_of([&] { make_shm_communicator(world.name(), 0, 0.6); });
  EXPECT_NE(error.find("not every rank arrived"), std::string::npos) << error;
}

TEST(ShmCommunicator, RefusesBadWorldsAndRanks) {
  EXPECT_NE(error_of([] { ShmWorld::create(world_name("zero"), 0); }).find("ShmWorld size"), std::string::npos);
  EXPECT_NE(error_of([] { ShmWorld::create("no-slash", 2); }).find("shared-memory name"), std::string::npos);
  EXPECT_NE(error_of([] { make_shm_communicator(world_name("absent"), 0); }).find("cannot open the shared-memory world"),
            std::string::npos);
  const ShmWorld world = ShmWorld::create(world_name("ranks"), 2);
  EXPECT_NE(error_of([&] { make_shm_communicator(world.name(), 2); }).find("rank"), std::string::npos);
  EXPECT_NE(error_of([&] { make_shm_communicator(world.name(), -1); }).find("rank"), std::string::npos);
  // A region of the right size that no ShmWorld made.
  const ShmRegion stranger = ShmRegion::create(world_name("stranger"), 1 << 20);
  EXPECT_NE(error_of([&] { make_shm_communicator(stranger.name(), 0); }).find("made by ShmWorld::create"), std::string::npos);
}

}  // namespace
}  // namespace tessel
