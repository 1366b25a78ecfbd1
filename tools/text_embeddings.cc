// --embeddings read and checked (text_embeddings.h).
#include "text_embeddings.h"

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/safetensors.h"

namespace tessel::cli {

TextEmbeddings read_text_embeddings(const std::string& path, int64_t text_dim, bool need_negative) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const auto read = [&](const char* name) {
    const std::string where = "--embeddings " + quoted_excerpt(path, 256) + ": " + name;
    const SafetensorsEntry* entry = file.find(name);
    if (entry == nullptr) fail_argument("--embeddings", detail::concat("a safetensors file with a tensor \"", name, "\""), quoted_excerpt(path, 256));
    if (entry->shape.size() != 3 || entry->shape[0] != 1 || entry->shape[1] < 1 || entry->shape[2] != text_dim)
      fail_argument(where, detail::concat("(1, L >= 1, ", text_dim, " (the transformer's text_dim))"), shape_str(entry->shape));
    Tensor tensor = file.load(name);
    if (tensor.dtype() != DType::kF32) tensor = tensor.to(DType::kF32);
    check_finite(tensor, where);
    return tensor;
  };
  TextEmbeddings embeddings;
  embeddings.prompt = read("prompt_embeds");
  if (need_negative || file.find("negative_prompt_embeds") != nullptr) embeddings.negative = read("negative_prompt_embeds");
  return embeddings;
}

}  // namespace tessel::cli
