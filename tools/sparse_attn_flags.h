// The --sparse-attn-* flags shared by CLI commands (bench, backends, ...). Header-only so tests can
// parse command lines with it too.
#pragma once

#include <CLI/CLI.hpp>

#include "tessel/sparse/config.h"

namespace tessel::cli {

inline void add_sparse_attn_flags(CLI::App& app, SparseAttnFlags& flags) {
  app.add_option("--sparse-attn-backend", flags.backend,
                 "Sparse attention backend: a registered name, /path/libx.so[:symbol], auto or none "
                 "(env TESSEL_SPARSE_ATTN_BACKEND overrides)");
  app.add_option("--sparse-attn-topk", flags.topk, "Top-k ratio of kv blocks kept per row, in (0, 1]");
  app.add_option("--sparse-attn-schedule", flags.schedule, "Sparsity schedule: constant | conservative | aggressive");
  app.add_option("--sparse-attn-pattern", flags.pattern,
                 "Pattern type: dense, block_sparse, sliding_window, spatial_aware, dynamic_topk, threshold, "
                 "radial, local, arrow, composite");
  app.add_option("--sparse-attn-config", flags.config,
                 "Sparse attention config as JSON, or @file.json (env TESSEL_SPARSE_ATTN_CONFIG when absent)");
}

}  // namespace tessel::cli
