// Internal: the three inner operations of tiled attention on fp32 tiles, shared by the dense and
// block-sparse CPU kernels, written once against kernels/cpu/simd.h (AVX-512, AVX2 or scalar).
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

namespace tessel::cpu {

inline constexpr int64_t kPanelKeys = 16;
inline constexpr int64_t kChunkKeys = 64;

// Name of the instruction set the tile kernels were compiled for ("avx512", "avx2", "scalar").
const char* tile_kernels_isa();

// Writes one K panel: keys[c][d] (16 rows of dp floats, row stride ld) to panel[d][c].
void pack_key_panel(const float* keys, int64_t ld, int64_t dp, float* panel);

// S[r][0, cols) = Q[r] · K[key] for the `cols` keys (a multiple of 16) whose panels start at kt.
void tile_scores(const float* q, int64_t m, int64_t dp, const float* kt, int64_t cols, float* s, int64_t ld_s);

// Online-softmax step for the m rows of a score tile s[m][ld], in the log2 domain. In each row,
// columns [n, cols) and entries the caller set to -inf are masked. Updates each row's running max
// and sum, overwrites s[r][0, cols) with probabilities (0 where masked), and sets alpha[r], the
// factor the row's previous output must be scaled by.
void tile_softmax(float* s, int64_t m, int64_t ld, int64_t n, int64_t cols, float* row_max, float* row_sum,
                  float* alpha);

// O[r] = alpha[r] * O[r] + sum over keys c in [c0, n) of P[r][c] * V[c]   (V points at key 0 of the chunk)
void tile_accumulate(const float* p, int64_t m, int64_t ld_p, int64_t c0, int64_t n, const float* v, int64_t dp,
                     const float* alpha, float* o);

}  // namespace tessel::cpu
