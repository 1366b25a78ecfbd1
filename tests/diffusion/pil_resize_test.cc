// resize_pil against Pillow's Image.resize on a committed fixture (scripts/make_pil_resize_fixture.py):
// LANCZOS and BICUBIC, up- and downscaled, byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/core/io/safetensors.h"
#include "tessel/diffusion/pil_resize.h"
#include "test_source_dir.h"

namespace tessel {
namespace {

TEST(PilResize, EqualsPillowByteForByte) {
  const SafetensorsFile file = SafetensorsFile::open((test_support::source_dir() / "tests/fixtures/diffusion/pil_resize.safetensors").string());
  const Tensor image = file.load("image");
  const auto bytes = [](const Tensor& t) {
    return std::vector<uint8_t>(static_cast<const uint8_t*>(t.data()), static_cast<const uint8_t*>(t.data()) + t.numel());
  };
  for (const auto& [name, filter] : {std::pair{"lanczos", PilFilter::kLanczos}, {"bicubic", PilFilter::kBicubic}})
    for (const char* label : {"up", "down", "mixed"}) {
      const Tensor expected = file.load(std::string(name) + "_" + label);
      const std::vector<uint8_t> resized =
          resize_pil(static_cast<const uint8_t*>(image.data()), image.size(0), image.size(1), expected.size(0), expected.size(1), filter);
      EXPECT_EQ(resized, bytes(expected)) << name << " " << label;
    }
}

}  // namespace
}  // namespace tessel
