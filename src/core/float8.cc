#include "tessel/core/float8.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/parallel.h"

namespace tessel {

float e4m3_to_float(uint8_t byte) {
  const int exponent = (byte >> 3) & 0xf, mantissa = byte & 0x7;
  float magnitude;
  if (e4m3_is_nan(byte))
    magnitude = NAN;
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // zero or subnormal: m x 2^-9
  else
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1 + m/8) x 2^(e-7)
  return (byte & 0x80) ? -magnitude : magnitude;
}

uint8_t float_to_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (a >= kE4M3Max) return sign | 0x7e;  // saturate (448 = 1.75 x 2^8)
  // Below the smallest normal (2^-6) the grid step is 2^-9: the count of steps is the byte itself
  // (8 steps is 2^-6's encoding, exponent 1 and mantissa 0). Scaling by powers of two is exact and
  // nearbyint rounds to nearest even.
  if (a < std::ldexp(1.0f, -6)) return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  int exponent = std::ilogb(a);                                          // -6 .. 8
  int steps = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));  // 8 .. 16
  if (steps == 16) steps = 8, ++exponent;
  if (exponent > 8 || (exponent == 8 && steps > 14)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | (steps - 8));
}

void quantize_rows_e4m3(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales) {
  parallel_for(rows, [&](int64_t r) {
    const float* row = x + r * cols;
    float absmax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(row[c]));
    const float factor = absmax > 0.0f ? kE4M3Max / absmax : 1.0f;
    scales[r] = absmax > 0.0f ? absmax / kE4M3Max : 1.0f;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = float_to_e4m3(row[c] * factor);
  });
}

}  // namespace tessel
