// `tessel dit-bench` end to end: its help names every flag, it runs the committed Wan fixture
// checkpoint dense and through a sparse backend, and bad shapes and option mixes are clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "run_tessel.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

TesselRun dit_bench(const std::string& args) {
  const fs::path log = fs::path(::testing::TempDir()) / ("tessel_dit_bench_" + std::to_string(::getpid()) + ".txt");
  return run_tessel_binary("dit-bench " + args, log);
}

// The fixture checkpoint at 9 frames of 32 x 32 pixels: a 3 x 4 x 4 latent, 12 tokens.
const std::string kFixtureRun = "--from-dir '" + std::string(TESSEL_SOURCE_DIR) +
                                "/tests/fixtures/wan/checkpoint' --frames 9 --height 32 --width 32 --text-tokens 7 --threads 1 --steps 2 --json";

TEST(DitBenchCli, HelpNamesEveryFlag) {
  const TesselRun run = dit_bench("--help");
  EXPECT_EQ(run.status, 0) << run.out;
  for (const char* flag : {"--model", "--from-dir", "--frames", "--height", "--width", "--batch", "--text-tokens", "--image-tokens", "--layers", "--steps",
                           "--warmup", "--threads", "--seed", "--json", "--compare-dense", "--attention-dtype", "--attention-kernel-variant", "--sparse-attn-layers", "--sparse-attn-backend", "--sparse-attn-topk",
                           "--sparse-attn-schedule", "--sparse-attn-pattern", "--sparse-attn-config"})
    EXPECT_NE(run.out.find(flag), std::string::npos) << flag << " missing from:\n" << run.out;
}

// A checkpoint with Wan 2.1 I2V's image branch (36 input channels) runs on random CLIP features of
// --image-tokens tokens; FLF2V's takes its position table's 10 whatever the flag says.
TEST(DitBenchCli, RunsImageBranchCheckpointsOnRandomClipFeatures) {
  const std::string fixtures = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/wan_i2v/";
  const std::string size = " --frames 9 --height 32 --width 32 --text-tokens 7 --threads 1 --steps 1 --json --image-tokens 3";
  for (const auto& [variant, tokens] : {std::pair{"i2v", 3}, {"flf2v", 10}}) {
    const TesselRun run = dit_bench("--from-dir '" + fixtures + variant + "'" + size);
    ASSERT_EQ(run.status, 0) << variant << "\n" << run.out;
    const nlohmann::json report = nlohmann::json::parse(run.out);
    EXPECT_EQ(report["image_tokens"], tokens) << variant;
    EXPECT_EQ(report["tokens"], 12) << variant;
  }
  // A text-to-video model has none.
  const TesselRun t2v = dit_bench(kFixtureRun);
  ASSERT_EQ(t2v.status, 0) << t2v.out;
  EXPECT_EQ(nlohmann::json::parse(t2v.out)["image_tokens"], 0);
}

TEST(DitBenchCli, RunsTheFixtureCheckpointDenseAndSparse) {
  const TesselRun dense = dit_bench(kFixtureRun);
  ASSERT_EQ(dense.status, 0) << dense.out;
  const nlohmann::json report = nlohmann::json::parse(dense.out);
  EXPECT_EQ(report["tokens"], 12);
  EXPECT_EQ(report["layers"], 2);
  EXPECT_EQ(report["attention_backend"], "dense");
  EXPECT_GT(report["step_s_median"].get<double>(), 0.0);

  const TesselRun sparse = dit_bench(kFixtureRun + " --sparse-attn-config '{\"backend\": \"sliding_window\", \"pattern\": "
                                                   "{\"type\": \"sliding_window\", \"window_size\": 4}, \"geometry\": {\"block_q\": 4, \"block_kv\": 4}}'");
  ASSERT_EQ(sparse.status, 0) << sparse.out;
  EXPECT_EQ(nlohmann::json::parse(sparse.out)["attention_backend"], "sliding_window");

  // Radial needs the latent grid: dit-bench fills it in; the output moves away from dense.
  const TesselRun radial = dit_bench(kFixtureRun + " --compare-dense --sparse-attn-config '{\"backend\": \"radial\", \"pattern\": "
                                                   "{\"type\": \"radial\"}, \"geometry\": {\"block_q\": 4, \"block_kv\": 4}}'");
  ASSERT_EQ(radial.status, 0) << radial.out;
  const nlohmann::json radial_report = nlohmann::json::parse(radial.out);
  EXPECT_EQ(radial_report["attention_backend"], "radial");
  EXPECT_GE(radial_report["rel_l2_vs_dense"].get<double>(), 0.0);

  // Both blocks set back to dense through the per-block configs: the output is dense attention's.
  const TesselRun per_block = dit_bench(kFixtureRun + " --compare-dense --sparse-attn-backend sliding_window --sparse-attn-config "
                                                      "'{\"pattern\": {\"type\": \"sliding_window\", \"window_size\": 2}, \"geometry\": "
                                                      "{\"block_q\": 2, \"block_kv\": 2}}' --sparse-attn-layers '{\"0\": {\"backend\": \"none\"}, "
                                                      "\"1\": {\"backend\": \"none\"}}'");
  ASSERT_EQ(per_block.status, 0) << per_block.out;
  EXPECT_EQ(nlohmann::json::parse(per_block.out)["rel_l2_vs_dense"].get<double>(), 0.0);
}

TEST(DitBenchCli, BadShapesAndOptionMixesAreClearErrors) {
  const struct {
    std::string args, expected;
  } cases[] = {
      {"--frames 8", "4k + 1"},
      {"--height 20", "--height: expected a multiple of 16"},
      {"--model wan-7b", "--model"},
      {"--model wan-14b --from-dir /tmp", "excludes"},
      {"--from-dir /nonexistent --layers 1", "--layers"},
      {"--compare-dense", "--compare-dense"},
      {"--sparse-attn-layers '{}'", "--sparse-attn-layers"},
      {kFixtureRun + " --sparse-attn-backend dense --sparse-attn-layers '{\"2\": {}}'", "block index in [0, 2)"},
      {kFixtureRun + " --sparse-attn-backend dense --sparse-attn-layers '{\"0\": {\"bogus\": 1}}'", "--sparse-attn-layers[0]"},
  };
  for (const auto& c : cases) {
    const TesselRun run = dit_bench(c.args);
    EXPECT_NE(run.status, 0) << c.args;
    EXPECT_NE(run.out.find(c.expected), std::string::npos) << c.args << " -> " << run.out;
  }
}

}  // namespace
}  // namespace tessel
