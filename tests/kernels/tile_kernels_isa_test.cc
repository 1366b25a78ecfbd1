// The run-time choice of the CPU tile-kernel variant, and every variant this CPU can run against
// the baseline (scalar) one on the same tiles: scores, softmax (with masked columns and a row
// that sees nothing yet), accumulation and the K panel transpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/tile_kernels.h"
#include "tessel/kernels/cpu_isa.h"

namespace tessel {
namespace {

using cpu::kPanelKeys;
using cpu::TileKernels;

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

void expect_near_all(const std::vector<float>& actual, const std::vector<float>& expected, float tolerance,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isinf(expected[i]) || std::isnan(expected[i])) {
      EXPECT_EQ(std::isinf(actual[i]), std::isinf(expected[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1.0f + std::fabs(expected[i]))) << what << " at " << i;
  }
}

// One attention tile step (pack, scores, softmax, accumulate) with `kernels`; returns S/P, the
// output accumulator and the row statistics, concatenated.
std::vector<float> tile_step(const TileKernels& kernels, int64_t m, int64_t dp, int64_t n) {
  const int64_t cols = (n + kPanelKeys - 1) / kPanelKeys * kPanelKeys, ld = 64;
  const std::vector<float> q = random_floats(static_cast<size_t>(m * dp), 1);
  const std::vector<float> keys = random_floats(static_cast<size_t>(cols * dp), 2);
  const std::vector<float> v = random_floats(static_cast<size_t>(cols * dp), 3);
  std::vector<float> kt(static_cast<size_t>(cols * dp));
  for (int64_t panel = 0; panel < cols / kPanelKeys; ++panel)
    kernels.pack_key_panel(keys.data() + panel * kPanelKeys * dp, dp, dp, kt.data() + panel * kPanelKeys * dp);
  std::vector<float> s(static_cast<size_t>(m * ld), 0.0f);
  kernels.scores(q.data(), m, dp, kt.data(), cols, s.data(), ld);
  std::vector<float> row_max(static_cast<size_t>(m), -std::numeric_limits<float>::infinity());
  std::vector<float> row_sum(static_cast<size_t>(m), 0.0f), alpha(static_cast<size_t>(m));
  // Row 0 sees no key at all: masked everywhere.
  for (int64_t c = 0; c < cols; ++c) s[static_cast<size_t>(c)] = -std::numeric_limits<float>::infinity();
  kernels.softmax(s.data(), m, ld, n, cols, row_max.data(), row_sum.data(), alpha.data());
  std::vector<float> o = random_floats(static_cast<size_t>(m * dp), 4);
  kernels.accumulate(s.data(), m, ld, 0, n, v.data(), dp, alpha.data(), o.data());
  std::vector<float> all = s;
  all.insert(all.end(), o.begin(), o.end());
  all.insert(all.end(), row_max.begin(), row_max.end());
  all.insert(all.end(), row_sum.begin(), row_sum.end());
  all.insert(all.end(), kt.begin(), kt.end());
  return all;
}

TEST(TileKernelsIsa, TheWidestRunnableVariantIsChosen) {
  const std::vector<const TileKernels*> runnable = cpu::runnable_tile_kernels();
  ASSERT_FALSE(runnable.empty());
  EXPECT_EQ(&cpu::active_tile_kernels(), runnable.front());
  EXPECT_EQ(cpu_kernels_isa(), runnable.front()->isa);
  EXPECT_EQ(runnable_cpu_kernel_isas().front(), cpu_kernels_isa());
#if defined(__x86_64__)
  if (!cpu_kernels_native_build()) {
    // A portable x86-64 build carries all three variants; cpuid decides which of them run here.
    std::vector<std::string> expected;
    // Feature by feature: clang 14 (the sanitizer build) does not know the level names.
    const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vl");
    if (v4) expected.push_back("avx512");
    if (v3) expected.push_back("avx2");
    expected.push_back("scalar");
    EXPECT_EQ(runnable_cpu_kernel_isas(), expected);
  }
#endif
}

TEST(TileKernelsIsa, EveryRunnableVariantMatchesTheLastOne) {
  const std::vector<const TileKernels*> runnable = cpu::runnable_tile_kernels();
  const TileKernels& baseline = *runnable.back();
  for (const int64_t m : {1, 7, 24}) {
    for (const int64_t n : {64, 37, 16}) {
      const std::vector<float> expected = tile_step(baseline, m, 128, n);
      for (const TileKernels* variant : runnable)
        expect_near_all(tile_step(*variant, m, 128, n), expected, 2e-5f,
                        std::string(variant->isa) + " m=" + std::to_string(m) + " n=" + std::to_string(n));
    }
  }
}

}  // namespace
}  // namespace tessel
