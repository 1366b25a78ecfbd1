// The tiny random Wan configs and inputs the CUDA forward's GPU tests share (wan_cuda_gpu_test.cc,
// wan_fp8_gpu_test.cc): odd latent patch grids, batch 1 and 2, one timestep per entry, per latent
// frame or per token, with and without the affine cross-attention norm, and Wan 2.1 I2V's and
// FLF2V's image branch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"

namespace tessel::wan_test {

// How many timesteps a batch entry has: one, one per latent frame, or one per token.
enum class Timesteps { kPerEntry, kPerFrame, kPerToken };

struct Case {
  std::string name;
  WanConfig config;
  int64_t batch, frames, height, width, text_len;
  Timesteps timesteps;
  int64_t image_len = 0;  // CLIP tokens per batch entry for a config with an image branch
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

// Wan 2.1 I2V's layout on a tiny config: 2 x 16 + 4 input channels, the image branch over CLIP
// features of width image_dim; pos_embed_seq_len > 0 makes it FLF2V's.
inline WanConfig with_image_branch(WanConfig c, int64_t image_dim, int64_t pos_embed_seq_len) {
  c.in_channels = 2 * c.out_channels + 4;
  c.image_dim = image_dim;
  c.added_kv_proj_dim = c.inner_dim();
  c.pos_embed_seq_len = pos_embed_seq_len;
  return c;
}

inline std::vector<Case> cases() {
  return {
      {"2x64_batch2_grid3x5x3", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 10, 6, 7, Timesteps::kPerEntry},
      {"1x128_batch1_grid5x3x7_no_cross_norm", tiny_config(1, 128, 192, 40, 3, false), 1, 5, 6, 14, 13, Timesteps::kPerEntry},
      {"2x64_batch2_per_token_timesteps", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 10, 6, 7, Timesteps::kPerToken},
      {"2x64_batch2_per_frame_timesteps", tiny_config(2, 64, 256, 48, 2, true), 2, 3, 10, 6, 7, Timesteps::kPerFrame},
      {"i2v_2x64_batch2_grid3x5x3_9_image_tokens", with_image_branch(tiny_config(2, 64, 256, 48, 2, true), 40, 0), 2, 3, 10, 6, 7,
       Timesteps::kPerEntry, 9},
      {"i2v_1x128_batch1_grid5x3x7_no_cross_norm_1_image_token", with_image_branch(tiny_config(1, 128, 192, 40, 3, false), 24, 0), 1,
       5, 6, 14, 13, Timesteps::kPerEntry, 1},
      {"flf2v_2x64_batch2_grid2x7x5_2x7_image_tokens", with_image_branch(tiny_config(2, 64, 256, 48, 2, true), 56, 14), 2, 2, 14, 10,
       5, Timesteps::kPerEntry, 14},
  };
}

struct Inputs {
  Tensor latents, timestep, text, image;  // image: undefined without an image branch
  Inputs(const Case& c, uint64_t seed) {
    const WanConfig& config = c.config;
    latents = Tensor::empty({c.batch, config.in_channels, c.frames, c.height, c.width}, DType::kF32);
    text = Tensor::empty({c.batch, c.text_len, config.text_dim}, DType::kF32);
    fill_normal(latents.view(), seed + 1);
    fill_normal(text.view(), seed + 2);
    if (config.has_image_branch()) {
      image = Tensor::empty({c.batch, c.image_len, config.image_dim}, DType::kF32);
      fill_normal(image.view(), seed + 3);
    }
    const int64_t seq = c.frames / config.patch_size[0] * (c.height / config.patch_size[1]) * (c.width / config.patch_size[2]);
    const int64_t patch_frames = c.frames / config.patch_size[0];
    const int64_t per_entry = c.timesteps == Timesteps::kPerToken ? seq : c.timesteps == Timesteps::kPerFrame ? patch_frames : 1;
    timestep = per_entry > 1 ? Tensor::empty({c.batch, per_entry}, DType::kF32) : Tensor::empty({c.batch}, DType::kF32);
    // Distinct timesteps per batch entry; per token, the first frame at 0 as Wan 2.2 conditions it;
    // per frame, the first at 0 and the others apart.
    for (int64_t b = 0; b < c.batch; ++b) {
      const float t = b == 0 ? 999.0f : 250.0f;
      for (int64_t i = 0; i < per_entry; ++i) {
        const int64_t frame = per_entry == seq ? i / (seq / patch_frames) : i;
        const float frame_t = per_entry == patch_frames && per_entry > 1 ? t - 60.0f * static_cast<float>(frame) : t;
        timestep.data_as<float>()[b * per_entry + i] = per_entry > 1 && frame == 0 ? 0.0f : frame_t;
      }
    }
  }
};

// The output shape: out_channels where the input has in_channels.
inline Shape output_shape(const WanConfig& config, const Tensor& latents) {
  Shape shape = latents.shape();
  shape[1] = config.out_channels;
  return shape;
}

}  // namespace tessel::wan_test
