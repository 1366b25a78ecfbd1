// `tessel bench`: attention speed and accuracy at several mask densities on one shape.
// BenchConfig is what the command line sets; run_bench() does the work and returns a BenchReport;
// the formatters print it. New methods or flags add a field and a few lines, not a new loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/device.h"
#include "tessel/core/dtype.h"
#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/sparse/block_mask.h"

namespace tessel::cli {

struct BenchConfig {
  Device device = Device::cpu();
  DType dtype = DType::kBF16;
  int64_t batch = 1, heads = 8, kv_heads = 0, head_dim = 128;  // kv_heads 0 = heads
  int64_t seq = 4096, seq_kv = 0;                               // seq_kv 0 = seq
  std::vector<double> densities{1.0, 0.5, 0.25};
  int64_t block_q = 128, block_kv = 64;
  int iters = 10, warmup = 2, threads = 0;  // threads 0 = default
  bool causal = false;
  bool fp8 = false;  // also time each method in FP8 (AttentionPrecision::kFp8), as "<method>_fp8"
  uint64_t seed = 0;
  int64_t check_rows = 16;  // query rows compared with the fp64 reference
  std::string save_mask_dir;  // non-empty: write every mask used there (bench_mask_export.h)
  // Hopper kernel variants (attention_tuning.h) to time each method under, as "<method>@<variant>":
  // the 16-bit variants time the plain methods, the FP8 ones ("fp8...", with --fp8) the FP8 twins;
  // "all" stands for every variant the device has. Empty: the variant the calls would run anyway.
  std::vector<std::string> kernel_variants;
  bool tune = false;  // tune_attention for the dense and block-sparse calls first (reported in notes)

  int64_t effective_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t effective_seq_kv() const { return seq_kv > 0 ? seq_kv : seq; }
  nlohmann::json to_json() const;
};

struct BenchResult {
  std::string method;       // "dense" or "block_sparse", "_fp8" appended for the FP8 runs
  double density = 1.0;     // fraction of blocks actually kept
  double ms = 0.0;          // median over iters
  double tflops_dense_equiv = 0.0;  // 4*B*H*Sq*Skv*D / time
  double tflops_effective = 0.0;    // over the (query, key) pairs actually computed
  double max_rel_err = 0.0;         // max |out - ref| / max |ref| over the checked rows
};

struct BenchReport {
  BenchConfig config;
  std::vector<BenchResult> results;
  std::vector<std::string> notes;  // the tuning's candidates and choices, printed after the table
  nlohmann::json to_json() const;
  std::string to_table() const;
};

BenchReport run_bench(const BenchConfig& config);

// Shared by the bench runners.
double median(std::vector<double> values);
// Max |out - ref| / max |ref| over config.check_rows evenly spaced query rows, against the fp64
// reference (with `mask` when given). q/k/v are CPU tensors; `out` may live on any device.
double sampled_relative_error(const BenchConfig& config, const Tensor& q_host, const Tensor& k_host, const Tensor& v_host,
                              const BlockMask* mask, const AttentionOptions& options, const Tensor& out);

}  // namespace tessel::cli
