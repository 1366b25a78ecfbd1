// Multi-process tests, launched by ctest through mpirun with 2 and 4 ranks: the Wan transformer
// under sequence parallelism (Ulysses, also with its heads in two pipelined groups, Ring, USP) and
// the Wan pipeline under CFG-parallel (alone and with sequence parallelism), dense and sparse (a
// sliding-window block mask, radial, dynamic top-k), on a random 2-block model over an odd
// 5 x 3 x 3 patch grid (45 tokens), against the same model run by one process. Every rank
// computes the one-process result itself, so nothing but the parallel path crosses ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multi_process_test_main.h"
#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_model.h"
#include "tessel/parallel/communicator.h"
#include "tessel/parallel/parallel_config.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

Communicator& world() { return testing::test_world(); }

// Outputs of one process and of several differ by the order of fp32 sums (Ring merges partial
// results by LSE); a wrong shard, position or mask moves them by more than 1e-2.
constexpr double kTolerance = 2e-6;

// 4 heads (Ulysses 2 and 4 divide them) of 16, 2 blocks; the 3-D RoPE splits 16 into 8 + 4 + 4.
WanConfig tiny_config() {
  WanConfig config;
  config.num_attention_heads = 4;
  config.attention_head_dim = 16;
  config.in_channels = config.out_channels = 4;
  config.text_dim = 24;
  config.freq_dim = 32;
  config.ffn_dim = 96;
  config.num_layers = 2;
  config.validate();
  return config;
}

// Latent frames 5, height 6, width 6: the 5 x 3 x 3 patch grid. Video size 17 x 48 x 48 maps to it.
constexpr int64_t kFrames = 5, kHeight = 6, kWidth = 6, kTextTokens = 7;

std::string layout_name(const ParallelConfig& c) {
  return detail::concat("ulysses ", c.sp_ulysses_degree, " x ring ", c.sp_ring_degree, " x cfg ", c.cfg_parallel_size,
                        c.ulysses_head_groups > 1 ? detail::concat(" (", c.ulysses_head_groups, " head groups)") : "");
}

// Every layout of the world: CFG 1 or 2, the rest split between Ulysses (a divisor of the 4 heads)
// and Ring; Ulysses alone also with two head groups (ParallelConfig::ulysses_head_groups).
std::vector<ParallelConfig> layouts() {
  std::vector<ParallelConfig> all;
  for (int cfg = 1; cfg <= 2; ++cfg) {
    if (world().size() % cfg != 0) continue;
    const int sequence = world().size() / cfg;
    for (int ulysses = 1; ulysses <= sequence; ++ulysses) {
      if (sequence % ulysses != 0 || 4 % ulysses != 0) continue;
      ParallelConfig config;
      config.cfg_parallel_size = cfg;
      config.sp_ulysses_degree = ulysses;
      config.sp_ring_degree = sequence / ulysses;
      all.push_back(config);
      // Ulysses alone with its heads pipelined in two groups, where a rank has an even number of them.
      if (ulysses > 1 && config.sp_ring_degree == 1 && (4 / ulysses) % 2 == 0) {
        config.ulysses_head_groups = 2;
        all.push_back(config);
      }
    }
  }
  return all;
}

struct Pattern {
  std::string name;
  std::string json;  // empty: dense attention without a registry
};

// Block sizes 8 x 4 over 45 tokens: partial last blocks, and shard boundaries inside blocks under
// Ulysses (Ring aligns its shards to the blocks).
std::vector<Pattern> patterns() {
  const std::string blocks = R"("geometry": {"block_q": 8, "block_kv": 4})";
  return {{"dense", ""},
          {"sliding_window", R"({"backend": "sliding_window", "pattern": {"type": "sliding_window", "window_size": 8}, )" + blocks + "}"},
          {"radial", R"({"backend": "radial", "pattern": {"type": "radial"}, )" + blocks + "}"},
          // Every block ranked (no self-similarity bypass), half of each row kept.
          {"dynamic_topk", R"({"backend": "dynamic_topk", "pattern": {"type": "dynamic_topk"}, "selection": {"topk_ratio": 0.5},
                              "options": {"similarity_threshold": "-2"}, )" + blocks + "}"}};
}

class Models {
 public:
  Models() { register_builtin_backends(registry_); }

  WanAttentionOptions attention(const Pattern& pattern, const ParallelGroups* groups) {
    WanAttentionOptions options;
    options.parallel = groups;
    if (pattern.json.empty()) return options;
    options.registry = &registry_;
    options.config = parse_sparse_attn_json(pattern.json);
    if (pattern.name == "radial") options.config.geometry.spatial_layout = wan_spatial_layout(tiny_config(), kFrames, kHeight, kWidth);
    return options;
  }
  WanTransformer make(const Pattern& pattern, const ParallelGroups* groups) {
    return WanTransformer::random(tiny_config(), 7, attention(pattern, groups));
  }

 private:
  BackendRegistry registry_{false};
};

double rel_l2(const Tensor& a, const Tensor& b) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    diff += (x - y) * (x - y);
    norm += y * y;
  }
  return std::sqrt(diff / norm);
}

struct StepInputs {
  Tensor latents, timestep, text;
};

// Batch 2 (the two CFG branches of one call); per_token: Wan 2.2's (B, S) timesteps, the first
// frame's 0.
StepInputs step_inputs(const WanConfig& c, bool per_token) {
  StepInputs in{Tensor::empty({2, c.in_channels, kFrames, kHeight, kWidth}, DType::kF32), {},
                Tensor::empty({2, kTextTokens, c.text_dim}, DType::kF32)};
  fill_normal(in.latents, 11);
  fill_normal(in.text, 12);
  const int64_t seq = kFrames * (kHeight / 2) * (kWidth / 2);
  in.timestep = per_token ? Tensor::empty({2, seq}, DType::kF32) : Tensor::empty({2}, DType::kF32);
  for (int64_t i = 0; i < in.timestep.numel(); ++i)
    in.timestep.data_as<float>()[i] = per_token && i % seq < seq / kFrames ? 0.0f : (i < in.timestep.numel() / 2 ? 900.0f : 350.0f);
  return in;
}

Tensor run_step(const WanTransformer& model, const StepInputs& in, const StepInfo& step) {
  Tensor out = Tensor::empty(in.latents.shape(), DType::kF32);
  model.forward(ExecContext{}, step, in.latents, in.timestep, in.text, out);
  return out;
}

TEST(WanSequenceParallel, StepEqualsOneProcessForEveryLayoutAndPattern) {
  Models models;
  const StepInputs in = step_inputs(tiny_config(), false), per_token = step_inputs(tiny_config(), true);
  const StepInfo step = StepInfo::at(1, 4);
  for (const Pattern& pattern : patterns()) {
    const WanTransformer single = models.make(pattern, nullptr);
    const Tensor expected = run_step(single, in, step), expected_per_token = run_step(single, per_token, step);
    for (const ParallelConfig& config : layouts()) {
      const ParallelGroups groups = initialize_parallel_groups(world(), config);
      const WanTransformer parallel = models.make(pattern, &groups);
      const double error = rel_l2(run_step(parallel, in, step), expected);
      const double error_per_token = rel_l2(run_step(parallel, per_token, step), expected_per_token);
      if (world().rank() == 0)
        std::printf("%-14s %-28s rel-L2 %.2e, per-token timesteps %.2e\n", pattern.name.c_str(), layout_name(config).c_str(), error,
                    error_per_token);
      EXPECT_LE(error, kTolerance) << pattern.name << ", " << layout_name(config);
      EXPECT_LE(error_per_token, kTolerance) << pattern.name << ", " << layout_name(config) << ", per-token timesteps";
    }
  }
}

TEST(WanSequenceParallel, SparsePatternsDropBlocksAndMoveTheOutput) {
  // The sparse cases above are not dense ones in disguise: each differs from the dense step.
  Models models;
  const StepInputs in = step_inputs(tiny_config(), false);
  const Tensor dense = run_step(models.make(patterns()[0], nullptr), in, StepInfo::at(1, 4));
  for (size_t i = 1; i < patterns().size(); ++i)
    EXPECT_GT(rel_l2(run_step(models.make(patterns()[i], nullptr), in, StepInfo::at(1, 4)), dense), 1e-3) << patterns()[i].name;
}

// The phase timeline a benchmark attaches (set_phase_timeline): every block's attention marks the
// work before it and its exchanges, on every layout that splits the sequence; detached, nothing is
// marked any more.
TEST(WanSequenceParallel, ThePhaseTimelineSeesEveryBlocksExchanges) {
  Models models;
  const StepInputs in = step_inputs(tiny_config(), false);
  for (const ParallelConfig& config : layouts()) {
    if (config.sp_ulysses_degree * config.sp_ring_degree == 1) continue;  // no sequence split: nothing exchanged
    const ParallelGroups groups = initialize_parallel_groups(world(), config);
    const WanTransformer parallel = models.make(patterns()[0], &groups);
    PhaseTimeline timeline(Device::cpu());
    parallel.set_phase_timeline(&timeline);
    timeline.begin(ExecContext{});
    run_step(parallel, in, StepInfo::at(1, 4));
    std::map<std::string, double> phases;
    for (const PhaseTimeline::Phase& phase : timeline.phases()) phases[phase.name] = phase.device_ms;
    EXPECT_EQ(phases.count("outside attention"), 1u) << layout_name(config);
    EXPECT_EQ(phases.count("attention"), 1u) << layout_name(config);
    const bool exchanged = phases.count(config.sp_ulysses_degree > 1 ? "ulysses all_to_all" : "ring exchange wait") > 0;
    EXPECT_TRUE(exchanged) << layout_name(config);
    parallel.set_phase_timeline(nullptr);
    timeline.begin(ExecContext{});
    run_step(parallel, in, StepInfo::at(1, 4));
    EXPECT_TRUE(timeline.phases().empty()) << layout_name(config);
  }
}

// The pipeline: 2 UniPC steps with guidance 5, on every layout (CFG-parallel with or without
// sequence parallelism), against one process running both branches as batch 2.
TEST(WanPipelineParallel, LatentsEqualOneProcessUnderCfgAndSequenceParallelism) {
  Models models;
  const WanConfig c = tiny_config();
  Tensor prompt = Tensor::empty({1, kTextTokens, c.text_dim}, DType::kF32), negative = Tensor::empty(prompt.shape(), DType::kF32);
  fill_normal(prompt, 21);
  fill_normal(negative, 22);
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.guidance_scale = 5.0;
  options.seed = 3;
  options.size = WanVideoSize{17, 48, 48};
  for (const Pattern& pattern : {patterns()[0], patterns()[3]}) {
    const WanTransformer single = models.make(pattern, nullptr);
    auto scheduler = make_scheduler(SchedulerConfig{});
    const Tensor expected = WanPipeline(single, *scheduler).generate(ExecContext{}, prompt, negative, options).latents;
    for (const ParallelConfig& config : layouts()) {
      const ParallelGroups groups = initialize_parallel_groups(world(), config);
      const WanTransformer parallel = models.make(pattern, &groups);
      WanGenerationOptions parallel_options = options;
      parallel_options.cfg_group = groups.cfg.get();
      const Tensor latents = WanPipeline(parallel, *scheduler).generate(ExecContext{}, prompt, negative, parallel_options).latents;
      const double error = rel_l2(latents, expected);
      if (world().rank() == 0) std::printf("pipeline %-14s %-28s rel-L2 %.2e\n", pattern.name.c_str(), layout_name(config).c_str(), error);
      EXPECT_LE(error, kTolerance) << pattern.name << ", " << layout_name(config);
    }
  }
}

// The generator in a group: only the text root (world rank 0) holds the text encoder; the others
// get its embeddings over the groups, and every layout ends where one process does.
TEST(WanGeneratorParallel, TheTextRootsEmbeddingsReachEveryRank) {
  // Each rank writes its own copy of the same random model (one seed): no file is shared.
  const std::string dir = detail::concat(::testing::TempDir(), "generator_text_root_", getpid());
  write_random_wan_model(dir, "tiny", 17, 1);
  WanRequest request;
  request.prompt = "a red cube";
  request.negative_prompt = "blurry";
  request.frames = 5;
  request.height = 32;
  request.width = 32;
  request.steps = 2;
  request.guidance = 5.0;
  request.seed = 9;
  WanLoadOptions options;
  options.load_vae = false;
  const Tensor expected = WanGenerator::load(ExecContext{}, dir, options).generate(ExecContext{}, request).generation.latents;
  for (const ParallelConfig& config : layouts()) {
    // The tiny preset has 2 heads: at most 2 Ulysses ranks, one head each (no head groups).
    if (config.sp_ulysses_degree > 2 || config.ulysses_head_groups > 1) continue;
    const ParallelGroups groups = initialize_parallel_groups(world(), config);
    WanLoadOptions parallel_options = options;
    parallel_options.parallel = &groups;
    WanGenerator generator = WanGenerator::load(ExecContext{}, dir, parallel_options);
    const Tensor latents = generator.generate(ExecContext{}, request).generation.latents;
    const double error = rel_l2(latents, expected);
    if (world().rank() == 0) std::printf("generator %-28s rel-L2 %.2e\n", layout_name(config).c_str(), error);
    EXPECT_LE(error, kTolerance) << layout_name(config);
  }
  std::filesystem::remove_all(dir);
}

using testing::error_of;

TEST(WanSequenceParallel, BadDegreesGiveClearErrors) {
  Models models;
  // Degrees whose product is not the world size.
  ParallelConfig too_many;
  too_many.sp_ring_degree = world().size() + 1;
  EXPECT_NE(error_of([&] { initialize_parallel_groups(world(), too_many); }).find("sp_ring_degree"), std::string::npos);

  // A Ulysses degree that does not divide the heads: 3 heads of 16 under Ulysses = world size.
  ParallelConfig ulysses;
  ulysses.sp_ulysses_degree = world().size();
  const ParallelGroups groups = initialize_parallel_groups(world(), ulysses);
  WanConfig three_heads = tiny_config();
  three_heads.num_attention_heads = 3;
  const std::string message = error_of([&] { WanTransformer::random(three_heads, 1, models.attention(patterns()[0], &groups)); });
  EXPECT_NE(message.find("sp_ulysses_degree"), std::string::npos) << message;
  EXPECT_NE(message.find("3 attention heads"), std::string::npos) << message;

  // Blocks with different mask block sizes cannot share one sharding of the tokens.
  WanAttentionOptions mixed = models.attention(patterns()[1], &groups);
  mixed.layer_configs[1] = parse_sparse_attn_json(R"({"backend": "sliding_window", "pattern": {"type": "sliding_window",
                                                      "window_size": 8}, "geometry": {"block_q": 16, "block_kv": 4}})");
  const WanTransformer model = WanTransformer::random(tiny_config(), 1, mixed);
  const StepInputs in = step_inputs(tiny_config(), false);
  const std::string blocks = error_of([&] { run_step(model, in, StepInfo::at(1, 4)); });
  EXPECT_NE(blocks.find("block sizes of block 1"), std::string::npos) << blocks;
}

}  // namespace
}  // namespace tessel
