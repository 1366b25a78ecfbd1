// The host-side pieces both flow predictors (CPU and CUDA) and the pipeline's finish share for
// TI2V's first frame (diffusers' expand_timesteps): the frame put over latent frame 0 of every
// channel, and the per-frame timesteps that give it 0.
#include <gtest/gtest.h>

#include <vector>

#include "tessel/core/tensor.h"
#include "wan_flow_predictor.h"

namespace tessel {
namespace {

TEST(WanFirstFrame, PutOverFrameZeroOfEveryChannelOnly) {
  constexpr int64_t channels = 3, frames = 4, height = 2, width = 5, plane = height * width;
  Tensor first = Tensor::empty({1, channels, 1, height, width}, DType::kF32);
  for (int64_t i = 0; i < first.numel(); ++i) first.data_as<float>()[i] = 1000.0f + static_cast<float>(i);
  std::vector<float> video(static_cast<size_t>(channels * frames * plane));
  for (size_t i = 0; i < video.size(); ++i) video[i] = -static_cast<float>(i);
  const std::vector<float> before = video;
  put_first_frame(first.view(), frames, video.data());
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t f = 0; f < frames; ++f)
      for (int64_t p = 0; p < plane; ++p) {
        const size_t at = static_cast<size_t>((c * frames + f) * plane + p);
        const float expected = f == 0 ? 1000.0f + static_cast<float>(c * plane + p) : before[at];
        EXPECT_EQ(video[at], expected) << "channel " << c << " frame " << f << " pixel " << p;
      }
}

TEST(WanFirstFrame, StepTimestepsAreZeroOnTheFirstFrameOfEveryRow) {
  std::vector<float> timesteps(2 * 7, -1.0f);
  fill_step_timesteps(timesteps.data(), 2, 7, 1, 812.5f);
  const std::vector<float> row = {0.0f, 812.5f, 812.5f, 812.5f, 812.5f, 812.5f, 812.5f};
  EXPECT_EQ(std::vector<float>(timesteps.begin(), timesteps.begin() + 7), row);
  EXPECT_EQ(std::vector<float>(timesteps.begin() + 7, timesteps.end()), row);
  // Without a first frame: one timestep per row, all at t.
  std::vector<float> per_row(2, -1.0f);
  fill_step_timesteps(per_row.data(), 2, 1, 0, 999.0f);
  EXPECT_EQ(per_row, (std::vector<float>{999.0f, 999.0f}));
}

}  // namespace
}  // namespace tessel
