// Helpers for the GPU attention tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/kernels/block_mask_view.h"
#include "tessel/kernels/reference.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tessel::gpu_test {

// A compute capability 9.0 device: the one that runs the Hopper kernel (head dims 96, 192, 256 and
// the FP8 mode; the GPU test binaries carry sm_90a code for it).
inline bool hopper_device() {
#ifdef TESSEL_WITH_CUDA
  int device = 0, major = 0, minor = 0, count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
         minor == 0;
#else
  return false;
#endif
}

// Forces a kernel variant of `precision` on the first GPU for the scope; lifts it afterwards even
// when a check fails.
struct ForcedVariant {
  ForcedVariant(int64_t dim, const std::string& name, AttentionPrecision precision = AttentionPrecision::kInput)
      : dim(dim), precision(precision) {
    force_attention_kernel_variant(Device::cuda(), dim, name, precision);
  }
  ~ForcedVariant() { force_attention_kernel_variant(Device::cuda(), dim, "", precision); }
  ForcedVariant(const ForcedVariant&) = delete;
  ForcedVariant& operator=(const ForcedVariant&) = delete;
  int64_t dim;
  AttentionPrecision precision;
};

// Runs `call` and expects a tessel::Error whose message names `argument`.
inline void expect_error_naming(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "expected tessel::Error naming " << argument;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << e.what();
  }
}

// True when the CPU mask keeps the kv block of key j for query i of (batch, q head h).
inline bool mask_keeps(const BlockMaskView& mask, int64_t heads, int64_t kv_heads, int64_t b, int64_t h, int64_t i,
                       int64_t j) {
  const int64_t row = mask.row(b, mask.mask_head_for(h, heads, kv_heads), i / mask.block_q);
  const int32_t* begin = mask.indices + mask.indptr[row];
  const int32_t* end = mask.indices + mask.indptr[row + 1];
  return std::binary_search(begin, end, static_cast<int32_t>(j / mask.block_kv));
}

// Max |a.out - b.out| over two results of the same rows (the plain-dtype baseline's error).
inline double max_out_difference(const reference::AttentionResult& a, const reference::AttentionResult& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.out.size(); ++i) e = std::max(e, std::abs(a.out[i] - b.out[i]));
  return e;
}

}  // namespace tessel::gpu_test
