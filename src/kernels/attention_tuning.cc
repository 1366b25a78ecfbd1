// Public entry points of attention_tuning.h: the CPU has one kernel per call and nothing to tune;
// CUDA devices go to tessel::cuda (cuda/attention_tuning_cuda.cc) when built with CUDA.
#include "tessel/kernels/attention_tuning.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "tessel/core/error.h"
#ifdef TESSEL_WITH_CUDA
#include "cuda/attention_tuning_cuda.h"
#endif

namespace tessel {

AttentionTuning tune_attention(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options) {
#ifdef TESSEL_WITH_CUDA
  if (device.is_cuda()) return cuda::tune_attention(ctx, device, dtype, dims, options);
#endif
  (void)ctx, (void)dtype, (void)dims, (void)options;
  if (device.is_cuda()) fail_argument("device", "cpu (tessel was built without CUDA)", device.str());
  return {};
}

namespace {

std::atomic<bool>& tuning_switch() {  // the library reads no environment: apps set it
  static std::atomic<bool> state{false};
  return state;
}

}  // namespace

bool attention_tuning_enabled() { return tuning_switch().load(); }

void set_attention_tuning_enabled(bool enabled) { tuning_switch().store(enabled); }

void tune_attention_if_enabled(const ExecContext& ctx, Device device, DType dtype, const AttentionDims& dims,
                               const AttentionTuneOptions& options) {
  if (!device.is_cuda() || (dtype != DType::kBF16 && dtype != DType::kF16) || !attention_tuning_enabled()) return;
#ifdef TESSEL_WITH_CUDA
  cuda::tune_attention_unless_capturing(ctx, device, dtype, dims, options);
#else
  (void)ctx, (void)dims, (void)options;
#endif
}

std::vector<std::string> attention_kernel_variants(Device device, int64_t head_dim, AttentionPrecision precision) {
#ifdef TESSEL_WITH_CUDA
  if (device.is_cuda()) return cuda::attention_kernel_variants(device, head_dim, precision);
#endif
  (void)device, (void)head_dim, (void)precision;
  return {};
}

void force_attention_kernel_variant(Device device, int64_t head_dim, const std::string& variant,
                                    AttentionPrecision precision) {
#ifdef TESSEL_WITH_CUDA
  if (device.is_cuda()) return cuda::force_attention_kernel_variant(device, head_dim, variant, precision);
#endif
  (void)head_dim, (void)variant, (void)precision;
  fail_argument("device", "a CUDA device (the CPU has no kernel variants)", device.str());
}

void clear_attention_tuning() {
#ifdef TESSEL_WITH_CUDA
  cuda::clear_attention_tuning();
#endif
}

}  // namespace tessel
