// End to end through the `tessel` binary: `tessel eval --config` checks the config `tessel
// calibrate --out` writes on held-out captures. Its per-head errors and densities are compared
// with an fp64 reference of the config's own masks, with calibrate's held-out report on the same
// steps, and its exit status with the target; bad inputs name the option or config field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "quality/synthetic_video.h"
#include "run_tessel.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/estimators/xattention_estimator.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

fs::path test_dir() { return test_scratch_dir("tessel_eval_config_"); }

TesselRun run_tessel(const std::string& args) { return run_tessel_binary(args, test_dir() / "output.txt"); }

nlohmann::json parse_json_output(const TesselRun& r) {
  // stderr (the missed-target line) follows the JSON document in the captured output.
  const size_t end = r.out.rfind("\n}");
  EXPECT_NE(end, std::string::npos) << r.out;
  return nlohmann::json::parse(r.out.substr(0, end + 2));
}

// Captured steps of an odd shape (3 frames of 7x9 tokens: 189, no multiple of the blocks), 3 heads.
struct Capture {
  std::string path;
  SyntheticQkv qkv;
};
Capture write_capture(uint64_t seed) {
  SyntheticVideoOptions o;
  o.grid = {3, 7, 9};
  o.heads = 3;
  o.head_dim = 32;
  o.seed = seed;
  Capture c{(test_dir() / ("step" + std::to_string(seed) + ".safetensors")).string(), make_synthetic_video_qkv(o)};
  write_safetensors(c.path, {{"q", c.qkv.q.view()}, {"k", c.qkv.k.view()}, {"v", c.qkv.v.view()}});
  return c;
}

std::vector<double> split_numbers(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stod(item));
  return values;
}

TEST(EvalConfigCli, PerHeadErrorsAndDensitiesMatchAnFp64ReferenceOfTheConfigsMasks) {
  const Capture step1 = write_capture(1), step2 = write_capture(2), heldout = write_capture(3);
  const std::string config = (test_dir() / "calibrated.json").string();
  const std::string layer = "--layer '" + step1.path + "," + step2.path + "' --heldout '" + heldout.path + "'";
  const TesselRun calibrated = run_tessel("calibrate " + layer + " " + layer +
                                          " --method threshold --target 0.08 --block-q 32 --block-kv 16 --out '" + config + "' --json");
  ASSERT_EQ(calibrated.status, 0) << calibrated.out;
  const nlohmann::json c = nlohmann::json::parse(calibrated.out);

  const std::string held = " --layer '" + heldout.path + "'";
  const TesselRun r = run_tessel("eval --config '" + config + "'" + held + held + " --json --report-only");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = parse_json_output(r);
  ASSERT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["metric"], "rel_l2");
  EXPECT_DOUBLE_EQ(j["target"].get<double>(), 0.08);

  const SyntheticQkv& d = heldout.qkv;
  const reference::AttentionResult dense = reference::attention(d.q.view(), d.k.view(), d.v.view());
  double mean_density = 0.0;
  for (size_t l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    const nlohmann::json& layer_report = j["layers"][l];
    // calibrate measured the same held-out step with the same setting.
    EXPECT_DOUBLE_EQ(layer_report["density"].get<double>(), c["layers"][l]["heldout_density"].get<double>());
    EXPECT_DOUBLE_EQ(layer_report["error"].get<double>(), c["layers"][l]["heldout_error"].get<double>());
    mean_density += layer_report["density"].get<double>() / 2.0;

    // The config's mask, and the per-head rel-L2 of its fp64 block-sparse output against fp64 dense.
    XAttentionOptions x;
    x.block_q = 32;
    x.block_kv = 16;
    x.stride = 8;
    x.per_head_threshold = split_numbers(c["layers"][l]["sparse_attn"]["options"]["per_head_threshold"].get<std::string>());
    ASSERT_EQ(x.per_head_threshold.size(), 3u);
    const BlockMask mask = estimate_xattention_mask(ExecContext{}, d.q.view(), d.k.view(), x).mask;
    const reference::AttentionResult sparse = reference::block_sparse_attention(d.q.view(), d.k.view(), d.v.view(), mask.view());
    const BlockMaskShape& s = mask.shape();
    double worst_head = 0.0;
    for (int64_t h = 0; h < 3; ++h) {
      double diff = 0.0, norm = 0.0;
      for (int64_t t = 0; t < dense.rows(); ++t)
        for (int64_t e = 0; e < 32; ++e) {
          diff += std::pow(sparse.out_at(0, t, h, e) - dense.out_at(0, t, h, e), 2);
          norm += std::pow(dense.out_at(0, t, h, e), 2);
        }
      int64_t kept = 0;
      for (int64_t qb = 0; qb < s.q_blocks(); ++qb) kept += static_cast<int64_t>(mask.row(0, h, qb).size());
      const nlohmann::json& head = layer_report["heads"][static_cast<size_t>(h)];
      EXPECT_DOUBLE_EQ(head["value"].get<double>(), x.per_head_threshold[static_cast<size_t>(h)]);
      EXPECT_NEAR(head["error"].get<double>(), std::sqrt(diff / norm), 2e-4) << "head " << h;
      EXPECT_DOUBLE_EQ(head["density"].get<double>(), static_cast<double>(kept) / static_cast<double>(s.q_blocks() * s.kv_blocks()));
      EXPECT_EQ(head["meets_target"].get<bool>(), head["error"].get<double>() <= 0.08);
      worst_head = std::max(worst_head, head["error"].get<double>());
    }
    EXPECT_EQ(layer_report["meets_target"].get<bool>(), worst_head <= 0.08);
    EXPECT_DOUBLE_EQ(layer_report["predicted_speedup"].get<double>(), 1.0 / layer_report["density"].get<double>());
  }
  EXPECT_NEAR(j["mean_density"].get<double>(), mean_density, 1e-12);

  // A target no head meets: every (layer, head, step) is named and the status says so.
  const TesselRun missed = run_tessel("eval --config '" + config + "'" + held + held + " --target 1e-6");
  EXPECT_EQ(missed.status, 1) << missed.out;
  EXPECT_NE(missed.out.find("MISSED"), std::string::npos) << missed.out;
  EXPECT_NE(missed.out.find("missed by 6 (layer, head, step): layer 0 head 0 step 0"), std::string::npos) << missed.out;
  EXPECT_NE(missed.out.find("layer 1 head 2 step 0"), std::string::npos) << missed.out;
  const TesselRun reported = run_tessel("eval --config '" + config + "'" + held + held + " --target 1e-6 --report-only --json");
  EXPECT_EQ(reported.status, 0) << reported.out;
  EXPECT_EQ(parse_json_output(reported)["misses"].size(), 6u);
  // A target every head meets passes.
  const TesselRun met = run_tessel("eval --config '" + config + "'" + held + held + " --target 5");
  EXPECT_EQ(met.status, 0) << met.out;
  EXPECT_NE(met.out.find("predicted attention speedup"), std::string::npos) << met.out;
}

TEST(EvalConfigCli, SyntheticHeldOutStepsRepeatCalibratesHeldOutReport) {
  const std::string config = (test_dir() / "calibrated.json").string();
  const TesselRun calibrated = run_tessel(
      "calibrate --grid 2x8x8 --synthetic-layers 2 --synthetic-steps 1 --synthetic-heldout 2 --heads 2 --head-dim 32 "
      "--block-q 32 --block-kv 16 --similarity-threshold -1 --method topk --out '" + config + "' --json");
  ASSERT_EQ(calibrated.status, 0) << calibrated.out;
  const nlohmann::json c = nlohmann::json::parse(calibrated.out);
  EXPECT_EQ(c["shape"]["heads"], 2);
  EXPECT_EQ(c["shape"]["head_dim"], 32);
  // The captures' heads and head dimension come from the config's shape.
  const TesselRun r = run_tessel("eval --config '" + config + "' --grid 2x8x8 --synthetic-heldout 2 --json --report-only");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = parse_json_output(r);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_DOUBLE_EQ(j["layers"][l]["density"].get<double>(), c["layers"][l]["heldout_density"].get<double>());
    EXPECT_DOUBLE_EQ(j["layers"][l]["error"].get<double>(), c["layers"][l]["heldout_error"].get<double>());
    EXPECT_EQ(j["layers"][l]["steps"].size(), 2u);
    EXPECT_EQ(j["layers"][l]["heads"].size(), 2u);
  }
  // Another --seed gives other held-out steps.
  const TesselRun shifted = run_tessel("eval --config '" + config + "' --grid 2x8x8 --seed 7 --json --report-only");
  ASSERT_EQ(shifted.status, 0) << shifted.out;
  EXPECT_NE(parse_json_output(shifted)["layers"][0]["error"].get<double>(), j["layers"][0]["error"].get<double>());
}

TEST(EvalConfigCli, BadInputsNameTheOptionOrConfigField) {
  const Capture step = write_capture(1);
  const std::string config = (test_dir() / "calibrated.json").string();
  const std::string layer = " --layer '" + step.path + "'";
  ASSERT_EQ(run_tessel("calibrate" + layer + layer + " --method threshold --block-q 32 --block-kv 16 --out '" + config + "'").status, 0);
  const auto write = [](const std::string& name, const std::string& text) {
    const std::string path = (test_dir() / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const std::string radial = write("radial.json", R"({"target": 0.05, "layers": [{"sparse_attn": {"pattern": {"type": "radial"}}}]})");
  const std::string no_layers = write("no_layers.json", R"({"target": 0.05})");
  const std::string bad_metric =
      write("bad_metric.json", R"({"metric": "l1", "target": 0.05, "layers": [{"sparse_attn": {"pattern": {"type": "threshold"}}}]})");
  const std::string smooth_off = write(
      "smooth_off.json",
      R"({"target": 0.05, "layers": [{"sparse_attn": {"pattern": {"type": "dynamic_topk"}, "options": {"smooth_k": "0"}}}]})");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--config '" + (test_dir() / "missing.json").string() + "'" + layer, {"--config", "missing.json"}},
      {"--config '" + config + "'" + layer, {"--layer", "2 values (one per layer of --config", "got 1"}},
      {"--config '" + config + "' --grid 3x7x9 --heads 4 --head-dim 32", {"layers[0].sparse_attn.options.per_head_threshold", "4 values"}},
      {"--config '" + radial + "'" + layer, {"layers[0].sparse_attn.pattern.type", "dynamic_topk or threshold", "radial"}},
      {"--config '" + no_layers + "'" + layer, {"--config", "\"layers\" array"}},
      {"--config '" + bad_metric + "'" + layer, {"metric", "rel_l2 or cosine", "l1"}},
      {"--config '" + smooth_off + "'" + layer, {"layers[0].sparse_attn.options.smooth_k"}},
      {"--config '" + config + "'", {"--layer / --grid", "neither"}},
      {"--config '" + config + "' --qkv '" + step.path + "'" + layer, {"--qkv"}},
      {"--config '" + config + "'" + layer + layer + " --device tpu", {"tpu"}},
      {layer, {"--layer", "--config"}},
  };
  for (const auto& [args, expected] : cases) {
    const TesselRun r = run_tessel("eval " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    for (const std::string& text : expected) EXPECT_NE(r.out.find(text), std::string::npos) << args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace tessel
