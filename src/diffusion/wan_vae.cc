#include "tessel/diffusion/wan_vae.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/core/io/bounded_read.h"
#include "wan_vae_blocks.h"
#include "wan_vae_encoder.h"
#include "wan_vae_layout.h"
#include "wan_vae_split.h"
#include "tessel/parallel/communicator.h"

#ifdef TESSEL_VAE_CUDA
#include "cuda/wan_vae_cuda.h"
#include "cuda/wan_vae_cuda_encoder.h"
#endif

namespace tessel {
namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;
constexpr int64_t kMaxLatentExtent = 1 << 16;

void check_latents(const TensorView& latents, const WanVaeConfig& config) {
  if (latents.dtype() != DType::kF32 || !latents.is_contiguous() || latents.dim() != 5)
    fail_argument("latents", "a contiguous fp32 tensor (1, z_dim, frames, height, width)", latents.describe());
  if (latents.size(0) != 1) fail_argument("latents", "batch 1", latents.describe());
  if (latents.size(1) != config.z_dim) fail_argument("latents", detail::concat(config.z_dim, " channels (z_dim)"), latents.describe());
  for (int64_t d = 2; d < 5; ++d)
    if (latents.size(d) < 1 || latents.size(d) > kMaxLatentExtent)
      fail_argument("latents", detail::concat("frames, height and width in [1, ", kMaxLatentExtent, "]"), latents.describe());
}

// The group that splits a decode by height, or null when the decode runs whole on this rank: no
// group, a group of one, or fewer latent rows than ranks. Checks the group's device against the
// latents'.
Communicator* splitting_group(Communicator* group, const TensorView& latents) {
  if (group == nullptr) return nullptr;
  if (group->device() != latents.device())
    fail_argument("group", "a communicator of the latents' device " + latents.device().str(),
                  detail::concat(group->engine(), " on ", group->device().str()));
  return group->size() > 1 && latents.size(3) >= group->size() ? group : nullptr;
}

}  // namespace

struct WanVae::DeviceModels {
#ifdef TESSEL_VAE_CUDA
  std::mutex mutex;
  // fp32 host copies of the tensors of the halves built, for a device's first decode or encode
  vae::WeightMap weights;
  std::map<int, std::unique_ptr<const vae::cuda::CudaDecoder>> decoders;  // by device index
  std::map<int, std::unique_ptr<const vae::cuda::CudaEncoder>> encoders;  // by device index

  // The decoder or encoder of `device` in `models`, made (its weights uploaded) by its first use.
  template <typename Model>
  const Model& on(std::map<int, std::unique_ptr<const Model>>& models, const WanVaeConfig& config, Device device) {
    const std::lock_guard lock(mutex);
    std::unique_ptr<const Model>& slot = models[device.index];
    if (!slot) slot = std::make_unique<const Model>(config, weights, device);
    return *slot;
  }
#endif
};

#ifndef TESSEL_VAE_CUDA
namespace {

// A device tensor given to a VAE built without its CUDA half: an Error naming the argument.
[[noreturn]] void fail_without_device_vae(const char* argument, const TensorView& tensor, const char* verb) {
#ifdef TESSEL_WITH_CUDA
  fail_argument(argument, detail::concat("a CPU tensor (tessel was built without cuDNN's headers, so the VAE ", verb, " on the CPU only)"),
                tensor.describe());
#else
  static_cast<void>(verb);
  fail_argument(argument, "a CPU tensor (tessel was built without CUDA)", tensor.describe());
#endif
}

}  // namespace
#endif

// AutoencoderKLWan's decoder half: post_quant_conv, then WanDecoder3d (its up blocks WanUpBlock, or
// WanResidualUpBlock for Wan 2.2's residual VAE).
struct WanVae::Decoder {
  vae::SlotCounter slots;
  vae::CausalConv post_quant, conv_in, conv_out;
  std::unique_ptr<vae::MidBlock> mid;
  struct UpStage {
    std::vector<vae::ResidualBlock> resnets;
    std::unique_ptr<vae::Upsampler> upsampler;
    // Residual up blocks: the input, duplicated up to the output's size, is added to the output.
    bool duplicate_shortcut = false;
    int64_t out_dim = 0, time_factor = 1;
  };
  std::vector<UpStage> stages;
  std::vector<float> norm_out;

  Decoder(const WanVaeConfig& config, const vae::WeightMap& w) {
    const std::vector<vae::DecoderStage> layout = vae::decoder_stages(config);
    post_quant = vae::CausalConv(w, "post_quant_conv", 1, 1, 1, slots);
    conv_in = vae::CausalConv(w, "decoder.conv_in", 3, 3, 3, slots);
    mid = std::make_unique<vae::MidBlock>(w, "decoder.mid_block", layout[0].in_dim, slots);
    for (size_t i = 0; i < layout.size(); ++i) {
      const std::string p = "decoder.up_blocks." + std::to_string(i);
      UpStage stage;
      for (int64_t r = 0; r <= config.num_res_blocks; ++r)
        stage.resnets.emplace_back(w, p + ".resnets." + std::to_string(r), r == 0 ? layout[i].in_dim : layout[i].out_dim,
                                   layout[i].out_dim, slots);
      if (layout[i].upsample)
        stage.upsampler = std::make_unique<vae::Upsampler>(w, p + "." + layout[i].upsampler_name, layout[i].out_dim,
                                                           layout[i].temporal, slots);
      stage.duplicate_shortcut = layout[i].duplicate_shortcut;
      stage.out_dim = layout[i].upsample_dim;
      stage.time_factor = layout[i].temporal ? 2 : 1;
      stages.push_back(std::move(stage));
    }
    const int64_t last = layout.back().out_dim;
    const float* gamma = vae::weight_data(w, "decoder.norm_out.gamma");
    norm_out.assign(gamma, gamma + last);
    conv_out = vae::CausalConv(w, "decoder.conv_out", 3, 3, 3, slots);
  }

  // WanDecoder3d.forward on one chunk (one latent frame), with the cache of the chunks before it.
  vae::FeatureFrames chunk(const ExecContext& ctx, const vae::FeatureFrames& latent, vae::FeatureCache& cache,
                           bool first_chunk) const {
    vae::FeatureFrames x = mid->forward(ctx, conv_in.forward(ctx, latent, cache), cache);
    for (const UpStage& stage : stages) {
      const vae::FeatureFrames input = stage.duplicate_shortcut ? x : vae::FeatureFrames{};
      for (const vae::ResidualBlock& block : stage.resnets) x = block.forward(ctx, x, cache);
      if (stage.upsampler) x = stage.upsampler->forward(ctx, x, cache);
      if (stage.duplicate_shortcut)
        vae::add_in_place(ctx, x, vae::duplicate_upsample(ctx, input, stage.out_dim, stage.time_factor, first_chunk));
    }
    vae::rms_norm(ctx, x, norm_out.data(), true);
    return conv_out.forward(ctx, x, cache);
  }
};

namespace {

// The encoder's half of a checkpoint: read and built only when encoding is asked for.
bool is_encoder_tensor(const std::string& name) { return name.starts_with("encoder.") || name.starts_with("quant_conv."); }

// The specs of the tensors `parts` needs.
std::vector<WeightSpec> part_specs(const WanVaeConfig& config, WanVaeParts parts) {
  std::vector<WeightSpec> specs = wan_vae_weight_specs(config);
  if (parts == WanVaeParts::kDecoder) std::erase_if(specs, [](const WeightSpec& spec) { return is_encoder_tensor(spec.name); });
  return specs;
}

}  // namespace

WanVae::WanVae(WanVaeConfig config, const std::map<std::string, Tensor>& weights, WanVaeParts parts) : config_(std::move(config)) {
  config_.validate();
  const std::vector<WeightSpec> specs = part_specs(config_, parts);
  vae::WeightMap fp32;
  for (const WeightSpec& spec : specs) {
    const auto found = weights.find(spec.name);
    if (found == weights.end()) fail_argument("Wan VAE weights", "a tensor named " + spec.name, "none");
    if (found->second.shape() != spec.shape)
      fail_argument("Wan VAE weight " + spec.name, shape_str(spec.shape), shape_str(found->second.shape()));
    fp32[spec.name] = found->second.dtype() == DType::kF32 ? found->second.clone() : found->second.to(DType::kF32);
  }
  if (weights.size() != specs.size()) {
    const std::vector<WeightSpec> all = wan_vae_weight_specs(config_);
    for (const auto& entry : weights) {  // not a structured binding: clang 14 cannot capture one in a lambda
      const std::string& name = entry.first;
      if (std::none_of(all.begin(), all.end(), [&](const WeightSpec& s) { return s.name == name; }))
        fail_argument("Wan VAE weights", "only AutoencoderKLWan's tensors", "an extra tensor " + quoted_excerpt(name));
    }
  }
  decoder_ = std::make_unique<Decoder>(config_, fp32);
  if (parts == WanVaeParts::kDecoderAndEncoder) encoder_ = std::make_unique<vae::Encoder>(config_, fp32);
  device_models_ = std::make_unique<DeviceModels>();
#ifdef TESSEL_VAE_CUDA
  device_models_->weights = std::move(fp32);  // the encoder's half only when it was asked for
#endif
}

WanVae::~WanVae() = default;
WanVae::WanVae(WanVae&&) noexcept = default;
WanVae& WanVae::operator=(WanVae&&) noexcept = default;

WanVae WanVae::load(const std::string& directory, WanVaeParts parts) {
  const std::string config_path = directory + "/config.json";
  const WanVaeConfig config = parse_wan_vae_config(read_file_bounded(config_path, kMaxConfigBytes, "VAE config"), config_path);
  const Checkpoint checkpoint = Checkpoint::open(directory);
  check_checkpoint(checkpoint, wan_vae_weight_specs(config));  // the whole file, whichever half is read
  return WanVae(config, read_weights(checkpoint, part_specs(config, parts), DType::kF32), parts);
}

Shape WanVae::decoded_shape(const Shape& latent_shape) const {
  if (latent_shape.size() != 5) fail_argument("latent shape", "(1, z_dim, frames, height, width)", shape_str(latent_shape));
  const int64_t spatial = vae::spatial_factor(config_), temporal = vae::temporal_factor(config_);
  return {latent_shape[0], config_.out_channels / (config_.patch_size * config_.patch_size), (latent_shape[2] - 1) * temporal + 1,
          latent_shape[3] * spatial, latent_shape[4] * spatial};
}

Tensor WanVae::decode(const ExecContext& ctx, const TensorView& latents, const WanDecodeControl* control, Communicator* group) const {
  check_latents(latents, config_);
  Tensor video = Tensor::empty(decoded_shape(latents.shape()), DType::kF32, latents.device());
  if (!decode(ctx, latents, video.view(), control, group)) return Tensor();
  return video;
}

bool WanVae::decode(const ExecContext& ctx, const TensorView& latents, const TensorView& video, const WanDecodeControl* control,
                    Communicator* group) const {
  check_latents(latents, config_);
  if (latents.device().is_cuda()) return decode_on_device(ctx, latents, video, control, group);
  if (ctx.device.is_cuda()) fail_argument("latents", "a tensor on the context's device " + ctx.device.str(), latents.describe());
  const Shape expected = decoded_shape(latents.shape());
  if (video.dtype() != DType::kF32 || !video.device().is_cpu() || !video.is_contiguous() || video.shape() != expected)
    fail_argument("video", "a contiguous fp32 CPU tensor " + shape_str(expected), video.describe());
  const int64_t z = config_.z_dim, frames = latents.size(2), height = latents.size(3), width = latents.size(4);

  // De-normalized as WanPipeline does it: latents / (1 / std) + mean, in fp32.
  vae::FeatureFrames denormalized(frames, z, height, width);
  const float* in = latents.data_as<const float>();
  for (int64_t c = 0; c < z; ++c) {
    const float inverse_std = 1.0f / config_.latents_std[static_cast<size_t>(c)], mean = config_.latents_mean[static_cast<size_t>(c)];
    for (int64_t t = 0; t < frames; ++t)
      for (int64_t y = 0; y < height; ++y)
        for (int64_t x = 0; x < width; ++x)
          denormalized.pixel(t, y, x)[c] = in[((c * frames + t) * height + y) * width + x] / inverse_std + mean;
  }
  std::optional<vae::RowSplit> split;
  if (Communicator* splitting = splitting_group(group, latents)) split.emplace(*splitting, height);
  vae::FeatureCache cache(decoder_->slots.next, split ? &*split : nullptr);
  // post_quant_conv (1x1x1, no halo) runs over the whole latents on every rank: it is small next to
  // a chunk.
  const vae::FeatureFrames quantized = decoder_->post_quant.forward(ctx, denormalized, cache);
  // This rank's latent rows: the whole frame, or its band.
  const int64_t first_row = split ? split->bands().begin(split->bands().rank()) : 0;
  const int64_t rows = split ? split->bands().rows(split->bands().rank()) : height;

  const int64_t channels = expected[1], out_frames = expected[2], out_height = expected[3], out_width = expected[4];
  const int64_t patch = config_.patch_size;
  float* out = video.data_as<float>();
  int64_t written = 0;
  for (int64_t t = 0; t < frames; ++t) {
    const bool cancelled = control != nullptr && control->cancelled();
    if (split ? split->any(cancelled) : cancelled) return false;
    vae::FeatureFrames latent(1, z, rows, width);
    for (int64_t y = 0; y < rows; ++y)
      std::memcpy(latent.pixel(0, y, 0), quantized.pixel(t, first_row + y, 0), static_cast<size_t>(width * z) * sizeof(float));
    vae::FeatureFrames decoded = decoder_->chunk(ctx, latent, cache, t == 0);
    if (split) decoded = split->whole(ctx, decoded);  // every rank's band of the chunk
    // Unpatchified as diffusers' unpatchify: channel (c * patch + r) * patch + q of decoded pixel
    // (y, x) is channel c of video pixel (y * patch + q, x * patch + r); patch 1 copies.
    for (int64_t f = 0; f < decoded.count; ++f, ++written)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t y = 0; y < out_height; ++y)
          for (int64_t x = 0; x < out_width; ++x)
            out[((c * out_frames + written) * out_height + y) * out_width + x] = std::clamp(
                decoded.pixel(f, y / patch, x / patch)[(c * patch + x % patch) * patch + y % patch], -1.0f, 1.0f);
    if (control != nullptr && control->on_chunk) control->on_chunk(t + 1, frames);
  }
  if (written != out_frames) throw Error(detail::concat("Wan VAE: decoded ", written, " frames, expected ", out_frames));
  return true;
}

bool WanVae::decode_on_device(const ExecContext& ctx, const TensorView& latents, const TensorView& video,
                              const WanDecodeControl* control, Communicator* group) const {
  const Device device = latents.device();
  if (ctx.device.is_cuda() && ctx.device != device)
    fail_argument("latents", "a tensor on the context's device " + ctx.device.str(), latents.describe());
  const Shape expected = decoded_shape(latents.shape());
  if (video.dtype() != DType::kF32 || video.device() != device || !video.is_contiguous() || video.shape() != expected)
    fail_argument("video", "a contiguous fp32 tensor " + shape_str(expected) + " on " + device.str(), video.describe());
#ifdef TESSEL_VAE_CUDA
  const vae::cuda::CudaDecoder& decoder = device_models_->on(device_models_->decoders, config_, device);
  return decoder.decode(reinterpret_cast<cudaStream_t>(ctx.stream), latents.data_as<const float>(), latents.size(2), latents.size(3),
                        latents.size(4), video.data_as<float>(), expected[2], cuda_tf32_, control, splitting_group(group, latents));
#else
  static_cast<void>(group);
  fail_without_device_vae("latents", latents, "decodes");
#endif
}

bool WanVae::encode_on_device(const ExecContext& ctx, const TensorView& video, const TensorView& mu,
                              const WanDecodeControl* control) const {
  const Device device = video.device();
  if (ctx.device.is_cuda() && ctx.device != device)
    fail_argument("video", "a tensor on the context's device " + ctx.device.str(), video.describe());
  const Shape expected = encoded_shape(video.shape());
  if (mu.dtype() != DType::kF32 || mu.device() != device || !mu.is_contiguous() || mu.shape() != expected)
    fail_argument("mu", "a contiguous fp32 tensor " + shape_str(expected) + " on " + device.str(), mu.describe());
#ifdef TESSEL_VAE_CUDA
  const vae::cuda::CudaEncoder& encoder = device_models_->on(device_models_->encoders, config_, device);
  return encoder.encode(reinterpret_cast<cudaStream_t>(ctx.stream), video.data_as<const float>(), video.size(0), video.size(2),
                        video.size(3), video.size(4), mu.data_as<float>(), expected[2], cuda_tf32_, control);
#else
  fail_without_device_vae("video", video, "encodes");
#endif
}

}  // namespace tessel
