// The backend registry: backends registered explicitly (the built-ins through
// register_builtin_backends() in builtin_backends.h) and plugins loaded from shared libraries
// (plugin/tessel_plugin.h). The application owns its registry; the library keeps none. Loading a
// library goes through the registry's plugin loader, installed by the plugin layer
// (install_plugin_loader() in tessel/plugin/plugin_loader.h); a registry without one discovers
// nothing and refuses plugin paths.
//
// Plugin discovery (lazy, on first lookup; again on rescan_plugins()): every `*.so` file in the
// directories given to set_plugin_dirs (searched first; the CLI passes TESSEL_PLUGIN_PATH) and
// then in the install's plugin directory (plugin_install_dir()); the library reads no
// environment. A library that fails to load is skipped with a logged warning and recorded in
// plugin_failures(); the host keeps working. When two backends share a
// name, the first found wins (explicit registrations and built-ins before plugins).
//
// Resolution (resolve_backend), docs/architecture.md "Resolution order":
//   1. the backend override, when not empty (the app passes what it read from
//      TESSEL_SPARSE_ATTN_BACKEND; reported as source "env")
//   2. the config's backend, when not "auto"
//   3. "auto": the highest-scoring backend with score >= 0 that supports the config's pattern,
//      the module type and the device
//   4. none: dense attention (resolution.backend == nullptr)
// A name in (1) or (2) is a registered name, "none" (dense attention), or a path "/path/libx.so" or "/path/libx.so:symbol" (entry symbol, default tessel_plugin_init).
// An explicit name that cannot be found or loaded throws Error (a typo must not silently run dense).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/sparse/backend.h"
#include "tessel/sparse/config.h"

namespace tessel {

// Loads one plugin library: (path, entry symbol) -> its backend. Throws Error naming the path and
// what failed.
using PluginLoader = std::function<std::shared_ptr<Backend>(const std::string& path, const std::string& symbol)>;

inline constexpr const char* kDefaultPluginSymbol = "tessel_plugin_init";

// The install's plugin directory (the TESSEL_PLUGIN_DIR compile definition).
std::string plugin_install_dir();

// A library that discovery could not load, and why.
struct PluginFailure {
  std::string path;
  std::string message;
};

enum class ResolutionSource { kEnv, kConfig, kAuto, kNone };
std::string_view resolution_source_name(ResolutionSource source);  // "env", "config", "auto", "none"

struct Resolution {
  std::shared_ptr<Backend> backend;  // null: dense attention
  ResolutionSource source = ResolutionSource::kNone;
  std::string requested;             // the name/path that was asked for ("" for auto/none)
};

class BackendRegistry {
 public:
  // An empty registry. With discover_plugins false, the plugin directories are scanned only by
  // rescan_plugins() (tests use this to control exactly which backends exist).
  explicit BackendRegistry(bool discover_plugins = true);
  ~BackendRegistry();
  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  // The hook through which libraries are loaded (discovery and plugin paths). Replaces any
  // previous loader; throws Error for an empty one.
  void set_plugin_loader(PluginLoader loader);

  // Explicit registration. Throws Error when the name is empty or already registered.
  void register_backend(std::shared_ptr<Backend> backend);
  // The backend registered (or discovered) under `name`, or null.
  std::shared_ptr<Backend> find(const std::string& name);
  // A registered name, or a plugin path "/path/libx.so[:symbol]" (loaded and cached by path).
  // Throws Error when neither.
  std::shared_ptr<Backend> get(const std::string& name_or_path);
  // Every backend: built-ins and registered ones first, then discovered plugins.
  std::vector<std::shared_ptr<Backend>> list();

  // Loads one plugin library now (not registered under its name; cached by path+symbol).
  // Throws Error when no plugin loader is installed, and (from the loader) for a missing file, a
  // missing symbol, a wrong ABI version, a failing init or an incomplete table.
  std::shared_ptr<Backend> load_plugin(const std::string& path, const std::string& symbol = kDefaultPluginSymbol);

  // Directories searched for plugins before the install's folder, in order. Takes effect at the
  // next discovery: the first lookup, or rescan_plugins().
  void set_plugin_dirs(std::vector<std::string> dirs);
  // Forgets discovered plugins and scans the directories again.
  void rescan_plugins();
  std::vector<PluginFailure> plugin_failures();
  // The directories scanned, in order (duplicates removed).
  std::vector<std::string> plugin_search_dirs();

  // Resolution as described at the top of this file; `backend_override` "" = none.
  Resolution resolve(const ResolvedSparseAttnConfig& config, ModuleType module, Device device,
                     const std::string& backend_override = "");

 private:
  void ensure_discovered_locked();
  std::shared_ptr<Backend> find_locked(const std::string& name);
  std::vector<std::string> plugin_search_dirs_locked() const;

  std::mutex mutex_;
  std::vector<std::shared_ptr<Backend>> registered_;
  std::vector<std::shared_ptr<Backend>> discovered_;
  std::vector<std::pair<std::string, std::shared_ptr<Backend>>> loaded_by_path_;
  std::vector<PluginFailure> failures_;
  std::vector<std::string> plugin_dirs_;
  PluginLoader plugin_loader_;
  bool discovered_once_ = false;
  bool discover_plugins_ = true;
};

// Splits "/path/libx.so:symbol" into path and symbol (default tessel_plugin_init). Returns false
// when `spec` does not name a path (contains no '/' and does not end in ".so").
bool parse_plugin_reference(const std::string& spec, std::string& path, std::string& symbol);

}  // namespace tessel
