// How a forward applies a WanLoraSelection (internal to the Wan transformer's forwards): the batch
// entries grouped into runs of one adapter, and the CPU's unmerged low-rank update.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/dit/wan_lora_bank.h"

namespace tessel {

// Consecutive batch entries that use one adapter (entries without one form no run).
struct LoraRun {
  int64_t first_entry = 0, entries = 0;
  int32_t adapter = -1;
};

// Checks `selection` for a forward of `batch` entries of a `config` model on `device` (the bank's
// device and config, one adapter index per entry in [-1, bank size)) and returns its runs; empty
// when no entry uses an adapter. Throws Error naming the field.
std::vector<LoraRun> lora_runs(const WanLoraSelection& selection, const WanConfig& config, Device device, int64_t batch);

// y (rows, out) += scale * up (down x) for the rows of each run, `rows` being batch-major over the
// forward's `batch` entries (rows / batch per entry), when the bank has pairs for `module`. CPU, fp32.
void add_lora_cpu(const ExecContext& ctx, const WanLoraBank& bank, const std::vector<LoraRun>& runs, int64_t batch,
                  const std::string& module, const float* x, int64_t rows, float* y);

}  // namespace tessel
