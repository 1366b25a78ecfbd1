// The CUDA offload engine: pinned host KV cache, device ring slots, one non-blocking copy stream
// per slot plus one offload stream and one key stream, and events for the ordering rules of
// offload_engine.h:
//   slot_loaded[s]        recorded on slot stream s after its H2D copy; the compute stream waits on it
//   slot_compute_done[s]  recorded on the compute stream; slot stream s waits on it before reloading
//   offload_done[layer]   recorded on the offload stream after D2H copies; the compute stream waits on
//                         it before overwriting the layer's buffer, and slot streams before loading
//   offload_prior[layer]  recorded on the offload stream just before an offload's copies: every
//                         earlier offload is done (load_keys waits on it for blocks the latest
//                         offload did not write, so their copy can overlap the compute that the
//                         latest offload itself waits for)
//   buffer_ready          recorded on the compute stream before an offload; the offload stream waits
//   keys_loaded           recorded on the key stream after load_keys' copies; the compute stream waits
//   keys_consumed         recorded on the compute stream; the key stream waits before the next copy
// Copy streams are created non-blocking so the legacy default stream (where the attention entry
// points launch) does not serialize with them.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "tessel/kernels/cuda/device_guard.h"
#include "tessel/core/error.h"
#include "tessel/kv/offload_engine.h"

namespace tessel::kv {
namespace {

using cuda::DeviceGuard;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(detail::concat("CUDA offload engine: ", what, " failed: ", cudaGetErrorString(status)));
}

cudaEvent_t make_event() {
  cudaEvent_t event;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return event;
}

class CudaOffloadEngine final : public OffloadEngine {
 public:
  CudaOffloadEngine(const OffloadConfig& config, int device_index, cudaStream_t compute_stream)
      : OffloadEngine(config, Device::cuda(device_index)), compute_(compute_stream) {
    if (!cuda_available()) fail_argument("device", "a visible CUDA GPU", "none");
    int count = 0;
    check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device_index < 0 || device_index >= count)
      fail_argument("device_index", detail::concat("in [0, ", count, ")"), device_index);
    DeviceGuard guard(device_index);
    allocate_buffers(MemoryKind::kPinnedHost);
    for (int64_t s = 0; s < config.num_slots; ++s) {
      cudaStream_t stream;
      check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      slot_streams_.push_back(stream);
      slot_loaded_.push_back(make_event());
      slot_compute_done_.push_back(make_event());
    }
    check_cuda(cudaStreamCreateWithFlags(&offload_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaStreamCreateWithFlags(&key_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int64_t l = 0; l < config.num_layers; ++l) {
      prefill_offload_done_.push_back(make_event());
      decode_offload_done_.push_back(make_event());
      prefill_offload_prior_.push_back(make_event());
      decode_offload_prior_.push_back(make_event());
    }
    last_prefill_blocks_.resize(static_cast<size_t>(config.num_layers));
    last_decode_block_.assign(static_cast<size_t>(config.num_layers), -1);
    buffer_ready_ = make_event();
    keys_loaded_ = make_event();
    keys_consumed_ = make_event();
    // Record every event once so that the first waits on them are satisfied immediately.
    for (cudaEvent_t e : slot_compute_done_) check_cuda(cudaEventRecord(e, compute_), "cudaEventRecord");
    for (cudaEvent_t e : prefill_offload_done_) check_cuda(cudaEventRecord(e, offload_stream_), "cudaEventRecord");
    for (cudaEvent_t e : decode_offload_done_) check_cuda(cudaEventRecord(e, offload_stream_), "cudaEventRecord");
    for (cudaEvent_t e : prefill_offload_prior_) check_cuda(cudaEventRecord(e, offload_stream_), "cudaEventRecord");
    for (cudaEvent_t e : decode_offload_prior_) check_cuda(cudaEventRecord(e, offload_stream_), "cudaEventRecord");
    check_cuda(cudaEventRecord(keys_consumed_, compute_), "cudaEventRecord");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  ~CudaOffloadEngine() override {
    DeviceGuard guard(device_.index);
    cudaDeviceSynchronize();
    for (cudaStream_t s : slot_streams_) cudaStreamDestroy(s);
    cudaStreamDestroy(offload_stream_);
    cudaStreamDestroy(key_stream_);
    for (const auto* events : {&slot_loaded_, &slot_compute_done_, &prefill_offload_done_, &decode_offload_done_,
                               &prefill_offload_prior_, &decode_offload_prior_})
      for (cudaEvent_t e : *events) cudaEventDestroy(e);
    for (cudaEvent_t e : {buffer_ready_, keys_loaded_, keys_consumed_}) cudaEventDestroy(e);
  }

  void wait_offloads(int64_t layer) override {
    if (layer < 0 || layer >= config_.num_layers)
      fail_argument("layer", detail::concat("in [0, ", config_.num_layers, ")"), layer);
    check_cuda(cudaEventSynchronize(prefill_offload_done_[static_cast<size_t>(layer)]), "cudaEventSynchronize");
    check_cuda(cudaEventSynchronize(decode_offload_done_[static_cast<size_t>(layer)]), "cudaEventSynchronize");
  }

  void synchronize() override {
    DeviceGuard guard(device_.index);
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  StreamHandle compute_stream() const override { return compute_; }

  double measure_peak_h2d_bandwidth() override {
    DeviceGuard guard(device_.index);
    // One large pinned→device copy (the whole host K cache or 256 MiB, whichever is smaller),
    // repeated; the best of the repeats is the peak.
    const size_t bytes = std::min(host_k_.nbytes(), static_cast<size_t>(256) << 20);
    Tensor target = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, device_);
    cudaEvent_t start, stop;
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    double best = 0;
    for (int i = 0; i < 5; ++i) {
      check_cuda(cudaEventRecord(start, slot_streams_[0]), "cudaEventRecord");
      check_cuda(cudaMemcpyAsync(target.data(), host_k_.data(), bytes, cudaMemcpyHostToDevice, slot_streams_[0]),
                 "cudaMemcpyAsync");
      check_cuda(cudaEventRecord(stop, slot_streams_[0]), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return best;
  }

 protected:
  void do_load(int64_t slot, int64_t layer, int64_t host_block) override {
    DeviceGuard guard(device_.index);
    const size_t s = static_cast<size_t>(slot);
    cudaStream_t stream = slot_streams_[s];
    // Do not overwrite the slot while compute may still read it; load history only once offloaded.
    check_cuda(cudaStreamWaitEvent(stream, slot_compute_done_[s], 0), "cudaStreamWaitEvent");
    check_cuda(cudaStreamWaitEvent(stream, prefill_offload_done_[static_cast<size_t>(layer)], 0), "cudaStreamWaitEvent");
    check_cuda(cudaStreamWaitEvent(stream, decode_offload_done_[static_cast<size_t>(layer)], 0), "cudaStreamWaitEvent");
    const size_t bytes = block_bytes();
    check_cuda(cudaMemcpyAsync(slot_k_ptr(slot), host_k_ptr(layer, host_block), bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (load K)");
    check_cuda(cudaMemcpyAsync(slot_v_ptr(slot), host_v_ptr(layer, host_block), bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync (load V)");
    check_cuda(cudaEventRecord(slot_loaded_[s], stream), "cudaEventRecord");
    // Loads in flight: this one plus any other slot whose last load has not finished.
    int64_t in_flight = 1;
    for (size_t other = 0; other < slot_loaded_.size(); ++other)
      if (other != s && cudaEventQuery(slot_loaded_[other]) == cudaErrorNotReady) ++in_flight;
    std::lock_guard lock(stats_mutex_);
    stats_.max_loads_in_flight = std::max(stats_.max_loads_in_flight, in_flight);
  }

  void do_wait_slot(int64_t slot) override {
    DeviceGuard guard(device_.index);
    check_cuda(cudaStreamWaitEvent(compute_, slot_loaded_[static_cast<size_t>(slot)], 0), "cudaStreamWaitEvent");
  }

  void do_record_compute_done(int64_t slot) override {
    DeviceGuard guard(device_.index);
    check_cuda(cudaEventRecord(slot_compute_done_[static_cast<size_t>(slot)], compute_), "cudaEventRecord");
  }

  void do_store(int64_t layer, bool decode_buffer, char* dst_k, char* dst_v, const TensorView& k,
                const TensorView& v) override {
    DeviceGuard guard(device_.index);
    const auto& done = decode_buffer ? decode_offload_done_ : prefill_offload_done_;
    check_cuda(cudaStreamWaitEvent(compute_, done[static_cast<size_t>(layer)], 0), "cudaStreamWaitEvent");
    check_cuda(cudaMemcpyAsync(dst_k, k.data(), k.nbytes(), cudaMemcpyDefault, compute_), "cudaMemcpyAsync (store K)");
    check_cuda(cudaMemcpyAsync(dst_v, v.data(), v.nbytes(), cudaMemcpyDefault, compute_), "cudaMemcpyAsync (store V)");
  }

  void do_offload(int64_t layer, bool decode_buffer, std::span<const BlockCopy> copies) override {
    DeviceGuard guard(device_.index);
    const size_t l = static_cast<size_t>(layer);
    const auto& prior = decode_buffer ? decode_offload_prior_ : prefill_offload_prior_;
    check_cuda(cudaEventRecord(prior[l], offload_stream_), "cudaEventRecord");
    // The host blocks this offload writes (from their destination in the host K cache).
    const auto block = static_cast<std::ptrdiff_t>(block_bytes());
    std::vector<int32_t> written;
    for (const BlockCopy& c : copies) written.push_back(static_cast<int32_t>((c.dst_k - host_k_ptr(layer, 0)) / block));
    if (decode_buffer) {
      last_decode_block_[l] = written.front();
    } else {
      last_prefill_blocks_[l] = std::move(written);
    }
    check_cuda(cudaEventRecord(buffer_ready_, compute_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(offload_stream_, buffer_ready_, 0), "cudaStreamWaitEvent");
    for (const BlockCopy& c : copies) {
      check_cuda(cudaMemcpyAsync(c.dst_k, c.src_k, c.bytes, cudaMemcpyDeviceToHost, offload_stream_),
                 "cudaMemcpyAsync (offload K)");
      check_cuda(cudaMemcpyAsync(c.dst_v, c.src_v, c.bytes, cudaMemcpyDeviceToHost, offload_stream_),
                 "cudaMemcpyAsync (offload V)");
    }
    const auto& done = decode_buffer ? decode_offload_done_ : prefill_offload_done_;
    check_cuda(cudaEventRecord(done[static_cast<size_t>(layer)], offload_stream_), "cudaEventRecord");
  }

  // Blocks the layer's latest offloads wrote wait for those offloads; all others only for the
  // offloads before them (offload_prior), which usually finished long ago.
  void do_load_keys(int64_t layer, std::span<const int32_t> host_blocks, char* dst) override {
    DeviceGuard guard(device_.index);
    const size_t l = static_cast<size_t>(layer);
    const std::vector<int32_t>& latest = last_prefill_blocks_[l];
    auto recent = [&](size_t i) {
      return host_blocks[i] == last_decode_block_[l] ||
             std::find(latest.begin(), latest.end(), host_blocks[i]) != latest.end();
    };
    auto issue = [&](const std::vector<KeyCopy>& copies) {
      for (const KeyCopy& c : copies)
        check_cuda(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, key_stream_),
                   "cudaMemcpyAsync (keys)");
    };
    check_cuda(cudaStreamWaitEvent(key_stream_, keys_consumed_, 0), "cudaStreamWaitEvent");
    check_cuda(cudaStreamWaitEvent(key_stream_, prefill_offload_prior_[l], 0), "cudaStreamWaitEvent");
    check_cuda(cudaStreamWaitEvent(key_stream_, decode_offload_prior_[l], 0), "cudaStreamWaitEvent");
    issue(key_copies(layer, host_blocks, dst, [&](size_t i) { return !recent(i); }));
    check_cuda(cudaStreamWaitEvent(key_stream_, prefill_offload_done_[l], 0), "cudaStreamWaitEvent");
    check_cuda(cudaStreamWaitEvent(key_stream_, decode_offload_done_[l], 0), "cudaStreamWaitEvent");
    issue(key_copies(layer, host_blocks, dst, recent));
    check_cuda(cudaEventRecord(keys_loaded_, key_stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(compute_, keys_loaded_, 0), "cudaStreamWaitEvent");
  }

  void do_record_keys_consumed() override {
    DeviceGuard guard(device_.index);
    check_cuda(cudaEventRecord(keys_consumed_, compute_), "cudaEventRecord");
  }

 private:
  cudaStream_t compute_;
  cudaStream_t offload_stream_ = nullptr;
  cudaStream_t key_stream_ = nullptr;
  cudaEvent_t buffer_ready_ = nullptr;
  cudaEvent_t keys_loaded_ = nullptr, keys_consumed_ = nullptr;
  std::vector<cudaStream_t> slot_streams_;
  std::vector<cudaEvent_t> slot_loaded_, slot_compute_done_;
  std::vector<cudaEvent_t> prefill_offload_done_, decode_offload_done_;
  std::vector<cudaEvent_t> prefill_offload_prior_, decode_offload_prior_;
  // Per layer: the host blocks its latest prefill offload wrote, its latest decode offload's block.
  std::vector<std::vector<int32_t>> last_prefill_blocks_;
  std::vector<int32_t> last_decode_block_;
};

}  // namespace

std::unique_ptr<OffloadEngine> make_cuda_offload_engine(const ExecContext& ctx, const OffloadConfig& config) {
  const int device_index = ctx.device.is_cuda() ? ctx.device.index : 0;
  return std::make_unique<CudaOffloadEngine>(config, device_index, ctx.stream);
}

}  // namespace tessel::kv
