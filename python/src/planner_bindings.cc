// Static patterns (opaque StaticPattern values made by one factory per rule) and the planner that
// turns one into a BlockMask for a latent grid. Only raster-order patterns are exposed, so a plan
// is a mask alone (no token permutation to carry back to Python).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "tessel/core/error.h"
#include "tessel/sparse/planners/static_patterns.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

BlockMask plan(const StaticPattern& pattern, int64_t frames, int64_t height, int64_t width, int64_t text_tokens,
               bool text_first, int64_t block_q, int64_t block_kv, bool keep_diagonal, int64_t sink_blocks,
               bool keep_text) {
  StaticPlanRequest request;
  request.layout = TokenLayout{TokenGrid{frames, height, width}, text_tokens, text_first};
  request.block_q = block_q;
  request.block_kv = block_kv;
  request.keep.diagonal = keep_diagonal;
  request.keep.sink_blocks = sink_blocks;
  request.keep.text = keep_text;
  StaticPlan result = plan_static_pattern(pattern, request);
  // Raster-order rules never permute; a permuted plan here would be a mask over other positions.
  TESSEL_CHECK(!result.permuted(), "pattern ", describe_static_pattern(pattern),
               ": expected a raster-order plan, got a token permutation");
  return std::move(result.mask);
}

}  // namespace

void bind_planners(nb::module_& m) {
  nb::class_<StaticPattern>(m, "StaticPattern")
      .def("__repr__", [](const StaticPattern& p) { return describe_static_pattern(p); });
  m.def("dense_pattern", [] { return StaticPattern{DensePattern{}}; });
  m.def("sliding_window_pattern", [](int64_t window) { return StaticPattern{SlidingWindowPattern{window}}; },
        "window"_a);
  m.def(
      "sliding_window_3d_pattern",
      [](int64_t frame_radius, int64_t height_radius, int64_t width_radius) {
        return StaticPattern{SlidingWindow3dPattern{frame_radius, height_radius, width_radius}};
      },
      "frame_radius"_a, "height_radius"_a, "width_radius"_a);
  m.def(
      "radial_pattern",
      [](double decay_factor, bool frame0_sink) { return StaticPattern{RadialPattern{decay_factor, frame0_sink}}; },
      "decay_factor"_a, "frame0_sink"_a);
  m.def("local_pattern", [](int64_t local_window_size) { return StaticPattern{LocalPattern{local_window_size}}; },
        "local_window_size"_a);
  m.def("arrow_pattern", [](const StaticPattern& inner) { return make_arrow(inner); }, "inner"_a);
  m.def(
      "plan_static_pattern",
      [](const StaticPattern& pattern, int64_t frames, int64_t height, int64_t width, int64_t text_tokens,
         bool text_first, int64_t block_q, int64_t block_kv, bool keep_diagonal, int64_t sink_blocks, bool keep_text) {
        nb::gil_scoped_release release;
        return plan(pattern, frames, height, width, text_tokens, text_first, block_q, block_kv, keep_diagonal,
                    sink_blocks, keep_text);
      },
      "pattern"_a, "frames"_a, "height"_a, "width"_a, "text_tokens"_a, "text_first"_a, "block_q"_a, "block_kv"_a,
      "keep_diagonal"_a, "sink_blocks"_a, "keep_text"_a);
}

}  // namespace tessel::python
