// The tracing decorator of any communicator (see traced_communicator.h).
#include "tessel/parallel/traced_communicator.h"

#include <utility>

#include "tessel/core/error.h"
#include "tessel/core/sync_trace.h"

namespace tessel {
namespace {

class TracedPendingExchange final : public PendingExchange {
 public:
  TracedPendingExchange(std::unique_ptr<PendingExchange> inner, std::string what)
      : inner_(std::move(inner)), what_(std::move(what)) {}
  void wait(const ExecContext& ctx) override {
    const SyncTraceScope trace(sync_trace_enabled() ? what_ + " wait" : std::string());
    inner_->wait(ctx);
  }

 private:
  std::unique_ptr<PendingExchange> inner_;
  std::string what_;
};

class TracedCommunicator final : public Communicator {
 public:
  TracedCommunicator(std::unique_ptr<Communicator> inner, std::string label)
      : inner_(std::move(inner)), label_(std::move(label)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  std::string engine() const override { return inner_->engine(); }

  void all_to_all(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    const SyncTraceScope trace(describe("all_to_all", send.nbytes()));
    inner_->all_to_all(ctx, send, recv);
  }
  void all_gather(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    const SyncTraceScope trace(describe("all_gather", send.nbytes()));
    inner_->all_gather(ctx, send, recv);
  }
  void all_reduce_sum(const ExecContext& ctx, const TensorView& tensor) override {
    const SyncTraceScope trace(describe("all_reduce_sum", tensor.nbytes()));
    inner_->all_reduce_sum(ctx, tensor);
  }
  std::unique_ptr<PendingExchange> all_to_all_async(const ExecContext& ctx, const TensorView& send,
                                                    const TensorView& recv) override {
    std::string what = describe("all_to_all_async", send.nbytes());
    const SyncTraceScope trace(what);
    return std::make_unique<TracedPendingExchange>(inner_->all_to_all_async(ctx, send, recv), std::move(what));
  }
  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext& ctx, const TensorView& send,
                                                       const TensorView& recv) override {
    std::string what = describe("ring_exchange", send.nbytes());
    const SyncTraceScope trace(what);
    return std::make_unique<TracedPendingExchange>(inner_->ring_exchange_async(ctx, send, recv), std::move(what));
  }
  void neighbour_exchange(const ExecContext& ctx, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    const SyncTraceScope trace(describe("neighbour_exchange", to_previous.nbytes()));
    inner_->neighbour_exchange(ctx, to_previous, to_next, from_previous, from_next);
  }
  void barrier(const ExecContext& ctx) override {
    const SyncTraceScope trace(describe("barrier", 0));
    inner_->barrier(ctx);
  }
  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions& options) const override {
    const SyncTraceScope trace(sync_trace_enabled() ? detail::concat(label_, " rank ", rank(), "/", size(), " split ", color) : std::string());
    return std::make_unique<TracedCommunicator>(inner_->split(color, key, options), detail::concat(label_, "/split(", color, ")"));
  }

 private:
  // Counts every call, traced or not, so that the numbers agree across ranks when the trace is
  // turned on mid-run only if every rank turned it on at the same call.
  std::string describe(const char* call, size_t bytes) {
    const long long sequence = calls_++;
    if (!sync_trace_enabled()) return {};
    return detail::concat(label_, " rank ", rank(), "/", size(), " #", sequence, " ", call, " ", bytes, " bytes");
  }

  std::unique_ptr<Communicator> inner_;
  std::string label_;
  long long calls_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_traced_communicator(std::unique_ptr<Communicator> inner, std::string label) {
  if (!inner) fail_argument("inner", "a communicator", "null");
  return std::make_unique<TracedCommunicator>(std::move(inner), std::move(label));
}

}  // namespace tessel
