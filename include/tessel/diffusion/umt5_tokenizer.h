// The UMT5 tokenizer Wan's text encoder reads, through the sentencepiece library: a diffusers model's
// tokenizer/spiece.model, applied as diffusers' WanPipeline applies transformers' tokenizer to a
// prompt (cleaned by wan_prompt_clean, then padding="max_length", truncation, EOS appended,
// attention mask).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

// WanPipeline's max_sequence_length.
constexpr int64_t kWanMaxSequenceLength = 512;

struct TokenizedPrompts {
  Tensor input_ids;       // (prompts, max_length) int32: the tokens, EOS, then the pad id
  Tensor attention_mask;  // (prompts, max_length) int32: 1 for the tokens and the EOS, 0 for padding
  std::vector<int64_t> lengths;  // per prompt: tokens kept, the EOS included
  std::vector<int64_t> tokens_cut;  // per prompt: tokens dropped to fit max_length (0: none)
};

class UMT5Tokenizer {
 public:
  // Reads `directory`/spiece.model (a diffusers model's tokenizer/). Throws Error naming the file
  // when it is missing, too large or not a sentencepiece model with pad and EOS pieces.
  static UMT5Tokenizer load(const std::string& directory);
  // The same from the bytes of a model file; `source` names it in errors.
  static UMT5Tokenizer from_serialized_model(std::string_view model, const std::string& source);

  UMT5Tokenizer(UMT5Tokenizer&&) noexcept;
  UMT5Tokenizer& operator=(UMT5Tokenizer&&) noexcept;
  ~UMT5Tokenizer();

  // The ids of `text` as given (no cleaning, no EOS), as transformers' tokenizer converted from the
  // same model gives them: a run of characters the vocabulary lacks is one unknown token (a model
  // with byte fallback would spell them as bytes; transformers' converted tokenizer does not).
  // Throws Error naming `argument` when `text` is not UTF-8 or longer than kMaxPromptBytes.
  std::vector<int32_t> encode(std::string_view text, std::string_view argument = "prompt") const;

  // Each prompt cleaned (wan_prompt_clean), encoded, cut to max_length - 1 tokens, EOS appended and
  // padded to max_length. A cut prompt is logged as a warning (and counted in tokens_cut). Throws
  // Error naming "prompts[i]" for a bad prompt, or max_length when it is below 1.
  TokenizedPrompts tokenize(const std::vector<std::string>& prompts, int64_t max_length = kWanMaxSequenceLength) const;

  int64_t vocab_size() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;

  static constexpr size_t kMaxPromptBytes = size_t{1} << 20;
  static constexpr uint64_t kMaxModelBytes = uint64_t{64} << 20;

 private:
  struct Impl;
  explicit UMT5Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel
