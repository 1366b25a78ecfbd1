// The communicator of a group of one: what a rank sends, it receives.
#include "communicator_checks.h"
#include "row_copy.h"
#include "tessel/core/error.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {
namespace {

// A tensor's bytes as one row, so copy_rows moves them with one copy.
TensorView bytes_of(const TensorView& t) {
  return TensorView(t.data(), DType::kU8, t.device(), {static_cast<int64_t>(t.nbytes())});
}


class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(Device device) : device_(device) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return device_; }
  std::string engine() const override { return "single"; }

  void all_to_all(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    parallel_detail::check_all_to_all(*this, send, recv);
    parallel_detail::copy_rows(ctx, bytes_of(send), bytes_of(recv));
  }
  void all_gather(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    parallel_detail::check_all_gather(*this, send, recv);
    parallel_detail::copy_rows(ctx, bytes_of(send), bytes_of(recv));
  }
  void all_reduce_sum(const ExecContext&, const TensorView& tensor) override {
    parallel_detail::check_comm_tensor(*this, tensor, "tensor");
  }
  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext& ctx, const TensorView& send,
                                                       const TensorView& recv) override {
    parallel_detail::check_ring_exchange(*this, send, recv);
    if (send.data() != recv.data()) parallel_detail::copy_rows(ctx, bytes_of(send), bytes_of(recv));
    return parallel_detail::make_done_exchange();
  }
  // One rank has neither neighbour: nothing moves.
  void neighbour_exchange(const ExecContext&, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    parallel_detail::check_neighbour_exchange(*this, to_previous, to_next, from_previous, from_next);
  }
  void barrier(const ExecContext& ctx) override {
    if (!device_.is_cuda()) return;
#ifdef TESSEL_WITH_CUDA
    const cudaError_t status = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(ctx.stream));
    if (status != cudaSuccess) throw Error(detail::concat("cudaStreamSynchronize (barrier) failed: ", cudaGetErrorString(status)));
#endif
  }
  std::unique_ptr<Communicator> split(int color, int, const SplitOptions&) const override {
    if (color < 0) fail_argument("color", ">= 0", color);
    return std::make_unique<SingleRankCommunicator>(device_);
  }

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator(Device device) {
  if (device.is_cuda() && !cuda_compiled())
    fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
  return std::make_unique<SingleRankCommunicator>(device);
}

}  // namespace tessel
