// CFG-parallel: gathering the guidance branches' predictions.
#include "tessel/parallel/cfg_parallel.h"

#include "tessel/core/error.h"

namespace tessel {

int cfg_branch(const Communicator& cfg_group) { return cfg_group.rank(); }

void gather_cfg_branches(const ExecContext& ctx, Communicator& cfg_group, const TensorView& prediction,
                         const TensorView& branches) {
  Shape stacked = prediction.shape();
  stacked.insert(stacked.begin(), cfg_group.size());
  check_shape(branches, stacked, "branches");
  check_dtype(branches, prediction.dtype(), "branches");
  cfg_group.all_gather(ctx, prediction, branches);
}

}  // namespace tessel
