// The built-in backends, written against the same Backend interface as plugins. An application
// registers them explicitly (register_builtin_backends); these factories also let tests and tools
// make fresh instances.
//
//   dense        DenseFallbackBackend: exact dense attention for every pattern (it
//                ignores the pattern), the correctness oracle. Score -1: never chosen by "auto".
//   block_sparse Executes PatternType::kBlockSparse (spec.block_mask) and kSlidingWindow on the
//                block-sparse kernel, with the always-keep options. The window is block-granular:
//                q block i keeps kv block j when some query of i and some key of j satisfy
//                |q + (S_kv - S_q) - k| <= window_size; kept blocks are computed whole.
#pragma once

#include <memory>

#include "tessel/sparse/backend.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/registry.h"

namespace tessel {

// Registers every built-in backend in `registry`: dense, block_sparse, then the pattern library's
// (register_pattern_backends in pattern_backends.h). Throws Error when a name is taken already.
void register_builtin_backends(BackendRegistry& registry);

std::shared_ptr<Backend> make_dense_backend();
std::shared_ptr<Backend> make_block_sparse_backend();

// The block_sparse backend's planners, exposed for reuse and tests.
PlannedMask plan_explicit_block_mask(const PatternSpec& spec, ModuleType module, const AttentionShape& shape);
PlannedMask plan_sliding_window_blocks(const PatternSpec& spec, ModuleType module, const AttentionShape& shape);

}  // namespace tessel
