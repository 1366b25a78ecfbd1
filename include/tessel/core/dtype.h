// Element types and exact CPU conversions (round-to-nearest-even) for fp16/bf16.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tessel {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI32, kU8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);     // "fp32", "fp16", "bf16", "fp64", "int32", "uint8"
DType parse_dtype(std::string_view name);     // accepts the names above plus float32/float16/bfloat16; throws Error
bool is_floating(DType dtype);

// Raw 16-bit storage types. They are plain structs so they can sit in any buffer.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float half_to_float(uint16_t bits);
uint16_t float_to_half(float f);  // round-to-nearest-even, overflow to inf, subnormals kept

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kF16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };

inline float to_float(float x) { return x; }
inline float to_float(Half x) { return half_to_float(x.bits); }
inline float to_float(BFloat16 x) { return bf16_to_float(x.bits); }
template <typename T> T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline Half from_float<Half>(float x) { return Half{float_to_half(x)}; }
template <> inline BFloat16 from_float<BFloat16>(float x) { return BFloat16{float_to_bf16(x)}; }

}  // namespace tessel
