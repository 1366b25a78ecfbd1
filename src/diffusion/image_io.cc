// PNG and JPEG decoding (see image_io.h).
#include "tessel/diffusion/image_io.h"

#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <jpeglib.h>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"

namespace tessel {
namespace {

constexpr uint64_t kMaxImageFileBytes = uint64_t{256} << 20;

void refuse_size(const std::string& name, const char* format, uint64_t width, uint64_t height) {
  if (width == 0 || height == 0 || width * height > kMaxImagePixels)
    fail_argument(name, detail::concat("a ", format, " of 1 to ", kMaxImagePixels, " pixels"), detail::concat(width, " x ", height));
}

VideoFrames decode_png(std::string_view bytes, const std::string& name) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    fail_argument(name, "a readable PNG image", image.message);
  const uint64_t width = image.width, height = image.height;
  try {
    refuse_size(name, "PNG", width, height);
  } catch (...) {
    png_image_free(&image);
    throw;
  }
  // RGBA, then the alpha dropped: PIL's convert("RGB") keeps the colours of transparent pixels.
  image.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgba.data(), 0, nullptr)) {
    png_image_free(&image);
    fail_argument(name, "a readable PNG image", image.message);
  }
  VideoFrames frames;
  frames.count = 1;
  frames.width = static_cast<int64_t>(width);
  frames.height = static_cast<int64_t>(height);
  frames.rgb.resize(static_cast<size_t>(width * height * 3));
  for (uint64_t i = 0; i < width * height; ++i) std::memcpy(&frames.rgb[i * 3], &rgba[i * 4], 3);
  return frames;
}

// libjpeg reports errors through a callback that must not return: it jumps back here.
struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr info) {
  auto* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

void ignore_jpeg_message(j_common_ptr) {}

// The decode proper, in a function of its own with no objects that need destructors between the
// setjmp and a longjmp (which would skip them).
bool decode_jpeg_into(std::string_view bytes, const std::string& name, VideoFrames& frames, JpegError& error, std::string& problem) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = on_jpeg_error;
  error.manager.output_message = ignore_jpeg_message;  // warnings (e.g. extraneous bytes) stay quiet
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    problem = error.message;
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&info);
    problem = "a CMYK JPEG (convert it to RGB first)";
    return false;
  }
  const uint64_t width = info.image_width, height = info.image_height;
  if (width == 0 || height == 0 || width * height > kMaxImagePixels) {
    jpeg_destroy_decompress(&info);
    problem = detail::concat("a JPEG of ", width, " x ", height, " pixels (at most ", kMaxImagePixels, ")");
    return false;
  }
  info.out_color_space = JCS_RGB;  // gray and YCbCr both come out as RGB
  jpeg_start_decompress(&info);
  frames.count = 1;
  frames.width = static_cast<int64_t>(info.output_width);
  frames.height = static_cast<int64_t>(info.output_height);
  frames.rgb.resize(static_cast<size_t>(frames.width * frames.height * 3));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = frames.rgb.data() + static_cast<size_t>(info.output_scanline) * static_cast<size_t>(frames.width) * 3;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  static_cast<void>(name);
  return true;
}

VideoFrames decode_jpeg(std::string_view bytes, const std::string& name) {
  VideoFrames frames;
  JpegError error{};
  std::string problem;
  if (!decode_jpeg_into(bytes, name, frames, error, problem)) fail_argument(name, "a readable RGB or gray JPEG image", problem);
  return frames;
}

}  // namespace

VideoFrames decode_image(std::string_view bytes, const std::string& name) {
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static constexpr unsigned char kJpeg[] = {0xff, 0xd8, 0xff};
  const auto starts_with = [&](const unsigned char* signature, size_t length) {
    return bytes.size() >= length && std::memcmp(bytes.data(), signature, length) == 0;
  };
  VideoFrames frames;
  if (starts_with(kPng, sizeof(kPng)))
    frames = decode_png(bytes, name);
  else if (starts_with(kJpeg, sizeof(kJpeg)))
    frames = decode_jpeg(bytes, name);
  else
    fail_argument(name, "a PNG or JPEG image", bytes.empty() ? std::string("no bytes") : "data of another format");
  frames.validate();
  return frames;
}

VideoFrames read_image(const std::string& path) {
  return decode_image(read_file_bounded(path, kMaxImageFileBytes, "image"), quoted_excerpt(path));
}

}  // namespace tessel
