// head_error_sums: argument checks, the CPU sums, and the device launch with its host total.
#include "tessel/kernels/head_error_sums.h"

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/head_error_sums.h"
#include "tessel/kernels/cuda/launch_check.h"
#endif

namespace tessel {
namespace {

void check_operands(const TensorView& approx, const TensorView& reference) {
  for (const auto& [t, name] : {std::pair{&approx, "approx"}, std::pair{&reference, "reference"}}) {
    if (t->dim() != 4 || !t->is_contiguous()) fail_argument(name, "a contiguous (B, S, H, D) tensor", t->describe());
    const DType d = t->dtype();
    const bool dtype_ok = t->device().is_cpu() ? d == DType::kF32 : (d == DType::kF32 || d == DType::kBF16 || d == DType::kF16);
    if (!dtype_ok) fail_argument(name, "fp32 on the CPU, or fp32, bf16 or fp16 on CUDA", t->describe());
  }
  if (approx.shape() != reference.shape())
    fail_argument("reference", detail::concat("the shape of approx (", approx.describe(), ")"), reference.describe());
  if (approx.device() != reference.device())
    fail_argument("reference", detail::concat("the device of approx (", approx.device().str(), ")"), reference.device().str());
}

HeadErrorSums sums_on_cpu(const ExecContext& ctx, const TensorView& approx, const TensorView& reference) {
  const int64_t heads = reference.size(2), dim = reference.size(3), rows = reference.size(0) * reference.size(1);
  HeadErrorSums s{std::vector<double>(heads), std::vector<double>(heads), std::vector<double>(heads), std::vector<double>(heads)};
  const float* a = approx.data_as<const float>();
  const float* r = reference.data_as<const float>();
  parallel_for(ctx.threads(), heads, [&](int64_t h, int) {
    double sum_diff = 0.0, sum_ref = 0.0, sum_app = 0.0, sum_dot = 0.0;
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t d = 0; d < dim; ++d) {
        const size_t i = static_cast<size_t>((row * heads + h) * dim + d);
        const double x = a[i], y = r[i];
        sum_diff += (x - y) * (x - y);
        sum_ref += y * y;
        sum_app += x * x;
        sum_dot += x * y;
      }
    s.diff[h] = sum_diff, s.reference[h] = sum_ref, s.approx[h] = sum_app, s.dot[h] = sum_dot;
  });
  return s;
}

#ifdef TESSEL_WITH_CUDA
HeadErrorSums sums_on_cuda(const ExecContext& ctx, const TensorView& approx, const TensorView& reference) {
  const int64_t heads = reference.size(2), rows = reference.size(0) * reference.size(1);
  cuda::detail::HeadErrorSumsParams p{};
  p.approx = approx.data();
  p.reference = reference.data();
  p.approx_dtype = approx.dtype();
  p.reference_dtype = reference.dtype();
  p.rows = rows;
  p.heads = heads;
  p.head_dim = reference.size(3);
  p.chunks = cuda::detail::head_error_sums_chunks(rows);
  const int64_t count = heads * p.chunks * 4;
  Tensor partial = Tensor::empty({count}, DType::kF64, reference.device());
  p.partial = partial.data_as<double>();
  cuda::detail::launch_head_error_sums(p, ctx.stream);
  cuda::check_launch("head_error_sums");
  std::vector<double> host(static_cast<size_t>(count));
  cudaError_t status = cudaMemcpyAsync(host.data(), p.partial, host.size() * sizeof(double), cudaMemcpyDeviceToHost, ctx.stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(ctx.stream);
  if (status != cudaSuccess) throw Error(detail::concat("head_error_sums: copy of the partial sums: ", cudaGetErrorString(status)));
  HeadErrorSums s{std::vector<double>(heads), std::vector<double>(heads), std::vector<double>(heads), std::vector<double>(heads)};
  for (int64_t h = 0; h < heads; ++h)
    for (int chunk = 0; chunk < p.chunks; ++chunk) {
      const double* part = host.data() + (h * p.chunks + chunk) * 4;
      s.diff[h] += part[0], s.reference[h] += part[1], s.approx[h] += part[2], s.dot[h] += part[3];
    }
  return s;
}
#endif

}  // namespace

HeadErrorSums head_error_sums(const ExecContext& ctx, const TensorView& approx, const TensorView& reference) {
  check_operands(approx, reference);
  if (approx.device().is_cpu()) return sums_on_cpu(ctx, approx, reference);
#ifdef TESSEL_WITH_CUDA
  return sums_on_cuda(ctx, approx, reference);
#else
  fail_argument("approx.device", "cpu (tessel was built without CUDA)", approx.device().str());
#endif
}

}  // namespace tessel
