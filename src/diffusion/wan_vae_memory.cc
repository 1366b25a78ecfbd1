// The Wan VAE's memory and arithmetic estimates (wan_vae_memory.h), walking the stages as
// wan_vae.cc / wan_vae_encoder.cc (CPU) and cuda/wan_vae_cuda.cc (CUDA) run them.
#include "tessel/diffusion/wan_vae_memory.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/dit/checkpoint.h"
#include "wan_vae_layout.h"

namespace tessel {
namespace {

// One chunk's walk through a half of the VAE: the feature cache it leaves (every causal convolution
// of three frames keeps the last two frames it read), the largest set of buffers alive at once in
// each stage, and the arithmetic. Sizes in floats.
class ChunkWalk {
 public:
  explicit ChunkWalk(bool cuda) : cuda_(cuda) {}

  // Floats of `frames` frames of `channels` at height x width: the CPU's frames carry a zero border
  // one pixel wide (wan_vae_ops.h), the device's do not.
  double frames(double count, int64_t channels, int64_t height, int64_t width) const {
    const double pixels = cuda_ ? static_cast<double>(height * width) : static_cast<double>((height + 2) * (width + 2));
    return count * static_cast<double>(channels) * pixels;
  }

  // A causal convolution of three frames over `in` channels of `f` frames: the two it keeps, and
  // what it holds while it runs beside the `around` floats already alive (CPU: the new history
  // copied before the old one goes; CUDA: the input with its two cached frames before it, the next
  // history and the output).
  double causal_conv(double around, int64_t in, int64_t out, double f, int64_t height, int64_t width) {
    const double next = history(in, height, width);
    return cuda_ ? around + frames(f + 2, in, height, width) + next + frames(f, out, height, width)
                 : around + next + frames(f, out, height, width);
  }
  // The two frames of `in` channels a causal convolution keeps; returns the floats of the next
  // history, made before the old one is given back.
  double history(int64_t in, int64_t height, int64_t width) {
    cache_ += frames(2, in, height, width);
    return frames(2, in, height, width);
  }

  // WanResidualBlock (in -> out channels) on `f` frames, its input `x` alive beside `around`.
  void residual_block(double around, int64_t in, int64_t out, double f, int64_t height, int64_t width) {
    const double x = frames(f, in, height, width);
    // conv1 reads the normalized copy h of x; conv2 reads h normalized again; the 1x1x1 shortcut
    // (channel change) is computed beside them.
    const double h1 = frames(f, in, height, width), h2 = frames(f, out, height, width);
    const double shortcut = in != out ? frames(f, out, height, width) : 0.0;
    stage(causal_conv(around + x + h1, in, out, f, height, width));
    stage(causal_conv(around + x + h2 + (cuda_ ? shortcut : 0.0), out, out, f, height, width));
    if (in != out) stage(around + x + h2 + shortcut + frames(f, out, height, width));
  }

  // A live set inside the current stage.
  void stage(double floats) { stage_peak_ = std::max(stage_peak_, floats); }
  // The stage is over: the CPU frees its buffers; the CUDA pool keeps them for the next chunk (the
  // next stage asks for other sizes).
  void end_stage() {
    activations_ = cuda_ ? activations_ + stage_peak_ : std::max(activations_, stage_peak_);
    stage_peak_ = 0.0;
  }
  // Buffers alive for the whole call (the quantized latents).
  void keep(double floats) { cache_ += floats; }

  // 2 x multiply-adds of a convolution of `taps` taps over `frames` output frames.
  void conv_flop(int64_t in, int64_t out, int64_t taps, double frames, int64_t height, int64_t width) {
    flop_ += 2.0 * static_cast<double>(in) * static_cast<double>(out) * static_cast<double>(taps) * frames *
             static_cast<double>(height * width);
  }
  void add_flop(double flop) { flop_ += flop; }

  WanVaeCost cost(double output_floats) {
    end_stage();
    return {4.0 * (cache_ + activations_), 4.0 * output_floats, flop_};
  }

 private:
  bool cuda_;
  double cache_ = 0.0, activations_ = 0.0, stage_peak_ = 0.0, flop_ = 0.0;
};

// The flop of WanResidualBlock over `frames` frames in total.
void residual_flop(ChunkWalk& walk, int64_t in, int64_t out, double frames, int64_t height, int64_t width) {
  walk.conv_flop(in, out, 27, frames, height, width);
  walk.conv_flop(out, out, 27, frames, height, width);
  if (in != out) walk.conv_flop(in, out, 1, frames, height, width);
}

// The mid block: two residual blocks around one head of attention over each frame's pixels (CPU:
// the packed tokens, q/k/v and the output; CUDA also the (pixels x pixels) scores).
void mid_block(ChunkWalk& walk, int64_t dim, double f, double total_frames, int64_t height, int64_t width, bool cuda) {
  walk.residual_block(0.0, dim, dim, f, height, width);
  const double pixels = static_cast<double>(height * width), channels = static_cast<double>(dim);
  walk.stage(walk.frames(2 * f, dim, height, width) + 6.0 * pixels * channels + (cuda ? pixels * pixels : 0.0));
  walk.residual_block(0.0, dim, dim, f, height, width);
  residual_flop(walk, dim, dim, 2 * total_frames, height, width);
  walk.conv_flop(dim, 4 * dim, 1, total_frames, height, width);  // to_qkv and proj
  walk.add_flop(4.0 * pixels * pixels * channels * total_frames);
  walk.end_stage();
}

void check_shape(const Shape& shape, const char* name) {
  if (shape.size() != 5) fail_argument(name, "(batch, channels, frames, height, width)", shape_str(shape));
  for (int64_t extent : shape)
    if (extent < 1) fail_argument(name, "positive extents", shape_str(shape));
}

}  // namespace

WanVaeCost wan_vae_decode_cost(const WanVaeConfig& config, const Shape& latent_shape, Device device) {
  check_shape(latent_shape, "latent shape");
  const bool cuda = device.is_cuda();
  ChunkWalk walk(cuda);
  const int64_t z = config.z_dim, latent_frames = latent_shape[2];
  int64_t height = latent_shape[3], width = latent_shape[4];
  // post_quant_conv over every latent frame at once: the de-normalized and the quantized latents stay
  // for the whole decode (the CUDA pool keeps the first's buffer).
  walk.keep(walk.frames(2.0 * static_cast<double>(latent_frames), z, height, width));
  walk.conv_flop(z, z, 1, static_cast<double>(latent_frames), height, width);
  // Every chunk after the first carries one latent frame, doubled by each temporal upsampler; the
  // whole video's frames at a stage: T, then 2 (T - 1) + 1 after each.
  double f = 1.0, total = static_cast<double>(latent_frames);
  const std::vector<vae::DecoderStage> layout = vae::decoder_stages(config);
  const int64_t first_dim = layout.front().in_dim;
  walk.stage(walk.causal_conv(walk.frames(f, z, height, width), z, first_dim, f, height, width));  // conv_in
  walk.conv_flop(z, first_dim, 27, total, height, width);
  mid_block(walk, first_dim, f, total, height, width, cuda);
  for (const vae::DecoderStage& stage : layout) {
    // A residual up block keeps its input until the duplicated shortcut is added.
    const double input = stage.duplicate_shortcut ? walk.frames(f, stage.in_dim, height, width) : 0.0;
    for (int64_t r = 0; r <= config.num_res_blocks; ++r) {
      const int64_t in = r == 0 ? stage.in_dim : stage.out_dim;
      walk.residual_block(input, in, stage.out_dim, f, height, width);
      residual_flop(walk, in, stage.out_dim, total, height, width);
    }
    if (stage.upsample) {
      const int64_t c = stage.out_dim;
      const double x = walk.frames(f, c, height, width);
      double doubled = 0.0, after = f;
      if (stage.temporal) {
        // time_conv's two halves written into twice the frames (CUDA: its 2c-channel output with
        // the padded input, then the interleaved copy).
        after = 2 * f;
        doubled = walk.frames(after, c, height, width);
        const double next = walk.history(c, height, width);
        walk.stage(cuda ? input + x + walk.frames(f, 2 * c, height, width) +
                              std::max(walk.frames(f + 2, c, height, width) + next, doubled)
                        : input + x + doubled + next);
        walk.conv_flop(c, 2 * c, 3, total - 1, height, width);
        total = 2 * (total - 1) + 1;
      }
      // Nearest 2x upsampling (the CPU one frame at a time, the device all of them), then a 3x3
      // convolution to upsample_dim channels; a residual block adds the duplicated input beside it.
      const double upsampled = walk.frames(cuda ? after : 1.0, c, 2 * height, 2 * width);
      const double out = walk.frames(after, stage.upsample_dim, 2 * height, 2 * width);
      walk.stage(input + x + doubled + upsampled + out + (stage.duplicate_shortcut && !cuda ? out : 0.0));
      walk.conv_flop(c, stage.upsample_dim, 9, total, 2 * height, 2 * width);
      height *= 2, width *= 2, f = after;
    }
    walk.end_stage();
  }
  // norm_out in place, then conv_out to the (patched) colours.
  const int64_t last = layout.back().out_dim;
  walk.stage(walk.causal_conv(walk.frames(f, last, height, width), last, config.out_channels, f, height, width));
  walk.conv_flop(last, config.out_channels, 27, total, height, width);
  // The video: (T - 1) x temporal factor + 1 frames of the colours, spatial factor x the latents.
  const double spatial = static_cast<double>(vae::spatial_factor(config));
  const double video = static_cast<double>(config.out_channels / (config.patch_size * config.patch_size)) *
                       static_cast<double>((latent_frames - 1) * vae::temporal_factor(config) + 1) *
                       static_cast<double>(latent_shape[3]) * spatial * static_cast<double>(latent_shape[4]) * spatial;
  return walk.cost(video);
}

WanVaeCost wan_vae_encode_cost(const WanVaeConfig& config, const Shape& video_shape) {
  check_shape(video_shape, "video shape");
  ChunkWalk walk(false);
  const int64_t patch = config.patch_size, batch = video_shape[0];
  int64_t height = video_shape[3] / patch, width = video_shape[4] / patch;
  // Chunks of four frames after the first; the video's frames at a stage: F, then 1 + (F - 1) / 2
  // after each temporal downsampler.
  double f = 4.0, total = static_cast<double>(video_shape[2]);
  const double chunk = walk.frames(f, config.in_channels, height, width);
  walk.stage(walk.causal_conv(chunk, config.in_channels, config.base_dim, f, height, width));  // conv_in
  walk.conv_flop(config.in_channels, config.base_dim, 27, total, height, width);
  walk.end_stage();
  int64_t dim = config.base_dim;
  for (const vae::EncoderStage& stage : vae::encoder_stages(config)) {
    const double input = stage.average_shortcut ? walk.frames(f, stage.in_dim, height, width) : 0.0;
    for (size_t r = 0; r < stage.resnet_names.size(); ++r) {
      const int64_t in = r == 0 ? stage.in_dim : stage.out_dim;
      walk.residual_block(chunk + input, in, stage.out_dim, f, height, width);
      residual_flop(walk, in, stage.out_dim, total, height, width);
    }
    dim = stage.out_dim;
    if (stage.downsample) {
      // A 3x3 convolution of stride 2 per frame, then for a temporal stage (3, 1, 1) of stride 2 in
      // time over the last frame of the chunk before (which it keeps) and this chunk's.
      const double x = walk.frames(f, dim, height, width), halved = walk.frames(f, dim, height / 2, width / 2);
      walk.conv_flop(dim, dim, 9, total, height / 2, width / 2);
      height /= 2, width /= 2;
      if (stage.temporal) {
        walk.keep(walk.frames(1, dim, height, width));
        total = 1 + (total - 1) / 2;
        walk.conv_flop(dim, dim, 3, total - 1, height, width);
        walk.stage(chunk + input + x + halved + walk.frames(f / 2, dim, height, width));
        f /= 2;
      } else {
        walk.stage(chunk + input + x + halved);
      }
    }
    walk.end_stage();
  }
  mid_block(walk, dim, f, total, height, width, false);
  walk.stage(walk.causal_conv(chunk + walk.frames(f, dim, height, width), dim, 2 * config.z_dim, f, height, width));  // conv_out
  walk.conv_flop(dim, 2 * config.z_dim, 27, total, height, width);
  walk.conv_flop(2 * config.z_dim, config.z_dim, 1, total, height, width);  // quant_conv's mu half
  // The latents: 1 + (F - 1) / 4 x (4 / temporal factor) frames of z_dim at 1 / spatial factor.
  const int64_t spatial = vae::spatial_factor(config);
  const double latents = static_cast<double>(batch * config.z_dim) *
                         static_cast<double>(1 + (video_shape[2] - 1) / 4 * (4 / vae::temporal_factor(config))) *
                         static_cast<double>((video_shape[3] / spatial) * (video_shape[4] / spatial));
  WanVaeCost cost = walk.cost(latents);
  cost.flop *= static_cast<double>(batch);  // one video of the batch at a time: the same peak
  return cost;
}

namespace {

double parameter_bytes(const WanVaeConfig& config, bool encoder) {
  double floats = 0.0;
  for (const WeightSpec& spec : wan_vae_weight_specs(config)) {
    const bool of_encoder = spec.name.starts_with("encoder.") || spec.name.starts_with("quant_conv.");
    if (of_encoder == encoder) floats += static_cast<double>(shape_numel(spec.shape));
  }
  return 4.0 * floats;
}

}  // namespace

WanVaeHostWeights wan_vae_host_weight_bytes(const WanVaeConfig& config, WanVaeParts parts) {
  const double decoder = parameter_bytes(config, false);
  const double built = decoder + (parts == WanVaeParts::kDecoderAndEncoder ? parameter_bytes(config, true) : 0.0);
#ifdef TESSEL_VAE_CUDA
  const double upload_copy = decoder;  // the CUDA decoders' fp32 source, kept for a device's first decode
#else
  const double upload_copy = 0.0;
#endif
  return {built + upload_copy, 3.0 * built};
}

double wan_vae_device_weight_bytes(const WanVaeConfig& config) { return parameter_bytes(config, false); }

}  // namespace tessel
