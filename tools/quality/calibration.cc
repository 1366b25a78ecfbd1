#include "quality/calibration.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/kernels/attention.h"
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

// Head `head` of a contiguous (B, S, H, D) tensor as a (B, S, 1, D) view (strides of the whole).
TensorView head_view(const Tensor& t, int64_t head) {
  const TensorView& v = t.view();
  auto* data = static_cast<char*>(v.data()) + static_cast<size_t>(head * v.stride(2)) * dtype_size(v.dtype());
  return TensorView(data, v.dtype(), v.device(), {v.size(0), v.size(1), 1, v.size(3)},
                    {v.stride(0), v.stride(1), v.stride(2), v.stride(3)});
}

Tensor host_fp32(const Tensor& t) { return t.device().is_cpu() ? t.to(DType::kF32) : t.to(Device::cpu()).to(DType::kF32); }

// CUDA samples: the device estimators take one parameter for all heads, and a head's mask depends
// only on its own q and k, so each head is estimated and attended on its own with its value.
// Returns the mean density over the heads; `out` receives every head.
double sparse_forward_per_head_device(const ExecContext& ctx, const CalibrationSample& s, const std::vector<double>& per_head,
                                      const CalibrationOptions& o, Tensor& out) {
  const int64_t heads = s.q.size(2), group = heads / s.k.size(2);
  const BlockMaskShape shape{s.q.size(0), 1, s.q.size(1), s.k.size(1), o.block_q, o.block_kv};
  const bool threshold = o.method == CalibrationMethod::kThreshold;
  DeviceEstimatedMask mask(shape, 1, s.q.size(3), s.q.device(), threshold ? o.stride : 0);
  double density = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    const TensorView q = head_view(s.q, h), k = head_view(s.k, h / group), v = head_view(s.v, h / group);
    const double value = per_head[static_cast<size_t>(h)];
    if (threshold) {
      XAttentionOptions x;
      x.block_q = o.block_q;
      x.block_kv = o.block_kv;
      x.stride = o.stride;
      x.threshold = value;
      estimate_xattention_mask_device(ctx, q, k, x, mask);
    } else {
      TopkEstimatorOptions t;
      t.block_q = o.block_q;
      t.block_kv = o.block_kv;
      t.similarity_threshold = o.similarity_threshold;
      if (o.method == CalibrationMethod::kCdf) t.cdf_threshold = value;
      else t.topk_ratio = value;
      estimate_topk_mask_device(ctx, q, k, t, mask);
    }
    block_sparse_attention_forward(ctx, q, k, v, mask.view(), head_view(out, h), TensorView{});
    density += mask.to_host().density() / static_cast<double>(heads);
  }
  return density;
}

BlockMask estimate(const ExecContext& ctx, const CalibrationSample& s, const std::vector<double>& per_head,
                   const CalibrationOptions& o) {
  if (o.method == CalibrationMethod::kThreshold) {
    XAttentionOptions x;
    x.block_q = o.block_q;
    x.block_kv = o.block_kv;
    x.stride = o.stride;
    x.per_head_threshold = per_head;
    return estimate_xattention_mask(ctx, s.q.view(), s.k.view(), x).mask;
  }
  TopkEstimatorOptions t;
  t.block_q = o.block_q;
  t.block_kv = o.block_kv;
  t.similarity_threshold = o.similarity_threshold;
  t.per_head = per_head;
  if (o.method == CalibrationMethod::kCdf) t.cdf_threshold = 1.0;  // cdf mode: per_head holds the cdf values
  return estimate_topk_mask(ctx, s.q.view(), s.k.view(), t).mask;
}

// Per head h of (B, S, H, D) contiguous fp32 outputs: rel-L2 or 1 - cosine of approx against
// reference (fp64 sums); index H is the whole output. One task per head.
std::vector<double> head_errors(const Tensor& approx, const Tensor& reference, CalibrationMetric metric) {
  const int64_t heads = reference.size(2), dim = reference.size(3), rows = reference.size(0) * reference.size(1);
  std::vector<double> diff(heads + 1, 0.0), ref(heads + 1, 0.0), app(heads + 1, 0.0), dot(heads + 1, 0.0);
  const float* a = approx.data_as<const float>();
  const float* r = reference.data_as<const float>();
  parallel_for(heads, [&](int64_t h) {
    double sum_diff = 0.0, sum_ref = 0.0, sum_app = 0.0, sum_dot = 0.0;
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t d = 0; d < dim; ++d) {
        const size_t i = static_cast<size_t>((row * heads + h) * dim + d);
        const double x = a[i], y = r[i];
        sum_diff += (x - y) * (x - y);
        sum_ref += y * y;
        sum_app += x * x;
        sum_dot += x * y;
      }
    diff[h] = sum_diff, ref[h] = sum_ref, app[h] = sum_app, dot[h] = sum_dot;
  });
  for (int64_t h = 0; h < heads; ++h) diff[heads] += diff[h], ref[heads] += ref[h], app[heads] += app[h], dot[heads] += dot[h];
  std::vector<double> error(heads + 1);
  for (int64_t h = 0; h <= heads; ++h) {
    if (metric == CalibrationMetric::kRelL2) error[h] = ref[h] > 0.0 ? std::sqrt(diff[h] / ref[h]) : std::sqrt(diff[h]);
    else error[h] = (ref[h] > 0.0 && app[h] > 0.0) ? 1.0 - dot[h] / std::sqrt(ref[h] * app[h]) : (diff[h] > 0.0 ? 1.0 : 0.0);
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
  const bool on_cpu = sample.q.device().is_cpu();
  if (!sample.dense_out.defined()) {  // kept on the host in fp32, where the errors are computed
    Tensor dense = Tensor::empty(sample.q.shape(), sample.q.dtype(), sample.q.device());
    attention_forward(ctx, sample.q.view(), sample.k.view(), sample.v.view(), dense.view(), TensorView{});
    sample.dense_out = on_cpu ? std::move(dense) : host_fp32(dense);
  }
  Tensor out = Tensor::empty(sample.q.shape(), sample.q.dtype(), sample.q.device());
  double density = 0.0;
  if (on_cpu) {
    const BlockMask mask = estimate(ctx, sample, per_head, options);
    block_sparse_attention_forward(ctx, sample.q.view(), sample.k.view(), sample.v.view(), mask.view(), out.view(), TensorView{});
    density = mask.density();
  } else {
    density = sparse_forward_per_head_device(ctx, sample, per_head, options, out);
  }
  std::vector<double> errors = head_errors(on_cpu ? out : host_fp32(out), sample.dense_out, options.metric);
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
