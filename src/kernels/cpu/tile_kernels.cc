// Portable tile operations (the compiler vectorizes the inner loops).
#include "kernels/cpu/tile_kernels.h"

#include <cmath>
#include <limits>

namespace tessel::cpu {

void tile_scores(const float* q, int64_t m, int64_t dp, const float* kt, int64_t ld_s, float* s) {
  for (int64_t r = 0; r < m; ++r) {
    float* sr = s + r * ld_s;
    for (int64_t c = 0; c < ld_s; ++c) sr[c] = 0.0f;
    for (int64_t d = 0; d < dp; ++d) {
      const float qd = q[r * dp + d];
      const float* kd = kt + d * ld_s;
      for (int64_t c = 0; c < ld_s; ++c) sr[c] += qd * kd[c];
    }
  }
}

float tile_softmax_row(float* s, int64_t n, int64_t ld, float& row_max, float& row_sum) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float local = kNegInf;
  for (int64_t c = 0; c < n; ++c) local = std::max(local, s[c]);
  const float new_max = std::max(row_max, local);
  if (new_max == kNegInf) {  // nothing visible yet: no probability mass, nothing to rescale
    for (int64_t c = 0; c < ld; ++c) s[c] = 0.0f;
    return 1.0f;
  }
  const float alpha = std::exp2(row_max - new_max);
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    s[c] = std::exp2(s[c] - new_max);
    sum += s[c];
  }
  for (int64_t c = n; c < ld; ++c) s[c] = 0.0f;
  row_max = new_max;
  row_sum = row_sum * alpha + sum;
  return alpha;
}

void tile_accumulate(const float* p, int64_t m, int64_t ld_p, int64_t n, const float* v, int64_t dp,
                     const float* alpha, float* o) {
  for (int64_t r = 0; r < m; ++r) {
    float* orow = o + r * dp;
    const float a = alpha[r];
    if (a != 1.0f)
      for (int64_t d = 0; d < dp; ++d) orow[d] *= a;
    for (int64_t c = 0; c < n; ++c) {
      const float pc = p[r * ld_p + c];
      if (pc == 0.0f) continue;
      const float* vc = v + c * dp;
      for (int64_t d = 0; d < dp; ++d) orow[d] += pc * vc[d];
    }
  }
}

}  // namespace tessel::cpu
