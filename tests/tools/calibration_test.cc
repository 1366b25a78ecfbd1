// Per-head calibration of the dynamic methods on the structured synthetic video data (heads with
// known roles), and the configs it writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "quality/calibration.h"
#include "quality/synthetic_video.h"
#include "tessel/core/error.h"
#include "tessel/sparse/config.h"

namespace tessel {
namespace {

// Two captured steps of one layer: the same heads, different content noise.
std::vector<CalibrationSample> video_steps() {
  std::vector<CalibrationSample> samples;
  for (uint64_t seed : {1u, 2u}) {
    SyntheticVideoOptions o;
    o.grid = {4, 8, 8};
    o.heads = 4;
    o.head_dim = 32;
    o.seed = seed;
    o.head_types = {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal, SyntheticHeadType::kSink,
                    SyntheticHeadType::kDiffuse};
    SyntheticQkv d = make_synthetic_video_qkv(o);
    samples.push_back({std::move(d.q), std::move(d.k), std::move(d.v), Tensor{}});
  }
  return samples;
}

CalibrationOptions small_blocks(CalibrationMethod method) {
  CalibrationOptions o;
  o.method = method;
  o.target = 0.05;
  o.block_q = 32;
  o.block_kv = 16;
  o.similarity_threshold = -1.0;
  return o;
}

TEST(Calibration, EveryHeadMeetsTheTargetOnEveryStepAndPerHeadBeatsOneGlobalValue) {
  for (CalibrationMethod method : {CalibrationMethod::kTopk, CalibrationMethod::kCdf, CalibrationMethod::kThreshold}) {
    SCOPED_TRACE(static_cast<int>(method));
    std::vector<CalibrationSample> samples = video_steps();
    const CalibrationOptions o = small_blocks(method);
    const LayerCalibration c = calibrate_layer(ExecContext{}, samples, o);
    ASSERT_EQ(c.per_head.size(), 4u);
    for (size_t h = 0; h < 4; ++h) EXPECT_LE(c.head_error[h], o.target) << "head " << h;
    EXPECT_LT(c.density, 1.0);
    // The one value that suits every head is the largest per-head value: it keeps at least as much.
    const double global = *std::max_element(c.per_head.begin(), c.per_head.end());
    double global_density = 0.0;
    for (CalibrationSample& s : samples)
      global_density += evaluate_setting(ExecContext{}, s, std::vector<double>(4, global), o).density / 2.0;
    EXPECT_LE(c.density, global_density + 1e-12);
  }
}

// With a margin every head is held to target x margin on the calibration steps, and the setting it
// picks keeps at least the blocks of the one picked without a margin.
TEST(Calibration, AMarginHoldsEveryHeadToTheSmallerBound) {
  std::vector<CalibrationSample> samples = video_steps();
  const CalibrationOptions plain = small_blocks(CalibrationMethod::kThreshold);
  CalibrationOptions with_margin = plain;
  with_margin.margin = 0.6;
  const LayerCalibration a = calibrate_layer(ExecContext{}, samples, plain);
  const LayerCalibration b = calibrate_layer(ExecContext{}, samples, with_margin);
  for (size_t h = 0; h < 4; ++h) {
    EXPECT_LE(b.head_error[h], 0.6 * plain.target) << "head " << h;
    EXPECT_GE(b.per_head[h], a.per_head[h]) << "head " << h;
  }
  EXPECT_GE(b.density, a.density);
}

TEST(Calibration, TheDiffuseHeadNeedsMoreBlocksThanTheSpatialHead) {
  std::vector<CalibrationSample> samples = video_steps();
  const LayerCalibration c = calibrate_layer(ExecContext{}, samples, small_blocks(CalibrationMethod::kTopk));
  EXPECT_GT(c.per_head[3], c.per_head[0]);
}

TEST(Calibration, OneGlobalValueMeetsTheTargetOnEveryHeadOfEveryLayer) {
  std::vector<std::vector<CalibrationSample>> layers{video_steps(), video_steps()};
  const CalibrationOptions o = small_blocks(CalibrationMethod::kThreshold);
  const GlobalCalibration g = calibrate_global(ExecContext{}, layers, o);
  EXPECT_GT(g.value, 0.0);
  EXPECT_LE(g.value, 1.0);
  double density = 0.0;
  for (std::vector<CalibrationSample>& samples : layers)
    for (CalibrationSample& s : samples) {
      const SampleError e = evaluate_setting(ExecContext{}, s, std::vector<double>(4, g.value), o);
      density += e.density / 4.0;
      for (double error : e.head_error) EXPECT_LE(error, o.target);
    }
  EXPECT_NEAR(g.density, density, 1e-12);
}

TEST(Calibration, WritesAConfigThatParsesAndValidates) {
  LayerCalibration layer;
  layer.per_head = {0.25, 0.5};
  for (CalibrationMethod method : {CalibrationMethod::kTopk, CalibrationMethod::kCdf, CalibrationMethod::kThreshold}) {
    const SparseAttnConfig c = calibrated_config(layer, small_blocks(method));
    const SparseAttnConfig parsed = parse_sparse_attn_json(c.to_json());
    EXPECT_EQ(parsed, c);
    const ResolvedSparseAttnConfig resolved(parsed);
    EXPECT_EQ(resolved.config().options.at(method == CalibrationMethod::kThreshold ? "per_head_threshold" : "per_head"),
              "0.25,0.5");
  }
}

TEST(Calibration, RejectsBadInput) {
  std::vector<CalibrationSample> none;
  EXPECT_THROW(calibrate_layer(ExecContext{}, none, small_blocks(CalibrationMethod::kTopk)), Error);
  std::vector<CalibrationSample> samples = video_steps();
  CalibrationOptions o = small_blocks(CalibrationMethod::kTopk);
  o.target = 0.0;
  EXPECT_THROW(calibrate_layer(ExecContext{}, samples, o), Error);
  for (double margin : {0.0, -0.5, 1.5}) {
    CalibrationOptions m = small_blocks(CalibrationMethod::kTopk);
    m.margin = margin;
    EXPECT_THROW(calibrate_layer(ExecContext{}, samples, m), Error) << margin;
  }
  samples[1].q = Tensor::empty({1, 128, 4, 32}, DType::kF32);
  EXPECT_THROW(calibrate_layer(ExecContext{}, samples, small_blocks(CalibrationMethod::kTopk)), Error);
  EXPECT_THROW(parse_calibration_method("radial"), Error);
  EXPECT_THROW(parse_calibration_metric("l1"), Error);
}

}  // namespace
}  // namespace tessel
