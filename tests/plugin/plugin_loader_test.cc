// Plugins through the real dlopen path: the example plugin (by path, by symbol, via
// TESSEL_PLUGIN_PATH) against the fp64 reference with its mask, and every failure mode of the
// loader (missing file, not a library, missing symbol, wrong/zero ABI, incomplete table, failing
// init) leaving the host working.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace tessel::testing;

void expect_load_error(const std::string& reference, const std::vector<std::string>& fragments) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  try {
    registry.get(reference);
    ADD_FAILURE() << "expected loading '" << reference << "' to fail";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
  }
}

PatternSpec window_spec(int64_t window, int64_t block_q, int64_t block_kv) {
  PatternSpec spec;
  spec.type = PatternType::kSlidingWindow;
  spec.window_size = window;
  spec.block_q = block_q;
  spec.block_kv = block_kv;
  return spec;
}

// Plans and runs `backend` on fresh inputs; checks against the reference with the plugin's mask.
void expect_sink_window_matches_reference(const std::shared_ptr<Backend>& backend, int64_t seq_q, int64_t seq_kv,
                                          int64_t heads, int64_t kv_heads, PatternSpec spec, int64_t sinks) {
  const int64_t dim = 32;
  const Qkv t = random_qkv(2, seq_q, seq_kv, heads, kv_heads, dim, DType::kF32, 17 + seq_q);
  const auto builder = backend->make_metadata_builder();
  const auto impl = backend->make_impl();
  const auto metadata = builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, heads, kv_heads, dim, seq_q, seq_kv, 2, DType::kF32);
  Tensor out = poisoned(t.q.shape(), DType::kF32);
  Tensor lse = poisoned({2, heads, seq_q}, DType::kF32);
  const ForwardStats stats = impl->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, out, lse);
  const BlockMask mask = sink_window_mask(seq_q, seq_kv, spec.block_q, spec.block_kv, *spec.window_size, sinks);
  EXPECT_DOUBLE_EQ(stats.density, mask.density());
  expect_matches_masked_reference(t, mask, out, lse);
}

TEST(PluginLoader, ExamplePluginByPathDescribesItself) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  const auto backend = registry.get(example_plugin_path());
  EXPECT_EQ(backend->name(), "sink_window");
  EXPECT_EQ(backend->origin(), example_plugin_path());
  EXPECT_EQ(backend->supported_patterns(), std::vector<PatternType>{PatternType::kSlidingWindow});
  EXPECT_TRUE(backend->supports(ModuleType::kDitSelf));
  EXPECT_FALSE(backend->supports(ModuleType::kDitCross));
  EXPECT_TRUE(backend->supports(DeviceType::kCPU));
  EXPECT_EQ(backend->score(), 5);
  // Loading again by path returns the cached instance; naming the symbol explicitly is the same.
  EXPECT_EQ(registry.get(example_plugin_path()), backend);
  const auto by_symbol = registry.get(example_plugin_path() + ":tessel_plugin_init");
  EXPECT_EQ(by_symbol, backend);
}

TEST(PluginLoader, RelativePathsLoadTheFileInTheWorkingDirectory) {
  const fs::path previous = fs::current_path();
  fs::current_path(example_plugin_dir());
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  std::shared_ptr<Backend> backend;
  EXPECT_NO_THROW(backend = registry.get("./libtessel_sink_window.so"));
  EXPECT_NO_THROW(registry.get("libtessel_sink_window.so"));  // no '/': still this folder, not the system's
  fs::current_path(previous);
  ASSERT_TRUE(backend);
  EXPECT_EQ(backend->name(), "sink_window");
}

TEST(PluginLoader, ExamplePluginEqualsTheReferenceWithItsMask) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  const auto backend = registry.get(example_plugin_path());
  // Default: one sink block; self attention with partial last blocks.
  expect_sink_window_matches_reference(backend, 300, 300, 4, 4, window_spec(40, 64, 32), 1);
  // GQA, seq_q != seq_kv (bottom-right aligned window), sinks from the always-keep option.
  PatternSpec spec = window_spec(20, 32, 32);
  spec.sink_blocks = 2;
  expect_sink_window_matches_reference(backend, 96, 250, 8, 2, spec, 2);
  // Sinks from the backend option when sink_blocks is 0.
  spec = window_spec(0, 32, 16);
  spec.options["sinks"] = "3";
  expect_sink_window_matches_reference(backend, 128, 128, 2, 1, spec, 3);
}

TEST(PluginLoader, PluginErrorsComeBackAsErrorsWithTheirMessage) {
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  const auto backend = registry.get(example_plugin_path());
  const auto builder = backend->make_metadata_builder();
  PatternSpec spec = window_spec(8, 32, 32);
  spec.options["sinks"] = "-1";
  try {
    builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 16, 64, 64);
    ADD_FAILURE() << "expected a plan error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("plugin 'sink_window'"), std::string::npos) << message;
    EXPECT_NE(message.find("plan failed (status invalid_argument)"), std::string::npos) << message;
    EXPECT_NE(message.find("option sinks must be >= 0"), std::string::npos) << message;
  }
  // A bad output tensor: the host kernel's error travels through the plugin and back.
  spec.options.clear();
  const auto metadata = builder->plan(ExecContext{}, spec, ModuleType::kDitSelf, 2, 2, 16, 64, 64, 1, DType::kF32);
  const Qkv t = random_qkv(1, 64, 64, 2, 2, 16, DType::kF32, 3);
  Tensor wrong_out = Tensor::empty({1, 64, 2, 8}, DType::kF32);
  try {
    backend->make_impl()->forward(ExecContext{}, t.q, t.k, t.v, *metadata, StepInfo{}, wrong_out, {});
    ADD_FAILURE() << "expected a forward error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("forward_with_context failed"), std::string::npos) << message;
    EXPECT_NE(message.find("out"), std::string::npos) << message;
  }
  // Unsupported module type is refused before the plugin is called.
  EXPECT_THROW(builder->plan(ExecContext{}, spec, ModuleType::kDitCross, 2, 2, 16, 64, 64), Error);
}

TEST(PluginLoader, EveryFailureModeIsAClearErrorAndTheHostKeepsWorking) {
  expect_load_error("/nonexistent/dir/libtessel_x.so", {"plugin '/nonexistent/dir/libtessel_x.so'", "file not found"});
  const std::string not_a_library = ::testing::TempDir() + "/libtessel_not_a_library_" + std::to_string(getpid()) + ".so";
  {
    std::ofstream out(not_a_library);
    out << "this is not an ELF file";
  }
  expect_load_error(not_a_library, {"cannot load the shared library"});
  expect_load_error(broken_plugin_path("missing_symbol"),
                    {"libtessel_broken_missing_symbol.so", "missing entry symbol 'tessel_plugin_init'", "tessel_plugin.h"});
  expect_load_error(broken_plugin_path("wrong_abi"),
                    {"ABI version mismatch", "built for ABI version 999", "supports versions 1..2"});
  expect_load_error(broken_plugin_path("wrong_abi") + ":zero_abi_init", {"did not set abi_version"});
  expect_load_error(broken_plugin_path("wrong_abi") + ":incomplete_init", {"incomplete table: 'forward' is not set"});
  expect_load_error(broken_plugin_path("wrong_abi") + ":no_such_entry", {"missing entry symbol 'no_such_entry'"});
  expect_load_error(broken_plugin_path("failing_init"),
                    {"init failed (status unsupported)", "no accelerator found for the broken plugin"});
  fs::remove(not_a_library);

  // After all of that, the host still loads and runs a good plugin.
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  expect_sink_window_matches_reference(registry.get(example_plugin_path()), 128, 128, 2, 2, window_spec(32, 32, 32), 1);
}

// `path:symbol` names any symbol: only a function of the library itself that fills a valid table
// (known status, ABI version and size first, then code pointers) is accepted; nothing else in the
// table is called.
TEST(PluginLoader, PathSymbolRefusesSymbolsThatAreNoEntryPoint) {
  const std::string bad = broken_plugin_path("bad_tables");
  const struct {
    std::string reference;
    std::vector<std::string> fragments;
  } cases[] = {
      // The example plugin needs the C library: dlsym finds libc's functions through it.
      {example_plugin_path() + ":printf", {"'printf' is not defined by this library but by its dependency"}},
      {example_plugin_path() + ":abort", {"'abort' is not defined by this library"}},
      {bad + ":not_a_function", {"'not_a_function' is not a function"}},
      {bad + ":oversized_table_init", {"table struct_size", "bytes reserved", "1048576"}},
      {bad + ":wild_pointer_init", {"'forward' points into no loaded library"}},
      {bad + ":odd_status_init", {"returned 4242, not a tessel_status"}},
      {bad + ":unterminated_message_init", {"init failed (status internal): xxxx"}},
      {"/lib/x86_64-linux-gnu/libc.so.6:abort", {"a library this process already uses"}},
      {"/dev/zero", {"not a regular file"}},
      {::testing::TempDir() + "/", {"not a regular file"}},
  };
  for (const auto& c : cases) expect_load_error(c.reference, c.fragments);
  // The same library's real entry point still loads.
  BackendRegistry registry(/*discover_plugins=*/false);
  install_plugin_loader(registry);
  EXPECT_EQ(registry.get(bad)->name(), "bad_tables_valid_entry");
}

// A plugin folder that is a file or does not exist is reported, not silently skipped.
TEST(PluginLoader, PluginDirsThatAreNoFolderAreReported) {
  const std::string file = ::testing::TempDir() + "/tessel_plugin_path_file_" + std::to_string(getpid()) + ".txt";
  std::ofstream(file) << "not a folder";
  LogCapture log;
  BackendRegistry registry(/*discover_plugins=*/true);
  install_plugin_loader(registry);
  registry.set_plugin_dirs({file, "/nonexistent/tessel/plugins"});
  const auto failures = registry.plugin_failures();
  const auto reported = [&](const std::string& entry, const std::string& fragment) {
    for (const PluginFailure& f : failures)
      if (f.path == entry && f.message.find(fragment) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(reported(file, "plugin folder is a file, not a directory"));
  EXPECT_TRUE(reported("/nonexistent/tessel/plugins", "plugin folder does not exist"));
  std::remove(file.c_str());
}

TEST(PluginLoader, DiscoveryThroughThePluginDirsSkipsBrokenLibraries) {
  // A plugin folder holding a copy of the example plugin and every broken library.
  const fs::path dir = fs::path(::testing::TempDir()) / ("tessel_plugin_path_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(example_plugin_path(), dir / "libcopied_sink_window.so");
  for (const std::string mode : {"missing_symbol", "wrong_abi", "failing_init"})
    fs::copy_file(broken_plugin_path(mode), dir / ("libtessel_broken_" + mode + ".so"));
  std::ofstream(dir / "README.txt") << "not a plugin: ignored (no .so suffix)";

  LogCapture log;
  BackendRegistry registry(/*discover_plugins=*/true);
  install_plugin_loader(registry);
  registry.set_plugin_dirs({dir.string()});
  const auto found = registry.find("sink_window");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->origin(), (dir / "libcopied_sink_window.so").string());  // the given dirs come first

  const auto failures = registry.plugin_failures();
  const auto failed = [&](const std::string& file, const std::string& fragment) {
    for (const PluginFailure& f : failures)
      if (f.path.find(file) != std::string::npos && f.message.find(fragment) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(failed("libtessel_broken_missing_symbol.so", "missing entry symbol"));
  EXPECT_TRUE(failed("libtessel_broken_wrong_abi.so", "ABI version mismatch"));
  EXPECT_TRUE(failed("libtessel_broken_failing_init.so", "init failed"));
  // The install folder's own copy has the same name and is reported, not loaded twice.
  EXPECT_TRUE(failed("libtessel_sink_window.so", "already taken"));
  EXPECT_GE(log.lines.size(), 4u);

  // Listed, resolvable by name, and correct.
  bool listed = false;
  for (const auto& backend : registry.list()) listed |= backend->name() == "sink_window";
  EXPECT_TRUE(listed);
  SparseAttnConfig config;
  config.backend = "sink_window";
  config.pattern.type = PatternType::kSlidingWindow;
  const Resolution r = registry.resolve(ResolvedSparseAttnConfig(config), ModuleType::kDitSelf, Device::cpu());
  ASSERT_TRUE(r.backend);
  EXPECT_EQ(r.backend, found);
  expect_sink_window_matches_reference(r.backend, 200, 200, 2, 2, window_spec(50, 64, 64), 1);
  // auto also finds it: the only backend here for sliding_window.
  config.backend = "auto";
  EXPECT_EQ(registry.resolve(ResolvedSparseAttnConfig(config), ModuleType::kDitSelf, Device::cpu()).backend, found);
  fs::remove_all(dir);
}

TEST(PluginLoader, DefaultRegistryHasTheBuiltinsAndDiscoversPlugins) {
  const auto registry = make_default_registry();
  EXPECT_NE(registry->find("dense"), nullptr);
  EXPECT_NE(registry->find("threshold"), nullptr);
  EXPECT_NE(registry->find("xattn"), nullptr);  // the KV policies too
  const auto found = registry->find("sink_window");  // the install folder's example plugin
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->origin(), example_plugin_path());
  EXPECT_TRUE(make_default_registry(/*discover_plugins=*/false)->find("sink_window") == nullptr);
}

}  // namespace
}  // namespace tessel
