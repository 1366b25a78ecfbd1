// Internal: the vector type the CPU tile kernels are written against, chosen at compile time from
// the instruction set the translation unit is compiled for: AVX-512, else AVX2+FMA, else plain
// scalars the compiler may still vectorize. Each variant also fixes the register blocking of the
// micro-kernels (rows x vectors of accumulators) to fit its register file.
//
// Everything here lives in the namespace TESSEL_CPU_ISA names (one per compiled variant, see
// tile_kernels.h): inline functions compiled for different instruction sets must never share a
// mangled name, or the linker could keep the AVX-512 copy for a caller built for AVX2.
#pragma once

#ifndef TESSEL_CPU_ISA
#error "simd.h is compiled once per instruction set: define TESSEL_CPU_ISA (the variant's namespace)"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized inside their own reduce/round helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace tessel::cpu::TESSEL_CPU_ISA {

// exp2 polynomial on [-0.5, 0.5]: Taylor coefficients of 2^f = e^(f ln 2) to degree 7
// (truncation error < 1e-8 relative, below fp32 rounding).
inline constexpr float kExp2Coefficients[8] = {1.0f,
                                               0.693147180559945309f,
                                               0.240226506959100712f,
                                               0.0555041086648215800f,
                                               0.00961812910762847717f,
                                               0.00133335581464284434f,
                                               0.000154035303933816099f,
                                               0.0000152527338040598403f};

#if defined(__AVX512F__)

struct Simd {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr const char* kName = "avx512";
  static constexpr int kScoreRows = 6, kScoreVectors = 4;  // 24 accumulators of 32 registers
  static constexpr int kAccRows = 6, kAccVectors = 4;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  // Whether any lane is NaN (reduce_max may drop NaN: clang lowers it to an fmax reduction).
  static bool any_nan(V v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  // 2^x; x = -inf gives 0. scalef(p, n) = p * 2^n handles the exponent (and underflow) exactly.
  static V exp2(V x) {
    // The clamp's operands in this order: maxps returns its second operand when either is NaN,
    // so a NaN score stays NaN (FlashAttention's propagation) instead of becoming 2^-200.
    x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);
    const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm512_sub_ps(x, n);
    V p = _mm512_set1_ps(kExp2Coefficients[7]);
    for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Coefficients[i]));
    return _mm512_scalef_ps(p, n);
  }
};

#elif defined(__AVX2__) && defined(__FMA__)

struct Simd {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr const char* kName = "avx2";
  static constexpr int kScoreRows = 3, kScoreVectors = 4;  // 12 accumulators of 16 registers
  static constexpr int kAccRows = 2, kAccVectors = 4;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static bool any_nan(V v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static float reduce_max(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  // 2^x; inputs below -127 give 0 (the exponent field built from n = -127 is 0).
  static V exp2(V x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);  // NaN stays NaN (see the AVX-512 exp2)
    const V n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm256_sub_ps(x, n);
    V p = _mm256_set1_ps(kExp2Coefficients[7]);
    for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Coefficients[i]));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
};

#else

struct Simd {
  using V = float;
  static constexpr int kLanes = 1;
  static constexpr const char* kName = "scalar";
  static constexpr int kScoreRows = 4, kScoreVectors = 4;
  static constexpr int kAccRows = 4, kAccVectors = 4;
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V set1(float x) { return x; }
  static V zero() { return 0.0f; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return std::max(a, b); }
  static bool any_nan(V v) { return std::isnan(v); }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static float reduce_max(V v) { return v; }
  static float reduce_add(V v) { return v; }
  static V exp2(V x) { return std::exp2(x); }
};

#endif

}  // namespace tessel::cpu::TESSEL_CPU_ISA
