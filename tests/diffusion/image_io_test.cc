// decode_image / read_image against PIL's Image.open(...).convert("RGB") on committed files of every
// colour layout (scripts/make_image_fixture.py), and the errors of hostile inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "error_of.h"
#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/image_io.h"
#include "tessel/diffusion/video_io.h"

namespace tessel {
namespace {

using testing::error_of;

const std::string kDir = std::string(TESSEL_SOURCE_DIR) + "/tests/fixtures/diffusion/images/";

std::string file_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

TEST(ImageIo, EveryLayoutDecodesAsPilConvertsIt) {
  const SafetensorsFile expected = SafetensorsFile::open(kDir + "expected.safetensors");
  for (const char* name : {"rgb.png", "rgba.png", "gray.png", "palette.png", "rgb.jpg", "gray.jpg"}) {
    std::string key = name;
    key[key.find('.')] = '_';
    const Tensor want = expected.load(key);
    const VideoFrames image = read_image(kDir + name);
    ASSERT_EQ(image.count, 1) << name;
    ASSERT_EQ(image.height, want.size(0)) << name;
    ASSERT_EQ(image.width, want.size(1)) << name;
    EXPECT_EQ(std::memcmp(image.rgb.data(), want.data(), image.rgb.size()), 0) << name << ": bytes differ from PIL's";
  }
}

TEST(ImageIo, HostileInputsAreErrorsNamingTheInput) {
  EXPECT_NE(error_of([] { read_image(kDir + "cmyk.jpg"); }).find("CMYK"), std::string::npos);
  EXPECT_NE(error_of([] { read_image(kDir + "missing.png"); }).find("missing.png"), std::string::npos);
  EXPECT_NE(error_of([] { decode_image("", "input_reference"); }).find("input_reference"), std::string::npos);
  EXPECT_NE(error_of([] { decode_image("GIF89a....", "input_reference"); }).find("PNG or JPEG"), std::string::npos);
  // Truncated files of both formats.
  for (const char* name : {"rgb.png", "rgb.jpg"}) {
    const std::string bytes = file_bytes(kDir + name);
    const std::string error = error_of([&] { decode_image(bytes.substr(0, bytes.size() / 2), "image"); });
    EXPECT_NE(error.find("image"), std::string::npos) << name << ": " << error;
  }
  // A PNG header claiming more pixels than allowed is refused before decoding.
  std::string huge = file_bytes(kDir + "rgb.png");
  const uint32_t side = 0x00100000;  // 1 Mi x 1 Mi, big-endian in IHDR at offset 16
  for (int i = 0; i < 4; ++i) huge[16 + i] = huge[20 + i] = static_cast<char>((side >> (24 - 8 * i)) & 0xff);
  EXPECT_NE(error_of([&] { decode_image(huge, "image"); }).find("image"), std::string::npos);
}

TEST(ImageIo, WrittenPngsReadBackExactly) {
  VideoFrames frames;
  frames.count = 1;
  frames.height = 3;
  frames.width = 5;
  for (int i = 0; i < 45; ++i) frames.rgb.push_back(static_cast<uint8_t>(i * 5));
  const VideoFrames back = decode_image(encode_png(frames), "encoded");
  EXPECT_EQ(back.rgb, frames.rgb);
}

}  // namespace
}  // namespace tessel
