#include <png.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tessel/core/error.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

void check_index(const VideoFrames& frames, int64_t index) {
  frames.validate();
  if (index < 0 || index >= frames.count)
    fail_argument("frame index", detail::concat("0 to ", frames.count - 1), index);
}

png_image rgb_image(int64_t width, int64_t height) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  return image;
}

}  // namespace

std::string encode_png(const VideoFrames& frames, int64_t index) {
  check_index(frames, index);
  png_image image = rgb_image(frames.width, frames.height);
  png_alloc_size_t size = 0;
  const png_int_32 stride = static_cast<png_int_32>(frames.width * 3);
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, frames.frame(index), stride, nullptr))
    throw Error(detail::concat("PNG encoding of frame ", index, " failed: ", image.message));
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&image, bytes.data(), &size, 0, frames.frame(index), stride, nullptr))
    throw Error(detail::concat("PNG encoding of frame ", index, " failed: ", image.message));
  bytes.resize(size);
  return bytes;
}

void write_png(const std::string& path, const VideoFrames& frames, int64_t index) {
  const std::string bytes = encode_png(frames, index);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) fail_argument("path", "a writable file", quoted_excerpt(path));
}

std::vector<std::string> write_png_frames(const std::string& path, const VideoFrames& frames) {
  frames.validate();
  if (frames.count == 1) {
    write_png(path, frames, 0);
    return {path};
  }
  const std::filesystem::path base(path);
  const std::string stem = (base.parent_path() / base.stem()).string(), extension = base.extension().string();
  std::vector<std::string> paths;
  for (int64_t i = 0; i < frames.count; ++i) {
    char number[32];
    std::snprintf(number, sizeof(number), "_%05lld", static_cast<long long>(i));
    paths.push_back(stem + number + extension);
    write_png(paths.back(), frames, i);
  }
  return paths;
}

VideoFrames read_png(const std::string& path) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str()))
    fail_argument("path", "a PNG file", detail::concat(quoted_excerpt(path), " (", image.message, ")"));
  // A hostile header may claim billions of pixels: refuse before allocating.
  constexpr uint64_t kMaxPixels = uint64_t{1} << 26;
  if (static_cast<uint64_t>(image.width) * image.height > kMaxPixels) {
    png_image_free(&image);
    fail_argument("path", detail::concat("a PNG of at most ", kMaxPixels, " pixels"),
                  detail::concat(quoted_excerpt(path), " of ", image.width, " x ", image.height));
  }
  image.format = PNG_FORMAT_RGB;
  VideoFrames frames;
  frames.count = 1;
  frames.width = image.width;
  frames.height = image.height;
  frames.rgb.resize(PNG_IMAGE_SIZE(image));
  png_color black{0, 0, 0};
  if (!png_image_finish_read(&image, &black, frames.rgb.data(), 0, nullptr)) {
    png_image_free(&image);
    fail_argument("path", "a readable PNG file", detail::concat(quoted_excerpt(path), " (", image.message, ")"));
  }
  frames.validate();
  return frames;
}

}  // namespace tessel
