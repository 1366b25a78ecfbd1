// The Wan VAE's encoder (vae::Encoder) and WanVae's encode door: arguments checked, the video
// patchified and cut into diffusers' chunks, each chunk's latent frames written into mu.
#include "wan_vae_encoder.h"

#include <cstring>

#include "tessel/core/error.h"
#include "wan_vae_layout.h"

namespace tessel {
namespace vae {

Encoder::Encoder(const WanVaeConfig& config, const WeightMap& w) {
  conv_in_ = CausalConv(w, "encoder.conv_in", 3, 3, 3, slots_);
  int64_t dim = config.base_dim;
  for (const EncoderStage& layout : encoder_stages(config)) {
    Stage stage;
    for (size_t r = 0; r < layout.resnet_names.size(); ++r)
      stage.resnets.emplace_back(w, layout.resnet_names[r], r == 0 ? layout.in_dim : layout.out_dim, layout.out_dim, slots_);
    if (layout.downsample)
      stage.downsampler = std::make_unique<Downsampler>(w, layout.downsampler_name, layout.temporal, slots_);
    stage.average_shortcut = layout.average_shortcut;
    stage.out_dim = layout.out_dim;
    stage.time_factor = layout.temporal ? 2 : 1;
    stage.space_factor = layout.downsample ? 2 : 1;
    stages_.push_back(std::move(stage));
    dim = layout.out_dim;
  }
  mid_ = std::make_unique<MidBlock>(w, "encoder.mid_block", dim, slots_);
  const float* gamma = weight_data(w, "encoder.norm_out.gamma");
  norm_out_.assign(gamma, gamma + dim);
  conv_out_ = CausalConv(w, "encoder.conv_out", 3, 3, 3, slots_);
  // PyTorch's weight is (out, in, 1, 1, 1), so the first z_dim output channels are its first rows.
  quant_mu_ = PackedConv(weight_data(w, "quant_conv.weight"), weight_data(w, "quant_conv.bias"), config.z_dim,
                         2 * config.z_dim, 1, 1, 1);
}

Encoder::~Encoder() = default;

FeatureFrames Encoder::chunk(const ExecContext& ctx, const FeatureFrames& frames, FeatureCache& cache) const {
  FeatureFrames x = conv_in_.forward(ctx, frames, cache);
  for (const Stage& stage : stages_) {
    const FeatureFrames input = stage.average_shortcut ? x : FeatureFrames{};
    for (const ResidualBlock& block : stage.resnets) x = block.forward(ctx, x, cache);
    if (stage.downsampler) x = stage.downsampler->forward(ctx, x, cache);
    if (stage.average_shortcut)
      add_in_place(ctx, x, average_downsample(ctx, input, stage.out_dim, stage.time_factor, stage.space_factor));
  }
  x = mid_->forward(ctx, x, cache);
  rms_norm(ctx, x, norm_out_.data(), true);
  const FeatureFrames moments = conv_out_.forward(ctx, x, cache);
  FeatureFrames mu(moments.count, quant_mu_.out_channels, moments.height, moments.width);
  for (int64_t t = 0; t < moments.count; ++t) conv_frame(ctx, quant_mu_, {moments.frame(t)}, mu.height, mu.width, mu.frame(t));
  return mu;
}

}  // namespace vae

namespace {

constexpr int64_t kChunkFrames = vae::kEncodeChunkFrames;
constexpr int64_t kMaxVideoExtent = 1 << 20;

void check_video(const TensorView& video, const WanVaeConfig& config) {
  if (video.dtype() != DType::kF32 || !video.is_contiguous() || video.dim() != 5)
    fail_argument("video", "a contiguous fp32 tensor (batch, channels, frames, height, width)", video.describe());
  const int64_t channels = config.in_channels / (config.patch_size * config.patch_size);
  if (video.size(0) < 1) fail_argument("video", "a batch of at least 1", video.describe());
  if (video.size(1) != channels) fail_argument("video", detail::concat(channels, " channels"), video.describe());
  const int64_t frames = video.size(2);
  if (frames < 1 || frames > kMaxVideoExtent || (frames - 1) % kChunkFrames != 0)
    fail_argument("video", "1 + 4k frames (the first frame, then chunks of 4)", video.describe());
  const int64_t stride = vae::spatial_factor(config);
  for (int64_t d = 3; d < 5; ++d)
    if (video.size(d) < stride || video.size(d) > kMaxVideoExtent || video.size(d) % stride != 0)
      fail_argument("video", detail::concat("height and width multiples of ", stride, " (the VAE's spatial_compression)"),
                    video.describe());
  // A chunk of 4 frames must reach every temporal downsampler with at least 2 (diffusers fails too).
  if (kChunkFrames % vae::temporal_factor(config) != 0)
    fail_argument("Wan VAE config: temperal_downsample", "at most two temporal stages to encode (chunks of 4 frames)",
                  detail::concat(vae::temporal_factor(config), " frames per latent frame"));
}

}  // namespace

Shape WanVae::encoded_shape(const Shape& video_shape) const {
  if (video_shape.size() != 5) fail_argument("video shape", "(batch, channels, frames, height, width)", shape_str(video_shape));
  const int64_t spatial = vae::spatial_factor(config_), per_chunk = kChunkFrames / vae::temporal_factor(config_);
  return {video_shape[0], config_.z_dim, 1 + (video_shape[2] - 1) / kChunkFrames * per_chunk, video_shape[3] / spatial,
          video_shape[4] / spatial};
}

Tensor WanVae::encode(const ExecContext& ctx, const TensorView& video, const WanDecodeControl* control) const {
  check_video(video, config_);
  Tensor mu = Tensor::empty(encoded_shape(video.shape()), DType::kF32, video.device());
  if (!encode(ctx, video, mu.view(), control)) return Tensor();
  return mu;
}

bool WanVae::encode(const ExecContext& ctx, const TensorView& video, const TensorView& mu, const WanDecodeControl* control) const {
  check_video(video, config_);
  if (!encoder_) fail_argument("WanVae::encode", "a VAE built with its encoder (WanVaeParts::kDecoderAndEncoder)", "a decoder-only VAE");
  if (video.device().is_cuda()) return encode_on_device(ctx, video, mu, control);
  if (ctx.device.is_cuda()) fail_argument("video", "a tensor on the context's device " + ctx.device.str(), video.describe());
  const Shape expected = encoded_shape(video.shape());
  if (mu.dtype() != DType::kF32 || !mu.device().is_cpu() || !mu.is_contiguous() || mu.shape() != expected)
    fail_argument("mu", "a contiguous fp32 CPU tensor " + shape_str(expected), mu.describe());
  const int64_t batch = video.size(0), channels = video.size(1), frames = video.size(2), height = video.size(3),
                width = video.size(4);
  const int64_t patch = config_.patch_size, chunks = 1 + (frames - 1) / kChunkFrames;
  const int64_t z = config_.z_dim, latent_frames = expected[2], latent_height = expected[3], latent_width = expected[4];
  const float* in = video.data_as<const float>();
  float* out = mu.data_as<float>();
  for (int64_t b = 0; b < batch; ++b) {
    vae::FeatureCache cache(encoder_->cache_slots());
    int64_t written = 0;
    for (int64_t i = 0; i < chunks; ++i) {
      if (control != nullptr && control->cancelled()) return false;
      const int64_t first = i == 0 ? 0 : 1 + (i - 1) * kChunkFrames, count = i == 0 ? 1 : kChunkFrames;
      // Patchified as diffusers' patchify: video pixel (y, x) of colour c becomes channel
      // (c * patch + x % patch) * patch + y % patch of pixel (y / patch, x / patch); patch 1 copies.
      vae::FeatureFrames chunk(count, config_.in_channels, height / patch, width / patch);
      for (int64_t f = 0; f < count; ++f)
        for (int64_t c = 0; c < channels; ++c)
          for (int64_t y = 0; y < height; ++y) {
            const float* row = in + (((b * channels + c) * frames + first + f) * height + y) * width;
            for (int64_t x = 0; x < width; ++x)
              chunk.pixel(f, y / patch, x / patch)[(c * patch + x % patch) * patch + y % patch] = row[x];
          }
      const vae::FeatureFrames latent = encoder_->chunk(ctx, chunk, cache);
      if (written + latent.count > latent_frames)
        throw Error(detail::concat("Wan VAE: encoded more than the ", latent_frames, " latent frames expected"));
      for (int64_t t = 0; t < latent.count; ++t, ++written)
        for (int64_t c = 0; c < z; ++c)
          for (int64_t y = 0; y < latent_height; ++y)
            for (int64_t x = 0; x < latent_width; ++x)
              out[(((b * z + c) * latent_frames + written) * latent_height + y) * latent_width + x] = latent.pixel(t, y, x)[c];
      if (control != nullptr && control->on_chunk) control->on_chunk(b * chunks + i + 1, batch * chunks);
    }
    if (written != latent_frames) throw Error(detail::concat("Wan VAE: encoded ", written, " latent frames, expected ", latent_frames));
  }
  return true;
}

Tensor WanVae::normalize_latents(const TensorView& mu) const {
  if (mu.dtype() != DType::kF32 || !mu.device().is_cpu() || !mu.is_contiguous() || mu.dim() != 5 || mu.size(1) != config_.z_dim)
    fail_argument("mu", detail::concat("a contiguous fp32 CPU tensor (batch, ", config_.z_dim, " (z_dim), frames, height, width)"),
                  mu.describe());
  Tensor latents = Tensor::empty(mu.shape(), DType::kF32);
  const int64_t plane = mu.size(2) * mu.size(3) * mu.size(4);
  const float* in = mu.data_as<const float>();
  float* out = latents.data_as<float>();
  for (int64_t b = 0; b < mu.size(0); ++b)
    for (int64_t c = 0; c < config_.z_dim; ++c) {
      // As WanImageToVideoPipeline: (mu - mean) * (1 / std), the inverse rounded to fp32 first.
      const float mean = config_.latents_mean[static_cast<size_t>(c)];
      const float inverse_std = 1.0f / config_.latents_std[static_cast<size_t>(c)];
      const int64_t offset = (b * config_.z_dim + c) * plane;
      for (int64_t i = 0; i < plane; ++i) out[offset + i] = (in[offset + i] - mean) * inverse_std;
    }
  return latents;
}

}  // namespace tessel
