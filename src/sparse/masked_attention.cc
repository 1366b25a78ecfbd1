// Dense attention with an explicit boolean mask: the path SparseAttention takes when a caller
// passes attn_mask (bypass with a logged warning; docs/sparse_attention.md). Plain fp32/fp64 loops: it is a
// fallback, not a fast path.
#include <cmath>
#include <limits>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {
namespace {

Tensor to_f32_contiguous(const TensorView& view) {
  Tensor out = Tensor::empty(view.shape(), DType::kF32);
  copy_convert(view, out);
  return out;
}

}  // namespace

void masked_attention_forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& mask,
                              const TensorView& out, const TensorView& lse, float scale) {
  const AttentionShape shape = AttentionShape::of(q, k, v);
  check_device(q, Device::cpu(), "q (masked attention)");
  if (!is_floating(q.dtype())) fail_argument("q dtype", "fp32, fp16 or bf16", dtype_name(q.dtype()));
  check_shape(out, q.shape(), "out");
  check_dtype(out, q.dtype(), "out");
  check_device(out, Device::cpu(), "out");
  if (!lse.empty()) {
    check_shape(lse, {shape.batch, shape.num_qo_heads, shape.seq_q}, "lse");
    check_dtype(lse, DType::kF32, "lse");
    check_device(lse, Device::cpu(), "lse");
  }
  check_dtype(mask, DType::kU8, "attn_mask");
  check_device(mask, Device::cpu(), "attn_mask");
  const bool key_padding = mask.dim() == 2;
  if (key_padding) {
    check_shape(mask, {shape.batch, shape.seq_kv}, "attn_mask");
  } else {
    check_rank(mask, 4, "attn_mask");
    if ((mask.size(0) != 1 && mask.size(0) != shape.batch) || (mask.size(1) != 1 && mask.size(1) != shape.num_qo_heads) ||
        mask.size(2) != shape.seq_q || mask.size(3) != shape.seq_kv)
      fail_argument("attn_mask", detail::concat("(B, S_kv) or (1|", shape.batch, ", 1|", shape.num_qo_heads, ", ",
                                                shape.seq_q, ", ", shape.seq_kv, ")"),
                    shape_str(mask.shape()));
  }

  const Tensor qf = to_f32_contiguous(q), kf = to_f32_contiguous(k), vf = to_f32_contiguous(v);
  const Tensor of = Tensor::zeros(q.shape(), DType::kF32);
  const Tensor lf = Tensor::empty({shape.batch, shape.num_qo_heads, shape.seq_q}, DType::kF32);
  const float* qp = qf.data_as<float>();
  const float* kp = kf.data_as<float>();
  const float* vp = vf.data_as<float>();
  float* op = of.data_as<float>();
  float* lp = lf.data_as<float>();
  const auto* mp = mask.data_as<const uint8_t>();
  const int64_t B = shape.batch, Sq = shape.seq_q, Skv = shape.seq_kv, Hq = shape.num_qo_heads,
                Hkv = shape.num_kv_heads, D = shape.head_dim, group = Hq / Hkv;
  const double s = scale != 0.0f ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  const auto allowed = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (key_padding) return mp[b * mask.stride(0) + j * mask.stride(1)] != 0;
    const int64_t mb = mask.size(0) == 1 ? 0 : b, mh = mask.size(1) == 1 ? 0 : h;
    return mp[mb * mask.stride(0) + mh * mask.stride(1) + i * mask.stride(2) + j * mask.stride(3)] != 0;
  };

  parallel_for(ctx.threads(), B * Hq, [&](int64_t bh, int) {
    const int64_t b = bh / Hq, h = bh % Hq, hk = h / group;
    std::vector<double> scores(static_cast<size_t>(Skv));
    for (int64_t i = 0; i < Sq; ++i) {
      const float* qi = qp + ((b * Sq + i) * Hq + h) * D;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Skv; ++j) {
        if (!allowed(b, h, i, j)) {
          scores[static_cast<size_t>(j)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const float* kj = kp + ((b * Skv + j) * Hkv + hk) * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
        scores[static_cast<size_t>(j)] = dot * s;
        max_score = std::max(max_score, dot * s);
      }
      float* oi = op + ((b * Sq + i) * Hq + h) * D;
      if (max_score == -std::numeric_limits<double>::infinity()) {
        lp[(b * Hq + h) * Sq + i] = -std::numeric_limits<float>::infinity();
        continue;  // no key: output stays 0
      }
      double sum = 0.0;
      std::vector<double> acc(static_cast<size_t>(D), 0.0);
      for (int64_t j = 0; j < Skv; ++j) {
        const double score = scores[static_cast<size_t>(j)];
        if (score == -std::numeric_limits<double>::infinity()) continue;
        const double w = std::exp(score - max_score);
        sum += w;
        const float* vj = vp + ((b * Skv + j) * Hkv + hk) * D;
        for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += w * vj[d];
      }
      for (int64_t d = 0; d < D; ++d) oi[d] = static_cast<float>(acc[static_cast<size_t>(d)] / sum);
      lp[(b * Hq + h) * Sq + i] = static_cast<float>(max_score + std::log(sum));
    }
  });
  copy_convert(of, out);
  if (!lse.empty()) copy_convert(lf, lse);
}

}  // namespace tessel
