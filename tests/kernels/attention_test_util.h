// Test helpers for the attention kernels: random inputs, the "plain" same-dtype reference whose
// error sets the tolerance (as FlashAttention's tests do), and error measurement against the
// fp64 oracle.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/reference.h"

namespace tessel::testing {

struct Qkv {
  Tensor q, k, v;
};

inline Qkv random_qkv(int64_t batch, int64_t seq_q, int64_t seq_kv, int64_t heads, int64_t kv_heads, int64_t dim,
                      DType dtype, uint64_t seed) {
  Qkv t{Tensor::empty({batch, seq_q, heads, dim}, dtype), Tensor::empty({batch, seq_kv, kv_heads, dim}, dtype),
        Tensor::empty({batch, seq_kv, kv_heads, dim}, dtype)};
  // Normal q/k with unit variance give peaked softmax rows at scale 1/sqrt(D), as real models do.
  fill_normal(t.q.view(), seed * 3 + 1);
  fill_normal(t.k.view(), seed * 3 + 2);
  fill_uniform(t.v.view(), seed * 3 + 3);
  return t;
}

inline double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  if (dtype == DType::kBF16) return bf16_to_float(float_to_bf16(f));
  if (dtype == DType::kF16) return half_to_float(float_to_half(f));
  return f;
}

// The plain attention a framework computes in `dtype`: scores and probabilities rounded to the
// dtype, fp32 accumulation, output rounded. keep(b, h, i, j) restricts keys further (block masks).
template <typename Keep>
reference::AttentionResult plain_attention(const Qkv& t, const AttentionOptions& options, Keep&& keep) {
  const DType dt = t.q.dtype();
  const int64_t batch = t.q.size(0), seq_q = t.q.size(1), heads = t.q.size(2), dim = t.q.size(3);
  const int64_t seq_kv = t.k.size(1), kv_heads = t.k.size(2), group = heads / kv_heads;
  const float scale = attention_scale(options, dim);
  reference::AttentionResult r;
  r.batch = batch;
  r.heads = heads;
  r.head_dim = dim;
  for (int64_t i = 0; i < seq_q; ++i) r.q_rows.push_back(i);
  r.out.assign(static_cast<size_t>(batch * seq_q * heads * dim), 0.0);
  r.lse.assign(static_cast<size_t>(batch * heads * seq_q), -std::numeric_limits<double>::infinity());
  // Exact: every fp16/bf16 value is an fp32 value.
  const Tensor q = t.q.to(DType::kF32), k = t.k.to(DType::kF32), v = t.v.to(DType::kF32);
  auto at = [](const Tensor& x, int64_t b, int64_t s, int64_t h) {
    return x.data_as<const float>() + ((b * x.size(1) + s) * x.size(2) + h) * x.size(3);
  };
  std::vector<float> s(static_cast<size_t>(seq_kv)), p(static_cast<size_t>(seq_kv));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seq_q; ++i) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < seq_kv; ++j) {
          float x = -std::numeric_limits<float>::infinity();
          if (reference::key_visible(i, j, seq_q, seq_kv, options) && keep(b, h, i, j)) {
            const float* qi = at(q, b, i, h);
            const float* kj = at(k, b, j, h / group);
            float acc = 0.0f;
            for (int64_t d = 0; d < dim; ++d) acc += qi[d] * kj[d];
            x = static_cast<float>(round_to(dt, acc * scale));
          }
          s[static_cast<size_t>(j)] = x;
          mx = std::max(mx, x);
        }
        if (mx == -std::numeric_limits<float>::infinity()) continue;
        float sum = 0.0f;
        for (int64_t j = 0; j < seq_kv; ++j) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        for (int64_t j = 0; j < seq_kv; ++j)
          p[static_cast<size_t>(j)] = static_cast<float>(round_to(dt, std::exp(s[static_cast<size_t>(j)] - mx) / sum));
        std::vector<float> acc(static_cast<size_t>(dim), 0.0f);
        for (int64_t j = 0; j < seq_kv; ++j) {
          if (p[static_cast<size_t>(j)] == 0.0f) continue;
          const float* vj = at(v, b, j, h / group);
          for (int64_t d = 0; d < dim; ++d) acc[static_cast<size_t>(d)] += p[static_cast<size_t>(j)] * vj[d];
        }
        for (int64_t d = 0; d < dim; ++d)
          r.out[static_cast<size_t>(((b * seq_q + i) * heads + h) * dim + d)] = round_to(dt, acc[static_cast<size_t>(d)]);
        r.lse[static_cast<size_t>((b * heads + h) * seq_q + i)] = mx + std::log(sum);
      }
  return r;
}

struct Errors {
  double out = 0.0, lse = 0.0;
  bool lse_pattern_ok = true;  // -inf exactly where the reference has -inf
  bool finite = true;          // no NaN left in out (outputs are poisoned before each run)
};

// Max abs errors of (out tensor, lse tensor or empty) against a reference over its rows.
inline Errors compare(const TensorView& out, const TensorView& lse, const reference::AttentionResult& ref) {
  Errors e;
  const int64_t seq_q = out.size(1), heads = out.size(2), dim = out.size(3);
  for (int64_t b = 0; b < ref.batch; ++b)
    for (int64_t r = 0; r < ref.rows(); ++r) {
      const int64_t i = ref.q_rows[static_cast<size_t>(r)];
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < dim; ++d) {
          const double got = element_as_double(out, ((b * seq_q + i) * heads + h) * dim + d);
          if (!std::isfinite(got)) e.finite = false;
          e.out = std::max(e.out, std::abs(got - ref.out_at(b, r, h, d)));
        }
        if (lse.empty()) continue;
        const double got = element_as_double(lse, (b * heads + h) * seq_q + i), want = ref.lse_at(b, h, r);
        if (std::isinf(want) || std::isinf(got)) {
          if (got != want) e.lse_pattern_ok = false;
        } else {
          e.lse = std::max(e.lse, std::abs(got - want));
        }
      }
    }
  return e;
}

// Absolute slack added to 2x the plain reference's error: a few ulps of the output dtype, so an
// fp32 comparison does not demand bit-identical summation order.
inline double error_floor(DType dtype) { return dtype == DType::kF32 ? 2e-6 : dtype == DType::kF16 ? 2e-4 : 2e-3; }
inline double lse_floor(DType dtype) { return dtype == DType::kF32 ? 1e-5 : 1e-3; }

inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  fill(t.view(), std::numeric_limits<double>::quiet_NaN());
  return t;
}

// The tolerance rule of every kernel test: the kernel's (out, lse) may be at most twice as far from
// the fp64 result `exact` as the plain same-dtype reference (plus a few ulps), with no NaN left and
// -inf lse exactly on the rows with no key. keep() is the block mask (always true when dense).
template <typename Keep>
void expect_close_to_reference(const Qkv& t, const AttentionOptions& options, Keep&& keep, const TensorView& out,
                               const TensorView& lse, const reference::AttentionResult& exact) {
  const DType dtype = t.q.dtype();
  const auto plain_ref = plain_attention(t, options, keep);
  Tensor plain_out = Tensor::empty(t.q.shape(), DType::kF64);
  Tensor plain_lse = Tensor::empty({t.q.size(0), t.q.size(2), t.q.size(1)}, DType::kF64);
  std::copy(plain_ref.out.begin(), plain_ref.out.end(), plain_out.data_as<double>());
  std::copy(plain_ref.lse.begin(), plain_ref.lse.end(), plain_lse.data_as<double>());
  const auto base = compare(plain_out, plain_lse, exact);
  const auto got = compare(out, lse, exact);
  EXPECT_TRUE(got.finite) << "NaN left in the output";
  EXPECT_TRUE(got.lse_pattern_ok) << "lse -inf pattern differs from the reference";
  EXPECT_LE(got.out, 2 * base.out + error_floor(dtype)) << "plain reference error " << base.out;
  EXPECT_LE(got.lse, 2 * base.lse + lse_floor(dtype)) << "plain reference lse error " << base.lse;
}

}  // namespace tessel::testing
