// `tessel eval --config --device cuda` against the CPU check of the very same bf16 captures, and the
// per-head densities the device reports (from the estimated mask's row offsets) against the CPU
// mask's. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quality/calibration.h"
#include "quality/synthetic_video.h"
#include "run_tessel.h"
#include "tessel/core/device.h"
#include "tessel/core/io/safetensors.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

fs::path test_dir() { return test_scratch_dir("tessel_eval_config_gpu_"); }

// One step of four heads with known roles on an odd grid (3 x 13 x 17 = 663 tokens), in bf16.
SyntheticQkv bf16_step(uint64_t seed) {
  SyntheticVideoOptions o;
  o.grid = {3, 13, 17};
  o.heads = 4;
  o.head_dim = 64;
  o.seed = seed;
  o.dtype = DType::kBF16;
  o.head_types = {SyntheticHeadType::kSpatial, SyntheticHeadType::kTemporal, SyntheticHeadType::kSink, SyntheticHeadType::kDiffuse};
  return make_synthetic_video_qkv(o);
}

TEST(EvalConfigGpu, PerHeadDensitiesAndErrorsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const SyntheticQkv d = bf16_step(5);
  std::vector<CalibrationSample> cpu(1), gpu(1);
  cpu[0].q = d.q.to(DType::kF32), cpu[0].k = d.k.to(DType::kF32), cpu[0].v = d.v.to(DType::kF32);
  gpu[0].q = d.q.to(Device::cuda()), gpu[0].k = d.k.to(Device::cuda()), gpu[0].v = d.v.to(Device::cuda());
  const std::vector<double> per_head{0.3, 0.5, 0.4, 0.9};
  for (CalibrationMethod method : {CalibrationMethod::kTopk, CalibrationMethod::kThreshold}) {
    SCOPED_TRACE(static_cast<int>(method));
    CalibrationOptions o;
    o.method = method;
    o.similarity_threshold = -1.0;
    ExecContext on_gpu;
    on_gpu.device = Device::cuda();
    const StepsEvaluation c = evaluate_steps(ExecContext{}, cpu, per_head, o);
    const StepsEvaluation g = evaluate_steps(on_gpu, gpu, per_head, o);
    ASSERT_EQ(g.head_density.size(), 4u);
    double mean = 0.0;
    for (size_t h = 0; h < 4; ++h) {
      EXPECT_NEAR(g.head_density[h], c.head_density[h], 0.02) << "head " << h;
      EXPECT_NEAR(g.head_error[h], c.head_error[h], 0.005 + 0.05 * c.head_error[h]) << "head " << h;
      mean += g.head_density[h] / 4.0;
    }
    EXPECT_NEAR(mean, g.density, 1e-12);  // every head has as many blocks
  }
}

TEST(EvalConfigGpu, TheCommandOnCudaReportsWhatTheCpuReports) {
  SKIP_WITHOUT_GPU();
  std::vector<std::string> files;
  for (uint64_t seed : {1u, 2u, 3u}) {
    const SyntheticQkv d = bf16_step(seed);
    files.push_back((test_dir() / ("step" + std::to_string(seed) + ".safetensors")).string());
    write_safetensors(files.back(), {{"q", d.q.view()}, {"k", d.k.view()}, {"v", d.v.view()}});
  }
  const std::string config = (test_dir() / "calibrated.json").string();
  const std::string layer = " --layer '" + files[0] + "," + files[1] + "'";
  const TesselRun calibrated =
      run_tessel_binary("calibrate" + layer + layer + " --method threshold --target 0.05 --out '" + config + "'", test_dir() / "out.txt");
  ASSERT_EQ(calibrated.status, 0) << calibrated.out;
  const std::string held = " --layer '" + files[2] + "'";
  const auto report = [&](const std::string& device) {
    const TesselRun r = run_tessel_binary("eval --config '" + config + "'" + held + held + " --report-only --json --device " + device,
                                          test_dir() / "out.txt");
    EXPECT_EQ(r.status, 0) << r.out;
    return nlohmann::json::parse(r.out.substr(0, r.out.rfind("\n}") + 2));
  };
  const nlohmann::json c = report("cpu"), g = report("cuda");
  ASSERT_EQ(g["layers"].size(), 2u);
  for (size_t l = 0; l < 2; ++l)
    for (size_t h = 0; h < 4; ++h) {
      const nlohmann::json &ch = c["layers"][l]["heads"][h], &gh = g["layers"][l]["heads"][h];
      EXPECT_NEAR(gh["density"].get<double>(), ch["density"].get<double>(), 0.02) << "layer " << l << " head " << h;
      EXPECT_NEAR(gh["error"].get<double>(), ch["error"].get<double>(), 0.005 + 0.05 * ch["error"].get<double>())
          << "layer " << l << " head " << h;
    }
  EXPECT_NEAR(g["mean_density"].get<double>(), c["mean_density"].get<double>(), 0.02);
}

}  // namespace
}  // namespace tessel
