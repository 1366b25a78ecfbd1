// Sequence shards: the cut of a global token sequence over the sequence-parallel ranks.
#include "tessel/parallel/sequence_sharding.h"

#include <algorithm>

#include "row_copy.h"
#include "tessel/core/error.h"

namespace tessel {

using parallel_detail::contiguous_prefix;
using parallel_detail::copy_rows;
using parallel_detail::narrow;
using parallel_detail::select_first;
using parallel_detail::zero_rows;

SequenceSharding SequenceSharding::make(int64_t length, int64_t parts, int64_t alignment) {
  if (length < 0) fail_argument("length", ">= 0", length);
  if (parts < 1) fail_argument("parts", ">= 1", parts);
  if (alignment < 1) fail_argument("alignment", ">= 1", alignment);
  const int64_t even = length / parts + (length % parts != 0);
  const int64_t aligned = (even / alignment + (even % alignment != 0)) * alignment;
  return {length, parts, alignment, aligned};
}

int64_t SequenceSharding::valid(int64_t part) const {
  if (part < 0 || part >= parts) fail_argument("part", detail::concat("in [0, ", parts, ")"), part);
  return std::clamp<int64_t>(length - begin(part), 0, shard_length);
}

namespace {

void check_sequence(const TensorView& t, int64_t expected, const std::string& argument) {
  if (t.dim() < 2) fail_argument(argument, "a tensor (B, S, ...)", t.describe());
  if (t.size(1) != expected) fail_argument(argument, detail::concat("sequence length ", expected), shape_str(t.shape()));
}

// The same shape as `shard` with the sequence length of `full`, apart from it.
void check_same_rows(const TensorView& full, const TensorView& shard) {
  Shape expected = shard.shape();
  expected[1] = full.size(1);
  check_shape(full, expected, "full");
}

// Where shard `part`'s real tokens start in the global sequence (its end for an empty shard).
int64_t first_token(const SequenceSharding& sharding, int64_t part) {
  return std::min(sharding.begin(part), sharding.length);
}

}  // namespace

void take_shard(const ExecContext& ctx, const SequenceSharding& sharding, int64_t part, const TensorView& full,
                const TensorView& shard) {
  check_sequence(full, sharding.length, "full");
  check_sequence(shard, sharding.shard_length, "shard");
  check_same_rows(full, shard);
  const int64_t valid = sharding.valid(part);
  copy_rows(ctx, narrow(full, 1, first_token(sharding, part), valid), narrow(shard, 1, 0, valid));
  zero_rows(ctx, narrow(shard, 1, valid, sharding.shard_length - valid));
}

size_t gather_staging_bytes(const SequenceSharding& sharding, const TensorView& shard) {
  return shard.nbytes() * static_cast<size_t>(sharding.parts);
}

void gather_shards(const ExecContext& ctx, Communicator& comm, const SequenceSharding& sharding, const TensorView& shard,
                   const TensorView& staging, const TensorView& full) {
  if (comm.size() != sharding.parts)
    fail_argument("comm", detail::concat("a group of ", sharding.parts, " ranks (the shards)"), comm.size());
  check_sequence(full, sharding.length, "full");
  check_sequence(shard, sharding.shard_length, "shard");
  check_same_rows(full, shard);
  check_contiguous(shard, "shard");
  if (staging.nbytes() < gather_staging_bytes(sharding, shard))
    fail_argument("staging", detail::concat(gather_staging_bytes(sharding, shard), " bytes or more"), staging.nbytes());
  Shape stacked = shard.shape();
  stacked.insert(stacked.begin(), sharding.parts);
  const TensorView gathered = contiguous_prefix(TensorView(staging.data(), shard.dtype(), staging.device(),
                                                           {static_cast<int64_t>(staging.nbytes() / dtype_size(shard.dtype()))}),
                                                stacked);
  comm.all_gather(ctx, shard, gathered);
  for (int64_t part = 0; part < sharding.parts; ++part) {
    const int64_t valid = sharding.valid(part);
    copy_rows(ctx, narrow(select_first(gathered, part), 1, 0, valid), narrow(full, 1, first_token(sharding, part), valid));
  }
}

}  // namespace tessel
