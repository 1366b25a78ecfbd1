// The device XAttention block masses (one-pass kernel: per-block log-sum-exp in the GEMM epilogue,
// then row normalization) against an fp64 oracle computed from the same bf16 inputs, including
// partially valid kv blocks (kv_valid_groups, as an offloaded KV cache has) and zero-filled tail
// groups. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"

#ifdef TESSEL_WITH_CUDA
#include "tessel/kernels/cuda/xattention_estimation.h"
#include "cuda/xattention_scores_wgmma.h"
#endif

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

struct MassCase {
  int seq_q, seq_kv, heads, kv_heads, dim, stride, block_q, block_kv;
  std::vector<int32_t> valid_groups;  // empty: every group of every block is scored
  DType dtype = DType::kBF16;
};

#ifdef TESSEL_WITH_CUDA
// Every score GEMM this device can run: mma.sync always, the wgmma shapes on sm_90a builds for
// compute capability 9.0.
std::vector<cuda::detail::XAttentionGemm> runnable_gemms() {
  using cuda::detail::XAttentionGemm;
  std::vector<XAttentionGemm> gemms{XAttentionGemm::kMmaSync};
  if (cuda::detail::xattention_wgmma_supported()) {
    gemms.push_back(XAttentionGemm::kWgmma128);
    gemms.push_back(XAttentionGemm::kWgmma256);
  }
  return gemms;
}

const char* gemm_name(cuda::detail::XAttentionGemm gemm) {
  switch (gemm) {
    case cuda::detail::XAttentionGemm::kMmaSync: return "mma.sync";
    case cuda::detail::XAttentionGemm::kWgmma128: return "wgmma 128x128";
    case cuda::detail::XAttentionGemm::kWgmma256: return "wgmma 128x256";
    default: return "auto";
  }
}

// Params for q (B=1, S_q, H, D) and k on the device, the case's geometry and the scale.
cuda::detail::XAttentionParams mass_params(const MassCase& c, const Tensor& qd, const Tensor& kd, double scale) {
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
  return p;
}

Tensor nan_filled_device(int64_t n) {
  Tensor poisoned = Tensor::empty({n}, DType::kF32);
  std::fill_n(poisoned.data_as<float>(), n, std::numeric_limits<float>::quiet_NaN());
  return poisoned.to(Device::cuda());
}
#endif

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
      {2100, 4500, 2, 1, 128, 16, 128, 128, {}, DType::kF16},  // fp16, several row and column tiles
      {4096, 4096, 1, 1, 64, 2, 64, 64, {}},                   // stride 2: 2048 x 2048 groups, units of 4
  };
  uint64_t seed = 71;
  for (const MassCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "S=" << c.seq_q << "/" << c.seq_kv << " D=" << c.dim << " stride " << c.stride
                                      << " blocks " << c.block_q << "x" << c.block_kv);
    Tensor q = Tensor::empty({1, c.seq_q, c.heads, c.dim}, DType::kF32);
    Tensor k = Tensor::empty({1, c.seq_kv, c.kv_heads, c.dim}, DType::kF32);
    fill_normal(q.view(), seed++, 0.0, 1.5);
    fill_normal(k.view(), seed++, 0.0, 1.5);
    const Tensor q16 = q.to(c.dtype), k16 = k.to(c.dtype);
    const Tensor qf = q16.to(DType::kF32), kf = k16.to(DType::kF32);  // what the kernel sees
    const std::vector<float> qv(qf.data_as<const float>(), qf.data_as<const float>() + qf.numel());
    const std::vector<float> kv(kf.data_as<const float>(), kf.data_as<const float>() + kf.numel());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim)) / c.stride;
    const std::vector<double> want = oracle_mass(c, qv, kv, scale);

    const Tensor qd = q16.to(Device::cuda()), kd = k16.to(Device::cuda());
    cuda::detail::XAttentionParams p = mass_params(c, qd, kd, scale);
    Tensor valid_device;
    if (!c.valid_groups.empty()) {
      ASSERT_EQ(static_cast<int>(c.valid_groups.size()), p.kv_blocks);
      Tensor valid = Tensor::empty({p.kv_blocks}, DType::kI32);
      std::copy(c.valid_groups.begin(), c.valid_groups.end(), valid.data_as<int32_t>());
      valid_device = valid.to(Device::cuda());
      p.kv_valid_groups = valid_device.data_as<const int32_t>();
    }
    for (const cuda::detail::XAttentionGemm gemm : runnable_gemms()) {
      SCOPED_TRACE(gemm_name(gemm));
      p.gemm = gemm;
      Tensor workspace = nan_filled_device(cuda::detail::xattention_block_lse_floats(p));
      Tensor mass = nan_filled_device(static_cast<int64_t>(want.size()));
      p.block_lse2 = workspace.data_as<float>();
      p.mass = mass.data_as<float>();
      cuda::detail::launch_xattention_block_mass(p, c.dtype, nullptr);
      const Tensor got = mass.to(Device::cpu());
      const float* g = got.data_as<const float>();
      double worst = 0.0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(g[i])) << "mass " << i << " not written";
        worst = std::max(worst, std::abs(g[i] - want[i]));
      }
      // fp32 accumulation of 16-bit products and ex2.approx against fp64: masses are sums of up
      // to block_q / stride row probabilities, each off by ~1e-6 relative.
      EXPECT_LT(worst, 2e-4) << "largest |mass - fp64 oracle|";
    }
  }
#endif
}

// The GEMM variants at the largest benchmark shape (S = 29700, 40 heads, D = 128, bf16,
// 128 x 128 blocks, strides 16 and 8): the masses agree with the mma.sync kernel's, and each
// variant's time (median of 15 launches of the scores + masses) is printed for the record.
TEST(XAttentionBlockMassGpu, GemmVariantsAgreeAtTheBenchmarkShape) {
  SKIP_WITHOUT_GPU();
#ifdef TESSEL_WITH_CUDA
  Tensor q = Tensor::empty({1, 29700, 40, 128}, DType::kF32), k = Tensor::empty({1, 29700, 40, 128}, DType::kF32);
  fill_normal(q.view(), 900, 0.0, 1.0);
  fill_normal(k.view(), 901, 0.0, 1.0);
  const Tensor qd = q.to(DType::kBF16).to(Device::cuda()), kd = k.to(DType::kBF16).to(Device::cuda());
  for (const int stride : {16, 8}) {
    const MassCase c{29700, 29700, 40, 40, 128, stride, 128, 128, {}};
    SCOPED_TRACE(::testing::Message() << "stride " << stride);
    cuda::detail::XAttentionParams p = mass_params(c, qd, kd, 1.0 / std::sqrt(128.0) / stride);
    const int64_t mass_floats = static_cast<int64_t>(p.q_blocks) * p.kv_blocks * c.heads;
    Tensor workspace = nan_filled_device(cuda::detail::xattention_block_lse_floats(p));
    p.block_lse2 = workspace.data_as<float>();
    std::vector<float> reference;
    cudaEvent_t start, stop;
    ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
    for (const cuda::detail::XAttentionGemm gemm : runnable_gemms()) {
      p.gemm = gemm;
      Tensor mass = nan_filled_device(mass_floats);
      p.mass = mass.data_as<float>();
      std::vector<float> ms;
      for (int i = 0; i < 18; ++i) {
        cudaEventRecord(start, nullptr);
        cuda::detail::launch_xattention_block_mass(p, DType::kBF16, nullptr);
        cudaEventRecord(stop, nullptr);
        ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
        float t = 0.f;
        cudaEventElapsedTime(&t, start, stop);
        if (i >= 3) ms.push_back(t);  // the first launches warm up
      }
      std::sort(ms.begin(), ms.end());
      const double gflop = 2.0 * p.groups_q * p.groups_kv * (static_cast<double>(stride) * c.dim) * c.heads * 1e-9;
      std::printf("[ timing ] XAttention scores+masses %-14s S=29700 H=40 D=128 stride %2d: %.3f ms (%.0f TFLOP/s)\n",
                  gemm_name(gemm), stride, ms[ms.size() / 2], gflop / ms[ms.size() / 2]);
      const Tensor got = mass.to(Device::cpu());
      const float* g = got.data_as<const float>();
      if (reference.empty()) {
        reference.assign(g, g + mass_floats);
        continue;
      }
      double worst = 0.0;
      for (int64_t i = 0; i < mass_floats; ++i) {
        ASSERT_TRUE(std::isfinite(g[i])) << "mass " << i << " not written";
        worst = std::max(worst, static_cast<double>(std::abs(g[i] - reference[static_cast<size_t>(i)])));
      }
      EXPECT_LT(worst, 2e-4) << gemm_name(gemm) << ": largest |mass - mma.sync mass|";
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
#endif
}

// The wgmma launch refuses what it cannot run, before enqueuing anything: no sm_90a code or not
// compute capability 9.0, a tile width other than 128 / 256, more tiles than its int item count.
TEST(XAttentionBlockMassGpu, WgmmaLaunchRejectsWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
#ifdef TESSEL_WITH_CUDA
  const MassCase c{1 << 22, 1 << 22, 64, 64, 128, 2, 128, 128, {}};  // (2^21 / 128)^2 x 64 tiles > 2^31
  cuda::detail::XAttentionParams p = mass_params(c, Tensor::empty({1, 8, 1, 128}, DType::kBF16, Device::cuda()),
                                                 Tensor::empty({1, 8, 1, 128}, DType::kBF16, Device::cuda()), 0.01);
  if (!cuda::detail::xattention_wgmma_supported()) {
    EXPECT_THROW(cuda::detail::launch_xattention_block_lse_wgmma(p, DType::kBF16, 128, nullptr),
                 std::runtime_error);
    p.gemm = cuda::detail::XAttentionGemm::kWgmma128;
    EXPECT_THROW(cuda::detail::launch_xattention_block_mass(p, DType::kBF16, nullptr), std::runtime_error);
    return;
  }
  EXPECT_THROW(cuda::detail::launch_xattention_block_lse_wgmma(p, DType::kBF16, 192, nullptr),
               std::invalid_argument);
  try {
    cuda::detail::launch_xattention_block_lse_wgmma(p, DType::kBF16, 128, nullptr);
    ADD_FAILURE() << "2^31 or more tiles were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tiles"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a refused launch must not leave a launch error behind";
#endif
}

}  // namespace
}  // namespace tessel
