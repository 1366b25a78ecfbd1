// End to end through the `tessel` binary: `tessel eval` on synthetic and on loaded q/k/v, and
// `tessel mask` writing PNGs for static and dynamic patterns, and naming what is wrong.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "tessel/core/io/safetensors.h"
#include "quality/synthetic_video.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

struct CommandOutput {
  int status = -1;
  std::string out;
};

fs::path test_dir();

// Runs the tessel binary with `args`, stdout and stderr captured in a file of the test's folder.
CommandOutput run_tessel(const std::string& args) {
  const fs::path log = test_dir() / "output.txt";
  const std::string command = "env -u TESSEL_SPARSE_ATTN_BACKEND -u DIFFUSION_SPARSE_ATTN_BACKEND -u TESSEL_SPARSE_ATTN_CONFIG '" + std::string(TESSEL_BINARY_DIR) +
                              "/bin/tessel' " + args + " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  return CommandOutput{WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

fs::path test_dir() {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("tessel_eval_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
                        std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

void check_results(const nlohmann::json& j, const std::vector<std::string>& methods) {
  ASSERT_TRUE(j.contains("config"));
  ASSERT_TRUE(j["results"].is_array());
  for (const std::string& m : methods) {
    bool found = false;
    for (const auto& r : j["results"]) {
      if (r["method"] != m) continue;
      found = true;
      for (const char* key : {"param", "density", "rel_l2", "cosine", "estimate_ms", "attn_ms"}) EXPECT_TRUE(r[key].is_number()) << m << " " << key;
      EXPECT_GT(r["density"].get<double>(), 0.0);
      EXPECT_LE(r["density"].get<double>(), 1.0);
      EXPECT_GE(r["rel_l2"].get<double>(), 0.0);
    }
    EXPECT_TRUE(found) << m;
  }
}

TEST(EvalCli, SyntheticGridJson) {
  const CommandOutput r = run_tessel(
      "eval --grid 3x8x8 --heads 4 --head-dim 32 --block-q 32 --block-kv 16 --topk 0.3 --threshold 0.9 --radius 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["seq"], 192);
  check_results(j, {"random", "dynamic_topk", "threshold", "radial", "local", "sliding_window", "spatial_aware"});
  // Dense-equivalent methods are exact: a full-density row has rel_l2 ~ 0.
  for (const auto& row : j["results"])
    if (row["density"].get<double>() == 1.0) EXPECT_LT(row["rel_l2"].get<double>(), 1e-5) << row.dump();
}

TEST(EvalCli, LoadedQkv) {
  SyntheticVideoOptions o;
  o.grid = {2, 8, 8};
  o.heads = 2;
  o.head_dim = 32;
  o.dtype = DType::kBF16;
  const SyntheticQkv d = make_synthetic_video_qkv(o);
  const fs::path file = test_dir() / "qkv.safetensors";
  write_safetensors(file.string(), {{"q", d.q.view()}, {"k", d.k.view()}, {"v", d.v.view()}});
  const CommandOutput r = run_tessel("eval --qkv '" + file.string() + "' --grid 2x8x8 --block-q 32 --block-kv 16 --methods random,dynamic_topk,threshold,radial --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["heads"], 2);
  check_results(j, {"random", "dynamic_topk", "threshold", "radial"});
  const CommandOutput bad = run_tessel("eval --qkv '" + file.string() + "' --grid 3x8x8");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--grid"), std::string::npos) << bad.out;
}

TEST(CalibrateCli, WritesPerLayerConfigsAndChecksHeldOutSteps) {
  std::vector<std::string> files;
  for (uint64_t seed : {1u, 2u, 3u}) {
    SyntheticVideoOptions o;
    o.grid = {2, 8, 8};
    o.heads = 2;
    o.head_dim = 32;
    o.seed = seed;
    const SyntheticQkv d = make_synthetic_video_qkv(o);
    files.push_back((test_dir() / ("step" + std::to_string(seed) + ".safetensors")).string());
    write_safetensors(files.back(), {{"q", d.q.view()}, {"k", d.k.view()}, {"v", d.v.view()}});
  }
  const fs::path config = test_dir() / "calibrated.json";
  const std::string layer = "--layer '" + files[0] + "," + files[1] + "' --heldout '" + files[2] + "'";
  const CommandOutput r = run_tessel("calibrate " + layer + " " + layer + " --method threshold --target 0.1 --block-q 32 " +
                                     "--block-kv 16 --compare-global --out '" + config.string() + "' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const auto& entry : j["layers"]) {
    EXPECT_LE(entry["error"].get<double>(), 0.1);
    EXPECT_GT(entry["density"].get<double>(), 0.0);
    EXPECT_TRUE(entry["heldout_error"].is_number());
    EXPECT_EQ(entry["sparse_attn"]["pattern"]["type"], "threshold");
  }
  EXPECT_GE(j["global"]["mean_density"].get<double>(), 0.0);
  EXPECT_TRUE(j["global"]["density_reduction"].is_number());
  std::ifstream written(config);
  EXPECT_EQ(nlohmann::json::parse(written), j);
  const CommandOutput bad = run_tessel("calibrate --layer '" + files[0] + "' --heldout a --heldout b");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--heldout"), std::string::npos) << bad.out;
}

TEST(CalibrateCli, SyntheticCapturesPerLayer) {
  const CommandOutput r = run_tessel(
      "calibrate --grid 2x8x8 --synthetic-layers 2 --synthetic-steps 1 --heads 2 --head-dim 32 --block-q 32 --block-kv 16 "
      "--similarity-threshold -1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const auto& entry : j["layers"]) {
    EXPECT_LE(entry["error"].get<double>(), 0.05);
    EXPECT_TRUE(entry["heldout_error"].is_number());
    EXPECT_EQ(entry["per_head"].size(), 2u);
  }
  const CommandOutput neither = run_tessel("calibrate --method topk");
  EXPECT_NE(neither.status, 0);
  EXPECT_NE(neither.out.find("--layer / --grid"), std::string::npos) << neither.out;
}

TEST(MaskCli, WritesPngsForStaticAndDynamicPatterns) {
  const fs::path dir = test_dir();
  for (const std::string args : {"--pattern radial --grid 6x8x12", "--pattern spatial_aware --radius 1 --grid 2x16x16 --ordering z_curve",
                                 "--pattern arrow --inner local --local-window 2 --text-tokens 40 --grid 4x8x8",
                                 "--pattern composite --children radial,local --op intersection --grid 6x8x8",
                                 "--pattern dynamic_topk --topk 0.3 --grid 3x8x8 --heads 2 --head-dim 32 --block-q 32 --block-kv 32",
                                 "--pattern threshold --grid 3x8x8 --heads 2 --head-dim 32 --block-q 32 --block-kv 32 --head 1"}) {
    const fs::path png = dir / "mask.png";
    fs::remove(png);
    const CommandOutput r = run_tessel("mask " + args + " --png '" + png.string() + "'");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("density"), std::string::npos) << r.out;
    ASSERT_TRUE(fs::exists(png)) << args;
    EXPECT_GT(fs::file_size(png), 60u);
  }
  const CommandOutput bad = run_tessel("mask --pattern radial --grid 3x0x4 --png '" + (dir / "x.png").string() + "'");
  EXPECT_NE(bad.status, 0);
}

TEST(MaskCli, BadNamesAndConfigValuesNameTheFlagOrKey) {
  const std::string png = " --png '" + (test_dir() / "x.png").string() + "'";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--pattern stripes --grid 2x8x8", {"--pattern", "'stripes'", "radial"}},
      {"--pattern arrow --inner blob --text-tokens 8 --grid 2x8x8", {"--inner", "'blob'"}},
      {"--pattern composite --children radial,blob --grid 2x8x8", {"--children", "'blob'"}},
      {"--pattern composite --children radial,local --op xor --grid 2x8x8", {"--op", "union, intersection", "'xor'"}},
      {"--pattern spatial_aware --radius 1 --ordering snake --grid 2x8x8", {"--ordering", "z_curve", "'snake'"}},
      {"--pattern radial --decay 0 --grid 2x8x8", {"--decay", "(0, 16]"}},
      {"--pattern radial --grid 2x8x8 --sparse-attn-config '{\"selection\": {\"stride\": 0}}'", {"sparse_attn.selection.stride", "[1, 64]"}},
  };
  for (const auto& [args, fragments] : cases) {
    const CommandOutput r = run_tessel("mask " + args + png);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    for (const std::string& fragment : fragments) EXPECT_NE(r.out.find(fragment), std::string::npos) << fragment << " in " << r.out;
  }
}

}  // namespace
}  // namespace tessel
