// How a global token sequence is cut into equal shards, one per sequence-parallel rank.
//
// Shard i holds the global tokens [i * shard_length, i * shard_length + valid(i)); every shard is
// shard_length tokens long, the tail of the last non-empty shard and any empty shards being padding
// (zeros in, zeros out, never attended to). shard_length is ceil(length / parts) rounded up to
// `alignment`: the parallel attention asks for the block sizes of its masks under Ring, so that a
// shard boundary is a block boundary and every rank's slice of a block mask is a block mask.
#pragma once

#include <cstdint>

#include "tessel/parallel/communicator.h"

namespace tessel {

struct SequenceSharding {
  int64_t length = 0;        // global tokens
  int64_t parts = 1;
  int64_t alignment = 1;
  int64_t shard_length = 0;  // padded tokens per shard

  // Throws Error naming the argument when length < 0, parts < 1 or alignment < 1.
  static SequenceSharding make(int64_t length, int64_t parts, int64_t alignment = 1);

  int64_t begin(int64_t part) const { return part * shard_length; }
  // Real (non-padding) tokens of shard `part`.
  int64_t valid(int64_t part) const;
  int64_t padded_length() const { return shard_length * parts; }
};

// Copies shard `part` of `full` (B, length, ...) into `shard` (B, shard_length, ...) and zeroes its
// padding. Both on one device, same dtype, innermost dimension contiguous.
void take_shard(const ExecContext& ctx, const SequenceSharding& sharding, int64_t part, const TensorView& full,
                const TensorView& shard);

// The inverse over a group: every rank passes its shard (part = its rank in `comm`) and receives
// the whole sequence into `full` (B, length, ...), padding dropped. `staging` is contiguous scratch
// of parts * shard bytes on the communicator's device (gather_staging_bytes).
size_t gather_staging_bytes(const SequenceSharding& sharding, const TensorView& shard);
void gather_shards(const ExecContext& ctx, Communicator& comm, const SequenceSharding& sharding, const TensorView& shard,
                   const TensorView& staging, const TensorView& full);

}  // namespace tessel
