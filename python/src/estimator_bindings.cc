// Dynamic mask estimators on host tensors: dynamic_topk (pooled-score top-k / cdf selection) and
// threshold (XAttention's strided antidiagonal scoring). Each returns the mask and the estimation
// time in milliseconds.
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "tensor_arg.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

XAttentionVote parse_vote(const std::string& vote) {
  if (vote == "none") return XAttentionVote::kNone;
  if (vote == "heads") return XAttentionVote::kHeads;
  if (vote == "columns") return XAttentionVote::kColumns;
  fail_argument("vote", "'none', 'heads' or 'columns'", quoted_excerpt(vote));
}

std::pair<BlockMask, double> topk(const ReadOnlyArray& q, const ReadOnlyArray& k, double topk_ratio,
                                  double cdf_threshold, std::vector<double> per_head, double similarity_threshold,
                                  int64_t block_q, int64_t block_kv, double scale, bool keep_diagonal,
                                  int64_t sink_blocks) {
  const TopkEstimatorOptions options{.topk_ratio = topk_ratio,
                                     .cdf_threshold = cdf_threshold,
                                     .per_head = std::move(per_head),
                                     .similarity_threshold = similarity_threshold,
                                     .block_q = block_q,
                                     .block_kv = block_kv,
                                     .scale = static_cast<float>(scale),
                                     .keep = AlwaysKeep{.diagonal = keep_diagonal, .sink_blocks = sink_blocks}};
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k");
  nb::gil_scoped_release release;
  EstimateResult result = estimate_topk_mask(ExecContext{}, q_view, k_view, options);
  return {std::move(result.mask), result.estimate_ms};
}

std::pair<BlockMask, double> threshold(const ReadOnlyArray& q, const ReadOnlyArray& k, double threshold_value,
                                       std::vector<double> per_head_threshold, int64_t stride, int64_t block_q,
                                       int64_t block_kv, double scale, bool keep_diagonal, bool keep_first,
                                       bool gqa_any, const std::string& vote, double vote_threshold) {
  const XAttentionOptions options{.threshold = threshold_value,
                                  .per_head_threshold = std::move(per_head_threshold),
                                  .stride = stride,
                                  .block_q = block_q,
                                  .block_kv = block_kv,
                                  .scale = static_cast<float>(scale),
                                  .keep_diagonal = keep_diagonal,
                                  .keep_first = keep_first,
                                  .gqa_any = gqa_any,
                                  .vote = parse_vote(vote),
                                  .vote_threshold = vote_threshold};
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k");
  nb::gil_scoped_release release;
  EstimateResult result = estimate_xattention_mask(ExecContext{}, q_view, k_view, options);
  return {std::move(result.mask), result.estimate_ms};
}

}  // namespace

void bind_estimators(nb::module_& m) {
  m.def("estimate_topk", &topk, "q"_a, "k"_a, "topk_ratio"_a, "cdf_threshold"_a, "per_head"_a,
        "similarity_threshold"_a, "block_q"_a, "block_kv"_a, "scale"_a, "keep_diagonal"_a, "sink_blocks"_a);
  m.def("estimate_threshold", &threshold, "q"_a, "k"_a, "threshold"_a, "per_head_threshold"_a, "stride"_a,
        "block_q"_a, "block_kv"_a, "scale"_a, "keep_diagonal"_a, "keep_first"_a, "gqa_any"_a, "vote"_a,
        "vote_threshold"_a);
}

}  // namespace tessel::python
