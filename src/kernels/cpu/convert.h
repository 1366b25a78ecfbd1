// Internal: row conversions between the attention dtypes and fp32 for the CPU kernels, with an
// optional scale. fp16 uses the F16C instructions when compiled in (exact, and round-to-nearest-
// even on the way back, like tessel::float_to_half); bf16 is a shift (exact) and an inline RNE
// rounding the compiler vectorizes.
#pragma once

#include <cstdint>

#include "tessel/core/dtype.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace tessel::cpu {

inline void row_to_fp32(DType dtype, const void* src, int64_t n, float scale, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i] * scale;
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]) * scale;
      return;
    }
    default: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      const __m256 vs = _mm256_set1_ps(scale);
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))), vs));
#endif
      for (; i < n; ++i) dst[i] = half_to_float(s[i]) * scale;
      return;
    }
  }
}

inline void row_from_fp32(DType dtype, const float* src, int64_t n, float scale, void* dst) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i] * scale;
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i] * scale);
      return;
    }
    default: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(__F16C__)
      const __m256 vs = _mm256_set1_ps(scale);
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), vs), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = float_to_half(src[i] * scale);
      return;
    }
  }
}

}  // namespace tessel::cpu
