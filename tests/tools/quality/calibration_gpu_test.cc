// Calibration on CUDA (every head estimated, attended and scored on the device at once) against the
// CPU calibration of the very same bf16 values, on the structured synthetic video data. Skips
// (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "quality/calibration.h"
#include "quality/synthetic_video.h"
#include "tessel/core/device.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

struct TwinSamples {
  std::vector<CalibrationSample> cpu, gpu;  // fp32 on the host, bf16 on the device: equal values
};

// Two captured steps of one layer of four heads with known roles, 8 q blocks × 16 kv blocks.
TwinSamples video_steps() {
  TwinSamples t;
  for (uint64_t seed : {1u, 2u}) {
    SyntheticVideoOptions o;
    o.grid = {4, 16, 16};
    o.heads = 4;
    o.head_dim = 64;
    o.seed = seed;
    o.dtype = DType::kBF16;
    o.head_types = {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal, SyntheticHeadType::kSink,
                    SyntheticHeadType::kDiffuse};
    const SyntheticQkv d = make_synthetic_video_qkv(o);
    CalibrationSample cpu, gpu;
    cpu.q = d.q.to(DType::kF32), cpu.k = d.k.to(DType::kF32), cpu.v = d.v.to(DType::kF32);
    gpu.q = d.q.to(Device::cuda()), gpu.k = d.k.to(Device::cuda()), gpu.v = d.v.to(Device::cuda());
    t.cpu.push_back(std::move(cpu));
    t.gpu.push_back(std::move(gpu));
  }
  return t;
}

CalibrationOptions options_for(CalibrationMethod method) {
  CalibrationOptions o;
  o.method = method;
  o.target = 0.05;
  o.similarity_threshold = -1.0;
  return o;
}

ExecContext on_gpu() {
  ExecContext ctx;
  ctx.device = Device::cuda();
  return ctx;
}

TEST(CalibrationGpu, ErrorsAndDensityOfOneSettingMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  TwinSamples t = video_steps();
  const std::vector<double> per_head{0.3, 0.5, 0.4, 0.9};
  for (CalibrationMethod method : {CalibrationMethod::kTopk, CalibrationMethod::kCdf, CalibrationMethod::kThreshold}) {
    SCOPED_TRACE(static_cast<int>(method));
    const CalibrationOptions o = options_for(method);
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      const SampleError cpu = evaluate_setting(ExecContext{}, t.cpu[i], per_head, o);
      const SampleError gpu = evaluate_setting(on_gpu(), t.gpu[i], per_head, o);
      EXPECT_NEAR(gpu.density, cpu.density, 0.02);
      // The device output and reference are bf16: their rounding adds a few 1e-3 of rel-L2.
      EXPECT_NEAR(gpu.error, cpu.error, 0.005 + 0.05 * cpu.error);
      for (size_t h = 0; h < per_head.size(); ++h)
        EXPECT_NEAR(gpu.head_error[h], cpu.head_error[h], 0.005 + 0.05 * cpu.head_error[h]) << "head " << h;
    }
  }
}

TEST(CalibrationGpu, PicksThePerHeadSettingsOfTheCpu) {
  SKIP_WITHOUT_GPU();
  for (CalibrationMethod method : {CalibrationMethod::kTopk, CalibrationMethod::kCdf, CalibrationMethod::kThreshold}) {
    SCOPED_TRACE(static_cast<int>(method));
    TwinSamples t = video_steps();
    const CalibrationOptions o = options_for(method);
    const LayerCalibration cpu = calibrate_layer(ExecContext{}, t.cpu, o);
    const LayerCalibration gpu = calibrate_layer(on_gpu(), t.gpu, o);
    ASSERT_EQ(gpu.per_head.size(), cpu.per_head.size());
    // The CPU's worst error of each head at the values the device picked.
    std::vector<double> cpu_error_at_gpu_values(cpu.per_head.size(), 0.0);
    for (CalibrationSample& s : t.cpu) {
      const SampleError e = evaluate_setting(ExecContext{}, s, gpu.per_head, o);
      for (size_t h = 0; h < e.head_error.size(); ++h) cpu_error_at_gpu_values[h] = std::max(cpu_error_at_gpu_values[h], e.head_error[h]);
    }
    int differing = 0;
    for (size_t h = 0; h < cpu.per_head.size(); ++h) {
      EXPECT_LE(gpu.head_error[h], o.target) << "head " << h;
      if (gpu.per_head[h] == cpu.per_head[h]) continue;
      // Bisection paths part only where a midpoint's error lies within bf16 rounding of the target:
      // then the device's value is still valid for the CPU up to that rounding.
      ++differing;
      EXPECT_LE(cpu_error_at_gpu_values[h], o.target * 1.1)
          << "head " << h << ": cpu value " << cpu.per_head[h] << ", gpu value " << gpu.per_head[h];
    }
    EXPECT_LE(differing, 1) << "the device calibration should pick the CPU's value for all but a boundary head";
    EXPECT_NEAR(gpu.density, cpu.density, 0.05);
  }
}

}  // namespace
}  // namespace tessel
