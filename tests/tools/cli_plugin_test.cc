// End to end through the `tessel` binary: a plugin outside the core library is found through
// TESSEL_PLUGIN_PATH, listed by `tessel backends`, selected by --sparse-attn-backend in
// `tessel bench --steps`, and reported per step with its mask's density; the sparse-attention
// environment variables (config, backend and its DIFFUSION_ alias) reach resolution.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// Runs the tessel binary with `args`, the given plugin path and extra `NAME='value'` environment
// assignments; stderr goes to `stderr_path`.
CommandOutput run_tessel(const std::string& plugin_path, const std::string& args, const std::string& environment = "",
                         const std::string& stderr_path = "/dev/null") {
  const std::string command =
      "env -u TESSEL_SPARSE_ATTN_BACKEND -u DIFFUSION_SPARSE_ATTN_BACKEND -u TESSEL_SPARSE_ATTN_CONFIG TESSEL_PLUGIN_PATH='" +
      plugin_path + "' " + environment + " '" + std::string(TESSEL_BINARY_DIR) + "/bin/tessel' " + args + " 2>'" +
      stderr_path + "'";
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

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(CliPlugin, EnvironmentVariablesReachResolution) {
  const std::string window_config = "TESSEL_SPARSE_ATTN_CONFIG='{\"pattern\": {\"type\": \"sliding_window\", "
                                    "\"window_size\": 64}}' ";
  const auto resolved = [&](const std::string& environment, const std::string& flags, const std::string& stderr_path) {
    const CommandOutput r = run_tessel(dir_.string(), "backends --json " + flags, environment, stderr_path);
    EXPECT_EQ(r.status, 0) << r.out;
    return r.status == 0 ? nlohmann::json::parse(r.out)["resolved"] : nlohmann::json();
  };
  const std::string log = (dir_ / "stderr.txt").string();

  // The config variable sets the pattern; the flag's backend is the config's. The resolved config
  // is printed in its nested form.
  const CommandOutput full = run_tessel(dir_.string(), "backends --json --sparse-attn-topk 0.25", window_config, log);
  ASSERT_EQ(full.status, 0) << full.out;
  const nlohmann::json config = nlohmann::json::parse(full.out)["config"];
  EXPECT_EQ(config["pattern"]["type"], "sliding_window");
  EXPECT_EQ(config["pattern"]["window_size"], 64);
  EXPECT_EQ(config["selection"]["topk_ratio"], 0.25);
  nlohmann::json r = resolved(window_config, "--sparse-attn-backend block_sparse", log);
  EXPECT_EQ(r["pattern"], "sliding_window");
  EXPECT_EQ(r["backend"], "block_sparse");
  EXPECT_EQ(r["source"], "config");
  // The DiT plugin proposal's variable name is accepted and beats the config.
  r = resolved(window_config + "DIFFUSION_SPARSE_ATTN_BACKEND=sink_window", "--sparse-attn-backend block_sparse", log);
  EXPECT_EQ(r["backend"], "sink_window");
  EXPECT_EQ(r["source"], "env");
  EXPECT_EQ(read_file(log).find("disagree"), std::string::npos) << read_file(log);
  // Both names, different values: TESSEL_ wins, and a warning says so.
  r = resolved(window_config + "TESSEL_SPARSE_ATTN_BACKEND=block_sparse DIFFUSION_SPARSE_ATTN_BACKEND=sink_window", "", log);
  EXPECT_EQ(r["backend"], "block_sparse");
  EXPECT_EQ(r["source"], "env");
  const std::string warning = read_file(log);
  EXPECT_NE(warning.find("disagree"), std::string::npos) << warning;
  EXPECT_NE(warning.find("DIFFUSION_SPARSE_ATTN_BACKEND='sink_window'"), std::string::npos) << warning;
  EXPECT_NE(warning.find("using TESSEL_SPARSE_ATTN_BACKEND"), std::string::npos) << warning;
  // A bad config in the variable is an error naming the key.
  const CommandOutput bad =
      run_tessel(dir_.string(), "backends", "TESSEL_SPARSE_ATTN_CONFIG='{\"selection\": {\"stride\": 0}}'", log);
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(read_file(log).find("sparse_attn.selection.stride"), std::string::npos) << read_file(log);
}

TEST_F(CliPlugin, BadChoicesFailWithAnError) {
  // Exit status 2: a tessel::Error reported by the CLI (not a crash, not a parse error).
  EXPECT_EQ(run_tessel(dir_.string(), "bench --steps 2 --seq 64 --sparse-attn-backend nope").status, 2);
  EXPECT_EQ(run_tessel(dir_.string(), "bench --steps 2 --seq 64 --sparse-attn-topk 7").status, 2);
  EXPECT_EQ(run_tessel(dir_.string(), "backends --sparse-attn-backend /no/such/lib.so").status, 2);
  EXPECT_EQ(run_tessel(dir_.string(), "bench --seq 64 --sparse-attn-backend sink_window").status, 2);  // no --steps
}

}  // namespace
}  // namespace tessel
