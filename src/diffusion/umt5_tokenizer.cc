#include "tessel/diffusion/umt5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/log.h"
#include "tessel/diffusion/prompt_clean.h"
#include "tessel/core/utf8.h"

namespace tessel {

struct UMT5Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

UMT5Tokenizer::UMT5Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UMT5Tokenizer::UMT5Tokenizer(UMT5Tokenizer&&) noexcept = default;
UMT5Tokenizer& UMT5Tokenizer::operator=(UMT5Tokenizer&&) noexcept = default;
UMT5Tokenizer::~UMT5Tokenizer() = default;

UMT5Tokenizer UMT5Tokenizer::load(const std::string& directory) {
  const std::string path = (std::filesystem::path(directory) / "spiece.model").string();
  return from_serialized_model(read_file_bounded(path, kMaxModelBytes, "tokenizer"), path);
}

UMT5Tokenizer UMT5Tokenizer::from_serialized_model(std::string_view model, const std::string& source) {
  auto impl = std::make_unique<Impl>();
  const sentencepiece::util::Status status = impl->processor.LoadFromSerializedProto(model);
  if (!status.ok()) fail_argument(source, "a sentencepiece model", detail::concat("a file it rejects (", status.ToString(), ")"));
  const auto& p = impl->processor;
  if (p.pad_id() < 0 || p.eos_id() < 0 || p.unk_id() < 0)
    fail_argument(source, "a model with pad, EOS and unknown pieces (T5's)",
                  detail::concat("pad id ", p.pad_id(), ", EOS id ", p.eos_id(), ", unknown id ", p.unk_id()));
  return UMT5Tokenizer(std::move(impl));
}

std::vector<int32_t> UMT5Tokenizer::encode(std::string_view text, std::string_view argument) const {
  if (text.size() > kMaxPromptBytes)
    fail_argument(std::string(argument), detail::concat("at most ", kMaxPromptBytes, " bytes"), text.size());
  utf8_decode(text, argument);  // throws on invalid UTF-8 before sentencepiece sees it
  std::vector<int> pieces;
  const sentencepiece::util::Status status = impl_->processor.Encode(text, &pieces);
  if (!status.ok()) throw Error(detail::concat(argument, ": sentencepiece could not encode it (", status.ToString(), ")"));
  std::vector<int32_t> ids;
  ids.reserve(pieces.size());
  for (int id : pieces) {
    if (impl_->processor.IsByte(id)) {
      if (ids.empty() || ids.back() != unk_id()) ids.push_back(unk_id());
      continue;
    }
    ids.push_back(id);
  }
  return ids;
}

TokenizedPrompts UMT5Tokenizer::tokenize(const std::vector<std::string>& prompts, int64_t max_length) const {
  if (max_length < 1) fail_argument("max_length", "at least 1 (room for the EOS token)", max_length);
  const int64_t batch = static_cast<int64_t>(prompts.size());
  TokenizedPrompts out;
  out.input_ids = Tensor::empty({batch, max_length}, DType::kI32);
  out.attention_mask = Tensor::zeros({batch, max_length}, DType::kI32);
  int32_t* ids = out.input_ids.data_as<int32_t>();
  int32_t* mask = out.attention_mask.data_as<int32_t>();
  std::fill(ids, ids + batch * max_length, pad_id());
  for (int64_t row = 0; row < batch; ++row) {
    const std::string argument = detail::concat("prompts[", row, "]");
    std::vector<int32_t> tokens = encode(wan_prompt_clean(prompts[row], argument), argument);
    const int64_t cut = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - (max_length - 1));
    tokens.resize(tokens.size() - static_cast<size_t>(cut));
    tokens.push_back(eos_id());
    std::copy(tokens.begin(), tokens.end(), ids + row * max_length);
    std::fill(mask + row * max_length, mask + row * max_length + tokens.size(), 1);
    out.lengths.push_back(static_cast<int64_t>(tokens.size()));
    out.tokens_cut.push_back(cut);
    if (cut > 0)
      log_warning(detail::concat(argument, ": the last ", cut, " tokens were cut: the text encoder reads at most ",
                                 max_length, " tokens, EOS included"));
  }
  return out;
}

int64_t UMT5Tokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }
int32_t UMT5Tokenizer::eos_id() const { return impl_->processor.eos_id(); }
int32_t UMT5Tokenizer::pad_id() const { return impl_->processor.pad_id(); }
int32_t UMT5Tokenizer::unk_id() const { return impl_->processor.unk_id(); }

}  // namespace tessel
