// CFG-parallel: the two branches of classifier-free guidance (conditional, unconditional) run on
// the two ranks of a CFG group, each the whole model on its own prompt; their noise predictions are
// then gathered so that every rank can apply the guidance.
#pragma once

#include "tessel/parallel/communicator.h"

namespace tessel {

// The branch a rank of the CFG group computes: 0 = conditional, 1 = unconditional.
int cfg_branch(const Communicator& cfg_group);

// branches (G, ...) = the `prediction` tensors of CFG ranks 0 .. G-1 (G = cfg_group.size()),
// stacked: branches[0] the conditional, branches[1] the unconditional prediction. Collective over
// `cfg_group`; prediction contiguous, branches contiguous of G times its shape.
void gather_cfg_branches(const ExecContext& ctx, Communicator& cfg_group, const TensorView& prediction,
                         const TensorView& branches);

}  // namespace tessel
