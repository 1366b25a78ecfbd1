// XAttention-BSA scoring on the device (CUDA builds). Per select_blocks call, on the engine's
// compute stream:
//   1. the K of every history block into a device scratch buffer (OffloadEngine::load_keys: K only,
//      whole blocks, block b at token b * block_size, on the engine's key stream ordered after the
//      offloads that wrote them, so most of the copy can overlap compute queued earlier);
//   2. the device scorer (kernels/cuda/xattention_estimation.h) over the chunk's whole stride
//      groups against those keys, each block's columns limited to its valid groups: the block
//      masses (heads, query blocks, history blocks);
//   3. the masses back to the host (the host waits here), for the shared selection rule.
// Only K crosses the link: V is loaded later for the selected blocks only.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>

#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/kernels/cuda/launch_check.h"
#include "tessel/kernels/cuda/xattention_estimation.h"
#include "tessel/core/error.h"
#include "tessel/kv/chunked_attention.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
#include "xattention_scoring.h"

namespace tessel::kv {
namespace {

// Engine scratch ids of the device scorer.
constexpr int kScratchKeys = kFirstPolicyScratch;
constexpr int kScratchValidGroups = kFirstPolicyScratch + 1;
constexpr int kScratchBlockLse = kFirstPolicyScratch + 2;
constexpr int kScratchMass = kFirstPolicyScratch + 3;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(detail::concat("XAttention device scoring: ", what, " failed: ", cudaGetErrorString(status)));
}

// Times the work issued on `stream` between construction and stop() (CUDA events).
class StreamTimer {
 public:
  explicit StreamTimer(cudaStream_t stream) : stream_(stream) {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
    check_cuda(cudaEventRecord(start_, stream_), "cudaEventRecord");
  }
  ~StreamTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  void stop() { check_cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord"); }
  // After the stream reached stop().
  double seconds() const {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

std::string device_scoring_unavailable(const OffloadEngine& engine, const PolicyContext& ctx,
                                       const XAttentionGeometry& g) {
  if (!engine.device().is_cuda()) return "the offload engine is on the CPU";
  const DType dtype = engine.config().dtype;
  if (dtype != DType::kBF16 && dtype != DType::kF16)
    return detail::concat("the engine's dtype is ", dtype_name(dtype), " (the device scorer takes bf16 or fp16)");
  const TensorView& q = ctx.query;
  if (!(q.device() == engine.device()))
    return detail::concat("the query is on ", q.device().str(), ", not on the engine's ", engine.device().str());
  if (q.dtype() != dtype || !q.is_contiguous() || reinterpret_cast<uintptr_t>(q.data()) % 16 != 0)
    return detail::concat("the query (", q.describe(), ") is not a contiguous, 16-byte aligned ", dtype_name(dtype),
                          " tensor");
  if (const char* limit = xattention_device_limit(g.dim, g.stride, g.block_size, g.block_size))
    return detail::concat("the device kernels need ", limit, " (head dim ", g.dim, ", stride ", g.stride, ", block ",
                          g.block_size, ")");
  if (g.blocks * g.block_size > INT_MAX || g.mass_size() > INT_MAX)
    return detail::concat(g.blocks, " history blocks of ", g.block_size,
                          " tokens exceed the device scorer's int range");
  return {};
}

std::vector<float> score_on_device(OffloadEngine& engine, const PolicyContext& ctx, std::span<const int32_t> available,
                                   const XAttentionGeometry& g, SelectionStats& stats) {
  const std::string why_not = device_scoring_unavailable(engine, ctx, g);
  if (!why_not.empty()) throw Error("XAttention device scoring: " + why_not);
  cuda::DeviceGuard guard(engine.device().index);
  const cudaStream_t stream = engine.compute_stream();
  const OffloadConfig& c = engine.config();
  const int64_t n = g.blocks, block = g.block_size;

  const TensorView& q = ctx.query;
  cuda::detail::XAttentionParams p{};
  p.q = q.data();
  p.q_stride_b = q.stride(0), p.q_stride_s = q.stride(1), p.q_stride_h = q.stride(2);
  p.batch = 1;
  p.seq_q = static_cast<int>(g.q_rows * g.stride);  // whole stride groups only, as the host scorer
  p.seq_kv = static_cast<int>(n * block);
  p.heads_q = static_cast<int>(g.heads);
  p.heads_kv = static_cast<int>(g.kv_heads);
  p.dim = static_cast<int>(g.dim);
  p.stride = static_cast<int>(g.stride);
  p.groups_q = static_cast<int>(g.q_rows);
  p.groups_kv = static_cast<int>(n * block / g.stride);
  p.block_q = static_cast<int>(block);  // a query block is block_size / stride reshaped rows
  p.block_kv = static_cast<int>(block);
  p.q_blocks = static_cast<int>(g.q_blocks);
  p.kv_blocks = static_cast<int>(n);
  p.logit_scale_log2 = g.scale * 1.4426950408889634f;  // the host scorer's scale, in the log2 domain

  // Scratch first: growing a buffer synchronizes the device, better before the key copy is issued.
  // Buffers are sized for a power-of-two number of blocks (at most the host cache's), so a history
  // that grows chunk by chunk reallocates only O(log n) times.
  const int64_t capacity = std::max<int64_t>(
      n, std::min<int64_t>(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n))), c.num_host_blocks));
  const TensorView key_buffer = engine.scratch(kScratchKeys, {1, capacity * block, g.kv_heads, g.dim}, c.dtype);
  const TensorView keys(key_buffer.data(), c.dtype, engine.device(), {1, n * block, g.kv_heads, g.dim});
  p.k = keys.data();
  p.k_stride_b = keys.stride(0), p.k_stride_s = keys.stride(1), p.k_stride_h = keys.stride(2);
  const int64_t lse_floats = cuda::detail::xattention_block_lse_floats(p);
  p.block_lse2 = engine.scratch(kScratchBlockLse, {lse_floats / n * capacity}, DType::kF32).data_as<float>();
  p.mass = engine.scratch(kScratchMass, {g.mass_size() / n * capacity}, DType::kF32).data_as<float>();
  bool partial = false;
  for (int32_t tokens : ctx.block_tokens) partial |= tokens != block;
  const TensorView device_groups =
      partial ? engine.scratch(kScratchValidGroups, {capacity}, DType::kI32) : TensorView{};

  engine.load_keys(ctx.layer_id, available, keys);

  // Valid stride groups per block; all-full histories (the usual case) need no upload.
  if (partial) {
    std::vector<int32_t> groups(ctx.block_tokens.size());
    for (size_t b = 0; b < groups.size(); ++b) groups[b] = static_cast<int32_t>(ctx.block_tokens[b] / g.stride);
    // From pageable memory: staged before the call returns, so `groups` may go out of scope.
    check_cuda(cudaMemcpyAsync(device_groups.data(), groups.data(), groups.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (valid groups)");
    stats.score_bytes_h2d += static_cast<int64_t>(groups.size() * sizeof(int32_t));
    p.kv_valid_groups = device_groups.data_as<const int32_t>();
  }

  StreamTimer timer(stream);
  cuda::detail::launch_xattention_block_mass(p, c.dtype, stream);
  cuda::check_launch("XAttention device scoring (launch_xattention_block_mass)");
  timer.stop();
  engine.record_keys_consumed();

  std::vector<float> mass(static_cast<size_t>(g.mass_size()));
  check_cuda(cudaMemcpyAsync(mass.data(), p.mass, mass.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (masses)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  stats.score_bytes_d2h += static_cast<int64_t>(mass.size() * sizeof(float));
  stats.score_kernel_seconds += timer.seconds();
  return mass;
}

}  // namespace tessel::kv
