// XAttention-BSA block selection (see policies.h for the algorithm): validate, score on the device
// or the host (xattention_scoring.h), then the one selection rule over the masses.
#include <string>
#include <utility>

#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/kv/policies.h"
#include "xattention_scoring.h"

namespace tessel::kv {

XAttentionBsaPolicy::XAttentionBsaPolicy(XAttentionOptions options, XAttentionScoring scoring)
    : options_(std::move(options)), scoring_(scoring) {
  if (!(options_.threshold > 0 && options_.threshold <= 1))
    fail_argument("xattention.threshold", "in (0, 1]", options_.threshold);
  if (options_.stride < 1) fail_argument("xattention.stride", ">= 1", options_.stride);
  if (!(options_.vote_threshold >= 0 && options_.vote_threshold < 1))
    fail_argument("xattention.vote_threshold", "in [0, 1)", options_.vote_threshold);
  // Settings of the estimator that this policy has no use for are refused rather than ignored.
  if (!options_.per_head_threshold.empty())
    fail_argument("xattention.per_head_threshold", "empty (the KV policy uses one threshold for every head)",
                  detail::concat(options_.per_head_threshold.size(), " values"));
  if (options_.scale != 0.0f)
    fail_argument("xattention.scale", "0 (the KV policy scores with 1/sqrt(head_dim))", options_.scale);
}

std::vector<int32_t> XAttentionBsaPolicy::select_blocks(const std::vector<int32_t>& available, OffloadEngine& engine,
                                                        const PolicyContext& ctx) {
  if (!ctx.is_prefill) fail_phase("decode");
  const int64_t n = static_cast<int64_t>(available.size());
  if (n <= 2) return available;  // first and last are always kept
  if (static_cast<int64_t>(ctx.block_tokens.size()) != n)
    fail_argument("ctx.block_tokens.size()", n, ctx.block_tokens.size());
  const XAttentionGeometry g = xattention_geometry(engine.config(), ctx.query, options_.stride, n);
  if (g.q_rows == 0) return available;  // fewer queries than the stride: nothing to estimate
  int64_t columns = 0;
  for (int32_t tokens : ctx.block_tokens) columns += tokens / g.stride;
  if (columns == 0) return available;  // no block holds a whole stride group: nothing to score

  bool on_device = false;
  if (scoring_ != XAttentionScoring::kHost) {
    const std::string why_not = device_scoring_unavailable(engine, ctx, g);
    on_device = why_not.empty();
    if (!on_device && scoring_ == XAttentionScoring::kDevice)
      throw Error("XAttention scoring = device, but the device scorer cannot score this call: " + why_not);
    if (!on_device && engine.device().is_cuda() && !warned_host_fallback_) {
      log_warning("XAttention: scoring on the host (slow at long context) because " + why_not);
      warned_host_fallback_ = true;
    }
  }
  const std::vector<float> mass = on_device ? score_on_device(engine, ctx, available, g, selection_)
                                            : score_on_host(engine, ctx, available, g, selection_);
  (on_device ? selection_.device_scored : selection_.host_scored) += 1;

  std::vector<int32_t> selected;
  for (int64_t b : select_from_block_masses(mass, g, options_.threshold, options_.vote_threshold))
    selected.push_back(available[static_cast<size_t>(b)]);
  return selected;
}

}  // namespace tessel::kv
