// `tessel backends`: every sparse-attention backend tessel can use — built-ins, and plugins found
// in TESSEL_PLUGIN_PATH and the install's plugin folder (plus any named by path with
// --sparse-attn-backend) — with what each supports, the libraries that failed to load, and the
// backend the given --sparse-attn-* flags resolve to.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.h"
#include "option_checks.h"
#include "sparse_attn_flags.h"
#include "tessel/sparse/registry.h"

namespace tessel::cli {
namespace {

template <typename T, typename NameFn>
std::vector<std::string> names(const std::vector<T>& items, NameFn name) {
  std::vector<std::string> out;
  for (const T& item : items) out.emplace_back(name(item));
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

struct BackendsArgs {
  bool json = false;
  std::string module = "dit_self";
  std::string device = "cpu";
  SparseAttnFlags flags;
};

int run_backends(const BackendsArgs& args) {
  const std::unique_ptr<BackendRegistry> owned_registry = make_cli_registry();
  BackendRegistry& registry = *owned_registry;
  std::vector<std::shared_ptr<Backend>> backends = registry.list();
  // A backend named by path is loaded on demand; show it too.
  std::string path, symbol;
  if (args.flags.backend && parse_plugin_reference(*args.flags.backend, path, symbol)) {
    const auto loaded = registry.load_plugin(path, symbol);
    bool present = false;
    for (const auto& b : backends) present |= b == loaded;
    if (!present) backends.push_back(loaded);
  }
  const ModuleType module = parse_module_type(args.module);
  const Device device = parse_device(args.device);
  const SparseAttnEnv& env = process_sparse_attn_env();
  const ResolvedSparseAttnConfig config(sparse_attn_config_from(args.flags, env));
  const Resolution resolution = registry.resolve(config, module, device, backend_override(env));
  const std::string pattern(pattern_type_name(config.pattern().type));
  const std::string resolved = resolution.backend ? resolution.backend->name() : "none (dense attention)";

  nlohmann::json rows = nlohmann::json::array();
  for (const auto& backend : backends) {
    rows.push_back({{"name", backend->name()},
                    {"origin", backend->origin()},
                    {"score", backend->score()},
                    {"patterns", names(backend->supported_patterns(), pattern_type_name)},
                    {"module_types", names(backend->supported_module_types(), module_type_name)},
                    {"devices", names(backend->supported_devices(), device_type_name)}});
  }
  nlohmann::json failures = nlohmann::json::array();
  for (const PluginFailure& failure : registry.plugin_failures())
    failures.push_back({{"path", failure.path}, {"message", failure.message}});

  if (args.json) {
    nlohmann::json out = {{"backends", rows},
                          {"config", nlohmann::json::parse(config.json())},
                          {"plugin_dirs", registry.plugin_search_dirs()},
                          {"plugin_failures", failures},
                          {"resolved", {{"backend", resolution.backend ? resolution.backend->name() : "none"},
                                        {"source", std::string(resolution_source_name(resolution.source))},
                                        {"pattern", pattern},
                                        {"module_type", args.module},
                                        {"device", device.str()}}}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& row : rows) {
    std::cout << row["name"].get<std::string>() << "\n"
              << "  origin:       " << row["origin"].get<std::string>() << "\n"
              << "  score:        " << row["score"].get<int>() << (row["score"].get<int>() < 0 ? " (never auto)" : "") << "\n"
              << "  patterns:     " << joined(row["patterns"].get<std::vector<std::string>>()) << "\n"
              << "  module types: " << joined(row["module_types"].get<std::vector<std::string>>()) << "\n"
              << "  devices:      " << joined(row["devices"].get<std::vector<std::string>>()) << "\n";
  }
  std::cout << "plugin dirs: " << joined(registry.plugin_search_dirs()) << "\n";
  for (const auto& failure : failures)
    std::cout << "not loaded: " << failure["path"].get<std::string>() << ": " << failure["message"].get<std::string>()
              << "\n";
  std::cout << "resolved for pattern " << pattern << ", " << args.module << ", " << device.str() << ": "
            << resolved << " (" << resolution_source_name(resolution.source) << ")\n";
  return 0;
}

CommandRegistration registration{
    "backends", "List sparse attention backends (built-in and plugins) and the one the flags resolve to",
    [](CLI::App& app) {
      auto args = std::make_shared<BackendsArgs>();
      app.add_flag("--json", args->json, "Print JSON");
      app.add_option("--module", args->module, "Module type for resolution: dit_self, dit_cross, dit_joint, llm_prefill, llm_decode")
          ->check(parsed_by("a module type", [](const std::string& text) { parse_module_type(text); }));
      app.add_option("--device", args->device, "Device for resolution: cpu or cuda[:N]")->check(device_name());
      add_sparse_attn_flags(app, args->flags);
      return CommandRunner([args] { return run_backends(*args); });
    }};

}  // namespace
}  // namespace tessel::cli
