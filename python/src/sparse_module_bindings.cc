// The drop-in SparseAttention module of the sparse layer (config resolution, backend registry with
// plugins, step schedules, dense warm-up, shared plan cache) for Python. One registry per process,
// made on first use with every built-in backend and the plugin loader; the Python layer, as the
// application, reads the environment and passes plugin folders and the backend override in.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "tensor_arg.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"
#include "tessel/sparse/schedule.h"
#include "tessel/sparse/sparse_attention.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

// Never destroyed: modules alive at interpreter exit may still hold backends of plugin libraries
// that the registry would unload.
BackendRegistry& registry() {
  static BackendRegistry* const process_registry = make_default_registry().release();
  return *process_registry;
}

SparseAttention make_module(int64_t num_heads, int64_t head_dim, int64_t num_kv_heads, const std::string& config_json,
                            const std::string& backend_override, const std::string& dtype, const std::string& device,
                            int64_t layer_index, std::shared_ptr<PlanCache> plan_cache) {
  SparseAttentionOptions options;
  options.num_heads = num_heads;
  options.head_dim = head_dim;
  options.num_kv_heads = num_kv_heads;
  options.config = parse_sparse_attn_json(config_json);
  options.backend_override = backend_override;
  options.dtype = parse_dtype(dtype);
  options.device = parse_device(device);
  options.layer_index = layer_index;
  options.plan_cache = std::move(plan_cache);
  options.registry = &registry();
  return SparseAttention(std::move(options));
}

nb::dict forward(const SparseAttention& module, const ReadOnlyArray& q, const ReadOnlyArray& k,
                 const ReadOnlyArray& v, const AnyArray& out, const std::optional<AnyArray>& lse,
                 std::optional<int64_t> step, int64_t total_steps, int64_t layer, int cfg_branch, uintptr_t stream) {
  const TensorView q_view = tensor_view(q, "q"), k_view = tensor_view(k, "k"), v_view = tensor_view(v, "v");
  const TensorView out_view = tensor_view(out, "out"), lse_view = optional_tensor_view(lse, "lse");
  const StepInfo info{.step = step, .total_steps = total_steps, .layer = layer, .cfg_branch = cfg_branch, .density = {}};
  ExecContext ctx;
  ctx.device = q_view.device();
  ctx.stream = reinterpret_cast<StreamHandle>(stream);
  AttentionStepReport report;
  {
    nb::gil_scoped_release release;
    report = module.forward(ctx, info, q_view, k_view, v_view, out_view, lse_view);
  }
  nb::dict result;
  result["backend"] = report.backend;
  result["dense"] = report.dense;
  result["density"] = report.density;
  result["estimate_ms"] = report.estimate_ms;
  return result;
}

}  // namespace

void bind_sparse_module(nb::module_& m) {
  nb::class_<PlanCache>(m, "PlanCache")
      .def(nb::init<>())
      .def_prop_ro("hits", &PlanCache::hits)
      .def_prop_ro("misses", &PlanCache::misses)
      .def("__len__", &PlanCache::size)
      .def("clear", &PlanCache::clear);

  nb::class_<SparseAttention>(m, "SparseAttentionModule")
      .def("__init__",
           [](SparseAttention* self, int64_t num_heads, int64_t head_dim, int64_t num_kv_heads,
              const std::string& config_json, const std::string& backend_override, const std::string& dtype,
              const std::string& device, int64_t layer_index, std::shared_ptr<PlanCache> plan_cache) {
             new (self) SparseAttention(make_module(num_heads, head_dim, num_kv_heads, config_json, backend_override,
                                                    dtype, device, layer_index, std::move(plan_cache)));
           },
           "num_heads"_a, "head_dim"_a, "num_kv_heads"_a, "config_json"_a, "backend_override"_a, "dtype"_a,
           "device"_a, "layer_index"_a, "plan_cache"_a.none())
      .def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "step"_a.none(), "total_steps"_a,
           "layer"_a, "cfg_branch"_a, "stream"_a)
      .def_prop_ro("backend",
                   [](const SparseAttention& module) {
                     const auto& backend = module.resolution().backend;
                     return backend ? backend->name() : std::string("none");
                   })
      .def_prop_ro("resolution_source",
                   [](const SparseAttention& module) {
                     return std::string(resolution_source_name(module.resolution().source));
                   })
      .def_prop_ro("config_json", [](const SparseAttention& module) { return module.adapter().config().json(); });

  // The config schema's codec for tessel.SparseAttentionConfig: the C++ parser, validation and
  // writer are the one definition of the fields, their defaults and their ranges.
  m.def(
      "canonical_sparse_config",
      [](const std::string& json_text) {
        const SparseAttnConfig config = parse_sparse_attn_json(json_text);
        config.validate();
        return config.to_json();
      },
      "json_text"_a,
      "parse_sparse_attn_json (nested or flat keys) then validate, written back as the nested JSON "
      "with every field; raises TesselError naming the key path of a bad field");
  m.def("default_sparse_config", [] { return SparseAttnConfig{}.to_json(); },
        "SparseAttnConfig{}'s nested JSON: every field at its default");
  m.def("sparsity_schedule_names", &sparsity_schedule_names, "the registered sparsity schedules");

  m.def("set_plugin_dirs", [](const std::vector<std::string>& dirs) { registry().set_plugin_dirs(dirs); }, "dirs"_a);
  m.def("backend_names", [] {
    std::vector<std::string> names;
    for (const auto& backend : registry().list()) names.push_back(backend->name());
    return names;
  });
}

}  // namespace tessel::python
