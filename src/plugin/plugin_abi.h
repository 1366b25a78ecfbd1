// Internal: conversions between tessel's C++ types and the plain C structs of the plugin ABI
// (include/tessel/plugin/tessel_plugin.h), and the host API table given to plugins.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"
#include "tessel/kernels/attention.h"
#include "tessel/kernels/block_mask_view.h"
#include "tessel/plugin/tessel_plugin.h"
#include "tessel/sparse/backend.h"
#include "tessel/sparse/pattern.h"

namespace tessel::plugin {

tessel_tensor to_c(const TensorView& view);
// Throws Error (named `argument`) for a malformed C tensor (null data, bad ndim/dtype/device).
TensorView from_c(const tessel_tensor& tensor, const std::string& argument);

tessel_block_mask to_c(const BlockMaskView& mask);
BlockMaskView from_c(const tessel_block_mask& mask);

tessel_attention_options to_c(const AttentionOptions& options);
AttentionOptions from_c(const tessel_attention_options* options);

tessel_plan_request to_c(const AttentionShape& shape, ModuleType module);

// The C form of a context and step (ABI 2). The workspace pointer is the context's arena.
tessel_exec_context to_c(const ExecContext& ctx, const StepInfo& step);
// A context from a plugin's C context (NULL: the default one). `workspace` receives the borrowed
// workspace the returned context points to; it must outlive the context's use.
ExecContext from_c(const tessel_exec_context* ctx, Workspace& workspace);

// A C view of a PatternSpec; owns every array the C struct points to (nested specs included).
class CPatternSpec {
 public:
  explicit CPatternSpec(const PatternSpec& spec);
  CPatternSpec(const CPatternSpec&) = delete;
  CPatternSpec& operator=(const CPatternSpec&) = delete;
  const tessel_pattern_spec* get() const { return &spec_; }

 private:
  tessel_pattern_spec spec_{};
  tessel_block_mask mask_{};
  std::unique_ptr<CPatternSpec> inner_;
  std::vector<std::unique_ptr<CPatternSpec>> child_holders_;
  std::vector<tessel_pattern_spec> children_;
  std::vector<const char*> keys_, values_;
};

std::string_view status_name(int32_t status);  // "ok", "invalid_argument", ...

// The host table plugins receive (static storage).
const tessel_host_api* host_api();

}  // namespace tessel::plugin
