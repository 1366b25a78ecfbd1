// A diffusers-layout Wan text-to-video model directory with tiny sizes and seeded random weights, so
// the whole generation path (tokenizer, text encoder, transformer, scheduler, VAE) runs in a fraction of a
// second on a fresh machine without downloading anything. The weights are random: what it
// generates is noise-like, not a picture of the prompt.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_config.h"

namespace tessel {

// The sizes write_tiny_wan_model uses: a 2-layer transformer of 2 heads of 16 and a 2-layer UMT5
// encoder of width 32 (the transformer's text_dim); the encoder's vocab_size is the tokenizer's.
WanConfig tiny_wan_transformer_config();
UMT5Config tiny_umt5_config(int64_t vocab_size);
// A Wan 2.1-layout VAE (three upsampling stages, two temporal) of base width 4, one residual block
// per stage, the transformer's 16 latent channels and Wan 2.1's latent statistics.
WanVaeConfig tiny_wan_vae_config();

// Writes into `directory` (created when missing; files of the same names are replaced):
//   model_index.json                 WanPipeline with its components
//   scheduler/scheduler_config.json  Wan 2.1's UniPC flow-matching configuration
//   transformer/config.json, diffusion_pytorch_model.safetensors (fp32)
//   text_encoder/config.json, model.safetensors (fp32, transformers' UMT5EncoderModel names)
//   vae/config.json, diffusion_pytorch_model.safetensors (fp32, AutoencoderKLWan)
//   tokenizer/spiece.model (a unigram sentencepiece model trained here on a fixed synthetic
//       corpus, with T5's pad 0, EOS 1, unknown 2), tokenizer_config.json, special_tokens_map.json
// The same seed gives byte-identical files. Throws Error naming the path it cannot write.
void write_tiny_wan_model(const std::string& directory, uint64_t seed = 0);

// Seeded random fp32 CPU weights for `specs` at the scales the model directory gets: norm weights
// near 1, matrices with unit-variance rows over their fan-in, biases and the rest small. For
// benchmarks and tests of any size (the values do not change the time).
std::map<std::string, Tensor> random_model_weights(const std::vector<WeightSpec>& specs, uint64_t seed);

}  // namespace tessel
