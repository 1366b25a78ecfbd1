// Internal: the three inner operations of tiled attention on fp32 tiles, shared by the dense and
// block-sparse CPU kernels, written once against cpu/simd.h and compiled once per instruction set
// (scalar baseline x86-64, AVX2+FMA, AVX-512; or one copy for the build machine with
// TESSEL_NATIVE). The variant used is the widest this CPU runs, chosen from cpuid at the first
// call, never during static initialisation (tile_kernels_dispatch.cc).
//
// Layouts (all padded to multiples of 16 floats so vector code needs no tail):
//   Q tile   [m][dp]            query rows, pre-scaled by scale * log2(e)
//   K panels [panel][dp][16]    keys transposed in panels of 16 keys; a chunk starting at any
//                               multiple of 16 keys is a run of consecutive panels
//   V rows   [key][dp]
//   S / P    [m][ld]            scores, then probabilities, of one chunk of <= kChunkKeys keys
//   O        [m][dp]            unnormalized output accumulator
#pragma once

#include <cstdint>
#include <vector>

namespace tessel::cpu {

inline constexpr int64_t kPanelKeys = 16;
inline constexpr int64_t kChunkKeys = 64;

// One compiled variant of the operations below (tile_kernels.cc built for one instruction set).
struct TileKernels {
  const char* isa;  // "avx512", "avx2" or "scalar"
  void (*pack_key_panel)(const float* keys, int64_t ld, int64_t dp, float* panel);
  void (*scores)(const float* q, int64_t m, int64_t dp, const float* kt, int64_t cols, float* s, int64_t ld_s);
  void (*softmax)(float* s, int64_t m, int64_t ld, int64_t n, int64_t cols, float* row_max, float* row_sum,
                  float* alpha);
  void (*accumulate)(const float* p, int64_t m, int64_t ld_p, int64_t c0, int64_t n, const float* v, int64_t dp,
                     const float* alpha, float* o);
};

#ifndef TESSEL_CPU_ISA
// (Seen by baseline code only: a copy of these inline functions compiled inside a variant's
// translation unit could be the one the linker keeps.)

// The variants this build carries that this CPU can run, the preferred (widest) first.
std::vector<const TileKernels*> runnable_tile_kernels();
// The variant in use: the first runnable one, chosen on the first call.
const TileKernels& active_tile_kernels();

// Writes one K panel: keys[c][d] (16 rows of dp floats, row stride ld) to panel[d][c].
inline void pack_key_panel(const float* keys, int64_t ld, int64_t dp, float* panel) {
  active_tile_kernels().pack_key_panel(keys, ld, dp, panel);
}

// S[r][0, cols) = Q[r] · K[key] for the `cols` keys (a multiple of 16) whose panels start at kt.
inline void tile_scores(const float* q, int64_t m, int64_t dp, const float* kt, int64_t cols, float* s, int64_t ld_s) {
  active_tile_kernels().scores(q, m, dp, kt, cols, s, ld_s);
}

// Online-softmax step for the m rows of a score tile s[m][ld], in the log2 domain. In each row,
// columns [n, cols) and entries the caller set to -inf are masked. Updates each row's running max
// and sum, overwrites s[r][0, cols) with probabilities (0 where masked), and sets alpha[r], the
// factor the row's previous output must be scaled by.
inline void tile_softmax(float* s, int64_t m, int64_t ld, int64_t n, int64_t cols, float* row_max, float* row_sum,
                         float* alpha) {
  active_tile_kernels().softmax(s, m, ld, n, cols, row_max, row_sum, alpha);
}

// O[r] = alpha[r] * O[r] + sum over keys c in [c0, n) of P[r][c] * V[c]   (V points at key 0 of the chunk)
inline void tile_accumulate(const float* p, int64_t m, int64_t ld_p, int64_t c0, int64_t n, const float* v,
                            int64_t dp, const float* alpha, float* o) {
  active_tile_kernels().accumulate(p, m, ld_p, c0, n, v, dp, alpha, o);
}
#endif  // TESSEL_CPU_ISA

}  // namespace tessel::cpu
