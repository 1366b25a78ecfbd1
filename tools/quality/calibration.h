// Calibration of a dynamic sparse method for an output-quality target: for one layer, from its
// captured q/k/v (one sample per chosen denoising step), the sparsest setting per head whose
// attention-output error stays under the target on every sample.
//
// Each head's output depends only on that head's mask, and each method's mask grows with its
// parameter (top-k ratio, cdf, τ), so all heads are bisected at once: an iteration estimates one
// mask with per-head values, runs block-sparse attention, and moves each head's interval by its
// own error (the worst over the samples). After `iterations` halvings the upper ends, which always
// meet the target (the interval starts at 1, where the method keeps every block with any score),
// are the result.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/estimators/device_mask_estimation.h"

namespace tessel {

enum class CalibrationMethod : uint8_t { kTopk, kCdf, kThreshold };
enum class CalibrationMetric : uint8_t { kRelL2, kCosine };  // cosine: error = 1 - cosine

CalibrationMethod parse_calibration_method(const std::string& name);  // topk, cdf, threshold
CalibrationMetric parse_calibration_metric(const std::string& name);  // rel_l2, cosine

struct CalibrationOptions {
  CalibrationMethod method = CalibrationMethod::kTopk;
  CalibrationMetric metric = CalibrationMetric::kRelL2;
  double target = 0.05;  // > 0
  // The calibration steps must meet target * margin, in (0, 1]: a head's error on a step it was not
  // calibrated on scatters around its error on the calibration steps (by up to a third on the
  // synthetic video data), so the margin is what keeps unseen steps under the target itself.
  double margin = 1.0;
  int iterations = 7;    // halvings of each head's interval, >= 1
  int64_t block_q = 128, block_kv = 64;
  int64_t stride = 8;                  // threshold
  double similarity_threshold = 0.1;   // topk, cdf
};

// One captured step of a layer: q (B, S, H_q, D), k and v (B, S_kv, H_kv, D), contiguous: CPU fp32,
// or CUDA bf16/fp16. On CUDA everything stays on the device: one estimate with every head's value,
// one block-sparse attention over all heads and one reduction of the per-head errors per setting;
// only the H error sums and the kept-block count come back to the host.
struct CalibrationSample {
  Tensor q, k, v;
  // Made by the first evaluation and reused by the others (the reference is computed once per
  // sample, and no evaluation allocates device memory):
  Tensor dense_out;   // dense attention output of q, k, v, on their device, in their dtype
  Tensor sparse_out;  // the block-sparse output of the setting being evaluated
  std::shared_ptr<DeviceEstimatedMask> device_mask;  // CUDA: the estimated mask and its workspace
};

struct LayerCalibration {
  std::vector<double> per_head;    // the parameter of each query head
  std::vector<double> head_error;  // worst error over the samples with that parameter
  double density = 1.0;            // mean density over the samples
  double error = 0.0;              // worst error of the whole output over the samples
};

// Throws Error when the samples are empty or of different shapes, or options are out of range.
LayerCalibration calibrate_layer(const ExecContext& ctx, std::span<CalibrationSample> samples, const CalibrationOptions& options);

// The one value for every head of every layer (the baseline per-head calibration is measured
// against): the smallest value, by the same bisection, that meets the target on every head of
// every sample of every layer; `density` is the mean over the layers of their mean density.
struct GlobalCalibration {
  double value = 1.0;
  double density = 1.0;
};
GlobalCalibration calibrate_global(const ExecContext& ctx, std::span<std::vector<CalibrationSample>> layers,
                                   const CalibrationOptions& options);

// Error of the whole output and of each head, by the metric, for one mask parameter per head.
struct SampleError {
  double density = 1.0, error = 0.0;
  std::vector<double> head_error;
  std::vector<double> head_density;  // kept blocks of each query head / its blocks
};
SampleError evaluate_setting(const ExecContext& ctx, CalibrationSample& sample, const std::vector<double>& per_head,
                             const CalibrationOptions& options);

// One setting over several captured steps: the error of every step, and their summary (mean
// densities, worst errors).
struct StepsEvaluation {
  std::vector<SampleError> steps;
  double density = 0.0, error = 0.0;
  std::vector<double> head_error, head_density;
};
StepsEvaluation evaluate_steps(const ExecContext& ctx, std::span<CalibrationSample> samples, const std::vector<double>& per_head,
                               const CalibrationOptions& options);

// The sparse-attention config that runs the calibrated setting of a layer (dynamic_topk or threshold,
// per-head values in the options).
SparseAttnConfig calibrated_config(const LayerCalibration& layer, const CalibrationOptions& options);

// The inverse, for checking a config on other captures: the method, blocks and estimator settings
// of a dynamic_topk or threshold config, read through the same spec the runtime resolves, and its
// value per query head (pattern.options.per_head / per_head_threshold, or the one ratio, cdf
// value or threshold for all `heads`). Throws Error naming the config field (prefixed by `who`)
// for another pattern type, estimator options the calibration does not measure (smooth_k off,
// the reach_target rule, XAttention votes, always-keep selections) or a per-head list of another
// length than `heads`. metric and target keep their defaults.
struct CalibratedSetting {
  CalibrationOptions options;
  std::vector<double> per_head;
};
CalibratedSetting calibrated_setting(const SparseAttnConfig& config, int64_t heads, const std::string& who);

}  // namespace tessel
