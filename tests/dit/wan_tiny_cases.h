// The tiny random Wan configs and inputs the CUDA forward's GPU tests share (wan_cuda_gpu_test.cc,
// wan_fp8_gpu_test.cc): odd latent patch grids, batch 1 and 2, per-batch and per-token timesteps,
// with and without the affine cross-attention norm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"

namespace tessel::wan_test {

struct Case {
  std::string name;
  WanConfig config;
  int64_t batch, frames, height, width, text_len;
  bool per_token_timestep;
};

inline WanConfig tiny_config(int64_t heads, int64_t head_dim, int64_t ffn_dim, int64_t text_dim, int64_t layers, bool cross_attn_norm) {
  WanConfig c;
  c.num_attention_heads = heads;
  c.attention_head_dim = head_dim;
  c.ffn_dim = ffn_dim;
  c.text_dim = text_dim;
  c.freq_dim = 32;
  c.num_layers = layers;
  c.cross_attn_norm = cross_attn_norm;
  c.rope_max_seq_len = 64;
  return c;
}

inline std::vector<Case> cases() {
  return {
      {"2x64_batch2_grid3x5x3", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 10, 6, 7, false},
      {"1x128_batch1_grid5x3x7_no_cross_norm", tiny_config(1, 128, 192, 40, 3, false), 1, 5, 6, 14, 13, false},
      {"2x64_batch2_per_token_timesteps", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 10, 6, 7, true},
  };
}

struct Inputs {
  Tensor latents, timestep, text;
  Inputs(const Case& c, uint64_t seed) {
    const WanConfig& config = c.config;
    latents = Tensor::empty({c.batch, config.in_channels, c.frames, c.height, c.width}, DType::kF32);
    text = Tensor::empty({c.batch, c.text_len, config.text_dim}, DType::kF32);
    fill_normal(latents.view(), seed + 1);
    fill_normal(text.view(), seed + 2);
    const int64_t seq = c.frames / config.patch_size[0] * (c.height / config.patch_size[1]) * (c.width / config.patch_size[2]);
    timestep = c.per_token_timestep ? Tensor::empty({c.batch, seq}, DType::kF32) : Tensor::empty({c.batch}, DType::kF32);
    // Distinct timesteps per batch entry; per token, the first frame at 0 as Wan 2.2 conditions it.
    for (int64_t b = 0; b < c.batch; ++b) {
      const float t = b == 0 ? 999.0f : 250.0f;
      if (!c.per_token_timestep) {
        timestep.data_as<float>()[b] = t;
        continue;
      }
      const int64_t first_frame = seq / (c.frames / c.config.patch_size[0]);
      for (int64_t s = 0; s < seq; ++s) timestep.data_as<float>()[b * seq + s] = s < first_frame ? 0.0f : t;
    }
  }
};

}  // namespace tessel::wan_test
