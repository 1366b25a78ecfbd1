#include "tessel/core/dtype.h"

#include <cmath>

#include "tessel/core/error.h"

namespace tessel {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  throw Error("dtype_size: unknown dtype");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "fp64";
    case DType::kI32: return "int32";
    case DType::kU8: return "uint8";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "f32") return DType::kF32;
  if (name == "fp16" || name == "float16" || name == "f16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp64" || name == "float64" || name == "f64") return DType::kF64;
  if (name == "int32" || name == "i32") return DType::kI32;
  if (name == "uint8" || name == "u8") return DType::kU8;
  fail_argument("dtype", "one of fp32, fp16, bf16, fp64, int32, uint8", std::string(name));
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF64;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;      // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;     // rounds to >= 65520 -> inf
  if (abs < 0x38800000u) {                           // below the smallest normal (2^-14): subnormal
    // value = abs_float; subnormal step 2^-24. Round-to-nearest-even via integer math.
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;                      // < 2^-25: rounds to zero
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                // 14..24
    uint32_t result = mant >> shift;
    const uint32_t remainder = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to even.
  uint32_t rebiased = abs - 0x38000000u;
  const uint32_t rounding = 0xfffu + ((rebiased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebiased + rounding) >> 13);
}

}  // namespace tessel
