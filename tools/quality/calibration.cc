#include "quality/calibration.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/head_error_sums.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"
#include "tessel/sparse/estimators/topk_estimator.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel {
namespace {

void check_options(const CalibrationOptions& o) {
  if (!(o.target > 0.0 && std::isfinite(o.target))) fail_argument("calibration target", "a finite number > 0", o.target);
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

// The block-sparse output of every head with its own value into s.sparse_out; returns the density.
double sparse_forward(const ExecContext& ctx, CalibrationSample& s, const std::vector<double>& per_head,
                      const CalibrationOptions& o) {
  const bool threshold = o.method == CalibrationMethod::kThreshold;
  if (s.q.device().is_cpu()) {
    const BlockMask mask = threshold ? estimate_xattention_mask(ctx, s.q.view(), s.k.view(), xattention_options(per_head, o)).mask
                                     : estimate_topk_mask(ctx, s.q.view(), s.k.view(), topk_options(per_head, o)).mask;
    block_sparse_attention_forward(ctx, s.q.view(), s.k.view(), s.v.view(), mask.view(), s.sparse_out.view(), TensorView{});
    return mask.density();
  }
  const BlockMaskShape shape{s.q.size(0), s.q.size(2), s.q.size(1), s.k.size(1), o.block_q, o.block_kv};
  if (!s.device_mask || !(s.device_mask->shape() == shape))
    s.device_mask = std::make_shared<DeviceEstimatedMask>(shape, s.k.size(2), s.q.size(3), s.q.device(), threshold ? o.stride : 0);
  DeviceEstimatedMask& mask = *s.device_mask;
  if (threshold) estimate_xattention_mask_device(ctx, s.q.view(), s.k.view(), xattention_options(per_head, o), mask);
  else estimate_topk_mask_device(ctx, s.q.view(), s.k.view(), topk_options(per_head, o), mask);
  block_sparse_attention_forward(ctx, s.q.view(), s.k.view(), s.v.view(), mask.view(), s.sparse_out.view(), TensorView{});
  const double all = static_cast<double>(shape.num_rows()) * static_cast<double>(shape.kv_blocks());
  return static_cast<double>(mask.kept_blocks(ctx.stream)) / all;
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
  const double density = sparse_forward(ctx, sample, per_head, options);
  std::vector<double> errors = head_errors(ctx, sample.sparse_out, sample.dense_out, options.metric);
  SampleError e{density, errors.back(), {}};
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
    for (size_t h = 0; h < heads; ++h) (worst[h] <= options.target ? high[h] : low[h]) = mid[h];
  }
  LayerCalibration result;
  result.per_head = high;
  result.head_error.assign(heads, 0.0);
  result.density = 0.0;
  for (CalibrationSample& s : samples) {
    const SampleError e = evaluate_setting(ctx, s, high, options);
    result.density += e.density / static_cast<double>(samples.size());
    result.error = std::max(result.error, e.error);
    for (size_t h = 0; h < heads; ++h) result.head_error[h] = std::max(result.head_error[h], e.head_error[h]);
  }
  return result;
}

GlobalCalibration calibrate_global(const ExecContext& ctx, std::span<std::vector<CalibrationSample>> layers,
                                   const CalibrationOptions& options) {
  check_options(options);
  if (layers.empty()) fail_argument("calibration layers", "at least one layer", 0);
  // Mean density over the layers at `value`, and whether every head of every sample meets the target.
  auto measure = [&](double value, bool& meets) {
    meets = true;
    double density = 0.0;
    for (std::vector<CalibrationSample>& samples : layers) {
      if (samples.empty()) fail_argument("calibration samples", "at least one captured step per layer", 0);
      for (CalibrationSample& s : samples) {
        const SampleError e = evaluate_setting(ctx, s, std::vector<double>(static_cast<size_t>(s.q.size(2)), value), options);
        density += e.density / static_cast<double>(samples.size() * layers.size());
        for (double error : e.head_error) meets = meets && error <= options.target;
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
