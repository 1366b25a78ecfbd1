#include "sparse_attn_flags.h"

#include <cstdlib>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/log.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
namespace {

std::vector<std::string> split_path_list(const std::string& list) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(':', start), list.size());
    if (end > start) parts.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// A config file is small: a regular file of at most this many bytes (not /dev/zero or a FIFO).
constexpr uint64_t kMaxConfigFileBytes = 1 << 20;

}  // namespace

SparseAttnEnv parse_sparse_attn_env(const EnvLookup& lookup) {
  const auto get = [&](const char* name) -> std::optional<std::string> {
    std::optional<std::string> value = lookup(name);
    if (value && value->empty()) value.reset();
    return value;
  };
  SparseAttnEnv env;
  env.config = get(kSparseAttnConfigEnvVar);
  const std::optional<std::string> backend = get(kSparseAttnBackendEnvVar);
  const std::optional<std::string> alias = get(kSparseAttnBackendAliasEnvVar);
  env.backend = backend ? backend : alias;
  if (backend && alias && *backend != *alias)
    env.warnings.push_back(std::string(kSparseAttnBackendEnvVar) + "='" + *backend + "' and " +
                           kSparseAttnBackendAliasEnvVar + "='" + *alias + "' disagree; using " +
                           kSparseAttnBackendEnvVar);
  if (const std::optional<std::string> dirs = get(kPluginPathEnvVar)) env.plugin_dirs = split_path_list(*dirs);
  return env;
}

const SparseAttnEnv& process_sparse_attn_env() {
  static const SparseAttnEnv env = [] {
    SparseAttnEnv read = parse_sparse_attn_env([](const char* name) -> std::optional<std::string> {
      const char* value = std::getenv(name);
      return value ? std::optional<std::string>(value) : std::nullopt;
    });
    for (const std::string& warning : read.warnings) log_warning(warning);
    return read;
  }();
  return env;
}

void add_sparse_attn_flags(CLI::App& app, SparseAttnFlags& flags) {
  app.add_option("--sparse-attn-backend", flags.backend,
                 "Sparse attention backend: a registered name, /path/libx.so[:symbol], auto or none "
                 "(env TESSEL_SPARSE_ATTN_BACKEND or DIFFUSION_SPARSE_ATTN_BACKEND overrides)");
  app.add_option("--sparse-attn-topk", flags.topk, "Top-k ratio of kv blocks kept per row, in (0, 1]");
  app.add_option("--sparse-attn-schedule", flags.schedule, "Sparsity schedule: constant | conservative | aggressive");
  app.add_option("--sparse-attn-pattern", flags.pattern,
                 "Pattern type: dense, block_sparse, sliding_window, spatial_aware, dynamic_topk, threshold, "
                 "radial, local, arrow, composite");
  app.add_option("--sparse-attn-config", flags.config,
                 "Sparse attention config as JSON, or @file.json (env TESSEL_SPARSE_ATTN_CONFIG when absent)");
}

bool sparse_attn_requested(const SparseAttnFlags& flags, const SparseAttnEnv& env) {
  return flags.any() || env.config || env.backend;
}

SparseAttnConfig parse_sparse_attn_config_arg(const std::string& arg, const std::string& source, const SparseAttnConfig& base) {
  if (!arg.empty() && arg[0] == '@') {
    const std::string path = arg.substr(1);
    const std::string text = read_file_bounded(path, kMaxConfigFileBytes, source + " file after '@'");
    try {
      return parse_sparse_attn_json(text, base);
    } catch (const Error& e) {
      throw Error(source + " file " + quoted_excerpt(path, 200) + ": " + e.what());
    }
  }
  return parse_sparse_attn_json(arg, base);
}

SparseAttnConfig sparse_attn_config_from(const SparseAttnFlags& flags, const SparseAttnEnv& env) {
  SparseAttnConfig result;
  if (flags.config) result = parse_sparse_attn_config_arg(*flags.config);
  else if (env.config) result = parse_sparse_attn_config_arg(*env.config, kSparseAttnConfigEnvVar);
  if (flags.backend) {
    if (flags.backend->empty())
      fail_argument("--sparse-attn-backend", "a backend name, a plugin path, 'auto' or 'none'", "''");
    result.backend = *flags.backend;
  }
  if (flags.topk) {
    if (!(*flags.topk > 0.0 && *flags.topk <= 1.0))
      fail_argument("--sparse-attn-topk (selection.topk_ratio)", "a number in (0, 1]", *flags.topk);
    result.selection.topk_ratio = *flags.topk;
  }
  if (flags.schedule) result.schedule = *flags.schedule;
  if (flags.pattern) result.pattern.type = parse_enum_flag(parse_pattern_type, *flags.pattern, "--sparse-attn-pattern");
  return result;
}

void apply_plugin_dirs(BackendRegistry& registry, const SparseAttnEnv& env) { registry.set_plugin_dirs(env.plugin_dirs); }

std::unique_ptr<BackendRegistry> make_cli_registry() {
  std::unique_ptr<BackendRegistry> registry = make_default_registry();
  apply_plugin_dirs(*registry, process_sparse_attn_env());
  return registry;
}

}  // namespace tessel::cli
