// Plugin ABI versions side by side: a version-1 plugin (no context; the step through update_step)
// and a version-2 plugin (forward_with_context) are both loaded through the registry and run; the
// version-2 one checks that it received the caller's stream and workspace. Plugins built for a
// future ABI are refused naming both versions (plugin_loader_test).
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/kernels/attention.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/plugin/tessel_plugin.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

using namespace tessel::testing;

std::string context_plugin_path(int version) {
  return test_plugin_dir() + "/libtessel_context_v" + std::to_string(version) + ".so";
}

// Loads a fixture through the registry, by path (an explicit path that fails to load throws).
std::shared_ptr<Backend> load_fixture(BackendRegistry& registry, int version) {
  auto backend = registry.get(context_plugin_path(version));
  EXPECT_EQ(backend->name(), "context_v" + std::to_string(version));
  return backend;
}

std::string hex(const void* address) {
  char text[32];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(address)));
  return text;
}

PatternSpec window_spec() {
  PatternSpec spec;
  spec.type = PatternType::kSlidingWindow;
  spec.window_size = 16;
  spec.block_q = spec.block_kv = 32;
  return spec;
}

void expect_dense(const Qkv& t, const TensorView& out) {
  const auto exact = reference::attention(t.q, t.k, t.v);
  expect_close_to_reference(t, {}, [](int64_t, int64_t, int64_t, int64_t) { return true; }, out, {}, exact);
}

TEST(PluginAbiCompat, VersionOnePluginLoadsAndGetsTheStepThroughUpdateStep) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  const auto backend = load_fixture(registry, 1);
  const Qkv t = random_qkv(1, 64, 64, 2, 2, 16, DType::kF32, 3);
  const auto metadata = backend->make_metadata_builder()->plan(ExecContext{}, window_spec(), ModuleType::kDitSelf,
                                                               AttentionShape::of(t.q, t.k, t.v));
  const auto impl = backend->make_impl();
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  // The fixture reports how many update_step calls its plan has seen as its density.
  EXPECT_DOUBLE_EQ(impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, {}).density, 0.0);
  EXPECT_DOUBLE_EQ(impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo::at(1, 4), out, {}).density, 1.0);
  EXPECT_DOUBLE_EQ(impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo::at(2, 4), out, {}).density, 2.0);
  expect_dense(t, out);
}

TEST(PluginAbiCompat, VersionTwoPluginReceivesTheCallersStreamWorkspaceAndStep) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  const auto backend = load_fixture(registry, 2);
  const Qkv t = random_qkv(1, 64, 64, 2, 2, 16, DType::kF32, 4);

  // A stream handle the plugin only compares (CPU work never touches it) and a real workspace that
  // the host kernel the plugin calls back into then uses.
  ExecContext ctx;
  ctx.stream = reinterpret_cast<StreamHandle>(uintptr_t{0x5eed00});
  Workspace workspace;
  ctx.workspace = &workspace;
  PatternSpec spec = window_spec();
  const auto metadata_for = [&](const PatternSpec& s) {
    return backend->make_metadata_builder()->plan(ctx, s, ModuleType::kDitSelf, AttentionShape::of(t.q, t.k, t.v));
  };
  workspace.reserve(metadata_for(spec)->workspace_bytes(ctx));
  spec.options["expect_stream"] = hex(ctx.stream);
  spec.options["expect_workspace"] = hex(workspace.data());
  const auto metadata = metadata_for(spec);
  const auto impl = backend->make_impl();

  StepInfo step = StepInfo::at(3, 10);
  step.density = 0.4;
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  const ForwardStats stats = impl->forward(ctx, t.q, t.k, t.v, *metadata, step, out, {});
  EXPECT_DOUBLE_EQ(stats.density, 0.4);  // the step's density reached the plugin
  expect_dense(t, out);

  // Another stream or no workspace: the plugin notices (so it really reads the context).
  ExecContext other_stream = ctx;
  other_stream.stream = nullptr;
  expect_error([&] { impl->forward(other_stream, t.q, t.k, t.v, *metadata, step, out, {}); },
               "not the caller's stream");
  ExecContext no_workspace = ctx;
  no_workspace.workspace = nullptr;
  expect_error([&] { impl->forward(no_workspace, t.q, t.k, t.v, *metadata, step, out, {}); },
               "not the caller's workspace");
}

TEST(PluginAbiCompat, HostTablesAreAppendOnly) {
  // Version-2 members sit after every version-1 member.
  EXPECT_GT(offsetof(tessel_plugin_backend, forward_with_context), offsetof(tessel_plugin_backend, shutdown));
  EXPECT_GT(offsetof(tessel_host_api, attention_with_context), offsetof(tessel_host_api, validate_block_mask));
  EXPECT_EQ(TESSEL_PLUGIN_ABI_VERSION, 2u);
}

}  // namespace
}  // namespace tessel
