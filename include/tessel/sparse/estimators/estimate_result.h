// What a dynamic (data-dependent) mask estimator returns: the mask and the wall time the
// estimation took, reported apart from the attention that uses the mask.
#pragma once

#include "tessel/sparse/block_mask.h"

namespace tessel {

struct EstimateResult {
  BlockMask mask;
  double estimate_ms = 0.0;
};

}  // namespace tessel
