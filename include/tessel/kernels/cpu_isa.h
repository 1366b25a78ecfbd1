// Which instruction set the CPU attention kernels use. The build carries several variants of the
// hot kernels (baseline x86-64, AVX2+FMA, AVX-512); the widest one this CPU supports is chosen
// from cpuid at the first call. A TESSEL_NATIVE build carries one variant compiled for the build
// machine instead (not portable to other CPUs).
#pragma once

#include <string>
#include <vector>

namespace tessel {

// "avx512", "avx2" or "scalar": the variant in use.
std::string cpu_kernels_isa();
// Every variant this build carries that this CPU can run, the preferred first.
std::vector<std::string> runnable_cpu_kernel_isas();
// True when the library was built with TESSEL_NATIVE (-march=native).
bool cpu_kernels_native_build();

}  // namespace tessel
