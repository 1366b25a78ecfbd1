// --embeddings of generate and serve: text embeddings computed elsewhere, read and checked once
// where they enter, so that a bad file is an error naming the flag, the file and the tensor (not a
// shape error from deep in the pipeline).
#pragma once

#include <cstdint>
#include <string>

#include "tessel/core/tensor.h"

namespace tessel::cli {

struct TextEmbeddings {
  Tensor prompt;    // prompt_embeds, fp32 (1, L, text_dim)
  Tensor negative;  // negative_prompt_embeds when the file has it (or `need_negative`), else undefined
};

// Reads `path` (--embeddings): prompt_embeds, and negative_prompt_embeds when present (required
// with `need_negative`: guidance above 1), each finite, (1, L >= 1, text_dim) in any float dtype.
TextEmbeddings read_text_embeddings(const std::string& path, int64_t text_dim, bool need_negative);

}  // namespace tessel::cli
