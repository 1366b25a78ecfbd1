// A diffusers-layout Wan text-to-video or image-to-video model directory with tiny sizes and seeded
// random weights, so the whole generation path (tokenizer, text encoder, CLIP image encoder,
// transformer, scheduler, VAE) runs in a fraction of a second on a fresh machine without
// downloading anything. The weights are random: what it
// generates is noise-like, not a picture of the prompt.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

// The sizes write_tiny_wan_model uses: a 2-layer transformer of 2 heads of 16 and a 2-layer UMT5
// encoder of width 32 (the transformer's text_dim); the encoder's vocab_size is the tokenizer's.
WanConfig tiny_wan_transformer_config();
// The same transformer with heads of 64, the smallest the CUDA attention kernels take (the
// "tiny-cuda" preset: it runs on both devices).
WanConfig tiny_cuda_wan_transformer_config();
UMT5Config tiny_umt5_config(int64_t vocab_size);
// A Wan 2.1-layout VAE (three upsampling stages, two temporal) of base width 4, one residual block
// per stage, the transformer's 16 latent channels and Wan 2.1's latent statistics.
WanVaeConfig tiny_wan_vae_config();
// Wan 2.2 TI2V-5B's layout at tiny sizes: the tiny transformer with 48 latent channels, and a
// residual, patched VAE (Wan 2.2's structure and latent statistics) of widths 2 (encoder) and 4
// (decoder), one residual block per stage.
WanConfig tiny_ti2v_wan_transformer_config();
WanVaeConfig tiny_ti2v_wan_vae_config();
// Wan-AI/Wan2.2-TI2V-5B-Diffusers' transformer: 24 heads of 128 (width 3072), 30 layers, FFN 14336,
// 48 latent channels.
WanConfig wan_ti2v_5b_transformer_config();
// Wan 2.1 I2V's image encoder at tiny sizes: a CLIPVisionModel of width 32 (the tiny transformer's
// inner width), 2 layers of 4 heads, MLP 48, patches of 14 on a 28 x 28 image (5 tokens: the class
// token and 2 x 2 patches), exact gelu.
ClipVisionConfig tiny_clip_vision_config();
// Wan 2.1 I2V's transformer at tiny sizes: the tiny transformer with 2 x 16 + 4 = 36 input channels
// (latents, frame mask, encoded image) and the image branch (image_dim = tiny_clip_vision_config's
// hidden size, added_kv_proj_dim = the inner width); `flf2v` adds FLF2V's learned position table of
// pos_embed_seq_len = 2 x the CLIP tokens (the first and the last frame's).
WanConfig tiny_i2v_wan_transformer_config(bool flf2v = false);
// Wan 2.2 I2V-A14B's experts at tiny sizes: 36 input channels, no image branch (the image arrives
// only through the channels).
WanConfig tiny_i2v_a14b_wan_transformer_config();
// Wan-AI/Wan2.1-I2V-14B-480P-Diffusers' transformer: Wan2.1-T2V-14B's with in_channels 36,
// image_dim 1280 (ViT-H/14's width) and added_kv_proj_dim 5120 (the inner width).
WanConfig wan_i2v_14b_transformer_config();
// Its image_encoder/: open-clip ViT-H/14 as a transformers CLIPVisionModel (hidden 1280, 32 layers
// of 16 heads, intermediate 5120, patch 14, image 224, gelu, layer_norm_eps 1e-5).
ClipVisionConfig wan_clip_vision_config();

// Writes into `directory` (created when missing; files of the same names are replaced):
//   model_index.json                 WanPipeline with its components
//   scheduler/scheduler_config.json  Wan 2.1's UniPC flow-matching configuration
//   transformer/config.json, diffusion_pytorch_model.safetensors (fp32)
//   text_encoder/config.json, model.safetensors (fp32, transformers' UMT5EncoderModel names)
//   vae/config.json, diffusion_pytorch_model.safetensors (fp32, AutoencoderKLWan)
//   tokenizer/spiece.model (a unigram sentencepiece model trained here on a fixed synthetic
//       corpus, with T5's pad 0, EOS 1, unknown 2), tokenizer_config.json, special_tokens_map.json
// kTwoExperts adds Wan 2.2 A14B's layout: transformer_2/ (the low-noise expert, the same config,
// other random weights) and "boundary_ratio" 0.875 in model_index.json. kTi2v is Wan 2.2 TI2V-5B's:
// "expand_timesteps" true, UniPC with flow shift 5 and tiny_ti2v_wan_vae_config (pass
// tiny_ti2v_wan_transformer_config as `transformer`).
// kI2v is Wan 2.1 I2V's (pass tiny_i2v_wan_transformer_config): a WanImageToVideoPipeline with
//   image_encoder/config.json, model.safetensors (fp32, transformers' CLIPVisionModel of
//       tiny_clip_vision_config, clip_vision_weight_specs' names)
//   image_processor/preprocessor_config.json (CLIPImageProcessor: bicubic resize of the shortest
//       edge and center crop to CLIP's image size, CLIP's mean and std)
// kI2vTwoExperts Wan 2.2 I2V-A14B's (pass tiny_i2v_a14b_wan_transformer_config): a
// WanImageToVideoPipeline of two experts, "boundary_ratio" 0.9, UniPC with flow shift 5 (Wan 2.2's
// i2v_A14B sample_shift), image_encoder and image_processor null.
// The same seed gives byte-identical files. Throws Error naming the path it cannot write, or a
// transformer that does not fit the layout (an image branch without kI2v or the other way round).
enum class TinyWanLayout { kOneExpert, kTwoExperts, kTi2v, kI2v, kI2vTwoExperts };
// `transformer` replaces the tiny transformer's sizes (tiny_cuda_wan_transformer_config for CUDA).
void write_tiny_wan_model(const std::string& directory, uint64_t seed = 0, TinyWanLayout layout = TinyWanLayout::kOneExpert,
                          const WanConfig& transformer = tiny_wan_transformer_config());

// "tiny", "tiny-a14b", "tiny-cuda", "tiny-ti2v", "tiny-i2v", "tiny-flf2v", "tiny-i2v-a14b",
// "wan-1.3b", "wan-14b", "wan-ti2v-5b", "wan-i2v-14b": what write_random_wan_model writes.
std::vector<std::string> random_wan_model_presets();

// Writes the directory of `preset`: "tiny" as write_tiny_wan_model, "tiny-a14b" in the two-expert
// layout, "tiny-cuda" with tiny_cuda_wan_transformer_config, "tiny-ti2v" in the kTi2v layout,
// "tiny-i2v" and "tiny-flf2v" in the kI2v layout (tiny_i2v_wan_transformer_config without and with
// FLF2V's position table), "tiny-i2v-a14b" in the kI2vTwoExperts layout;
// "wan-1.3b" and "wan-14b" at the published sizes (Wan2.1-T2V transformer, UMT5-XXL text encoder,
// Wan 2.1 VAE) in the same layout, "wan-ti2v-5b" at Wan2.2-TI2V-5B's (wan_ti2v_5b_transformer_config,
// UMT5-XXL, wan22_vae_config, expand_timesteps, flow shift 5), "wan-i2v-14b" at
// Wan2.1-I2V-14B-480P-Diffusers' (wan_i2v_14b_transformer_config, UMT5-XXL, the Wan 2.1 VAE, the
// CLIP of wan_clip_vision_config in bf16 with its 224 x 224 image_processor, flow shift 3),
// with the tiny tokenizer (the real one is not downloadable; its ids are a subset of UMT5's
// vocabulary), the transformer and the text encoder in bf16 and the VAE in fp32, sharded at 5 GiB
// with an index as save_pretrained does. The big presets are streamed to disk a chunk at a time:
// memory stays near 256 MiB and `threads` (<= 0: every core) draw the numbers. Returns the bytes of
// weights written (0 for the tiny presets). Throws Error naming an unknown preset or a path it cannot write.
uint64_t write_random_wan_model(const std::string& directory, std::string_view preset, uint64_t seed = 0, int threads = 0);

// Seeded random fp32 CPU weights for `specs` at the scales the model directory gets: norm weights
// near 1, matrices with unit-variance rows over their fan-in, biases and the rest small. For
// benchmarks and tests of any size (the values do not change the time).
std::map<std::string, Tensor> random_model_weights(const std::vector<WeightSpec>& specs, uint64_t seed);

}  // namespace tessel
