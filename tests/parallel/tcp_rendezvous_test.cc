// The TCP rendezvous of ranks launched without mpirun: four ranks (threads here) get rank 0's
// payload whichever arrives first, a missing rank 0 ends in an Error after the timeout, and bad
// fields are named.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "error_of.h"
#include "free_port.h"
#include "tessel/core/error.h"
#include "tessel/parallel/communicator.h"

namespace tessel {
namespace {

using testing::error_of;
using testing::free_port;

TcpRendezvous rendezvous(int rank, int size, int port) {
  TcpRendezvous r;
  r.rank = rank;
  r.size = size;
  r.port = port;
  r.timeout_s = 20.0;
  return r;
}

TEST(TcpRendezvous, EveryRankGetsRankZerosPayloadWhoeverArrivesFirst) {
  const int size = 4, port = free_port();
  const std::vector<uint8_t> payload = {7, 0, 255, 42, 1};
  std::vector<std::vector<uint8_t>> received(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> ranks;
  for (int rank = size - 1; rank >= 0; --rank) {  // rank 0 last: the others retry until it listens
    ranks.emplace_back([&, rank] {
      errors[rank] = error_of([&] { received[rank] = tcp_broadcast(rendezvous(rank, size, port), rank == 0 ? payload : std::vector<uint8_t>{9}); });
    });
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(errors[rank], "") << "rank " << rank;
    EXPECT_EQ(received[rank], payload) << "rank " << rank;
  }
  // A world of one needs no network.
  EXPECT_EQ(tcp_broadcast(rendezvous(0, 1, port), payload), payload);
}

TEST(TcpRendezvous, MissingRankZeroAndBadFieldsAreErrors) {
  TcpRendezvous lonely = rendezvous(1, 2, free_port());
  lonely.timeout_s = 0.3;
  EXPECT_NE(error_of([&] { tcp_broadcast(lonely, {}); }).find("connect to rank 0"), std::string::npos);
  EXPECT_NE(error_of([&] { tcp_broadcast(rendezvous(2, 2, 29511), {}); }).find("TcpRendezvous.rank"), std::string::npos);
  EXPECT_NE(error_of([&] { tcp_broadcast(rendezvous(0, 2, 70000), {}); }).find("TcpRendezvous.port"), std::string::npos);
}

}  // namespace
}  // namespace tessel
