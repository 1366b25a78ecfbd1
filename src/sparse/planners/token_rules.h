// Internal: the token-pair rules of the static patterns, evaluated one query token at a time.
// A rule marks, for query position i (original sequence order), every key position it keeps as
// inclusive ranges; the KeyMarker turns them into kv-block flags of one mask row, through the
// plan's token permutation when there is one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/sparse/planners/static_patterns.h"

namespace tessel::planners {

class KeyMarker {
 public:
  // inverse: original position -> permuted position, or null for raster order. Orderings only
  // move tokens within their frame (text keeps its positions), so whole frames and text stay
  // contiguous: [frames_begin, frames_end) is the image span and frame_tokens its frame size.
  KeyMarker(uint8_t* flags, int64_t block_kv, const int32_t* inverse, int64_t frames_begin = 0, int64_t frames_end = 0,
            int64_t frame_tokens = 1)
      : flags_(flags), block_kv_(block_kv), inverse_(inverse), frames_begin_(frames_begin), frames_end_(frames_end),
        frame_tokens_(frame_tokens) {}

  void range(int64_t lo, int64_t hi) {
    if (lo > hi) return;
    if (inverse_ == nullptr) {
      contiguous(lo, hi);
      return;
    }
    // Text before and after the image: identity positions.
    if (lo < frames_begin_) contiguous(lo, std::min(hi, frames_begin_ - 1));
    if (hi >= frames_end_) contiguous(std::max(lo, frames_end_), hi);
    const int64_t a = std::max(lo, frames_begin_), b = std::min(hi, frames_end_ - 1);
    if (a > b) return;
    // Whole frames inside [a, b] map onto themselves; only the partial frames at the ends need
    // the permutation token by token.
    const int64_t first_full = frames_begin_ + ((a - frames_begin_ + frame_tokens_ - 1) / frame_tokens_) * frame_tokens_;
    const int64_t end_full = frames_begin_ + ((b + 1 - frames_begin_) / frame_tokens_) * frame_tokens_;
    if (first_full >= end_full) {
      one_by_one(a, b);
      return;
    }
    one_by_one(a, first_full - 1);
    contiguous(first_full, end_full - 1);
    one_by_one(end_full, b);
  }

 private:
  void contiguous(int64_t lo, int64_t hi) {
    for (int64_t kb = lo / block_kv_; kb <= hi / block_kv_; ++kb) flags_[kb] = 1;
  }
  void one_by_one(int64_t lo, int64_t hi) {
    for (int64_t j = lo; j <= hi; ++j) flags_[inverse_[j] / block_kv_] = 1;
  }

  uint8_t* flags_;
  int64_t block_kv_;
  const int32_t* inverse_;
  int64_t frames_begin_, frames_end_, frame_tokens_;
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
