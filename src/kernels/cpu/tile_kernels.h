// Internal: the three inner operations of tiled attention on fp32 tiles, shared by the dense and
// block-sparse CPU kernels. Tiles are row-major with padded leading dimensions (multiples of 16,
// padding zero-filled) so SIMD code never needs a tail.
#pragma once

#include <cstdint>

namespace tessel::cpu {

// S[m][ld_s] = Q[m][dp] · Kt[dp][ld_s]   (Kt is the key tile transposed; ld_s, dp multiples of 16)
void tile_scores(const float* q, int64_t m, int64_t dp, const float* kt, int64_t ld_s, float* s);

// Online-softmax step for one row of scores s[0, n) (log2 domain, -inf = masked): updates the
// running max and sum, overwrites s[0, ld) with the probabilities (0 past n), returns the factor
// the row's previous output must be scaled by.
float tile_softmax_row(float* s, int64_t n, int64_t ld, float& row_max, float& row_sum);

// O[m][dp] = alpha[r] * O[m][dp] + P[m][ld_p] · V[n][dp]
void tile_accumulate(const float* p, int64_t m, int64_t ld_p, int64_t n, const float* v, int64_t dp,
                     const float* alpha, float* o);

}  // namespace tessel::cpu
