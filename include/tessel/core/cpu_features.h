// The widest vector instruction set this CPU runs, for code built in several variants (a baseline
// function and copies compiled with target attributes) that picks one at run time. By feature, not
// by CPU model, which virtual machines often hide.
#pragma once

namespace tessel {

enum class CpuVectorLevel { kBaseline, kAvx2Fma, kAvx512 };

// kAvx512: AVX-512 F and VL (with AVX2 and FMA); kAvx2Fma: AVX2 and FMA; kBaseline otherwise and on
// non-x86 machines. Read from cpuid once.
CpuVectorLevel cpu_vector_level();

// The variant for this CPU among a baseline function and its AVX2+FMA and AVX-512 builds.
template <typename Function>
Function widest_variant(Function baseline, Function avx2_fma, Function avx512) {
  switch (cpu_vector_level()) {
    case CpuVectorLevel::kAvx512: return avx512;
    case CpuVectorLevel::kAvx2Fma: return avx2_fma;
    case CpuVectorLevel::kBaseline: break;
  }
  return baseline;
}

}  // namespace tessel
