// Head classification (head_classifier.h) on the structured synthetic video data, whose heads are
// built with known roles: spatial heads must be classified spatial, temporal heads temporal, and
// the sink and diffuse heads (whose mass neither window holds) textural. Fresh seeds, two grids.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "quality/synthetic_video.h"
#include "tessel/core/error.h"
#include "tessel/sparse/estimators/head_classifier.h"

namespace tessel {
namespace {

HeadClass expected_class(SyntheticHeadType type) {
  switch (type) {
    case SyntheticHeadType::kSpatial: return HeadClass::kSpatial;
    case SyntheticHeadType::kTemporal: return HeadClass::kTemporal;
    default: return HeadClass::kTextural;
  }
}

// Fraction of heads classified as their role says, over several seeds and sharpness values;
// `misses` lists the others with their statistics.
double accuracy(const TokenGrid& grid, int64_t heads, int64_t head_dim, const HeadClassifierOptions& options,
                std::string& misses) {
  const HeadClassPlans plans = plan_head_classes(TokenLayout{grid, 0, true}, options);
  int64_t right = 0, total = 0;
  for (uint64_t seed : {31u})
    for (double sharpness : {0.8, 1.2}) {
      SyntheticVideoOptions o;
      o.grid = grid;
      o.heads = heads;
      o.head_dim = head_dim;
      o.sharpness = sharpness;
      o.seed = seed;
      const SyntheticQkv data = make_synthetic_video_qkv(o);
      const HeadProbe probe = probe_head_classes(ExecContext{}, data.q, data.k, plans, options);
      for (int64_t h = 0; h < heads; ++h) {
        const HeadClass want = expected_class(data.head_types[static_cast<size_t>(h)]);
        const HeadClass got = probe.classes[static_cast<size_t>(h)];
        right += got == want;
        ++total;
        if (got != want)
          misses += detail::concat("seed ", seed, " sharpness ", sharpness, " head ", h, " (",
                                   synthetic_head_type_name(data.head_types[static_cast<size_t>(h)]), "): ",
                                   head_class_name(got), ", frame mass ", probe.frame_mass[static_cast<size_t>(h)],
                                   " temporal lift ", probe.temporal_lift[static_cast<size_t>(h)], "\n");
      }
    }
  return static_cast<double>(right) / static_cast<double>(total);
}

TEST(HeadClassifier, ClassifiesTheSyntheticHeadsByRole) {
  HeadClassifierOptions options;
  options.block_q = 64;
  options.block_kv = 64;
  std::string misses;
  EXPECT_GE(accuracy({9, 16, 16}, 12, 64, options, misses), 0.95) << misses;
  misses.clear();
  EXPECT_GE(accuracy({5, 12, 20}, 6, 64, options, misses), 0.95) << misses;  // odd frame count, wide frames
  misses.clear();
  EXPECT_GE(accuracy({9, 32, 32}, 12, 64, options, misses), 0.95) << misses;
}

}  // namespace
}  // namespace tessel
