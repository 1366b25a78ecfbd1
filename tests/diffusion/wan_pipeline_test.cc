// WanPipeline's denoising loop against diffusers' WanPipeline (tests/fixtures/diffusion/
// wan_pipeline.safetensors, written by scripts/make_pipeline_fixture.py on the tiny transformer of
// tests/fixtures/wan/checkpoint): the latents after every step, from the same noise and text
// embeddings, with guidance (one batch-2 call here, two calls in diffusers) and without.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "diffusion/diffusion_test_util.h"

namespace tessel {
namespace {

const std::string kFixtureDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures";

// The fixture's 9 frames of 80 x 48 pixels: latent (1, 16, 3, 10, 6).
WanVideoSize fixture_size() { return WanVideoSize{9, 80, 48}; }

class WanPipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    transformer_ = new WanTransformer(WanTransformer::load(kFixtureDir + "/wan/checkpoint"));
    fixture_ = new SafetensorsFile(SafetensorsFile::open(kFixtureDir + "/diffusion/wan_pipeline.safetensors"));
  }
  static void TearDownTestSuite() {
    delete transformer_;
    delete fixture_;
  }
  static WanTransformer* transformer_;
  static SafetensorsFile* fixture_;

  // Runs the case and checks the latents after each step; returns the worst rel-L2.
  double run_case(const std::string& name, const SchedulerConfig& scheduler_config, int64_t steps, double guidance) {
    auto scheduler = make_scheduler(scheduler_config);
    WanPipeline pipeline(*transformer_, *scheduler);
    const Tensor prompt = fixture_->load("prompt_embeds");
    const Tensor negative = fixture_->load("negative_prompt_embeds");
    const Tensor noise = fixture_->load("noise");
    const Tensor expected = fixture_->load(name + ".latents");
    const Tensor timesteps = fixture_->load(name + ".timesteps");
    EXPECT_EQ(expected.size(0), steps);
    WanGenerationOptions options;
    options.num_inference_steps = steps;
    options.guidance_scale = guidance;
    options.size = fixture_size();
    double worst = 0.0;
    int64_t calls = 0;
    options.on_step = [&](const WanStepProgress& progress) {
      EXPECT_EQ(progress.step, calls + 1);
      EXPECT_EQ(progress.total_steps, steps);
      EXPECT_EQ(progress.timestep, static_cast<double>(timesteps.data_as<float>()[calls]));
      EXPECT_GE(progress.eta_seconds, 0.0);
      const int64_t count = progress.latents.numel();
      const double error = rel_l2(progress.latents.data_as<const float>(),
                                  expected.data_as<const float>() + calls * count, count);
      EXPECT_LE(error, 1e-5) << name << " step " << calls;
      worst = std::max(worst, error);
      ++calls;
    };
    const WanGenerationResult result = pipeline.generate(ExecContext{}, prompt, negative, options, noise);
    EXPECT_EQ(calls, steps);
    EXPECT_EQ(result.steps_done, steps);
    EXPECT_FALSE(result.cancelled);
    std::printf("%s: worst rel-L2 %.3g over %lld steps\n", name.c_str(), worst, static_cast<long long>(steps));
    return worst;
  }
};

WanTransformer* WanPipelineTest::transformer_ = nullptr;
SafetensorsFile* WanPipelineTest::fixture_ = nullptr;

TEST_F(WanPipelineTest, UniPCWithGuidanceMatchesDiffusers) { run_case("unipc_cfg", wan_unipc(), 4, 5.0); }
TEST_F(WanPipelineTest, EulerWithGuidanceMatchesDiffusers) { run_case("euler_cfg", euler_shift3(), 3, 3.5); }
TEST_F(WanPipelineTest, UniPCWithoutGuidanceMatchesDiffusers) { run_case("unipc_nocfg", wan_unipc(), 3, 1.0); }

TEST_F(WanPipelineTest, SameSeedSameLatentsAndCancellationBetweenSteps) {
  auto scheduler = make_scheduler(wan_unipc());
  WanPipeline pipeline(*transformer_, *scheduler);
  const Tensor prompt = fixture_->load("prompt_embeds");
  const Tensor negative = fixture_->load("negative_prompt_embeds");
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.size = fixture_size();
  options.seed = 42;
  const Tensor first = pipeline.generate(ExecContext{}, prompt, negative, options).latents;
  const Tensor again = pipeline.generate(ExecContext{}, prompt, negative, options).latents;
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.nbytes()), 0);
  options.seed = 43;
  const Tensor other = pipeline.generate(ExecContext{}, prompt, negative, options).latents;
  EXPECT_NE(std::memcmp(first.data(), other.data(), first.nbytes()), 0);

  std::atomic<bool> cancel{false};
  options.num_inference_steps = 5;
  options.cancel = &cancel;
  options.on_step = [&](const WanStepProgress& progress) {
    if (progress.step == 2) cancel = true;
  };
  const WanGenerationResult result = pipeline.generate(ExecContext{}, prompt, negative, options);
  EXPECT_TRUE(result.cancelled);
  EXPECT_EQ(result.steps_done, 2);
  EXPECT_EQ(result.latents.shape(), (Shape{1, 16, 3, 10, 6}));
}

// A pipeline made without a scheduler of its own runs generations that bring one (begin's), and
// refuses, naming the scheduler, one that does not.
TEST_F(WanPipelineTest, WithoutItsOwnSchedulerEveryGenerationBringsOne) {
  auto scheduler = make_scheduler(wan_unipc());
  WanPipeline with_own(*transformer_, *scheduler);
  const WanPipeline without_own(*transformer_, nullptr);
  const Tensor prompt = fixture_->load("prompt_embeds");
  WanGenerationOptions options;
  options.num_inference_steps = 2;
  options.guidance_scale = 1.0;
  options.size = fixture_size();
  const WanGenerationResult expected = with_own.generate(ExecContext{}, prompt, {}, options);
  auto state = without_own.begin(ExecContext{}, prompt, {}, options, {}, make_scheduler(wan_unipc()));
  WanDenoiseState* const one[] = {state.get()};
  while (!state->done()) without_own.step(ExecContext{}, one);
  const WanGenerationResult result = without_own.finish(ExecContext{}, *state);
  ASSERT_EQ(result.latents.numel(), expected.latents.numel());
  EXPECT_EQ(std::memcmp(result.latents.data(), expected.latents.data(), expected.latents.nbytes()), 0);
  try {
    without_own.generate(ExecContext{}, prompt, {}, options);
    ADD_FAILURE() << "a generation without a scheduler was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler"), std::string::npos) << e.what();
  }
}

// Step-level batching: states stepped together (one forward for the compatible ones) end where each
// stepped alone ends, within fp32 rounding (the CPU GEMMs split their work by batch size: rel-L2
// about 4e-7; a row given the wrong text, timestep or guidance is off by 1e-1): different seeds, guidance scales (one unguided), step
// counts, prompts, one state joining three steps late and one leaving early, and a cancelled one.
TEST_F(WanPipelineTest, StatesSteppedTogetherEqualEachSteppedAlone) {
  const WanPipeline pipeline(*transformer_, nullptr);
  const Tensor prompt = fixture_->load("prompt_embeds");
  const Tensor negative = fixture_->load("negative_prompt_embeds");
  struct Case {
    uint64_t seed;
    double guidance;
    int64_t steps;
    bool swap_prompts;  // another text: the negative prompt as the prompt
  };
  const Case cases[] = {{1, 5.0, 5, false}, {2, 3.5, 4, true}, {3, 1.0, 6, false}, {4, 5.0, 3, false}};
  const auto options_of = [&](const Case& c) {
    WanGenerationOptions options;
    options.num_inference_steps = c.steps;
    options.guidance_scale = c.guidance;
    options.seed = c.seed;
    options.size = fixture_size();
    return options;
  };
  const auto begin = [&](const Case& c) {
    return pipeline.begin(ExecContext{}, c.swap_prompts ? negative : prompt, c.swap_prompts ? prompt : negative, options_of(c),
                          {}, make_scheduler(wan_unipc()));
  };
  std::vector<Tensor> alone;
  for (const Case& c : cases) {
    auto state = begin(c);
    WanDenoiseState* const one[] = {state.get()};
    while (!state->done()) pipeline.step(ExecContext{}, one);
    alone.push_back(pipeline.finish(ExecContext{}, *state).latents);
  }
  std::vector<std::unique_ptr<WanDenoiseState>> states;
  for (size_t i = 0; i < 3; ++i) states.push_back(begin(cases[i]));
  std::atomic<bool> cancel{false};
  WanGenerationOptions cancelled_options = options_of(cases[0]);
  cancelled_options.cancel = &cancel;
  auto cancelled = pipeline.begin(ExecContext{}, prompt, negative, cancelled_options, {}, make_scheduler(wan_unipc()));
  int round = 0;
  for (bool any = true; any; ++round) {
    if (round == 3) states.push_back(begin(cases[3]));  // joins at a step boundary
    if (round == 2) cancel = true;
    std::vector<WanDenoiseState*> running{cancelled.get()};
    for (auto& state : states)
      if (!state->done()) running.push_back(state.get());
    any = running.size() > 1 || !cancelled->done();
    pipeline.step(ExecContext{}, running);
  }
  EXPECT_TRUE(cancelled->cancelled());
  EXPECT_EQ(cancelled->steps_done(), 2);
  for (size_t i = 0; i < states.size(); ++i) {
    const WanGenerationResult result = pipeline.finish(ExecContext{}, *states[i]);
    EXPECT_EQ(result.steps_done, cases[i].steps) << i;
    ASSERT_EQ(result.latents.nbytes(), alone[i].nbytes());
    const double error = rel_l2(result.latents.data_as<const float>(), alone[i].data_as<const float>(), alone[i].numel());
    std::printf("state %zu: rel-L2 %.3g against alone\n", i, error);
    EXPECT_LE(error, 1e-6) << "state " << i;
  }
  WanDenoiseState* const twice[] = {cancelled.get(), cancelled.get()};
  EXPECT_NO_THROW(pipeline.step(ExecContext{}, twice));  // done states are skipped before the check
  auto fresh = begin(cases[0]);
  WanDenoiseState* const duplicate[] = {fresh.get(), fresh.get()};
  try {
    pipeline.step(ExecContext{}, duplicate);
    ADD_FAILURE() << "a state given twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("each state once"), std::string::npos) << e.what();
  }
}

TEST_F(WanPipelineTest, BadInputsAreErrorsNamingTheArgument) {
  auto scheduler = make_scheduler(wan_unipc());
  WanPipeline pipeline(*transformer_, *scheduler);
  const Tensor prompt = fixture_->load("prompt_embeds");
  const Tensor negative = fixture_->load("negative_prompt_embeds");
  auto expect_error = [&](const WanGenerationOptions& options, const TensorView& positive, const TensorView& negative_view,
                          const TensorView& noise, const std::string& fragment) {
    try {
      pipeline.generate(ExecContext{}, positive, negative_view, options, noise);
      ADD_FAILURE() << "accepted, expected an error about " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  WanGenerationOptions options;
  options.num_inference_steps = 1;
  options.size = fixture_size();
  WanGenerationOptions bad = options;
  bad.size.frames = 10;
  expect_error(bad, prompt, negative, {}, "frames");
  bad = options;
  bad.size.height = 72;
  expect_error(bad, prompt, negative, {}, "height");
  bad = options;
  bad.num_inference_steps = 0;
  expect_error(bad, prompt, negative, {}, "num_inference_steps");
  const Tensor short_negative = Tensor::zeros({1, 5, 24}, DType::kF32);
  expect_error(options, prompt, short_negative, {}, "negative_prompt_embeds");
  expect_error(options, prompt, TensorView{}, {}, "negative_prompt_embeds");
  const Tensor wide_prompt = Tensor::zeros({1, 7, 25}, DType::kF32);
  expect_error(options, wide_prompt, negative, {}, "prompt_embeds");
  const Tensor wrong_noise = Tensor::zeros({1, 16, 3, 10, 8}, DType::kF32);
  expect_error(options, prompt, negative, wrong_noise, "initial_latents");
  // Without guidance the negative embeddings are not needed.
  WanGenerationOptions unguided = options;
  unguided.guidance_scale = 1.0;
  EXPECT_EQ(pipeline.generate(ExecContext{}, prompt, TensorView{}, unguided).steps_done, 1);
}

}  // namespace
}  // namespace tessel
