// merge_attention_states on the CPU: the max-shifted combination (docs/architecture.md, LSE), row by row.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/attention_cpu.h"
#include "tessel/core/parallel.h"

namespace tessel::cpu {
namespace {

float load(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  const int64_t off = b * t.stride(0) + s * t.stride(1) + h * t.stride(2) + d;
  switch (t.dtype()) {
    case DType::kF32: return t.data_as<const float>()[off];
    case DType::kF16: return to_float(t.data_as<const Half>()[off]);
    default: return to_float(t.data_as<const BFloat16>()[off]);
  }
}

void store(const TensorView& t, int64_t b, int64_t s, int64_t h, int64_t d, float x) {
  const int64_t off = b * t.stride(0) + s * t.stride(1) + h * t.stride(2) + d;
  switch (t.dtype()) {
    case DType::kF32: t.data_as<float>()[off] = x; return;
    case DType::kF16: t.data_as<Half>()[off] = from_float<Half>(x); return;
    default: t.data_as<BFloat16>()[off] = from_float<BFloat16>(x); return;
  }
}

}  // namespace

void merge_attention_states(const ExecContext& ctx, const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                            const TensorView& lse_b, const TensorView& out, const TensorView& lse) {
  const int64_t batch = out_a.size(0), seq = out_a.size(1), heads = out_a.size(2), dim = out_a.size(3);
  const float* la = lse_a.data_as<const float>();
  const float* lb = lse_b.data_as<const float>();
  float* lo = lse.data_as<float>();
  parallel_for(ctx.threads(), batch * seq, [&](int64_t bs, int) {
    const int64_t b = bs / seq, s = bs % seq;
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t li = (b * heads + h) * seq + s;
      // Read everything first: out/lse may alias a or b.
      const float a = la[li], c = lb[li];
      const float m = std::max(a, c);
      if (m == -std::numeric_limits<float>::infinity()) {  // neither part saw a key
        for (int64_t d = 0; d < dim; ++d) store(out, b, s, h, d, 0.0f);
        lo[li] = m;
        continue;
      }
      const float wa = std::exp(a - m), wb = std::exp(c - m), inv = 1.0f / (wa + wb);
      for (int64_t d = 0; d < dim; ++d) {
        // A side with zero weight contributes nothing, even if its (unused) output is NaN.
        const float xa = wa > 0.0f ? wa * load(out_a, b, s, h, d) : 0.0f;
        const float xb = wb > 0.0f ? wb * load(out_b, b, s, h, d) : 0.0f;
        row[static_cast<size_t>(d)] = (xa + xb) * inv;
      }
      for (int64_t d = 0; d < dim; ++d) store(out, b, s, h, d, row[static_cast<size_t>(d)]);
      lo[li] = m + std::log(wa + wb);
    }
  });
}

}  // namespace tessel::cpu
