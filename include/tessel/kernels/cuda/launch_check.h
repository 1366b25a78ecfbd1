// Launch error checking for tessel's CUDA code (internal). Kernels launch on the stream of the
// ExecContext the caller passed (tessel/core/exec_context.h); there is no stream state here.
#pragma once

namespace tessel::cuda {

// Throws tessel::Error naming `what` when a launch or runtime call failed.
void check_launch(const char* what);

}  // namespace tessel::cuda
