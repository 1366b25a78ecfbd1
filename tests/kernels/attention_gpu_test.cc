// CUDA attention kernels against the fp64 oracle, on fresh random inputs over many shapes: dense
// and block-sparse (all block sizes, per-batch / per-head masks, partial last blocks, empty rows),
// merge, argument errors, and CUDA-graph capture. Skips (with a message) when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_gpu_util.h"
#include "kernels/attention_test_util.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/random.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/attention_tuning.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/block_mask.h"

#ifdef TESSEL_WITH_CUDA
#include <cuda_runtime.h>

#endif

namespace tessel {
namespace {

using gpu_test::expect_error_naming;
using gpu_test::ForcedVariant;
using gpu_test::hopper_device;
using testing::compare;
using testing::Errors;
using testing::Qkv;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped"

bool hopper_only_head_dim(int64_t dim) { return dim == 96 || dim == 192 || dim == 256; }
#define SKIP_WITHOUT_KERNEL_FOR(dim)                       \
  if (hopper_only_head_dim(dim) && !hopper_device()) \
  GTEST_SKIP() << "head dim " << (dim) << " needs the Hopper kernel (compute capability 9.0)"

struct Case {
  int64_t batch, seq_q, seq_kv, heads, kv_heads, dim;
  DType dtype;
  AttentionOptions options;
};

std::string describe(const Case& c) {
  return detail::concat("B=", c.batch, " Sq=", c.seq_q, " Skv=", c.seq_kv, " H=", c.heads, "/", c.kv_heads, " D=", c.dim,
                        " ", dtype_name(c.dtype), " causal=", c.options.causal, " window=(", c.options.window_left, ",",
                        c.options.window_right, ") scale=", c.options.scale);
}

// How a block-sparse call finds its work order on Hopper: with the workspace a plan reserves
// (attention_workspace_bytes: rows sorted on the device, longest first, handed out through a
// counter) or without one (a static order).
enum class Schedule { kPlanned, kStatic };

// Runs the CUDA kernel (dense when mask is null) and checks out/lse against the fp64 oracle with
// a tolerance of twice the error of plain same-dtype attention plus a small floor.
void check_case(const Case& c, uint64_t seed, const BlockMask* mask = nullptr, Schedule schedule = Schedule::kPlanned) {
  SCOPED_TRACE(describe(c) + (schedule == Schedule::kPlanned ? " planned workspace" : " no workspace"));
  const Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, c.dtype, seed);
  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  Tensor out = testing::poisoned({c.batch, c.seq_q, c.heads, c.dim}, c.dtype).to(gpu);
  Tensor lse = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);

  reference::AttentionResult ref;
  if (mask == nullptr) {
    attention_forward(ExecContext{}, q, k, v, out, lse, c.options);
    ref = reference::attention(host.q, host.k, host.v, c.options);
  } else {
    const BlockMask::DeviceCopy device_mask = mask->to_device(gpu);
    Workspace workspace(gpu);
    ExecContext ctx;
    ctx.device = gpu;
    if (schedule == Schedule::kPlanned) {
      workspace.reserve(attention_workspace_bytes(
          ctx, gpu, {c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim}, mask->shape().block_kv));
      ctx.workspace = &workspace;
    }
    block_sparse_attention_forward(ctx, q, k, v, device_mask.view(), out, lse, c.options);
    ref = reference::block_sparse_attention(host.q, host.k, host.v, mask->view(), c.options);
  }
  const Tensor out_host = out.to(Device::cpu());
  const Tensor lse_host = lse.to(Device::cpu());
  const Errors got = compare(out_host, lse_host, ref);

  const BlockMaskView mask_view = mask == nullptr ? BlockMaskView{} : mask->view();
  const auto plain = testing::plain_attention(host, c.options, [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return mask == nullptr || gpu_test::mask_keeps(mask_view, c.heads, c.kv_heads, b, h, i, j);
  });
  const double baseline = gpu_test::max_out_difference(plain, ref);
  EXPECT_TRUE(got.finite) << "NaN or inf left in the output (unwritten or poisoned)";
  EXPECT_TRUE(got.lse_pattern_ok) << "lse is -inf exactly for rows with no visible key";
  EXPECT_LE(got.out, 2.0 * baseline + testing::error_floor(c.dtype)) << "plain-dtype error " << baseline;
  EXPECT_LE(got.lse, testing::lse_floor(c.dtype) + 1e-3) << "lse error";
}

// "bf16_D128" rather than gtest's byte dump of the parameters.
std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, int64_t>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_D" + std::to_string(std::get<1>(info.param));
}

class DenseGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(DenseGpu, MatchesReferenceOverShapes) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_left = 70;
  window.window_right = 9;
  AttentionOptions causal_window;
  causal_window.causal = true;
  causal_window.window_left = 100;
  AttentionOptions scaled;
  scaled.scale = 0.3f;
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 1, dim, dtype, {}},
      {2, 257, 257, 4, 2, dim, dtype, {}},
      {1, 130, 333, 3, 1, dim, dtype, {}},
      {1, 200, 200, 2, 2, dim, dtype, causal},
      {1, 100, 300, 4, 4, dim, dtype, causal},  // bottom-right: all rows see keys
      {1, 300, 100, 2, 1, dim, dtype, causal},  // bottom-right: the first 200 rows see nothing
      {2, 190, 250, 2, 1, dim, dtype, window},
      {1, 389, 389, 2, 2, dim, dtype, causal_window},
      {1, 77, 140, 6, 3, dim, dtype, scaled},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) check_case(c, seed++);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DenseGpu,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16), ::testing::Values(64, 96, 128, 192, 256)),
                         param_name);

struct SparseCase {
  int64_t block_q, block_kv;
  int64_t mask_batch_mode;  // 1 or B
  int64_t mask_heads_mode;  // 0 → 1, 1 → H_kv, 2 → H_q
  double density;
  bool causal;
};

class SparseGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(SparseGpu, MatchesReferenceOverMasks) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  const int64_t batch = 2, heads = 4, kv_heads = 2;
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{128, 64}, {128, 128}, {64, 64}};
  uint64_t seed = 101;
  for (const auto& [block_q, block_kv] : sizes)
    for (const int64_t heads_mode : {0, 1, 2})
      if (!hopper_only_head_dim(dim) || block_q % 128 == 0)  // the Hopper kernel's 128-row items
      for (const bool causal : {false, true}) {
        const int64_t seq_q = 333 + seed % 7, seq_kv = causal ? seq_q : 461;
        BlockMaskShape shape;
        shape.mask_batch = heads_mode == 1 ? 1 : batch;
        shape.mask_heads = heads_mode == 0 ? 1 : heads_mode == 1 ? kv_heads : heads;
        shape.seq_q = seq_q;
        shape.seq_kv = seq_kv;
        shape.block_q = block_q;
        shape.block_kv = block_kv;
        const BlockMask mask = BlockMask::random(shape, heads_mode == 2 ? 0.3 : 0.6, seed);
        Case c{batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, {}};
        c.options.causal = causal;
        SCOPED_TRACE(detail::concat("block ", block_q, "x", block_kv, " mask ", shape.mask_batch, "x", shape.mask_heads));
        check_case(c, seed++, &mask);
      }
}

TEST_P(SparseGpu, EmptyRowsGiveZeroAndMinusInfinity) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  BlockMaskShape shape;
  shape.mask_heads = 2;
  shape.seq_q = 300;  // 3 q blocks of 128, the last partial
  shape.seq_kv = 200; // 4 kv blocks of 64, the last partial
  std::vector<std::vector<int32_t>> rows = {{0, 3}, {}, {1}, {}, {2, 3}, {0, 1, 2, 3}};
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  check_case({1, 300, 200, 2, 2, dim, dtype, {}}, 7, &mask);
  check_case({1, 300, 200, 2, 2, dim, dtype, {}}, 7, &mask, Schedule::kStatic);
}

TEST_P(SparseGpu, FullMaskEqualsDense) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  BlockMaskShape shape;
  shape.seq_q = 517;
  shape.seq_kv = 517;
  const BlockMask mask = BlockMask::full(shape);
  AttentionOptions causal;
  causal.causal = true;
  check_case({1, 517, 517, 2, 1, dim, dtype, causal}, 8, &mask);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, SparseGpu,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16), ::testing::Values(64, 96, 128, 192, 256)),
                         param_name);

// Head dims 64 and 128 run the warp-specialized kernel on Hopper (and the sm_80 kernel elsewhere),
// 96 only the Hopper kernel (zero-padded to its 128-column layout), 192 and 256 only the Hopper
// kernel with 64-key stages (three at 192, two at 256): odd lengths around its 128-row and
// 128- or 64-key tiles, rows longer than its stage ring, GQA up to 4:1.
class LongAndOddGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(LongAndOddGpu, DenseMatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_left = 300;
  window.window_right = 0;
  const std::vector<Case> cases = {
      {1, 63, 65, 2, 2, dim, dtype, {}},     {1, 127, 129, 2, 1, dim, dtype, {}},
      {1, 129, 127, 2, 1, dim, dtype, {}},   {3, 255, 257, 2, 2, dim, dtype, {}},
      {1, 1000, 1000, 4, 1, dim, dtype, {}}, {1, 2049, 1531, 1, 1, dim, dtype, {}},
      {1, 777, 777, 4, 2, dim, dtype, causal}, {2, 1100, 1100, 2, 1, dim, dtype, window},
  };
  uint64_t seed = 501;
  for (const Case& c : cases) check_case(c, seed++);
}

TEST_P(LongAndOddGpu, SparseMatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  const int64_t batch = 2, heads = 4, kv_heads = 1;
  uint64_t seed = 601;
  for (const int64_t block_kv : {64, 256})
    for (const double density : {0.15, 0.5})
      for (const bool causal : {false, true}) {
        const int64_t seq_q = 641 + seed % 5, seq_kv = causal ? seq_q : 899;
        BlockMaskShape shape;
        shape.mask_batch = batch;
        shape.mask_heads = heads;
        shape.seq_q = seq_q;
        shape.seq_kv = seq_kv;
        shape.block_q = seed % 2 == 0 ? 128 : 256;
        shape.block_kv = block_kv;
        const BlockMask mask = BlockMask::random(shape, density, seed);
        Case c{batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, {}};
        c.options.causal = causal;
        SCOPED_TRACE(detail::concat("block ", shape.block_q, "x", block_kv, " density ", density));
        check_case(c, seed++, &mask);
      }
}

// Rows of 0 to 9 kept blocks (odd counts leave half of the kernel's last 128-key stage empty),
// kept blocks past the end of a causal row, and rows that keep nothing.
// 2 heads x 1240 tokens: 10 q blocks of 128 and 20 kv blocks of 64 (the last ones partial), the
// rows keeping 0 to 9 blocks.
BlockMask mask_of_every_row_length() {
  BlockMaskShape shape;
  shape.mask_heads = 2;
  shape.seq_q = 1240;
  shape.seq_kv = 1240;
  std::vector<std::vector<int32_t>> rows;
  for (int h = 0; h < 2; ++h)
    for (int qb = 0; qb < 10; ++qb) {
      std::vector<int32_t> row;
      const int kept = (qb + 3 * h) % 10;
      for (int i = 0; i < kept; ++i) row.push_back(static_cast<int32_t>((i * 7 + qb + h) % 20));
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      rows.push_back(row);
    }
  return BlockMask::from_rows(shape, rows);
}

TEST_P(LongAndOddGpu, SparseRowsOfEveryLength) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  const BlockMask mask = mask_of_every_row_length();
  check_case({1, 1240, 1240, 2, 1, dim, dtype, {}}, 701, &mask);
  AttentionOptions causal;
  causal.causal = true;
  check_case({1, 1240, 1240, 2, 1, dim, dtype, causal}, 702, &mask);
  check_case({1, 1240, 1240, 2, 1, dim, dtype, causal}, 702, &mask, Schedule::kStatic);
}

// More (batch, head, query block) items than an H100 has multiprocessors, so each CTA of the
// persistent Hopper kernel runs several in a row: its stage ring and barriers carry over from
// item to item, through rows of every length including empty ones.
TEST_P(LongAndOddGpu, ManyItemsPerMultiprocessor) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  const int64_t batch = 2, heads = 16, kv_heads = 4, seq_q = 1100, seq_kv = 300;
  check_case({batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, {}}, 801);
  BlockMaskShape shape;
  shape.mask_batch = batch;
  shape.mask_heads = heads;
  shape.seq_q = seq_q;
  shape.seq_kv = seq_kv;  // 5 kv blocks of 64, the last partial
  std::vector<std::vector<int32_t>> rows;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t qb = 0; qb < shape.q_blocks(); ++qb) {
        std::vector<int32_t> row;
        for (int32_t kb = 0; kb < static_cast<int32_t>((qb + h + b) % 6); ++kb) row.push_back((kb + 2 * static_cast<int32_t>(h)) % 5);
        std::sort(row.begin(), row.end());
        row.erase(std::unique(row.begin(), row.end()), row.end());
        rows.push_back(row);
      }
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  check_case({batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, {}}, 802, &mask);
  check_case({batch, seq_q, seq_kv, heads, kv_heads, dim, dtype, {}}, 802, &mask, Schedule::kStatic);
}

// Rows from empty to full in one mask, many more of them than multiprocessors, so the
// longest-first order differs from the static one; both must give the same bits (each item is
// computed by one CTA whatever its rank).
TEST_P(LongAndOddGpu, LongestFirstOrderGivesTheStaticOrdersBits) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  SKIP_WITHOUT_KERNEL_FOR(dim);
  const int64_t batch = 1, heads = 24, kv_heads = 8, seq = 2000;
  const Qkv host = testing::random_qkv(batch, seq, seq, heads, kv_heads, dim, dtype, 901);
  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  BlockMaskShape shape;
  shape.mask_heads = heads;
  shape.seq_q = seq;
  shape.seq_kv = seq;  // 32 kv blocks of 64, the last partial
  std::vector<std::vector<int32_t>> rows;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t qb = 0; qb < shape.q_blocks(); ++qb) {
      std::vector<int32_t> row;
      const int64_t kept = (qb * 7 + h * 5) % 33;  // 0 ... 32 blocks
      for (int64_t kb = 0; kb < kept; ++kb) row.push_back(static_cast<int32_t>((kb * 3 + h) % 32));
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      rows.push_back(row);
    }
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  const BlockMask::DeviceCopy device_mask = mask.to_device(gpu);
  Workspace workspace(gpu);
  ExecContext planned;
  planned.device = gpu;
  workspace.reserve(attention_workspace_bytes(planned, gpu, {batch, seq, seq, heads, kv_heads, dim}, shape.block_kv));
  planned.workspace = &workspace;
  Tensor out_planned = testing::poisoned({batch, seq, heads, dim}, dtype).to(gpu);
  Tensor out_static = testing::poisoned({batch, seq, heads, dim}, dtype).to(gpu);
  Tensor lse_planned = testing::poisoned({batch, heads, seq}, DType::kF32).to(gpu);
  Tensor lse_static = testing::poisoned({batch, heads, seq}, DType::kF32).to(gpu);
  for (int repeat = 0; repeat < 2; ++repeat)  // the second run reuses the workspace's counter
    block_sparse_attention_forward(planned, q, k, v, device_mask.view(), out_planned, lse_planned);
  block_sparse_attention_forward(ExecContext{}, q, k, v, device_mask.view(), out_static, lse_static);
  const Tensor a = out_planned.to(Device::cpu()), b = out_static.to(Device::cpu());
  const Tensor la = lse_planned.to(Device::cpu()), lb = lse_static.to(Device::cpu());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "outputs differ between the two orders";
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.nbytes()), 0) << "LSE differs between the two orders";
  check_case({batch, seq, seq, heads, kv_heads, dim, dtype, {}}, 901, &mask);
}

INSTANTIATE_TEST_SUITE_P(HopperShapes, LongAndOddGpu,
                         ::testing::Values(std::make_tuple(DType::kBF16, int64_t{128}), std::make_tuple(DType::kF16, int64_t{128}),
                                           std::make_tuple(DType::kBF16, int64_t{64}), std::make_tuple(DType::kBF16, int64_t{96}),
                                           std::make_tuple(DType::kF16, int64_t{96}), std::make_tuple(DType::kBF16, int64_t{192}),
                                           std::make_tuple(DType::kF16, int64_t{192}), std::make_tuple(DType::kBF16, int64_t{256}),
                                           std::make_tuple(DType::kF16, int64_t{256})),
                         param_name);

// Every variant of the Hopper kernel (attention_tuning.h: 64-key stages with two Q buffers, the
// consumer warpgroups' ping-pong, lazy rescaling of O, O stored through shared memory, the next
// item's first QK^T before the epilogue) forced in turn, over what stresses them: odd lengths around
// the tiles, GQA, causal and window edges, rows of every kept-block count including empty ones,
// more items than multiprocessors (the ping-pong turns carry across items), both schedules.
class VariantsGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};


TEST_P(VariantsGpu, EveryVariantMatchesReference) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) GTEST_SKIP() << "kernel variants exist on compute capability 9.0 only";
  const auto [dtype, dim] = GetParam();
  const std::vector<std::string> variants = attention_kernel_variants(Device::cuda(), dim);
  ASSERT_EQ(variants.size(), 10u);
  AttentionOptions causal;
  causal.causal = true;
  AttentionOptions window;
  window.window_left = 300;
  window.window_right = 5;
  const BlockMask every_length_mask = mask_of_every_row_length();
  BlockMaskShape many;
  many.mask_batch = 2;
  many.mask_heads = 16;
  many.seq_q = 1100;
  many.seq_kv = 900;
  many.block_kv = 128;
  const BlockMask many_mask = BlockMask::random(many, 0.3, 907);
  for (const std::string& variant : variants) {
    SCOPED_TRACE("variant " + variant);
    const ForcedVariant forced(dim, variant);
    uint64_t seed = 901;
    check_case({1, 1, 1, 1, 1, dim, dtype, {}}, seed++);
    check_case({1, 63, 65, 2, 2, dim, dtype, {}}, seed++);
    check_case({3, 255, 257, 4, 1, dim, dtype, {}}, seed++);
    check_case({1, 2049, 1531, 1, 1, dim, dtype, {}}, seed++);
    check_case({1, 777, 777, 4, 2, dim, dtype, causal}, seed++);
    check_case({2, 1100, 1100, 2, 1, dim, dtype, window}, seed++);
    check_case({2, 1100, 300, 16, 4, dim, dtype, {}}, seed++);
    check_case({1, 1240, 1240, 2, 1, dim, dtype, {}}, seed++, &every_length_mask);
    check_case({1, 1240, 1240, 2, 1, dim, dtype, causal}, seed++, &every_length_mask);
    check_case({1, 1240, 1240, 2, 1, dim, dtype, causal}, seed++, &every_length_mask, Schedule::kStatic);
    check_case({2, 1100, 900, 16, 4, dim, dtype, {}}, seed++, &many_mask);
  }
}

// Small enough for compute-sanitizer (gpu-check.sh runs it under memcheck and racecheck): empty
// rows, a causal edge and several items per CTA (the turns carry across items) in every variant.
TEST_P(VariantsGpu, SmallCasesEveryVariant) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) GTEST_SKIP() << "kernel variants exist on compute capability 9.0 only";
  const auto [dtype, dim] = GetParam();
  BlockMaskShape shape;
  shape.mask_heads = 3;
  shape.seq_q = 300;
  shape.seq_kv = 330;
  std::vector<std::vector<int32_t>> rows;
  for (int row = 0; row < 9; ++row)  // 3 heads x 3 q blocks; every third row keeps nothing
    rows.push_back(row % 3 == 0 ? std::vector<int32_t>{} : std::vector<int32_t>{0, static_cast<int32_t>(row % 6)});
  for (std::vector<int32_t>& row : rows) row.erase(std::unique(row.begin(), row.end()), row.end());
  const BlockMask mask = BlockMask::from_rows(shape, rows);
  AttentionOptions causal;
  causal.causal = true;
  for (const std::string& variant : attention_kernel_variants(Device::cuda(), dim)) {
    SCOPED_TRACE("variant " + variant);
    const ForcedVariant forced(dim, variant);
    check_case({1, 300, 330, 3, 1, dim, dtype, {}}, 961, &mask);
    check_case({1, 200, 200, 2, 2, dim, dtype, causal}, 962);
    check_case({2, 260, 140, 40, 8, dim, dtype, {}}, 963);  // 240 items: most CTAs run two
  }
}

// The variants storing O through shared memory with the copy engine ("+tmastore", with or without
// the next item's first QK^T before the epilogue, "+overlap") against the same variant storing it
// from registers: the same arithmetic, so the same bits of out and LSE, into an
// out that is the middle third of a poisoned (B, S, 3, H, D) buffer (as a fused projection's input
// would be): every element of the view written, every element between its rows still the poison
// (the copy engine's boxes must stay inside the view), over odd lengths (rows past the end clipped,
// a second warpgroup wholly past it), GQA, a causal edge, empty mask rows and more items than
// multiprocessors — dense, and short mask rows of 0 to 3 blocks in a mixed order, so that CTAs
// pass from empty to one-stage to longer items (the hand-back of the tile's stage and the early
// QK^T cross those edges). (The register variants are checked against the fp64 oracle above.)
TEST_P(VariantsGpu, StoresThroughSharedMemoryGiveTheRegisterStoresBits) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) GTEST_SKIP() << "kernel variants exist on compute capability 9.0 only";
  const auto [dtype, dim] = GetParam();
  const Device gpu = Device::cuda();
  AttentionOptions causal;
  causal.causal = true;
  const BlockMask every_length_mask = mask_of_every_row_length();
  BlockMaskShape short_shape;
  short_shape.mask_heads = 64;
  short_shape.seq_q = 600;  // 5 query blocks x 64 heads: 320 items
  short_shape.seq_kv = 600;
  std::vector<std::vector<int32_t>> short_rows;
  for (int h = 0; h < 64; ++h)
    for (int qb = 0; qb < 5; ++qb) {
      std::vector<int32_t> row;
      for (int kb = 0; kb < (h + 3 * qb) % 4; ++kb) row.push_back(static_cast<int32_t>((3 * kb + h + qb) % 10));
      std::sort(row.begin(), row.end());
      row.erase(std::unique(row.begin(), row.end()), row.end());
      short_rows.push_back(row);
    }
  const BlockMask short_rows_mask = BlockMask::from_rows(short_shape, short_rows);
  struct StoreCase {
    Case c;
    const BlockMask* mask;
  };
  const std::vector<StoreCase> cases = {{{1, 1, 1, 1, 1, dim, dtype, {}}, nullptr},
                                        {{2, 65, 300, 4, 2, dim, dtype, {}}, nullptr},
                                        {{3, 200, 257, 8, 1, dim, dtype, causal}, nullptr},
                                        {{2, 260, 140, 40, 8, dim, dtype, {}}, nullptr},
                                        {{1, 1240, 1240, 2, 1, dim, dtype, {}}, &every_length_mask},
                                        {{1, 600, 600, 64, 8, dim, dtype, {}}, &short_rows_mask}};
  std::vector<std::string> store_variants;
  for (const std::string& variant : attention_kernel_variants(gpu, dim))
    if (variant.find("+tmastore") != std::string::npos) store_variants.push_back(variant);
  ASSERT_EQ(store_variants.size(), 4u);
  uint64_t seed = 971;
  for (const StoreCase& sc : cases) {
    const Case& c = sc.c;
    SCOPED_TRACE(describe(c) + (sc.mask != nullptr ? " block-sparse" : " dense"));
    const Qkv host = testing::random_qkv(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.dim, c.dtype, seed++);
    const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
    const int64_t row = c.heads * c.dim;  // elements of one token's heads
    // Runs `variant` into the middle third of a fresh poisoned packed buffer; the buffer and LSE.
    auto run = [&](const std::string& variant) {
      const ForcedVariant forced(c.dim, variant);
      Tensor packed = testing::poisoned({c.batch, c.seq_q, 3, c.heads, c.dim}, c.dtype).to(gpu);
      Tensor lse = testing::poisoned({c.batch, c.heads, c.seq_q}, DType::kF32).to(gpu);
      const TensorView out(static_cast<uint16_t*>(packed.data()) + row, c.dtype, gpu, {c.batch, c.seq_q, c.heads, c.dim},
                           {c.seq_q * 3 * row, 3 * row, c.dim, 1});
      if (sc.mask == nullptr) {
        attention_forward(ExecContext{}, q, k, v, out, lse, c.options);
      } else {
        const BlockMask::DeviceCopy device_mask = sc.mask->to_device(gpu);
        block_sparse_attention_forward(ExecContext{}, q, k, v, device_mask.view(), out, lse, c.options);
      }
      return std::make_pair(packed.to(Device::cpu()), lse.to(Device::cpu()));
    };
    for (const std::string& variant : store_variants) {
      const std::string register_variant = variant.substr(0, variant.find("+tmastore"));
      SCOPED_TRACE("variant " + variant + " against " + register_variant);
      const auto [want, want_lse] = run(register_variant);
      const auto [got, got_lse] = run(variant);
      bool view_written = true, gaps_poisoned = true;
      for (int64_t n = 0; n < got.numel(); ++n) {
        const bool in_view = (n / row) % 3 == 1;
        const bool is_nan = std::isnan(element_as_double(got, n));
        if (in_view && is_nan) view_written = false;
        if (!in_view && !is_nan) gaps_poisoned = false;
      }
      EXPECT_TRUE(view_written) << "an element of the out view was left unwritten";
      EXPECT_TRUE(gaps_poisoned) << "an element outside the out view was written";
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << "out differs from " << register_variant;
      EXPECT_EQ(std::memcmp(got_lse.data(), want_lse.data(), got_lse.nbytes()), 0) << "LSE differs from " << register_variant;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HopperVariants, VariantsGpu,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16), ::testing::Values(64, 128)),
                         param_name);

#ifdef TESSEL_WITH_CUDA
// tune_attention times the candidates once per class and caches the fastest; later calls of the
// class run it (and stay correct), another length class is tuned apart, and the bad cases are
// errors that change nothing.
TEST(AttentionGpu, TuningChoosesOnceAndCallsRunTheChoice) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) GTEST_SKIP() << "kernel variants exist on compute capability 9.0 only";
  clear_attention_tuning();
  const AttentionDims dims{1, 3000, 3000, 8, 2, 128};
  ExecContext ctx;
  ctx.device = Device::cuda();
  const AttentionTuning first = tune_attention(ctx, Device::cuda(), DType::kBF16, dims);
  ASSERT_EQ(first.median_ms.size(), 10u);
  EXPECT_FALSE(first.cached);
  bool listed = false;
  for (const auto& [name, ms] : first.median_ms) {
    EXPECT_GT(ms, 0.0) << name;
    listed = listed || name == first.chosen;
  }
  EXPECT_TRUE(listed) << first.chosen;
  const AttentionTuning again = tune_attention(ctx, Device::cuda(), DType::kBF16, {1, 2500, 2500, 40, 40, 128});
  EXPECT_TRUE(again.cached);  // 2500 and 3000 share the power of two 4096
  EXPECT_EQ(again.chosen, first.chosen);
  AttentionTuneOptions sparse;
  sparse.block_sparse = true;
  sparse.density = 0.2;
  sparse.rounds = 3;
  const AttentionTuning sparse_tuning = tune_attention(ctx, Device::cuda(), DType::kBF16, dims, sparse);
  EXPECT_FALSE(sparse_tuning.cached);
  EXPECT_EQ(sparse_tuning.median_ms.size(), 10u);
  // Calls of the tuned classes run the choice and match the oracle.
  check_case({1, 3000, 3000, 2, 1, 128, DType::kBF16, {}}, 951);
  BlockMaskShape shape;
  shape.mask_heads = 2;
  shape.seq_q = 3000;
  shape.seq_kv = 3000;
  const BlockMask mask = BlockMask::random(shape, 0.2, 952);
  check_case({1, 3000, 3000, 2, 1, 128, DType::kBF16, {}}, 953, &mask);
  // Head dims with one variant: nothing to time.
  const AttentionTuning single = tune_attention(ctx, Device::cuda(), DType::kBF16, {1, 500, 500, 4, 4, 96});
  EXPECT_EQ(single.chosen, "wide");
  EXPECT_TRUE(single.median_ms.empty());
  // Errors.
  AttentionTuneOptions bad;
  bad.density = 0.0;
  expect_error_naming([&] { tune_attention(ctx, Device::cuda(), DType::kBF16, dims, bad); }, "options.density");
  bad = {};
  bad.rounds = 0;
  expect_error_naming([&] { tune_attention(ctx, Device::cuda(), DType::kBF16, dims, bad); }, "options.rounds");
  expect_error_naming([&] { tune_attention(ctx, Device::cuda(), DType::kBF16, {1, 300, 300, 6, 4, 128}); }, "dims");
  expect_error_naming([&] { tune_attention(ctx, Device::cuda(), DType::kF32, dims); }, "dtype");
  expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 128, "tall"); }, "variant");
  expect_error_naming([] { force_attention_kernel_variant(Device::cuda(), 96, "narrow"); }, "variant");
  // Inside a graph capture tuning would time nothing real: an Error naming the stream.
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ExecContext capturing = ctx;
  capturing.stream = stream;
  clear_attention_tuning();
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  expect_error_naming([&] { tune_attention(capturing, Device::cuda(), DType::kBF16, dims); }, "ctx.stream");
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  clear_attention_tuning();
}
#endif

TEST(AttentionGpu, StridedViewsOfPackedQkv) {
  SKIP_WITHOUT_GPU();
  // q, k, v as views into one packed (B, S, 3, H, D) buffer, as a fused QKV projection gives.
  const int64_t batch = 2, seq = 201, heads = 3, dim = 128;
  Tensor packed = Tensor::empty({batch, seq, 3, heads, dim}, DType::kBF16);
  fill_normal(packed.view(), 5);
  const Tensor device_packed = packed.to(Device::cuda());
  const Shape strides = {seq * 3 * heads * dim, 3 * heads * dim, dim, 1};
  auto part = [&](const Tensor& t, int which, Device device) {
    return TensorView(static_cast<uint16_t*>(t.data()) + which * heads * dim, DType::kBF16, device,
                      {batch, seq, heads, dim}, strides);
  };
  Tensor out = testing::poisoned({batch, seq, heads, dim}, DType::kBF16).to(Device::cuda());
  Tensor lse = testing::poisoned({batch, heads, seq}, DType::kF32).to(Device::cuda());
  attention_forward(ExecContext{}, part(device_packed, 0, Device::cuda()), part(device_packed, 1, Device::cuda()),
                    part(device_packed, 2, Device::cuda()), out, lse);
  const auto ref = reference::attention(part(packed, 0, Device::cpu()), part(packed, 1, Device::cpu()),
                                        part(packed, 2, Device::cpu()));
  const Errors got = compare(out.to(Device::cpu()), lse.to(Device::cpu()), ref);
  EXPECT_TRUE(got.finite);
  EXPECT_LE(got.out, 2e-2);
  EXPECT_LE(got.lse, 2e-3);
}

TEST(AttentionGpu, MergeOfTwoKeyHalvesEqualsWhole) {
  SKIP_WITHOUT_GPU();
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    const int64_t batch = 2, seq_q = 150, seq_kv = 256, heads = 4, dim = 64;
    const Qkv host = testing::random_qkv(batch, seq_q, seq_kv, heads, heads, dim, DType::kBF16, 21);
    const Device gpu = Device::cuda();
    const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
    const Shape half_shape = {batch, seq_kv / 2, heads, dim};
    auto half = [&](const Tensor& t, int64_t which) {
      return TensorView(static_cast<uint16_t*>(t.data()) + which * (seq_kv / 2) * heads * dim, DType::kBF16, gpu,
                        half_shape, {seq_kv * heads * dim, heads * dim, dim, 1});
    };
    Tensor out_a = Tensor::empty({batch, seq_q, heads, dim}, DType::kBF16, gpu);
    Tensor out_b = Tensor::empty({batch, seq_q, heads, dim}, DType::kBF16, gpu);
    Tensor lse_a = Tensor::empty({batch, heads, seq_q}, DType::kF32, gpu);
    Tensor lse_b = Tensor::empty({batch, heads, seq_q}, DType::kF32, gpu);
    attention_forward(ExecContext{}, q, half(k, 0), half(v, 0), out_a, lse_a);
    attention_forward(ExecContext{}, q, half(k, 1), half(v, 1), out_b, lse_b);
    Tensor out = testing::poisoned({batch, seq_q, heads, dim}, dtype).to(gpu);
    Tensor lse = testing::poisoned({batch, heads, seq_q}, DType::kF32).to(gpu);
    merge_attention_states(ExecContext{}, out_a, lse_a, out_b, lse_b, out, lse);
    const auto ref = reference::attention(host.q, host.k, host.v);
    const Errors got = compare(out.to(Device::cpu()), lse.to(Device::cpu()), ref);
    EXPECT_TRUE(got.finite);
    EXPECT_LE(got.out, 2e-2);
    EXPECT_LE(got.lse, 2e-3);
    // In place: the result overwrites input a.
    if (dtype == DType::kBF16) {
      merge_attention_states(ExecContext{}, out_a, lse_a, out_b, lse_b, out_a, lse_a);
      const Errors in_place = compare(out_a.to(Device::cpu()), lse_a.to(Device::cpu()), ref);
      EXPECT_LE(in_place.out, 2e-2);
      EXPECT_LE(in_place.lse, 2e-3);
    }
  }
}

// A ring step merges a token range of batched (B, chunk, H, D) buffers (the real rows of a padded
// shard): strided views give the same bits as contiguous copies of them.
TEST(AttentionGpu, MergeOfTokenRangesOfBatchedBuffersEqualsContiguous) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda();
  const int64_t batch = 2, chunk = 160, rows = 143, heads = 3, dim = 64;
  const Qkv a = testing::random_qkv(batch, chunk, chunk, heads, heads, dim, DType::kBF16, 31);
  const Qkv b = testing::random_qkv(batch, chunk, chunk, heads, heads, dim, DType::kBF16, 32);
  auto range = [&](const Tensor& t) {
    return TensorView(t.data(), t.dtype(), t.device(), {batch, rows, heads, dim}, t.view().strides());
  };
  auto contiguous = [&](const Tensor& t) {
    Tensor c = Tensor::empty({batch, rows, heads, dim}, t.dtype());
    const Tensor host = t.to(Device::cpu());
    const int64_t row_bytes = rows * heads * dim * static_cast<int64_t>(dtype_size(t.dtype()));
    for (int64_t i = 0; i < batch; ++i)
      std::memcpy(static_cast<char*>(c.data()) + i * row_bytes,
                  static_cast<const char*>(host.data()) + i * (host.nbytes() / batch), static_cast<size_t>(row_bytes));
    return c.to(gpu);
  };
  const Tensor out_a = a.q.to(gpu), out_b = b.q.to(gpu);
  Tensor lse_a = Tensor::empty({batch, heads, rows}, DType::kF32), lse_b = Tensor::empty({batch, heads, rows}, DType::kF32);
  fill_normal(lse_a, 33);
  fill_normal(lse_b, 34);
  const Tensor lse_a_gpu = lse_a.to(gpu), lse_b_gpu = lse_b.to(gpu);
  Tensor strided_out = testing::poisoned({batch, chunk, heads, dim}, DType::kBF16).to(gpu);
  Tensor lse = Tensor::empty({batch, heads, rows}, DType::kF32, gpu);
  merge_attention_states(ExecContext{}, range(out_a), lse_a_gpu, range(out_b), lse_b_gpu, range(strided_out), lse);
  Tensor expected = Tensor::empty({batch, rows, heads, dim}, DType::kBF16, gpu);
  merge_attention_states(ExecContext{}, contiguous(out_a), lse_a_gpu, contiguous(out_b), lse_b_gpu, expected, lse);
  const Tensor got = contiguous(strided_out).to(Device::cpu()), want = expected.to(Device::cpu());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0);
  // The padding rows were not written: still the poison.
  const Tensor whole = strided_out.to(Device::cpu());
  EXPECT_TRUE(std::isnan(element_as_double(whole, rows * heads * dim)));
}

// The device merge reads four elements at a time where every row is aligned for it and one at a
// time otherwise: both paths agree with the CPU merge for every mix of dtypes, head dims that are
// and are not multiples of 4, and views whose rows start off the 4-element grid.
TEST(AttentionGpu, MergeMatchesTheCpuMergeOnBothAccessWidths) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda();
  uint64_t seed = 41;
  for (const int64_t dim : {128, 64, 62, 36})
    for (const int64_t offset : {0, 2})
      for (const auto& [in_dtype, out_dtype] :
           {std::pair{DType::kBF16, DType::kF32}, std::pair{DType::kF16, DType::kF16},
            std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kF32, DType::kF32}}) {
        SCOPED_TRACE(detail::concat("dim ", dim, " offset ", offset, " ", dtype_name(in_dtype), " -> ", dtype_name(out_dtype)));
        const int64_t batch = 2, seq = 37, heads = 3, row = heads * dim + offset;
        // Rows of `row` elements (an `offset` of padding per token), so offset 2 misaligns every row.
        const auto padded = [&](DType dtype, Device device, uint64_t s) {
          Tensor t = Tensor::empty({batch, seq, row}, dtype);
          fill_normal(t, s);
          return t.to(device);
        };
        const auto view = [&](const Tensor& t) {
          return TensorView(static_cast<char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype())), t.dtype(),
                            t.device(), {batch, seq, heads, dim}, {seq * row, row, dim, 1});
        };
        const Tensor a = padded(in_dtype, Device::cpu(), ++seed), b = padded(DType::kF32, Device::cpu(), ++seed);
        Tensor lse_a = Tensor::empty({batch, heads, seq}, DType::kF32), lse_b = Tensor::empty({batch, heads, seq}, DType::kF32);
        fill_normal(lse_a, ++seed);
        fill_normal(lse_b, ++seed);
        Tensor want = Tensor::empty({batch, seq, row}, out_dtype), want_lse = Tensor::empty({batch, heads, seq}, DType::kF32);
        merge_attention_states(ExecContext{}, view(a), lse_a, view(b), lse_b, view(want), want_lse);
        const Tensor a_gpu = a.to(gpu), b_gpu = b.to(gpu);
        Tensor got = testing::poisoned({batch, seq, row}, out_dtype).to(gpu);
        Tensor got_lse = Tensor::empty({batch, heads, seq}, DType::kF32, gpu);
        merge_attention_states(ExecContext{}, view(a_gpu), lse_a.to(gpu), view(b_gpu), lse_b.to(gpu), view(got), got_lse);
        const Tensor host = got.to(Device::cpu());
        const double tolerance = out_dtype == DType::kF32 ? 1e-5 : 1e-2;  // fp32 math; one rounding of the output
        double worst = 0.0;
        for (int64_t i = 0; i < batch * seq; ++i)
          for (int64_t e = offset; e < row; ++e) {
            const double w = element_as_double(want, i * row + e), g = element_as_double(host, i * row + e);
            worst = std::max(worst, std::abs(w - g) / (1.0 + std::abs(w)));
          }
        EXPECT_LE(worst, tolerance);
        const Tensor lse_host = got_lse.to(Device::cpu());
        for (int64_t i = 0; i < batch * heads * seq; ++i)
          EXPECT_NEAR(lse_host.data_as<float>()[i], want_lse.data_as<float>()[i], 1e-5);
      }
}

TEST(AttentionGpu, MergeWithEmptyPartsGivesZeroAndMinusInfinity) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda();
  const Shape shape = {1, 3, 1, 64};
  Tensor a = testing::poisoned(shape, DType::kF32);  // NaN where the lse says "no key"
  Tensor b = Tensor::empty(shape, DType::kF32);
  fill(b.view(), 0.5);
  Tensor lse_a = Tensor::empty({1, 1, 3}, DType::kF32), lse_b = Tensor::empty({1, 1, 3}, DType::kF32);
  const float inf = std::numeric_limits<float>::infinity();
  const float la[3] = {-inf, -inf, 1.0f}, lb[3] = {-inf, 2.0f, -inf};
  for (int i = 0; i < 3; ++i) lse_a.data_as<float>()[i] = la[i], lse_b.data_as<float>()[i] = lb[i];
  for (int64_t d = 0; d < 64; ++d) a.data_as<float>()[2 * 64 + d] = 0.25f;
  Tensor out = Tensor::empty(shape, DType::kF32, gpu), lse = Tensor::empty({1, 1, 3}, DType::kF32, gpu);
  merge_attention_states(ExecContext{}, a.to(gpu), lse_a.to(gpu), b.to(gpu), lse_b.to(gpu), out, lse);
  const Tensor o = out.to(Device::cpu()), l = lse.to(Device::cpu());
  EXPECT_EQ(l.data_as<float>()[0], -inf);
  EXPECT_FLOAT_EQ(l.data_as<float>()[1], 2.0f);
  EXPECT_FLOAT_EQ(l.data_as<float>()[2], 1.0f);
  EXPECT_EQ(o.data_as<float>()[0], 0.0f);
  EXPECT_FLOAT_EQ(o.data_as<float>()[64], 0.5f);
  EXPECT_FLOAT_EQ(o.data_as<float>()[128], 0.25f);
}


// A mask over 64 queries and 64 keys that keeps every block, on `gpu`.
BlockMask::DeviceCopy full_mask_of_64_tokens(Device gpu, int64_t block_q, int64_t block_kv) {
  BlockMaskShape shape;
  shape.seq_q = 64;
  shape.seq_kv = 64;
  shape.block_q = block_q;
  shape.block_kv = block_kv;
  return BlockMask::full(shape).to_device(gpu);
}

TEST(AttentionGpu, RejectsWhatTheKernelsCannotRun) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::cuda();
  const Tensor q80 = Tensor::empty({1, 64, 2, 80}, DType::kBF16, gpu);
  const Tensor o80 = Tensor::empty({1, 64, 2, 80}, DType::kBF16, gpu);
  expect_error_naming([&] { attention_forward(ExecContext{}, q80, q80, q80, o80, {}); }, "q");
  // Head dim 96 with 64-row query blocks: neither kernel runs it (the Hopper one takes 128 rows).
  const Tensor q96 = Tensor::empty({1, 64, 2, 96}, DType::kBF16, gpu);
  const Tensor o96 = Tensor::empty({1, 64, 2, 96}, DType::kBF16, gpu);
  const BlockMask::DeviceCopy mask64 = full_mask_of_64_tokens(gpu, 64, 64);
  expect_error_naming([&] { block_sparse_attention_forward(ExecContext{}, q96, q96, q96, mask64.view(), o96, {}); }, "q");
  // Head dims 192 and 256: the same with 64-row query blocks, and every call on a device without
  // the Hopper kernel (the sm_80 kernel has no instantiation for them): an Error, never a launch.
  for (const int64_t wide_dim : {192, 256}) {
    const Tensor qw = Tensor::empty({1, 64, 2, wide_dim}, DType::kBF16, gpu);
    const Tensor ow = Tensor::empty({1, 64, 2, wide_dim}, DType::kBF16, gpu);
    expect_error_naming([&] { block_sparse_attention_forward(ExecContext{}, qw, qw, qw, mask64.view(), ow, {}); }, "q");
    if (!hopper_device()) expect_error_naming([&] { attention_forward(ExecContext{}, qw, qw, qw, ow, {}); }, "q");
  }

  const Tensor q = Tensor::empty({1, 64, 2, 64}, DType::kBF16, gpu);
  Tensor out = Tensor::empty({1, 64, 2, 64}, DType::kBF16, gpu);
  // D not contiguous: a view with stride 2 along D over a buffer twice as large.
  const Tensor wide = Tensor::empty({1, 64, 2, 128}, DType::kBF16, gpu);
  const TensorView strided_k(wide.data(), DType::kBF16, gpu, {1, 64, 2, 64}, {64 * 2 * 128, 2 * 128, 128, 2});
  expect_error_naming([&] { attention_forward(ExecContext{}, q, strided_k, q, out, {}); }, "k");
  // Base pointer not 16-byte aligned.
  const TensorView shifted_v(static_cast<uint16_t*>(wide.data()) + 1, DType::kBF16, gpu, {1, 64, 2, 64},
                             {64 * 2 * 128, 2 * 128, 128, 1});
  expect_error_naming([&] { attention_forward(ExecContext{}, q, q, shifted_v, out, {}); }, "v");
  const Tensor q32 = Tensor::empty({1, 64, 2, 64}, DType::kF32, gpu);
  const Tensor o32 = Tensor::empty({1, 64, 2, 64}, DType::kF32, gpu);
  expect_error_naming([&] { attention_forward(ExecContext{}, q32, q32, q32, o32, {}); }, "q");
  // A mask whose kv block is not a multiple of 64.
  const BlockMask::DeviceCopy mask = full_mask_of_64_tokens(gpu, 128, 32);
  expect_error_naming([&] { block_sparse_attention_forward(ExecContext{}, q, q, q, mask.view(), out, {}); }, "block_kv");
}

#ifdef TESSEL_WITH_CUDA
TEST(AttentionGpu, GraphCaptureReplaysTheSameOutput) {
  SKIP_WITHOUT_GPU();
  const int64_t seq = 700, heads = 4, dim = 128;
  const Qkv host = testing::random_qkv(1, seq, seq, heads, 2, dim, DType::kBF16, 31);
  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  BlockMaskShape shape;
  shape.mask_heads = heads;
  shape.seq_q = seq;
  shape.seq_kv = seq;
  const BlockMask::DeviceCopy mask = BlockMask::random(shape, 0.4, 3).to_device(gpu);
  Tensor eager = Tensor::empty({1, seq, heads, dim}, DType::kBF16, gpu);
  Tensor graphed = testing::poisoned({1, seq, heads, dim}, DType::kBF16).to(gpu);
  Tensor lse = Tensor::empty({1, heads, seq}, DType::kF32, gpu);
  block_sparse_attention_forward(ExecContext{}, q, k, v, mask.view(), eager, lse);

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // The plan's workspace (reserved before the capture): the captured sparse calls sort their rows
  // longest first, the eager one above ran in the static order; both give the same bits.
  Workspace workspace(gpu);
  {
    ExecContext on_stream;
    on_stream.device = Device::cuda();
    on_stream.stream = stream;
    workspace.reserve(attention_workspace_bytes(on_stream, gpu, {1, seq, seq, heads, 2, dim}, shape.block_kv));
    on_stream.workspace = &workspace;
    // One eager planned call first (after the default stream's call, which writes lse too): the
    // capture then finds the ordering kernel loaded.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor warm_up = Tensor::empty({1, seq, heads, dim}, DType::kBF16, gpu);
    block_sparse_attention_forward(on_stream, q, k, v, mask.view(), warm_up, lse);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    block_sparse_attention_forward(on_stream, q, k, v, mask.view(), graphed, lse);
    attention_forward(on_stream, q, k, v, graphed, lse);  // dense into the same buffer, then sparse again
    block_sparse_attention_forward(on_stream, q, k, v, mask.view(), graphed, lse);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  }
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const Tensor a = eager.to(Device::cpu()), b = graphed.to(Device::cpu());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "graph replay differs from the eager launch";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace tessel
