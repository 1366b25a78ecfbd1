#include "tessel/kv/policy_backend.h"

#include <utility>

#include "tessel/core/error.h"

namespace tessel::kv {
namespace {

using PolicyFactory = std::function<std::unique_ptr<SparsePolicy>(const PolicyOptions&)>;

// A built-in policy: its registered name, the phases it serves and its factory.
class BuiltinPolicyBackend final : public PolicyBackend {
 public:
  BuiltinPolicyBackend(std::string name, std::vector<ModuleType> modules, PolicyFactory factory)
      : name_(std::move(name)), modules_(std::move(modules)), factory_(std::move(factory)) {}
  std::string name() const override { return name_; }
  std::vector<ModuleType> supported_module_types() const override { return modules_; }
  std::unique_ptr<SparsePolicy> make_policy(const PolicyOptions& options) const override { return factory_(options); }

 private:
  std::string name_;
  std::vector<ModuleType> modules_;
  PolicyFactory factory_;
};

std::vector<std::shared_ptr<Backend>> builtin_policy_backends() {
  const std::vector<ModuleType> both = {ModuleType::kLlmPrefill, ModuleType::kLlmDecode};
  const PolicyFactory xattention = [](const PolicyOptions& o) {
    return std::make_unique<XAttentionBsaPolicy>(o.xattention, o.xattention_scoring);
  };
  return {
      std::make_shared<BuiltinPolicyBackend>("full", both,
                                             [](const PolicyOptions&) { return std::make_unique<FullPolicy>(); }),
      // Quest selects for prefill only when asked (QuestOptions::enable_prefill).
      std::make_shared<BuiltinPolicyBackend>(
          "quest", both, [](const PolicyOptions& o) { return std::make_unique<QuestPolicy>(o.quest); }),
      std::make_shared<BuiltinPolicyBackend>("xattn", std::vector<ModuleType>{ModuleType::kLlmPrefill}, xattention),
      std::make_shared<BuiltinPolicyBackend>("xattention-bsa", std::vector<ModuleType>{ModuleType::kLlmPrefill},
                                             xattention),
      std::make_shared<BuiltinPolicyBackend>("topk", std::vector<ModuleType>{ModuleType::kLlmDecode},
                                             [](const PolicyOptions& o) { return std::make_unique<TopKPolicy>(o.top_k); }),
  };
}

}  // namespace

std::unique_ptr<MetadataBuilder> PolicyBackend::make_metadata_builder() const {
  throw Error(detail::concat("backend '", name(),
                             "' is a KV-cache sparse policy (llm_prefill / llm_decode): it has no metadata builder; "
                             "use make_policy"));
}

std::unique_ptr<Impl> PolicyBackend::make_impl() const {
  throw Error(detail::concat("backend '", name(),
                             "' is a KV-cache sparse policy (llm_prefill / llm_decode): it has no attention impl; "
                             "use make_policy"));
}

void register_builtin_policies(BackendRegistry& registry) {
  for (std::shared_ptr<Backend>& backend : builtin_policy_backends())
    if (!registry.find(backend->name())) registry.register_backend(std::move(backend));
}

std::unique_ptr<SparsePolicy> make_sparse_policy(BackendRegistry& registry, const std::string& name,
                                                 const PolicyOptions& options) {
  const std::shared_ptr<Backend> backend = registry.find(name);
  const auto* policy_backend = dynamic_cast<const PolicyBackend*>(backend.get());
  if (policy_backend == nullptr) {
    std::string known;
    for (const std::shared_ptr<Backend>& b : registry.list())
      if (dynamic_cast<const PolicyBackend*>(b.get()) != nullptr) known += (known.empty() ? "" : ", ") + b->name();
    fail_argument("policy", detail::concat("the name of a registered KV sparse policy (", known, ")"),
                  backend ? name + " (a backend that is not a KV policy)" : name);
  }
  return policy_backend->make_policy(options);
}

std::unique_ptr<SparsePolicy> make_sparse_policy(const std::string& name, const PolicyOptions& options) {
  BackendRegistry builtins(/*discover_plugins=*/false);
  register_builtin_policies(builtins);
  return make_sparse_policy(builtins, name, options);
}

}  // namespace tessel::kv
