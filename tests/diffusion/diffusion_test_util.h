// Helpers shared by the diffusion layer's tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/scheduler.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/wan_pipeline.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_weights.h"

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

// A fixture's image, an (H, W, 3) uint8 tensor, as one RGB frame.
inline VideoFrames frames_of_image(const Tensor& pixels) {
  VideoFrames image;
  image.count = 1;
  image.height = pixels.size(0);
  image.width = pixels.size(1);
  image.rgb.assign(static_cast<const uint8_t*>(pixels.data()), static_cast<const uint8_t*>(pixels.data()) + pixels.numel());
  return image;
}

// The PSNR of 8-bit frames against the same bytes expected as a uint8 tensor (infinite when equal).
inline double frames_psnr(const VideoFrames& frames, const Tensor& expected) {
  double squared = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double d = static_cast<double>(frames.rgb[static_cast<size_t>(i)]) - static_cast<const uint8_t*>(expected.data())[i];
    squared += d * d;
  }
  const double mse = squared / static_cast<double>(expected.numel());
  return mse == 0.0 ? INFINITY : 10.0 * std::log10(255.0 * 255.0 / mse);
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

// The values of a CPU view rounded to bf16 and back: what a CUDA model keeps of what it stores in bf16.
inline Tensor bf16_rounded(const TensorView& t) {
  Tensor copy = Tensor::empty(t.shape(), DType::kF32);
  std::memcpy(copy.data(), t.data(), t.nbytes());
  return copy.to(DType::kBF16).to(DType::kF32);
}

// A Wan transformer directory's tensors (wan_weight_specs of its config.json); with
// round_like_cuda, those a CUDA model keeps in bf16 rounded to bf16 (the CUDA-vs-CPU tests'
// yardstick: what bf16 storage alone changes).
inline std::map<std::string, Tensor> wan_transformer_weights(const std::string& transformer_dir, bool round_like_cuda) {
  const SafetensorsFile file = SafetensorsFile::open(transformer_dir + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, Tensor> out;
  for (const WeightSpec& spec : wan_weight_specs(load_wan_config(transformer_dir))) {
    Tensor t = file.load(spec.name);
    out[spec.name] = round_like_cuda && wan_cuda_weight_dtype(spec.name) == DType::kBF16 ? bf16_rounded(t) : std::move(t);
  }
  return out;
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

// Rewrites one fp32 tensor of a safetensors file through `change` (a poisoned weight for the
// non-finite checks); fails the test when the file lacks it or holds it in another dtype.
inline void rewrite_tensor(const std::string& path, const std::string& name, const std::function<void(float*, int64_t)>& change) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors.emplace_back(entry.name, file.load(entry.name));
  bool found = false;
  for (auto& [tensor_name, tensor] : tensors)
    if (tensor_name == name) {
      ASSERT_EQ(tensor.dtype(), DType::kF32);
      change(tensor.data_as<float>(), tensor.numel());
      found = true;
    }
  ASSERT_TRUE(found) << name;
  std::vector<std::pair<std::string, TensorView>> views;
  for (auto& [tensor_name, tensor] : tensors) views.emplace_back(tensor_name, tensor.view());
  write_safetensors(path, views);
}

// A seeded denoising loop (seed 7, 2 CPU threads) of `steps` steps on `transformer`'s device, with
// a pipeline of its own (`vae` to decode, or none) and the scheduler of `scheduler_config`.
inline WanGenerationResult run_wan_loop(const WanTransformer& transformer, const SchedulerConfig& scheduler_config, double guidance,
                                        const WanVideoSize& size, int64_t steps, const TensorView& prompt, const TensorView& negative,
                                        const WanVae* vae = nullptr, WanGenerationOptions options = {}) {
  auto scheduler = make_scheduler(scheduler_config);
  const WanPipeline pipeline(transformer, *scheduler, vae);
  options.num_inference_steps = steps;
  options.guidance_scale = guidance;
  options.seed = 7;
  options.size = size;
  ExecContext ctx;
  ctx.device = transformer.device();
  ctx.num_threads = 2;
  return pipeline.generate(ctx, prompt, negative, options);
}

}  // namespace tessel
