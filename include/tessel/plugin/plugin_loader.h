// The plugin layer's entry points for applications: make a registry able to load backends from
// shared libraries (tessel_plugin.h's C ABI), or build the registry an application usually wants.
#pragma once

#include <memory>

#include "tessel/sparse/registry.h"

namespace tessel {

// Installs the C ABI plugin loader as `registry`'s plugin loader (BackendRegistry::set_plugin_loader),
// so discovery and "/path/libx.so[:symbol]" names load libraries.
void install_plugin_loader(BackendRegistry& registry);

// A registry with every built-in backend (register_builtin_backends, kv::register_builtin_policies)
// and the plugin loader. With
// discover_plugins false, the plugin directories are scanned only by rescan_plugins().
std::unique_ptr<BackendRegistry> make_default_registry(bool discover_plugins = true);

}  // namespace tessel
