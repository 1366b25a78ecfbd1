// Prompt text -> the text embeddings Wan's transformer reads, as diffusers' WanPipeline makes them:
// the UMT5 tokenizer (cleaning, max_length 512, EOS, padding) and the UMT5 encoder, with every
// position past a prompt's tokens set to zero.
#pragma once

#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/umt5_encoder.h"
#include "tessel/diffusion/umt5_tokenizer.h"

namespace tessel {

class WanTextEncoder {
 public:
  // Reads a diffusers model directory's tokenizer/ and text_encoder/. Throws Error naming a missing
  // component, or a tokenizer whose ids the encoder's vocabulary does not cover.
  // The encoder runs on `device` (UMT5Encoder::load); tokens and embeddings stay host tensors.
  static WanTextEncoder load(const std::string& model_directory, Device device = Device::cpu());
  WanTextEncoder(UMT5Tokenizer tokenizer, UMT5Encoder encoder);

  // (prompts, max_length, d_model) fp32 CPU. Throws Error naming a bad prompt ("prompts[i]").
  Tensor encode(const ExecContext& ctx, const std::vector<std::string>& prompts,
                int64_t max_length = kWanMaxSequenceLength) const;

  const UMT5Tokenizer& tokenizer() const { return tokenizer_; }
  const UMT5Encoder& encoder() const { return encoder_; }

 private:
  UMT5Tokenizer tokenizer_;
  UMT5Encoder encoder_;
};

}  // namespace tessel
