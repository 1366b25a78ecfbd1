// The device XAttention block masses (one-pass kernel: per-block log-sum-exp in the GEMM epilogue,
// then row normalization) against an fp64 oracle computed from the same bf16 inputs, including
// partially valid kv blocks (kv_valid_groups, as an offloaded KV cache has) and zero-filled tail
// groups. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"

#ifdef TESSEL_WITH_CUDA
#include "kernels/cuda/stream.h"
#include "kernels/cuda/xattention_estimation.h"
#endif

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

struct MassCase {
  int seq_q, seq_kv, heads, kv_heads, dim, stride, block_q, block_kv;
  std::vector<int32_t> valid_groups;  // empty: every group of every block is scored
};

// mass[h][qb][c] in fp64 from the bf16 values the kernel reads.
std::vector<double> oracle_mass(const MassCase& c, const std::vector<float>& q, const std::vector<float>& k, double scale) {
  const int s = c.stride, gq = (c.seq_q + s - 1) / s, gk = (c.seq_kv + s - 1) / s;
  const int qb = (c.seq_q + c.block_q - 1) / c.block_q, kb = (c.seq_kv + c.block_kv - 1) / c.block_kv;
  const int per_block = c.block_kv / s;
  std::vector<double> mass(static_cast<size_t>(c.heads) * qb * kb, 0.0);
  std::vector<double> row(static_cast<size_t>(gk));
  for (int h = 0; h < c.heads; ++h) {
    const int hk = h / (c.heads / c.kv_heads);
    for (int g = 0; g < gq; ++g) {
      double peak = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < gk; ++j) {
        const bool valid = c.valid_groups.empty() || j % per_block < c.valid_groups[static_cast<size_t>(j / per_block)];
        if (!valid) {
          row[static_cast<size_t>(j)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0.0;
        for (int i = 0; i < s; ++i) {
          const int tq = g * s + s - 1 - i, tk = j * s + i;
          if (tq >= c.seq_q || tk >= c.seq_kv) continue;  // zero-filled tokens of a tail group
          for (int d = 0; d < c.dim; ++d)
            dot += static_cast<double>(q[(static_cast<size_t>(tq) * c.heads + h) * c.dim + d]) *
                   k[(static_cast<size_t>(tk) * c.kv_heads + hk) * c.dim + d];
        }
        row[static_cast<size_t>(j)] = dot * scale;
        peak = std::max(peak, row[static_cast<size_t>(j)]);
      }
      double total = 0.0;
      for (double& x : row) total += (x = std::exp(x - peak));
      for (int j = 0; j < gk; ++j)
        mass[(static_cast<size_t>(h) * qb + g * s / c.block_q) * kb + j * s / c.block_kv] += row[static_cast<size_t>(j)] / total;
    }
  }
  return mass;
}

TEST(XAttentionBlockMassGpu, MatchesTheFp64Oracle) {
  SKIP_WITHOUT_GPU();
#ifdef TESSEL_WITH_CUDA
  const std::vector<MassCase> cases = {
      {700, 1500, 4, 2, 128, 8, 128, 128, {}},                 // tail groups zero-filled, GQA
      {1500, 1100, 2, 2, 128, 16, 128, 128, {8, 3, 8, 8, 5, 8, 8, 8, 1}},  // partial blocks
      {300, 900, 2, 1, 64, 16, 64, 64, {}},                    // 4 groups per block (units of 4)
      {1024, 3072, 2, 1, 128, 8, 1024, 1024, {128, 50, 128}},  // the KV policy's shape: one block per tile
      {333, 777, 3, 3, 64, 4, 128, 128, {}},                   // 32 groups per block
  };
  uint64_t seed = 71;
  for (const MassCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "S=" << c.seq_q << "/" << c.seq_kv << " D=" << c.dim << " stride " << c.stride
                                      << " blocks " << c.block_q << "x" << c.block_kv);
    Tensor q = Tensor::empty({1, c.seq_q, c.heads, c.dim}, DType::kF32);
    Tensor k = Tensor::empty({1, c.seq_kv, c.kv_heads, c.dim}, DType::kF32);
    fill_normal(q.view(), seed++, 0.0, 1.5);
    fill_normal(k.view(), seed++, 0.0, 1.5);
    const Tensor q16 = q.to(DType::kBF16), k16 = k.to(DType::kBF16);
    const Tensor qf = q16.to(DType::kF32), kf = k16.to(DType::kF32);  // what the kernel sees
    const std::vector<float> qv(qf.data_as<const float>(), qf.data_as<const float>() + qf.numel());
    const std::vector<float> kv(kf.data_as<const float>(), kf.data_as<const float>() + kf.numel());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim)) / c.stride;
    const std::vector<double> want = oracle_mass(c, qv, kv, scale);

    const Tensor qd = q16.to(Device::cuda()), kd = k16.to(Device::cuda());
    cuda::detail::XAttentionParams p{};
    p.q = qd.data();
    p.k = kd.data();
    p.q_stride_b = qd.view().stride(0), p.q_stride_s = qd.view().stride(1), p.q_stride_h = qd.view().stride(2);
    p.k_stride_b = kd.view().stride(0), p.k_stride_s = kd.view().stride(1), p.k_stride_h = kd.view().stride(2);
    p.batch = 1, p.seq_q = c.seq_q, p.seq_kv = c.seq_kv, p.heads_q = c.heads, p.heads_kv = c.kv_heads;
    p.dim = c.dim, p.stride = c.stride;
    p.groups_q = (c.seq_q + c.stride - 1) / c.stride, p.groups_kv = (c.seq_kv + c.stride - 1) / c.stride;
    p.block_q = c.block_q, p.block_kv = c.block_kv;
    p.q_blocks = (c.seq_q + c.block_q - 1) / c.block_q, p.kv_blocks = (c.seq_kv + c.block_kv - 1) / c.block_kv;
    p.logit_scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    Tensor valid_device;
    if (!c.valid_groups.empty()) {
      ASSERT_EQ(static_cast<int>(c.valid_groups.size()), p.kv_blocks);
      Tensor valid = Tensor::empty({p.kv_blocks}, DType::kI32);
      std::copy(c.valid_groups.begin(), c.valid_groups.end(), valid.data_as<int32_t>());
      valid_device = valid.to(Device::cuda());
      p.kv_valid_groups = valid_device.data_as<const int32_t>();
    }
    Tensor workspace = Tensor::empty({cuda::detail::xattention_block_lse_floats(p)}, DType::kF32, Device::cuda());
    Tensor poisoned = Tensor::empty({static_cast<int64_t>(want.size())}, DType::kF32);
    std::fill_n(poisoned.data_as<float>(), want.size(), std::numeric_limits<float>::quiet_NaN());
    Tensor mass = poisoned.to(Device::cuda());
    p.block_lse2 = workspace.data_as<float>();
    p.mass = mass.data_as<float>();
    cuda::detail::launch_xattention_block_mass(p, DType::kBF16, cuda::current_stream());
    const Tensor got = mass.to(Device::cpu());
    const float* g = got.data_as<const float>();
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(g[i])) << "mass " << i << " not written";
      worst = std::max(worst, std::abs(g[i] - want[i]));
    }
    // fp32 accumulation of bf16 products and ex2.approx against fp64: masses are sums of up to
    // block_q / stride row probabilities, each off by ~1e-6 relative.
    EXPECT_LT(worst, 2e-4) << "largest |mass - fp64 oracle|";
  }
#endif
}

}  // namespace
}  // namespace tessel
