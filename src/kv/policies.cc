// Full, Quest and Top-K policies and their block statistics (the factory is policy_backend.cc).
// (XAttention-BSA is in xattention_policy.cc.)
#include "tessel/kv/policies.h"

#include <algorithm>
#include <limits>

#include "host_floats.h"
#include "tessel/core/error.h"
#include "tessel/sparse/estimators/block_scoring.h"

namespace tessel::kv {
namespace {

// The available blocks whose keep flag is set, in order.
std::vector<int32_t> kept_blocks(const std::vector<int32_t>& available, const std::vector<uint8_t>& keep) {
  std::vector<int32_t> selected;
  for (size_t i = 0; i < available.size(); ++i)
    if (keep[i]) selected.push_back(available[i]);
  return selected;
}

// Query rows (S_q, H_q, D) of ctx.query on the host, checked against the statistics' shape; counts
// a host-scored call and the query's read back in `selection`.
std::vector<float> host_query(const PolicyContext& ctx, const BlockKeyStats& stats, int64_t& rows, int64_t& heads,
                              SelectionStats& selection) {
  const TensorView& q = ctx.query;
  if (q.dim() != 4 || q.size(3) != stats.head_dim() || q.size(2) % stats.num_kv_heads() != 0)
    fail_argument("ctx.query.shape", detail::concat("(1, S_q, k*", stats.num_kv_heads(), ", ", stats.head_dim(), ")"),
                  shape_str(q.shape()));
  rows = q.size(0) * q.size(1);
  heads = q.size(2);
  selection.host_scored += 1;
  if (!q.device().is_cpu()) selection.score_bytes_d2h += static_cast<int64_t>(q.nbytes());
  return to_host_floats(q);
}

}  // namespace

std::vector<int32_t> FullPolicy::select_blocks(const std::vector<int32_t>& available, OffloadEngine&,
                                               const PolicyContext&) {
  return available;
}

// ---- BlockKeyStats ------------------------------------------------------------------------------

void BlockKeyStats::initialize(int64_t num_layers, int64_t num_host_blocks, int64_t num_kv_heads, int64_t head_dim) {
  layers_ = num_layers;
  blocks_ = num_host_blocks;
  kv_heads_ = num_kv_heads;
  head_dim_ = head_dim;
  const size_t n = static_cast<size_t>(num_layers * num_host_blocks * num_kv_heads * head_dim);
  min_.assign(n, 0.0f);
  max_.assign(n, 0.0f);
  mean_.assign(n, 0.0f);
  valid_.assign(static_cast<size_t>(num_layers * num_host_blocks), 0);
}

int64_t BlockKeyStats::index(int64_t layer, int64_t block) const {
  if (layers_ == 0) throw Error("block key statistics used before initialize()");
  if (layer < 0 || layer >= layers_) fail_argument("layer", detail::concat("in [0, ", layers_, ")"), layer);
  if (block < 0 || block >= blocks_) fail_argument("host_block", detail::concat("in [0, ", blocks_, ")"), block);
  return layer * blocks_ + block;
}

void BlockKeyStats::update(int64_t host_block, int64_t layer, const TensorView& k, int64_t num_valid_tokens) {
  const int64_t slot = index(layer, host_block);
  if (k.dim() != 4 || k.size(2) != kv_heads_ || k.size(3) != head_dim_)
    fail_argument("k_cache.shape", detail::concat("(1, n, ", kv_heads_, ", ", head_dim_, ")"), shape_str(k.shape()));
  if (num_valid_tokens < 1 || num_valid_tokens > k.size(1))
    fail_argument("num_valid_tokens", detail::concat("in [1, ", k.size(1), "]"), num_valid_tokens);
  const std::vector<float> keys = to_host_floats(k);
  const int64_t width = kv_heads_ * head_dim_;
  float* mn = &min_[static_cast<size_t>(slot * width)];
  float* mx = &max_[static_cast<size_t>(slot * width)];
  float* mean = &mean_[static_cast<size_t>(slot * width)];
  for (int64_t e = 0; e < width; ++e) {
    mn[e] = std::numeric_limits<float>::infinity();
    mx[e] = -std::numeric_limits<float>::infinity();
    mean[e] = 0.0f;
  }
  for (int64_t t = 0; t < num_valid_tokens; ++t) {
    const float* row = &keys[static_cast<size_t>(t * width)];
    for (int64_t e = 0; e < width; ++e) {
      mn[e] = std::min(mn[e], row[e]);
      mx[e] = std::max(mx[e], row[e]);
      mean[e] += row[e];
    }
  }
  for (int64_t e = 0; e < width; ++e) mean[e] /= static_cast<float>(num_valid_tokens);
  valid_[static_cast<size_t>(slot)] = 1;
}

void BlockKeyStats::reset() { std::fill(valid_.begin(), valid_.end(), 0); }

bool BlockKeyStats::has(int64_t layer, int64_t block) const { return valid_[static_cast<size_t>(index(layer, block))] != 0; }

const float* BlockKeyStats::min(int64_t layer, int64_t block) const {
  if (!has(layer, block))
    throw Error(detail::concat("no key statistics for host block ", block, " of layer ", layer,
                               ": it was not offloaded through the policy's hooks"));
  return &min_[static_cast<size_t>(index(layer, block) * kv_heads_ * head_dim_)];
}
const float* BlockKeyStats::max(int64_t layer, int64_t block) const {
  return min(layer, block) - min_.data() + max_.data();
}
const float* BlockKeyStats::mean(int64_t layer, int64_t block) const {
  return min(layer, block) - min_.data() + mean_.data();
}

// ---- key statistics hooks (Quest, Top-K) --------------------------------------------------

void KeyStatsPolicy::initialize(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_host_blocks,
                             DType, Device) {
  stats_.initialize(num_layers, num_host_blocks, num_kv_heads, head_dim);
}

void KeyStatsPolicy::on_prefill_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                                     int64_t num_valid_tokens) {
  stats_.update(host_block, layer_id, k_cache, num_valid_tokens);
}

void KeyStatsPolicy::on_decode_offload(int64_t host_block, int64_t layer_id, const TensorView& k_cache,
                                    int64_t num_valid_tokens) {
  stats_.update(host_block, layer_id, k_cache, num_valid_tokens);
}

// ---- Quest --------------------------------------------------------------------------------------

QuestPolicy::QuestPolicy(QuestOptions options) : options_(options) {
  if (options.top_k < 0) fail_argument("quest.top_k", ">= 0", options.top_k);
  if (options.sink_blocks < 0) fail_argument("quest.sink_blocks", ">= 0", options.sink_blocks);
  if (options.recent_blocks < 0) fail_argument("quest.recent_blocks", ">= 0", options.recent_blocks);
}

std::vector<int32_t> QuestPolicy::select_blocks(const std::vector<int32_t>& available, OffloadEngine&,
                                                const PolicyContext& ctx) {
  if (ctx.is_prefill && !supports_prefill()) fail_phase("prefill");
  const int64_t n = static_cast<int64_t>(available.size());
  const int64_t sink = std::min(options_.sink_blocks, n);
  const int64_t recent = std::min(options_.recent_blocks, n - sink);
  if (n <= sink + recent + options_.top_k) return available;

  int64_t rows = 0, heads = 0;
  const std::vector<float> q = host_query(ctx, stats_, rows, heads, selection_);
  const int64_t d = stats_.head_dim();
  const int64_t group = heads / stats_.num_kv_heads();
  // The sink and recent blocks are always kept; the top_k are chosen among the blocks between them.
  std::vector<uint8_t> keep(static_cast<size_t>(n), 0);
  AlwaysKeep always;
  always.sink_blocks = sink;
  always.recent_blocks = recent;
  block_scoring::keep_sink_and_recent(always, n, keep.data());
  std::vector<double> scores(static_cast<size_t>(n));
  for (int64_t c = sink; c < n - recent; ++c) {
    const int64_t block = available[static_cast<size_t>(c)];
    const float* mn = stats_.min(ctx.layer_id, block);
    const float* mx = stats_.max(ctx.layer_id, block);
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = &q[static_cast<size_t>((r * heads + h) * d)];
        const int64_t g = h / group;
        double bound = 0;
        for (int64_t e = 0; e < d; ++e)
          bound += std::max(qh[e] * mn[g * d + e], qh[e] * mx[g * d + e]);
        best = std::max(best, bound);
      }
    scores[static_cast<size_t>(c)] = best;
  }
  block_scoring::keep_top_k(scores.data(), n, options_.top_k, keep.data());
  return kept_blocks(available, keep);
}

// ---- Top-K --------------------------------------------------------------------------------------

TopKPolicy::TopKPolicy(int64_t top_k) : top_k_(top_k) {
  if (top_k < 1) fail_argument("top_k", ">= 1", top_k);
}

std::vector<int32_t> TopKPolicy::select_blocks(const std::vector<int32_t>& available, OffloadEngine&,
                                               const PolicyContext& ctx) {
  if (ctx.is_prefill) fail_phase("prefill");
  const int64_t n = static_cast<int64_t>(available.size());
  if (n <= top_k_) return available;
  int64_t rows = 0, heads = 0;
  const std::vector<float> q = host_query(ctx, stats_, rows, heads, selection_);
  const int64_t d = stats_.head_dim();
  const int64_t group = heads / stats_.num_kv_heads();
  std::vector<double> scores(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* mean = stats_.mean(ctx.layer_id, available[static_cast<size_t>(i)]);
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = &q[static_cast<size_t>((r * heads + h) * d)];
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += qh[e] * mean[(h / group) * d + e];
        best = std::max(best, dot);
      }
    scores[static_cast<size_t>(i)] = best;
  }
  std::vector<uint8_t> keep(static_cast<size_t>(n), 0);
  block_scoring::keep_top_k(scores.data(), n, top_k_, keep.data());
  return kept_blocks(available, keep);
}

}  // namespace tessel::kv
