#include "wan_rope.h"

#include <cmath>

namespace tessel {

WanRope::WanRope(const WanConfig& config, int64_t frames, int64_t height, int64_t width) {
  const int64_t head_dim = config.attention_head_dim;
  const int64_t spatial_dim = 2 * (head_dim / 6);
  const int64_t axis_dims[3] = {head_dim - 2 * spatial_dim, spatial_dim, spatial_dim};
  // For each pair of the head: which axis it rotates along, and its frequency.
  std::vector<int> pair_axis;
  std::vector<double> pair_frequency;
  for (int axis = 0; axis < 3; ++axis)
    for (int64_t j = 0; j < axis_dims[axis] / 2; ++j) {
      pair_axis.push_back(axis);
      pair_frequency.push_back(1.0 / std::pow(10000.0, static_cast<double>(2 * j) / static_cast<double>(axis_dims[axis])));
    }
  const size_t pairs = pair_axis.size();
  const size_t tokens = static_cast<size_t>(frames * height * width);
  cos_.resize(tokens * pairs);
  sin_.resize(tokens * pairs);
  size_t token = 0;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x, ++token) {
        const int64_t position[3] = {f, y, x};
        for (size_t p = 0; p < pairs; ++p) {
          const double angle = static_cast<double>(position[pair_axis[p]]) * pair_frequency[p];
          cos_[token * pairs + p] = static_cast<float>(std::cos(angle));
          sin_[token * pairs + p] = static_cast<float>(std::sin(angle));
        }
      }
}

}  // namespace tessel
