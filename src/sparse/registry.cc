#include "tessel/sparse/registry.h"

#include <algorithm>
#include <filesystem>

#include "tessel/core/error.h"
#include "tessel/core/log.h"

#ifndef TESSEL_PLUGIN_DIR
#define TESSEL_PLUGIN_DIR ""
#endif

namespace tessel {
namespace {

// Shared libraries in `dir`, sorted by name so discovery order is reproducible.
std::vector<std::string> libraries_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (entry.is_regular_file(ec) && file.size() > 3 && file.ends_with(".so")) out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string names_of(const std::vector<std::shared_ptr<Backend>>& backends) {
  std::string out;
  for (const auto& backend : backends) out += (out.empty() ? "" : ", ") + backend->name();
  return out;
}

// An explicitly chosen backend must run what the config asks for; say so now rather than at plan().
void check_supports(const Backend& backend, const ResolvedSparseAttnConfig& config, ModuleType module, Device device,
                    std::string_view source) {
  const std::string who = "backend '" + backend.name() + "' (chosen by " + std::string(source) + ")";
  const PatternType pattern = config.pattern().type;
  if (!backend.supports(pattern)) {
    std::string names;
    for (PatternType p : backend.supported_patterns()) names += (names.empty() ? "" : ", ") + std::string(pattern_type_name(p));
    fail_argument(who + " pattern_type", "one of " + names, pattern_type_name(pattern));
  }
  if (!backend.supports(module)) fail_argument(who + " module type", "a supported module type", module_type_name(module));
  if (!backend.supports(device.type)) fail_argument(who + " device", "a supported device", device.str());
}

}  // namespace

std::string plugin_install_dir() { return TESSEL_PLUGIN_DIR; }

std::string_view resolution_source_name(ResolutionSource source) {
  switch (source) {
    case ResolutionSource::kEnv: return "env";
    case ResolutionSource::kConfig: return "config";
    case ResolutionSource::kAuto: return "auto";
    case ResolutionSource::kNone: return "none";
  }
  return "unknown";
}

bool parse_plugin_reference(const std::string& spec, std::string& path, std::string& symbol) {
  const bool looks_like_path = spec.find('/') != std::string::npos || spec.ends_with(".so");
  if (!looks_like_path) return false;
  path = spec;
  symbol = kDefaultPluginSymbol;
  // "/dir/libx.so:symbol" — a ':' after the last '/' that follows ".so" names the entry symbol.
  const size_t colon = spec.rfind(':');
  const size_t slash = spec.rfind('/');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash) && colon + 1 < spec.size()) {
    path = spec.substr(0, colon);
    symbol = spec.substr(colon + 1);
  }
  return true;
}

BackendRegistry::BackendRegistry(bool discover_plugins) : discover_plugins_(discover_plugins) {}

BackendRegistry::~BackendRegistry() = default;

void BackendRegistry::set_plugin_loader(PluginLoader loader) {
  if (!loader) fail_argument("plugin loader", "a callable loader", "an empty function");
  std::lock_guard<std::mutex> lock(mutex_);
  plugin_loader_ = std::move(loader);
}

void BackendRegistry::register_backend(std::shared_ptr<Backend> backend) {
  if (!backend) fail_argument("backend", "a backend", "null");
  const std::string name = backend->name();
  if (name.empty()) fail_argument("backend name", "a non-empty name", "''");
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& existing : registered_)
    if (existing->name() == name)
      fail_argument("backend name", "a name not registered yet", "'" + name + "' (already registered, from " + existing->origin() + ")");
  registered_.push_back(std::move(backend));
}

std::shared_ptr<Backend> BackendRegistry::find_locked(const std::string& name) {
  for (const auto& backend : registered_)
    if (backend->name() == name) return backend;
  ensure_discovered_locked();
  for (const auto& backend : discovered_)
    if (backend->name() == name) return backend;
  return nullptr;
}

std::shared_ptr<Backend> BackendRegistry::find(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return find_locked(name);
}

std::shared_ptr<Backend> BackendRegistry::get(const std::string& name_or_path) {
  std::string path, symbol;
  if (parse_plugin_reference(name_or_path, path, symbol)) return load_plugin(path, symbol);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto backend = find_locked(name_or_path)) return backend;
  std::vector<std::shared_ptr<Backend>> all = registered_;
  all.insert(all.end(), discovered_.begin(), discovered_.end());
  fail_argument("sparse attention backend", "a registered name (" + names_of(all) + "), a plugin path, 'auto' or 'none'",
                quoted_excerpt(name_or_path, 200));
}

std::vector<std::shared_ptr<Backend>> BackendRegistry::list() {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_discovered_locked();
  std::vector<std::shared_ptr<Backend>> all = registered_;
  all.insert(all.end(), discovered_.begin(), discovered_.end());
  return all;
}

std::shared_ptr<Backend> BackendRegistry::load_plugin(const std::string& path, const std::string& symbol) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  const std::string key = (ec ? path : absolute.lexically_normal().string()) + ":" + symbol;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [loaded_key, backend] : loaded_by_path_)
    if (loaded_key == key) return backend;
  if (!plugin_loader_)
    fail_argument("plugin '" + path + "'", "a registry with a plugin loader (install_plugin_loader)",
                  "a registry without one");
  std::shared_ptr<Backend> backend = plugin_loader_(path, symbol);
  loaded_by_path_.emplace_back(key, backend);
  return backend;
}

void BackendRegistry::set_plugin_dirs(std::vector<std::string> dirs) {
  std::lock_guard<std::mutex> lock(mutex_);
  plugin_dirs_ = std::move(dirs);
}

std::vector<std::string> BackendRegistry::plugin_search_dirs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return plugin_search_dirs_locked();
}

std::vector<std::string> BackendRegistry::plugin_search_dirs_locked() const {
  std::vector<std::string> dirs = plugin_dirs_;
  const std::string install = plugin_install_dir();
  if (!install.empty()) dirs.push_back(install);
  // The same folder named twice (or via another spelling) is scanned once.
  std::vector<std::string> unique, seen;
  for (const std::string& dir : dirs) {
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::weakly_canonical(dir, ec);
    const std::string key = ec ? dir : canonical.string();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    unique.push_back(dir);
  }
  return unique;
}

void BackendRegistry::ensure_discovered_locked() {
  if (discovered_once_ || !discover_plugins_ || !plugin_loader_) return;
  discovered_once_ = true;
  for (const std::string& dir : plugin_search_dirs_locked()) {
    // A plugin folder that is a file or does not exist is a mistake worth a word (the install's own
    // folder may legitimately be absent).
    std::error_code ec;
    const bool exists = std::filesystem::exists(dir, ec);
    if ((exists && !std::filesystem::is_directory(dir, ec)) || (!exists && dir != plugin_install_dir())) {
      const std::string message = exists ? "plugin folder is a file, not a directory (to load one library, name it by path "
                                           "as the backend)"
                                         : "plugin folder does not exist";
      failures_.push_back({dir, message});
      log_warning("'" + dir + "': " + message);
      continue;
    }
    for (const std::string& path : libraries_in(dir)) {
      std::shared_ptr<Backend> backend;
      try {
        backend = plugin_loader_(path, kDefaultPluginSymbol);
      } catch (const Error& e) {
        failures_.push_back({path, e.what()});
        log_warning(std::string("skipping plugin: ") + e.what());
        continue;
      }
      const std::string name = backend->name();
      const auto same_name = [&](const std::shared_ptr<Backend>& other) { return other->name() == name; };
      if (std::any_of(registered_.begin(), registered_.end(), same_name) ||
          std::any_of(discovered_.begin(), discovered_.end(), same_name)) {
        const std::string message = "backend name '" + name + "' is already taken; this copy is ignored";
        failures_.push_back({path, message});
        log_warning("skipping plugin '" + path + "': " + message);
        continue;
      }
      discovered_.push_back(std::move(backend));
    }
  }
}

void BackendRegistry::rescan_plugins() {
  std::lock_guard<std::mutex> lock(mutex_);
  discovered_.clear();
  failures_.clear();
  discovered_once_ = false;
  discover_plugins_ = true;
  ensure_discovered_locked();
}

std::vector<PluginFailure> BackendRegistry::plugin_failures() {
  std::lock_guard<std::mutex> lock(mutex_);
  ensure_discovered_locked();
  return failures_;
}

Resolution BackendRegistry::resolve(const ResolvedSparseAttnConfig& config, ModuleType module, Device device,
                                    const std::string& backend_override) {
  const auto explicit_choice = [&](const std::string& requested, ResolutionSource source) {
    Resolution resolution;
    resolution.source = source;
    resolution.requested = requested;
    if (requested != "none") {
      resolution.backend = get(requested);
      check_supports(*resolution.backend, config, module, device, resolution_source_name(source));
      resolution.backend->validate_config(config);
    }
    return resolution;
  };
  if (!backend_override.empty()) return explicit_choice(backend_override, ResolutionSource::kEnv);
  const std::string& configured = config.config().backend;
  if (configured != "auto") return explicit_choice(configured, ResolutionSource::kConfig);

  const PatternType pattern = config.pattern().type;
  std::shared_ptr<Backend> best;
  for (const auto& backend : list()) {
    if (backend->score() < 0 || !backend->supports(pattern) || !backend->supports(module) ||
        !backend->supports(device.type))
      continue;
    if (!best || backend->score() > best->score()) best = backend;
  }
  Resolution resolution;
  if (best) {
    best->validate_config(config);
    resolution.backend = best;
    resolution.source = ResolutionSource::kAuto;
  }
  return resolution;
}

}  // namespace tessel
