// Chooses the tile-kernel variant for this CPU. Built for the baseline instruction set: nothing
// here runs before main (the variants' tables are constants), and cpuid is read on the first call.
#include "cpu/tile_kernels.h"

#include "tessel/kernels/cpu_isa.h"

namespace tessel::cpu {

// The tables of the variants src/kernels/CMakeLists.txt can compile, each a tile_kernels.cc
// translation unit in its own namespace. Only those this build has (TESSEL_TILE_KERNELS_<ISA>)
// are referred to below; declaring the others is harmless.
namespace native { extern const TileKernels kTileKernels; }
namespace avx512 { extern const TileKernels kTileKernels; }
namespace avx2 { extern const TileKernels kTileKernels; }
namespace scalar { extern const TileKernels kTileKernels; }

namespace {

// Feature by feature rather than the "x86-64-v3"/"x86-64-v4" level names, which clang 14 (the
// sanitizer and fuzzer compiler) does not accept. The runtimes' cpuid code also checks that the
// OS saves the ymm/zmm state. F16C is not queried (clang 14 does not know the name); every CPU with
// AVX2 and FMA has it.
[[maybe_unused]] bool cpu_runs_x86_64_v3() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
}

[[maybe_unused]] bool cpu_runs_x86_64_v4() {
  return cpu_runs_x86_64_v3() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

}  // namespace

std::vector<const TileKernels*> runnable_tile_kernels() {
  std::vector<const TileKernels*> variants;
#ifdef TESSEL_TILE_KERNELS_NATIVE
  variants.push_back(&native::kTileKernels);  // TESSEL_NATIVE: the build machine's instruction set
#endif
#if defined(TESSEL_TILE_KERNELS_AVX512) || defined(TESSEL_TILE_KERNELS_AVX2)
  __builtin_cpu_init();
#endif
#ifdef TESSEL_TILE_KERNELS_AVX512
  // x86-64-v4: AVX-512 F/BW/CD/DQ/VL with the OS saving the zmm state, plus everything of v3.
  if (cpu_runs_x86_64_v4()) variants.push_back(&avx512::kTileKernels);
#endif
#ifdef TESSEL_TILE_KERNELS_AVX2
  // x86-64-v3: AVX2, FMA, F16C, BMI1/2.
  if (cpu_runs_x86_64_v3()) variants.push_back(&avx2::kTileKernels);
#endif
#ifdef TESSEL_TILE_KERNELS_SCALAR
  variants.push_back(&scalar::kTileKernels);
#endif
  return variants;
}

const TileKernels& active_tile_kernels() {
  static const TileKernels& chosen = *runnable_tile_kernels().front();
  return chosen;
}

}  // namespace tessel::cpu

namespace tessel {

std::string cpu_kernels_isa() { return cpu::active_tile_kernels().isa; }

std::vector<std::string> runnable_cpu_kernel_isas() {
  std::vector<std::string> names;
  for (const cpu::TileKernels* variant : cpu::runnable_tile_kernels()) names.emplace_back(variant->isa);
  return names;
}

bool cpu_kernels_native_build() {
#ifdef TESSEL_TILE_KERNELS_NATIVE
  return true;
#else
  return false;
#endif
}

}  // namespace tessel
