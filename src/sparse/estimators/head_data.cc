#include "head_data.h"

#include <algorithm>
#include <cstring>

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

Tensor to_contiguous_f32(const TensorView& x) {
  Tensor out = Tensor::empty(x.shape(), DType::kF32);
  copy_convert(x, out.view());
  return out;
}

std::vector<float> head_rows(const Tensor& x, int64_t b, int64_t h, int64_t rows) {
  const int64_t seq = x.size(1), heads = x.size(2), dim = x.size(3);
  std::vector<float> out(static_cast<size_t>(rows * dim), 0.0f);
  const float* base = x.data_as<float>();
  for (int64_t s = 0; s < std::min(rows, seq); ++s)
    std::memcpy(out.data() + s * dim, base + ((b * seq + s) * heads + h) * dim, sizeof(float) * dim);
  return out;
}

}  // namespace tessel::estimators
