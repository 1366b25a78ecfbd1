// The engine-independent part of Communicator: argument checks and the blocking ring exchange.
#include <climits>

#include "communicator_checks.h"
#include "tessel/core/error.h"

namespace tessel {

void Communicator::ring_exchange(const ExecContext& ctx, const TensorView& send, const TensorView& recv) {
  ring_exchange_async(ctx, send, recv)->wait(ctx);
}

std::unique_ptr<PendingExchange> Communicator::all_to_all_async(const ExecContext& ctx, const TensorView& send,
                                                                const TensorView& recv) {
  all_to_all(ctx, send, recv);
  return parallel_detail::make_done_exchange();
}

namespace parallel_detail {

namespace {
class DonePendingExchange final : public PendingExchange {
 public:
  void wait(const ExecContext&) override {}
};
}  // namespace

std::unique_ptr<PendingExchange> make_done_exchange() { return std::make_unique<DonePendingExchange>(); }

void check_comm_tensor(const Communicator& comm, const TensorView& t, const std::string& argument) {
  check_device(t, comm.device(), argument);
  check_contiguous(t, argument);
  if (t.data() == nullptr && t.numel() > 0) fail_argument(argument, "a tensor with data", "a null data pointer");
}

size_t check_all_to_all(const Communicator& comm, const TensorView& send, const TensorView& recv) {
  check_comm_tensor(comm, send, "send");
  check_comm_tensor(comm, recv, "recv");
  const size_t parts = static_cast<size_t>(comm.size());
  if (send.nbytes() % parts != 0)
    fail_argument("send", detail::concat("a byte size divisible by the group size ", parts), send.nbytes());
  if (recv.nbytes() != send.nbytes())
    fail_argument("recv", detail::concat(send.nbytes(), " bytes (as send)"), recv.nbytes());
  return send.nbytes() / parts;
}

void check_all_gather(const Communicator& comm, const TensorView& send, const TensorView& recv) {
  check_comm_tensor(comm, send, "send");
  check_comm_tensor(comm, recv, "recv");
  const size_t expected = send.nbytes() * static_cast<size_t>(comm.size());
  if (recv.nbytes() != expected)
    fail_argument("recv", detail::concat(expected, " bytes (send's times the group size ", comm.size(), ")"),
                  recv.nbytes());
}

void check_ring_exchange(const Communicator& comm, const TensorView& send, const TensorView& recv) {
  check_comm_tensor(comm, send, "send");
  check_comm_tensor(comm, recv, "recv");
  if (recv.nbytes() != send.nbytes())
    fail_argument("recv", detail::concat(send.nbytes(), " bytes (as send)"), recv.nbytes());
  if (send.data() == recv.data() && send.nbytes() > 0 && comm.size() > 1)
    fail_argument("recv", "a buffer other than send", "the same memory");
}

size_t check_neighbour_exchange(const Communicator& comm, const TensorView& to_previous, const TensorView& to_next,
                                const TensorView& from_previous, const TensorView& from_next) {
  const TensorView* views[] = {&to_previous, &to_next, &from_previous, &from_next};
  const char* names[] = {"to_previous", "to_next", "from_previous", "from_next"};
  for (int i = 0; i < 4; ++i) {
    check_comm_tensor(comm, *views[i], names[i]);
    if (views[i]->nbytes() != to_previous.nbytes())
      fail_argument(names[i], detail::concat(to_previous.nbytes(), " bytes (as to_previous)"), views[i]->nbytes());
    for (int j = 0; j < i; ++j)
      if (views[i]->data() == views[j]->data() && views[i]->nbytes() > 0)
        fail_argument(names[i], detail::concat("a buffer other than ", names[j]), "the same memory");
  }
  return to_previous.nbytes();
}

int checked_count(size_t bytes, const std::string& what) {
  if (bytes > static_cast<size_t>(INT_MAX))
    fail_argument(what, detail::concat("at most ", INT_MAX, " bytes per message"), bytes);
  return static_cast<int>(bytes);
}

}  // namespace parallel_detail
}  // namespace tessel
