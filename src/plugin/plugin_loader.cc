#include "tessel/plugin/plugin_loader.h"

#include "plugin_backend.h"
#include "tessel/kv/policy_backend.h"
#include "tessel/sparse/builtin_backends.h"

namespace tessel {

void install_plugin_loader(BackendRegistry& registry) { registry.set_plugin_loader(plugin::load_plugin_backend); }

std::unique_ptr<BackendRegistry> make_default_registry(bool discover_plugins) {
  auto registry = std::make_unique<BackendRegistry>(discover_plugins);
  register_builtin_backends(*registry);
  kv::register_builtin_policies(*registry);
  install_plugin_loader(*registry);
  return registry;
}

}  // namespace tessel
