#include "quality/calibration.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/head_error_sums.h"
#include "tessel/sparse/pattern_backends.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel {
namespace {

void check_options(const CalibrationOptions& o) {
  if (!(o.target > 0.0 && std::isfinite(o.target))) fail_argument("calibration target", "a finite number > 0", o.target);
  if (!(o.margin > 0.0 && o.margin <= 1.0)) fail_argument("calibration margin", "in (0, 1]", o.margin);
  if (o.iterations < 1 || o.iterations > 30) fail_argument("calibration iterations", "in [1, 30]", o.iterations);
}

void check_sample(const CalibrationSample& s, const CalibrationSample& first, size_t index) {
  const Device device = first.q.device();
  for (const Tensor* t : {&s.q, &s.k, &s.v}) {
    const bool dtype_ok = device.is_cpu() ? t->dtype() == DType::kF32 : (t->dtype() == DType::kBF16 || t->dtype() == DType::kF16);
    if (!dtype_ok || t->device() != device || t->view().dim() != 4 || !t->view().is_contiguous())
      fail_argument(detail::concat("calibration sample ", index),
                    "contiguous (B, S, H, D) q, k, v: CPU fp32, or CUDA bf16/fp16, all on the device of sample 0",
                    t->view().describe());
  }
  if (s.q.shape() != first.q.shape() || s.k.shape() != first.k.shape() || s.v.shape() != first.v.shape())
    fail_argument(detail::concat("calibration sample ", index), "the shapes of sample 0 (" + first.q.view().describe() + ")",
                  s.q.view().describe());
}

XAttentionOptions xattention_options(const std::vector<double>& per_head, const CalibrationOptions& o) {
  XAttentionOptions x;
  x.block_q = o.block_q;
  x.block_kv = o.block_kv;
  x.stride = o.stride;
  x.per_head_threshold = per_head;
  return x;
}

TopkEstimatorOptions topk_options(const std::vector<double>& per_head, const CalibrationOptions& o) {
  TopkEstimatorOptions t;
  t.block_q = o.block_q;
  t.block_kv = o.block_kv;
  t.similarity_threshold = o.similarity_threshold;
  t.per_head = per_head;
  if (o.method == CalibrationMethod::kCdf) t.cdf_threshold = 1.0;  // cdf mode: per_head holds the cdf values
  return t;
}

// Density of the whole mask and of each head from its row offsets (rows ordered batch, head, q block).
struct MaskDensity {
  double all = 0.0;
  std::vector<double> per_head;
};
MaskDensity mask_density(const BlockMaskShape& shape, const std::vector<int32_t>& indptr) {
  const int64_t q_blocks = shape.q_blocks(), heads = shape.mask_heads;
  const double head_blocks = static_cast<double>(shape.mask_batch * q_blocks * shape.kv_blocks());
  MaskDensity d;
  d.per_head.assign(static_cast<size_t>(heads), 0.0);
  for (int64_t b = 0; b < shape.mask_batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t first_row = (b * heads + h) * q_blocks;
      const auto kept = indptr[static_cast<size_t>(first_row + q_blocks)] - indptr[static_cast<size_t>(first_row)];
      d.per_head[static_cast<size_t>(h)] += static_cast<double>(kept) / head_blocks;
    }
  d.all = static_cast<double>(indptr.back()) / (head_blocks * static_cast<double>(heads));
  return d;
}

// The block-sparse output of every head with its own value into s.sparse_out; returns the densities.
MaskDensity sparse_forward(const ExecContext& ctx, CalibrationSample& s, const std::vector<double>& per_head,
                           const CalibrationOptions& o) {
  const bool threshold = o.method == CalibrationMethod::kThreshold;
  if (s.q.device().is_cpu()) {
    const BlockMask mask = threshold ? estimate_xattention_mask(ctx, s.q.view(), s.k.view(), xattention_options(per_head, o)).mask
                                     : estimate_topk_mask(ctx, s.q.view(), s.k.view(), topk_options(per_head, o)).mask;
    block_sparse_attention_forward(ctx, s.q.view(), s.k.view(), s.v.view(), mask.view(), s.sparse_out.view(), TensorView{});
    return mask_density(mask.shape(), mask.indptr());
  }
  const BlockMaskShape shape{s.q.size(0), s.q.size(2), s.q.size(1), s.k.size(1), o.block_q, o.block_kv};
  if (!s.device_mask || !(s.device_mask->shape() == shape))
    s.device_mask = std::make_shared<DeviceEstimatedMask>(shape, s.k.size(2), s.q.size(3), s.q.device(), threshold ? o.stride : 0);
  DeviceEstimatedMask& mask = *s.device_mask;
  if (threshold) estimate_xattention_mask_device(ctx, s.q.view(), s.k.view(), xattention_options(per_head, o), mask);
  else estimate_topk_mask_device(ctx, s.q.view(), s.k.view(), topk_options(per_head, o), mask);
  block_sparse_attention_forward(ctx, s.q.view(), s.k.view(), s.v.view(), mask.view(), s.sparse_out.view(), TensorView{});
  return mask_density(shape, mask.row_offsets(ctx.stream));
}

// Per head h of (B, S, H, D) outputs: rel-L2 or 1 - cosine of approx against reference, from the
// per-head sums (computed on the outputs' device); index H is the whole output.
std::vector<double> head_errors(const ExecContext& ctx, const Tensor& approx, const Tensor& reference, CalibrationMetric metric) {
  HeadErrorSums s = head_error_sums(ctx, approx.view(), reference.view());
  const size_t heads = s.diff.size();
  s.diff.push_back(0.0), s.reference.push_back(0.0), s.approx.push_back(0.0), s.dot.push_back(0.0);
  for (size_t h = 0; h < heads; ++h)
    s.diff[heads] += s.diff[h], s.reference[heads] += s.reference[h], s.approx[heads] += s.approx[h], s.dot[heads] += s.dot[h];
  std::vector<double> error(heads + 1);
  for (size_t h = 0; h <= heads; ++h) {
    const double diff = s.diff[h], ref = s.reference[h], app = s.approx[h], dot = s.dot[h];
    if (metric == CalibrationMetric::kRelL2) error[h] = ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
    else error[h] = (ref > 0.0 && app > 0.0) ? 1.0 - dot / std::sqrt(ref * app) : (diff > 0.0 ? 1.0 : 0.0);
  }
  return error;
}

}  // namespace

CalibrationMethod parse_calibration_method(const std::string& name) {
  if (name == "topk") return CalibrationMethod::kTopk;
  if (name == "cdf") return CalibrationMethod::kCdf;
  if (name == "threshold") return CalibrationMethod::kThreshold;
  fail_argument("--method", "topk, cdf or threshold", name);
}

CalibrationMetric parse_calibration_metric(const std::string& name) {
  if (name == "rel_l2") return CalibrationMetric::kRelL2;
  if (name == "cosine") return CalibrationMetric::kCosine;
  fail_argument("--metric", "rel_l2 or cosine", name);
}

SampleError evaluate_setting(const ExecContext& ctx, CalibrationSample& sample, const std::vector<double>& per_head,
                             const CalibrationOptions& options) {
  if (!sample.dense_out.defined()) {
    sample.dense_out = Tensor::empty(sample.q.shape(), sample.q.dtype(), sample.q.device());
    attention_forward(ctx, sample.q.view(), sample.k.view(), sample.v.view(), sample.dense_out.view(), TensorView{});
  }
  if (!sample.sparse_out.defined()) sample.sparse_out = Tensor::empty(sample.q.shape(), sample.q.dtype(), sample.q.device());
  MaskDensity density = sparse_forward(ctx, sample, per_head, options);
  std::vector<double> errors = head_errors(ctx, sample.sparse_out, sample.dense_out, options.metric);
  SampleError e{density.all, errors.back(), {}, std::move(density.per_head)};
  errors.pop_back();
  e.head_error = std::move(errors);
  return e;
}

LayerCalibration calibrate_layer(const ExecContext& ctx, std::span<CalibrationSample> samples, const CalibrationOptions& options) {
  check_options(options);
  if (samples.empty()) fail_argument("calibration samples", "at least one captured step", 0);
  for (size_t i = 0; i < samples.size(); ++i) check_sample(samples[i], samples[0], i);
  const size_t heads = static_cast<size_t>(samples[0].q.size(2));
  // Invariant: the value `high` meets the target (1 keeps every block with any score); `low` is
  // known not to, or is the lower end of the range.
  std::vector<double> low(heads, 0.0), high(heads, 1.0);
  for (int it = 0; it < options.iterations; ++it) {
    std::vector<double> mid(heads);
    for (size_t h = 0; h < heads; ++h) mid[h] = 0.5 * (low[h] + high[h]);
    std::vector<double> worst(heads, 0.0);
    for (CalibrationSample& s : samples) {
      const SampleError e = evaluate_setting(ctx, s, mid, options);
      for (size_t h = 0; h < heads; ++h) worst[h] = std::max(worst[h], e.head_error[h]);
    }
    const double bound = options.target * options.margin;
    for (size_t h = 0; h < heads; ++h) (worst[h] <= bound ? high[h] : low[h]) = mid[h];
  }
  StepsEvaluation final_steps = evaluate_steps(ctx, samples, high, options);
  LayerCalibration result;
  result.per_head = high;
  result.head_error = std::move(final_steps.head_error);
  result.density = final_steps.density;
  result.error = final_steps.error;
  return result;
}

StepsEvaluation evaluate_steps(const ExecContext& ctx, std::span<CalibrationSample> samples, const std::vector<double>& per_head,
                               const CalibrationOptions& options) {
  if (samples.empty()) fail_argument("captured steps", "at least one", 0);
  for (size_t i = 0; i < samples.size(); ++i) check_sample(samples[i], samples[0], i);
  StepsEvaluation r;
  for (CalibrationSample& s : samples) r.steps.push_back(evaluate_setting(ctx, s, per_head, options));
  const double share = 1.0 / static_cast<double>(samples.size());
  for (const SampleError& e : r.steps) {
    r.head_error.resize(e.head_error.size(), 0.0);
    r.head_density.resize(e.head_density.size(), 0.0);
    r.density += e.density * share;
    r.error = std::max(r.error, e.error);
    for (size_t h = 0; h < e.head_error.size(); ++h) r.head_error[h] = std::max(r.head_error[h], e.head_error[h]);
    for (size_t h = 0; h < e.head_density.size(); ++h) r.head_density[h] += e.head_density[h] * share;
  }
  return r;
}

GlobalCalibration calibrate_global(const ExecContext& ctx, std::span<std::vector<CalibrationSample>> layers,
                                   const CalibrationOptions& options) {
  check_options(options);
  if (layers.empty()) fail_argument("calibration layers", "at least one layer", 0);
  // Mean density over the layers at `value`, and whether every head of every sample meets the target
  // (with the same margin as the per-head calibration, so the two are compared on equal terms).
  auto measure = [&](double value, bool& meets) {
    meets = true;
    double density = 0.0;
    for (std::vector<CalibrationSample>& samples : layers) {
      if (samples.empty()) fail_argument("calibration samples", "at least one captured step per layer", 0);
      for (CalibrationSample& s : samples) {
        const SampleError e = evaluate_setting(ctx, s, std::vector<double>(static_cast<size_t>(s.q.size(2)), value), options);
        density += e.density / static_cast<double>(samples.size() * layers.size());
        for (double error : e.head_error) meets = meets && error <= options.target * options.margin;
      }
    }
    return density;
  };
  double low = 0.0, high = 1.0;
  for (int it = 0; it < options.iterations; ++it) {
    const double mid = 0.5 * (low + high);
    bool meets = false;
    measure(mid, meets);
    (meets ? high : low) = mid;
  }
  bool meets = false;
  const double density = measure(high, meets);
  return GlobalCalibration{high, density};
}

SparseAttnConfig calibrated_config(const LayerCalibration& layer, const CalibrationOptions& options) {
  SparseAttnConfig c;
  c.geometry.block_q = options.block_q;
  c.geometry.block_kv = options.block_kv;
  std::ostringstream values;
  values.precision(6);
  for (size_t h = 0; h < layer.per_head.size(); ++h) values << (h ? "," : "") << layer.per_head[h];
  if (options.method == CalibrationMethod::kThreshold) {
    c.pattern.type = PatternType::kThreshold;
    c.selection.stride = options.stride;
    c.selection.threshold = *std::max_element(layer.per_head.begin(), layer.per_head.end());
    c.options["per_head_threshold"] = values.str();
  } else {
    c.pattern.type = PatternType::kDynamicTopk;
    c.selection.topk_ratio = *std::max_element(layer.per_head.begin(), layer.per_head.end());
    c.options["per_head"] = values.str();
    std::ostringstream similarity;
    similarity << options.similarity_threshold;
    c.options["similarity_threshold"] = similarity.str();
    if (options.method == CalibrationMethod::kCdf) c.options["cdf"] = "1";
  }
  return c;
}

}  // namespace tessel

namespace tessel {
namespace {

// Every head's value: the per-head list when given (of exactly `heads` values), else `all` for each.
std::vector<double> head_values(const std::vector<double>& listed, double all, int64_t heads, const std::string& field) {
  if (listed.empty()) return std::vector<double>(static_cast<size_t>(heads), all);
  if (static_cast<int64_t>(listed.size()) != heads)
    fail_argument(field, detail::concat(heads, " values (one per query head of the captures)"), listed.size());
  return listed;
}

// A field the calibration's estimates do not apply must hold its default, or the check would
// measure another mask than the runtime's.
template <typename T>
void require_measured(bool is_default, const std::string& field, const T& expected, const T& actual) {
  if (!is_default) fail_argument(field, detail::concat(expected, " (the setting eval and calibrate measure)"), actual);
}

}  // namespace

CalibratedSetting calibrated_setting(const SparseAttnConfig& config, int64_t heads, const std::string& who) {
  const ResolvedSparseAttnConfig resolved(config);
  const PatternSpec& spec = resolved.pattern();
  CalibratedSetting s;
  s.options.block_q = spec.block_q;
  s.options.block_kv = spec.block_kv;
  require_measured(!spec.keep_diagonal, who + ".selection.keep_diagonal", false, true);
  require_measured(spec.sink_blocks == 0, who + ".selection.sink_blocks", int64_t{0}, spec.sink_blocks);
  if (spec.type == PatternType::kDynamicTopk) {
    const TopkEstimatorOptions t = topk_options_from_spec(spec);
    require_measured(t.smooth_k, who + ".options.smooth_k", true, false);
    require_measured(t.rule == TopkRule::kSpargeAttn, who + ".options.rule", std::string("spargeattn"), std::string("reach_target"));
    const bool cdf = t.cdf_threshold > 0.0;
    s.options.method = cdf ? CalibrationMethod::kCdf : CalibrationMethod::kTopk;
    s.options.similarity_threshold = t.similarity_threshold;
    s.per_head = head_values(t.per_head, cdf ? t.cdf_threshold : t.topk_ratio, heads, who + ".options.per_head");
  } else if (spec.type == PatternType::kThreshold) {
    const XAttentionOptions x = xattention_options_from_spec(spec);
    require_measured(x.vote == XAttentionVote::kNone, who + ".options.vote", std::string("none"), spec.option("vote"));
    require_measured(!x.gqa_any, who + ".options.gqa_any", false, true);
    require_measured(x.padding == XAttentionPadding::kChunk, who + ".options.padding", std::string("chunk"), spec.option("padding"));
    require_measured(x.keep_diagonal && x.keep_first, who + ".options.keep_diagonal and keep_first", true, false);
    s.options.method = CalibrationMethod::kThreshold;
    s.options.stride = x.stride;
    s.per_head = head_values(x.per_head_threshold, x.threshold, heads, who + ".options.per_head_threshold");
  } else {
    fail_argument(who + ".pattern.type", "dynamic_topk or threshold (the calibrated methods)", pattern_type_name(spec.type));
  }
  return s;
}

}  // namespace tessel
