#include "tessel/diffusion/wan_text_encoder.h"

#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/diffusion/wan_pipeline.h"

namespace tessel {

WanTextEncoder WanTextEncoder::load(const std::string& model_directory, Device device) {
  const std::filesystem::path root(model_directory);
  for (const char* component : {"tokenizer", "text_encoder"})
    if (!std::filesystem::is_directory(root / component))
      fail_argument("model directory", detail::concat("a directory with ", component, "/"), quoted_excerpt(model_directory));
  return WanTextEncoder(UMT5Tokenizer::load((root / "tokenizer").string()),
                        UMT5Encoder::load((root / "text_encoder").string(), device));
}

WanTextEncoder::WanTextEncoder(UMT5Tokenizer tokenizer, UMT5Encoder encoder)
    : tokenizer_(std::move(tokenizer)), encoder_(std::move(encoder)) {
  if (tokenizer_.vocab_size() > encoder_.config().vocab_size)
    fail_argument("tokenizer", detail::concat("at most the text encoder's ", encoder_.config().vocab_size, " token ids"),
                  tokenizer_.vocab_size());
}

Tensor WanTextEncoder::encode(const ExecContext& ctx, const std::vector<std::string>& prompts, int64_t max_length) const {
  const TokenizedPrompts tokens = tokenizer_.tokenize(prompts, max_length);
  return wan_prompt_embeddings(ctx, encoder_, tokens.input_ids.view(), tokens.attention_mask.view());
}

}  // namespace tessel
