#include "tessel/dit/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessel/core/cpu_features.h"

namespace tessel::dit {
namespace {

// The GEMM's register tile: 4 rows x 16 columns of y (eight 8-float accumulators), over chunks of
// kDepth steps of k so that a 16-column strip of w_t (16 KiB) stays in L1 across row tiles.
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileCols = 16;
constexpr int64_t kDepth = 256;
// Below this many scalar operations a loop runs on the calling thread: waking a team costs more
// than the work, and far more when the cores are shared with other processes.
constexpr int64_t kParallelMinWork = 1 << 16;

// Eight floats in one vector: one AVX register where the function's target has AVX.
using Vec8 = float __attribute__((vector_size(32)));

// y[r0 : r0 + 4, c0 : c0 + 16] += x[r0 : r0 + 4, k0 : k1] · w_t[k0 : k1, c0 : c0 + 16]. Inlined
// into one function per instruction set below; vectors move through memcpy (unaligned rows).
[[gnu::always_inline]] inline void tile_body(const float* x, int64_t k, const float* w_t, int64_t n, float* y, int64_t r0,
                                             int64_t c0, int64_t k0, int64_t k1) {
  Vec8 acc[kTileRows][2];
  for (int64_t r = 0; r < kTileRows; ++r) std::memcpy(acc[r], y + (r0 + r) * n + c0, sizeof acc[r]);
  for (int64_t kk = k0; kk < k1; ++kk) {
    Vec8 w[2];
    std::memcpy(w, w_t + kk * n + c0, sizeof w);
    for (int64_t r = 0; r < kTileRows; ++r) {
      const float a = x[(r0 + r) * k + kk];
      acc[r][0] += a * w[0];
      acc[r][1] += a * w[1];
    }
  }
  for (int64_t r = 0; r < kTileRows; ++r) std::memcpy(y + (r0 + r) * n + c0, acc[r], sizeof acc[r]);
}

using TileFunction = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t);

void tile_baseline(const float* x, int64_t k, const float* w_t, int64_t n, float* y, int64_t r0, int64_t c0, int64_t k0,
                   int64_t k1) {
  tile_body(x, k, w_t, n, y, r0, c0, k0, k1);
}

// The tile is also built for AVX-512 and for AVX2 + FMA, and the widest the CPU has is chosen once
// by feature (not by CPU model, which virtual machines often hide), so a portable build keeps the
// wide vectors.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void tile_avx512(const float* x, int64_t k, const float* w_t, int64_t n,
                                                                        float* y, int64_t r0, int64_t c0, int64_t k0, int64_t k1) {
  tile_body(x, k, w_t, n, y, r0, c0, k0, k1);
}
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t k, const float* w_t, int64_t n, float* y, int64_t r0,
                                                   int64_t c0, int64_t k0, int64_t k1) {
  tile_body(x, k, w_t, n, y, r0, c0, k0, k1);
}
TileFunction widest_tile() { return widest_variant<TileFunction>(tile_baseline, tile_avx2, tile_avx512); }
#else
TileFunction widest_tile() { return tile_baseline; }
#endif

const TileFunction accumulate_tile = widest_tile();

// The same for a partial tile at the bottom or right edge.
void accumulate_edge(const float* x, int64_t k, const float* w_t, int64_t n, float* y, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1, int64_t k0, int64_t k1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t kk = k0; kk < k1; ++kk) {
      const float a = x[r * k + kk];
      for (int64_t c = c0; c < c1; ++c) y[r * n + c] += a * w_t[kk * n + c];
    }
}

double row_mean(const float* x, int64_t dim) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum += x[i];
  return sum / static_cast<double>(dim);
}

// 1 / sqrt(var + eps) of a row whose mean is `mean` (biased variance, as PyTorch's LayerNorm).
double inverse_std(const float* x, int64_t dim, double mean, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) {
    const double d = x[i] - mean;
    sum += d * d;
  }
  return 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
}

}  // namespace

void linear(const ExecContext& ctx, const float* x, int64_t m, int64_t k, const float* w_t, const float* bias, int64_t n,
            float* y) {
  const bool parallel = m * k * n >= kParallelMinWork;
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (parallel)
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = bias ? bias[c] : 0.0f;
  const int64_t strips = (n + kTileCols - 1) / kTileCols, row_blocks = (m + kTileRows - 1) / kTileRows;
  for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
    const int64_t k1 = std::min(k, k0 + kDepth);
    // Consecutive iterations share a column strip, so a thread keeps its strip of w_t in cache
    // while it walks down the rows.
#pragma omp parallel for collapse(2) schedule(static) num_threads(ctx.threads()) if (parallel)
    for (int64_t strip = 0; strip < strips; ++strip) {
      for (int64_t rb = 0; rb < row_blocks; ++rb) {
        const int64_t r0 = rb * kTileRows, c0 = strip * kTileCols;
        if (r0 + kTileRows <= m && c0 + kTileCols <= n)
          accumulate_tile(x, k, w_t, n, y, r0, c0, k0, k1);
        else
          accumulate_edge(x, k, w_t, n, y, r0, std::min(m, r0 + kTileRows), c0, std::min(n, c0 + kTileCols), k0, k1);
      }
    }
  }
}

void layer_norm(const ExecContext& ctx, const float* x, int64_t rows, int64_t dim, double eps, const float* weight,
                const float* bias, float* y) {
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (rows * dim >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * dim;
    float* out = y + r * dim;
    const double mean = row_mean(in, dim);
    const double inv = inverse_std(in, dim, mean, eps);
    for (int64_t i = 0; i < dim; ++i) {
      const double normalized = (in[i] - mean) * inv;
      out[i] = static_cast<float>(weight ? normalized * weight[i] + bias[i] : normalized);
    }
  }
}

void layer_norm_modulate(const ExecContext& ctx, const float* x, int64_t batch, int64_t rows_per_batch, int64_t dim,
                         double eps, const float* shift, const float* scale, int64_t modulation_stride, float* y) {
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (batch * rows_per_batch * dim >= kParallelMinWork)
  for (int64_t r = 0; r < batch * rows_per_batch; ++r) {
    const int64_t b = r / rows_per_batch;
    const float* in = x + r * dim;
    const float* shift_b = shift + b * modulation_stride;
    const float* scale_b = scale + b * modulation_stride;
    float* out = y + r * dim;
    const double mean = row_mean(in, dim);
    const double inv = inverse_std(in, dim, mean, eps);
    for (int64_t i = 0; i < dim; ++i)
      out[i] = static_cast<float>((in[i] - mean) * inv * (1.0 + scale_b[i]) + shift_b[i]);
  }
}

void rms_norm(const ExecContext& ctx, float* x, int64_t rows, int64_t dim, double eps, const float* weight) {
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (rows * dim >= kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(row[i]) * row[i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<float>(row[i] * inv * weight[i]);
  }
}

void gelu(const ExecContext& ctx, float* x, int64_t count) {
  const float k = 0.7071067811865476f;  // 1 / sqrt(2)
#pragma omp parallel for simd schedule(static) num_threads(ctx.threads()) if (count >= kParallelMinWork)
  for (int64_t i = 0; i < count; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * k));
}

void gelu_tanh(const ExecContext& ctx, float* x, int64_t count) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
#pragma omp parallel for simd schedule(static) num_threads(ctx.threads()) if (count >= kParallelMinWork)
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
  }
}

void silu(const ExecContext& ctx, float* x, int64_t count) {
#pragma omp parallel for simd schedule(static) num_threads(ctx.threads()) if (count >= kParallelMinWork)
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void rotate_pairs(const ExecContext& ctx, float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                  const float* cos, const float* sin) {
  const int64_t pairs = head_dim / 2;
#pragma omp parallel for collapse(2) schedule(static) num_threads(ctx.threads()) if (batch * seq * heads * head_dim >= kParallelMinWork)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const float* c = cos + s * pairs;
      const float* sn = sin + s * pairs;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + ((b * seq + s) * heads + h) * head_dim;
        for (int64_t i = 0; i < pairs; ++i) {
          const float x1 = v[2 * i], x2 = v[2 * i + 1];
          v[2 * i] = x1 * c[i] - x2 * sn[i];
          v[2 * i + 1] = x1 * sn[i] + x2 * c[i];
        }
      }
    }
  }
}

void gated_residual(const ExecContext& ctx, float* x, const float* y, int64_t batch, int64_t rows_per_batch, int64_t dim,
                    const float* gate, int64_t gate_stride) {
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (batch * rows_per_batch * dim >= kParallelMinWork)
  for (int64_t r = 0; r < batch * rows_per_batch; ++r) {
    const float* g = gate ? gate + (r / rows_per_batch) * gate_stride : nullptr;
    float* out = x + r * dim;
    const float* in = y + r * dim;
    if (g) {
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) out[i] += in[i] * g[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) out[i] += in[i];
    }
  }
}

void sinusoidal_embedding(const float* values, int64_t count, int64_t channels, float* out) {
  const int64_t half = channels / 2;
  // The frequencies in fp32 as PyTorch builds them; the angle and its sine in double, then rounded.
  std::vector<float> frequencies(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    frequencies[static_cast<size_t>(i)] =
        std::exp(static_cast<float>(-std::log(10000.0)) * static_cast<float>(i) / static_cast<float>(half));
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(values[t]) * frequencies[static_cast<size_t>(i)];
      out[t * channels + i] = static_cast<float>(std::cos(angle));
      out[t * channels + half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace tessel::dit
