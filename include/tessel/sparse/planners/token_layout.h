// Where each token of an attention sequence sits: an optional run of text tokens (MMDiT joint
// attention) before or after a latent video grid of frames × height × width patches stored in
// raster order (frame-major, then row, then column). Static planners read geometry from here.
#pragma once

#include <cstdint>
#include <string>

namespace tessel {

struct TokenGrid {
  int64_t frames = 1;
  int64_t height = 1;
  int64_t width = 1;

  int64_t tokens_per_frame() const { return height * width; }
  int64_t numel() const { return frames * height * width; }
  bool operator==(const TokenGrid&) const = default;
};

struct TokenLayout {
  TokenGrid grid;
  int64_t text_tokens = 0;
  bool text_first = true;  // [text, image] as MMDiT/SD3 concatenate; false = [image, text]

  int64_t seq_len() const { return grid.numel() + text_tokens; }
  // First sequence position of the image tokens and of the text tokens.
  int64_t image_offset() const { return text_first ? text_tokens : 0; }
  int64_t text_offset() const { return text_first ? 0 : grid.numel(); }
  bool operator==(const TokenLayout&) const = default;
};

// Parses "FxHxW" (e.g. "21x30x52") or "HxW" (one frame). Throws Error naming `argument`.
TokenGrid parse_token_grid(const std::string& text, const std::string& argument = "grid");
// Throws Error unless every extent is >= 1.
void validate_token_layout(const TokenLayout& layout, const std::string& argument = "layout");

}  // namespace tessel
