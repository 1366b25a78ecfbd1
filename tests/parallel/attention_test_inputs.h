// The inputs of the multi-process attention tests (parallel_attention_mpi_test,
// ulysses_head_groups_mpi_test): seeded q, k, v and mask, the same on every rank that passes the
// same seed, one rank's shards of them, and the largest elementwise difference of two CPU tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessel/core/random.h"
#include "tessel/core/tensor.h"
#include "tessel/parallel/sequence_sharding.h"
#include "tessel/sparse/block_mask.h"
#include "tessel/sparse/planners/static_patterns.h"

namespace tessel::testing {

struct AttentionCase {
  int64_t batch = 2, seq = 37, heads = 8, kv_heads = 4, head_dim = 16;
  int64_t block_q = 0, block_kv = 0;  // 0: dense
  int64_t mask_batch = 1, mask_heads = 1;
  DType dtype = DType::kF32;
  bool radial = false;  // the mask is Radial Attention's plan for a 5x3x3 latent grid (seq 45)
};

struct AttentionInputs {
  Tensor q, k, v;
  BlockMask mask;
};

// q and k normal, v uniform (seeds seed+1 .. seed+3), in c.dtype; with blocks, the radial plan or a
// random mask of density 0.25 (seed+4) in which one query block of mask head 0 sees nothing (its
// rows must come out 0 on every strategy).
inline AttentionInputs make_attention_inputs(const AttentionCase& c, uint64_t seed) {
  AttentionInputs in{Tensor::empty({c.batch, c.seq, c.heads, c.head_dim}, DType::kF32),
                     Tensor::empty({c.batch, c.seq, c.kv_heads, c.head_dim}, DType::kF32),
                     Tensor::empty({c.batch, c.seq, c.kv_heads, c.head_dim}, DType::kF32), {}};
  fill_normal(in.q, seed + 1);
  fill_normal(in.k, seed + 2);
  fill_uniform(in.v, seed + 3);
  if (c.radial) {
    StaticPlanRequest request;
    request.layout.grid = {5, 3, 3};
    request.block_q = c.block_q;
    request.block_kv = c.block_kv;
    in.mask = plan_static_pattern(StaticPattern{RadialPattern{}}, request).mask;
  } else if (c.block_q > 0) {
    const BlockMaskShape shape{c.mask_batch, c.mask_heads, c.seq, c.seq, c.block_q, c.block_kv};
    std::vector<uint8_t> dense = BlockMask::random(shape, 0.25, seed + 4).to_dense();
    const int64_t kv_blocks = shape.kv_blocks();
    std::fill(dense.begin() + kv_blocks, dense.begin() + 2 * kv_blocks, 0);
    in.mask = BlockMask::from_dense(shape, dense);
  }
  if (c.dtype != DType::kF32) {
    in.q = in.q.to(c.dtype);
    in.k = in.k.to(c.dtype);
    in.v = in.v.to(c.dtype);
  }
  return in;
}

// One rank's shard `part` of q, k and v, and an output buffer of q's shape poisoned with NaN.
struct AttentionShards {
  Tensor q, k, v, out;
};
inline AttentionShards take_attention_shards(const AttentionCase& c, const SequenceSharding& sharding, int64_t part,
                                             const AttentionInputs& in) {
  const ExecContext ctx;
  const int64_t L = sharding.shard_length;
  AttentionShards s{Tensor::empty({c.batch, L, c.heads, c.head_dim}, c.dtype), Tensor::empty({c.batch, L, c.kv_heads, c.head_dim}, c.dtype),
                    Tensor::empty({c.batch, L, c.kv_heads, c.head_dim}, c.dtype), Tensor::empty({c.batch, L, c.heads, c.head_dim}, c.dtype)};
  fill(s.out, std::nan(""));
  take_shard(ctx, sharding, part, in.q, s.q);
  take_shard(ctx, sharding, part, in.k, s.k);
  take_shard(ctx, sharding, part, in.v, s.v);
  return s;
}

inline double max_abs_difference(const TensorView& a, const TensorView& b) {
  double worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(element_as_double(a, i) - element_as_double(b, i)));
  return worst;
}

}  // namespace tessel::testing
