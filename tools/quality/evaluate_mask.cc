#include "quality/evaluate_mask.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"

namespace tessel {

double median_ms(int repeats, const std::function<void()>& fn) {
  std::vector<double> times;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

MaskEvaluation evaluate_mask(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dense_out,
                             const BlockMask& mask, const TokenPermutation* permutation, int repeats) {
  check_shape(dense_out, q.shape(), "dense_out");
  MaskEvaluation e;
  e.density = mask.density();
  Tensor out = Tensor::empty(q.shape(), q.dtype());
  if (permutation != nullptr && !permutation->order.empty()) {
    Tensor qp = Tensor::empty(q.shape(), q.dtype()), kp = Tensor::empty(k.shape(), k.dtype()), vp = Tensor::empty(v.shape(), v.dtype()),
           op = Tensor::empty(q.shape(), q.dtype());
    e.attn_ms = median_ms(repeats, [&] {
      permute_tokens(q, qp.view(), *permutation);
      permute_tokens(k, kp.view(), *permutation);
      permute_tokens(v, vp.view(), *permutation);
      block_sparse_attention_forward(ctx, qp.view(), kp.view(), vp.view(), mask.view(), op.view(), TensorView{});
      unpermute_tokens(op.view(), out.view(), *permutation);
    });
  } else {
    e.attn_ms = median_ms(repeats, [&] { block_sparse_attention_forward(ctx, q, k, v, mask.view(), out.view(), TensorView{}); });
  }
  e.error = compare_outputs(out.view(), dense_out);
  return e;
}

}  // namespace tessel
