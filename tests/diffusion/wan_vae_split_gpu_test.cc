// The CUDA Wan VAE decode split by height over a group (WanVae::decode's `group`) against the
// one-rank CUDA decode of the same latents. Skips without a GPU.
//
// On one GPU the ranks are threads, each with its own stream and its own decoder, joined by a
// communicator of this file that copies between their device buffers (what NCCL does between GPUs):
// groups of 2, 3 and 4 ranks, Wan 2.1's and Wan 2.2's layouts at the tiny presets' widths, odd
// heights (bands that differ by a row, bands of one row) and three latent frames (the causal cache
// over three chunks). A group of one rank (the single-rank engine, and NCCL bootstrapped over a TCP
// world of one) is the whole-frame path: bit-equal. With two GPUs or more, two threads each drive a
// GPU through NCCL (a TCP rendezvous in the process), at the tiny widths and at Wan 2.1's real ones.
//
// Tolerance: rel-L2 1e-4 (TF32 off), the CUDA decoder's own bound against the CPU and diffusers
// (wan_vae_gpu_test.cc): a band's convolutions are cuDNN calls of other heights, for which cuDNN may
// choose other algorithms (Winograd, FFT, implicit GEMM) that round differently. A missing or wrong
// halo row changes the rows at every band edge by far more (rel-L2 of order 1e-1).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "error_of.h"
#include "free_port.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/parallel/communicator.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

#ifdef TESSEL_WITH_CUDA

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}
cudaStream_t stream_of(const ExecContext& ctx) { return reinterpret_cast<cudaStream_t>(ctx.stream); }

// What the thread ranks of one group share: a barrier and the buffer each rank offers.
struct ThreadRanks {
  explicit ThreadRanks(int n) : size(n), offered(static_cast<size_t>(n)) {}
  int size;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<const void*> offered;

  // Returns when every rank got here; an Error after a minute (a rank that threw never comes).
  void meet() {
    std::unique_lock lock(mutex);
    const int64_t mine = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return;
    }
    if (!changed.wait_for(lock, std::chrono::seconds(60), [&] { return generation != mine; }))
      throw Error("thread ranks: a rank did not reach the collective");
  }
};

// A rank of ThreadRanks on one GPU. A collective waits for the rank's own stream (its buffer is
// written), offers the buffer, meets the others, copies theirs on its stream and waits for it, and
// meets them again before anyone reuses a buffer.
class ThreadRankCommunicator final : public Communicator {
 public:
  ThreadRankCommunicator(std::shared_ptr<ThreadRanks> ranks, int rank, Device device)
      : ranks_(std::move(ranks)), rank_(rank), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return ranks_->size; }
  Device device() const override { return device_; }
  std::string engine() const override { return "threads"; }

  void all_gather(const ExecContext& ctx, const TensorView& send, const TensorView& recv) override {
    offer(ctx, send.data());
    const size_t bytes = send.nbytes();
    for (int i = 0; i < size(); ++i)
      check(cudaMemcpyAsync(static_cast<char*>(recv.data()) + i * bytes, ranks_->offered[static_cast<size_t>(i)], bytes,
                            cudaMemcpyDeviceToDevice, stream_of(ctx)),
            "all_gather copy");
    check(cudaStreamSynchronize(stream_of(ctx)), "all_gather");
    ranks_->meet();
  }
  void all_reduce_sum(const ExecContext& ctx, const TensorView& tensor) override {
    if (tensor.dtype() != DType::kF32) throw Error("thread ranks: fp32 sums only");
    offer(ctx, tensor.data());
    std::vector<float> sum(static_cast<size_t>(tensor.numel()), 0.0f), part(sum.size());
    for (int i = 0; i < size(); ++i) {
      check(cudaMemcpy(part.data(), ranks_->offered[static_cast<size_t>(i)], part.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "all_reduce copy");
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += part[e];
    }
    ranks_->meet();
    check(cudaMemcpy(tensor.data(), sum.data(), sum.size() * sizeof(float), cudaMemcpyHostToDevice), "all_reduce result");
  }
  // Each rank offers its [to_previous, to_next] pair; the neighbours read the half meant for them.
  void neighbour_exchange(const ExecContext& ctx, const TensorView& to_previous, const TensorView& to_next, const TensorView& from_previous,
                          const TensorView& from_next) override {
    const void* pair[2] = {to_previous.data(), to_next.data()};
    offer(ctx, pair);
    const size_t bytes = to_previous.nbytes();
    const auto pair_of = [&](int r) { return static_cast<const void* const*>(ranks_->offered[static_cast<size_t>(r)]); };
    if (rank_ > 0)
      check(cudaMemcpyAsync(from_previous.data(), pair_of(rank_ - 1)[1], bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)), "copy from previous");
    if (rank_ + 1 < size())
      check(cudaMemcpyAsync(from_next.data(), pair_of(rank_ + 1)[0], bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)), "copy from next");
    check(cudaStreamSynchronize(stream_of(ctx)), "neighbour exchange");
    ranks_->meet();
  }
  void all_to_all(const ExecContext&, const TensorView&, const TensorView&) override { unused("all_to_all"); }
  std::unique_ptr<PendingExchange> ring_exchange_async(const ExecContext&, const TensorView&, const TensorView&) override {
    unused("ring_exchange_async");
  }
  void barrier(const ExecContext& ctx) override { offer(ctx, nullptr); }
  std::unique_ptr<Communicator> split(int, int, const SplitOptions&) const override { unused("split"); }

 private:
  [[noreturn]] static void unused(const char* what) { throw Error(std::string("thread ranks: ") + what + " is not used by the decode"); }
  void offer(const ExecContext& ctx, const void* buffer) {
    check(cudaStreamSynchronize(stream_of(ctx)), "stream before a collective");
    ranks_->offered[static_cast<size_t>(rank_)] = buffer;
    ranks_->meet();
  }
  std::shared_ptr<ThreadRanks> ranks_;
  int rank_;
  Device device_;
};

// Runs rank(r, ctx) on `ranks` threads, each with its own stream on GPU device_of(r); an error on any
// rank fails the test.
void run_ranks(int ranks, const std::function<int(int)>& device_of, const std::function<void(int, const ExecContext&)>& rank) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      errors[static_cast<size_t>(r)] = testing::error_of([&] {
        check(cudaSetDevice(device_of(r)), "cudaSetDevice");
        cudaStream_t stream = nullptr;
        check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        ExecContext ctx;
        ctx.device = Device::cuda(device_of(r));
        ctx.stream = stream;
        rank(r, ctx);
        cudaStreamDestroy(stream);
      });
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// The decode of host latents on ctx's GPU into a video poisoned with NaN, back on the host.
Tensor decode_on(const WanVae& vae, const Tensor& latents, const ExecContext& ctx, Communicator* group) {
  Tensor poison = Tensor::empty(vae.decoded_shape(latents.shape()), DType::kF32);
  std::fill_n(poison.data_as<float>(), poison.numel(), std::numeric_limits<float>::quiet_NaN());
  Tensor video = poison.to(ctx.device);
  EXPECT_TRUE(vae.decode(ctx, latents.to(ctx.device), video, nullptr, group));
  return video.to(Device::cpu());
}

// rel-L2 of a decode against the expected one; NaN (a value no rank wrote) compares as infinity.
double video_error(const Tensor& video, const Tensor& expected) {
  for (int64_t i = 0; i < video.numel(); ++i)
    if (!(std::abs(video.data_as<const float>()[i]) <= 1.0f)) return std::numeric_limits<double>::infinity();
  return rel_l2(video.data_as<const float>(), expected.data_as<const float>(), expected.numel());
}

Tensor random_latents(const WanVaeConfig& config, Shape size, uint64_t seed) {
  Tensor latents = Tensor::empty({1, config.z_dim, size[0], size[1], size[2]}, DType::kF32);
  fill_normal(latents.view(), seed);
  return latents;
}

struct Model {
  const char* name;
  WanVaeConfig config;
};

constexpr double kTolerance = 1e-4;

TEST(WanVaeSplitGpu, ThreadRanksOnOneGpuMatchTheOneRankDecode) {
  SKIP_WITHOUT_GPU();
  const Shape sizes[] = {{3, 5, 3}, {1, 7, 4}, {3, 4, 5}};
  uint64_t seed = 300;
  for (const Model& model : {Model{"wan2.1", tiny_wan_vae_config()}, Model{"wan2.2-residual", tiny_ti2v_wan_vae_config()}}) {
    const std::map<std::string, Tensor> weights = random_model_weights(wan_vae_weight_specs(model.config), 5);
    WanVae single(model.config, weights, WanVaeParts::kDecoder);
    single.set_cuda_tf32(false);
    for (const Shape& size : sizes) {
      const Tensor latents = random_latents(model.config, size, seed++);
      ExecContext one;
      one.device = Device::cuda();
      const Tensor expected = decode_on(single, latents, one, nullptr);
      for (int ranks = 2; ranks <= 4; ++ranks) {
        auto shared = std::make_shared<ThreadRanks>(ranks);
        std::vector<double> errors(static_cast<size_t>(ranks));
        run_ranks(ranks, [](int) { return 0; }, [&](int r, const ExecContext& ctx) {
          WanVae vae(model.config, weights, WanVaeParts::kDecoder);  // a decoder per rank: one decodes at a time
          vae.set_cuda_tf32(false);
          ThreadRankCommunicator group(shared, r, ctx.device);
          errors[static_cast<size_t>(r)] = video_error(decode_on(vae, latents, ctx, &group), expected);
        });
        for (int r = 0; r < ranks; ++r) {
          std::printf("%-16s %d thread ranks, latents %s: rank %d rel-L2 %.3g\n", model.name, ranks, shape_str(size).c_str(), r,
                      errors[static_cast<size_t>(r)]);
          EXPECT_LE(errors[static_cast<size_t>(r)], kTolerance) << model.name << ", " << ranks << " ranks, " << shape_str(size);
        }
      }
    }
  }
}

// A world of one GPU: a group of one rank decodes whole frames, exactly as without a group.
TEST(WanVaeSplitGpu, AGroupOfOneRankIsTheWholeFrameDecode) {
  SKIP_WITHOUT_GPU();
  const WanVaeConfig config = tiny_wan_vae_config();
  WanVae vae(config, random_model_weights(wan_vae_weight_specs(config), 6), WanVaeParts::kDecoder);
  vae.set_cuda_tf32(false);
  const Tensor latents = random_latents(config, {3, 5, 3}, 61);
  ExecContext ctx;
  ctx.device = Device::cuda();
  const Tensor expected = decode_on(vae, latents, ctx, nullptr);
  std::vector<std::unique_ptr<Communicator>> groups;
  groups.push_back(make_single_rank_communicator(Device::cuda()));
  if (nccl_compiled()) {
    TcpRendezvous alone;
    alone.port = testing::free_port();
    groups.push_back(make_nccl_communicator(ctx, alone, Device::cuda()));
  }
  for (const auto& group : groups) {
    const Tensor video = decode_on(vae, latents, ctx, group.get());
    EXPECT_EQ(std::memcmp(video.data(), expected.data(), static_cast<size_t>(video.nbytes())), 0) << group->engine();
  }
}

// Two GPUs, one thread each, NCCL between them: the tiny model at odd sizes and Wan 2.1's real
// widths at a small latent size.
TEST(WanVaeSplitGpu, TwoGpusOverNcclMatchTheOneRankDecode) {
  SKIP_WITHOUT_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "one GPU visible: the NCCL split needs two";
  if (!nccl_compiled()) GTEST_SKIP() << "tessel was built without NCCL";
  struct Case {
    Model model;
    Shape size;
  };
  const Case cases[] = {{{"wan2.1 tiny", tiny_wan_vae_config()}, {3, 5, 3}},
                        {{"wan2.2-residual tiny", tiny_ti2v_wan_vae_config()}, {3, 7, 4}},
                        {{"wan2.1", WanVaeConfig{}}, {3, 11, 20}}};
  uint64_t seed = 400;
  for (const Case& c : cases) {
    const std::map<std::string, Tensor> weights = random_model_weights(wan_vae_weight_specs(c.model.config), 7);
    const Tensor latents = random_latents(c.model.config, c.size, seed++);
    WanVae single(c.model.config, weights, WanVaeParts::kDecoder);
    single.set_cuda_tf32(false);
    ExecContext one;
    one.device = Device::cuda(0);
    const Tensor expected = decode_on(single, latents, one, nullptr);
    const int port = testing::free_port();
    std::vector<double> errors(2);
    run_ranks(2, [](int r) { return r; }, [&](int r, const ExecContext& ctx) {
      TcpRendezvous rendezvous;
      rendezvous.rank = r;
      rendezvous.size = 2;
      rendezvous.port = port;
      const std::unique_ptr<Communicator> group = make_nccl_communicator(ctx, rendezvous, ctx.device);
      WanVae vae(c.model.config, weights, WanVaeParts::kDecoder);
      vae.set_cuda_tf32(false);
      errors[static_cast<size_t>(r)] = video_error(decode_on(vae, latents, ctx, group.get()), expected);
    });
    for (int r = 0; r < 2; ++r) {
      std::printf("%-22s NCCL over 2 GPUs, latents %s: rank %d rel-L2 %.3g\n", c.model.name, shape_str(c.size).c_str(), r,
                  errors[static_cast<size_t>(r)]);
      EXPECT_LE(errors[static_cast<size_t>(r)], kTolerance) << c.model.name << ", rank " << r;
    }
  }
}

#else

TEST(WanVaeSplitGpu, NeedsACudaBuild) { GTEST_SKIP() << "tessel was built without CUDA: GPU test skipped"; }

#endif

}  // namespace
}  // namespace tessel
