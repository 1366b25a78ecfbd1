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
  if (__builtin_cpu_supports("x86-64-v4")) variants.push_back(&avx512::kTileKernels);
#endif
#ifdef TESSEL_TILE_KERNELS_AVX2
  // x86-64-v3: AVX2, FMA, F16C, BMI1/2.
  if (__builtin_cpu_supports("x86-64-v3")) variants.push_back(&avx2::kTileKernels);
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
