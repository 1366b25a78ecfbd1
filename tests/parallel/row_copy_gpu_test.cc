// The CUDA row copies (one strided-copy kernel per call) against the CPU's memcpy loops on the same
// views: permuted 5-D views as the Ulysses pack and unpack make them, token ranges of batched
// buffers, odd sizes and every element width; the destination is poisoned first and what lies
// outside the view must stay untouched.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "row_copy.h"
#include "tessel/core/random.h"
#include "tessel/core/tensor.h"

namespace tessel {
namespace {

using parallel_detail::copy_rows;
using parallel_detail::narrow;
using parallel_detail::zero_rows;

// The same view (shape, strides, offset in elements) over another buffer.
TensorView same_view(const TensorView& view, const Tensor& base_of_view, const Tensor& other) {
  const auto offset = static_cast<const char*>(view.data()) - static_cast<const char*>(base_of_view.data());
  return TensorView(static_cast<char*>(other.data()) + offset, view.dtype(), other.device(), view.shape(), view.strides());
}

Tensor random_bytes(int64_t bytes, uint64_t seed) {
  Tensor t = Tensor::empty({bytes}, DType::kU8);
  std::vector<uint8_t> values(static_cast<size_t>(bytes));
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : values) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    v = static_cast<uint8_t>(state);
  }
  std::memcpy(t.data(), values.data(), values.size());
  return t;
}

// Copies src_view -> dst_view on the GPU and on the CPU over identical buffers; the whole
// destination buffers must be equal byte for byte afterwards.
void expect_same_as_cpu(const Tensor& src_host, const TensorView& src_view, const Tensor& dst_host, const TensorView& dst_view) {
  const Device gpu = Device::cuda(0);
  const Tensor src_gpu = src_host.to(gpu), dst_gpu = dst_host.to(gpu);
  Tensor dst_cpu = dst_host.to(Device::cpu());
  copy_rows(ExecContext{}, src_view, same_view(dst_view, dst_host, dst_cpu));
  copy_rows(ExecContext{gpu}, same_view(src_view, src_host, src_gpu), same_view(dst_view, dst_host, dst_gpu));
  const Tensor back = dst_gpu.to(Device::cpu());
  ASSERT_EQ(back.nbytes(), dst_cpu.nbytes());
  EXPECT_EQ(std::memcmp(back.data(), dst_cpu.data(), back.nbytes()), 0);
}

TEST(RowCopyGpu, UlyssesPackAndUnpackViewsEqualTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  for (const DType dtype : {DType::kBF16, DType::kF32, DType::kU8}) {
    for (const auto& [B, L, H, D, U] : std::vector<std::array<int64_t, 5>>{{2, 37, 8, 128, 2}, {1, 5, 12, 64, 4}, {3, 1, 6, 3, 3}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " B=" << B << " L=" << L << " H=" << H << " D=" << D << " U=" << U);
      const int64_t element = static_cast<int64_t>(dtype_size(dtype)), Hu = H / U, numel = B * L * H * D;
      const Tensor shard = Tensor::empty({numel}, dtype);
      std::memcpy(shard.data(), random_bytes(numel * element, 2).data(), shard.nbytes());
      const Tensor staging = Tensor::empty({numel}, dtype);
      std::memset(staging.data(), 0xA5, staging.nbytes());
      // Pack: shard (B, L, H, D) as (U, B, L, H/U, D) -> contiguous staging.
      const TensorView packed_source(shard.data(), dtype, Device::cpu(), {U, B, L, Hu, D}, {Hu * D, L * H * D, H * D, D, 1});
      const TensorView staged(staging.data(), dtype, Device::cpu(), {U, B, L, Hu, D});
      expect_same_as_cpu(shard, packed_source, staging, staged);
      // Unpack: contiguous staging -> gathered (B, U*L, H/U, D) as (U, B, L, H/U, D).
      const Tensor gathered = Tensor::empty({numel}, dtype);
      std::memset(gathered.data(), 0x5A, gathered.nbytes());
      const TensorView gathered_view(gathered.data(), dtype, Device::cpu(), {U, B, L, Hu, D},
                                     {L * Hu * D, U * L * Hu * D, Hu * D, D, 1});
      const TensorView staged_source(shard.data(), dtype, Device::cpu(), {U, B, L, Hu, D});
      expect_same_as_cpu(shard, staged_source, gathered, gathered_view);
    }
  }
}

TEST(RowCopyGpu, TokenRangesOfBatchedBuffersAndZeroRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const Device gpu = Device::cuda(0);
  const int64_t B = 2, chunk = 160, H = 3, D = 40;
  Tensor src = Tensor::empty({B, chunk, H, D}, DType::kF32), dst = Tensor::empty({B, chunk, H, D}, DType::kF32);
  fill_normal(src, 3);
  std::memset(dst.data(), 0xFF, dst.nbytes());  // NaN
  // Rows [7, 150) of every batch entry: not contiguous across the batch.
  expect_same_as_cpu(src, narrow(src.view(), 1, 7, 143), dst, narrow(dst.view(), 1, 7, 143));
  // zero_rows of the padding rows [150, 160) leaves every other row as it was.
  Tensor on_gpu = src.to(gpu);
  zero_rows(ExecContext{gpu}, narrow(on_gpu.view(), 1, 150, 10));
  const Tensor back = on_gpu.to(Device::cpu());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < chunk; ++s)
      for (int64_t i = 0; i < H * D; ++i) {
        const int64_t at = (b * chunk + s) * H * D + i;
        ASSERT_EQ(back.data_as<float>()[at], s >= 150 ? 0.0f : src.data_as<float>()[at]) << "b=" << b << " s=" << s;
      }
}

}  // namespace
}  // namespace tessel
