// The budgets of the commands whose memory and work grow with their flags (tools/work_budget.h):
// a run estimated over the host budget, the device or the hour is refused naming the flags that
// asked for it and the way past (--max-memory / --force); a dry run sizes the real workloads (Wan
// 14B at 720p, 81 frames, on a GPU) without computing anything, and admits them; and on the CPU,
// where this machine can measure, each estimate lands within 2x of the run's peak resident memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_tessel.h"
#include "tessel/diffusion/wan_vae.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

fs::path scratch() { return test_scratch_dir("work_budget_"); }

// `tessel init-model --preset tiny` once for the suite, and a Wan 14B directory beside it: the
// 14B transformer's and Wan 2.1 VAE's configs without weights (a dry run reads no weight) and a
// text encoder file of UMT5-XXL's bf16 size (sparse: the estimate reads only its size).
class WorkBudgetCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("work_budget_models_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    const TesselRun init = run_tessel_binary("init-model --preset tiny --out '" + tiny().string() + "'", root_ / "init.log");
    ASSERT_EQ(init.status, 0) << init.out;
    fs::copy(tiny(), wan14b(), fs::copy_options::recursive);
    fs::remove(wan14b() / "transformer" / "diffusion_pytorch_model.safetensors");
    fs::remove(wan14b() / "vae" / "diffusion_pytorch_model.safetensors");
    std::ofstream(wan14b() / "transformer" / "config.json")
        << R"({"_class_name": "WanTransformer3DModel", "attention_head_dim": 128, "cross_attn_norm": true, "eps": 1e-06,
              "ffn_dim": 13824, "freq_dim": 256, "image_dim": null, "in_channels": 16, "num_attention_heads": 40,
              "num_layers": 40, "out_channels": 16, "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads",
              "rope_max_seq_len": 1024, "text_dim": 4096})";
    std::ofstream(wan14b() / "vae" / "config.json") << wan_vae_config_json(WanVaeConfig{});
    fs::resize_file(wan14b() / "text_encoder" / "model.safetensors", 11'361'000'000);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  static fs::path tiny() { return root_ / "tiny"; }
  static fs::path wan14b() { return root_ / "wan14b"; }

 private:
  static inline fs::path root_;
};

struct Row {
  std::string name, args;
  std::vector<std::string> needles;  // the message names each
};

// The GiB the dry run's line gives the device ("..., 40.7 GiB on cuda:0 and ...", or "96.0 MiB on cuda:0").
double device_gib(const std::string& out) {
  std::smatch match;
  if (!std::regex_search(out, match, std::regex(R"(([0-9.]+) (GiB|MiB) on cuda)"))) return -1.0;
  return std::stod(match[1]) / (match[2] == "MiB" ? 1024.0 : 1.0);
}

TEST_F(WorkBudgetCli, RefusalsNameTheFlagsThatAskedAndTheWayPast) {
  const std::string tiny_model = " --model '" + tiny().string() + "' --prompt 'a cat' --out '" + (scratch() / "x.png").string() + "'";
  const std::vector<Row> rows = {
      {"dit-bench over --max-memory", "dit-bench --model wan-1.3b --layers 1 --frames 5 --height 64 --width 64 --max-memory 64M",
       {"--model wan-1.3b --frames 5 --height 64 --width 64 --batch 2 --layers 1", "of host memory", "(--max-memory)", "--force"}},
      {"dit-bench on CUDA past the hour",
       "dit-bench --dry-run --device cuda --model wan-14b --height 720 --width 1280 --steps 1000",
       {"--steps 1000", "over the hour", "--force"}},
      {"dit-bench per rank", "dit-bench --dry-run --device cuda --model wan-14b --height 720 --width 1280 --ulysses 2 --steps 1000",
       {"dit-bench, per rank of 2", "over the hour"}},
      {"sp-bench over --max-memory", "sp-bench --seq 1000000 --heads 64 --max-memory 1G",
       {"--batch 1 --seq 1000000 --heads 64", "(--max-memory)", "--force"}},
      {"sp-bench on CUDA past the hour", "sp-bench --dry-run --device cuda --dtype bf16 --seq 1000000 --heads 8 --head-dim 64 --steps 10000",
       {"--seq 1000000 --heads 8", "--steps 10000", "--force"}},
      {"vae-bench over --max-memory", "vae-bench --device cpu --preset tiny --frames 5 --height 512 --width 512 --max-memory 100M",
       {"--frames 5 --height 512 --width 512", "(--max-memory)", "--force"}},
      {"vae-bench past the hour on the CPU", "vae-bench --dry-run --device cpu --iters 1000",
       {"--frames 81 --height 480 --width 832 --iters 1000 --warmup 1", "over the hour", "--force"}},
      {"vae-bench on CUDA past the hour", "vae-bench --dry-run --device cuda --frames 81 --height 720 --width 1280 --iters 2000",
       {"--iters 2000", "over the hour"}},
      {"vae-bench --encode over --max-memory", "vae-bench --device cpu --encode --preset tiny --frames 9 --height 512 --width 512 --max-memory 64M",
       {"vae-bench --encode needs", "--frames 9 --height 512 --width 512", "(--max-memory)"}},
      {"generate over --max-memory", "generate" + tiny_model + " --size 512x512 --frames 5 --steps 1 --max-memory 50M",
       {"--size 512x512 --frames 5 --steps 1 --num-outputs 1", "(--max-memory)", "--force"}},
      {"generate on the CPU at Wan 14B 480p", "generate --dry-run --model '" + wan14b().string() + "' --prompt 'a cat' --out '" +
                                                  (scratch() / "y.png").string() + "' --size 832x480",
       {"--size 832x480 --frames 81 --steps 50", "--force"}},
      {"--max-memory unreadable", "vae-bench --device cpu --preset tiny --frames 5 --height 64 --width 64 --max-memory 2X",
       {"--max-memory", "K, M, G or T"}},
      {"bench over --max-memory", "bench --device cpu --seq 100000 --heads 8 --max-memory 1G",
       {"--batch 1 --seq 100000 --seq-kv 100000 --heads 8 --head-dim 128", "bench needs", "(--max-memory)", "--force"}},
      {"bench on CUDA past the hour", "bench --dry-run --device cuda --seq 75600 --heads 40 --iters 100000",
       {"--seq 75600", "--iters 100000", "over the hour", "--force"}},
      {"eval past the hour on the CPU", "eval --grid 60x60x60", {"--grid 60x60x60 (216000 tokens) --heads 12", "over the hour", "--force"}},
      {"mask over --max-memory", "mask --pattern radial --grid 21x45x80 --png '" + (scratch() / "m.png").string() +
                                     "' --pixels-per-block 64 --max-memory 64M",
       {"--grid 21x45x80", "--pixels-per-block 64", "mask needs", "(--max-memory)"}},
      {"prefill-bench over --max-memory", "prefill-bench --device cpu --context 1048576 --max-memory 1G",
       {"--context 1048576 --layers 1 --heads 32 --kv-heads 8", "(--max-memory)", "--force"}},
  };
  for (const Row& row : rows) {
    const TesselRun run = run_tessel_binary(row.args, scratch() / "refusal.log");
    EXPECT_NE(run.status, 0) << row.name << ": " << run.out;
    for (const std::string& needle : row.needles) EXPECT_NE(run.out.find(needle), std::string::npos) << row.name << ": " << needle << "\n" << run.out;
  }
}

// Each real workload's estimate alone (--dry-run: nothing computed, no GPU needed) is within the
// budgets and, on the GPU, within an H100's 80 GB (bench at Wan 2.1 14B 480p's 29,700 tokens, prefill-bench
// at its documented contexts) (generate's whole pipeline within an H200's).
TEST_F(WorkBudgetCli, DryRunAdmitsWan14B720pWorkloads) {
  // The dry runs under --ulysses start Open MPI, whose own start-up allocations LeakSanitizer
  // reports at exit; the estimates are plain arithmetic, checked by the unsanitized build.
  if (kBuiltWithMemorySanitizer) GTEST_SKIP() << "a sanitizer build: Open MPI's start-up leaks abort the MPI dry runs";
  const fs::path config = scratch() / "calibrated_40_layers.json";
  {
    nlohmann::json layers = nlohmann::json::array();
    for (int layer = 0; layer < 40; ++layer)
      layers.push_back({{"sparse_attn", {{"pattern", {{"type", "dynamic_topk"}}}, {"selection", {{"topk_ratio", 0.2}}}}}});
    std::ofstream(config) << nlohmann::json{{"metric", "rel_l2"}, {"target", 0.05}, {"shape", {{"heads", 40}, {"head_dim", 128}}},
                                            {"layers", layers}}.dump();
  }
  struct Admitted {
    std::string name, args;
    double device_gib_below;
    double device_gib_above = 1.0;  // prefill-bench's device ring is small by design
  };
  const std::vector<Admitted> rows = {
      {"calibrate", "calibrate --dry-run --device cuda --grid 21x45x80 --synthetic-layers 40 --heads 40 --head-dim 128 "
                    "--synthetic-steps 2 --synthetic-heldout 1", 80.0},
      {"eval --config", "eval --dry-run --config '" + config.string() + "' --device cuda --grid 21x45x80 --synthetic-heldout 2", 80.0},
      {"dit-bench", "dit-bench --dry-run --device cuda --model wan-14b --height 720 --width 1280 --batch 2", 80.0},
      {"dit-bench Ulysses 4 per rank", "dit-bench --dry-run --device cuda --model wan-14b --height 720 --width 1280 --ulysses 4", 80.0},
      {"sp-bench", "sp-bench --dry-run --device cuda --dtype bf16 --seq 75600 --heads 40 --mask dynamic_topk --check", 80.0},
      {"vae-bench", "vae-bench --dry-run --device cuda --frames 81 --height 720 --width 1280", 80.0},
      {"bench", "bench --dry-run --device cuda --seq 29700 --heads 40 --head-dim 128 --fp8", 80.0},
      {"prefill-bench", "prefill-bench --dry-run --device cuda --context 32768,65536,131072", 80.0, 0.05},
      {"generate", "generate --dry-run --device cuda --model '" + wan14b().string() + "' --prompt 'a cat' --size 1280x720 --out '" +
                       (scratch() / "z.png").string() + "'", 141.0},
  };
  for (const Admitted& row : rows) {
    const TesselRun run = run_tessel_binary(row.args, scratch() / "admitted.log");
    EXPECT_EQ(run.status, 0) << row.name << ": " << run.out;
    EXPECT_NE(run.out.find("within the budgets"), std::string::npos) << row.name << ": " << run.out;
    const double gib = device_gib(run.out);
    EXPECT_GT(gib, row.device_gib_above) << row.name << ": " << run.out;
    EXPECT_LT(gib, row.device_gib_below) << row.name << ": " << run.out;
  }
  const TesselRun forced = run_tessel_binary("dit-bench --dry-run --force --device cuda --model wan-14b --steps 5000", scratch() / "forced.log");
  EXPECT_EQ(forced.status, 0) << forced.out;
  EXPECT_NE(forced.out.find("--force: no budget applies"), std::string::npos) << forced.out;
}

// The last line of `out` that parses as a JSON object.
nlohmann::json last_json(const std::string& out) {
  // eval and prefill-bench print indented JSON (prefill-bench an array of one object per context:
  // its last), the others one line.
  const size_t open = out.find_first_of("{[");
  if (open != std::string::npos) {
    const nlohmann::json whole = nlohmann::json::parse(out.substr(open), nullptr, false);
    if (whole.is_object()) return whole;
    if (whole.is_array() && !whole.empty() && whole.back().is_object()) return whole.back();
  }
  nlohmann::json found;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    const nlohmann::json parsed = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (parsed.is_object()) found = parsed;
  }
  return found;
}

// On the CPU each command reports its peak resident memory beside its estimate: within 2x. The
// sizes are chosen so that what each estimate adds up (the VAE's activations; the transformer's
// weights; q, k, v and the outputs) is most of the peak, not the process's own few tens of MB.
// A generation to latents at the same size is that process and little else: what the decode adds
// to the estimate is checked against what it adds to the peak instead.
TEST_F(WorkBudgetCli, CpuEstimatesAreWithinTwiceTheMeasuredPeak) {
  // A sanitizer's shadow memory and redzones are part of the peak, not of what tessel allocates.
  if (kBuiltWithMemorySanitizer) GTEST_SKIP() << "a sanitizer build: measured peaks include the sanitizer's own memory";
  const std::string generate = "generate --model '" + tiny().string() + "' --prompt 'a cat' --size 384x384 --frames 5 --steps 1 --out '";
  struct Measured {
    std::string name, args;
    bool whole = true;    // the estimate is most of the peak
    bool threads = true;  // the command takes --threads (prefill-bench's engine has its own)
  };
  const std::vector<Measured> runs = {
      {"vae-bench decode", "vae-bench --device cpu --preset tiny --frames 5 --height 384 --width 384 --iters 1 --warmup 0 --json"},
      {"vae-bench encode", "vae-bench --device cpu --encode --preset tiny --frames 9 --height 384 --width 384 --iters 1 --warmup 0 --json"},
      {"dit-bench", "dit-bench --model wan-1.3b --layers 2 --frames 5 --height 64 --width 64 --json"},
      {"sp-bench", "sp-bench --seq 4095 --heads 8 --steps 1 --warmup 0 --json"},
      {"bench", "bench --device cpu --dtype fp32 --seq 8192 --heads 8 --head-dim 64 --density 1,0.5 --iters 1 --warmup 0 --json"},
      {"eval", "eval --grid 4x32x32 --heads 16 --head-dim 128 --methods radial --json"},
      {"prefill-bench", "prefill-bench --device cpu --context 16384 --layers 4 --decode-steps 4 --json", true, false},
      {"generate with its VAE decode", generate + (scratch() / "peak.png").string() + "'"},
      {"generate to latents", generate + (scratch() / "peak.safetensors").string() + "'", false},
  };
  std::map<std::string, std::pair<double, double>> measured;  // name -> (peak, estimate)
  for (const Measured& run : runs) {
    const TesselRun result = run_tessel_binary(run.args + (run.threads ? " --threads 2" : ""), scratch() / "peak.log");
    ASSERT_EQ(result.status, 0) << run.name << ": " << result.out;
    const nlohmann::json report = last_json(result.out);
    ASSERT_TRUE(report.contains("peak_host_memory_bytes") && report.contains("estimated_host_memory_bytes")) << run.name << ": " << result.out;
    const double peak = report["peak_host_memory_bytes"].get<double>(), estimate = report["estimated_host_memory_bytes"].get<double>();
    measured[run.name] = {peak, estimate};
    if (!run.whole) continue;
    EXPECT_LE(peak, 2.0 * estimate) << run.name << ": peak " << peak << " estimate " << estimate;
    EXPECT_LE(estimate, 2.0 * peak) << run.name << ": peak " << peak << " estimate " << estimate;
  }
  const auto [decode_peak, decode_estimate] = measured["generate with its VAE decode"];
  const auto [latents_peak, latents_estimate] = measured["generate to latents"];
  const double added_peak = decode_peak - latents_peak, added_estimate = decode_estimate - latents_estimate;
  EXPECT_GT(added_peak, 0.5 * decode_peak) << "the decode is most of a generation's memory at video sizes";
  EXPECT_LE(added_peak, 2.0 * added_estimate) << added_peak << " vs " << added_estimate;
  EXPECT_LE(added_estimate, 2.0 * added_peak) << added_peak << " vs " << added_estimate;
}

}  // namespace
}  // namespace tessel
