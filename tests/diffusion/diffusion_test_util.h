// Helpers shared by the diffusion layer's tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/umt5_encoder.h"

namespace tessel {

// sqrt(sum (actual - expected)^2 / sum expected^2), accumulated in double.
inline double rel_l2(const float* actual, const float* expected, int64_t count) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    diff += (static_cast<double>(actual[i]) - expected[i]) * (static_cast<double>(actual[i]) - expected[i]);
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff / norm);
}

// The first `kept` frames of a (1, C, frames, H, W) fp32 CPU tensor (latents or a video).
inline Tensor leading_frames(const Tensor& t, int64_t kept) {
  const int64_t channels = t.size(1), frames = t.size(2), plane = t.size(3) * t.size(4);
  Tensor head = Tensor::empty({1, channels, kept, t.size(3), t.size(4)}, DType::kF32);
  for (int64_t c = 0; c < channels; ++c)
    std::memcpy(head.data_as<float>() + c * kept * plane, t.data_as<const float>() + c * frames * plane,
                static_cast<size_t>(kept * plane) * sizeof(float));
  return head;
}

// The UMT5 fixture directory's config and weights (scripts/make_umt5_fixture.py).
inline std::pair<UMT5Config, std::map<std::string, Tensor>> load_umt5_fixture(const std::string& directory) {
  std::ifstream file(directory + "/config.json");
  std::stringstream text;
  text << file.rdbuf();
  const SafetensorsFile weights_file = SafetensorsFile::open(directory + "/model.safetensors");
  std::map<std::string, Tensor> weights;
  for (const SafetensorsEntry& entry : weights_file.entries()) weights[entry.name] = weights_file.load(entry.name);
  return {parse_umt5_config(text.str()), std::move(weights)};
}

// Wan 2.1's schedulers at flow shift 3: UniPC (its default configuration) and Euler.
inline SchedulerConfig wan_unipc() {
  SchedulerConfig config;
  config.shift = 3.0;
  return config;
}

inline SchedulerConfig euler_shift3() {
  SchedulerConfig config;
  config.kind = SchedulerKind::flow_match_euler;
  config.shift = 3.0;
  return config;
}

}  // namespace tessel
