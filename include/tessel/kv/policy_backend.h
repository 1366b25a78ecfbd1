// The KV-cache sparse policies as backends of the sparse-attention registry, for the module types
// llm_prefill and llm_decode: a policy is found by name in a BackendRegistry like any other backend,
// so a backend registered at run time (for example by an application or a C++ extension) can
// provide a policy too.
//
// A PolicyBackend supports no DiT pattern (auto resolution for a DiT module never picks it) and has
// no MetadataBuilder / Impl (asking for one throws Error): what it makes is a SparsePolicy.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/kv/policies.h"
#include "tessel/sparse/registry.h"

namespace tessel::kv {

class PolicyBackend : public Backend {
 public:
  std::vector<PatternType> supported_patterns() const override { return {}; }
  std::vector<DeviceType> supported_devices() const override { return {DeviceType::kCPU, DeviceType::kCUDA}; }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override;
  std::unique_ptr<Impl> make_impl() const override;

  // A new policy with the given options (each policy reads its own part of them).
  virtual std::unique_ptr<SparsePolicy> make_policy(const PolicyOptions& options) const = 0;
};

// Registers the built-in policies that `registry` does not hold yet: "full", "quest", "xattn"
// (also under its long name "xattention-bsa") and "topk".
void register_builtin_policies(BackendRegistry& registry);

// The policy of the backend named `name` in `registry`. Throws Error when no backend has that name
// or when it is not an LLM policy backend.
std::unique_ptr<SparsePolicy> make_sparse_policy(BackendRegistry& registry, const std::string& name,
                                                 const PolicyOptions& options = {});

}  // namespace tessel::kv
