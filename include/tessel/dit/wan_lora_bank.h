// Named LoRA adapters kept resident and unmerged beside one Wan transformer, so that each request
// (each batch row of a forward) can use its own adapter, or none, without reloading weights.
//
// The bank holds every adapter's low-rank pairs (WanLora::factors) on the transformer's device:
// fp32 on the CPU, bf16 on CUDA (the precision the CUDA forward's GEMMs read). A forward given a
// WanLoraSelection adds, after each linear layer an adapter changes, y += scale * B (A x) over the
// rows of the batch entries that use it (wan_model.h). Only low-rank pairs on linear layers run
// unmerged: a full diff (LightX2V's `.diff`, `.diff_b`), a lora_B bias, or a pair on a norm or
// modulation table is an Error naming the file and key (merge those at load: WanTransformer::load).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/device.h"
#include "tessel/core/tensor.h"
#include "tessel/dit/wan_config.h"
#include "tessel/dit/wan_lora.h"

namespace tessel {

class WanLoraBank {
 public:
  // One adapter's pair for one linear layer, in the bank's device layout. CPU: down_t (in, rank)
  // and up_t (rank, out) fp32 (transposed for dit::linear); CUDA: down (rank, in) and up (out, rank)
  // bf16 row-major, as stored. rank 0: this adapter leaves the layer alone.
  struct Pair {
    Tensor down, up;
    int64_t rank = 0;
    float scale = 1.0f;
  };

  // Loads each (name, file) for `config`'s transformer onto `device`. Throws Error naming the name
  // (empty, repeated) or the file and key (full diffs, lora_B biases, pairs on tensors that are not
  // a linear layer's weight, and whatever WanLora::load refuses).
  static WanLoraBank load(const std::vector<std::pair<std::string, LoraFile>>& adapters, const WanConfig& config, Device device,
                          bool ignore_unmatched = false);
  // `adapters` adapters named "0", "1", ... of rank `rank` on every linear layer of `config`'s
  // transformer, with random factors from `seed` (uniform within 1 / sqrt(fan-in), scale 1): what
  // a benchmark times, as WanTransformer::random. Throws Error for a count or rank below 1.
  static WanLoraBank random(const WanConfig& config, Device device, int64_t adapters, int64_t rank, uint64_t seed);

  WanLoraBank();
  ~WanLoraBank();
  WanLoraBank(WanLoraBank&&) noexcept;
  WanLoraBank& operator=(WanLoraBank&&) noexcept;

  int64_t size() const;
  const std::string& name(int64_t adapter) const;
  // The adapter called `name`. Throws Error naming `what` and the names the bank has when none is.
  int32_t index(const std::string& name, const std::string& what) const;
  Device device() const;
  const WanConfig& config() const;
  int64_t max_rank() const;  // the largest rank of any pair (0 for an empty bank)
  size_t bytes() const;      // the factors' bytes on the device
  // One line per adapter for logs.
  std::vector<std::string> summary() const;

  // The pairs of a linear layer (its diffusers module name, e.g. "blocks.0.attn1.to_q"), one per
  // adapter in bank order; null when no adapter changes it.
  const std::vector<Pair>* pairs(const std::string& module) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The factors' elements of one adapter of `rank` on every linear layer of `config`'s transformer
// (what WanLoraBank::random holds per adapter): rank * (in + out) summed over the layers.
int64_t wan_lora_elements(const WanConfig& config, int64_t rank);

// Which adapter each batch entry of a forward uses: adapters[b] is an index into `bank`, or -1 for
// none. WanTransformer::forward checks it against the batch and its own config and device.
struct WanLoraSelection {
  const WanLoraBank* bank = nullptr;
  std::vector<int32_t> adapters;
  bool any() const;  // whether some entry uses an adapter
};

}  // namespace tessel
