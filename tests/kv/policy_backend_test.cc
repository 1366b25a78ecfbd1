// The KV sparse policies are backends of the registry (module types llm_prefill / llm_decode):
// built-ins resolve by name, a backend registered at run time can provide a policy, and names that
// are not KV policies are rejected with the list of those that are.
#include <gtest/gtest.h>

#include <string>

#include "error_of.h"
#include "tessel/core/error.h"
#include "tessel/kv/policy_backend.h"
#include "tessel/sparse/builtin_backends.h"

namespace tessel::kv {
namespace {

using tessel::testing::error_of;

TEST(PolicyBackend, BuiltinsResolveByNameWithTheirPhases) {
  BackendRegistry registry(/*discover_plugins=*/false);
  register_builtin_policies(registry);
  register_builtin_policies(registry);  // idempotent: nothing registered twice
  EXPECT_EQ(registry.list().size(), 5u);
  for (const char* name : {"full", "quest", "xattn", "topk"})
    EXPECT_EQ(make_sparse_policy(registry, name)->name(), name);
  EXPECT_EQ(make_sparse_policy(registry, "xattention-bsa")->name(), "xattn");
  EXPECT_TRUE(registry.find("xattn")->supports(ModuleType::kLlmPrefill));
  EXPECT_FALSE(registry.find("xattn")->supports(ModuleType::kLlmDecode));
  EXPECT_TRUE(registry.find("topk")->supports(ModuleType::kLlmDecode));
  EXPECT_FALSE(registry.find("topk")->supports(ModuleType::kLlmPrefill));
  EXPECT_TRUE(registry.find("full")->supports(ModuleType::kLlmPrefill));
  EXPECT_FALSE(registry.find("full")->supports(ModuleType::kDitSelf));
  EXPECT_TRUE(registry.find("quest")->supported_patterns().empty());
}

TEST(PolicyBackend, OptionsReachThePolicy) {
  BackendRegistry registry(/*discover_plugins=*/false);
  register_builtin_policies(registry);
  PolicyOptions options;
  options.xattention.threshold = 1.5;
  EXPECT_NE(error_of([&] { make_sparse_policy(registry, "xattn", options); }).find("xattention.threshold"),
            std::string::npos);
  options.top_k = 0;
  EXPECT_NE(error_of([&] { make_sparse_policy(registry, "topk", options); }).find("top_k"), std::string::npos);
}

// A policy provided from outside the library: loads only the most recent block.
class LastBlockPolicy final : public SparsePolicy {
 public:
  std::string name() const override { return "last-block"; }
  bool supports_prefill() const override { return false; }
  bool supports_decode() const override { return true; }
  std::vector<int32_t> select_blocks(const std::vector<int32_t>& available, OffloadEngine&,
                                     const PolicyContext&) override {
    return available.empty() ? available : std::vector<int32_t>{available.back()};
  }
};

class LastBlockBackend final : public PolicyBackend {
 public:
  std::string name() const override { return "last-block"; }
  std::vector<ModuleType> supported_module_types() const override { return {ModuleType::kLlmDecode}; }
  std::unique_ptr<SparsePolicy> make_policy(const PolicyOptions&) const override {
    return std::make_unique<LastBlockPolicy>();
  }
};

TEST(PolicyBackend, ARegisteredBackendProvidesAPolicy) {
  BackendRegistry registry(/*discover_plugins=*/false);
  register_builtin_policies(registry);
  registry.register_backend(std::make_shared<LastBlockBackend>());
  auto policy = make_sparse_policy(registry, "last-block");
  EXPECT_EQ(policy->name(), "last-block");
  EXPECT_NE(error_of([&] { make_sparse_policy(registry, "nope"); }).find("last-block"), std::string::npos);
}

TEST(PolicyBackend, NamesThatAreNotPoliciesAreRejected) {
  BackendRegistry registry(/*discover_plugins=*/false);
  register_builtin_backends(registry);
  register_builtin_policies(registry);
  const std::string dense = error_of([&] { make_sparse_policy(registry, "dense"); });
  EXPECT_NE(dense.find("not a KV policy"), std::string::npos) << dense;
  const std::string unknown = error_of([&] { make_sparse_policy(registry, "nope"); });
  EXPECT_NE(unknown.find("full, quest, xattn, xattention-bsa, topk"), std::string::npos) << unknown;
  EXPECT_NE(error_of([&] { registry.find("quest")->make_impl(); }).find("make_policy"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.find("quest")->make_metadata_builder(); }).find("make_policy"), std::string::npos);
  // The built-in default still resolves without a caller-provided registry.
  EXPECT_EQ(make_sparse_policy("topk")->name(), "topk");
}

}  // namespace
}  // namespace tessel::kv
