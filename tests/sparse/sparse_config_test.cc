// SparseAttnConfig: defaults, JSON and CLI parsing, env fallback, and every validation error;
// PatternSpec / SpatialLayout validation.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "../../tools/sparse_attn_flags.h"
#include "sparse/sparse_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/pattern.h"

namespace tessel {
namespace {

using testing::ScopedEnv;

// Expects `fn` to throw tessel::Error whose message contains every fragment.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected tessel::Error containing '" << fragments.front() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
  }
}

TEST(SparseAttnConfig, DefaultsFollowTheRfcTeleFuserAndXAttention) {
  const SparseAttnConfig c;
  EXPECT_EQ(c.backend, "auto");
  EXPECT_EQ(c.pattern_type, "dynamic_topk");
  EXPECT_DOUBLE_EQ(c.topk_ratio, 0.5);
  EXPECT_EQ(c.block_size_q, 128);
  EXPECT_EQ(c.block_size_kv, 64);
  EXPECT_FALSE(c.window_size.has_value());
  EXPECT_FALSE(c.spatial_radius.has_value());
  EXPECT_EQ(c.schedule, "constant");
  EXPECT_EQ(c.dense_timesteps, 0);
  EXPECT_EQ(c.dense_layers, 0);
  EXPECT_DOUBLE_EQ(c.decay_factor, 1.0);
  EXPECT_EQ(c.local_window_size, 6);
  EXPECT_DOUBLE_EQ(c.threshold, 0.95);
  EXPECT_EQ(c.stride, 8);
  EXPECT_NO_THROW(c.validate());
}

TEST(SparseAttnConfig, ParsesEveryJsonField) {
  const SparseAttnConfig c = parse_sparse_attn_json(R"({
    "backend": "block_sparse", "pattern_type": "sliding_window", "topk_ratio": 0.25,
    "block_size_q": 64, "block_size_kv": 32, "window_size": 256, "spatial_radius": 3,
    "schedule": "aggressive", "dense_timesteps": 4, "dense_layers": 2, "decay_factor": 0.5,
    "local_window_size": 3, "threshold": 0.9, "stride": 16,
    "spatial_layout": {"frames": 5, "height": 16, "width": 32, "patch_size": 2, "ordering": "hilbert"},
    "num_text_tokens": 77, "keep_diagonal": true, "sink_blocks": 2, "keep_text": true,
    "i2i_pattern_type": "radial", "children": ["sliding_window", "radial"], "composite_op": "intersection",
    "options": {"cdf": 0.9, "mode": "fast", "flag": true}})");
  EXPECT_EQ(c.backend, "block_sparse");
  EXPECT_EQ(c.pattern_type, "sliding_window");
  EXPECT_DOUBLE_EQ(c.topk_ratio, 0.25);
  EXPECT_EQ(c.block_size_q, 64);
  EXPECT_EQ(c.block_size_kv, 32);
  EXPECT_EQ(c.window_size, 256);
  EXPECT_EQ(c.spatial_radius, 3);
  EXPECT_EQ(c.schedule, "aggressive");
  EXPECT_EQ(c.dense_timesteps, 4);
  EXPECT_EQ(c.dense_layers, 2);
  EXPECT_DOUBLE_EQ(c.decay_factor, 0.5);
  EXPECT_EQ(c.local_window_size, 3);
  EXPECT_DOUBLE_EQ(c.threshold, 0.9);
  EXPECT_EQ(c.stride, 16);
  ASSERT_TRUE(c.spatial_layout.has_value());
  EXPECT_EQ(c.spatial_layout->frames, 5);
  EXPECT_EQ(c.spatial_layout->ordering, SpatialOrdering::kHilbert);
  EXPECT_EQ(c.num_text_tokens, 77);
  EXPECT_TRUE(c.keep_diagonal);
  EXPECT_EQ(c.sink_blocks, 2);
  EXPECT_TRUE(c.keep_text);
  EXPECT_EQ(c.i2i_pattern_type, "radial");
  EXPECT_EQ(c.children, (std::vector<std::string>{"sliding_window", "radial"}));
  EXPECT_EQ(c.options.at("cdf"), "0.9");
  EXPECT_EQ(c.options.at("mode"), "fast");
  EXPECT_EQ(c.options.at("flag"), "true");

  // to_json round-trips.
  const SparseAttnConfig again = parse_sparse_attn_json(c.to_json());
  EXPECT_EQ(again.to_json(), c.to_json());

  const PatternSpec spec = c.to_pattern_spec();
  EXPECT_EQ(spec.type, PatternType::kSlidingWindow);
  EXPECT_EQ(spec.block_q, 64);
  EXPECT_EQ(spec.window_size, 256);
  EXPECT_EQ(spec.local_window_frames, 3);
  EXPECT_EQ(spec.num_image_tokens, 5 * 8 * 16);
  EXPECT_EQ(spec.sink_blocks, 2);
  ASSERT_TRUE(spec.i2i_pattern);
  EXPECT_EQ(spec.i2i_pattern->type, PatternType::kRadial);
  ASSERT_EQ(spec.children.size(), 2u);
  EXPECT_EQ(spec.children[1].type, PatternType::kRadial);
  EXPECT_EQ(spec.composite_op, CompositeOp::kIntersection);
  EXPECT_EQ(spec.option("mode"), "fast");
  EXPECT_EQ(spec.option("absent", "x"), "x");
}

TEST(SparseAttnConfig, EachOutOfRangeFieldIsNamedWithItsRange) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"topk_ratio": 0})", {"sparse_attn.topk_ratio", "(0, 1]", "got 0"}},
      {R"({"topk_ratio": 1.5})", {"sparse_attn.topk_ratio", "(0, 1]", "1.5"}},
      {R"({"block_size_q": 0})", {"sparse_attn.block_size_q", "[1, 4096]"}},
      {R"({"block_size_kv": 5000})", {"sparse_attn.block_size_kv", "[1, 4096]", "5000"}},
      {R"({"window_size": -1})", {"sparse_attn.window_size", ">= 0"}},
      {R"({"spatial_radius": -2})", {"sparse_attn.spatial_radius", ">= 0"}},
      {R"({"schedule": "wavy"})", {"sparse_attn.schedule", "constant", "conservative", "aggressive", "'wavy'"}},
      {R"({"pattern_type": "diagonal"})", {"pattern_type", "dynamic_topk", "'diagonal'"}},
      {R"({"dense_timesteps": -1})", {"sparse_attn.dense_timesteps", ">= 0"}},
      {R"({"dense_layers": -3})", {"sparse_attn.dense_layers", ">= 0"}},
      {R"({"decay_factor": 0})", {"sparse_attn.decay_factor", "(0, 16]"}},
      {R"({"local_window_size": 0})", {"sparse_attn.local_window_size", ">= 1"}},
      {R"({"threshold": 1.01})", {"sparse_attn.threshold", "(0, 1]"}},
      {R"({"stride": 65})", {"sparse_attn.stride", "[1, 64]"}},
      {R"({"sink_blocks": -1})", {"sparse_attn.sink_blocks", ">= 0"}},
      {R"({"num_text_tokens": -1})", {"sparse_attn.num_text_tokens", ">= 0"}},
      {R"({"keep_text": true})", {"sparse_attn.keep_text", "num_text_tokens"}},
      {R"({"backend": ""})", {"sparse_attn.backend", "auto"}},
      {R"({"composite_op": "xor"})", {"sparse_attn.composite_op", "'union' or 'intersection'"}},
      {R"({"i2i_pattern_type": "arrow"})", {"sparse_attn.i2i_pattern_type", "other than arrow"}},
      {R"({"children": ["composite"]})", {"sparse_attn.children", "other than composite"}},
      {R"({"spatial_layout": {"frames": 1, "height": 15, "width": 16, "patch_size": 2}})",
       {"sparse_attn.spatial_layout.height", "multiple of patch_size 2", "15"}},
      {R"({"spatial_layout": {"frames": 0, "height": 16, "width": 16}})", {"sparse_attn.spatial_layout.frames", ">= 1"}},
      {R"({"spatial_layout": {"height": 4, "width": 4, "ordering": "snake"}})", {"spatial_layout.ordering", "z_curve"}},
      {R"({"spatial_layout": {"depth": 4}})", {"sparse_attn.spatial_layout.depth", "unknown key"}},
  };
  for (const auto& [json, fragments] : cases) {
    SCOPED_TRACE(json);
    expect_error([&] { parse_sparse_attn_json(json); }, fragments);
  }
}

TEST(SparseAttnConfig, WrongTypesUnknownKeysAndBadJsonAreNamed) {
  expect_error([] { parse_sparse_attn_json(R"({"topk_ratio": "half"})"); },
               {"sparse_attn.topk_ratio", "a number", "string"});
  expect_error([] { parse_sparse_attn_json(R"({"block_size_q": 1.5})"); }, {"sparse_attn.block_size_q", "an integer"});
  expect_error([] { parse_sparse_attn_json(R"({"keep_diagonal": 1})"); }, {"sparse_attn.keep_diagonal", "true or false"});
  expect_error([] { parse_sparse_attn_json(R"({"options": {"x": [1]}})"); }, {"sparse_attn.options.x"});
  expect_error([] { parse_sparse_attn_json(R"({"topk": 0.5})"); }, {"sparse_attn.topk", "unknown key", "topk_ratio"});
  expect_error([] { parse_sparse_attn_json(R"({"topk_ratio": )"); }, {"invalid JSON"});
  expect_error([] { parse_sparse_attn_json("[1, 2]"); }, {"a JSON object", "array"});
}

TEST(SparseAttnConfig, ReadsAtFileAndReportsMissingFiles) {
  const std::string path = ::testing::TempDir() + "/tessel_sparse_config.json";
  {
    std::ofstream out(path);
    out << R"({"topk_ratio": 0.3, "schedule": "conservative"})";
  }
  const SparseAttnConfig c = parse_sparse_attn_config_arg("@" + path);
  EXPECT_DOUBLE_EQ(c.topk_ratio, 0.3);
  EXPECT_EQ(c.schedule, "conservative");
  std::remove(path.c_str());
  expect_error([&] { parse_sparse_attn_config_arg("@" + path); }, {"--sparse-attn-config", path, "cannot open"});
}

SparseAttnFlags parse_flags(std::vector<std::string> args) {
  CLI::App app;
  SparseAttnFlags flags;
  cli::add_sparse_attn_flags(app, flags);
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector in reverse order
  app.parse(args);
  return flags;
}

TEST(SparseAttnConfig, CliFlagsOverrideJsonWhichOverridesDefaults) {
  ScopedEnv no_config("TESSEL_SPARSE_ATTN_CONFIG", std::nullopt);
  ScopedEnv no_backend("TESSEL_SPARSE_ATTN_BACKEND", std::nullopt);
  EXPECT_FALSE(parse_flags({}).any());

  const SparseAttnFlags flags = parse_flags({"--sparse-attn-backend", "block_sparse", "--sparse-attn-topk", "0.2",
                                             "--sparse-attn-schedule", "aggressive", "--sparse-attn-pattern",
                                             "sliding_window", "--sparse-attn-config",
                                             R"({"topk_ratio": 0.9, "window_size": 64, "backend": "dense"})"});
  EXPECT_TRUE(flags.any());
  const SparseAttnConfig c = flags.to_config();
  EXPECT_EQ(c.backend, "block_sparse");  // flag beats JSON
  EXPECT_DOUBLE_EQ(c.topk_ratio, 0.2);   // flag beats JSON
  EXPECT_EQ(c.schedule, "aggressive");
  EXPECT_EQ(c.pattern_type, "sliding_window");
  EXPECT_EQ(c.window_size, 64);          // JSON beats default
}

TEST(SparseAttnConfig, EnvConfigIsTheFallbackForTheJsonFlag) {
  ScopedEnv env("TESSEL_SPARSE_ATTN_CONFIG", R"({"topk_ratio": 0.7, "dense_layers": 3})");
  const SparseAttnFlags none = parse_flags({});
  EXPECT_TRUE(none.any());
  EXPECT_DOUBLE_EQ(none.to_config().topk_ratio, 0.7);
  EXPECT_EQ(none.to_config().dense_layers, 3);
  // The flag wins over the environment.
  const SparseAttnFlags given = parse_flags({"--sparse-attn-config", R"({"topk_ratio": 0.4})"});
  EXPECT_DOUBLE_EQ(given.to_config().topk_ratio, 0.4);
  EXPECT_EQ(given.to_config().dense_layers, 0);
}

TEST(SparseAttnConfig, BadFlagValuesNameTheFlag) {
  ScopedEnv no_config("TESSEL_SPARSE_ATTN_CONFIG", std::nullopt);
  expect_error([] { parse_flags({"--sparse-attn-topk", "0"}).to_config(); }, {"--sparse-attn-topk", "(0, 1]"});
  expect_error([] { parse_flags({"--sparse-attn-topk", "2"}).to_config(); }, {"--sparse-attn-topk", "2"});
  expect_error([] { parse_flags({"--sparse-attn-schedule", "linear"}).to_config(); }, {"sparse_attn.schedule", "'linear'"});
  expect_error([] { parse_flags({"--sparse-attn-pattern", "stripes"}).to_config(); }, {"pattern_type", "'stripes'"});
  expect_error([] { parse_flags({"--sparse-attn-backend", ""}).to_config(); }, {"--sparse-attn-backend"});
  EXPECT_THROW(parse_flags({"--sparse-attn-topk", "abc"}), CLI::ParseError);
}

TEST(PatternSpec, NamesRoundTrip) {
  for (PatternType type : all_pattern_types()) EXPECT_EQ(parse_pattern_type(pattern_type_name(type)), type);
  EXPECT_EQ(all_pattern_types().size(), static_cast<size_t>(kNumPatternTypes));
  for (SpatialOrdering o : {SpatialOrdering::kRaster, SpatialOrdering::kHilbert, SpatialOrdering::kZCurve})
    EXPECT_EQ(parse_spatial_ordering(spatial_ordering_name(o)), o);
  expect_error([] { parse_pattern_type("blocky"); }, {"pattern_type", "block_sparse", "'blocky'"});
}

TEST(PatternSpec, LayoutGeometry) {
  const SpatialLayout layout{5, 16, 32, 2, SpatialOrdering::kRaster};
  EXPECT_EQ(layout.grid_height(), 8);
  EXPECT_EQ(layout.grid_width(), 16);
  EXPECT_EQ(layout.tokens_per_frame(), 128);
  EXPECT_EQ(layout.num_tokens(), 640);
}

TEST(PatternSpec, RequiredFieldsPerTypeAndRanges) {
  const auto spec_of = [](PatternType type) {
    PatternSpec s;
    s.type = type;
    return s;
  };
  expect_error([&] { spec_of(PatternType::kBlockSparse).validate(); }, {"pattern.block_mask", "block_sparse"});
  expect_error([&] { spec_of(PatternType::kSlidingWindow).validate(); }, {"pattern.window_size", "sliding_window"});
  expect_error([&] { spec_of(PatternType::kSpatialAware).validate(); }, {"pattern.spatial_layout"});
  expect_error([&] { spec_of(PatternType::kDynamicTopk).validate(); }, {"pattern.topk_ratio"});
  expect_error([&] { spec_of(PatternType::kThreshold).validate(); }, {"pattern.threshold"});
  expect_error([&] { spec_of(PatternType::kRadial).validate(); }, {"pattern.spatial_layout", "radial"});
  expect_error([&] { spec_of(PatternType::kArrow).validate(); }, {"pattern.num_text_tokens", "arrow"});
  expect_error([&] { spec_of(PatternType::kComposite).validate(); }, {"pattern.children"});
  EXPECT_NO_THROW(spec_of(PatternType::kDense).validate());

  PatternSpec s = spec_of(PatternType::kDynamicTopk);
  s.topk_ratio = 0.0;
  expect_error([&] { s.validate(); }, {"pattern.topk_ratio", "(0, 1]"});
  s.topk_ratio = 0.5;
  s.block_q = 0;
  expect_error([&] { s.validate(); }, {"pattern.block_q", ">= 1"});
  s.block_q = 128;
  s.stride = 0;
  expect_error([&] { s.validate(); }, {"pattern.stride", "[1, 64]"});
  s.stride.reset();
  s.total_steps = 10;
  s.current_step = 10;
  expect_error([&] { s.validate(); }, {"pattern.current_step", "< total_steps (10)"});
  s.current_step = 9;
  EXPECT_NO_THROW(s.validate());
  s.keep_text = true;
  expect_error([&] { s.validate(); }, {"pattern.keep_text", "num_text_tokens"});
  s.keep_text = false;
  s.decay_factor = -1;
  expect_error([&] { s.validate(); }, {"pattern.decay_factor", "(0, 16]"});
}

TEST(PatternSpec, ExplicitMaskBlockSizesAndSubBlockMaskAreChecked) {
  PatternSpec s;
  s.type = PatternType::kBlockSparse;
  BlockMaskShape shape;
  shape.seq_q = 256;
  shape.seq_kv = 256;
  shape.block_q = 64;
  shape.block_kv = 64;
  s.block_mask = std::make_shared<const BlockMask>(BlockMask::full(shape));
  expect_error([&] { s.validate(); }, {"pattern.block_mask", "128x64", "64x64"});
  s.block_q = 64;
  EXPECT_NO_THROW(s.validate());
  s.sub_block_mask.assign(3, 1);
  expect_error([&] { s.validate(); }, {"pattern.sub_block_mask", std::to_string(16 * 64 * 64) + " entries"});
}

TEST(PatternSpec, NestedPatternsAreValidated) {
  PatternSpec arrow;
  arrow.type = PatternType::kArrow;
  arrow.num_text_tokens = 10;
  arrow.num_image_tokens = 100;
  PatternSpec inner;
  inner.type = PatternType::kDynamicTopk;  // topk_ratio missing
  arrow.i2i_pattern = std::make_shared<const PatternSpec>(inner);
  expect_error([&] { arrow.validate(); }, {"pattern.topk_ratio"});

  PatternSpec composite;
  composite.type = PatternType::kComposite;
  PatternSpec child;
  child.block_q = 64;
  composite.children.push_back(child);
  expect_error([&] { composite.validate(); }, {"pattern.children[0]", "128x64", "64x64"});
}

}  // namespace
}  // namespace tessel
