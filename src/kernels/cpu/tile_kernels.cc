// Register-blocked micro-kernels: each block keeps R rows x NV vectors of accumulators in
// registers for a whole reduction (over head_dim for scores, over keys for the output), so every
// loaded K/V vector is reused R times and every broadcast query/probability NV times.
//
// Compiled once per instruction set (src/kernels/CMakeLists.txt), each copy in the namespace
// TESSEL_CPU_ISA names and published as that namespace's kTileKernels; tile_kernels_dispatch.cc
// picks one at run time.
#include "cpu/tile_kernels.h"

#include <cmath>
#include <limits>

#include "cpu/simd.h"

namespace tessel::cpu::TESSEL_CPU_ISA {
namespace {

using V = Simd::V;
constexpr int64_t kLanes = Simd::kLanes;
constexpr int64_t kScoreDimSlice = 64;

// acc[r][w] += a[r * lda] * b[w] for the whole R x NV block: one step of a micro-kernel's
// reduction. Always inlined, so the block stays in registers as if written in the loop.
template <int R, int NV>
[[gnu::always_inline]] inline void rank1_update(V (&acc)[R][NV], const float* a, int64_t lda, const V (&b)[NV]) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const V ar = Simd::set1(a[r * lda]);
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = Simd::fma(ar, b[w], acc[r][w]);
  }
}

// Writes the block to rows c + r * ldc, vectors vec0 to vec0 + NV - 1 of each.
template <int R, int NV>
[[gnu::always_inline]] inline void store_block(const V (&acc)[R][NV], float* c, int64_t ldc, int64_t vec0) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) Simd::store(c + r * ldc + (vec0 + w) * kLanes, acc[r][w]);
}

// ---- scores: S = Q · K^T --------------------------------------------------------------------

// Accumulates over head dims [d0, d1); starts from zero when d0 == 0, else from the stored S.
template <int R, int NV>
void scores_block(const float* q, int64_t dp, const float* kt, int64_t vec0, float* s, int64_t ld_s, int64_t d0,
                  int64_t d1) {
  const float* col[NV];
  for (int w = 0; w < NV; ++w) {
    const int64_t c = (vec0 + w) * kLanes;
    col[w] = kt + (c / kPanelKeys) * kPanelKeys * dp + c % kPanelKeys;
  }
  V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = d0 == 0 ? Simd::zero() : Simd::load(s + r * ld_s + (vec0 + w) * kLanes);
  for (int64_t d = d0; d < d1; ++d) {
    V kv[NV];
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) kv[w] = Simd::load(col[w] + d * kPanelKeys);
    rank1_update(acc, q + d, dp, kv);
  }
  store_block(acc, s, ld_s, vec0);
}

template <int R, int NV>
void scores_vector_tail(int64_t rest, const float* q, int64_t dp, const float* kt, int64_t vec0, float* s, int64_t ld_s,
                        int64_t d0, int64_t d1) {
  if constexpr (NV > 0) {
    if (rest == NV)
      scores_block<R, NV>(q, dp, kt, vec0, s, ld_s, d0, d1);
    else
      scores_vector_tail<R, NV - 1>(rest, q, dp, kt, vec0, s, ld_s, d0, d1);
  }
}

template <int R>
void scores_rows(const float* q, int64_t dp, const float* kt, int64_t vectors, float* s, int64_t ld_s, int64_t d0,
                 int64_t d1) {
  constexpr int NV = Simd::kScoreVectors;
  int64_t v = 0;
  for (; v + NV <= vectors; v += NV) scores_block<R, NV>(q, dp, kt, v, s, ld_s, d0, d1);
  scores_vector_tail<R, NV - 1>(vectors - v, q, dp, kt, v, s, ld_s, d0, d1);
}

template <int R>
void scores_row_tail(int64_t rest, const float* q, int64_t dp, const float* kt, int64_t vectors, float* s, int64_t ld_s,
                     int64_t d0, int64_t d1) {
  if constexpr (R > 0) {
    if (rest == R)
      scores_rows<R>(q, dp, kt, vectors, s, ld_s, d0, d1);
    else
      scores_row_tail<R - 1>(rest, q, dp, kt, vectors, s, ld_s, d0, d1);
  }
}

// ---- output: O = alpha * O + P · V ----------------------------------------------------------

template <int R, int NV>
void accumulate_block(const float* p, int64_t ld_p, int64_t c0, int64_t n, const float* v, int64_t dp,
                      const float* alpha, float* o, int64_t vec0) {
  V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const V a = Simd::set1(alpha[r]);
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) acc[r][w] = Simd::mul(Simd::load(o + r * dp + (vec0 + w) * kLanes), a);
  }
  for (int64_t c = c0; c < n; ++c) {
    V vv[NV];
#pragma GCC unroll 16
    for (int w = 0; w < NV; ++w) vv[w] = Simd::load(v + c * dp + (vec0 + w) * kLanes);
    rank1_update(acc, p + c, ld_p, vv);
  }
  store_block(acc, o, dp, vec0);
}

struct AccumulateArgs {
  const float* p;
  int64_t ld_p, c0, n;
  const float* v;
  int64_t dp;
  const float* alpha;
  float* o;
};

template <int R, int NV>
void accumulate_vector_tail(int64_t rest, const AccumulateArgs& a, int64_t vec0) {
  if constexpr (NV > 0) {
    if (rest == NV)
      accumulate_block<R, NV>(a.p, a.ld_p, a.c0, a.n, a.v, a.dp, a.alpha, a.o, vec0);
    else
      accumulate_vector_tail<R, NV - 1>(rest, a, vec0);
  }
}

// Output vectors [vec_begin, vec_end) of one block of R rows.
template <int R>
void accumulate_rows(const AccumulateArgs& a, int64_t vec_begin, int64_t vec_end) {
  constexpr int NV = Simd::kAccVectors;
  int64_t v = vec_begin;
  for (; v + NV <= vec_end; v += NV) accumulate_block<R, NV>(a.p, a.ld_p, a.c0, a.n, a.v, a.dp, a.alpha, a.o, v);
  accumulate_vector_tail<R, NV - 1>(vec_end - v, a, v);
}

template <int R>
void accumulate_row_tail(int64_t rest, const AccumulateArgs& a, int64_t vec_begin, int64_t vec_end) {
  if constexpr (R > 0) {
    if (rest == R)
      accumulate_rows<R>(a, vec_begin, vec_end);
    else
      accumulate_row_tail<R - 1>(rest, a, vec_begin, vec_end);
  }
}

void pack_key_panel(const float* keys, int64_t ld, int64_t dp, float* panel) {
#if defined(__AVX512F__)
  // 16x16 blocks transposed in registers: unpack pairs, then 4-lane shuffles, then 128-bit lanes.
  for (int64_t d0 = 0; d0 < dp; d0 += 16) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(keys + i * ld + d0);
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
      t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; ++i) {
      r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
      r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(panel + (d0 + i) * kPanelKeys, r[i]);
  }
#else
  for (int64_t d = 0; d < dp; ++d)
    for (int64_t c = 0; c < kPanelKeys; ++c) panel[d * kPanelKeys + c] = keys[c * ld + d];
#endif
}

void tile_scores(const float* q, int64_t m, int64_t dp, const float* kt, int64_t cols, float* s, int64_t ld_s) {
  constexpr int R = Simd::kScoreRows;
  const int64_t vectors = cols / kLanes;
  // Head dims in slices of kScoreDimSlice, so the slice of the key chunk stays in L1 while every
  // row block of Q passes over it.
  for (int64_t d0 = 0; d0 < dp; d0 += kScoreDimSlice) {
    const int64_t d1 = std::min(dp, d0 + kScoreDimSlice);
    int64_t r = 0;
    for (; r + R <= m; r += R) scores_rows<R>(q + r * dp, dp, kt, vectors, s + r * ld_s, ld_s, d0, d1);
    scores_row_tail<R - 1>(m - r, q + r * dp, dp, kt, vectors, s + r * ld_s, ld_s, d0, d1);
  }
}

// In separate passes over the rows (maxima; rescale factors, 16 rows per vector exp2; then the
// probabilities), so the horizontal reductions of neighbouring rows overlap instead of chaining.
void tile_softmax(float* s, int64_t m, int64_t ld, int64_t n, int64_t cols, float* row_max, float* row_sum,
                  float* alpha) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < m; ++r) {  // alpha[r] = the row's new max, for now
    float* sr = s + r * ld;
    for (int64_t c = n; c < cols; ++c) sr[c] = kNegInf;
    V vmax = Simd::load(sr);
    bool nan = Simd::any_nan(vmax);
    for (int64_t c = kLanes; c < cols; c += kLanes) {
      const V x = Simd::load(sr + c);
      vmax = Simd::max(vmax, x);
      nan = nan || Simd::any_nan(x);
    }
    // NaN propagates as in FlashAttention: a NaN score (from a NaN in q or k) makes the row's max
    // NaN, and a NaN max stays NaN, so the row's output and LSE come out NaN, never a zero row.
    // (Checked apart from the max: reductions may drop NaN, as clang's fmax reduction does.)
    const float tile_max = Simd::reduce_max(vmax);
    alpha[r] = nan || std::isnan(tile_max) || std::isnan(row_max[r]) ? std::numeric_limits<float>::quiet_NaN()
                                                                      : std::max(row_max[r], tile_max);
  }
  int64_t r = 0;
  for (; r + kLanes <= m; r += kLanes) {
    const V new_max = Simd::load(alpha + r);
    Simd::store(alpha + r, Simd::exp2(Simd::sub(Simd::load(row_max + r), new_max)));
    Simd::store(row_max + r, new_max);
  }
  for (; r < m; ++r) {
    const float new_max = alpha[r];
    alpha[r] = std::exp2(row_max[r] - new_max);
    row_max[r] = new_max;
  }
  for (r = 0; r < m; ++r) {
    float* sr = s + r * ld;
    if (row_max[r] == kNegInf) {  // nothing visible yet: no probability mass, nothing to rescale
      alpha[r] = 1.0f;
      for (int64_t c = 0; c < cols; c += kLanes) Simd::store(sr + c, Simd::zero());
      continue;
    }
    const V shift = Simd::set1(row_max[r]);
    V vsum = Simd::zero();
    for (int64_t c = 0; c < cols; c += kLanes) {
      const V e = Simd::exp2(Simd::sub(Simd::load(sr + c), shift));
      Simd::store(sr + c, e);
      vsum = Simd::add(vsum, e);
    }
    row_sum[r] = row_sum[r] * alpha[r] + Simd::reduce_add(vsum);
  }
}

void tile_accumulate(const float* p, int64_t m, int64_t ld_p, int64_t c0, int64_t n, const float* v, int64_t dp,
                     const float* alpha, float* o) {
  constexpr int R = Simd::kAccRows;
  // (Slicing the output dims like tile_scores slices head dims measured no gain here.)
  const int64_t vectors = dp / kLanes;
  int64_t r = 0;
  for (; r + R <= m; r += R) accumulate_rows<R>({p + r * ld_p, ld_p, c0, n, v, dp, alpha + r, o + r * dp}, 0, vectors);
  accumulate_row_tail<R - 1>(m - r, {p + r * ld_p, ld_p, c0, n, v, dp, alpha + r, o + r * dp}, 0, vectors);
}

}  // namespace

extern const TileKernels kTileKernels{Simd::kName, pack_key_panel, tile_scores, tile_softmax, tile_accumulate};

}  // namespace tessel::cpu::TESSEL_CPU_ISA
