#include "tessel/core/cpu_features.h"

namespace tessel {

CpuVectorLevel cpu_vector_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const CpuVectorLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return CpuVectorLevel::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuVectorLevel::kAvx2Fma;
    return CpuVectorLevel::kBaseline;
  }();
  return level;
#else
  return CpuVectorLevel::kBaseline;
#endif
}

}  // namespace tessel
