// DBCache on the CUDA transformer (bf16) against DBCache on the CPU transformer (fp32), both holding
// the same random weights of a 4-layer tiny CUDA config (those the CUDA model keeps in bf16 rounded to
// bf16 for both) and fed the same inputs: a batch of the two CFG branches over a fixed trajectory
// from noise to a random latent, one forward per step.
//
// What the hook is shown and does, recorded on each device by a wrapper around DBCache: the CUDA
// forward hands it the patch embeddings block 0 got (within bf16 error of the CPU's); each decision
// equals the rule recomputed on the host in double from the device's own hidden states and
// embeddings (the device reduces in another order: only a change within 1e-9 of the threshold could
// decide otherwise); a skipped forward adds exactly the middle blocks' kept residual, bit for bit
// (fp32 adds on both sides); the relative changes agree with the CPU's within bf16 error and so do
// the decisions, unless a CPU change lies within that error of the threshold.
// Also: two identical forwards skip the second, whose output is the first's; the denoising loop on
// CUDA skips what the limits allow and stays within the bf16 error of the CPU loop. Skips without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/diffusion_test_util.h"
#include "tessel/core/allocator.h"
#include "tessel/core/device.h"
#include "tessel/core/random.h"
#include "tessel/diffusion/cache_backend.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_model.h"
#include "tessel/dit/wan_weights.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

constexpr int64_t kLayers = 4;
constexpr int64_t kSteps = 10;
constexpr int64_t kBatch = 2;  // the CFG branches: 0 conditional, 1 unconditional
// Latents (2, 16, 3, 6, 10): a 3 x 3 x 5 patch grid, 45 tokens per branch.
constexpr int64_t kFrames = 3, kHeight = 6, kWidth = 10, kTextLen = 7;

WanConfig four_layer_config() {
  WanConfig c = tiny_cuda_wan_transformer_config();
  c.num_layers = kLayers;
  return c;
}

// Random weights with the tensors the CUDA model keeps in bf16 rounded to bf16: both devices hold
// the same numbers, and what differs is the CUDA forward's arithmetic alone.
std::map<std::string, Tensor> shared_weights(const WanConfig& config) {
  std::map<std::string, Tensor> weights = random_model_weights(wan_weight_specs(config), 13);
  for (auto& [name, tensor] : weights)
    if (wan_cuda_weight_dtype(name) == DType::kBF16) tensor = bf16_rounded(tensor);
  return weights;
}

CacheConfig dbcache_config(int64_t first, int64_t last, double thresh, int64_t warmup) {
  CacheConfig config;
  config.dbcache_first_blocks = first;
  config.dbcache_last_blocks = last;
  config.dbcache_thresh = thresh;
  config.dbcache_warmup_steps = warmup;
  return config;
}

std::vector<float> download(const float* data, size_t count, Device device) {
  std::vector<float> host(count);
  copy_bytes(host.data(), Device::cpu(), data, device, count * sizeof(float));
  return host;
}

// What one forward showed the hook and what it decided.
struct Forward {
  bool run = true;
  std::array<double, 2> change{-1.0, -1.0};  // relative change per row; -1 where the rule compared none
  std::vector<float> embeddings;            // (batch, tokens, dim), host copy
};

// Wraps DBCache's hook on either device: downloads what it is shown, checks each decision against
// the rule recomputed in double (the threshold must lie in (0, 1) and there are no skip limits), and
// that a skip adds the kept middle residual bit for bit and a computed forward leaves `hidden` alone.
class RecordingDBCache final : public WanBlockCache {
 public:
  RecordingDBCache(const CacheConfig& config, const WanConfig& transformer)
      : inner_(make_cache_backend("dbcache", config, transformer)), thresh_(config.dbcache_thresh),
        warmup_(config.dbcache_warmup_steps) {}

  int64_t leading_blocks() const override { return hook().leading_blocks(); }
  int64_t trailing_blocks() const override { return hook().trailing_blocks(); }
  bool handles_device(Device device) const override { return hook().handles_device(device); }

  bool before_blocks(const WanBlockCacheInput& input, float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim), total = static_cast<size_t>(input.batch) * size;
    EXPECT_NE(input.embeddings, nullptr) << "the forward passes no patch embeddings";
    if (input.embeddings == nullptr) return hook().before_blocks(input, hidden);  // DBCache refuses it
    const std::vector<float> before = download(hidden, total, input.device);
    Forward forward;
    forward.embeddings = download(input.embeddings, total, input.device);
    std::vector<std::vector<double>> residuals(static_cast<size_t>(input.batch));
    bool expected_run = false, near_threshold = false;
    for (int64_t b = 0; b < input.batch; ++b) {
      const size_t row = static_cast<size_t>(b);
      for (size_t i = 0; i < size; ++i)
        residuals[row].push_back(static_cast<double>(before[row * size + i] - forward.embeddings[row * size + i]));
      bool reuse = *input.step->step >= warmup_ && !rows_[row].previous.empty();
      if (reuse) {
        double change = 0.0, magnitude = 0.0;
        for (size_t i = 0; i < size; ++i) {
          change += std::abs(rows_[row].previous[i] - residuals[row][i]);
          magnitude += std::abs(rows_[row].previous[i]);
        }
        forward.change[row] = change / magnitude;
        near_threshold = near_threshold || std::abs(forward.change[row] - thresh_) <= 1e-9 * thresh_;
        reuse = forward.change[row] < thresh_;
      }
      expected_run = expected_run || !reuse;
    }
    forward.run = hook().before_blocks(input, hidden);
    if (!near_threshold) EXPECT_EQ(forward.run, expected_run) << "step " << *input.step->step << " on " << input.device.str();
    const std::vector<float> after = download(hidden, total, input.device);
    for (int64_t b = 0; b < input.batch; ++b) {
      const size_t row = static_cast<size_t>(b);
      size_t mismatches = 0;
      if (forward.run) {
        rows_[row].previous = residuals[row];
        for (size_t i = 0; i < size; ++i) mismatches += after[row * size + i] != before[row * size + i];
      } else {
        for (size_t i = 0; i < size; ++i) mismatches += after[row * size + i] != before[row * size + i] + rows_[row].middle[i];
      }
      EXPECT_EQ(mismatches, 0u) << "row " << b << " of step " << *input.step->step << (forward.run ? " (computed)" : " (skipped)")
                                << " on " << input.device.str();
    }
    forwards.push_back(std::move(forward));
    return forwards.back().run;
  }

  void after_blocks(const WanBlockCacheInput& input, const float* blocks_input, const float* hidden) override {
    const size_t size = static_cast<size_t>(input.tokens * input.dim), total = static_cast<size_t>(input.batch) * size;
    const std::vector<float> in = download(blocks_input, total, input.device), out = download(hidden, total, input.device);
    for (int64_t b = 0; b < input.batch; ++b) {
      std::vector<float>& middle = rows_[static_cast<size_t>(b)].middle;
      middle.resize(size);
      for (size_t i = 0; i < size; ++i) middle[i] = out[b * size + i] - in[b * size + i];
    }
    hook().after_blocks(input, blocks_input, hidden);
  }

  CacheStats stats() const { return inner_->stats(); }
  std::vector<Forward> forwards;

 private:
  WanBlockCache& hook() const { return *inner_->block_cache(); }

  struct Row {
    std::vector<double> previous;  // R of the last computed forward
    std::vector<float> middle;     // what the middle blocks added in it
  };
  std::unique_ptr<CacheBackend> inner_;
  double thresh_;
  int64_t warmup_;
  std::array<Row, 2> rows_;
};

// The inputs of every step: both rows of the batch take the same latents, (1 - s) x0 + s noise at
// s = 1 - step / kSteps, and timestep 1000 s; row 0 the prompt, row 1 the negative prompt.
struct Trajectory {
  Trajectory() {
    const WanConfig c = four_layer_config();
    const Shape latent_shape{1, c.in_channels, kFrames, kHeight, kWidth};
    noise = Tensor::empty(latent_shape, DType::kF32);
    target = Tensor::empty(latent_shape, DType::kF32);
    text = Tensor::empty({kBatch, kTextLen, c.text_dim}, DType::kF32);
    fill_normal(noise.view(), 21);
    fill_normal(target.view(), 22);
    fill_normal(text.view(), 23);
  }
  Tensor latents(int64_t step) const {
    const double s = 1.0 - static_cast<double>(step) / kSteps;
    Tensor out = Tensor::empty({kBatch, noise.size(1), kFrames, kHeight, kWidth}, DType::kF32);
    const int64_t count = noise.numel();
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t i = 0; i < count; ++i)
        out.data_as<float>()[b * count + i] =
            static_cast<float>((1.0 - s) * target.data_as<float>()[i] + s * noise.data_as<float>()[i]);
    return out;
  }
  Tensor timestep(int64_t step) const {
    Tensor out = Tensor::empty({kBatch}, DType::kF32);
    for (int64_t b = 0; b < kBatch; ++b) out.data_as<float>()[b] = static_cast<float>(1000.0 * (1.0 - static_cast<double>(step) / kSteps));
    return out;
  }

  Tensor noise, target, text;
};

struct Recorded {
  std::vector<Forward> forwards;
  std::vector<Tensor> outputs;  // host copies
  CacheStats stats;
};

// One forward per step of `steps` (each step's inputs from `input_step(step)`) with a recording
// DBCache of `config`.
template <typename InputStep>
Recorded run_forwards(const WanTransformer& model, const CacheConfig& config, const Trajectory& trajectory, int64_t steps,
                 InputStep input_step) {
  const Device device = model.device();
  RecordingDBCache cache(config, model.config());
  Workspace workspace(device);
  ExecContext ctx;
  ctx.device = device;
  ctx.workspace = &workspace;
  ctx.num_threads = 2;
  workspace.reserve(model.workspace_bytes(ctx, kBatch, kFrames, kHeight, kWidth, kTextLen));
  const Tensor text = trajectory.text.to(device);
  Recorded run;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t at = input_step(step);
    const Tensor latents = trajectory.latents(at).to(device), timestep = trajectory.timestep(at).to(device);
    const Tensor out = Tensor::empty(latents.shape(), DType::kF32, device);
    model.forward(ctx, StepInfo::at(step, steps), latents, timestep, text, out, nullptr, &cache);
    run.outputs.push_back(out.to(Device::cpu()));
  }
  run.forwards = std::move(cache.forwards);
  run.stats = cache.stats();
  return run;
}

class DBCacheGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!cuda_available()) return;
    weights_ = new std::map<std::string, Tensor>(shared_weights(four_layer_config()));
  }
  static void TearDownTestSuite() {
    delete weights_;
    weights_ = nullptr;
  }
  static std::map<std::string, Tensor>* weights_;
};

std::map<std::string, Tensor>* DBCacheGpuTest::weights_ = nullptr;

// F1B1, threshold 0.4, warm-up 2 over the trajectory: the CPU run both skips and computes after the
// warm-up (its changes, 0.31 to 0.50, are printed beside the CUDA run's; the nearest lies 0.017 from
// the threshold); the CUDA run takes the same decisions.
TEST_F(DBCacheGpuTest, SkipDecisionsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const WanConfig config = four_layer_config();
  const WanTransformer cpu(config, *weights_);
  const WanTransformer cuda(config, *weights_, {}, Device::cuda());
  const Trajectory trajectory;
  constexpr double kThresh = 0.4;
  const CacheConfig cache_config = dbcache_config(1, 1, kThresh, 2);
  const auto same_step = [](int64_t step) { return step; };
  const Recorded on_cpu = run_forwards(cpu, cache_config, trajectory, kSteps, same_step);
  const Recorded on_gpu = run_forwards(cuda, cache_config, trajectory, kSteps, same_step);
  ASSERT_EQ(on_cpu.forwards.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(on_gpu.forwards.size(), static_cast<size_t>(kSteps));

  std::printf("dbcache F1B1 thresh %.2f, changes (cond uncond) CPU | CUDA:", kThresh);
  for (int64_t step = 0; step < kSteps; ++step) {
    const Forward &c = on_cpu.forwards[step], &g = on_gpu.forwards[step];
    std::printf("\n  step %lld: %.4f %.4f %s | %.4f %.4f %s", static_cast<long long>(step), c.change[0], c.change[1],
                c.run ? "run " : "skip", g.change[0], g.change[1], g.run ? "run " : "skip");
  }
  std::printf("\n  skipped %lld (CPU) and %lld (CUDA) of %lld steps\n", static_cast<long long>(on_cpu.stats.skipped[0]),
              static_cast<long long>(on_gpu.stats.skipped[0]), static_cast<long long>(kSteps));
  // The threshold splits the CPU's changes: the comparison below sees both outcomes.
  EXPECT_GE(on_cpu.stats.skipped[0], 1);
  EXPECT_GE(on_cpu.stats.computed[0], 3);  // the 2 warm-up steps and at least one computed after them

  // The embeddings the CUDA hook got are the patch embeddings (bf16 patches and weights, fp32 sums).
  for (int64_t step = 0; step < kSteps; ++step) {
    const std::vector<float>&c = on_cpu.forwards[step].embeddings, &g = on_gpu.forwards[step].embeddings;
    ASSERT_EQ(g.size(), c.size());
    EXPECT_LE(rel_l2(g.data(), c.data(), static_cast<int64_t>(c.size())), 1e-2) << "step " << step;
  }

  // The same decisions, and changes within bf16 error, up to a decision a CPU change within that
  // error of the threshold explains (the kept residuals differ from there on).
  const auto tolerance = [](double change) { return 0.05 * change + 2e-3; };
  bool diverged = false;
  for (int64_t step = 0; step < kSteps && !diverged; ++step) {
    const Forward &c = on_cpu.forwards[step], &g = on_gpu.forwards[step];
    for (size_t row = 0; row < 2; ++row) {
      if (c.change[row] < 0.0 || g.change[row] < 0.0) continue;  // a row the rule did not compare
      EXPECT_NEAR(g.change[row], c.change[row], tolerance(c.change[row])) << "row " << row << " of step " << step;
    }
    if (g.run == c.run) continue;
    diverged = true;
    bool explained = false;
    for (size_t row = 0; row < 2; ++row)
      explained = explained || (c.change[row] >= 0.0 && std::abs(c.change[row] - kThresh) <= tolerance(c.change[row]));
    EXPECT_TRUE(explained) << "step " << step << ": CUDA " << (g.run ? "ran" : "skipped") << ", CPU " << (c.run ? "ran" : "skipped")
                           << " with changes " << c.change[0] << " and " << c.change[1];
    std::printf("the decisions part at step %lld, a change within bf16 error of the threshold\n", static_cast<long long>(step));
  }
  if (!diverged) {
    EXPECT_EQ(on_gpu.stats.skipped, on_cpu.stats.skipped);
    EXPECT_EQ(on_gpu.stats.computed, on_cpu.stats.computed);
    EXPECT_EQ(on_gpu.stats.blocks_skipped, on_cpu.stats.blocks_skipped);
  }
}

// Two forwards of the same inputs, the second after the warm-up: its first blocks' residual is the
// first's (a change of 0, compared on the device), so it skips, and the kept middle residual
// replays the first forward's middle blocks: both outputs agree within the rounding of
// x + (y - x) in fp32 (and its bf16 copies in the last block).
TEST_F(DBCacheGpuTest, ASkippedForwardReplaysTheMiddleBlocks) {
  SKIP_WITHOUT_GPU();
  const WanConfig config = four_layer_config();
  const WanTransformer cuda(config, *weights_, {}, Device::cuda());
  const Trajectory trajectory;
  const Recorded run = run_forwards(cuda, dbcache_config(1, 1, 0.5, 1), trajectory, 2, [](int64_t) { return int64_t{3}; });
  ASSERT_EQ(run.forwards.size(), 2u);
  EXPECT_TRUE(run.forwards[0].run);
  EXPECT_FALSE(run.forwards[1].run);
  for (size_t row = 0; row < 2; ++row) EXPECT_LE(run.forwards[1].change[row], 1e-4) << "row " << row;
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(run.stats.computed[branch], 1);
    EXPECT_EQ(run.stats.skipped[branch], 1);
    EXPECT_EQ(run.stats.blocks_skipped[branch], kLayers - 2);
  }
  const Tensor &first = run.outputs[0], &second = run.outputs[1];
  const double error = rel_l2(second.data_as<float>(), first.data_as<float>(), first.numel());
  std::printf("dbcache: a skipped forward of the same inputs, output rel-L2 %.3e from the computed one\n", error);
  EXPECT_LE(error, 1e-3);
}

// The denoising loop with the CUDA transformer (the pipeline's device path and its workspace): F2B1,
// a threshold above 1 (reuse without comparing), warm-up 3, at most 2 skips in a row over 12 UniPC
// steps skips steps 3, 4, 6, 7, 9 and 10 as on the CPU, and the latents stay as near the CPU loop's
// with the same cache as the uncached loops are to each other (bf16 arithmetic).
TEST_F(DBCacheGpuTest, DenoisingLoopSkipsWhatTheLimitsAllow) {
  SKIP_WITHOUT_GPU();
  const WanConfig config = four_layer_config();
  const WanTransformer cpu(config, *weights_);
  const WanTransformer cuda(config, *weights_, {}, Device::cuda());
  Tensor prompt = Tensor::empty({1, kTextLen, config.text_dim}, DType::kF32);
  Tensor negative = Tensor::empty({1, kTextLen, config.text_dim}, DType::kF32);
  fill_normal(prompt.view(), 1);
  fill_normal(negative.view(), 2);
  CacheConfig cache_config = dbcache_config(2, 1, 5.0, 3);
  cache_config.dbcache_max_consecutive_cached_steps = 2;
  const auto generate = [&](const WanTransformer& transformer, bool cached) {
    const std::unique_ptr<CacheBackend> cache = cached ? make_cache_backend("dbcache", cache_config, config) : nullptr;
    auto scheduler = make_scheduler(wan_unipc());
    const WanPipeline pipeline(transformer, *scheduler);
    WanGenerationOptions options;
    options.num_inference_steps = 12;
    options.guidance_scale = 5.0;
    options.seed = 7;
    options.size = WanVideoSize{9, 48, 80};  // latents (1, 16, 3, 6, 10)
    options.cache = cache.get();
    ExecContext ctx;
    ctx.device = transformer.device();
    ctx.num_threads = 2;
    return pipeline.generate(ctx, prompt.view(), negative.view(), options);
  };
  const WanGenerationResult cpu_plain = generate(cpu, false), cuda_plain = generate(cuda, false);
  const WanGenerationResult cpu_cached = generate(cpu, true), cuda_cached = generate(cuda, true);
  for (size_t branch = 0; branch < 2; ++branch) {
    EXPECT_EQ(cuda_cached.cache_stats.skipped[branch], 6);
    EXPECT_EQ(cuda_cached.cache_stats.computed[branch], 6);
    EXPECT_EQ(cuda_cached.cache_stats.blocks_skipped[branch], 6);  // one middle block (layer 2 of 0..3)
  }
  EXPECT_EQ(cuda_cached.cache_stats.skipped, cpu_cached.cache_stats.skipped);
  const int64_t count = cpu_plain.latents.numel();
  ASSERT_EQ(cuda_cached.latents.numel(), count);
  const double plain_error = rel_l2(cuda_plain.latents.data_as<float>(), cpu_plain.latents.data_as<float>(), count);
  const double cached_error = rel_l2(cuda_cached.latents.data_as<float>(), cpu_cached.latents.data_as<float>(), count);
  const double cache_effect = rel_l2(cpu_cached.latents.data_as<float>(), cpu_plain.latents.data_as<float>(), count);
  std::printf("dbcache F2B1 on the loop: CUDA vs CPU rel-L2 %.3e cached, %.3e uncached; the cache moves the CPU latents %.3e\n",
              cached_error, plain_error, cache_effect);
  EXPECT_TRUE(std::isfinite(cached_error));
  EXPECT_GT(cache_effect, 0.0);  // the skips changed something
  EXPECT_LE(cached_error, 4.0 * plain_error + 1e-4);
}

}  // namespace
}  // namespace tessel
