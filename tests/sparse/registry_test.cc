// Backend registry: explicit registration, lookup by name and path, and the resolution order
// override (the app's env variable) > config > auto > none in every combination.
#include <gtest/gtest.h>

#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/builtin_backends.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

using testing::builtin_registry;
using testing::example_plugin_dir;
using testing::example_plugin_path;
using testing::full_mask_backend;

SparseAttnConfig config_with(const std::string& backend, PatternType pattern = PatternType::kSlidingWindow) {
  SparseAttnConfig c;
  c.backend = backend;
  c.pattern.type = pattern;
  c.pattern.window_size = 64;
  return c;
}

ResolvedSparseAttnConfig resolved_with(const std::string& backend, PatternType pattern = PatternType::kSlidingWindow) {
  return ResolvedSparseAttnConfig(config_with(backend, pattern));
}

// What each env / config value means in the matrix below.
struct Choice {
  std::optional<std::string> value;  // nullopt: unset (env) or "auto" (config)
  std::string expected_backend;      // "" = dense (none)
};

TEST(Registry, ResolutionPriorityInEveryCombination) {
  const std::vector<Choice> env_choices = {
      {std::nullopt, ""}, {"alpha", "alpha"}, {example_plugin_path(), "sink_window"}, {"none", ""}};
  const std::vector<Choice> config_choices = {{std::nullopt, ""},
                                              {"beta", "beta"},
                                              {example_plugin_path() + ":tessel_plugin_init", "sink_window"},
                                              {"none", ""}};
  for (const bool auto_candidates : {true, false}) {
    BackendRegistry registry(/*discover_plugins=*/false);
    // Library paths load through the registry's plugin loader; this one stands in for dlopen.
    registry.set_plugin_loader([](const std::string& path, const std::string&) {
      EXPECT_EQ(path, example_plugin_path());
      return full_mask_backend("sink_window", {PatternType::kSlidingWindow}, 0);
    });
    // With candidates, auto picks the highest score (beta); without, nothing may be auto-chosen.
    registry.register_backend(full_mask_backend("alpha", {PatternType::kSlidingWindow}, auto_candidates ? 3 : -1));
    registry.register_backend(full_mask_backend("beta", {PatternType::kSlidingWindow}, auto_candidates ? 7 : -1));
    for (const Choice& env : env_choices) {
      for (const Choice& config : config_choices) {
        SCOPED_TRACE("env=" + env.value.value_or("<unset>") + " config=" + config.value.value_or("auto") +
                     " auto_candidates=" + std::to_string(auto_candidates));
        const Resolution r = registry.resolve(resolved_with(config.value.value_or("auto")), ModuleType::kDitSelf,
                                              Device::cpu(), env.value.value_or(""));
        std::string expected;
        ResolutionSource source;
        if (env.value) {
          source = ResolutionSource::kEnv;
          expected = env.expected_backend;
        } else if (config.value) {
          source = ResolutionSource::kConfig;
          expected = config.expected_backend;
        } else if (auto_candidates) {
          source = ResolutionSource::kAuto;
          expected = "beta";
        } else {
          source = ResolutionSource::kNone;
        }
        EXPECT_EQ(r.source, source) << resolution_source_name(r.source);
        EXPECT_EQ(r.backend ? r.backend->name() : "", expected);
        if (source == ResolutionSource::kEnv) EXPECT_EQ(r.requested, *env.value);
        if (source == ResolutionSource::kConfig) EXPECT_EQ(r.requested, *config.value);
      }
    }
  }
}

TEST(Registry, EmptyOverrideCountsAsNone) {
  BackendRegistry registry(/*discover_plugins=*/false);
  registry.register_backend(full_mask_backend("alpha", {PatternType::kSlidingWindow}, 1));
  const Resolution r = registry.resolve(resolved_with("auto"), ModuleType::kDitSelf, Device::cpu(), "");
  EXPECT_EQ(r.source, ResolutionSource::kAuto);
  ASSERT_TRUE(r.backend);
  EXPECT_EQ(r.backend->name(), "alpha");
}

TEST(Registry, AutoFiltersByPatternModuleAndDeviceAndSkipsNegativeScores) {
  BackendRegistry registry(/*discover_plugins=*/false);
  registry.register_backend(full_mask_backend("cuda_only", {PatternType::kSlidingWindow}, 50, {DeviceType::kCUDA}));
  registry.register_backend(full_mask_backend("topk_only", {PatternType::kDynamicTopk}, 40));
  registry.register_backend(full_mask_backend("oracle", {PatternType::kSlidingWindow}, -1));
  registry.register_backend(full_mask_backend("first", {PatternType::kSlidingWindow}, 2));
  registry.register_backend(full_mask_backend("tie", {PatternType::kSlidingWindow}, 2));
  const Resolution cpu = registry.resolve(resolved_with("auto"), ModuleType::kDitSelf, Device::cpu());
  ASSERT_TRUE(cpu.backend);
  EXPECT_EQ(cpu.backend->name(), "first");  // ties: the earlier registered
  const Resolution cuda = registry.resolve(resolved_with("auto"), ModuleType::kDitSelf, Device::cuda(0));
  ASSERT_TRUE(cuda.backend);
  EXPECT_EQ(cuda.backend->name(), "cuda_only");
  const Resolution topk = registry.resolve(resolved_with("auto", PatternType::kDynamicTopk), ModuleType::kDitSelf, Device::cpu());
  ASSERT_TRUE(topk.backend);
  EXPECT_EQ(topk.backend->name(), "topk_only");
  const Resolution none = registry.resolve(resolved_with("auto", PatternType::kThreshold), ModuleType::kDitSelf, Device::cpu());
  EXPECT_EQ(none.backend, nullptr);
  EXPECT_EQ(none.source, ResolutionSource::kNone);
}

TEST(Registry, ExplicitChoicesThatCannotRunFailLoudly) {
  const auto owned = builtin_registry();
  BackendRegistry& registry = *owned;
  try {
    registry.resolve(resolved_with("no_such_backend"), ModuleType::kDitSelf, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'no_such_backend'"), std::string::npos) << message;
    EXPECT_NE(message.find("dense"), std::string::npos) << message;         // lists what exists
    EXPECT_NE(message.find("block_sparse"), std::string::npos) << message;
  }
  try {
    registry.resolve(resolved_with("block_sparse", PatternType::kDynamicTopk), ModuleType::kDitSelf, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("backend 'block_sparse' (chosen by config)"), std::string::npos) << message;
    EXPECT_NE(message.find("sliding_window"), std::string::npos) << message;
    EXPECT_NE(message.find("dynamic_topk"), std::string::npos) << message;
  }
  // The backend's validate_config runs at resolution.
  SparseAttnConfig no_window = config_with("block_sparse");
  no_window.pattern.window_size.reset();
  try {
    registry.resolve(ResolvedSparseAttnConfig(no_window), ModuleType::kDitSelf, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sparse_attn.pattern.window_size: required by the block_sparse backend"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(registry.resolve(resolved_with("block_sparse", PatternType::kBlockSparse), ModuleType::kDitSelf, Device::cpu()), Error);
  try {
    registry.resolve(resolved_with("auto"), ModuleType::kDitSelf, Device::cpu(), "/nonexistent/libnothing.so");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    // Loud, never silently dense (this registry has no plugin loader; the loader's own errors are
    // tested in tests/plugin/).
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/libnothing.so'"), std::string::npos) << e.what();
  }
}

TEST(Registry, RegistrationRejectsDuplicatesAndEmptyNames) {
  const auto owned = builtin_registry();
  BackendRegistry& registry = *owned;
  EXPECT_THROW(registry.register_backend(make_dense_backend()), Error);  // built-in already there
  EXPECT_THROW(registry.register_backend(nullptr), Error);
  registry.register_backend(full_mask_backend("mine", {PatternType::kSlidingWindow}, 0));
  EXPECT_EQ(registry.find("mine")->name(), "mine");
  EXPECT_EQ(registry.find("absent"), nullptr);
  EXPECT_THROW(full_mask_backend("", {PatternType::kSlidingWindow}, 0), Error);
}

TEST(Registry, BuiltinsAreRegisteredExplicitly) {
  const auto registry = builtin_registry();
  const auto dense = registry->find("dense");
  ASSERT_TRUE(dense);
  EXPECT_EQ(dense->origin(), "built-in");
  EXPECT_LT(dense->score(), 0);  // the oracle is never chosen by auto
  EXPECT_EQ(dense->supported_patterns().size(), static_cast<size_t>(kNumPatternTypes));
  const auto block_sparse = registry->find("block_sparse");
  ASSERT_TRUE(block_sparse);
  EXPECT_TRUE(block_sparse->supports(PatternType::kBlockSparse));
  EXPECT_TRUE(block_sparse->supports(PatternType::kSlidingWindow));
  EXPECT_FALSE(block_sparse->supports(PatternType::kDynamicTopk));
  for (const std::string name : {"sliding_window", "radial", "dynamic_topk", "threshold"})
    EXPECT_NE(registry->find(name), nullptr) << name;
  EXPECT_THROW(register_builtin_backends(*registry), Error);  // every name is taken already

  BackendRegistry without(/*discover_plugins=*/false);
  EXPECT_TRUE(without.list().empty());
}

TEST(Registry, LibrariesLoadOnlyThroughTheInstalledPluginLoader) {
  BackendRegistry registry(/*discover_plugins=*/true);
  registry.set_plugin_dirs({example_plugin_dir()});
  EXPECT_TRUE(registry.list().empty());  // no loader: the plugin folders are not scanned
  try {
    registry.get("/some/dir/libx.so");
    ADD_FAILURE() << "a plugin path loaded without a plugin loader";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plugin loader"), std::string::npos) << e.what();
  }
  EXPECT_THROW(registry.set_plugin_loader(PluginLoader{}), Error);

  std::vector<std::string> loaded;
  registry.set_plugin_loader([&](const std::string& library, const std::string& symbol) {
    loaded.push_back(library + ":" + symbol);
    return full_mask_backend("loaded_" + std::to_string(loaded.size()), {PatternType::kSlidingWindow}, 1);
  });
  const auto by_path = registry.get("/some/dir/libx.so:my_init");
  EXPECT_EQ(by_path->name(), "loaded_1");
  EXPECT_EQ(registry.get("/some/dir/libx.so:my_init"), by_path);  // cached by path and symbol
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0], "/some/dir/libx.so:my_init");
  // Discovery now runs through the same loader, once per library in the plugin folders.
  const size_t listed = registry.list().size();
  EXPECT_GE(listed, 1u);
  EXPECT_EQ(loaded.size(), 1u + listed);
}

TEST(Registry, PluginReferencesParse) {
  std::string path, symbol;
  EXPECT_FALSE(parse_plugin_reference("block_sparse", path, symbol));
  ASSERT_TRUE(parse_plugin_reference("/a/b/libx.so", path, symbol));
  EXPECT_EQ(path, "/a/b/libx.so");
  EXPECT_EQ(symbol, "tessel_plugin_init");
  ASSERT_TRUE(parse_plugin_reference("/a/b/libx.so:my_init", path, symbol));
  EXPECT_EQ(path, "/a/b/libx.so");
  EXPECT_EQ(symbol, "my_init");
  ASSERT_TRUE(parse_plugin_reference("libx.so", path, symbol));
  EXPECT_EQ(path, "libx.so");
  ASSERT_TRUE(parse_plugin_reference("./dir:with:colons/libx.so", path, symbol));
  EXPECT_EQ(path, "./dir:with:colons/libx.so");  // colons before the last '/' belong to the path
  EXPECT_EQ(symbol, "tessel_plugin_init");
}

TEST(Registry, SearchDirsFollowTheGivenDirsThenTheInstallDir) {
  BackendRegistry registry(/*discover_plugins=*/false);
  registry.set_plugin_dirs({"/tmp/tessel_a", "/tmp/tessel_b", "/tmp/tessel_a"});
  const auto dirs = registry.plugin_search_dirs();
  ASSERT_GE(dirs.size(), 3u);
  EXPECT_EQ(dirs[0], "/tmp/tessel_a");
  EXPECT_EQ(dirs[1], "/tmp/tessel_b");
  EXPECT_EQ(dirs[2], plugin_install_dir());
  EXPECT_EQ(dirs.size(), 3u);  // the repeated folder is scanned once
}

}  // namespace
}  // namespace tessel
