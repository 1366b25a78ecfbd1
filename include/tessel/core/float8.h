// float8 e4m3 ("e4m3fn": 4 exponent bits of bias 7, 3 mantissa bits, no infinities, NaN = 0x7f /
// 0xff, largest finite 448) on the host: the element conversions and the row quantiser of the FP8
// weights. The bytes are held as DType::kU8 (what the FP8 kernels take; a safetensors entry marks
// them SafetensorsEntry::float8_e4m3).
#pragma once

#include <cstdint>

namespace tessel {

inline constexpr float kE4M3Max = 448.0f;

float e4m3_to_float(uint8_t byte);
// Round to nearest even, saturating: values beyond +-448 (and infinities) give +-448, NaN gives
// 0x7f; what the GPU's cvt.rn.satfinite.e4m3 gives.
uint8_t float_to_e4m3(float value);
inline bool e4m3_is_nan(uint8_t byte) { return (byte & 0x7f) == 0x7f; }

// x (rows, cols) fp32, row-major -> q (rows, cols) e4m3 bytes and scales (rows): each row's
// absolute maximum maps to 448 (factor 448 / absmax, then x * factor rounded; scale absmax / 448;
// an all-zero row gets 1 for both), the same fp32 operations as the device's
// launch_quantize_rows_fp8, so the same bytes.
void quantize_rows_e4m3(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scales);

}  // namespace tessel
