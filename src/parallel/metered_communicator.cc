// The metering decorator of any communicator (see metered_communicator.h).
#include "tessel/parallel/metered_communicator.h"

#include <chrono>
#include <utility>

#include "tessel/core/error.h"

namespace tessel {
namespace {

using Clock = std::chrono::steady_clock;

// Adds the seconds of its lifetime to the meter.
class MeteredScope {
 public:
  explicit MeteredScope(CommunicationMeter& meter) : meter_(meter), start_(Clock::now()) {}
  ~MeteredScope() { meter_.seconds += std::chrono::duration<double>(Clock::now() - start_).count(); }
  MeteredScope(const MeteredScope&) = delete;
  MeteredScope& operator=(const MeteredScope&) = delete;

 private:
  CommunicationMeter& meter_;
  Clock::time_point start_;
};

class MeteredPendingExchange final : public PendingExchange {
 public:
  MeteredPendingExchange(std::unique_ptr<PendingExchange> inner, std::shared_ptr<CommunicationMeter> meter)
      : inner_(std::move(inner)), meter_(std::move(meter)) {}
  void wait(const ExecContext& ctx) override {
    const MeteredScope scope(*meter_);
    inner_->wait(ctx);
  }

 private:
  std::unique_ptr<PendingExchange> inner_;
  std::shared_ptr<CommunicationMeter> meter_;
};

class MeteredCommunicator final : public Communicator {
 public:
  MeteredCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommunicationMeter> meter)
      : inner_(std::move(inner)), meter_(std::move(meter)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  std::string engine() const override { return inner_->engine(); }

  void all_to_all(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    count(static_cast<double>(send.nbytes()) * (size() - 1) / size());
    const MeteredScope scope(*meter_);
    inner_->all_to_all(ctx, send, recv);
  }
  void all_gather(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    count(static_cast<double>(send.nbytes()) * (size() - 1));
    const MeteredScope scope(*meter_);
    inner_->all_gather(ctx, send, recv);
  }
  void all_reduce_sum(const ExecContext& ctx, const TensorView& tensor) override {
    count(2.0 * static_cast<double>(tensor.nbytes()) * (size() - 1) / size());
    const MeteredScope scope(*meter_);
    inner_->all_reduce_sum(ctx, tensor);
  }
  std::unique_ptr<PendingExchange> all_to_all_async(const ExecContext& ctx, const TensorView& send,
                                                    const TensorView& recv) override {
    count(static_cast<double>(send.nbytes()) * (size() - 1) / size());
    const MeteredScope scope(*meter_);
    return std::make_unique<MeteredPendingExchange>(inner_->all_to_all_async(ctx, send, recv), meter_);
  }
  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext& ctx, const TensorView& send,
                                                       const TensorView& recv) override {
    count(size() > 1 ? static_cast<double>(send.nbytes()) : 0.0);
    const MeteredScope scope(*meter_);
    return std::make_unique<MeteredPendingExchange>(inner_->ring_exchange_async(ctx, send, recv), meter_);
  }
  void neighbour_exchange(const ExecContext& ctx, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    const int neighbours = (rank() > 0 ? 1 : 0) + (rank() + 1 < size() ? 1 : 0);
    count(static_cast<double>(to_previous.nbytes()) * neighbours);
    const MeteredScope scope(*meter_);
    inner_->neighbour_exchange(ctx, to_previous, to_next, from_previous, from_next);
  }
  void barrier(const ExecContext& ctx) override {
    const MeteredScope scope(*meter_);
    inner_->barrier(ctx);
  }
  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions& options) const override {
    return std::make_unique<MeteredCommunicator>(inner_->split(color, key, options), meter_);
  }

 private:
  void count(double bytes) {
    meter_->bytes += bytes;
    ++meter_->calls;
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<CommunicationMeter> meter_;
};

}  // namespace

std::unique_ptr<Communicator> make_metered_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<CommunicationMeter> meter) {
  if (!inner) fail_argument("inner", "a communicator", "null");
  if (!meter) fail_argument("meter", "a meter", "null");
  return std::make_unique<MeteredCommunicator>(std::move(inner), std::move(meter));
}

}  // namespace tessel
