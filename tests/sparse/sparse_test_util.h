// Helpers shared by the sparse-interface tests: scoped environment variables, captured log
// lines, the paths of the plugins the build produces, and small test backends.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention_test_util.h"
#include "tessel/core/log.h"
#include "tessel/kernels/reference.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/mask_planning.h"
#include "tessel/sparse/registry.h"

namespace tessel::testing {

// Sets (or unsets, with nullopt) an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) setenv(name_.c_str(), value->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Collects log lines at warning level and above while alive.
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](LogLevel level, std::string_view message) {
      if (level >= LogLevel::kWarning) lines.emplace_back(message);
    });
  }
  ~LogCapture() { set_log_sink(previous_); }
  std::vector<std::string> lines;

 private:
  LogSink previous_;
};

inline std::string example_plugin_dir() { return std::string(TESSEL_BINARY_DIR) + "/lib/tessel/plugins"; }
inline std::string example_plugin_path() { return example_plugin_dir() + "/libtessel_sink_window.so"; }
inline std::string test_plugin_dir() { return std::string(TESSEL_BINARY_DIR) + "/lib/tessel/test_plugins"; }
inline std::string broken_plugin_path(const std::string& mode) {
  return test_plugin_dir() + "/libtessel_broken_" + mode + ".so";
}

// A registry with the built-in backends and no plugin discovery (what the sparse layer's tests
// exercise; plugin loading is the plugin layer's, tests/plugin/).
inline std::unique_ptr<BackendRegistry> builtin_registry() {
  auto registry = std::make_unique<BackendRegistry>(/*discover_plugins=*/false);
  register_builtin_backends(*registry);
  return registry;
}

// One built-in registry per test process, for tests that only look backends up.
inline BackendRegistry& builtins() {
  static const std::unique_ptr<BackendRegistry> registry = builtin_registry();
  return *registry;
}

// A static-mask backend keeping every block, for registry and adapter tests.
inline std::shared_ptr<Backend> full_mask_backend(const std::string& name, std::vector<PatternType> patterns, int score,
                                                  std::vector<DeviceType> devices = {DeviceType::kCPU}) {
  PatternBackendInfo info;
  info.name = name;
  info.patterns = std::move(patterns);
  info.score = score;
  info.devices = std::move(devices);
  return make_mask_planning_backend(info, [](const PatternSpec& spec, ModuleType, const AttentionShape& shape) {
    BlockMaskShape s;
    s.seq_q = shape.seq_q;
    s.seq_kv = shape.seq_kv;
    s.block_q = spec.block_q;
    s.block_kv = spec.block_kv;
    return PlannedMask{BlockMask::full(s), {}, {}};
  });
}

// The kernel-test tolerance rule (attention_test_util.h) for an output computed with `mask`:
// compares out/lse with the fp64 reference restricted to the mask's blocks.
inline void expect_matches_masked_reference(const Qkv& t, const BlockMask& mask, const TensorView& out,
                                            const TensorView& lse) {
  const std::vector<uint8_t> dense = mask.to_dense();
  const BlockMaskShape& s = mask.shape();
  const int64_t heads = t.q.size(2), kv_heads = t.k.size(2);
  const BlockMaskView view = mask.view();
  const auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t mh = view.mask_head_for(h, heads, kv_heads);
    const int64_t mb = s.mask_batch == 1 ? 0 : b;
    return dense[static_cast<size_t>(((mb * s.mask_heads + mh) * s.q_blocks() + i / s.block_q) * s.kv_blocks() +
                                     j / s.block_kv)] != 0;
  };
  const auto exact = reference::block_sparse_attention(t.q, t.k, t.v, view);
  expect_close_to_reference(t, AttentionOptions{}, keep, out, lse, exact);
}

// The documented mask of the example plugin (plugins/example/sink_window_plugin.c).
inline BlockMask sink_window_mask(int64_t seq_q, int64_t seq_kv, int64_t block_q, int64_t block_kv, int64_t window,
                                  int64_t sinks) {
  BlockMaskShape s;
  s.seq_q = seq_q;
  s.seq_kv = seq_kv;
  s.block_q = block_q;
  s.block_kv = block_kv;
  const int64_t shift = seq_kv - seq_q;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(s.q_blocks()));
  for (int64_t i = 0; i < s.q_blocks(); ++i) {
    const int64_t lo = std::max<int64_t>(i * block_q + shift - window, 0);
    const int64_t hi = std::min(std::min((i + 1) * block_q, seq_q) - 1 + shift + window, seq_kv - 1);
    for (int64_t j = 0; j < s.kv_blocks(); ++j)
      if (j < sinks || (lo <= hi && j >= lo / block_kv && j <= hi / block_kv))
        rows[static_cast<size_t>(i)].push_back(static_cast<int32_t>(j));
  }
  return BlockMask::from_rows(s, rows);
}

// Element-wise: out within out_tolerance of want_out; lse within lse_tolerance of want_lse, and
// -inf exactly where want_lse is -inf (rows with no key).
inline void expect_outputs_near(const TensorView& out, const TensorView& want_out, double out_tolerance,
                                const TensorView& lse, const TensorView& want_lse, double lse_tolerance) {
  for (int64_t i = 0; i < out.numel(); ++i)
    ASSERT_NEAR(element_as_double(out, i), element_as_double(want_out, i), out_tolerance) << "output element " << i;
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const double got = element_as_double(lse, i), expected = element_as_double(want_lse, i);
    if (std::isinf(expected)) {
      ASSERT_EQ(got, expected) << "lse " << i;
    } else {
      ASSERT_NEAR(got, expected, lse_tolerance) << "lse " << i;
    }
  }
}

}  // namespace tessel::testing
