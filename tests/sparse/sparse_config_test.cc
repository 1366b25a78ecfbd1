// SparseAttnConfig: defaults, the JSON codec (flat and nested keys, round trip), every parse and
// validation error with its key path, the resolved form's PatternSpec; PatternSpec / SpatialLayout
// validation. The CLI flags and environment are tested in tests/tools/.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "sparse/pattern_test_util.h"
#include "tessel/core/error.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/pattern.h"

namespace tessel {
namespace {

using testing::expect_error_containing;

TEST(SparseAttnConfig, DefaultsFollowTheRfcTeleFuserAndXAttention) {
  const SparseAttnConfig c;
  EXPECT_EQ(c.backend, "auto");
  EXPECT_EQ(c.pattern.type, PatternType::kDynamicTopk);
  EXPECT_DOUBLE_EQ(c.selection.topk_ratio, 0.5);
  EXPECT_EQ(c.geometry.block_q, 128);
  EXPECT_EQ(c.geometry.block_kv, 64);
  EXPECT_TRUE(c.geometry.text_first);
  EXPECT_FALSE(c.pattern.window_size.has_value());
  EXPECT_FALSE(c.pattern.spatial_radius.has_value());
  EXPECT_EQ(c.schedule, "constant");
  EXPECT_EQ(c.warmup.dense_steps, 0);
  EXPECT_EQ(c.warmup.dense_layers, 0);
  EXPECT_DOUBLE_EQ(c.pattern.decay_factor, 1.0);
  EXPECT_EQ(c.pattern.local_window_size, 6);
  EXPECT_DOUBLE_EQ(c.selection.threshold, 0.95);
  EXPECT_EQ(c.selection.stride, 8);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(parse_sparse_attn_json("{}"), c);
}

// Every field, in the older flat form; the nested form of the same values must parse equal.
constexpr const char* kEveryFieldFlat = R"({
    "backend": "block_sparse", "pattern_type": "sliding_window", "topk_ratio": 0.25,
    "block_size_q": 64, "block_size_kv": 32, "window_size": 256, "spatial_radius": 3,
    "schedule": "aggressive", "dense_timesteps": 4, "dense_layers": 2, "decay_factor": 0.5,
    "local_window_size": 3, "threshold": 0.9, "stride": 16,
    "spatial_layout": {"frames": 5, "height": 16, "width": 32, "patch_size": 2, "ordering": "hilbert"},
    "num_text_tokens": 77, "text_first": false, "keep_diagonal": true, "sink_blocks": 2, "keep_text": true,
    "i2i_pattern_type": "radial", "children": ["sliding_window", "radial"], "composite_op": "intersection",
    "options": {"cdf": 0.9, "mode": "fast", "flag": true}})";

constexpr const char* kEveryFieldNested = R"({
    "backend": "block_sparse",
    "geometry": {"block_q": 64, "block_kv": 32, "num_text_tokens": 77, "text_first": false,
                 "spatial_layout": {"frames": 5, "height": 16, "width": 32, "patch_size": 2, "ordering": "hilbert"}},
    "pattern": {"type": "sliding_window", "window_size": 256, "spatial_radius": 3, "decay_factor": 0.5,
                "local_window_size": 3, "i2i_pattern": "radial", "children": ["sliding_window", "radial"],
                "composite_op": "intersection"},
    "selection": {"topk_ratio": 0.25, "threshold": 0.9, "stride": 16, "sink_blocks": 2, "keep_diagonal": true,
                  "keep_text": true},
    "schedule": "aggressive",
    "warmup": {"dense_steps": 4, "dense_layers": 2},
    "options": {"cdf": "0.9", "mode": "fast", "flag": "true"}})";

// The values of kEveryFieldFlat / kEveryFieldNested.
SparseAttnConfig every_field_expected() {
  SparseAttnConfig c;
  c.backend = "block_sparse";
  c.geometry = SparseAttnGeometry{.block_q = 64,
                                  .block_kv = 32,
                                  .spatial_layout = SpatialLayout{5, 16, 32, 2, SpatialOrdering::kHilbert},
                                  .num_text_tokens = 77,
                                  .text_first = false};
  c.pattern = SparseAttnPattern{.type = PatternType::kSlidingWindow,
                                .window_size = 256,
                                .spatial_radius = 3,
                                .decay_factor = 0.5,
                                .local_window_size = 3,
                                .i2i_pattern = PatternType::kRadial,
                                .children = {PatternType::kSlidingWindow, PatternType::kRadial},
                                .composite_op = CompositeOp::kIntersection};
  c.selection = SparseAttnSelection{
      .topk_ratio = 0.25, .threshold = 0.9, .stride = 16, .sink_blocks = 2, .keep_diagonal = true, .keep_text = true};
  c.schedule = "aggressive";
  c.warmup = SparseAttnWarmup{.dense_steps = 4, .dense_layers = 2};
  c.options = {{"cdf", "0.9"}, {"mode", "fast"}, {"flag", "true"}};  // scalars kept as their text
  return c;
}

TEST(SparseAttnConfig, ParsesEveryFieldFlatAndNested) {
  const SparseAttnConfig c = parse_sparse_attn_json(kEveryFieldFlat);
  EXPECT_EQ(c, every_field_expected()) << c.to_json();
  EXPECT_EQ(parse_sparse_attn_json(kEveryFieldNested), c);
  // The two forms may be mixed.
  const SparseAttnConfig mixed =
      parse_sparse_attn_json(R"({"topk_ratio": 0.25, "warmup": {"dense_steps": 4}, "pattern_type": "radial"})");
  EXPECT_DOUBLE_EQ(mixed.selection.topk_ratio, 0.25);
  EXPECT_EQ(mixed.warmup.dense_steps, 4);
  EXPECT_EQ(mixed.pattern.type, PatternType::kRadial);
}

TEST(SparseAttnConfig, JsonRoundTripsThroughTheNestedForm) {
  const SparseAttnConfig c = parse_sparse_attn_json(kEveryFieldFlat);
  const std::string text = c.to_json();
  EXPECT_EQ(parse_sparse_attn_json(text), c);
  EXPECT_EQ(parse_sparse_attn_json(text).to_json(), text);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["selection"]["topk_ratio"], 0.25);
  EXPECT_EQ(j["warmup"]["dense_steps"], 4);
  EXPECT_EQ(j["pattern"]["children"], nlohmann::json::array({"sliding_window", "radial"}));
  EXPECT_FALSE(j.contains("topk_ratio"));  // the flat keys are read, never written
  // Absent optionals are written as null and read back as absent.
  const SparseAttnConfig defaults;
  EXPECT_TRUE(nlohmann::json::parse(defaults.to_json())["pattern"]["window_size"].is_null());
  EXPECT_EQ(parse_sparse_attn_json(defaults.to_json()), defaults);
  // Parsing starts from `base`: keys not given keep its values.
  const SparseAttnConfig layered = parse_sparse_attn_json(R"({"selection": {"stride": 4}})", c);
  EXPECT_EQ(layered.selection.stride, 4);
  EXPECT_EQ(layered.pattern.window_size, 256);
}

TEST(ResolvedSparseAttnConfig, DerivesThePatternOnce) {
  const ResolvedSparseAttnConfig resolved(parse_sparse_attn_json(kEveryFieldNested));
  EXPECT_EQ(resolved.json(), resolved.config().to_json());
  const PatternSpec& spec = resolved.pattern();
  EXPECT_EQ(spec.type, PatternType::kSlidingWindow);
  EXPECT_EQ(spec.block_q, 64);
  EXPECT_EQ(spec.block_kv, 32);
  EXPECT_EQ(spec.window_size, 256);
  EXPECT_EQ(spec.local_window_frames, 3);
  EXPECT_EQ(spec.topk_ratio, 0.25);
  EXPECT_EQ(spec.threshold, 0.9);
  EXPECT_EQ(spec.stride, 16);
  EXPECT_EQ(spec.num_text_tokens, 77);
  EXPECT_EQ(spec.num_image_tokens, 5 * 8 * 16);
  EXPECT_FALSE(spec.text_first);
  EXPECT_TRUE(spec.keep_diagonal);
  EXPECT_EQ(spec.sink_blocks, 2);
  EXPECT_TRUE(spec.keep_text);
  ASSERT_TRUE(spec.i2i_pattern);
  EXPECT_EQ(spec.i2i_pattern->type, PatternType::kRadial);
  EXPECT_EQ(spec.i2i_pattern->block_q, 64);
  ASSERT_EQ(spec.children.size(), 2u);
  EXPECT_EQ(spec.children[1].type, PatternType::kRadial);
  EXPECT_TRUE(spec.children[1].children.empty());
  EXPECT_EQ(spec.composite_op, CompositeOp::kIntersection);
  EXPECT_EQ(spec.option("mode"), "fast");
  EXPECT_EQ(spec.option("absent", "x"), "x");
  // Validation happens at construction.
  SparseAttnConfig bad;
  bad.selection.topk_ratio = 2.0;
  expect_error_containing([&] { (void)ResolvedSparseAttnConfig(bad); }, {"sparse_attn.selection.topk_ratio", "(0, 1]", "got 2"});
}

ResolvedSparseAttnConfig resolve_json(const std::string& text) {
  return ResolvedSparseAttnConfig(parse_sparse_attn_json(text));
}

TEST(SparseAttnConfig, EachOutOfRangeFieldIsNamedWithItsPathAndRange) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"topk_ratio": 0})", {"sparse_attn.selection.topk_ratio", "(0, 1]", "got 0"}},
      {R"({"selection": {"topk_ratio": 1.5}})", {"sparse_attn.selection.topk_ratio", "(0, 1]", "1.5"}},
      {R"({"block_size_q": 0})", {"sparse_attn.geometry.block_q", "[1, 4096]"}},
      {R"({"geometry": {"block_kv": 5000}})", {"sparse_attn.geometry.block_kv", "[1, 4096]", "5000"}},
      {R"({"window_size": -1})", {"sparse_attn.pattern.window_size", ">= 0"}},
      {R"({"pattern": {"spatial_radius": -2}})", {"sparse_attn.pattern.spatial_radius", ">= 0"}},
      {R"({"schedule": "wavy"})", {"sparse_attn.schedule", "constant", "conservative", "aggressive", "'wavy'"}},
      {R"({"dense_timesteps": -1})", {"sparse_attn.warmup.dense_steps", ">= 0"}},
      {R"({"warmup": {"dense_layers": -3}})", {"sparse_attn.warmup.dense_layers", ">= 0"}},
      {R"({"decay_factor": 0})", {"sparse_attn.pattern.decay_factor", "(0, 16]"}},
      {R"({"local_window_size": 0})", {"sparse_attn.pattern.local_window_size", ">= 1"}},
      {R"({"threshold": 1.01})", {"sparse_attn.selection.threshold", "(0, 1]"}},
      {R"({"stride": 65})", {"sparse_attn.selection.stride", "[1, 64]"}},
      {R"({"sink_blocks": -1})", {"sparse_attn.selection.sink_blocks", ">= 0"}},
      {R"({"num_text_tokens": -1})", {"sparse_attn.geometry.num_text_tokens", ">= 0"}},
      {R"({"keep_text": true})", {"sparse_attn.selection.keep_text", "geometry.num_text_tokens"}},
      {R"({"backend": ""})", {"sparse_attn.backend", "auto"}},
      {R"({"i2i_pattern_type": "arrow"})", {"sparse_attn.pattern.i2i_pattern", "other than arrow"}},
      {R"({"children": ["composite"]})", {"sparse_attn.pattern.children", "other than composite"}},
      {R"({"spatial_layout": {"frames": 1, "height": 15, "width": 16, "patch_size": 2}})",
       {"sparse_attn.geometry.spatial_layout.height", "multiple of patch_size 2", "15"}},
      {R"({"geometry": {"spatial_layout": {"frames": 0, "height": 16, "width": 16}}})",
       {"sparse_attn.geometry.spatial_layout.frames", ">= 1"}},
  };
  for (const auto& [json, fragments] : cases) {
    SCOPED_TRACE(json);
    EXPECT_NO_THROW(parse_sparse_attn_json(json));  // ranges are the resolver's job
    expect_error_containing([&text = json] { resolve_json(text); }, fragments);  // clang 14 cannot capture a binding
  }
}

TEST(SparseAttnConfig, WrongTypesUnknownKeysUnknownNamesAndBadJsonAreNamed) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"topk_ratio": "half"})", {"sparse_attn.topk_ratio", "a number", "string"}},
      {R"({"selection": {"topk_ratio": "half"}})", {"sparse_attn.selection.topk_ratio", "a number", "string"}},
      {R"({"block_size_q": 1.5})", {"sparse_attn.block_size_q", "an integer"}},
      {R"({"selection": {"keep_diagonal": 1}})", {"sparse_attn.selection.keep_diagonal", "true or false"}},
      {R"({"options": {"x": [1]}})", {"sparse_attn.options.x", "a string, number or boolean"}},
      {R"({"pattern": {"children": "radial"}})", {"sparse_attn.pattern.children", "an array"}},
      {R"({"pattern": {"children": ["radial", 3]}})", {"sparse_attn.pattern.children[1]", "a string"}},
      {R"({"selection": 0.5})", {"sparse_attn.selection", "an object", "topk_ratio"}},
      {R"({"topk": 0.5})", {"sparse_attn.topk", "unknown key", "topk_ratio", "selection"}},
      {R"({"selection": {"topk": 0.5}})", {"sparse_attn.selection.topk", "unknown key", "topk_ratio"}},
      {R"({"warmup": {"dense_timesteps": 3}})", {"sparse_attn.warmup.dense_timesteps", "unknown key", "dense_steps"}},
      {R"({"selection.topk_ratio": 0.5})", {"sparse_attn.selection.topk_ratio", "unknown key"}},
      {R"({"spatial_layout": {"depth": 4}})", {"sparse_attn.spatial_layout.depth", "unknown key"}},
      {R"({"pattern_type": "diagonal"})", {"sparse_attn.pattern_type", "dynamic_topk", "'diagonal'"}},
      {R"({"pattern": {"type": "diagonal"}})", {"sparse_attn.pattern.type: expected one of", "'diagonal'"}},
      {R"({"composite_op": "xor"})", {"sparse_attn.composite_op", "union, intersection", "'xor'"}},
      {R"({"spatial_layout": {"height": 4, "width": 4, "ordering": "snake"}})",
       {"sparse_attn.spatial_layout.ordering", "z_curve", "'snake'"}},
      {R"({"topk_ratio": 0.2, "selection": {"topk_ratio": 0.3}})", {"given twice", "sparse_attn.topk_ratio",
                                                                    "sparse_attn.selection.topk_ratio"}},
      {R"({"selection": {"stride": 18446744073709551615}})", {"sparse_attn.selection.stride", "an integer"}},
      {R"({"geometry": {"block_q": -9223372036854775809}})", {"sparse_attn.geometry.block_q", "an integer"}},
      {R"({"selection": {"topk_ratio": 1e400}})", {"invalid JSON", "1e400"}},
      {R"({"topk_ratio": )", {"invalid JSON"}},
      {"[1, 2]", {"a JSON object", "array"}},
  };
  for (const auto& [json, fragments] : cases) {
    SCOPED_TRACE(json);
    expect_error_containing([&text = json] { parse_sparse_attn_json(text); }, fragments);
  }
}

TEST(PatternSpec, NamesRoundTrip) {
  for (PatternType type : all_pattern_types()) EXPECT_EQ(parse_pattern_type(pattern_type_name(type)), type);
  EXPECT_EQ(all_pattern_types().size(), static_cast<size_t>(kNumPatternTypes));
  for (SpatialOrdering o : {SpatialOrdering::kRaster, SpatialOrdering::kHilbert, SpatialOrdering::kZCurve})
    EXPECT_EQ(parse_spatial_ordering(spatial_ordering_name(o)), o);
  expect_error_containing([] { parse_pattern_type("blocky"); }, {"pattern_type", "block_sparse", "'blocky'"});
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
  expect_error_containing([&] { spec_of(PatternType::kBlockSparse).validate(); }, {"pattern.block_mask", "block_sparse"});
  expect_error_containing([&] { spec_of(PatternType::kSlidingWindow).validate(); }, {"pattern.window_size", "sliding_window"});
  expect_error_containing([&] { spec_of(PatternType::kSpatialAware).validate(); }, {"pattern.spatial_layout"});
  expect_error_containing([&] { spec_of(PatternType::kDynamicTopk).validate(); }, {"pattern.topk_ratio"});
  expect_error_containing([&] { spec_of(PatternType::kThreshold).validate(); }, {"pattern.threshold"});
  expect_error_containing([&] { spec_of(PatternType::kRadial).validate(); }, {"pattern.spatial_layout", "radial"});
  expect_error_containing([&] { spec_of(PatternType::kArrow).validate(); }, {"pattern.num_text_tokens", "arrow"});
  expect_error_containing([&] { spec_of(PatternType::kComposite).validate(); }, {"pattern.children"});
  EXPECT_NO_THROW(spec_of(PatternType::kDense).validate());

  PatternSpec s = spec_of(PatternType::kDynamicTopk);
  s.topk_ratio = 0.0;
  expect_error_containing([&] { s.validate(); }, {"pattern.topk_ratio", "(0, 1]"});
  s.topk_ratio = 0.5;
  s.block_q = 0;
  expect_error_containing([&] { s.validate(); }, {"pattern.block_q", ">= 1"});
  s.block_q = 128;
  s.stride = 0;
  expect_error_containing([&] { s.validate(); }, {"pattern.stride", "[1, 64]"});
  s.stride.reset();
  s.total_steps = 10;
  s.current_step = 10;
  expect_error_containing([&] { s.validate(); }, {"pattern.current_step", "< total_steps (10)"});
  s.current_step = 9;
  EXPECT_NO_THROW(s.validate());
  s.keep_text = true;
  expect_error_containing([&] { s.validate(); }, {"pattern.keep_text", "num_text_tokens"});
  s.keep_text = false;
  s.decay_factor = -1;
  expect_error_containing([&] { s.validate(); }, {"pattern.decay_factor", "(0, 16]"});
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
  expect_error_containing([&] { s.validate(); }, {"pattern.block_mask", "128x64", "64x64"});
  s.block_q = 64;
  EXPECT_NO_THROW(s.validate());
  s.sub_block_mask.assign(3, 1);
  expect_error_containing([&] { s.validate(); }, {"pattern.sub_block_mask", std::to_string(16 * 64 * 64) + " entries"});
}

TEST(PatternSpec, NestedPatternsAreValidated) {
  PatternSpec arrow;
  arrow.type = PatternType::kArrow;
  arrow.num_text_tokens = 10;
  arrow.num_image_tokens = 100;
  PatternSpec inner;
  inner.type = PatternType::kDynamicTopk;  // topk_ratio missing
  arrow.i2i_pattern = std::make_shared<const PatternSpec>(inner);
  expect_error_containing([&] { arrow.validate(); }, {"pattern.topk_ratio"});

  PatternSpec composite;
  composite.type = PatternType::kComposite;
  PatternSpec child;
  child.block_q = 64;
  composite.children.push_back(child);
  expect_error_containing([&] { composite.validate(); }, {"pattern.children[0]", "128x64", "64x64"});
}

}  // namespace
}  // namespace tessel
