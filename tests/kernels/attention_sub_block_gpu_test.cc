// Sub-block masks on the CUDA block-sparse kernel against the fp64 oracle: random token-level bits
// inside random kept blocks, block sizes 64/128/256 x 64/128, partial blocks, odd lengths, GQA,
// per-head masks, causal limits on top, rows left with no key (output 0, lse -inf), outputs
// poisoned first. On an H100 the masks with bits run on the sm_80 kernel (the Hopper kernel
// computes whole blocks), which these shapes (D 128, 128x64 blocks) would otherwise take.
// Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "attention_gpu_util.h"
#include "kernels/attention_test_util.h"
#include "kernels/sub_block_test_util.h"
#include "tessel/core/device.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

Tensor bits_on(const std::vector<uint32_t>& bits, Device device) {
  Tensor host = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::kI32);
  std::memcpy(host.data(), bits.data(), bits.size() * sizeof(uint32_t));
  return host.to(device);
}

void check_on_gpu(const testing::SubBlockCase& c, DType dtype, bool causal, uint64_t seed) {
  SCOPED_TRACE(detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads,
                              " D=", c.dim, " ", dtype_name(dtype), " mask ", c.mask_batch, "x", c.mask_heads,
                              " blocks ", c.block_q, "x", c.block_kv, causal ? " causal" : "", " seed=", seed));
  const testing::Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, dtype, seed);
  const BlockMask mask = BlockMask::random({c.mask_batch, c.mask_heads, c.seq_q, c.seq_kv, c.block_q, c.block_kv},
                                           c.density, seed);
  const std::vector<uint32_t> bits = testing::random_sub_block_bits(mask, c.bit_density, seed);
  AttentionOptions options;
  options.causal = causal;

  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  Tensor out = testing::poisoned(host.q.shape(), dtype).to(gpu);
  Tensor lse = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
  const BlockMask::DeviceCopy device_mask = mask.to_device(gpu);
  const Tensor device_bits = bits_on(bits, gpu);
  BlockMaskView device_view = device_mask.view();
  device_view.sub_block_bits = device_bits.data_as<const uint32_t>();
  block_sparse_attention_forward(ExecContext{}, q, k, v, device_view, out, lse, options);

  BlockMaskView host_view = mask.view();
  host_view.sub_block_bits = bits.data();
  const auto exact = reference::block_sparse_attention(host.q, host.k, host.v, host_view, options);
  const Tensor out_host = out.to(Device::cpu()), lse_host = lse.to(Device::cpu());
  const testing::Errors got = testing::compare(out_host, lse_host, exact);
  const auto plain = testing::plain_attention(host, options, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return reference::block_mask_keeps(host_view, b, h, c.heads, c.kv_heads, i, j);
  });
  const double baseline = gpu_test::max_out_difference(plain, exact);
  EXPECT_TRUE(got.finite) << "NaN or inf left in the output (unwritten or poisoned)";
  EXPECT_TRUE(got.lse_pattern_ok) << "lse is -inf exactly for rows with no visible key";
  EXPECT_LE(got.out, 2.0 * baseline + testing::error_floor(dtype)) << "plain-dtype error " << baseline;
  EXPECT_LE(got.lse, testing::lse_floor(dtype) + 1e-3) << "lse error";
  // The rows the bits clear entirely (random_sub_block_bits: i % 7 == 3) are exactly 0.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 3; i < c.seq_q; i += 7)
        for (int64_t d = 0; d < c.dim; ++d)
          ASSERT_EQ(element_as_double(out_host, ((b * c.seq_q + i) * c.heads + h) * c.dim + d), 0.0) << "row " << i;
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, int64_t>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_D" + std::to_string(std::get<1>(info.param));
}

class SubBlockGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(SubBlockGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  const std::vector<testing::SubBlockCase> cases = {
      {1, 256, 256, 2, 2, dim, 1, 1, 128, 64, 0.6, 0.5},
      {2, 333, 461, 4, 2, dim, 2, 4, 128, 64, 0.5, 0.7},   // per-batch, per-q-head, partial blocks
      {1, 301, 517, 8, 1, dim, 1, 1, 64, 64, 0.4, 0.3},    // GQA 8, shared mask
      {1, 389, 389, 4, 2, dim, 1, 2, 128, 128, 0.5, 0.6},  // per-kv-head mask, two tiles per block
      {1, 517, 300, 4, 2, dim, 1, 4, 256, 64, 0.5, 0.5},   // block_q 256: two CTAs per q block
      {1, 77, 45, 2, 1, dim, 1, 2, 64, 256, 0.7, 0.2},     // short odd lengths, 4 tiles per block
  };
  uint64_t seed = 1700;
  for (const testing::SubBlockCase& c : cases)
    for (const bool causal : {false, true}) check_on_gpu(c, dtype, causal, seed++);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, SubBlockGpu,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16), ::testing::Values(64, 128)),
                         param_name);

}  // namespace
}  // namespace tessel
