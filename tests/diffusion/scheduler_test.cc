// The flow-matching schedulers against diffusers 0.42.1 (tests/fixtures/diffusion/schedulers.json,
// written by scripts/make_scheduler_fixture.py): timesteps and sigmas, then every step() of a full
// run on the model outputs the fixture recorded.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/core/error.h"
#include "tessel/diffusion/scheduler.h"

namespace tessel {
namespace {

nlohmann::json load_fixture() {
  std::ifstream file(std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/schedulers.json");
  EXPECT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  return nlohmann::json::parse(text.str());
}

std::unique_ptr<Scheduler> scheduler_for(const nlohmann::json& fixture_case) {
  nlohmann::json config = fixture_case["config"];
  config["_class_name"] = fixture_case["class_name"];
  return make_scheduler(parse_scheduler_config(config.dump(), fixture_case["name"].get<std::string>()));
}

TEST(Scheduler, TimestepsAndSigmasEqualDiffusers) {
  const nlohmann::json fixture = load_fixture();
  ASSERT_EQ(fixture["diffusers_version"], "0.42.1");
  for (const auto& fixture_case : fixture["cases"]) {
    SCOPED_TRACE(fixture_case["name"].get<std::string>());
    auto scheduler = scheduler_for(fixture_case);
    scheduler->set_timesteps(fixture_case["num_inference_steps"].get<int64_t>());
    const auto timesteps = fixture_case["timesteps"].get<std::vector<double>>();
    const auto sigmas = fixture_case["sigmas"].get<std::vector<float>>();
    ASSERT_EQ(scheduler->timesteps().size(), timesteps.size());
    ASSERT_EQ(scheduler->sigmas().size(), sigmas.size());
    // Same float32 (and int64) numbers, not merely close ones.
    for (size_t i = 0; i < timesteps.size(); ++i) EXPECT_EQ(scheduler->timesteps()[i], timesteps[i]) << "step " << i;
    for (size_t i = 0; i < sigmas.size(); ++i) EXPECT_EQ(scheduler->sigmas()[i], sigmas[i]) << "sigma " << i;
  }
}

// Every step's output within `tolerance` * (1 + |diffusers|) of diffusers' float32 result: the
// scalar coefficients (logs, expm1) may differ from torch's in the last bit, nothing more.
TEST(Scheduler, StepsEqualDiffusers) {
  const nlohmann::json fixture = load_fixture();
  for (const auto& fixture_case : fixture["cases"]) {
    const std::string name = fixture_case["name"].get<std::string>();
    SCOPED_TRACE(name);
    const bool euler = fixture_case["class_name"] == "FlowMatchEulerDiscreteScheduler";
    const double tolerance = euler ? 1e-6 : 2e-6;
    auto scheduler = scheduler_for(fixture_case);
    scheduler->set_timesteps(fixture_case["num_inference_steps"].get<int64_t>());
    const Shape shape = fixture_case["shape"].get<Shape>();
    Tensor sample = Tensor::empty(shape, DType::kF32);
    Tensor model_output = Tensor::empty(shape, DType::kF32);
    const auto initial = fixture_case["initial_sample"].get<std::vector<float>>();
    std::copy(initial.begin(), initial.end(), sample.data_as<float>());
    double worst = 0.0;
    for (size_t step = 0; step < fixture_case["samples"].size(); ++step) {
      const auto output = fixture_case["model_outputs"][step].get<std::vector<float>>();
      std::copy(output.begin(), output.end(), model_output.data_as<float>());
      scheduler->step(model_output, sample, sample);
      const auto expected = fixture_case["samples"][step].get<std::vector<float>>();
      for (size_t i = 0; i < expected.size(); ++i) {
        const double error = std::fabs(sample.data_as<float>()[i] - expected[i]) / (1.0 + std::fabs(expected[i]));
        worst = std::max(worst, error);
        ASSERT_LE(error, tolerance) << "step " << step << " element " << i << ": " << sample.data_as<float>()[i]
                                    << " vs " << expected[i];
      }
    }
    EXPECT_EQ(scheduler->step_index(), scheduler->num_inference_steps());
    std::printf("%s: worst relative error %.3g over %zu steps\n", name.c_str(), worst,
                fixture_case["samples"].size());
  }
}

TEST(Scheduler, StepMisuseIsAnError) {
  auto scheduler = make_scheduler(SchedulerConfig{});
  Tensor sample = Tensor::zeros({2, 3}, DType::kF32);
  EXPECT_THROW(scheduler->step(sample, sample, sample), Error);  // no set_timesteps
  EXPECT_THROW(scheduler->set_timesteps(0), Error);
  scheduler->set_timesteps(2);
  Tensor wrong_shape = Tensor::zeros({3, 2}, DType::kF32);
  EXPECT_THROW(scheduler->step(wrong_shape, sample, sample), Error);
  Tensor wrong_dtype = Tensor::zeros({2, 3}, DType::kF64);
  EXPECT_THROW(scheduler->step(wrong_dtype, sample, sample), Error);
  scheduler->step(sample, sample, sample);
  Tensor other_size = Tensor::zeros({4}, DType::kF32);
  EXPECT_THROW(scheduler->step(other_size, other_size, other_size), Error);  // history is (2, 3)
  scheduler->step(sample, sample, sample);
  EXPECT_THROW(scheduler->step(sample, sample, sample), Error);  // past the last step
}

void expect_config_error(const std::string& json, const std::string& fragment) {
  try {
    parse_scheduler_config(json, "cfg");
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Scheduler, ConfigOfWan21Parses) {
  // Wan2.1-T2V-1.3B-Diffusers' scheduler/scheduler_config.json.
  const SchedulerConfig config = parse_scheduler_config(R"({"_class_name": "UniPCMultistepScheduler",
    "_diffusers_version": "0.33.0.dev0", "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
    "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": true, "num_train_timesteps": 1000, "predict_x0": true, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": false, "sample_max_value": 1.0, "solver_order": 2, "solver_p": null,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": false, "timestep_spacing": "linspace",
    "trained_betas": null, "use_beta_sigmas": false, "use_exponential_sigmas": false, "use_flow_sigmas": true,
    "use_karras_sigmas": false})");
  EXPECT_EQ(config.kind, SchedulerKind::unipc);
  EXPECT_EQ(config.shift, 3.0);
  EXPECT_EQ(config.solver_order, 2);
  EXPECT_TRUE(config.solver_bh2);
}

TEST(Scheduler, UnsupportedConfigsAreErrors) {
  expect_config_error(R"({"_class_name": "DDIMScheduler"})", "_class_name");
  expect_config_error(R"({"shift": 3.0})", "_class_name");
  expect_config_error(R"({"_class_name": "UniPCMultistepScheduler", "flow_shift": 3.0})", "use_flow_sigmas is missing");
  expect_config_error(R"({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": true,
    "prediction_type": "epsilon"})", "prediction_type");
  expect_config_error(R"({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": true,
    "prediction_type": "flow_prediction", "use_karras_sigmas": true})", "use_karras_sigmas");
  expect_config_error(R"({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": true,
    "prediction_type": "flow_prediction", "solver_order": 4})", "solver_order");
  expect_config_error(R"({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": true,
    "prediction_type": "flow_prediction", "solver_type": "midpoint"})", "solver_type");
  expect_config_error(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": -1})", "shift");
  expect_config_error(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": true})",
                      "use_dynamic_shifting");
  expect_config_error(R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "flow_shift": 3})", "unknown key");
  expect_config_error("[1, 2]", "JSON object");
  EXPECT_THROW(scheduler_kind_from_name("ddim"), Error);
  EXPECT_EQ(scheduler_kind_from_name("euler"), SchedulerKind::flow_match_euler);
}

}  // namespace
}  // namespace tessel
