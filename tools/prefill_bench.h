// `tessel prefill-bench`: chunked prefill and decode with the KV cache offloaded to the host,
// on synthetic attention inputs with a planted needle (see prefill_bench.cc for the data model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"

namespace tessel::cli {

struct PrefillBenchConfig {
  std::vector<int64_t> contexts{32768, 65536, 131072};
  int64_t chunk = 4096;
  int64_t block = 1024;
  int64_t slots = 4;
  int64_t layers = 1;
  int64_t heads = 32;     // Llama-3.1-8B attention
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t decode_steps = 32;
  std::string policy = "xattn";         // prefill policy
  std::string decode_policy;            // default: the prefill policy when it decodes, else full
  double threshold = 0.95;              // XAttention τ
  int64_t stride = 8;                   // XAttention stride
  std::string scoring = "auto";         // XAttention scoring: auto | device | host
  int64_t top_k = 16;                   // Quest / Top-K budget in blocks
  std::string data = "clustered";       // clustered | random
  double cpu_copy_bandwidth = 0;        // CPU engine only: simulated link in GB/s (0 = memcpy)
  Device device = Device::cpu();
  DType dtype = DType::kF32;
  uint64_t seed = 1;
};

// Runs one context length; returns its measurements as JSON.
nlohmann::json run_prefill_bench(const PrefillBenchConfig& config, int64_t context);

}  // namespace tessel::cli
