// The Wan generation door (see wan_generator.h): the model directory read once, the components
// loaded once, requests through WanPipeline's step-level door.
#include "tessel/diffusion/wan_generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/io/bounded_read.h"
#include "tessel/core/io/limited_json.h"
#include "tessel/diffusion/clip_image_processor.h"
#include "tessel/diffusion/clip_vision_encoder.h"
#include "tessel/diffusion/wan_image_condition.h"
#include "tessel/diffusion/wan_text_encoder.h"
#include "tessel/parallel/communicator.h"
#include "tessel/diffusion/wan_vae.h"
#include "tessel/dit/wan_model.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxModelIndexBytes = 1 << 20;

bool component_set(const nlohmann::json& index, const char* name) {
  const auto entry = index.find(name);
  // Absent, null or diffusers' [null, null] for a component the pipeline runs without.
  return entry != index.end() && !entry->is_null() && !(entry->is_array() && !entry->empty() && (*entry)[0].is_null());
}

}  // namespace

std::string_view wan_task_name(WanTask task) {
  switch (task) {
    case WanTask::kTextToVideo: return "t2v";
    case WanTask::kTextImageToVideo: return "ti2v";
    case WanTask::kImageToVideo: return "i2v";
  }
  return "?";
}

std::string WanModelDir::component(const char* name) const { return (fs::path(path) / name).string(); }

WanModelDir WanModelDir::open(const std::string& dir) {
  try {
    return open_checked(dir);
  } catch (const fs::filesystem_error& e) {
    // A symlink loop, a permission or an I/O error while the directory is walked.
    fail_argument("model directory " + quoted_excerpt(dir), "a readable diffusers model directory", e.code().message());
  }
}

WanModelDir WanModelDir::open_checked(const std::string& dir) {
  const fs::path root(dir);
  const std::string index_path = (root / "model_index.json").string();
  std::error_code status_error;
  const bool index_exists = !dir.empty() && fs::is_regular_file(index_path, status_error);
  if (status_error && status_error != std::errc::no_such_file_or_directory)
    fail_argument("model directory " + quoted_excerpt(dir), "a readable diffusers model directory", status_error.message());
  if (!index_exists) fail_argument("model directory", "a diffusers model directory with model_index.json", quoted_excerpt(dir));
  const nlohmann::json index =
      parse_json_limited(read_file_bounded(index_path, kMaxModelIndexBytes, "model_index.json"), JsonLimits{}, index_path);
  if (!index.is_object()) fail_argument(index_path, "a JSON object", json_excerpt(index));
  WanModelDir model;
  model.path = dir;
  const auto class_name = index.find("_class_name");
  if (class_name != index.end() && *class_name == "WanPipeline") {
    model.task = WanTask::kTextToVideo;
  } else if (class_name != index.end() && *class_name == "WanImageToVideoPipeline") {
    model.task = WanTask::kImageToVideo;
  } else {
    fail_argument(index_path + ": _class_name", "\"WanPipeline\" or \"WanImageToVideoPipeline\"",
                  class_name == index.end() ? std::string("none") : json_excerpt(*class_name));
  }
  // Wan 2.2 TI2V-5B sets expand_timesteps: diffusers then hands the transformer one timestep per
  // token, (mask[0][0][:, ::2, ::2] * t).flatten(). For text to video the mask is all ones, so every
  // token gets t and the per-token time embeddings and modulation equal the scalar ones: the loop
  // runs unchanged (tests/diffusion/wan_ti2v_pipeline_test.cc checks it against diffusers).
  const auto expand = index.find("expand_timesteps");
  if (expand != index.end() && !expand->is_null() && !expand->is_boolean())
    fail_argument(index_path + ": expand_timesteps", "true or false", json_excerpt(*expand));
  if (expand != index.end() && expand->is_boolean() && expand->get<bool>() && model.task == WanTask::kTextToVideo)
    model.task = WanTask::kTextImageToVideo;
  model.two_experts = component_set(index, "transformer_2");
  const auto boundary = index.find("boundary_ratio");
  const bool boundary_set = boundary != index.end() && !boundary->is_null();
  if (model.two_experts != boundary_set)
    fail_argument(index_path + ": transformer_2 and boundary_ratio", "both set (Wan 2.2's two experts) or neither",
                  model.two_experts ? "transformer_2 without boundary_ratio" : "boundary_ratio without transformer_2");
  if (boundary_set) {
    if (!boundary->is_number() || !(boundary->get<double>() > 0.0 && boundary->get<double>() < 1.0))
      fail_argument(index_path + ": boundary_ratio", "a number in (0, 1)", json_excerpt(*boundary));
    model.boundary_ratio = boundary->get<double>();
  }
  std::vector<const char*> components = {"transformer", "scheduler"};
  if (model.two_experts) components.push_back("transformer_2");
  for (const char* component : components)
    if (!fs::is_directory(root / component))
      fail_argument("model directory", detail::concat("a directory with ", component, "/"), quoted_excerpt(dir));
  model.transformer = load_wan_config(model.component("transformer"));
  if (model.two_experts) {
    model.transformer_2 = load_wan_config(model.component("transformer_2"));
    const std::pair<const char*, std::pair<int64_t, int64_t>> shared[] = {
        {"in_channels", {model.transformer.in_channels, model.transformer_2->in_channels}},
        {"out_channels", {model.transformer.out_channels, model.transformer_2->out_channels}},
        {"text_dim", {model.transformer.text_dim, model.transformer_2->text_dim}}};
    for (const auto& [name, values] : shared)
      if (values.first != values.second)
        fail_argument(model.component("transformer_2") + "/config.json: " + name,
                      detail::concat("transformer's ", values.first), values.second);
  }
  model.scheduler = load_scheduler_config(model.component("scheduler"));
  model.has_vae = fs::is_directory(root / "vae");
  model.vae_spatial_stride = wan_model_vae_spatial_stride(dir);
  model.has_text_encoder = fs::is_directory(root / "tokenizer") && fs::is_directory(root / "text_encoder");
  model.has_image_encoder = fs::is_directory(root / "image_encoder");
  // Image-to-video transformers take the noisy latents, the 4-channel frame mask and the encoded
  // conditioning video (as many channels as the latents); text-to-video ones the latents alone.
  const WanConfig& t = model.transformer;
  const std::string transformer_config = model.component("transformer") + "/config.json";
  if (model.task == WanTask::kImageToVideo) {
    if (t.in_channels != 2 * t.out_channels + 4)
      fail_argument(transformer_config + ": in_channels",
                    detail::concat("2 x out_channels + 4 = ", 2 * t.out_channels + 4, " for image to video (latents, mask, image)"),
                    t.in_channels);
    if (t.has_image_branch() && !model.has_image_encoder)
      fail_argument("model directory", "an image_encoder/ directory (the transformer's image branch takes CLIP features)",
                    quoted_excerpt(dir));
    if (!model.has_vae)
      fail_argument("model directory", "a vae/ directory (image to video encodes the image with it)", quoted_excerpt(dir));
  } else if (t.in_channels != t.out_channels || t.has_image_branch()) {
    fail_argument(transformer_config, "a text-to-video transformer for " + index_path + "'s WanPipeline (in_channels = out_channels, no image_dim)",
                  detail::concat("in_channels ", t.in_channels, ", out_channels ", t.out_channels, ", image_dim ", t.image_dim));
  }
  return model;
}

struct WanGenerator::Impl {
  WanModelDir model;
  WanLoadOptions options;
  SchedulerConfig scheduler;
  std::optional<WanTextEncoder> text_encoder;
  std::optional<WanVae> vae;
  std::optional<ClipVisionEncoder> image_encoder;  // Wan 2.1 I2V's, with an image branch
  ClipImageProcessing image_processing;            // its image_processor/ settings
  WanLora lora, lora_2;  // merged into each expert's weights as it loads
  // Per-request adapters beside every setting's `transformer` (one bank: the settings share its
  // config and device). Held by pointer so that the states' pointers survive a move of the generator.
  std::unique_ptr<WanLoraBank> lora_bank;
  struct Experts {
    std::unique_ptr<WanTransformer> high, low;
    std::unique_ptr<WanPipeline> pipeline;
  };
  std::map<std::string, Experts> settings;  // by sparse setting name ("default" first)

  WanAttentionOptions attention_for(const std::optional<SparseAttnConfig>& config, const WanConfig& transformer) const {
    WanAttentionOptions attention;
    attention.parallel = options.parallel;
    attention.precision = options.attention_precision;
    if (!config) return attention;
    if (options.registry == nullptr)
      fail_argument("WanLoadOptions.registry", "a backend registry (a sparse setting is configured)", "none");
    attention.registry = options.registry;
    attention.config = *config;
    attention.backend_override = options.backend_override;
    if (options.layout_size && !attention.config.geometry.spatial_layout && transformer.patch_size[1] == transformer.patch_size[2]) {
      const Shape latent = options.layout_size->latent_shape(transformer.in_channels);
      attention.config.geometry.spatial_layout = wan_spatial_layout(transformer, latent[2], latent[3], latent[4]);
    }
    return attention;
  }

  Experts& experts_for(const std::string& requested) {
    const std::string name = requested.empty() ? "default" : requested;
    if (const auto found = settings.find(name); found != settings.end()) return found->second;
    const WanSparseSetting* setting = &options.sparse;
    if (name != "default") {
      const auto named = options.named_sparse.find(name);
      if (named == options.named_sparse.end()) {
        std::string names = "\"default\"";
        for (const auto& [known, unused] : options.named_sparse) names += ", \"" + known + "\"";
        fail_argument("sparse_setting", "one of " + names, quoted_excerpt(name));
      }
      setting = &named->second;
    }
    if (!model.two_experts && setting->config_2)
      fail_argument("sparse setting \"" + name + "\" for transformer_2", "none: the model has one expert", "a config");
    Experts experts;
    experts.high = std::make_unique<WanTransformer>(
        WanTransformer::load(model.component("transformer"), attention_for(setting->config, model.transformer), options.device,
                             &lora, options.residency, options.precision, options.transformer_file));
    const WanVae* decoder = vae && options.load_vae ? &*vae : nullptr;
    if (model.two_experts) {
      const std::optional<SparseAttnConfig>& low = setting->config_2 ? setting->config_2 : setting->config;
      experts.low = std::make_unique<WanTransformer>(
          WanTransformer::load(model.component("transformer_2"), attention_for(low, *model.transformer_2), options.device,
                               &lora_2, options.residency, options.precision, options.transformer_2_file));
      // No scheduler of the pipeline's own: every generation brings its own (begin).
      experts.pipeline = std::make_unique<WanPipeline>(
          *experts.high, WanLowNoiseExpert{experts.low.get(), model.boundary_ratio, scheduler.num_train_timesteps}, decoder);
    } else {
      experts.pipeline = std::make_unique<WanPipeline>(*experts.high, decoder);
    }
    return settings.emplace(name, std::move(experts)).first->second;
  }

  // Image to video: the request's image condition and CLIP features into `options` (checked
  // against the model); for text to video, that the request brings no image.
  void set_image_condition(const ExecContext& ctx, const WanRequest& request, const WanVideoSize& size,
                           WanGenerationOptions& options) const;

};

struct WanGenerationState::Impl {
  WanPipeline* pipeline = nullptr;
  std::function<void(std::string_view)> on_phase;
  bool decode = true;
  std::unique_ptr<CacheBackend> cache, cache_2;
  std::unique_ptr<WanDenoiseState> denoise;
  double text_encode_seconds = 0.0;
};

WanGenerationState::WanGenerationState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WanGenerationState::~WanGenerationState() = default;
bool WanGenerationState::done() const { return impl_->denoise->done(); }
int64_t WanGenerationState::steps_done() const { return impl_->denoise->steps_done(); }
int64_t WanGenerationState::total_steps() const { return impl_->denoise->total_steps(); }

WanGenerator::WanGenerator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WanGenerator::~WanGenerator() = default;
WanGenerator::WanGenerator(WanGenerator&&) noexcept = default;
WanGenerator& WanGenerator::operator=(WanGenerator&&) noexcept = default;
const WanModelDir& WanGenerator::model() const { return impl_->model; }
const WanLoadOptions& WanGenerator::options() const { return impl_->options; }
std::vector<std::string> WanGenerator::lora_summary() const {
  std::vector<std::string> lines;
  for (const std::string& line : impl_->lora.summary()) lines.push_back("transformer: " + line);
  for (const std::string& line : impl_->lora_2.summary()) lines.push_back("transformer_2: " + line);
  if (impl_->lora_bank)
    for (const std::string& line : impl_->lora_bank->summary()) lines.push_back("per-request adapter " + line);
  return lines;
}

namespace {

// The rank of a group that encodes the text: sequence rank 0 of CFG branch 0 (the world's rank 0).
bool is_text_root(const ParallelGroups* parallel) {
  return parallel == nullptr || (parallel->coordinates.sequence == 0 && parallel->coordinates.cfg == 0);
}

// Sums `values` over `group` on the group's device (the text root's values, zeros elsewhere: the
// sum is the root's, exactly).
void sum_over(const ExecContext& ctx, Communicator& group, Tensor& values) {
  if (group.size() == 1) return;
  if (group.device().is_cpu()) return group.all_reduce_sum(ctx, values);
  Tensor on_device = values.to(group.device());
  ExecContext device_ctx = ctx;
  device_ctx.device = group.device();
  group.all_reduce_sum(device_ctx, on_device);
  values = on_device.to(Device::cpu());
}

// Collective over the whole group: the text root passes its embeddings (1, L, text_dim) fp32 host
// (an undefined tensor when its encoder failed), the other ranks an undefined tensor, and every
// rank gets the root's. The shape goes first, so
// the other ranks need no tokenizer. Over the CFG group, then the sequence group: every rank
// joins both, whatever its coordinates.
Tensor receive_text_from_root(const ExecContext& ctx, const ParallelGroups& parallel, const Tensor& root_text) {
  Tensor shape = Tensor::zeros({3}, DType::kF32);
  if (root_text.defined())
    for (int i = 0; i < 3; ++i) shape.data_as<float>()[i] = static_cast<float>(root_text.size(i));
  sum_over(ctx, *parallel.cfg, shape);
  sum_over(ctx, *parallel.sequence, shape);
  const Shape text_shape{static_cast<int64_t>(shape.data_as<float>()[0]), static_cast<int64_t>(shape.data_as<float>()[1]),
                         static_cast<int64_t>(shape.data_as<float>()[2])};
  // The root failed to encode (it passed no tensor): every rank stops here, none waits for text.
  if (text_shape[0] == 0) throw Error("text encoding failed on the group's text root (world rank 0: its error says why)");
  Tensor text = root_text.defined() ? root_text.clone() : Tensor::zeros(text_shape, DType::kF32);
  sum_over(ctx, *parallel.cfg, text);
  sum_over(ctx, *parallel.sequence, text);
  return text;
}

}  // namespace

WanGenerator WanGenerator::load(const ExecContext& ctx, const std::string& dir, const WanLoadOptions& options) {
  return load(ctx, WanModelDir::open(dir), options);
}

WanGenerator WanGenerator::load(const ExecContext& ctx, WanModelDir model, const WanLoadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->model = std::move(model);
  const std::string& dir = impl->model.path;
  impl->options = options;
  const bool image_to_video = impl->model.task == WanTask::kImageToVideo;

  if (options.residency == WanWeightResidency::kOffloadBlocks && !options.device.is_cuda())
    fail_argument("block offload (WanLoadOptions::residency)", "a CUDA device", options.device.str());
  if (options.precision == WanWeightPrecision::kFp8 && !options.device.is_cuda())
    fail_argument("fp8 weights (WanLoadOptions::precision)", "a CUDA device", options.device.str());
  if (!impl->model.two_experts) {
    if (options.sparse.config_2)
      fail_argument("sparse config for transformer_2", "none: the model has one expert (no transformer_2)", "a config");
  }
  if (!impl->model.two_experts && !options.transformer_2_file.empty())
    fail_argument("transformer_2_file (--transformer-2-file)", "none: the model has one expert (no transformer_2)",
                  quoted_excerpt(options.transformer_2_file, 200));
  if (!impl->model.two_experts && !options.loras_2.empty())
    fail_argument("loras_2 (--lora-2)", "none: the model has one expert (no transformer_2)", options.loras_2[0].path);
  // Read and checked against the transformers' configs before any weight loads.
  impl->lora = WanLora::load(options.loras, impl->model.transformer, options.lora_ignore_unmatched);
  if (impl->model.two_experts)
    impl->lora_2 = WanLora::load(options.loras_2, *impl->model.transformer_2, options.lora_ignore_unmatched);
  if (!options.lora_adapters.empty()) {
    if (impl->model.two_experts)
      fail_argument("lora_adapters (--lora-adapter)", "none for a model with two experts (per-request adapters: one expert; merge with "
                    "--lora and --lora-2)", options.lora_adapters[0].first);
    impl->lora_bank = std::make_unique<WanLoraBank>(
        WanLoraBank::load(options.lora_adapters, impl->model.transformer, options.device, options.lora_ignore_unmatched));
  }
  impl->scheduler = impl->model.scheduler;
  if (!options.scheduler.empty()) {
    SchedulerConfig replacement;
    replacement.kind = scheduler_kind_from_name(options.scheduler);
    replacement.num_train_timesteps = impl->scheduler.num_train_timesteps;
    replacement.shift = impl->scheduler.shift;
    impl->scheduler = replacement;
  }
  if (options.flow_shift < 0.0 || !std::isfinite(options.flow_shift))
    fail_argument("flow_shift", "a finite number >= 0 (0: the scheduler config's)", options.flow_shift);
  if (options.flow_shift > 0.0) impl->scheduler.shift = options.flow_shift;
  make_cache_backend(options.cache, options.cache_config, impl->model.transformer);  // a bad name fails here
  // In a parallel group only the text root (sequence rank 0 of CFG branch 0) holds the encoder: it
  // encodes every request and hands the embeddings to the others (begin), who would otherwise each
  // hold UMT5-XXL (about 11 GB in bf16) for the same result.
  if (options.load_text_encoder && impl->model.has_text_encoder && is_text_root(options.parallel))
    impl->text_encoder.emplace(WanTextEncoder::load(dir, options.device));
  // Image to video encodes with the VAE even when results stay latents (load_vae false: no decode).
  // Only image to video (and TI2V, which may take an image) reads and keeps the encoder's half.
  const bool encodes = image_to_video || impl->model.task == WanTask::kTextImageToVideo;
  if ((options.load_vae || image_to_video) && impl->model.has_vae)
    impl->vae.emplace(WanVae::load(impl->model.component("vae"), encodes ? WanVaeParts::kDecoderAndEncoder : WanVaeParts::kDecoder));
  if (image_to_video && impl->model.transformer.has_image_branch()) {
    // On the generation's device: a CUDA generator's CLIP runs there (fp32 weights, 2.5 GB at ViT-H).
    impl->image_encoder.emplace(ClipVisionEncoder::load(impl->model.component("image_encoder"), options.device));
    // image_processor/preprocessor_config.json when the directory has it, else CLIP's own input size.
    const std::string processor = impl->model.component("image_processor") + "/preprocessor_config.json";
    if (fs::is_regular_file(processor)) {
      impl->image_processing = parse_clip_image_processing(read_file_bounded(processor, kMaxModelIndexBytes, "preprocessor_config.json"), processor);
    } else {
      const int64_t side = impl->image_encoder->config().image_size;
      impl->image_processing.shortest_edge = impl->image_processing.crop_height = impl->image_processing.crop_width = side;
    }
    const ClipVisionConfig& clip = impl->image_encoder->config();
    if (impl->image_processing.crop_height != clip.image_size || impl->image_processing.crop_width != clip.image_size)
      fail_argument(processor + ": crop_size", detail::concat("the image encoder's image_size ", clip.image_size),
                    detail::concat(impl->image_processing.crop_height, " x ", impl->image_processing.crop_width));
    const WanConfig& t = impl->model.transformer;
    if (clip.hidden_size != t.image_dim)
      fail_argument(impl->model.component("image_encoder") + "/config.json: hidden_size",
                    detail::concat("the transformer's image_dim ", t.image_dim), clip.hidden_size);
  }
  static_cast<void>(ctx);
  WanGenerator generator(std::move(impl));
  generator.impl_->experts_for("default");
  return generator;
}

WanVideoSize WanGenerator::size_of(const WanRequest& request) const {
  WanVideoSize size{request.frames, request.height, request.width, impl_->model.vae_spatial_stride};
  size.validate();
  return size;
}

const WanTransformer& WanGenerator::transformer(const std::string& sparse_setting, int expert) {
  Impl::Experts& experts = impl_->experts_for(sparse_setting);
  if (expert == 1 && !experts.low) fail_argument("expert", "0 (the model has one expert)", expert);
  return expert == 1 ? *experts.low : *experts.high;
}

void WanGenerator::Impl::set_image_condition(const ExecContext& ctx, const WanRequest& request, const WanVideoSize& size,
                                             WanGenerationOptions& options) const {
  const bool given = request.image.count > 0 || !request.image.rgb.empty();
  const bool last_given = request.last_image.count > 0 || !request.last_image.rgb.empty();
  if (model.task == WanTask::kTextImageToVideo && (given || last_given)) {
    // Wan 2.2 TI2V-5B's image half (diffusers' expand_timesteps): the image's latents are the
    // first latent frame; there is no last frame.
    if (last_given) fail_argument("last_image", "none: TI2V's image to video takes the first frame only", "an image");
    if (!vae) fail_argument("image", "a generator loaded with its VAE (load_vae) to encode it", "load_vae false");
    const Tensor pixels = wan_image_pixels(request.image, size.height, size.width, "image");
    if (request.on_phase) request.on_phase("image encoding");
    const WanDecodeControl control{nullptr, request.cancel};
    options.first_frame = wan_first_frame_latents(ctx, *vae, pixels, &control);
    // A cancel during the encode: the first step sees the flag and ends the generation cancelled.
    if (!options.first_frame.defined())
      options.first_frame = Tensor::zeros(vae->encoded_shape({1, 3, 1, size.height, size.width}), DType::kF32);
    return;
  }
  if (model.task != WanTask::kImageToVideo) {
    if (given || last_given)
      fail_argument(last_given && !given ? "last_image" : "image",
                    "none: " + model.path + " is a " + std::string(wan_task_name(model.task)) +
                        " model (model_index.json's _class_name is WanPipeline; image to video needs a WanImageToVideoPipeline directory)",
                    "an image");
    return;
  }
  if (!given) fail_argument("image", "the first frame of the video (" + model.path + " is an image-to-video model)", "none");
  const WanConfig& t = model.transformer;
  // FLF2V's image branch takes both frames' CLIP tokens through its position table; a plain I2V
  // image branch takes one image's. Wan 2.2 I2V-A14B (no branch) takes a last frame in the mask alone.
  if (last_given && t.has_image_branch() && t.pos_embed_seq_len == 0)
    fail_argument("last_image", "none: this Wan 2.1 I2V transformer's image branch takes one image (FLF2V models set pos_embed_seq_len)",
                  "an image");
  if (!last_given && t.pos_embed_seq_len > 0)
    fail_argument("last_image", "the last frame (this FLF2V transformer's position table covers a first and a last image)", "none");
  const Tensor first = wan_image_pixels(request.image, size.height, size.width, "image");
  const Tensor last = last_given ? wan_image_pixels(request.last_image, size.height, size.width, "last_image") : Tensor{};
  if (request.on_phase) request.on_phase("image encoding");
  if (image_encoder) {
    // CLIP sees each image as given (its own resize and crop), the two of FLF2V as one batch.
    Tensor pixels = clip_preprocess(request.image, image_processing);
    if (last_given) {
      const Tensor last_pixels = clip_preprocess(request.last_image, image_processing);
      Tensor both = Tensor::empty({2, pixels.size(1), pixels.size(2), pixels.size(3)}, DType::kF32);
      std::memcpy(both.data(), pixels.data(), pixels.nbytes());
      std::memcpy(static_cast<char*>(both.data()) + pixels.nbytes(), last_pixels.data(), last_pixels.nbytes());
      pixels = std::move(both);
    }
    const ClipVisionConfig& clip = image_encoder->config();
    // diffusers hands the transformer (images, tokens, width), which its embedder views as one row
    // of images x tokens: the same memory as (1, images x tokens, width).
    options.image_embeds = Tensor::empty({1, pixels.size(0) * clip.tokens(), clip.hidden_size}, DType::kF32);
    // On the encoder's device (ctx's stream when ctx is on it); the features come back to the host
    // and the CUDA predictor uploads them once per request.
    image_encoder->forward(ctx, pixels,
                           TensorView(options.image_embeds.data(), DType::kF32, Device::cpu(), {pixels.size(0), clip.tokens(), clip.hidden_size}));
  }
  const WanDecodeControl control{nullptr, request.cancel};
  options.condition = wan_image_condition(ctx, *vae, first, last, size.frames, &control);
  // A cancel during the encode: the first step sees the flag and ends the generation cancelled.
  if (!options.condition.defined()) options.condition = Tensor::zeros(size.latent_shape(t.in_channels - t.out_channels), DType::kF32);
}

std::unique_ptr<WanGenerationState> WanGenerator::begin(const ExecContext& ctx, const WanRequest& request) {
  Impl& g = *impl_;
  const WanVideoSize size = size_of(request);
  if (request.steps < 1) fail_argument("steps", ">= 1", request.steps);
  if (!std::isfinite(request.guidance) || request.guidance < 0.0) fail_argument("guidance", "a finite number >= 0", request.guidance);
  if (request.guidance_2 && !g.model.two_experts)
    fail_argument("guidance_2", "unset: the model has one expert (no transformer_2)", *request.guidance_2);
  const bool guided = request.guidance > 1.0;
  const std::string cache_name = request.cache.value_or(g.options.cache);
  if (cache_name != "none" && cache_name != g.options.cache)
    fail_argument("cache", "\"none\" or the loaded \"" + g.options.cache + "\"", quoted_excerpt(cache_name));
  Impl::Experts& experts = g.experts_for(request.sparse_setting);

  auto state = std::make_unique<WanGenerationState::Impl>();
  state->pipeline = experts.pipeline.get();
  // The text: the request's embeddings, or its prompts through the text encoder (on the host).
  Tensor prompt = request.prompt_embeds, negative = request.negative_prompt_embeds;
  if (!prompt.defined()) {
    if (request.prompt.empty()) fail_argument("prompt", "a non-empty prompt, or prompt embeddings", "neither");
    // The same answer on every rank of a group (the flags are the same), before any collective.
    if (!(g.options.load_text_encoder && g.model.has_text_encoder))
      fail_argument("prompt", "embeddings (the generator has no text encoder: none in the model directory, or not loaded)",
                    quoted_excerpt(request.prompt));
    // The encoder runs on its own device; tokens and embeddings are host tensors.
    if (request.on_phase) request.on_phase("text encoding");
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    if (g.text_encoder) {
      try {
        if (!guided) {
          prompt = g.text_encoder->encode(ctx, {request.prompt});
        } else {
          const Tensor both = g.text_encoder->encode(ctx, {request.prompt, request.negative_prompt});
          const int64_t row = both.size(1) * both.size(2);
          prompt = Tensor::empty({1, both.size(1), both.size(2)}, DType::kF32);
          negative = Tensor::empty({1, both.size(1), both.size(2)}, DType::kF32);
          std::copy_n(both.data_as<float>(), row, prompt.data_as<float>());
          std::copy_n(both.data_as<float>() + row, row, negative.data_as<float>());
        }
      } catch (...) {
        if (g.options.parallel == nullptr || g.options.parallel->config.world_size() == 1) throw;
        failure = std::current_exception();  // the group hears of it first, then it is thrown
        prompt = negative = Tensor{};
      }
    }
    if (g.options.parallel != nullptr && g.options.parallel->config.world_size() > 1) {
      try {
        prompt = receive_text_from_root(ctx, *g.options.parallel, prompt);
        if (guided) negative = receive_text_from_root(ctx, *g.options.parallel, negative);
      } catch (const Error&) {
        if (failure) std::rethrow_exception(failure);
        throw;
      }
    }
    state->text_encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } else if (!request.prompt.empty() || !request.negative_prompt.empty()) {
    fail_argument("prompt / prompt_embeds", "one of them", "both");
  } else if (guided && !negative.defined()) {
    fail_argument("negative_prompt_embeds", "given with guidance above 1", "none");
  }
  if (request.noise.defined()) {
    const Shape latent = size.latent_shape(g.model.transformer.out_channels);
    if (request.noise.shape() != latent)
      fail_argument("noise", "the latent shape " + shape_str(latent) + " (from the size and frames)", request.noise.view().describe());
    check_finite(request.noise, "noise");
  }
  // One cache per expert: each keeps the residuals of its own blocks.
  state->cache = make_cache_backend(cache_name, g.options.cache_config, experts.high->config(), size.height, size.width);
  if (experts.low)
    state->cache_2 = make_cache_backend(cache_name, g.options.cache_config, experts.low->config(), size.height, size.width);

  WanGenerationOptions options;
  options.num_inference_steps = request.steps;
  options.guidance_scale = request.guidance;
  options.guidance_scale_2 = request.guidance_2;
  options.seed = request.seed;
  options.size = size;
  options.cancel = request.cancel;
  options.on_step = request.on_step;
  options.on_decode_chunk = request.on_decode_chunk;
  options.decode = request.decode;
  options.cache = state->cache.get();
  options.cache_2 = state->cache_2.get();
  options.cfg_group = g.options.parallel != nullptr ? g.options.parallel->cfg.get() : nullptr;
  options.decode_group = g.options.parallel != nullptr && g.options.split_decode ? g.options.parallel->sequence.get() : nullptr;
  if (!request.lora.empty()) {
    if (!g.lora_bank) fail_argument("lora", "no adapter (the model was loaded without per-request adapters)", quoted_excerpt(request.lora));
    options.lora_bank = g.lora_bank.get();
    options.lora_adapter = g.lora_bank->index(request.lora, "lora");
  }
  ExecContext run_ctx = ctx;
  run_ctx.device = g.options.device;
  // The image encoders run on the generator's device (CLIP where it was loaded, the VAE's encoder
  // where the conditioning video is put), their results come back as host tensors.
  g.set_image_condition(run_ctx, request, size, options);
  state->denoise = experts.pipeline->begin(run_ctx, prompt, guided ? negative.view() : TensorView{}, options,
                                           request.noise.defined() ? request.noise.view() : TensorView{},
                                           make_scheduler(g.scheduler));
  state->on_phase = request.on_phase;
  state->decode = request.decode;
  if (request.on_phase) request.on_phase("denoising");
  return std::unique_ptr<WanGenerationState>(new WanGenerationState(std::move(state)));
}

void WanGenerator::step(const ExecContext& ctx, std::span<WanGenerationState* const> states) {
  ExecContext run_ctx = ctx;
  run_ctx.device = impl_->options.device;
  // The states of one pipeline (one sparse setting) step together: the pipeline batches those that
  // can share a forward.
  std::vector<bool> taken(states.size(), false);
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i] == nullptr) fail_argument("states", "states from begin", "a null one");
    if (taken[i]) continue;
    const WanPipeline* pipeline = states[i]->impl_->pipeline;
    std::vector<WanDenoiseState*> group;
    for (size_t j = i; j < states.size(); ++j)
      if (!taken[j] && states[j] != nullptr && states[j]->impl_->pipeline == pipeline) {
        group.push_back(states[j]->impl_->denoise.get());
        taken[j] = true;
      }
    pipeline->step(run_ctx, group);
  }
}

WanGeneratorResult WanGenerator::finish(const ExecContext& ctx, WanGenerationState& state) {
  ExecContext run_ctx = ctx;
  run_ctx.device = impl_->options.device;
  WanGeneratorResult result;
  if (state.impl_->on_phase && impl_->vae && impl_->options.load_vae && state.impl_->decode && !state.impl_->denoise->cancelled())
    state.impl_->on_phase("decoding");
  result.generation = state.impl_->pipeline->finish(run_ctx, *state.impl_->denoise);
  result.text_encode_seconds = state.impl_->text_encode_seconds;
  return result;
}

WanGeneratorResult WanGenerator::generate(const ExecContext& ctx, const WanRequest& request) {
  return std::move(generate(ctx, std::span<const WanRequest>(&request, 1)).front());
}

std::vector<WanGeneratorResult> WanGenerator::generate(const ExecContext& ctx, std::span<const WanRequest> requests) {
  std::vector<std::unique_ptr<WanGenerationState>> states;
  std::vector<WanGenerationState*> running;
  for (const WanRequest& request : requests) {
    states.push_back(begin(ctx, request));
    running.push_back(states.back().get());
  }
  while (std::any_of(running.begin(), running.end(), [](const WanGenerationState* s) { return !s->done(); })) step(ctx, running);
  std::vector<WanGeneratorResult> results;
  for (auto& state : states) results.push_back(finish(ctx, *state));
  return results;
}

}  // namespace tessel
