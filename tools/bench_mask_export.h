// `tessel bench --save-mask DIR`: writes each mask the bench uses in FlexAttention's form, so
// bench/peer_attention.py can time FlexAttention on the very same blocks.
//
// For a mask NAME: DIR/NAME.json (seq_q, seq_kv, block_q, block_kv, mask_batch, mask_heads,
// q_blocks, kv_blocks, density), DIR/NAME.kv_num_blocks.i32 (B_m, H_m, Qb) and
// DIR/NAME.kv_indices.i32 (B_m, H_m, Qb, KVb), raw little-endian int32.
#pragma once

#include <string>

#include "bench.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::cli {

// Writes `mask` (or, when null, the full mask of the dense run) under config.save_mask_dir,
// named after the sequence length, requested density and block sizes. Throws Error on I/O failure.
void save_bench_mask(const BenchConfig& config, double requested_density, const BlockMask* mask);

}  // namespace tessel::cli
