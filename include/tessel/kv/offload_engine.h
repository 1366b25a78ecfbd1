// Offload engine: the host KV cache, the device ring of slots, the per-layer prefill and decode
// buffers, and the asynchronous copies between them (docs/kv-offload.md).
//
// Memory:
//   host K/V cache   [layers, host_blocks, block, kv_heads, head_dim]  (pinned on CUDA)
//   ring slots       [slots, block, kv_heads, head_dim]                 (device; one layer at a time)
//   prefill buffer   [layers, max_chunk_tokens, kv_heads, head_dim]     (device; current chunk's KV)
//   decode buffer    [layers, block, kv_heads, head_dim]                (device; tokens since last block)
//
// Ordering rules (the same for both implementations; CUDA enforces them with events on streams,
// the CPU engine with fences its copy thread signals):
//   * load_to_slot_layer(s, ...) starts only after the compute recorded by the last
//     record_slot_compute_done(s) and after every offload already issued (so freshly offloaded
//     history can be loaded back).
//   * wait_slot_layer(s) orders later compute after the slot's last load.
//   * offload_*() copies start after the compute that wrote the buffer; the next store into that
//     layer's prefill (or decode) buffer waits until the offload has read it.
//   * wait_offloads(layer) blocks the host until the layer's host cache is up to date (for
//     estimators that read the host cache).
//   * load_keys(...) copies start after the offloads that wrote the blocks it reads and after the
//     compute recorded by the last record_keys_consumed(); compute issued after load_keys waits for
//     them (for estimators that score history keys on the device).
// Every public method validates its arguments first (tessel::Error, nothing issued).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"

namespace tessel::kv {

struct OffloadConfig {
  int64_t num_layers = 1;
  int64_t num_host_blocks = 0;
  int64_t block_size = 1024;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t num_slots = 4;
  int64_t max_chunk_tokens = 4096;  // prefill buffer capacity per layer
  DType dtype = DType::kF32;
};

// Options of the CPU engine's copy thread. A bandwidth or latency makes each copy take at least
// latency + bytes / bandwidth, which lets tests and benchmarks see whether copies overlap compute.
struct CpuCopyOptions {
  double bandwidth_gb_per_s = 0.0;  // 0: copy as fast as memcpy
  double latency_us = 0.0;
};

struct OffloadStats {
  int64_t loads = 0;          // slot loads (K and V of one block of one layer)
  int64_t offloads = 0;       // blocks offloaded to the host cache
  int64_t bytes_h2d = 0;
  int64_t bytes_d2h = 0;
  double copy_busy_seconds = 0;  // CPU engine: time the copy thread spent copying (0 on CUDA)
  double wait_seconds = 0;       // CPU engine: time the caller blocked in wait_slot_layer
  int64_t max_loads_in_flight = 0;  // largest number of issued, unfinished loads seen at issue time
  int64_t key_loads = 0;       // blocks whose K load_keys copied (device-side scoring), one per block
  int64_t bytes_h2d_keys = 0;  // their bytes (also counted in bytes_h2d)
};

using KvPair = std::pair<TensorView, TensorView>;

class OffloadEngine {
 public:
  virtual ~OffloadEngine();
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  const OffloadConfig& config() const { return config_; }
  Device device() const { return device_; }

  // The ring-buffer API (docs/kv-offload.md).
  void load_to_slot_layer(int64_t slot, int64_t layer, int64_t host_block);
  void wait_slot_layer(int64_t slot);
  // (1, num_tokens, kv_heads, head_dim) views of the slot on the device; num_tokens -1 = whole block.
  KvPair get_kv_for_slot(int64_t slot, int64_t num_tokens = -1) const;
  void record_slot_compute_done(int64_t slot);

  // Prefill buffer: the current chunk's KV for one layer.
  // store_prefill_kv copies k, v (1, n, kv_heads, head_dim), on the device or the host, into rows [0, n).
  void store_prefill_kv(int64_t layer, const TensorView& k, const TensorView& v);
  KvPair get_prefill_buffer_slice(int64_t layer, int64_t num_tokens) const;
  // Asynchronously copies rows [i*block, min((i+1)*block, num_tokens)) of the layer's prefill
  // buffer into host_blocks[i].
  void offload_prefill_blocks(int64_t layer, std::span<const int32_t> host_blocks, int64_t num_tokens);

  // Decode buffer: tokens decoded since the last committed block, rows [0, block).
  void store_decode_kv(int64_t layer, int64_t position, const TensorView& k, const TensorView& v);
  KvPair decode_buffer_slice(int64_t layer, int64_t start, int64_t end) const;
  // Asynchronously copies the layer's first num_tokens decode rows into host_block.
  void offload_decode_block(int64_t layer, int64_t host_block, int64_t num_tokens);

  // Host cache views (1, block, kv_heads, head_dim) on the CPU. Call wait_offloads(layer) first
  // when reading blocks that were offloaded recently.
  KvPair host_block(int64_t layer, int64_t host_block) const;
  // Writes a block straight into the host cache (synchronous; for loading a saved cache and tests).
  void write_host_block(int64_t layer, int64_t host_block, const TensorView& k, const TensorView& v);
  virtual void wait_offloads(int64_t layer) = 0;
  // Blocks the host until every issued copy and the compute stream are done.
  virtual void synchronize() = 0;

  // Keys for scoring history on the device (XAttention): asynchronously copies the K (not V) of
  // each of host_blocks of `layer`, whole blocks, into dst (1, >= blocks * block_size, kv_heads,
  // head_dim), contiguous, on the engine's device, in the engine's dtype: block i at rows
  // [i * block_size, (i + 1) * block_size). Rows past a block's valid tokens hold whatever its host
  // block holds. Ordered after the offloads that wrote those blocks (on CUDA, on a copy stream of its
  // own, so it can overlap compute issued earlier) and after the compute recorded by the last
  // record_keys_consumed(); compute issued afterwards waits for the copy. Runs of consecutive host
  // blocks are copied at once.
  void load_keys(int64_t layer, std::span<const int32_t> host_blocks, const TensorView& dst);
  // Marks the compute issued so far as the last reader of load_keys' destination: the next
  // load_keys overwrites it only after that compute.
  void record_keys_consumed();
  // The CUDA stream (nullptr is the legacy default stream) that the engine orders compute on: the
  // stream of the ExecContext it was made with. Attention over its buffers must run there.
  // nullptr for the CPU engine, whose compute is synchronous.
  virtual StreamHandle compute_stream() const = 0;

  // Scratch memory on the device, reused across calls (grows when a larger size is asked for).
  // Views of different ids never alias. Work is ordered on the compute stream, so reuse is safe.
  TensorView scratch(int id, const Shape& shape, DType dtype);

  OffloadStats stats() const;
  void reset_stats();
  // Measures the peak host→device copy bandwidth of this engine, in GB/s (1e9 bytes/s).
  virtual double measure_peak_h2d_bandwidth() = 0;

 protected:
  OffloadEngine(const OffloadConfig& config, Device device);
  // Allocates the host cache (host_kind) and the device buffers (on device_).
  void allocate_buffers(MemoryKind host_kind);
  int64_t block_elements() const { return config_.block_size * config_.num_kv_heads * config_.head_dim; }
  size_t block_bytes() const { return static_cast<size_t>(block_elements()) * dtype_size(config_.dtype); }
  char* host_k_ptr(int64_t layer, int64_t block) const;
  char* host_v_ptr(int64_t layer, int64_t block) const;
  char* slot_k_ptr(int64_t slot) const;
  char* slot_v_ptr(int64_t slot) const;
  char* prefill_k_ptr(int64_t layer, int64_t row) const;
  char* prefill_v_ptr(int64_t layer, int64_t row) const;
  char* decode_k_ptr(int64_t layer, int64_t row) const;
  char* decode_v_ptr(int64_t layer, int64_t row) const;

  // Implementations see validated arguments only.
  virtual void do_load(int64_t slot, int64_t layer, int64_t host_block) = 0;
  virtual void do_wait_slot(int64_t slot) = 0;
  virtual void do_record_compute_done(int64_t slot) = 0;
  // Copy `bytes` from src (device or host per the view) into the buffer row pointers dst_k/dst_v on
  // the compute stream, after `layer`'s last prefill (decode_buffer=false) or decode offload.
  virtual void do_store(int64_t layer, bool decode_buffer, char* dst_k, char* dst_v, const TensorView& k,
                        const TensorView& v) = 0;
  // One offload of `layer` from the prefill (or decode) buffer: copies per block.
  struct BlockCopy {
    const char* src_k;
    const char* src_v;
    char* dst_k;
    char* dst_v;
    size_t bytes;
  };
  virtual void do_offload(int64_t layer, bool decode_buffer, std::span<const BlockCopy> copies) = 0;
  // load_keys: host_blocks are valid, dst is checked.
  virtual void do_load_keys(int64_t layer, std::span<const int32_t> host_blocks, char* dst) = 0;
  virtual void do_record_keys_consumed() = 0;
  // One copy per run of consecutive host blocks among host_blocks[i] with include(i): the keys of
  // `layer` into dst rows [i * block_size, ...).
  struct KeyCopy {
    const char* src;
    char* dst;
    size_t bytes;
  };
  std::vector<KeyCopy> key_copies(int64_t layer, std::span<const int32_t> host_blocks, char* dst,
                                  const std::function<bool(size_t)>& include) const;

  OffloadConfig config_;
  Device device_;
  Tensor host_k_, host_v_;
  Tensor slots_k_, slots_v_;
  Tensor prefill_k_, prefill_v_;
  Tensor decode_k_, decode_v_;
  mutable std::mutex stats_mutex_;
  OffloadStats stats_;

 private:
  void check_layer(int64_t layer) const;
  void check_slot(int64_t slot) const;
  void check_host_block(int64_t block) const;
  void check_kv_rows(const TensorView& t, const std::string& argument, int64_t max_rows) const;
  KvPair device_rows(const Tensor& k, const Tensor& v, int64_t offset_rows, int64_t rows) const;
  struct ScratchEntry {
    Tensor tensor;
    size_t bytes = 0;
  };
  std::vector<ScratchEntry> scratch_;
};

// A CPU engine: the "device" is a separate host arena; copies run on one copy thread.
std::unique_ptr<OffloadEngine> make_cpu_offload_engine(const OffloadConfig& config, CpuCopyOptions options = {});
// A CUDA engine (pinned host cache, cudaMemcpyAsync on per-slot streams) on ctx.device (cuda:0 for
// a CPU context) that orders compute on ctx.stream: attention over its buffers must run under a
// context with that stream. Throws Error when CUDA is not compiled in or no GPU is present.
std::unique_ptr<OffloadEngine> make_cuda_offload_engine(const ExecContext& ctx, const OffloadConfig& config);
// Either, by ctx.device (cpu_options apply to the CPU engine).
std::unique_ptr<OffloadEngine> make_offload_engine(const ExecContext& ctx, const OffloadConfig& config,
                                                   CpuCopyOptions cpu_options = {});

}  // namespace tessel::kv
