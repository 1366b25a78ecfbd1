#include "tessel/diffusion/wan_pipeline.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/core/finite_check.h"
#include "tessel/core/random.h"
#include "tessel/sparse/backend.h"
#include "wan_batch_predictor.h"
#include "wan_flow_predictor.h"

namespace tessel {
namespace {

constexpr int64_t kVaeTimeStride = 4;
// Wan 2.1's VAE and Wan 2.2's patched one (TI2V-5B).
constexpr int64_t kVaeSpaceStrides[] = {8, 16};
// Height and width of one transformer patch in latent pixels.
constexpr int64_t kPatchLatentPixels = 2;
constexpr int64_t kMaxPixels = 1 << 14;
constexpr int64_t kMaxFrames = 4 * 1024 + 1;

void require_cpu_f32(const TensorView& view, const char* name) {
  if (view.dtype() != DType::kF32 || !view.device().is_cpu() || !view.is_contiguous())
    fail_argument(name, "a contiguous fp32 CPU tensor", view.describe());
}

// The predictor for the transformer's device.
std::unique_ptr<WanFlowPredictor> make_flow_predictor(const ExecContext& ctx, const WanFlowRequest& request) {
  if (request.transformer->device().is_cpu()) return make_cpu_flow_predictor(request);
#ifdef TESSEL_WITH_CUDA
  return make_cuda_flow_predictor(ctx, request);
#else
  // A CUDA transformer cannot be built without CUDA; this names the build should one appear.
  fail_argument("transformer device", "cpu (tessel was built without CUDA)", request.transformer->device().str());
#endif
}

// 8-bit frames of the VAE's output, refusing NaN and infinities (they would become black pixels).
VideoFrames frames_of_decoded(const Tensor& decoded) {
  check_finite(decoded, "the VAE's decoded video", "the final latents were finite: the VAE's weights or its arithmetic overflowed");
  return video_frames_from_tensor(decoded);
}

}  // namespace

void WanVideoSize::validate() const {
  if (frames < 1 || frames > kMaxFrames || (frames - 1) % kVaeTimeStride != 0)
    fail_argument("frames", detail::concat("4k + 1 frames, at most ", kMaxFrames), frames);
  if (std::find(std::begin(kVaeSpaceStrides), std::end(kVaeSpaceStrides), vae_spatial_stride) == std::end(kVaeSpaceStrides))
    fail_argument("vae_spatial_stride", "8 (Wan 2.1's VAE) or 16 (Wan 2.2's)", vae_spatial_stride);
  const int64_t unit = vae_spatial_stride * kPatchLatentPixels;
  const std::pair<const char*, int64_t> sides[] = {{"height", height}, {"width", width}};
  for (const auto& [name, pixels] : sides)
    if (pixels < unit || pixels > kMaxPixels || pixels % unit != 0)
      fail_argument(name, detail::concat("a multiple of ", unit, " in [", unit, ", ", kMaxPixels, "]"), pixels);
}

Shape WanVideoSize::latent_shape(int64_t channels) const {
  validate();
  return {1, channels, (frames - 1) / kVaeTimeStride + 1, height / vae_spatial_stride, width / vae_spatial_stride};
}

Tensor wan_initial_noise(const Shape& latent_shape, uint64_t seed) {
  Tensor noise = Tensor::empty(latent_shape, DType::kF32);
  fill_normal(noise, seed);
  return noise;
}

Tensor wan_prompt_embeddings(const ExecContext& ctx, const UMT5Encoder& encoder, const TensorView& input_ids,
                             const TensorView& attention_mask) {
  if (input_ids.dim() != 2 || input_ids.dtype() != DType::kI32 || !input_ids.device().is_cpu() || !input_ids.is_contiguous())
    fail_argument("input_ids", "(batch, length) int32, CPU, contiguous", input_ids.describe());
  const int64_t rows = input_ids.size(0), length = input_ids.size(1), width = encoder.config().d_model;
  if (attention_mask.dim() != 2 || attention_mask.size(0) != rows || attention_mask.size(1) != length ||
      attention_mask.dtype() != DType::kI32 || !attention_mask.device().is_cpu() || !attention_mask.is_contiguous())
    fail_argument("attention_mask", detail::concat("(", rows, ", ", length, ") int32, CPU, contiguous as input_ids"),
                  attention_mask.describe());
  // Per row: its token count (diffusers zeroes the outputs from there on) and the end of its last
  // token (the tokenizer pads at the end, so the two are equal for its masks).
  std::vector<int64_t> tokens(static_cast<size_t>(rows), 0);
  int64_t kept = 1;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < length; ++i)
      if (attention_mask.data_as<const int32_t>()[row * length + i] != 0) {
        ++tokens[static_cast<size_t>(row)];
        kept = std::max(kept, i + 1);
      }
  // The encoder runs on the positions up to the last token of any row. Its attention masks the
  // padding out as keys and its relative position bias depends on distances alone, so a token's
  // output does not depend on how much padding follows it: a prompt of 20 tokens costs 20 rows of
  // UMT5-XXL instead of max_length's 512.
  Tensor embeddings = Tensor::zeros({rows, length, width}, DType::kF32);
  if (kept == length) {
    encoder.forward(ctx, input_ids, attention_mask, embeddings);  // checks both token tensors first
  } else {
    Tensor ids = Tensor::empty({rows, kept}, DType::kI32), mask = Tensor::empty({rows, kept}, DType::kI32);
    for (int64_t row = 0; row < rows; ++row) {
      std::copy_n(input_ids.data_as<const int32_t>() + row * length, kept, ids.data_as<int32_t>() + row * kept);
      std::copy_n(attention_mask.data_as<const int32_t>() + row * length, kept, mask.data_as<int32_t>() + row * kept);
    }
    Tensor out = Tensor::empty({rows, kept, width}, DType::kF32);
    encoder.forward(ctx, ids, mask, out);
    for (int64_t row = 0; row < rows; ++row)
      std::copy_n(out.data_as<const float>() + row * kept * width, kept * width, embeddings.data_as<float>() + row * length * width);
  }
  for (int64_t row = 0; row < rows; ++row) {
    float* padding = embeddings.data_as<float>() + (row * length + tokens[static_cast<size_t>(row)]) * width;
    std::fill(padding, padding + (length - tokens[static_cast<size_t>(row)]) * width, 0.0f);
  }
  return embeddings;
}

WanPipeline::WanPipeline(const WanTransformer& transformer, Scheduler& scheduler, const WanVae* vae)
    : WanPipeline(transformer, vae) {
  scheduler_ = &scheduler;
}

WanPipeline::WanPipeline(const WanTransformer& transformer, const WanLowNoiseExpert& low_noise, Scheduler& scheduler,
                         const WanVae* vae)
    : WanPipeline(transformer, low_noise, vae) {
  scheduler_ = &scheduler;
}

struct WanPipeline::BatchPredictors {
  std::mutex mutex;  // step is const and may be called from several threads
  std::unique_ptr<WanBatchFlowPredictor> predictors[2];
};

WanPipeline::WanPipeline(const WanTransformer& transformer, const WanVae* vae)
    : transformer_(transformer), vae_(vae), batch_(std::make_shared<BatchPredictors>()) {
  const WanConfig& config = transformer.config();
  if (config.in_channels < config.out_channels)
    fail_argument("transformer out_channels", detail::concat("at most in_channels (", config.in_channels,
                                                             "): the latents are part of the input"),
                  config.out_channels);
  if (vae_ == nullptr) return;
  if (vae_->config().z_dim != config.out_channels)
    fail_argument("VAE z_dim", detail::concat("the transformer's out_channels (", config.out_channels, ")"),
                  vae_->config().z_dim);
  // One latent frame after the first is kVaeTimeStride frames, one latent pixel one of kVaeSpaceStrides^2.
  const Shape one_step = vae_->decoded_shape({1, config.out_channels, 2, 1, 1});
  if (one_step[1] != 3 || one_step[2] != 1 + kVaeTimeStride ||
      std::find(std::begin(kVaeSpaceStrides), std::end(kVaeSpaceStrides), one_step[3]) == std::end(kVaeSpaceStrides))
    fail_argument("VAE", detail::concat("3 output channels, ", kVaeTimeStride, " frames and 8 x 8 or 16 x 16 pixels per latent"),
                  detail::concat("a VAE decoding (1, ", config.out_channels, ", 2, 1, 1) latents to ", shape_str(one_step)));
}

WanPipeline::WanPipeline(const WanTransformer& transformer, const WanLowNoiseExpert& low_noise, const WanVae* vae)
    : WanPipeline(transformer, vae) {
  if (low_noise.transformer == nullptr) fail_argument("low-noise expert (transformer_2)", "a transformer", "none");
  const WanConfig& high = transformer.config();
  const WanConfig& low = low_noise.transformer->config();
  const std::pair<const char*, std::pair<int64_t, int64_t>> shared[] = {
      {"in_channels", {high.in_channels, low.in_channels}},
      {"out_channels", {high.out_channels, low.out_channels}},
      {"text_dim", {high.text_dim, low.text_dim}}};
  for (const auto& [name, values] : shared)
    if (values.first != values.second)
      fail_argument(detail::concat("low-noise expert (transformer_2) ", name), detail::concat("the transformer's ", values.first),
                    values.second);
  if (!(low_noise.boundary_ratio > 0.0 && low_noise.boundary_ratio < 1.0))
    fail_argument("boundary_ratio", "a number in (0, 1)", low_noise.boundary_ratio);
  if (low_noise.num_train_timesteps < 1)
    fail_argument("num_train_timesteps", "at least 1", low_noise.num_train_timesteps);
  low_noise_ = low_noise;
}

// On a CUDA context the VAE decodes on that device (the final latents go up once, the video comes
// back once); should the device decoder be unavailable (no cuDNN), the CPU decodes, with a warning
// (whole frames on each rank of a device group: its communicator moves no CPU tensors).
VideoFrames WanPipeline::decode_on(const ExecContext& ctx, const Tensor& host_latents, const WanDecodeControl* control,
                                   Communicator* group) const {
  if (vae_ == nullptr) fail_argument("WanPipeline::decode", "a pipeline built with a VAE", "none");
  if (ctx.device.is_cuda()) {
    std::optional<Tensor> decoded;
    try {
      decoded = vae_->decode(ctx, host_latents.to(ctx.device), control, group);
    } catch (const Error& e) {
      ctx.log(LogLevel::kWarning, std::string("the VAE decodes on the CPU: the CUDA decoder failed: ") + e.what());
    }
    if (decoded) return decoded->defined() ? frames_of_decoded(decoded->to(Device::cpu())) : VideoFrames{};
  }
  Communicator* cpu_group = group != nullptr && group->device().is_cpu() ? group : nullptr;
  const Tensor decoded = vae_->decode(ctx.on_cpu(), host_latents, control, cpu_group);
  return decoded.defined() ? frames_of_decoded(decoded) : VideoFrames{};
}

VideoFrames WanPipeline::decode(const ExecContext& ctx, const TensorView& latents) const {
  if (vae_ == nullptr) fail_argument("WanPipeline::decode", "a pipeline built with a VAE", "none");
  return frames_of_decoded(vae_->decode(ctx, latents));
}

struct WanDenoiseState::Impl {
  WanGenerationOptions options;
  std::unique_ptr<Scheduler> owned_scheduler;
  Scheduler* scheduler = nullptr;
  Tensor prompt, negative;  // the embeddings the predictors' views point into
  Tensor latents;
  float boundary = 0.0f;
  double guidance_2 = 0.0;
  WanFlowRequest request;
  std::unique_ptr<WanFlowPredictor> predictors[2];
  Tensor batched_flow;  // this state's flow when its step ran in a batch with others
  uint64_t id = 0;      // unique in the process: names its texts to the batched forward
  WanGenerationResult result;
  int64_t steps = 0;
  std::chrono::steady_clock::time_point start;
  bool spent = false;
};

WanDenoiseState::WanDenoiseState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WanDenoiseState::~WanDenoiseState() = default;
int64_t WanDenoiseState::steps_done() const { return impl_->result.steps_done; }
int64_t WanDenoiseState::total_steps() const { return impl_->steps; }
bool WanDenoiseState::done() const { return impl_->result.cancelled || impl_->result.steps_done >= impl_->steps; }
bool WanDenoiseState::cancelled() const { return impl_->result.cancelled; }

namespace {

// The image-to-video inputs against what the transformer takes (both experts share the config's
// channels and image branch: the two-expert constructor checked the channels, Wan 2.2's experts
// have no image branch).
void check_image_condition(const WanGenerationOptions& options, const Shape& latent_shape, const WanTransformer& transformer) {
  const WanConfig& config = transformer.config();
  const int64_t channels = config.in_channels - config.out_channels;
  if (channels == 0 && options.condition.defined())
    fail_argument("condition", "none: this transformer takes the latents alone (in_channels = out_channels)", options.condition.view().describe());
  if (channels > 0) {
    if (!options.condition.defined())
      fail_argument("condition", detail::concat("the ", channels, " channels an image-to-video transformer takes after the latents (an image)"),
                    "none");
    Shape expected = latent_shape;
    expected[1] = channels;
    require_cpu_f32(options.condition.view(), "condition");
    if (options.condition.shape() != expected)
      fail_argument("condition", "the shape " + shape_str(expected), options.condition.view().describe());
    check_finite(options.condition.view(), "condition");
  }
  if (config.has_image_branch() != options.image_embeds.defined())
    fail_argument("image_embeds", config.has_image_branch() ? "the CLIP features of the image (the transformer has an image branch)"
                                                             : "none (the transformer has no image branch)",
                  options.image_embeds.defined() ? options.image_embeds.view().describe() : std::string("none"));
  if (options.image_embeds.defined()) {
    require_cpu_f32(options.image_embeds.view(), "image_embeds");
    if (options.image_embeds.view().dim() != 3 || options.image_embeds.size(0) != 1 || options.image_embeds.size(2) != config.image_dim)
      fail_argument("image_embeds", detail::concat("(1, I, ", config.image_dim, ")"), options.image_embeds.view().describe());
    check_finite(options.image_embeds.view(), "image_embeds");
  }
  if (options.first_frame.defined()) {
    if (channels > 0)
      fail_argument("first_frame", "none for a transformer that takes condition channels (it is TI2V's image)", "a first frame");
    if (config.patch_size[0] != 1)
      fail_argument("first_frame", "a transformer whose patch spans one frame (its tokens get timestep 0)", config.patch_size[0]);
    Shape expected = latent_shape;
    expected[2] = 1;
    require_cpu_f32(options.first_frame.view(), "first_frame");
    if (options.first_frame.shape() != expected)
      fail_argument("first_frame", "the shape " + shape_str(expected), options.first_frame.view().describe());
    check_finite(options.first_frame.view(), "first_frame");
    // Step caches judge one timestep per batch entry; a given first frame gives each token its own.
    if (options.cache != nullptr || options.cache_2 != nullptr)
      fail_argument("cache", "none with a first frame (its tokens have their own timestep)",
                    (options.cache ? options.cache : options.cache_2)->name());
  }
}

Tensor host_copy(const TensorView& view) {
  Tensor copy = Tensor::empty(view.shape(), DType::kF32);
  if (view.numel() > 0) std::memcpy(copy.data(), view.data(), view.nbytes());
  return copy;
}

}  // namespace

WanGenerationResult WanPipeline::generate(const ExecContext& ctx, const TensorView& prompt_embeds,
                                          const TensorView& negative_prompt_embeds,
                                          const WanGenerationOptions& options,
                                          const TensorView& initial_latents) const {
  const std::unique_ptr<WanDenoiseState> state = begin(ctx, prompt_embeds, negative_prompt_embeds, options, initial_latents);
  WanDenoiseState* const one[] = {state.get()};
  while (!state->done()) step(ctx, one);
  return finish(ctx, *state);
}

std::unique_ptr<WanDenoiseState> WanPipeline::begin(const ExecContext& ctx, const TensorView& prompt_embeds,
                                                    const TensorView& negative_prompt_embeds,
                                                    const WanGenerationOptions& options, const TensorView& initial_latents,
                                                    std::unique_ptr<Scheduler> scheduler) const {
  const WanConfig& config = transformer_.config();
  const Shape latent_shape = options.size.latent_shape(config.out_channels);
  if (vae_ != nullptr && options.size.vae_spatial_stride != vae_->config().spatial_compression())
    fail_argument("size.vae_spatial_stride", detail::concat("the VAE's ", vae_->config().spatial_compression(), " pixels per latent pixel"),
                  options.size.vae_spatial_stride);
  const bool guided = options.guidance_scale > 1.0;
  if (!std::isfinite(options.guidance_scale)) fail_argument("guidance_scale", "a finite number", options.guidance_scale);
  const bool two_experts = low_noise_.transformer != nullptr;
  if (options.guidance_scale_2 && !two_experts)
    fail_argument("guidance_scale_2", "unset for a pipeline with one expert (it is the low-noise expert's)", *options.guidance_scale_2);
  if (options.cache_2 && !two_experts)
    fail_argument("cache_2", "none for a pipeline with one expert (it is the low-noise expert's)", options.cache_2->name());
  const double guidance_2 = options.guidance_scale_2.value_or(options.guidance_scale);
  if (!std::isfinite(guidance_2)) fail_argument("guidance_scale_2", "a finite number", guidance_2);
  if (options.cache && options.cache == options.cache_2)
    fail_argument("cache_2", "another backend than cache (each expert keeps its own residuals)", "the same");
  if (options.cfg_group != nullptr && options.cfg_group->size() > 2)
    fail_argument("cfg_group size", "1 or 2 (the conditional and the unconditional branch)", options.cfg_group->size());
  if (options.lora_adapter >= 0) {
    if (options.lora_bank == nullptr) fail_argument("lora_bank", "the bank of lora_adapter", "null");
    if (two_experts) fail_argument("lora_adapter", "-1 for a pipeline with two experts (per-request adapters: one expert)", options.lora_adapter);
    if (options.lora_adapter >= options.lora_bank->size())
      fail_argument("lora_adapter", detail::concat("-1 or an adapter of lora_bank in [0, ", options.lora_bank->size(), ")"), options.lora_adapter);
  } else if (options.lora_adapter != -1) {
    fail_argument("lora_adapter", "-1 (none) or an adapter index", options.lora_adapter);
  }

  require_cpu_f32(prompt_embeds, "prompt_embeds");
  // L >= 1: an empty text used to pass here and fail in the first step.
  if (prompt_embeds.dim() != 3 || prompt_embeds.size(0) != 1 || prompt_embeds.size(1) < 1 || prompt_embeds.size(2) != config.text_dim)
    fail_argument("prompt_embeds", detail::concat("(1, L >= 1, ", config.text_dim, ")"), prompt_embeds.describe());
  if (guided) {
    require_cpu_f32(negative_prompt_embeds, "negative_prompt_embeds");
    if (negative_prompt_embeds.shape() != prompt_embeds.shape())
      fail_argument("negative_prompt_embeds", "the shape of prompt_embeds " + shape_str(prompt_embeds.shape()),
                    negative_prompt_embeds.describe());
  }
  check_finite(prompt_embeds, "prompt_embeds");
  if (guided) check_finite(negative_prompt_embeds, "negative_prompt_embeds");
  check_image_condition(options, latent_shape, transformer_);
  auto impl = std::make_unique<WanDenoiseState::Impl>();
  if (initial_latents.empty()) {
    impl->latents = wan_initial_noise(latent_shape, options.seed);
  } else {
    require_cpu_f32(initial_latents, "initial_latents");
    if (initial_latents.shape() != latent_shape)
      fail_argument("initial_latents", "the latent shape " + shape_str(latent_shape), initial_latents.describe());
    check_finite(initial_latents, "initial_latents");
    impl->latents = host_copy(initial_latents);
  }
  impl->options = options;
  // Copies, as of the embeddings: the caller's tensors may change while the generation runs.
  if (options.condition.defined()) impl->options.condition = host_copy(options.condition.view());
  if (options.image_embeds.defined()) impl->options.image_embeds = host_copy(options.image_embeds.view());
  if (options.first_frame.defined()) impl->options.first_frame = host_copy(options.first_frame.view());
  impl->owned_scheduler = std::move(scheduler);
  impl->scheduler = impl->owned_scheduler ? impl->owned_scheduler.get() : scheduler_;
  if (impl->scheduler == nullptr)
    fail_argument("scheduler", "one for this generation (the pipeline was made without its own)", "none");
  impl->scheduler->set_timesteps(options.num_inference_steps);
  impl->steps = impl->scheduler->num_inference_steps();
  for (const double t : impl->scheduler->timesteps())
    if (!std::isfinite(t))
      fail_argument("scheduler timesteps", "finite values (check the scheduler config's shift and num_train_timesteps)", t);
  // diffusers compares its timestep tensor (int64 or float32) with the boundary in float32.
  impl->boundary = static_cast<float>(low_noise_.boundary_ratio * static_cast<double>(low_noise_.num_train_timesteps));
  impl->guidance_2 = guidance_2;
  impl->prompt = host_copy(prompt_embeds);
  if (guided) impl->negative = host_copy(negative_prompt_embeds);
  impl->request.prompt_embeds = impl->prompt.view();
  impl->request.negative_prompt_embeds = guided ? impl->negative.view() : TensorView{};
  impl->request.latent_shape = latent_shape;
  impl->request.condition = impl->options.condition.defined() ? impl->options.condition.view() : TensorView{};
  impl->request.image_embeds = impl->options.image_embeds.defined() ? impl->options.image_embeds.view() : TensorView{};
  impl->request.first_frame = impl->options.first_frame.defined() ? impl->options.first_frame.view() : TensorView{};
  impl->request.guided = guided;
  impl->request.cfg_group = options.cfg_group;
  if (options.lora_adapter >= 0) impl->request.lora_bank = options.lora_bank, impl->request.lora_adapter = options.lora_adapter;
  for (CacheBackend* cache : {options.cache, options.cache_2})
    if (cache) cache->refresh(impl->steps);
  static std::atomic<uint64_t> next_id{1};
  impl->id = next_id.fetch_add(1);
  impl->start = std::chrono::steady_clock::now();
  return std::unique_ptr<WanDenoiseState>(new WanDenoiseState(std::move(impl)));
}

namespace {

// One state's step, between choosing its expert and the scheduler's update.
struct PendingStep {
  WanDenoiseState* state;  // its Impl is private: reached from WanPipeline::step (a friend)
  int64_t step;
  double t;
  int expert;
  std::chrono::steady_clock::time_point start;
  TensorView flow;
};

// Whether a transformer's attention reads the denoising step (sparse schedules, dense warm-up
// steps): then only states at the same step share a forward.
bool attention_reads_step(const WanTransformer& transformer) {
  for (int64_t layer = 0; layer < transformer.config().num_layers; ++layer)
    if (transformer.block_attention(layer) != nullptr) return true;
  return false;
}

}  // namespace

// Step-level batching: the states that can share a forward (one expert and transformer, one
// latent shape and text length, no block cache (its skip decisions are per generation), no
// CFG-parallel group, and one step when the attention reads it) run as one batch of their rows;
// the others, and a group of one, run through their own predictor as before.
void WanPipeline::step(const ExecContext& ctx, std::span<WanDenoiseState* const> states) const {
  const bool two_experts = low_noise_.transformer != nullptr;
  std::vector<PendingStep> pending;
  for (WanDenoiseState* state : states) {
    if (state == nullptr) fail_argument("states", "non-null states from begin", "a null one");
    WanDenoiseState::Impl& s = *state->impl_;
    if (s.spent) fail_argument("states", "states not yet finished", "a finished one");
    for (const PendingStep& p : pending)
      if (p.state == state) fail_argument("states", "each state once per step", "a state twice");
    if (state->done()) continue;
    if (s.options.cancel && s.options.cancel->load()) {
      s.result.cancelled = true;
      continue;
    }
    const int64_t step = s.result.steps_done;
    const double t = s.scheduler->timesteps()[static_cast<size_t>(step)];
    const int expert = two_experts && static_cast<float>(t) < s.boundary ? 1 : 0;
    pending.push_back({state, step, t, expert, std::chrono::steady_clock::now(), {}});
  }
  const auto transformer_of = [&](int expert) { return expert == 1 ? low_noise_.transformer : &transformer_; };
  const auto batchable = [&](const PendingStep& p) {
    const CacheBackend* cache = p.expert == 1 ? p.state->impl_->options.cache_2 : p.state->impl_->options.cache;
    // Image-to-video states run alone: the batched forward takes no condition channels.
    const WanFlowRequest& r = p.state->impl_->request;
    return cache == nullptr && r.cfg_group == nullptr && r.condition.empty() && r.image_embeds.empty() && r.first_frame.empty();
  };
  const bool reads_step[2] = {attention_reads_step(transformer_), two_experts && attention_reads_step(*low_noise_.transformer)};
  const auto same_batch = [&](const PendingStep& a, const PendingStep& b) {
    return a.expert == b.expert && a.state->impl_->request.latent_shape == b.state->impl_->request.latent_shape &&
           a.state->impl_->request.prompt_embeds.shape() == b.state->impl_->request.prompt_embeds.shape() &&
           (!reads_step[a.expert] || (a.step == b.step && a.state->impl_->steps == b.state->impl_->steps));
  };
  std::vector<bool> batched(pending.size(), false);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (batched[i] || !batchable(pending[i])) continue;
    std::vector<size_t> members{i};
    // Generations with per-request adapters share a forward when their adapters are of one bank.
    const WanLoraBank* lora_bank = pending[i].state->impl_->request.lora_bank;
    for (size_t j = i + 1; j < pending.size(); ++j) {
      const WanLoraBank* bank = pending[j].state->impl_->request.lora_bank;
      if (batched[j] || !batchable(pending[j]) || !same_batch(pending[i], pending[j])) continue;
      if (bank != nullptr && lora_bank != nullptr && bank != lora_bank) continue;
      if (bank != nullptr) lora_bank = bank;
      members.push_back(j);
    }
    if (members.size() < 2) continue;
    std::vector<WanBatchEntry> entries;
    for (const size_t m : members) {
      PendingStep& p = pending[m];
      WanDenoiseState::Impl& s = *p.state->impl_;
      entries.push_back({s.latents.view(), p.t, s.request.prompt_embeds, s.request.negative_prompt_embeds,
                         p.expert == 1 ? s.guidance_2 : s.options.guidance_scale, &s.batched_flow, s.id, s.request.lora_adapter});
      batched[m] = true;
    }
    const int expert = pending[i].expert;
    {
      const std::lock_guard<std::mutex> lock(batch_->mutex);
      std::unique_ptr<WanBatchFlowPredictor>& predictor = batch_->predictors[expert];
      if (!predictor) predictor = std::make_unique<WanBatchFlowPredictor>(*transformer_of(expert));
      predictor->predict(ctx, StepInfo::at(pending[i].step, pending[i].state->impl_->steps), entries, lora_bank);
    }
    for (const size_t m : members) pending[m].flow = pending[m].state->impl_->batched_flow.view();
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    PendingStep& p = pending[i];
    WanDenoiseState::Impl& s = *p.state->impl_;
    if (batched[i]) continue;
    // One predictor per expert, each with its transformer, its guidance scale and its cache.
    if (!s.predictors[p.expert]) {
      WanFlowRequest r = s.request;
      r.transformer = transformer_of(p.expert);
      r.guidance_scale = p.expert == 1 ? s.guidance_2 : s.options.guidance_scale;
      CacheBackend* cache = p.expert == 1 ? s.options.cache_2 : s.options.cache;
      r.block_cache = cache ? cache->block_cache() : nullptr;
      s.predictors[p.expert] = make_flow_predictor(ctx, r);
    }
    p.flow = s.predictors[p.expert]->predict(ctx, p.step, s.steps, s.latents.view(), p.t);
  }
  for (PendingStep& p : pending) {
    WanDenoiseState::Impl& s = *p.state->impl_;
    const int64_t step = p.step;
    const double t = p.t;
    s.result.experts.push_back(p.expert);
    // Non-finite values never pass silently (they end as a black video): named by where they
    // first appear, the expert's guided prediction or the scheduler's update.
    const char* expert_name = p.expert == 1 ? "transformer_2" : "transformer";
    check_finite(p.flow, detail::concat("the guided noise prediction of ", expert_name, " at step ", step + 1, " of ", s.steps, " (t=", t, ")"),
                 "the inputs were finite: the model's weights or its arithmetic overflowed");
    const auto scheduler_start = std::chrono::steady_clock::now();
    s.scheduler->step(p.flow, s.latents, s.latents);
    check_finite(s.latents, detail::concat("the latents after the scheduler's step ", step + 1, " of ", s.steps, " (t=", t, ")"));
    s.result.steps_done = step + 1;
    if (s.options.on_step) {
      const auto now = std::chrono::steady_clock::now();
      WanStepProgress progress;
      progress.step = step + 1;
      progress.total_steps = s.steps;
      progress.timestep = t;
      progress.step_seconds = std::chrono::duration<double>(now - p.start).count();
      progress.scheduler_seconds = std::chrono::duration<double>(now - scheduler_start).count();
      progress.elapsed_seconds = std::chrono::duration<double>(now - s.start).count();
      progress.eta_seconds = progress.elapsed_seconds / static_cast<double>(step + 1) * static_cast<double>(s.steps - step - 1);
      progress.latents = s.latents.view();
      s.options.on_step(progress);
    }
  }
}

WanGenerationResult WanPipeline::finish(const ExecContext& ctx, WanDenoiseState& state) const {
  WanDenoiseState::Impl& s = *state.impl_;
  if (s.spent) fail_argument("state", "a state not yet finished", "a finished one");
  s.spent = true;
  for (auto& predictor : s.predictors) predictor.reset();  // the device buffers go before the decode's
  WanGenerationResult result = std::move(s.result);
  // TI2V's image: the loop's first latent frame gives way to the image's (diffusers does this after
  // the last step, before the decode).
  if (s.options.first_frame.defined()) put_first_frame(s.options.first_frame, s.latents.size(2), s.latents.data_as<float>());
  if (vae_ != nullptr && s.options.decode && !result.cancelled) {
    const WanDecodeControl control{s.options.on_decode_chunk, s.options.cancel};
    result.frames = decode_on(ctx, s.latents, &control, s.options.decode_group);
    // A decode returns no frames only when cancelled, here or (agreed on by a decode group) on another rank.
    result.cancelled = result.frames.count == 0;
  }
  result.latents = std::move(s.latents);
  if (s.options.cache) result.cache_stats = s.options.cache->stats();
  if (s.options.cache_2) result.cache_stats_2 = s.options.cache_2->stats();
  return result;
}

}  // namespace tessel
