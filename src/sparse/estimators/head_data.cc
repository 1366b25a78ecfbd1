#include "head_data.h"

#include <algorithm>

#include "tessel/core/error.h"

namespace tessel::estimators {

void check_qk(const TensorView& q, const TensorView& k, const std::string& who) {
  check_rank(q, 4, who + " q");
  check_rank(k, 4, who + " k");
  check_device(q, Device::cpu(), who + " q");
  check_device(k, Device::cpu(), who + " k");
  for (const TensorView* t : {&q, &k}) {
    const DType d = t->dtype();
    if (d != DType::kF32 && d != DType::kF16 && d != DType::kBF16)
      fail_argument(who + (t == &q ? " q" : " k"), "dtype fp32, fp16 or bf16", dtype_name(d));
  }
  if (k.size(0) != q.size(0)) fail_argument(who + " k batch", q.size(0), k.size(0));
  if (k.size(3) != q.size(3)) fail_argument(who + " k head_dim", q.size(3), k.size(3));
  if (k.size(2) < 1 || q.size(2) % k.size(2) != 0)
    fail_argument(who + " k heads", detail::concat("a divisor of ", q.size(2)), k.size(2));
  if (q.size(1) < 1 || k.size(1) < 1 || q.size(3) < 1)
    fail_argument(who + " q/k", "non-empty sequences and head_dim", q.describe() + " / " + k.describe());
}

namespace {

template <typename T>
void copy_rows(const TensorView& x, int64_t b, int64_t h, int64_t rows, float* out) {
  const T* base = x.data_as<T>() + b * x.stride(0) + h * x.stride(2);
  const int64_t dim = x.size(3), s1 = x.stride(1), s3 = x.stride(3);
  for (int64_t s = 0; s < rows; ++s)
    for (int64_t d = 0; d < dim; ++d) out[s * dim + d] = to_float(base[s * s1 + d * s3]);
}

}  // namespace

std::vector<float> head_rows(const TensorView& x, int64_t b, int64_t h, int64_t rows) {
  const int64_t dim = x.size(3), present = std::min(rows, x.size(1));
  std::vector<float> out(static_cast<size_t>(rows * dim), 0.0f);
  switch (x.dtype()) {
    case DType::kF32: copy_rows<float>(x, b, h, present, out.data()); break;
    case DType::kF16: copy_rows<Half>(x, b, h, present, out.data()); break;
    case DType::kBF16: copy_rows<BFloat16>(x, b, h, present, out.data()); break;
    default: fail_argument("estimator input dtype", "fp32, fp16 or bf16", dtype_name(x.dtype()));
  }
  return out;
}

}  // namespace tessel::estimators
