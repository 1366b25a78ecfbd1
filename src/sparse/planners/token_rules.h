// Internal: the token-pair rules of the static patterns, evaluated one query token at a time.
// A rule marks, for query position i (original sequence order), every key position it keeps as
// inclusive ranges; the KeyMarker turns them into kv-block flags of one mask row, through the
// plan's token permutation when there is one.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/sparse/planners/static_patterns.h"

namespace tessel::planners {

class KeyMarker {
 public:
  // inverse: original position -> permuted position, or null for raster order.
  KeyMarker(uint8_t* flags, int64_t block_kv, const int32_t* inverse) : flags_(flags), block_kv_(block_kv), inverse_(inverse) {}
  void range(int64_t lo, int64_t hi) {
    if (lo > hi) return;
    if (inverse_ == nullptr) {
      for (int64_t kb = lo / block_kv_; kb <= hi / block_kv_; ++kb) flags_[kb] = 1;
    } else {
      for (int64_t j = lo; j <= hi; ++j) flags_[inverse_[j] / block_kv_] = 1;
    }
  }

 private:
  uint8_t* flags_;
  int64_t block_kv_;
  const int32_t* inverse_;
};

class TokenRule {
 public:
  virtual ~TokenRule() = default;
  virtual void mark(int64_t query, KeyMarker& keys) const = 0;
};

// Builds the rule of a pattern (arrow and composite excluded: the planner handles them). Throws
// Error on invalid parameters, naming the field.
std::unique_ptr<TokenRule> make_token_rule(const StaticPattern& pattern, const TokenLayout& layout, int64_t block_q);

}  // namespace tessel::planners
