// The Wan generation door (tessel::WanGenerator) for Python's tessel.WanPipeline: a generator loaded
// once from a diffusers model directory, together with the backend registry its sparse settings
// use, and requests run whole with the GIL released. Arrays come in as CPU float32 (the Python layer
// converts torch tensors and lists) and go out as numpy arrays that own the library's buffers.
// Ctrl-C between denoising steps cancels the generation and raises KeyboardInterrupt.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "host_arrays.h"
#include "tensor_arg.h"
#include "tessel/core/device.h"
#include "tessel/core/error.h"
#include "tessel/core/exec_context.h"
#include "tessel/diffusion/tiny_model.h"
#include "tessel/diffusion/wan_generator.h"
#include "tessel/plugin/plugin_loader.h"
#include "tessel/sparse/config.h"
#include "tessel/sparse/registry.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

// A loaded generator and what it borrows. Members are destroyed in reverse order: the generator
// (whose sparse backends come from the registry) before the registry.
struct LoadedWanGenerator {
  std::unique_ptr<BackendRegistry> registry;  // only when a sparse setting is configured
  std::optional<WanGenerator> generator;
  int num_threads = 0;  // ExecContext::num_threads: 0 = every core
  // One generation at a time: calls from several Python threads queue here (the GIL is released).
  std::mutex busy;
};

struct LoadArguments {
  std::string directory;
  std::string device = "cpu";
  std::optional<std::string> sparse_json, sparse_json_2;
  std::string scheduler;
  double flow_shift = 0.0;
  std::string cache = "none";
  int num_threads = 0;
  std::string backend_override;
  std::vector<std::string> plugin_dirs;
  std::optional<std::tuple<int64_t, int64_t, int64_t>> layout_size;  // (frames, height, width)
  bool load_text_encoder = true;
  bool load_vae = true;
  std::vector<std::pair<std::string, double>> loras, loras_2;  // (path, scale)
  bool lora_ignore_unmatched = false;
  std::vector<std::tuple<std::string, std::string, double>> lora_adapters;  // (name, path, scale)
};

Device checked_device(const std::string& name) {
  const Device device = parse_device(name);
  if (device.is_cuda() && !cuda_compiled())
    fail_argument("device", "cpu (this tessel build has no CUDA kernels: build it with TESSEL_CUDA=ON)", device.str());
  if (device.is_cuda() && !cuda_available()) fail_argument("device", "a device present (no CUDA GPU found)", device.str());
  return device;
}

SparseAttnConfig parse_config(const std::string& json, const SparseAttnConfig& base, const char* argument) {
  try {
    return parse_sparse_attn_json(json, base);
  } catch (const Error& e) {
    throw Error(std::string(argument) + ": " + e.what());
  }
}

// Everything is read into C++ values first: this runs with the GIL released.
std::unique_ptr<LoadedWanGenerator> load_generator(const LoadArguments& a) {
  auto loaded = std::make_unique<LoadedWanGenerator>();
  if (a.num_threads < 0) fail_argument("num_threads", ">= 0 (0: every core)", a.num_threads);
  loaded->num_threads = a.num_threads;
  WanLoadOptions options;
  options.device = checked_device(a.device);
  // The second expert's config is JSON over the first's (as `tessel generate --sparse-attn-config-2`).
  if (a.sparse_json) options.sparse.config = parse_config(*a.sparse_json, SparseAttnConfig{}, "sparse_attention");
  if (a.sparse_json_2)
    options.sparse.config_2 =
        parse_config(*a.sparse_json_2, options.sparse.config.value_or(SparseAttnConfig{}), "sparse_attention_2");
  if (options.sparse.config || options.sparse.config_2) {
    loaded->registry = make_default_registry();
    loaded->registry->set_plugin_dirs(a.plugin_dirs);
    options.registry = loaded->registry.get();
  }
  options.backend_override = a.backend_override;
  if (a.layout_size) {
    const auto [frames, height, width] = *a.layout_size;
    options.layout_size = WanVideoSize{frames, height, width, 8};
  }
  options.scheduler = a.scheduler;
  options.flow_shift = a.flow_shift;
  options.cache = a.cache;
  options.load_text_encoder = a.load_text_encoder;
  options.load_vae = a.load_vae;
  for (const auto& [path, scale] : a.loras) options.loras.push_back({path, scale});
  for (const auto& [path, scale] : a.loras_2) options.loras_2.push_back({path, scale});
  options.lora_ignore_unmatched = a.lora_ignore_unmatched;
  for (const auto& [name, path, scale] : a.lora_adapters) options.lora_adapters.push_back({name, {path, scale}});
  ExecContext ctx;
  ctx.num_threads = loaded->num_threads;
  WanModelDir model = WanModelDir::open(a.directory);
  if (options.layout_size) {
    options.layout_size->vae_spatial_stride = model.vae_spatial_stride;
    try {
      options.layout_size->validate();
    } catch (const Error& e) {
      throw Error(std::string("sparse_layout_size: ") + e.what());
    }
  }
  loaded->generator.emplace(WanGenerator::load(ctx, std::move(model), options));
  return loaded;
}

// A CPU float32 tensor copied from `array` (None: undefined).
Tensor host_f32(const std::optional<ReadOnlyArray>& array, const std::string& argument) {
  if (!array) return {};
  const TensorView view = tensor_view(*array, argument);
  check_device(view, Device::cpu(), argument);
  check_dtype(view, DType::kF32, argument);
  Tensor tensor = Tensor::empty(view.shape(), DType::kF32);
  copy_convert(view, tensor.view());
  return tensor;
}

// A numpy array over `tensor`'s buffer, which it keeps alive.
nb::object numpy_of(Tensor tensor) {
  if (!tensor.view().is_contiguous()) tensor = tensor.clone();
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> extents(owned->shape().begin(), owned->shape().end());
  return nb::cast(nb::ndarray<nb::numpy, float>(owned->data_as<float>(), extents.size(), extents.data(), owner));
}

// The request fields whose Python keywords (diffusers' names) differ from WanRequest's: the
// library's message, with the argument it names spelled as the caller spelled it.
[[noreturn]] void rethrow_in_python_names(const Error& e) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"frames: ", "num_frames: "},
      {"steps: ", "num_inference_steps: "},
      {"guidance: ", "guidance_scale: "},
      {"guidance_2: ", "guidance_scale_2: "},
  };
  const std::string_view message = e.what();
  for (const auto& [library, python] : kNames)
    if (message.starts_with(library)) throw Error(std::string(python) + std::string(message.substr(library.size())));
  throw e;
}

// An RGB image as C-contiguous uint8 (H, W, 3) (the Python side converts PIL images and checks
// the dtype): one frame, or no frame for None.
using ImageArray = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
VideoFrames frames_of(const std::optional<ImageArray>& image, const char* argument) {
  if (!image) return {};
  if (image->shape(2) != 3)
    fail_argument(argument, "an RGB image, uint8 (height, width, 3)", detail::concat("an array of ", image->shape(2), " channels"));
  VideoFrames frames;
  frames.count = 1;
  frames.height = static_cast<int64_t>(image->shape(0));
  frames.width = static_cast<int64_t>(image->shape(1));
  frames.rgb.assign(image->data(), image->data() + image->size());
  return frames;
}

nb::dict generate(LoadedWanGenerator& loaded, std::optional<std::string> prompt, std::optional<std::string> negative_prompt,
                  const std::optional<ReadOnlyArray>& prompt_embeds, const std::optional<ReadOnlyArray>& negative_prompt_embeds,
                  int64_t num_frames, int64_t height, int64_t width, int64_t num_inference_steps, double guidance_scale,
                  std::optional<double> guidance_scale_2, uint64_t seed, const std::optional<ReadOnlyArray>& noise,
                  bool decode, const std::optional<ImageArray>& image, const std::optional<ImageArray>& last_image,
                  const std::string& lora) {
  WanRequest request;
  request.lora = lora;
  request.image = frames_of(image, "image");
  request.last_image = frames_of(last_image, "last_image");
  request.decode = decode;
  request.prompt = prompt.value_or("");
  request.negative_prompt = negative_prompt.value_or("");
  request.prompt_embeds = host_f32(prompt_embeds, "prompt_embeds");
  request.negative_prompt_embeds = host_f32(negative_prompt_embeds, "negative_prompt_embeds");
  request.noise = host_f32(noise, "noise");
  request.frames = num_frames;
  request.height = height;
  request.width = width;
  request.steps = num_inference_steps;
  request.guidance = guidance_scale;
  request.guidance_2 = guidance_scale_2;
  request.seed = seed;
  std::atomic<bool> cancel{false};
  bool interrupted = false;
  request.cancel = &cancel;
  // Between steps: Python's signal handlers run (Ctrl-C raises KeyboardInterrupt there, which is
  // kept as this thread's error indicator and raised once the generation has stopped).
  request.on_step = [&](const WanStepProgress&) {
    if (interrupted) return;
    nb::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) {
      interrupted = true;
      cancel = true;
    }
  };
  ExecContext ctx;
  ctx.num_threads = loaded.num_threads;
  WanGeneratorResult result;
  {
    nb::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(loaded.busy);
    try {
      result = loaded.generator->generate(ctx, request);
    } catch (const Error& e) {
      rethrow_in_python_names(e);
    }
  }
  if (interrupted) throw nb::python_error();
  const WanGenerationResult& generation = result.generation;
  nb::dict out;
  out["latents"] = numpy_of(generation.latents);
  if (generation.frames.count > 0) {
    const VideoFrames& frames = generation.frames;
    const Shape shape = {frames.count, frames.height, frames.width, 3};
    out["frames"] = numpy_array<uint8_t>(std::move(result.generation.frames.rgb), shape);
    out["fps"] = frames.fps;
  } else {
    out["frames"] = nb::none();
  }
  out["steps_done"] = generation.steps_done;
  out["cancelled"] = generation.cancelled;
  out["experts"] = nb::cast(generation.experts);
  out["text_encode_seconds"] = result.text_encode_seconds;
  const auto stats = [](const CacheStats& s) -> nb::object {
    if (s.backend.empty()) return nb::none();
    nb::dict d;
    d["backend"] = s.backend;
    d["computed"] = nb::make_tuple(s.computed[0], s.computed[1]);
    d["skipped"] = nb::make_tuple(s.skipped[0], s.skipped[1]);
    d["blocks_computed"] = nb::make_tuple(s.blocks_computed[0], s.blocks_computed[1]);
    d["blocks_skipped"] = nb::make_tuple(s.blocks_skipped[0], s.blocks_skipped[1]);
    return d;
  };
  out["cache_stats"] = stats(generation.cache_stats);
  out["cache_stats_2"] = stats(generation.cache_stats_2);
  return out;
}

const WanModelDir& model_of(const LoadedWanGenerator& loaded) { return loaded.generator->model(); }

}  // namespace

void bind_pipeline(nb::module_& m) {
  nb::class_<LoadedWanGenerator>(m, "WanGenerator")
      .def_static(
          "load",
          [](const std::string& directory, const std::string& device, std::optional<std::string> sparse_json,
             std::optional<std::string> sparse_json_2, const std::string& scheduler, double flow_shift,
             const std::string& cache, int num_threads, const std::string& backend_override,
             const std::vector<std::string>& plugin_dirs,
             std::optional<std::tuple<int64_t, int64_t, int64_t>> layout_size, bool load_text_encoder, bool load_vae,
             std::vector<std::pair<std::string, double>> loras, std::vector<std::pair<std::string, double>> loras_2,
             bool lora_ignore_unmatched, std::vector<std::tuple<std::string, std::string, double>> lora_adapters) {
            LoadArguments a{directory,        device,      std::move(sparse_json), std::move(sparse_json_2),
                            scheduler,        flow_shift,  cache,                  num_threads,
                            backend_override, plugin_dirs, layout_size,            load_text_encoder,
                            load_vae,         std::move(loras), std::move(loras_2), lora_ignore_unmatched,
                            std::move(lora_adapters)};
            nb::gil_scoped_release release;
            return load_generator(a);
          },
          "directory"_a, "device"_a = "cpu", "sparse_json"_a.none() = nb::none(), "sparse_json_2"_a.none() = nb::none(),
          "scheduler"_a = "", "flow_shift"_a = 0.0, "cache"_a = "none", "num_threads"_a = 0, "backend_override"_a = "",
          "plugin_dirs"_a = std::vector<std::string>{}, "layout_size"_a.none() = nb::none(), "load_text_encoder"_a = true,
          "load_vae"_a = true, "loras"_a = std::vector<std::pair<std::string, double>>{},
          "loras_2"_a = std::vector<std::pair<std::string, double>>{}, "lora_ignore_unmatched"_a = false,
          "lora_adapters"_a = std::vector<std::tuple<std::string, std::string, double>>{})
      .def("generate", &generate, "prompt"_a.none(), "negative_prompt"_a.none(), "prompt_embeds"_a.none(),
           "negative_prompt_embeds"_a.none(), "num_frames"_a, "height"_a, "width"_a, "num_inference_steps"_a,
           "guidance_scale"_a, "guidance_scale_2"_a.none(), "seed"_a, "noise"_a.none(), "decode"_a = true, "image"_a.none() = nb::none(),
           "last_image"_a.none() = nb::none(), "lora"_a = "")
      .def_prop_ro("path", [](const LoadedWanGenerator& g) { return model_of(g).path; })
      .def_prop_ro("lora_summary", [](const LoadedWanGenerator& g) { return g.generator->lora_summary(); })
      .def_prop_ro("task", [](const LoadedWanGenerator& g) { return std::string(wan_task_name(model_of(g).task)); })
      .def_prop_ro("two_experts", [](const LoadedWanGenerator& g) { return model_of(g).two_experts; })
      .def_prop_ro("boundary_ratio",
                   [](const LoadedWanGenerator& g) -> std::optional<double> {
                     return model_of(g).two_experts ? std::optional<double>(model_of(g).boundary_ratio) : std::nullopt;
                   })
      .def_prop_ro("vae_spatial_stride", [](const LoadedWanGenerator& g) { return model_of(g).vae_spatial_stride; })
      .def_prop_ro("in_channels", [](const LoadedWanGenerator& g) { return model_of(g).transformer.in_channels; })
      .def_prop_ro("text_dim", [](const LoadedWanGenerator& g) { return model_of(g).transformer.text_dim; })
      .def_prop_ro("has_vae",
                   [](const LoadedWanGenerator& g) { return model_of(g).has_vae && g.generator->options().load_vae; })
      .def_prop_ro("has_text_encoder",
                   [](const LoadedWanGenerator& g) {
                     return model_of(g).has_text_encoder && g.generator->options().load_text_encoder;
                   })
      .def_prop_ro("device", [](const LoadedWanGenerator& g) { return g.generator->options().device.str(); })
      .def_prop_ro("num_threads", [](const LoadedWanGenerator& g) { return g.num_threads; });

  m.def(
      "write_random_wan_model",
      [](const std::string& directory, const std::string& preset, uint64_t seed, int threads) {
        nb::gil_scoped_release release;
        return write_random_wan_model(directory, preset, seed, threads);
      },
      "directory"_a, "preset"_a = "tiny", "seed"_a = 0, "threads"_a = 0,
      "Writes a diffusers Wan model directory of random weights (`tessel init-model`): presets tiny, tiny-a14b, "
      "tiny-cuda, tiny-ti2v, wan-1.3b, wan-14b, wan-ti2v-5b. Returns the bytes of weights written (0 for tiny ones).");
  m.def("random_wan_model_presets", &random_wan_model_presets);
}

}  // namespace tessel::python
