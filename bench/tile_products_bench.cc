// Single-thread comparison of the CPU attention tile products: tessel's register-blocked SIMD
// micro-kernels (src/kernels/cpu/tile_kernels.cc) against OpenBLAS sgemm on the same tiles.
// Build and run: bash bench/tile_products.sh
#include <cblas.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <vector>

#include "cpu/tile_kernels.h"

using tessel::cpu::kPanelKeys;

namespace {

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best of several rounds of this thread's CPU time: the machine is shared, and CPU time leaves
// out the slices other processes take (wall time would not).
template <typename F>
double best_seconds(F&& f, int reps) {
  double best = 1e30;
  for (int round = 0; round < 9; ++round) {
    const double t0 = thread_seconds();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, (thread_seconds() - t0) / reps);
  }
  return best;
}

}  // namespace

int main() {
  openblas_set_num_threads(1);
  std::printf("tile kernels ISA: %s\n", tessel::cpu::active_tile_kernels().isa);
  std::printf("%-6s %-6s %-6s %-26s %10s %10s\n", "m", "keys", "dp", "product", "ours GF/s", "sgemm GF/s");
  for (int64_t m : {32, 64, 128}) {
    for (int64_t dp : {64, 128}) {
      const int64_t n = 64;
      std::vector<float> q(m * dp, 0.01f), k(n * dp, 0.02f), kt(n * dp, 0.02f), v(n * dp, 0.03f);
      std::vector<float> s(m * n), o(m * dp, 0.0f), alpha(m, 1.0f);
      const double flops = 2.0 * m * n * dp;
      const int reps = 2000;
      const double ours_s = best_seconds([&] { tessel::cpu::tile_scores(q.data(), m, dp, kt.data(), n, s.data(), n); }, reps);
      const double blas_s = best_seconds([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, dp, 1.0f, q.data(), dp, k.data(), dp, 0.0f, s.data(), n);
      }, reps);
      std::printf("%-6ld %-6ld %-6ld %-26s %10.1f %10.1f\n", m, n, dp, "S = Q K^T", flops / ours_s * 1e-9,
                  flops / blas_s * 1e-9);
      const double ours_o = best_seconds([&] {
        tessel::cpu::tile_accumulate(s.data(), m, n, 0, n, v.data(), dp, alpha.data(), o.data());
      }, reps);
      // sgemm cannot scale each row by its own alpha: that needs a separate pass, not counted here.
      const double blas_o = best_seconds([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dp, n, 1.0f, s.data(), n, v.data(), dp, 1.0f, o.data(), dp);
      }, reps);
      std::printf("%-6ld %-6ld %-6ld %-26s %10.1f %10.1f\n", m, n, dp, "O = alpha O + P V", flops / ours_o * 1e-9,
                  flops / blas_o * 1e-9);
      std::vector<float> row_max(m, -1e30f), row_sum(m, 0.0f), scores(m * n);
      for (size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>(i % 7) * 0.1f;
      const double soft = best_seconds([&] {
        std::copy(scores.begin(), scores.end(), s.begin());
        tessel::cpu::tile_softmax(s.data(), m, n, n, n, row_max.data(), row_sum.data(), alpha.data());
      }, reps);
      std::printf("%-6ld %-6ld %-6ld %-26s %10.2f us per tile (%.0f%% of the two products)\n", m, n, dp, "softmax rows",
                  soft * 1e6, 100.0 * soft / (ours_s + ours_o));
    }
  }
  (void)kPanelKeys;
  return 0;
}
