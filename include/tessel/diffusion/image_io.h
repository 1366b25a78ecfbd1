// Reading the still images image-to-video starts from: PNG (libpng) and JPEG (libjpeg-turbo), from
// a file or from the bytes a request carried, as one 8-bit RGB frame. The format is told by the
// bytes' signature, not by a file name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tessel/diffusion/video_frames.h"

namespace tessel {

// Images above this many pixels are refused before their pixels are decoded (a hostile header
// may claim billions): 64 Mi, far above a 4K frame.
constexpr uint64_t kMaxImagePixels = uint64_t{1} << 26;

// PNG or JPEG bytes as one RGB frame. Gray and palette PNGs are expanded; an alpha channel is
// dropped without compositing, as PIL's Image.convert("RGB") (what diffusers' load_image does);
// gray JPEGs are expanded and CMYK ones refused. `name` (a path, or a request field) names the
// input in errors: empty, truncated or corrupt data, another format, too many pixels.
VideoFrames decode_image(std::string_view bytes, const std::string& name);
// decode_image of a file (at most 256 MiB), errors naming the path.
VideoFrames read_image(const std::string& path);

}  // namespace tessel
