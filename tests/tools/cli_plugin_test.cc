// End to end through the `tessel` binary: a plugin outside the core library is found through
// TESSEL_PLUGIN_PATH, listed by `tessel backends`, selected by --sparse-attn-backend in
// `tessel bench --steps`, and reported per step with its mask's density.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "sparse/sparse_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

struct CommandOutput {
  int status = -1;
  std::string out;
};

// Runs the tessel binary with `args` (stderr discarded) and the given plugin path.
CommandOutput run_tessel(const std::string& plugin_path, const std::string& args) {
  const std::string command = "env -u TESSEL_SPARSE_ATTN_BACKEND -u TESSEL_SPARSE_ATTN_CONFIG TESSEL_PLUGIN_PATH='" +
                              plugin_path + "' '" + std::string(TESSEL_BINARY_DIR) + "/bin/tessel' " + args + " 2>/dev/null";
  CommandOutput result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

class CliPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test and process: ctest runs the cases of this file in parallel.
    dir_ = fs::path(::testing::TempDir()) / ("tessel_cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
                                             "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(testing::example_plugin_path(), dir_ / "libmy_sink_window.so");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CliPlugin, BackendsListsThePluginFromThePluginPath) {
  const CommandOutput r = run_tessel(dir_.string(), "backends --json --sparse-attn-pattern sliding_window");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  bool found = false;
  // auto: the highest score (first on ties) among the backends supporting sliding_window on cpu.
  std::string best;
  int best_score = -1;
  for (const auto& backend : j["backends"]) {
    const auto& patterns = backend["patterns"];
    const auto has = [](const nlohmann::json& list, const char* item) {
      return std::find(list.begin(), list.end(), item) != list.end();
    };
    const bool fits = has(patterns, "sliding_window") && has(backend["devices"], "cpu") &&
                      has(backend["module_types"], "dit_self");
    if (fits && backend["score"].get<int>() > best_score) {
      best_score = backend["score"].get<int>();
      best = backend["name"];
    }
  }
  for (const auto& backend : j["backends"]) {
    if (backend["name"] != "sink_window") continue;
    found = true;
    EXPECT_EQ(backend["origin"], (dir_ / "libmy_sink_window.so").string());
    EXPECT_EQ(backend["patterns"], nlohmann::json::array({"sliding_window"}));
    EXPECT_EQ(backend["devices"], nlohmann::json::array({"cpu", "cuda"}));
    EXPECT_EQ(backend["module_types"], nlohmann::json::array({"dit_self", "dit_joint", "llm_prefill"}));
  }
  EXPECT_TRUE(found) << r.out;
  EXPECT_EQ(j["plugin_dirs"][0], dir_.string());
  EXPECT_EQ(j["resolved"]["backend"], best);
  EXPECT_EQ(j["resolved"]["source"], "auto");
}

TEST_F(CliPlugin, BenchStepsRunsTheSelectedPlugin) {
  const CommandOutput r = run_tessel(
      dir_.string(),
      "bench --device cpu --dtype fp32 --heads 2 --head-dim 32 --seq 256 --iters 1 --warmup 0 --steps 3 --layers 2 "
      "--json --sparse-attn-backend sink_window --sparse-attn-pattern sliding_window --sparse-attn-schedule "
      "conservative --sparse-attn-config '{\"window_size\": 40, \"block_size_q\": 64, \"block_size_kv\": 32}'");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["backend"], "sink_window");
  EXPECT_EQ(j["resolution"], "config");
  EXPECT_EQ(j["backend_origin"], (dir_ / "libmy_sink_window.so").string());
  ASSERT_EQ(j["results"].size(), 3u);
  const double mask_density = testing::sink_window_mask(256, 256, 64, 32, 40, 1).density();
  // conservative over 3 steps: progress 0 (dense), 0.5 and 1 (sparse).
  EXPECT_EQ(j["results"][0]["backend"], "dense");
  EXPECT_EQ(j["results"][0]["dense_layers"], 2);
  EXPECT_DOUBLE_EQ(j["results"][0]["density"].get<double>(), 1.0);
  EXPECT_LT(j["results"][0]["rel_err_vs_dense"].get<double>(), 1e-5);
  for (int step = 1; step < 3; ++step) {
    EXPECT_EQ(j["results"][step]["backend"], "sink_window");
    EXPECT_EQ(j["results"][step]["dense_layers"], 0);
    EXPECT_DOUBLE_EQ(j["results"][step]["density"].get<double>(), mask_density);
    EXPECT_GT(j["results"][step]["ms"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["plan_cache"]["misses"], 1);  // one plan for both layers and every step
  EXPECT_EQ(j["plan_cache"]["hits"], 3);
}

TEST_F(CliPlugin, BadChoicesFailWithAnError) {
  // Exit status 2: a tessel::Error reported by the CLI (not a crash, not a parse error).
  EXPECT_EQ(run_tessel(dir_.string(), "bench --steps 2 --seq 64 --sparse-attn-backend nope").status, 2);
  EXPECT_EQ(run_tessel(dir_.string(), "bench --steps 2 --seq 64 --sparse-attn-topk 7").status, 2);
  EXPECT_EQ(run_tessel(dir_.string(), "backends --sparse-attn-backend /no/such/lib.so").status, 2);
}

}  // namespace
}  // namespace tessel
