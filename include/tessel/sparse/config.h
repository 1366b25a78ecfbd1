// SparseAttnConfig: the one sparse-attention config schema, grouped into sections, with its JSON
// codec; ResolvedSparseAttnConfig: the validated, immutable form that the registry, the
// DiT adapter and the backends consume.
//
// JSON (nested form, what to_json writes):
//   {"backend": "auto",
//    "geometry":  {"block_q": 128, "block_kv": 64, "spatial_layout": {...}, "num_text_tokens": 77,
//                  "text_first": true},
//    "pattern":   {"type": "radial", "window_size": 256, "spatial_radius": 3, "decay_factor": 1.0,
//                  "local_window_size": 6, "i2i_pattern": "radial", "children": [...],
//                  "composite_op": "union"},
//    "selection": {"topk_ratio": 0.5, "threshold": 0.95, "stride": 8, "sink_blocks": 0,
//                  "keep_diagonal": false, "keep_text": false},
//    "schedule": "constant",
//    "warmup":    {"dense_steps": 0, "dense_layers": 0},
//    "options":   {"key": "value"}}
// Every field also keeps its older flat key (block_size_q, pattern_type, topk_ratio,
// dense_timesteps, i2i_pattern_type, ...; see flat_key in config.cc's field table), so existing
// config files keep working; the two forms may be mixed, but one field given twice is an error.
//
// Errors (tessel::Error) name the key path ("sparse_attn.selection.topk_ratio"), what is allowed
// and the value: unknown keys and wrong types when parsing, out-of-range values and inconsistent
// fields when resolving.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/sparse/pattern.h"

namespace tessel {

inline constexpr int64_t kMaxConfigBlockSize = 4096;

// Token geometry: block sizes and how the sequence is laid out.
struct SparseAttnGeometry {
  int64_t block_q = 128;                  // query tokens per block, 1 .. kMaxConfigBlockSize
  int64_t block_kv = 64;                  // key tokens per block, 1 .. kMaxConfigBlockSize
  std::optional<SpatialLayout> spatial_layout;  // the latent grid (spatial, radial, local patterns)
  std::optional<int64_t> num_text_tokens;       // MMDiT text tokens, >= 0 (arrow, keep_text)
  bool text_first = true;                 // text tokens precede the image tokens
  bool operator==(const SparseAttnGeometry&) const = default;
};

// Which static or data-dependent pattern, and its shape parameters.
struct SparseAttnPattern {
  PatternType type = PatternType::kDynamicTopk;
  std::optional<int64_t> window_size;     // sliding_window, tokens, >= 0
  std::optional<int64_t> spatial_radius;  // spatial_aware, patches, >= 0
  double decay_factor = 1.0;              // radial window scale, (0, kMaxDecayFactor]
  int64_t local_window_size = 6;          // local attention window in frames, >= 1
  // Nested patterns by type: arrow's image-to-image pattern and composite's children. Each
  // inner pattern is this config with the type replaced.
  std::optional<PatternType> i2i_pattern;  // not arrow
  std::vector<PatternType> children;       // not composite
  CompositeOp composite_op = CompositeOp::kUnion;
  bool operator==(const SparseAttnPattern&) const = default;
};

// How data-dependent patterns choose blocks, and the blocks every pattern keeps.
struct SparseAttnSelection {
  double topk_ratio = 0.5;   // fraction of kv blocks per row, (0, 1] (the constant schedule's density)
  double threshold = 0.95;   // XAttention cumulative row mass, (0, 1]
  int64_t stride = 8;        // XAttention antidiagonal stride, 1 .. kMaxStride
  int64_t sink_blocks = 0;   // the first kv blocks of every row, >= 0
  bool keep_diagonal = false;
  bool keep_text = false;    // text rows and columns (needs geometry.num_text_tokens)
  bool operator==(const SparseAttnSelection&) const = default;
};

// Dense warm-up: steps [0, dense_steps) and layers [0, dense_layers) run dense attention. The
// default 0 makes a config that only names a backend sparse from the first step (TeleFuser uses
// 40 of its 50 steps; set it for that behaviour).
struct SparseAttnWarmup {
  int64_t dense_steps = 0;   // >= 0
  int64_t dense_layers = 0;  // >= 0
  bool operator==(const SparseAttnWarmup&) const = default;
};

struct SparseAttnConfig {
  std::string backend = "auto";  // registered name, /path/libx.so[:symbol], "auto" or "none"
  SparseAttnGeometry geometry;
  SparseAttnPattern pattern;
  SparseAttnSelection selection;
  std::string schedule = "constant";  // a registered sparsity schedule (schedule.h)
  SparseAttnWarmup warmup;
  std::map<std::string, std::string> options;  // free-form backend options; values kept as text

  // Throws Error naming the first invalid field by its key path, the allowed range and the value.
  void validate() const;
  // The nested JSON form with every field; parse_sparse_attn_json(to_json()) == *this.
  std::string to_json() const;
  bool operator==(const SparseAttnConfig&) const = default;
};

// Parses a JSON object (nested or flat keys) on top of `base`. Throws Error naming the key path
// for invalid JSON, unknown keys, wrong types, unknown pattern names and fields given twice.
// Ranges are checked by validate() (ResolvedSparseAttnConfig calls it).
SparseAttnConfig parse_sparse_attn_json(const std::string& json_text, const SparseAttnConfig& base = {});

// A validated config and the PatternSpec it describes, derived once. Immutable: share it freely.
class ResolvedSparseAttnConfig {
 public:
  // Validates `config` (throws Error as SparseAttnConfig::validate) and derives the pattern.
  explicit ResolvedSparseAttnConfig(SparseAttnConfig config = {});

  const SparseAttnConfig& config() const { return config_; }
  // The pattern planners and backends consume: type, geometry, selection and options.
  const PatternSpec& pattern() const { return pattern_; }
  // config().to_json(), computed once (plan-cache key, plugins' validate_config).
  const std::string& json() const { return json_; }

 private:
  SparseAttnConfig config_;
  PatternSpec pattern_;
  std::string json_;
};

}  // namespace tessel
