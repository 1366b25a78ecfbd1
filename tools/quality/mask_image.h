// Pictures of block masks: one pixel square per (q block, kv block), black where kept (grey for
// the fraction of heads keeping it when averaging), white where skipped; red lines at the q/kv
// blocks where a latent frame starts and blue lines at the text/image border of the layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/planners/token_layout.h"

namespace tessel {

struct MaskImageOptions {
  int64_t batch = 0;
  int64_t head = -1;          // a mask head, or -1 for the mean over all mask heads
  // Pixel rows per q block (kv blocks get columns in proportion block_kv / block_q, at least 1, so
  // frames look square); 0 = automatic (up to 8, keeping about 2048 pixels per side).
  int64_t pixels_per_block = 0;
  const TokenLayout* layout = nullptr;  // draws frame and text borders when set
};

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;  // row-major RGB
};

// Throws Error on a head or batch out of range, or a layout whose length differs from the mask's.
RgbImage render_mask(const BlockMask& mask, const MaskImageOptions& options);
// Writes an 8-bit RGB PNG (libpng). Throws Error on I/O failure.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace tessel
