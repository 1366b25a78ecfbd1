// The app side of sparse-attention configuration: the --sparse-attn-* flags shared by CLI
// commands and the environment variables the CLI reads once at start-up. The library reads
// neither; it receives the results as arguments (a SparseAttnConfig, the backend override given
// to BackendRegistry::resolve / SparseAttentionOptions, the plugin directories given to
// BackendRegistry::set_plugin_dirs).
//
// Flags:
//   --sparse-attn-backend NAME|/path/libx.so[:symbol]   backend (default "auto")
//   --sparse-attn-topk R                                 selection.topk_ratio in (0, 1]
//   --sparse-attn-schedule NAME                          constant | conservative | aggressive | registered
//   --sparse-attn-pattern NAME                           pattern.type
//   --sparse-attn-config '<json>' | @file.json           the whole config as JSON (config.h)
// Environment:
//   TESSEL_SPARSE_ATTN_CONFIG    the JSON (same syntax as the flag), used when the flag is absent
//   TESSEL_SPARSE_ATTN_BACKEND   the backend override, above everything at resolution
//   DIFFUSION_SPARSE_ATTN_BACKEND  alias of TESSEL_SPARSE_ATTN_BACKEND (the DiT plugin proposal's name); when both
//                                are set and differ, TESSEL_ wins and a warning is logged
//   TESSEL_PLUGIN_PATH           colon-separated plugin directories, searched before the install's
// Precedence of the config: defaults < JSON (flag, else env) < single-field flags. Backend
// resolution: env override > config backend > auto > none.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tessel/core/error.h"
#include "tessel/sparse/config.h"

namespace tessel {
class BackendRegistry;
}

namespace tessel::cli {

inline constexpr const char* kSparseAttnConfigEnvVar = "TESSEL_SPARSE_ATTN_CONFIG";
inline constexpr const char* kSparseAttnBackendEnvVar = "TESSEL_SPARSE_ATTN_BACKEND";
inline constexpr const char* kSparseAttnBackendAliasEnvVar = "DIFFUSION_SPARSE_ATTN_BACKEND";
inline constexpr const char* kPluginPathEnvVar = "TESSEL_PLUGIN_PATH";

// The raw values of the --sparse-attn-* flags; empty optional = flag not given.
struct SparseAttnFlags {
  std::optional<std::string> backend;
  std::optional<double> topk;
  std::optional<std::string> schedule;
  std::optional<std::string> pattern;
  std::optional<std::string> config;  // '<json>' or '@file.json'

  bool any() const { return backend || topk || schedule || pattern || config; }
};

// What the environment says about sparse attention (unset and empty variables are absent).
struct SparseAttnEnv {
  std::optional<std::string> config;        // TESSEL_SPARSE_ATTN_CONFIG
  std::optional<std::string> backend;       // TESSEL_SPARSE_ATTN_BACKEND, else its alias
  std::vector<std::string> plugin_dirs;     // TESSEL_PLUGIN_PATH split at ':', empty parts dropped
  std::vector<std::string> warnings;        // e.g. the two backend variables disagree
};

// Reads the variables through `lookup` (name -> value, nullopt when unset): tests pass values,
// read_sparse_attn_env passes the process environment.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
SparseAttnEnv parse_sparse_attn_env(const EnvLookup& lookup);
// The process environment, read once; its warnings are logged the first time.
const SparseAttnEnv& process_sparse_attn_env();

void add_sparse_attn_flags(CLI::App& app, SparseAttnFlags& flags);

// True when the flags or the environment ask for sparse attention (a flag, the config variable
// or a backend variable is given).
bool sparse_attn_requested(const SparseAttnFlags& flags, const SparseAttnEnv& env);

// The config the flags and environment describe: defaults < JSON (the flag, else the env
// variable) < single-field flags. Not yet validated (ResolvedSparseAttnConfig does that); bad
// flag values throw Error naming the flag.
SparseAttnConfig sparse_attn_config_from(const SparseAttnFlags& flags, const SparseAttnEnv& env);

// Reads '<json>' or '@path/to/file.json' (Error naming `source` when the file cannot be read);
// the keys the JSON leaves out keep `base`'s values.
SparseAttnConfig parse_sparse_attn_config_arg(const std::string& arg, const std::string& source = "--sparse-attn-config",
                                              const SparseAttnConfig& base = {});

// `parse(value)` for a named enumeration given by `flag`; an unknown name is an Error that names
// the flag (and the allowed names).
template <typename Enum>
Enum parse_enum_flag(Enum (*parse)(std::string_view), const std::string& value, const std::string& flag) {
  try {
    return parse(value);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

// The backend override for resolution: the env variable, "" when absent.
inline std::string backend_override(const SparseAttnEnv& env) { return env.backend.value_or(""); }

// Hands the environment's plugin directories to `registry`.
void apply_plugin_dirs(BackendRegistry& registry, const SparseAttnEnv& env);

// The CLI's registry: the built-in backends, the plugin loader, and the plugin directories of the
// process environment (process_sparse_attn_env()).
std::unique_ptr<BackendRegistry> make_cli_registry();

}  // namespace tessel::cli
