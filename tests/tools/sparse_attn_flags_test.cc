// The app side of sparse-attention configuration: the --sparse-attn-* flags, the environment
// variables (the DIFFUSION_ alias and its precedence), the config they build, and the backend
// override they hand to resolution (env > config > auto > none), all by passing values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include "sparse/pattern_test_util.h"
#include "sparse/sparse_test_util.h"
#include "sparse_attn_flags.h"
#include "tessel/core/error.h"
#include "tessel/sparse/registry.h"

namespace tessel {
namespace {

using cli::SparseAttnEnv;
using cli::SparseAttnFlags;
using testing::expect_error_containing;
using testing::full_mask_backend;


SparseAttnEnv env_of(const std::map<std::string, std::string>& variables) {
  return cli::parse_sparse_attn_env([&](const char* name) -> std::optional<std::string> {
    const auto it = variables.find(name);
    return it == variables.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

SparseAttnFlags parse_flags(std::vector<std::string> args) {
  CLI::App app;
  SparseAttnFlags flags;
  cli::add_sparse_attn_flags(app, flags);
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector in reverse order
  app.parse(args);
  return flags;
}

TEST(SparseAttnEnv, BackendAliasAndItsPrecedence) {
  EXPECT_FALSE(env_of({}).backend.has_value());
  EXPECT_EQ(env_of({{"TESSEL_SPARSE_ATTN_BACKEND", "alpha"}}).backend, "alpha");
  EXPECT_EQ(env_of({{"DIFFUSION_SPARSE_ATTN_BACKEND", "beta"}}).backend, "beta");

  // Both set and equal: no warning.
  const SparseAttnEnv same = env_of({{"TESSEL_SPARSE_ATTN_BACKEND", "alpha"}, {"DIFFUSION_SPARSE_ATTN_BACKEND", "alpha"}});
  EXPECT_EQ(same.backend, "alpha");
  EXPECT_TRUE(same.warnings.empty());

  // Both set and different: TESSEL_ wins, with a warning naming both.
  const SparseAttnEnv differ = env_of({{"TESSEL_SPARSE_ATTN_BACKEND", "alpha"}, {"DIFFUSION_SPARSE_ATTN_BACKEND", "beta"}});
  EXPECT_EQ(differ.backend, "alpha");
  ASSERT_EQ(differ.warnings.size(), 1u);
  for (const char* fragment : {"TESSEL_SPARSE_ATTN_BACKEND='alpha'", "DIFFUSION_SPARSE_ATTN_BACKEND='beta'", "using TESSEL"})
    EXPECT_NE(differ.warnings[0].find(fragment), std::string::npos) << differ.warnings[0];

  // An empty variable counts as unset, so the alias applies.
  EXPECT_EQ(env_of({{"TESSEL_SPARSE_ATTN_BACKEND", ""}, {"DIFFUSION_SPARSE_ATTN_BACKEND", "beta"}}).backend, "beta");
  EXPECT_TRUE(env_of({{"TESSEL_SPARSE_ATTN_BACKEND", ""}}).warnings.empty());
  EXPECT_EQ(cli::backend_override(env_of({})), "");
}

TEST(SparseAttnEnv, PluginPathIsSplitAtColons) {
  EXPECT_TRUE(env_of({}).plugin_dirs.empty());
  EXPECT_EQ(env_of({{"TESSEL_PLUGIN_PATH", "/tmp/a::/tmp/b:"}}).plugin_dirs,
            (std::vector<std::string>{"/tmp/a", "/tmp/b"}));
  BackendRegistry registry(/*discover_plugins=*/false);
  cli::apply_plugin_dirs(registry, env_of({{"TESSEL_PLUGIN_PATH", "/tmp/tessel_x:/tmp/tessel_y"}}));
  const std::vector<std::string> dirs = registry.plugin_search_dirs();
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], "/tmp/tessel_x");
  EXPECT_EQ(dirs[1], "/tmp/tessel_y");
}

TEST(SparseAttnFlags, FlagsOverrideJsonWhichOverridesDefaults) {
  EXPECT_FALSE(parse_flags({}).any());
  EXPECT_FALSE(cli::sparse_attn_requested(parse_flags({}), env_of({})));

  const SparseAttnFlags flags = parse_flags({"--sparse-attn-backend", "block_sparse", "--sparse-attn-topk", "0.2",
                                             "--sparse-attn-schedule", "aggressive", "--sparse-attn-pattern",
                                             "sliding_window", "--sparse-attn-config",
                                             R"({"topk_ratio": 0.9, "window_size": 64, "backend": "dense"})"});
  EXPECT_TRUE(flags.any());
  const SparseAttnConfig c = cli::sparse_attn_config_from(flags, env_of({}));
  EXPECT_EQ(c.backend, "block_sparse");         // flag beats JSON
  EXPECT_DOUBLE_EQ(c.selection.topk_ratio, 0.2);  // flag beats JSON
  EXPECT_EQ(c.schedule, "aggressive");
  EXPECT_EQ(c.pattern.type, PatternType::kSlidingWindow);
  EXPECT_EQ(c.pattern.window_size, 64);         // JSON beats default
}

TEST(SparseAttnFlags, EnvConfigIsTheFallbackForTheJsonFlag) {
  const SparseAttnEnv env = env_of({{"TESSEL_SPARSE_ATTN_CONFIG", R"({"warmup": {"dense_layers": 3}, "topk_ratio": 0.7})"}});
  EXPECT_TRUE(cli::sparse_attn_requested(parse_flags({}), env));
  const SparseAttnConfig from_env = cli::sparse_attn_config_from(parse_flags({}), env);
  EXPECT_DOUBLE_EQ(from_env.selection.topk_ratio, 0.7);
  EXPECT_EQ(from_env.warmup.dense_layers, 3);
  // The flag wins over the environment (which is then not read at all).
  const SparseAttnConfig given = cli::sparse_attn_config_from(parse_flags({"--sparse-attn-config", R"({"topk_ratio": 0.4})"}), env);
  EXPECT_DOUBLE_EQ(given.selection.topk_ratio, 0.4);
  EXPECT_EQ(given.warmup.dense_layers, 0);
  // A backend variable alone also asks for sparse attention.
  EXPECT_TRUE(cli::sparse_attn_requested(parse_flags({}), env_of({{"DIFFUSION_SPARSE_ATTN_BACKEND", "dense"}})));
  // A bad env JSON is named by the variable when it is a file reference.
  expect_error_containing([] { cli::sparse_attn_config_from({}, env_of({{"TESSEL_SPARSE_ATTN_CONFIG", "@/nonexistent/c.json"}})); },
               {"TESSEL_SPARSE_ATTN_CONFIG", "/nonexistent/c.json", "cannot open"});
}

TEST(SparseAttnFlags, ReadsAtFileAndReportsMissingFiles) {
  const std::string path = ::testing::TempDir() + "/tessel_sparse_flags_config.json";
  {
    std::ofstream out(path);
    out << R"({"selection": {"topk_ratio": 0.3}, "schedule": "conservative"})";
  }
  const SparseAttnConfig c = cli::parse_sparse_attn_config_arg("@" + path);
  EXPECT_DOUBLE_EQ(c.selection.topk_ratio, 0.3);
  EXPECT_EQ(c.schedule, "conservative");
  std::remove(path.c_str());
  expect_error_containing([&] { cli::parse_sparse_attn_config_arg("@" + path); }, {"--sparse-attn-config", path, "cannot open"});
}

TEST(SparseAttnFlags, BadFlagValuesNameTheFlag) {
  const SparseAttnEnv none = env_of({});
  const auto config_of = [&](std::vector<std::string> args) {
    return ResolvedSparseAttnConfig(cli::sparse_attn_config_from(parse_flags(std::move(args)), none));
  };
  expect_error_containing([&] { config_of({"--sparse-attn-topk", "0"}); }, {"--sparse-attn-topk", "(0, 1]"});
  expect_error_containing([&] { config_of({"--sparse-attn-topk", "2"}); }, {"--sparse-attn-topk", "2"});
  expect_error_containing([&] { config_of({"--sparse-attn-schedule", "linear"}); }, {"sparse_attn.schedule", "'linear'"});
  expect_error_containing([&] { config_of({"--sparse-attn-pattern", "stripes"}); }, {"--sparse-attn-pattern", "'stripes'"});
  expect_error_containing([&] { config_of({"--sparse-attn-backend", ""}); }, {"--sparse-attn-backend"});
  EXPECT_THROW(parse_flags({"--sparse-attn-topk", "abc"}), CLI::ParseError);
}

// env > config > auto > none, with the override taken from the parsed environment.
TEST(SparseAttnFlags, ResolutionOrderFromEnvironmentAndFlags) {
  BackendRegistry registry(/*discover_plugins=*/false);
  registry.register_backend(full_mask_backend("alpha", {PatternType::kSlidingWindow}, 3));
  registry.register_backend(full_mask_backend("beta", {PatternType::kSlidingWindow}, 7));
  const auto resolve = [&](const std::map<std::string, std::string>& variables, std::vector<std::string> args) {
    const SparseAttnEnv env = env_of(variables);
    args.insert(args.end(), {"--sparse-attn-config", R"({"pattern": {"type": "sliding_window", "window_size": 8}})"});
    const ResolvedSparseAttnConfig config(cli::sparse_attn_config_from(parse_flags(args), env));
    return registry.resolve(config, ModuleType::kDitSelf, Device::cpu(), cli::backend_override(env));
  };
  const Resolution by_alias = resolve({{"DIFFUSION_SPARSE_ATTN_BACKEND", "alpha"}}, {"--sparse-attn-backend", "beta"});
  EXPECT_EQ(by_alias.source, ResolutionSource::kEnv);
  EXPECT_EQ(by_alias.backend->name(), "alpha");
  const Resolution by_env = resolve({{"TESSEL_SPARSE_ATTN_BACKEND", "alpha"}, {"DIFFUSION_SPARSE_ATTN_BACKEND", "beta"}}, {});
  EXPECT_EQ(by_env.backend->name(), "alpha");
  const Resolution by_config = resolve({}, {"--sparse-attn-backend", "alpha"});
  EXPECT_EQ(by_config.source, ResolutionSource::kConfig);
  EXPECT_EQ(by_config.backend->name(), "alpha");
  const Resolution by_auto = resolve({}, {});
  EXPECT_EQ(by_auto.source, ResolutionSource::kAuto);
  EXPECT_EQ(by_auto.backend->name(), "beta");
  const Resolution none = resolve({{"TESSEL_SPARSE_ATTN_BACKEND", "none"}}, {"--sparse-attn-backend", "alpha"});
  EXPECT_EQ(none.source, ResolutionSource::kEnv);
  EXPECT_EQ(none.backend, nullptr);
}

}  // namespace
}  // namespace tessel
