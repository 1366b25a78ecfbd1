#include "quality/mask_image.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "tessel/core/error.h"

namespace tessel {
namespace {

void set_pixel(RgbImage& img, int64_t x, int64_t y, uint8_t r, uint8_t g, uint8_t b) {
  if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
  uint8_t* p = img.pixels.data() + (y * img.width + x) * 3;
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

}  // namespace

RgbImage render_mask(const BlockMask& mask, const MaskImageOptions& options) {
  const BlockMaskShape& s = mask.shape();
  if (options.batch < 0 || options.batch >= s.mask_batch) fail_argument("mask image batch", detail::concat("in [0, ", s.mask_batch, ")"), options.batch);
  if (options.head < -1 || options.head >= s.mask_heads)
    fail_argument("mask image head", detail::concat("-1 (mean) or in [0, ", s.mask_heads, ")"), options.head);
  if (options.layout && (options.layout->seq_len() != s.seq_q || options.layout->seq_len() != s.seq_kv))
    fail_argument("mask image layout", detail::concat(s.seq_q, " tokens (the mask's)"), options.layout->seq_len());
  const int64_t qbs = s.q_blocks(), kvbs = s.kv_blocks();
  // Pixels are drawn in proportion to tokens, so latent frames come out square: a q block gets
  // ppb_q rows, a kv block ppb_kv columns, ppb_kv / ppb_q = block_kv / block_q where possible.
  int64_t ppb_q = options.pixels_per_block;
  if (ppb_q <= 0) {
    const int64_t tokens_per_pixel = std::max<int64_t>({1, (std::max(s.seq_q, s.seq_kv) + 2047) / 2048, std::min(s.block_q, s.block_kv) / 8});
    ppb_q = std::max<int64_t>(1, s.block_q / tokens_per_pixel);
  }
  const int64_t ppb_kv = std::max<int64_t>(1, (ppb_q * s.block_kv + s.block_q / 2) / s.block_q);
  std::vector<float> kept(static_cast<size_t>(qbs * kvbs), 0.0f);
  const int64_t h0 = options.head < 0 ? 0 : options.head, h1 = options.head < 0 ? s.mask_heads : options.head + 1;
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t r = 0; r < qbs; ++r) {
      const int64_t row = (options.batch * s.mask_heads + h) * qbs + r;
      for (int32_t i = mask.indptr()[row]; i < mask.indptr()[row + 1]; ++i) kept[r * kvbs + mask.indices()[i]] += 1.0f;
    }
  RgbImage img{kvbs * ppb_kv, qbs * ppb_q, {}};
  img.pixels.assign(static_cast<size_t>(img.width * img.height * 3), 255);
  for (int64_t r = 0; r < qbs; ++r)
    for (int64_t c = 0; c < kvbs; ++c) {
      const float frac = kept[r * kvbs + c] / static_cast<float>(h1 - h0);
      const auto level = static_cast<uint8_t>(std::lround(255.0f * (1.0f - frac)));
      for (int64_t y = r * ppb_q; y < (r + 1) * ppb_q; ++y)
        for (int64_t x = c * ppb_kv; x < (c + 1) * ppb_kv; ++x) set_pixel(img, x, y, level, level, level);
    }
  if (options.layout) {
    const TokenLayout& l = *options.layout;
    auto line = [&](int64_t token, uint8_t r, uint8_t g, uint8_t b) {
      const int64_t y = token * ppb_q / s.block_q, x = token * ppb_kv / s.block_kv;
      for (int64_t i = 0; i < img.width; ++i) set_pixel(img, i, y, r, g, b);
      for (int64_t i = 0; i < img.height; ++i) set_pixel(img, x, i, r, g, b);
    };
    for (int64_t f = 1; f < l.grid.frames; ++f) line(l.image_offset() + f * l.grid.tokens_per_frame(), 220, 30, 30);
    if (l.text_tokens > 0) line(l.text_first ? l.text_tokens : l.grid.numel(), 30, 60, 230);
  }
  return img;
}

void write_png(const std::string& path, const RgbImage& image) {
  if (image.width < 1 || image.height < 1 || static_cast<int64_t>(image.pixels.size()) != image.width * image.height * 3)
    fail_argument("png image", "non-empty RGB pixels of width*height*3 bytes", detail::concat(image.width, "x", image.height));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) fail_argument("png path", "a writable file", path);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    throw Error("write_png: libpng could not start");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error("write_png: libpng failed writing " + path);
  }
  png_init_io(png, file.get());
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < image.height; ++y)
    png_write_row(png, const_cast<png_bytep>(image.pixels.data() + y * image.width * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
}

}  // namespace tessel
