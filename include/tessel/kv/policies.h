// Built-in sparse policies: Full, Quest, XAttention-BSA, Top-K.
//
// Block statistics (Quest's key min/max, Top-K's key mean) are gathered in the offload hooks, per
// layer and host block, and kept on the host in fp32. Quest and Top-K score on the host: the query
// (a decode token or a prefill chunk) is read back from the device when the engine is a GPU.
// XAttention scores on the device when it can (XAttentionScoring), else on the host. Every policy
// selects through the shared block-scoring rules (sparse/estimators/block_scoring.h): top-k with the
// sink / recent always-keep rule for Quest and Top-K, τ + GQA any + column vote for XAttention.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/kv/sparse_policy.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel::kv {

// Loads every block: the reference pipeline.
class FullPolicy final : public SparsePolicy {
 public:
  std::string name() const override { return "full"; }
  bool supports_prefill() const override { return true; }
  bool supports_decode() const override { return true; }
  std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                     const PolicyContext& ctx) override;
};

// Per-(layer, block, kv head) fp32 statistics of the keys of offloaded blocks.
class BlockKeyStats {
 public:
  void initialize(int64_t num_layers, int64_t num_host_blocks, int64_t num_kv_heads, int64_t head_dim);
  // k (1, n, kv_heads, head_dim) on any device, n >= valid tokens.
  void update(int64_t host_block, int64_t layer, const TensorView& k, int64_t num_valid_tokens);
  void reset();
  bool has(int64_t layer, int64_t block) const;
  // Pointers to kv_heads * head_dim values for (layer, block); throw when the block has no stats.
  const float* min(int64_t layer, int64_t block) const;
  const float* max(int64_t layer, int64_t block) const;
  const float* mean(int64_t layer, int64_t block) const;
  int64_t num_kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t index(int64_t layer, int64_t block) const;
  int64_t layers_ = 0, blocks_ = 0, kv_heads_ = 0, head_dim_ = 0;
  std::vector<float> min_, max_, mean_;
  std::vector<uint8_t> valid_;
};

// A policy that scores blocks from key statistics: the offload hooks keep `stats_` up to date.
class KeyStatsPolicy : public SparsePolicy {
 public:
  void initialize(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_host_blocks, DType dtype,
                  Device device) override;
  void on_prefill_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                          int64_t num_valid_tokens) override;
  void on_decode_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                         int64_t num_valid_tokens) override;
  void reset() override { stats_.reset(); }

 protected:
  BlockKeyStats stats_;
};

struct QuestOptions {
  int64_t top_k = 8;           // blocks chosen by score, besides sink and recent blocks
  int64_t sink_blocks = 1;     // first blocks, always kept
  int64_t recent_blocks = 1;   // last blocks, always kept
  bool enable_prefill = false; // also select for prefill chunks (score = max over the chunk's queries)
};

// Quest (Tang et al. 2024): block upper bound Σ_d max(q_d·min_d, q_d·max_d) of each query head
// against its kv head's key min/max; a block's score is the max over query heads (a kv block is
// loaded for the whole GQA group) and query rows; the top_k blocks win.
class QuestPolicy final : public KeyStatsPolicy {
 public:
  explicit QuestPolicy(QuestOptions options = {});
  std::string name() const override { return "quest"; }
  bool supports_prefill() const override { return options_.enable_prefill; }
  bool supports_decode() const override { return true; }
  std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                     const PolicyContext& ctx) override;

 private:
  QuestOptions options_;
};

// Where XAttention scores the history. kAuto: on the device when the engine is a CUDA engine in
// bf16/fp16 with the query on the device and the device scorer supports the shapes, else on the
// host (logging once why a CUDA engine falls back). kDevice: the device or a tessel::Error saying
// why not. kHost: always the host.
enum class XAttentionScoring : uint8_t { kAuto, kHost, kDevice };

// XAttention block selection for chunked prefill (prefill only; decode throws), with the options of
// the XAttention estimator (tessel::XAttentionOptions): threshold τ, stride (any >= 1; the engine's
// block_size must be a multiple of it) and vote_threshold; the mask-geometry fields (block_q,
// block_kv, keep_*, gqa_any, vote) do not apply here: query blocks are the engine's blocks, GQA
// "any" and the column vote always apply; per_head_threshold must be empty and scale 0 (1/sqrt(D)),
// else the constructor throws Error.
// For stride s, reshaped query row i = [q_{is+s-1}, q_{is+s-2}, ..., q_{is}] and reshaped key
// column j = [k_{js}, ..., k_{js+s-1}] (the antidiagonals of each s×s tile); scores are
// softmax(Q_r K_rᵀ · scale / s) over all history columns, summed per (query block of block/s rows,
// history block). Each (head, query block) keeps its highest blocks until their mass reaches τ;
// a GQA group keeps a block when any of its query heads does; a block is loaded when more than
// vote_threshold of the (kv head, query block) pairs keep it. The first and last history blocks
// are always loaded. With fewer than `stride` queries there is nothing to estimate: all blocks load.
// Scoring (the masses per (query head, query block, history block)) runs on the host, reading the
// host cache, or on the device over the history keys copied up by OffloadEngine::load_keys (see
// XAttentionScoring); both feed one selection rule, so the same masses select the same blocks.
// Scoring and selection are the shared block-scoring functions (sparse/estimators/block_scoring.h).
class XAttentionBsaPolicy final : public SparsePolicy {
 public:
  explicit XAttentionBsaPolicy(XAttentionOptions options = {}, XAttentionScoring scoring = XAttentionScoring::kAuto);
  std::string name() const override { return "xattn"; }
  bool supports_prefill() const override { return true; }
  bool supports_decode() const override { return false; }
  std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                     const PolicyContext& ctx) override;

 private:
  XAttentionOptions options_;
  XAttentionScoring scoring_;
  bool warned_host_fallback_ = false;
};

// The SparsePolicy guide's Top-K example: decode only; scores each block by max over query heads of q·mean(k)
// and loads the top_k blocks.
class TopKPolicy final : public KeyStatsPolicy {
 public:
  explicit TopKPolicy(int64_t top_k = 8);
  std::string name() const override { return "topk"; }
  bool supports_prefill() const override { return false; }
  bool supports_decode() const override { return true; }
  std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                     const PolicyContext& ctx) override;

 private:
  int64_t top_k_;
};

struct PolicyOptions {
  QuestOptions quest;
  XAttentionOptions xattention;
  XAttentionScoring xattention_scoring = XAttentionScoring::kAuto;
  int64_t top_k = 8;
};

// A built-in policy by name: "full", "quest", "xattn" (alias "xattention-bsa") or "topk", found in a
// registry holding only the built-in policies (policy_backend.h resolves through any registry);
// throws Error for other names.
std::unique_ptr<SparsePolicy> make_sparse_policy(const std::string& name, const PolicyOptions& options = {});

}  // namespace tessel::kv
