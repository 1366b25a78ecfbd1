// Wan's 3-D rotary position embedding: the head dimension's pairs are split into frames
// (head_dim - 4 * (head_dim / 6) dimensions), height and width (2 * (head_dim / 6) each), in that
// order; pair j of an axis with d dimensions rotates by position * 10000^(-2j / d). Angles are
// computed in double and rounded to fp32, as diffusers builds its tables.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/dit/wan_config.h"

namespace tessel {

class WanRope {
 public:
  // Tables for the tokens of a (frames, height, width) patch grid, frame-major.
  WanRope(const WanConfig& config, int64_t frames, int64_t height, int64_t width);

  // (tokens, head_dim / 2) cosines and sines, for dit::rotate_pairs.
  const float* cos() const { return cos_.data(); }
  const float* sin() const { return sin_.data(); }

 private:
  std::vector<float> cos_, sin_;
};

}  // namespace tessel
