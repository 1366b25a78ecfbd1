// SparsePolicy: decides which offloaded KV blocks a query chunk (prefill) or token (decode) loads,
// and computes that attention through the offload engine's ring of slots (docs/kv-offload.md).
//
// The standard flow, shared by every built-in policy (run_chunked_prefill / run_chunked_decode):
//   prefill: history = manager.get_prefilled_blocks(seq); selected = select_blocks(history, ...);
//            ring-buffer attention over the selected blocks (non-causal) → (o, lse);
//            the current chunk from engine.get_prefill_buffer_slice (causal); merge.
//   decode:  the same over the committed blocks, then the decode buffer (non-causal); merge.
// A policy that does not support a phase throws tessel::Error from compute_chunked_* and
// select_blocks (never a silent fallback).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/kv/block_manager.h"
#include "tessel/kv/offload_engine.h"

namespace tessel::kv {

struct PolicyContext {
  int64_t query_chunk_idx = 0;   // current chunk (0-indexed); 0 in decode
  int64_t num_query_chunks = 1;  // chunks of the prefill; 1 in decode
  int64_t layer_id = 0;
  TensorView query;              // (1, S_q, H_q, D) on the engine's device (S_q = 1 in decode)
  bool is_prefill = true;
  int64_t block_size = 0;        // tokens per block
  int64_t total_kv_len = 0;      // KV tokens visible to this query, history and current included
  std::vector<int32_t> block_tokens;  // valid tokens of each available block (same order)
};

struct ChunkedPrefillArgs {
  TensorView q;    // (1, num_tokens, H_q, D) on the engine's device; the chunk's KV is already stored
  TensorView out;  // same shape and dtype as q
  int64_t layer_id = 0;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(D)
  int64_t current_chunk_idx = 0;
  int64_t num_chunks = 1;
  SequenceId seq = 0;
  int64_t num_tokens = 0;
};

struct ChunkedDecodeArgs {
  TensorView q;    // (1, 1, H_q, D); the token's KV is already in the decode buffer
  TensorView out;  // (1, 1, H_q, D)
  int64_t layer_id = 0;
  float softmax_scale = 0.0f;
  SequenceId seq = 0;
};

// What the select_blocks calls of a policy chose and what scoring cost (for benchmarks and tests).
struct SelectionStats {
  int64_t available_blocks = 0;
  int64_t selected_blocks = 0;
  // Host wall time spent in select_blocks. A policy that scores on the device waits there for its
  // results, and so also for the device work queued before them (e.g. the previous chunk's attention).
  double select_seconds = 0;
  int64_t device_scored = 0;      // select_blocks calls scored on the device
  int64_t host_scored = 0;        // select_blocks calls scored on the host
  double score_kernel_seconds = 0;  // device time of the scoring kernels (CUDA events)
  // Bytes the policy itself copied for scoring, besides the engine's load_keys (in OffloadStats):
  // e.g. per-block valid counts uploaded, block masses or a device query read back.
  int64_t score_bytes_h2d = 0;
  int64_t score_bytes_d2h = 0;
};

class SparsePolicy {
 public:
  virtual ~SparsePolicy() = default;

  virtual std::string name() const = 0;
  virtual bool supports_prefill() const = 0;
  virtual bool supports_decode() const = 0;

  // Returns the subset of `available` (host block ids, in sequence order) to load, sorted in the
  // same order. ctx.block_tokens gives each available block's valid tokens.
  virtual std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                             const PolicyContext& ctx) = 0;

  // Check the phase, validate, then run the policy's flow under ctx. Throw Error for an unsupported
  // phase, or when a CUDA engine's compute stream is not ctx.stream (attention must be ordered
  // after the engine's loads).
  void compute_chunked_prefill(const ExecContext& ctx, const ChunkedPrefillArgs& args, OffloadEngine& engine,
                               KvBlockManager& manager);
  void compute_chunked_decode(const ExecContext& ctx, const ChunkedDecodeArgs& args, OffloadEngine& engine,
                              KvBlockManager& manager);

  // Hooks. initialize: after the KV cache exists. on_*_offload: before a block's device→host copy,
  // with k (1, num_valid_tokens, kv_heads, head_dim) still on the device. reset: new sequence.
  virtual void initialize(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_host_blocks,
                          DType dtype, Device device) {}
  virtual void on_prefill_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                                  int64_t num_valid_tokens) {}
  virtual void on_decode_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                                 int64_t num_valid_tokens) {}
  virtual void reset() {}

  // Blocks chosen over all select_blocks calls since the last reset_selection_stats().
  SelectionStats selection_stats() const { return selection_; }
  void reset_selection_stats() { selection_ = {}; }

 protected:
  // The standard flows described above; a policy may override them.
  virtual void run_chunked_prefill(const ExecContext& ctx, const ChunkedPrefillArgs& args, OffloadEngine& engine,
                                   KvBlockManager& manager);
  virtual void run_chunked_decode(const ExecContext& ctx, const ChunkedDecodeArgs& args, OffloadEngine& engine,
                                  KvBlockManager& manager);
  // Calls select_blocks and checks the answer is an ordered subset of `available`.
  std::vector<int32_t> checked_select(const std::vector<int32_t>& available, OffloadEngine& engine,
                                      const PolicyContext& ctx);
  // Throws the "does not support the <phase> phase" error.
  [[noreturn]] void fail_phase(const char* phase) const;

  // select_blocks adds its scoring costs here; checked_select counts blocks and time.
  SelectionStats selection_;
};

}  // namespace tessel::kv
