// SparseAttnConfig: the user's sparse-attention settings — the RFC's DiffusionSparseAttnConfig,
// TeleFuser's SparseAttentionConfig warm-up knobs and XAttention's threshold/stride — with
// parsing from CLI flags and JSON. Every error names the field, the allowed range and the value.
//
// CLI flags (see add_sparse_attn_flags):
//   --sparse-attn-backend NAME|/path/libx.so[:symbol]   backend (default "auto")
//   --sparse-attn-topk R                                 topk_ratio in (0, 1]
//   --sparse-attn-schedule NAME                          constant | conservative | aggressive | registered
//   --sparse-attn-pattern NAME                           pattern_type
//   --sparse-attn-config '<json>' | @file.json           any field below, as a JSON object
// Precedence: the single-field flags override the JSON. Without --sparse-attn-config the
// environment variable TESSEL_SPARSE_ATTN_CONFIG (same syntax) is read. The backend environment
// variable TESSEL_SPARSE_ATTN_BACKEND is applied later, at resolution (registry.h), above all.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessel/sparse/pattern.h"

namespace tessel {

struct SparseAttnConfig {
  // ---- the RFC's fields
  std::string backend = "auto";          // registered name, /path/libx.so[:symbol], "auto" or "none"
  std::string pattern_type = "dynamic_topk";
  double topk_ratio = 0.5;               // (0, 1]
  int64_t block_size_q = 128;            // 1 .. 4096
  int64_t block_size_kv = 64;            // 1 .. 4096
  std::optional<int64_t> window_size;    // tokens, >= 0
  std::optional<int64_t> spatial_radius; // patches, >= 0
  std::string schedule = "constant";     // a registered schedule (schedule.h)

  // ---- TeleFuser's
  // Steps [0, dense_timesteps) and layers [0, dense_layers) run dense attention. TeleFuser
  // defaults dense_timesteps to 40 (of its 50-step solver); tessel defaults it to 0 so that a
  // config that only names a backend is sparse from the first step.
  int64_t dense_timesteps = 0;           // >= 0
  int64_t dense_layers = 0;              // >= 0
  double decay_factor = 1.0;             // radial window scale, (0, 16]
  int64_t local_window_size = 6;         // local attention window in frames, >= 1

  // ---- XAttention's
  double threshold = 0.95;               // (0, 1]
  int64_t stride = 8;                    // antidiagonal stride, 1 .. 64

  // ---- pattern geometry and always-keep options (copied into the PatternSpec)
  std::optional<SpatialLayout> spatial_layout;
  std::optional<int64_t> num_text_tokens;
  bool keep_diagonal = false;
  int64_t sink_blocks = 0;               // >= 0
  bool keep_text = false;

  // ---- nested patterns, by type name: arrow's image-to-image pattern and composite's children
  // (each child/inner spec is this config with pattern_type replaced).
  std::optional<std::string> i2i_pattern_type;
  std::vector<std::string> children;
  std::string composite_op = "union";    // "union" | "intersection"

  // ---- free-form backend options ("options": {"key": value}); values kept as strings
  std::map<std::string, std::string> options;

  // Throws Error naming the first invalid field (pattern_type and schedule must be known names).
  void validate() const;

  // The PatternSpec this config describes: type from pattern_type, block sizes, window, radius,
  // topk_ratio, threshold, stride, decay_factor, local_window_frames (= local_window_size),
  // layout, text tokens, always-keep options and backend options.
  PatternSpec to_pattern_spec() const;

  // JSON object with every field (round-trips through parse_sparse_attn_json).
  std::string to_json() const;
};

// Parses a JSON object (text) into a config, starting from `base`. Unknown keys, wrong types and
// out-of-range values throw Error naming the key.
SparseAttnConfig parse_sparse_attn_json(const std::string& json_text, const SparseAttnConfig& base = {});
// Reads '<json>' or '@path/to/file.json'.
SparseAttnConfig parse_sparse_attn_config_arg(const std::string& arg, const SparseAttnConfig& base = {});

// The raw values of the --sparse-attn-* flags; empty optional = flag not given.
struct SparseAttnFlags {
  std::optional<std::string> backend;
  std::optional<double> topk;
  std::optional<std::string> schedule;
  std::optional<std::string> pattern;
  std::optional<std::string> config;  // '<json>' or '@file.json'

  // True when any flag was given (or TESSEL_SPARSE_ATTN_CONFIG / TESSEL_SPARSE_ATTN_BACKEND is
  // set): the caller should enable sparse attention.
  bool any() const;
  // Builds and validates the config: defaults < JSON (flag, or the env var when the flag is
  // absent) < single-field flags.
  SparseAttnConfig to_config() const;
};

}  // namespace tessel
