#include "tessel/kv/sparse_policy.h"

#include <chrono>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/kv/chunked_attention.h"

namespace tessel::kv {
namespace {

// q and out of a chunked call: (1, rows, H_q, D) on the engine's device, in the engine's dtype.
void check_query(const TensorView& q, const TensorView& out, int64_t rows, const OffloadEngine& engine) {
  const OffloadConfig& c = engine.config();
  check_rank(q, 4, "q");
  check_device(q, engine.device(), "q");
  check_dtype(q, c.dtype, "q");
  check_contiguous(q, "q");
  if (q.size(0) != 1 || q.size(1) != rows || q.size(3) != c.head_dim || q.size(2) % c.num_kv_heads != 0)
    fail_argument("q.shape",
                  detail::concat("(1, ", rows, ", a multiple of ", c.num_kv_heads, " heads, ", c.head_dim, ")"),
                  shape_str(q.shape()));
  check_rank(out, 4, "out");
  check_device(out, engine.device(), "out");
  check_dtype(out, c.dtype, "out");
  check_contiguous(out, "out");
  check_shape(out, q.shape(), "out");
}

std::vector<BlockRef> block_refs(const std::vector<int32_t>& selected, const std::vector<int32_t>& available,
                                 const std::vector<int32_t>& tokens) {
  std::vector<BlockRef> refs;
  refs.reserve(selected.size());
  size_t j = 0;
  for (int32_t block : selected) {
    while (available[j] != block) ++j;  // selected is an ordered subset (checked_select)
    refs.push_back({block, tokens[j]});
  }
  return refs;
}

// On a CUDA engine, attention must be enqueued on the stream the engine orders its copies against.
void check_engine_stream(const ExecContext& ctx, const OffloadEngine& engine) {
  if (engine.device().is_cuda() && ctx.stream != engine.compute_stream())
    fail_argument("ctx.stream", "the offload engine's compute stream (the stream of the context it was made with)",
                  "another stream");
}

// Attention of q over the current KV (the prefill chunk or the decode buffer) into out. When the
// history blocks already wrote out and history_lse, the two partial results are merged in place.
void attend_current_kv(const ExecContext& exec, const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttentionOptions& options, bool has_history, OffloadEngine& engine, const TensorView& out,
                       const TensorView& history_lse) {
  if (!has_history) {
    attention_forward(exec, q, k, v, out, TensorView{}, options);
    return;
  }
  const TensorView current_out = engine.scratch(kScratchCurrentOut, q.shape(), q.dtype());
  const TensorView current_lse = engine.scratch(kScratchCurrentLse, history_lse.shape(), DType::kF32);
  attention_forward(exec, q, k, v, current_out, current_lse, options);
  merge_attention_states(exec, out, history_lse, current_out, current_lse, out, history_lse);
}

}  // namespace

void SparsePolicy::fail_phase(const char* phase) const {
  throw Error(detail::concat("sparse policy '", name(), "' does not support the ", phase,
                             " phase (use a policy that does, e.g. 'full')"));
}

std::vector<int32_t> SparsePolicy::checked_select(const std::vector<int32_t>& available, OffloadEngine& engine,
                                                  const PolicyContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> selected = select_blocks(available, engine, ctx);
  selection_.select_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  size_t j = 0;
  for (size_t i = 0; i < selected.size(); ++i) {
    while (j < available.size() && available[j] != selected[i]) ++j;
    if (j == available.size())
      throw Error(detail::concat("sparse policy '", name(), "': select_blocks returned block ", selected[i], " at ", i,
                                 ", which is not an ordered, duplicate-free subset of the available blocks"));
    ++j;
  }
  selection_.available_blocks += static_cast<int64_t>(available.size());
  selection_.selected_blocks += static_cast<int64_t>(selected.size());
  return selected;
}

void SparsePolicy::compute_chunked_prefill(const ExecContext& ctx, const ChunkedPrefillArgs& args,
                                           OffloadEngine& engine, KvBlockManager& manager) {
  if (!supports_prefill()) fail_phase("prefill");
  check_engine_stream(ctx, engine);
  if (args.num_tokens < 1 || args.num_tokens > engine.config().max_chunk_tokens)
    fail_argument("num_tokens", detail::concat("in [1, ", engine.config().max_chunk_tokens, "]"), args.num_tokens);
  if (args.current_chunk_idx < 0 || args.current_chunk_idx >= args.num_chunks)
    fail_argument("current_chunk_idx", detail::concat("in [0, ", args.num_chunks, ")"), args.current_chunk_idx);
  check_query(args.q, args.out, args.num_tokens, engine);
  run_chunked_prefill(ctx, args, engine, manager);
}

void SparsePolicy::compute_chunked_decode(const ExecContext& ctx, const ChunkedDecodeArgs& args,
                                          OffloadEngine& engine, KvBlockManager& manager) {
  if (!supports_decode()) fail_phase("decode");
  check_engine_stream(ctx, engine);
  check_query(args.q, args.out, 1, engine);
  if (manager.decode_buffer_len(args.seq) < 1)
    fail_argument("seq", "the current token stored in the decode buffer and counted (append_decode_token)",
                  "an empty decode buffer");
  run_chunked_decode(ctx, args, engine, manager);
}

void SparsePolicy::run_chunked_prefill(const ExecContext& exec, const ChunkedPrefillArgs& args,
                                       OffloadEngine& engine, KvBlockManager& manager) {
  const std::vector<int32_t>& history = manager.get_prefilled_blocks(args.seq);
  PolicyContext ctx;
  ctx.query_chunk_idx = args.current_chunk_idx;
  ctx.num_query_chunks = args.num_chunks;
  ctx.layer_id = args.layer_id;
  ctx.query = args.q;
  ctx.is_prefill = true;
  ctx.block_size = engine.config().block_size;
  ctx.total_kv_len = manager.get_prefill_len(args.seq) + args.num_tokens;
  ctx.block_tokens = manager.prefilled_block_tokens(args.seq);
  const std::vector<int32_t> selected = history.empty() ? history : checked_select(history, engine, ctx);
  const std::vector<BlockRef> refs = block_refs(selected, history, ctx.block_tokens);

  const int64_t heads = args.q.size(2);
  const Shape lse_shape{1, heads, args.num_tokens};
  const TensorView history_lse = engine.scratch(kScratchHistoryLse, lse_shape, DType::kF32);
  const bool has_history =
      ring_buffer_attention(exec, args.q, refs, args.layer_id, args.softmax_scale, engine, args.out, history_lse);

  AttentionOptions causal;
  causal.scale = args.softmax_scale;
  causal.causal = true;
  const auto [k, v] = engine.get_prefill_buffer_slice(args.layer_id, args.num_tokens);
  attend_current_kv(exec, args.q, k, v, causal, has_history, engine, args.out, history_lse);
}

void SparsePolicy::run_chunked_decode(const ExecContext& exec, const ChunkedDecodeArgs& args, OffloadEngine& engine,
                                      KvBlockManager& manager) {
  const std::vector<int32_t>& history = manager.get_prefilled_blocks(args.seq);
  const int64_t buffered = manager.decode_buffer_len(args.seq);
  PolicyContext ctx;
  ctx.layer_id = args.layer_id;
  ctx.query = args.q;
  ctx.is_prefill = false;
  ctx.block_size = engine.config().block_size;
  ctx.total_kv_len = manager.get_prefill_len(args.seq) + buffered;
  ctx.block_tokens = manager.prefilled_block_tokens(args.seq);
  const std::vector<int32_t> selected = history.empty() ? history : checked_select(history, engine, ctx);
  const std::vector<BlockRef> refs = block_refs(selected, history, ctx.block_tokens);

  const Shape lse_shape{1, args.q.size(2), 1};
  const TensorView history_lse = engine.scratch(kScratchHistoryLse, lse_shape, DType::kF32);
  const bool has_history =
      ring_buffer_attention(exec, args.q, refs, args.layer_id, args.softmax_scale, engine, args.out, history_lse);

  AttentionOptions options;
  options.scale = args.softmax_scale;
  const auto [k, v] = engine.decode_buffer_slice(args.layer_id, 0, buffered);
  attend_current_kv(exec, args.q, k, v, options, has_history, engine, args.out, history_lse);
}

}  // namespace tessel::kv
