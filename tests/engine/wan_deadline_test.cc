// The automatic request deadline of a Wan request (wan_deadline.h): it grows with every part of the
// work the request asks for (steps, frames, size, outputs, guidance's second branch, the batch that
// shares the device), shrinks with a faster device or more threads, counts each step as the
// library's forward arithmetic (wan_forward_flop) at the stated rate, and on the tiny model directory
// is a finite deadline of little more than its floor.
#include "tessel/engine/wan_deadline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/umt5_tokenizer.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/dit/wan_flop.h"

namespace tessel::engine {
namespace {

// Wan 2.1 T2V 1.3B with its VAE and UMT5-XXL, on 4 CPU threads.
WanDeadlineModel wan_1_3b(Device device = Device::cpu()) {
  WanDeadlineModel model;
  model.transformer = wan_preset("wan-1.3b");
  model.vae = WanVaeConfig{};
  model.text_encoder = UMT5Config{};
  model.device = device;
  model.threads = 4;
  return model;
}

GenerationRequest video(int64_t width = 832, int64_t height = 480, int64_t frames = 81, int64_t steps = 50) {
  GenerationRequest request;
  request.kind = OutputKind::kVideo;
  request.width = width;
  request.height = height;
  request.frames = frames;
  request.num_inference_steps = steps;
  request.guidance_scale = 5.0;
  return request;
}

double work(const WanDeadlineModel& model, const GenerationRequest& request) { return wan_request_work_seconds(model, request); }

TEST(WanDeadline, GrowsWithStepsFramesSizeOutputsAndGuidance) {
  const WanDeadlineModel model = wan_1_3b();
  const double base = work(model, video());
  EXPECT_GT(work(model, video(832, 480, 81, 51)), base);
  EXPECT_GT(work(model, video(832, 480, 85)), base);
  EXPECT_GT(work(model, video(848, 480)), base);
  EXPECT_GT(work(model, video(832, 496)), base);
  GenerationRequest two = video();
  two.num_outputs = 2;
  EXPECT_GT(work(model, two), base);
  GenerationRequest unguided = video();
  unguided.guidance_scale = 1.0;
  EXPECT_LT(work(model, unguided), base);
  unguided.guidance_scale_2 = 3.0;  // the low-noise expert's guidance runs both branches too
  EXPECT_DOUBLE_EQ(work(model, unguided), base);
  GenerationRequest reference = video();
  reference.image = std::make_shared<const std::string>("png bytes");
  EXPECT_GT(work(model, reference), base);  // the VAE encodes the image condition
  for (const auto& request : {video(), video(16, 16, 1, 1)}) {
    const double deadline = wan_request_deadline_seconds(model, request);
    EXPECT_TRUE(std::isfinite(deadline));
    EXPECT_GE(deadline, kWanDeadlineFloorSeconds + kWanDeadlineSafetyFactor * work(model, request));
    EXPECT_LT(deadline, kWanDeadlineFloorSeconds + kWanDeadlineSafetyFactor * work(model, request) + 1.0);  // whole seconds, rounded up
  }
}

TEST(WanDeadline, ShrinksWithTheDeviceAndThreadsAndGrowsWithTheBatch) {
  const GenerationRequest request = video();
  WanDeadlineModel model = wan_1_3b();
  const double cpu = work(model, request);
  EXPECT_LT(work(wan_1_3b(Device::cuda()), request), cpu);
  model.threads = 8;
  EXPECT_DOUBLE_EQ(work(model, request), cpu / 2.0);
  model.threads = 4;
  model.sequence_ranks = 2;
  EXPECT_LT(work(model, request), cpu);  // the ranks share each forward's tokens
  model.sequence_ranks = 1;
  const double alone = wan_request_deadline_seconds(model, request);
  model.max_batch = 8;
  EXPECT_GT(wan_request_deadline_seconds(model, request) - kWanDeadlineFloorSeconds,
            7.9 * (alone - kWanDeadlineFloorSeconds));  // up to 8 requests share each step
}

// One more step costs one guided forward of the library's arithmetic at the stated rate; on an
// H100/H200-class GPU the 480p 81-frame, 50-step video is sized near 1000 s of work (a few minutes
// on the real GPU: the rate is a tenth of the real one).
TEST(WanDeadline, AStepIsTheLibrarysForwardArithmeticAtTheStatedRate) {
  const WanDeadlineModel model = wan_1_3b(Device::cuda());
  const double tokens = 21.0 * 30.0 * 52.0;  // 81 frames of 832 x 480: latent 21 x 60 x 104, patches 1 x 2 x 2
  const double forward = wan_forward_flop(model.transformer, 2.0, tokens, static_cast<double>(kWanMaxSequenceLength));
  const double step = work(model, video(832, 480, 81, 2)) - work(model, video(832, 480, 81, 1));
  EXPECT_NEAR(step, forward / kWanDeadlineCudaFlop, 1e-9 * step);
  const double full = work(model, video());
  EXPECT_GT(full, 500.0);
  EXPECT_LT(full, 2000.0);
}

// The tiny model directory, with the text encoder or an embeddings file instead, on one thread.
TEST(WanDeadline, TheTinyModelsDefaultRequestsGetAFiniteDeadlineNearTheFloor) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / ("wan_deadline_model_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  write_tiny_wan_model(dir.string(), 7);
  const WanModelDir model = WanModelDir::open(dir.string());
  WanRunnerConfig runner;
  runner.num_threads = 1;
  const WanDeadlineModel with_text = wan_deadline_model(model, runner, 8);
  ASSERT_TRUE(with_text.text_encoder.has_value());
  ASSERT_TRUE(with_text.vae.has_value());
  EXPECT_EQ(with_text.threads, 1);
  EXPECT_EQ(with_text.max_batch, 8);
  runner.embeddings_file = "embeddings.safetensors";
  const WanDeadlineModel embedded = wan_deadline_model(model, runner, 8);
  EXPECT_FALSE(embedded.text_encoder.has_value());
  const GenerationRequest request = video(32, 32, 5, 2);
  EXPECT_LT(work(embedded, request), work(with_text, request));
  const double deadline = wan_request_deadline_seconds(with_text, request);
  EXPECT_GT(deadline, kWanDeadlineFloorSeconds);
  EXPECT_LT(deadline, kWanDeadlineFloorSeconds + 10.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessel::engine
