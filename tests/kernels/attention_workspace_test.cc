// CPU attention takes its scratch from the context's workspace: a workspace of
// attention_workspace_bytes() gives the same result as none, a smaller one is refused before
// anything is written, and repeated calls reuse it.
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "kernels/attention_test_util.h"
#include "tessel/core/exec_context.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/block_mask.h"

namespace tessel {
namespace {

using testing::poisoned;
using testing::random_qkv;

AttentionDims dims_of(const testing::Qkv& t) {
  return {t.q.size(0), t.q.size(1), t.k.size(1), t.q.size(2), t.k.size(2), t.q.size(3)};
}

bool same_bytes(const Tensor& a, const Tensor& b) { return std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

TEST(AttentionWorkspace, ReservedWorkspaceGivesTheSameResultAsNone) {
  const testing::Qkv t = random_qkv(2, 300, 257, 8, 2, 64, DType::kBF16, 5);
  BlockMaskShape shape{1, 8, 300, 257, 128, 64};
  const BlockMask mask = BlockMask::random(shape, 0.5, 9);
  ExecContext ctx;
  ctx.num_threads = 2;
  Workspace workspace;
  workspace.reserve(attention_workspace_bytes(ctx, Device::cpu(), dims_of(t), 64));
  const size_t reserved = workspace.capacity();
  ExecContext with = ctx.with_workspace(&workspace);

  Tensor dense_own = poisoned(t.q.shape(), DType::kBF16), dense_ws = poisoned(t.q.shape(), DType::kBF16);
  Tensor sparse_own = poisoned(t.q.shape(), DType::kBF16), sparse_ws = poisoned(t.q.shape(), DType::kBF16);
  attention_forward(ctx, t.q, t.k, t.v, dense_own, {});
  block_sparse_attention_forward(ctx, t.q, t.k, t.v, mask.view(), sparse_own, {});
  for (int call = 0; call < 2; ++call) {
    attention_forward(with, t.q, t.k, t.v, dense_ws, {});
    block_sparse_attention_forward(with, t.q, t.k, t.v, mask.view(), sparse_ws, {});
  }
  EXPECT_TRUE(same_bytes(dense_own, dense_ws));
  EXPECT_TRUE(same_bytes(sparse_own, sparse_ws));
  EXPECT_EQ(workspace.capacity(), reserved);  // reused, never grown by a call
}

TEST(AttentionWorkspace, ShortWorkspaceIsRefusedBeforeWriting) {
  const testing::Qkv t = random_qkv(1, 128, 128, 4, 4, 32, DType::kF32, 6);
  ExecContext ctx;
  ctx.num_threads = 2;
  const size_t needed = attention_workspace_bytes(ctx, Device::cpu(), dims_of(t));
  ASSERT_GT(needed, kWorkspaceAlignment);
  Workspace workspace;
  workspace.reserve(needed - kWorkspaceAlignment);
  ctx.workspace = &workspace;
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  const Tensor before = out.clone();
  try {
    attention_forward(ctx, t.q, t.k, t.v, out, {});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(same_bytes(before, out));

  // More threads than the workspace was sized for need more scratch, also refused.
  Workspace two_threads;
  two_threads.reserve(needed);
  ExecContext four = ctx.with_workspace(&two_threads);
  four.num_threads = 4;
  EXPECT_GT(attention_workspace_bytes(four, Device::cpu(), dims_of(t)), needed);
  EXPECT_THROW(attention_forward(four, t.q, t.k, t.v, out, {}), Error);
}

TEST(AttentionWorkspace, SizesOnCudaAndChecksOfTheDims) {
  const ExecContext ctx;
  EXPECT_EQ(attention_workspace_bytes(ctx, Device::cuda(0), {1, 128, 128, 8, 8, 64}), 0u);
#ifdef TESSEL_WITH_CUDA
  // Block masks on CUDA: the work order of 2 x 8 x 3 items (int32 each) and its counter.
  EXPECT_EQ(attention_workspace_bytes(ctx, Device::cuda(0), {2, 300, 300, 8, 8, 64}, 64),
            workspace_slice_bytes(2 * 8 * 3 * sizeof(int32_t)) + workspace_slice_bytes(sizeof(int32_t)));
#else
  EXPECT_EQ(attention_workspace_bytes(ctx, Device::cuda(0), {2, 300, 300, 8, 8, 64}, 64), 0u);
#endif
  EXPECT_THROW(attention_workspace_bytes(ctx, Device::cpu(), {1, 128, 128, 6, 4, 64}), Error);
  EXPECT_THROW(attention_workspace_bytes(ctx, Device::cpu(), {1, 128, 128, 8, 8, 64}, -1), Error);
  Workspace device_memory(Device::cuda(0));  // never reserved: no allocation happens
  ExecContext on_device = ctx.with_workspace(&device_memory);
  const testing::Qkv t = random_qkv(1, 16, 16, 1, 1, 16, DType::kF32, 7);
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  EXPECT_THROW(attention_forward(on_device, t.q, t.k, t.v, out, {}), Error);
}

}  // namespace
}  // namespace tessel
