// Sub-block masks through the block_sparse backend on CUDA tensors: the plan uploads the packed
// bits beside the mask and the forward runs the sm_80 block-sparse kernel with them; the output
// equals dense attention under the token mask (masked_attention_forward on the host copies) within
// bf16 rounding, and rows left with no key give 0 and lse -inf. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sparse/sparse_test_util.h"
#include "tessel/core/device.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/sparse_attention.h"

namespace tessel {
namespace {

using namespace tessel::testing;

TEST(SubBlockBackendGpu, EqualsDenseAttentionUnderTheTokenMask) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible (or tessel built without CUDA): GPU test skipped";
  const int64_t seq_q = 333, seq_kv = 301, heads = 4, kv_heads = 2, dim = 128, block_q = 128, block_kv = 64;
  const Qkv host = random_qkv(1, seq_q, seq_kv, heads, kv_heads, dim, DType::kBF16, 77);
  PatternSpec spec;
  spec.type = PatternType::kBlockSparse;
  spec.block_q = block_q;
  spec.block_kv = block_kv;
  spec.block_mask = std::make_shared<const BlockMask>(BlockMask::random({1, heads, seq_q, seq_kv, block_q, block_kv}, 0.5, 77));
  // Pairs kept with probability 0.4; query rows i % 5 == 2 keep none (no key at all).
  std::mt19937_64 rng(77);
  std::bernoulli_distribution bit(0.4);
  const int64_t nnz = spec.block_mask->nnz();
  spec.sub_block_mask.resize(static_cast<size_t>(nnz * block_q * block_kv));
  Tensor dense_mask = Tensor::zeros({1, heads, seq_q, seq_kv}, DType::kU8);
  const BlockMask& mask = *spec.block_mask;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t qb = 0; qb < mask.shape().q_blocks(); ++qb) {
      const int64_t row = h * mask.shape().q_blocks() + qb;
      for (int32_t n = mask.indptr()[static_cast<size_t>(row)]; n < mask.indptr()[static_cast<size_t>(row + 1)]; ++n)
        for (int64_t r = 0; r < block_q; ++r)
          for (int64_t c = 0; c < block_kv; ++c) {
            const int64_t i = qb * block_q + r, j = mask.indices()[static_cast<size_t>(n)] * block_kv + c;
            const uint8_t keep = (i % 5 != 2 && bit(rng)) ? 1 : 0;
            spec.sub_block_mask[static_cast<size_t>((n * block_q + r) * block_kv + c)] = keep;
            if (i < seq_q && j < seq_kv) dense_mask.data_as<uint8_t>()[(h * seq_q + i) * seq_kv + j] = keep;
          }
    }

  const Device gpu = Device::cuda();
  const Tensor q = host.q.to(gpu), k = host.k.to(gpu), v = host.v.to(gpu);
  const auto backend = make_block_sparse_backend();
  const auto metadata =
      backend->make_metadata_builder()->plan(ExecContext{}, spec, ModuleType::kDitSelf, AttentionShape::of(q, k, v));
  Tensor out = poisoned(host.q.shape(), DType::kBF16).to(gpu);
  Tensor lse = poisoned({1, heads, seq_q}, DType::kF32).to(gpu);
  backend->make_impl()->forward(ExecContext{}, q, k, v, *metadata, StepInfo{}, out, lse);
  const Tensor got = out.to(Device::cpu()), got_lse = lse.to(Device::cpu());

  Tensor want = poisoned(host.q.shape(), DType::kF32), want_lse = poisoned({1, heads, seq_q}, DType::kF32);
  masked_attention_forward(ExecContext{}, host.q.to(DType::kF32), host.k.to(DType::kF32), host.v.to(DType::kF32),
                           dense_mask, want, want_lse, 0.0f);
  expect_outputs_near(got, want, 2e-2, got_lse, want_lse, 2e-2);
}

}  // namespace
}  // namespace tessel
