// A communicator that measures what passes through another one: the bytes this rank sends to other
// ranks and the seconds the caller spends blocked in communication, per rank, summed over calls.
// Groups split from it are metered into the same meter, so metering the world communicator before
// initialize_parallel_groups meters every group (benchmarks: `tessel sp-bench`, `tessel dit-bench`).
//
// Seconds are host wall time inside the calls and inside PendingExchange::wait, i.e. the
// communication the caller could not hide: a ring exchange that finished under the attention
// counts (almost) nothing. On CUDA the calls only enqueue work on the stream, so the seconds mean
// nothing there (synchronize and time the whole step instead); the bytes are exact on both.
// Bytes per operation, sent by this rank: all-to-all (n-1)/n of the send tensor, all-gather
// (n-1) times it, ring exchange the send tensor, all-reduce 2(n-1)/n of the tensor (ring
// algorithm); nothing for a group of one.
#pragma once

#include <cstdint>
#include <memory>

#include "tessel/parallel/communicator.h"

namespace tessel {

struct CommunicationMeter {
  double seconds = 0.0;
  double bytes = 0.0;
  int64_t calls = 0;
  void reset() { *this = {}; }
};

// Wraps `inner` (owned); `meter` is shared with the communicators split from the result.
std::unique_ptr<Communicator> make_metered_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<CommunicationMeter> meter);

}  // namespace tessel
