// Pillow's Image.resize of an 8-bit RGB image (height x width x 3, interleaved), byte for byte:
// a separable convolution, horizontal pass first, with the filter widened by the scale factor when
// downscaling (antialiasing), weights in 22-bit fixed point and each pass rounded to 8 bits, as
// Pillow's Resample.c computes it (up to Pillow 12; Pillow 13 runs the vertical pass first when
// the height shrinks much more than the width, python-pillow/Pillow#9549, which moves some such
// resizes by a level or two). BICUBIC is what CLIPImageProcessor resizes with, LANCZOS what
// diffusers' VaeImageProcessor (and so WanImageToVideoPipeline) resizes a PIL image with.
#pragma once

#include <cstdint>
#include <vector>

namespace tessel {

enum class PilFilter {
  kBicubic,  // Keys' cubic, a = -0.5, support 2
  kLanczos,  // sinc(x) sinc(x / 3), support 3
};

// Sizes must be positive (callers validate them).
std::vector<uint8_t> resize_pil(const uint8_t* rgb, int64_t height, int64_t width, int64_t out_height, int64_t out_width,
                                PilFilter filter);

}  // namespace tessel
