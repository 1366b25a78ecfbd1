// Argument checks every communicator engine runs before moving data, so that all engines reject
// the same calls with the same messages.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tessel/parallel/communicator.h"

namespace tessel::parallel_detail {

// t is on the communicator's device, contiguous, and has data when it is not empty.
void check_comm_tensor(const Communicator& comm, const TensorView& t, const std::string& argument);
// Both checked as above; returns the bytes of one rank's chunk of `send`.
size_t check_all_to_all(const Communicator& comm, const TensorView& send, const TensorView& recv);
void check_all_gather(const Communicator& comm, const TensorView& send, const TensorView& recv);
void check_ring_exchange(const Communicator& comm, const TensorView& send, const TensorView& recv);
// All four checked as above, of one byte size, none the same memory as another; returns the bytes.
size_t check_neighbour_exchange(const Communicator& comm, const TensorView& to_previous, const TensorView& to_next,
                                const TensorView& from_previous, const TensorView& from_next);
// A transfer that completed before it was returned (engines without asynchronous transfers).
std::unique_ptr<PendingExchange> make_done_exchange();
// Throws Error when `bytes` does not fit the int count an engine takes.
int checked_count(size_t bytes, const std::string& what);

}  // namespace tessel::parallel_detail
