#include "cuda/wan_vae_cuda_encoder.h"

#include <cstring>

#include "cuda/vae_kernels.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "wan_vae_encoder.h"
#include "wan_vae_layout.h"

namespace tessel::vae::cuda {
namespace {

// quant_conv's first z_dim output channels (its weight is (out, in, 1, 1, 1): the first z_dim rows),
// under the name "quant_mu": the posterior's mean; the log-variance half is never needed.
WeightMap quant_mu_weights(const WeightMap& weights, int64_t z_dim) {
  WeightMap mu;
  for (const char* part : {"weight", "bias"}) {
    const auto found = weights.find(std::string("quant_conv.") + part);
    if (found == weights.end()) throw Error(std::string("Wan VAE: no weight named quant_conv.") + part);
    const Tensor& full = found->second;
    Shape shape = full.shape();
    shape[0] = z_dim;
    Tensor half = Tensor::empty(shape, DType::kF32);
    std::memcpy(half.data(), full.data(), half.nbytes());
    mu[std::string("quant_mu.") + part] = std::move(half);
  }
  return mu;
}

}  // namespace

CudaEncoder::CudaEncoder(const WanVaeConfig& config, const WeightMap& weights, Device device)
    : device_(device), z_dim_(config.z_dim), in_channels_(config.in_channels), patch_(config.patch_size),
      spatial_(spatial_factor(config)) {
  const tessel::cuda::DeviceGuard guard(device.index);
  convolutions_ = std::make_unique<CudnnConvolutions>();  // opens cuDNN first: no upload when it is missing
  SlotCounter slots;
  conv_in_ = DeviceConv(weights, "encoder.conv_in", 3, 3, 3, slots, device);
  int64_t dim = config.base_dim;
  for (const EncoderStage& layout : encoder_stages(config)) {
    Stage stage;
    for (size_t r = 0; r < layout.resnet_names.size(); ++r)
      stage.resnets.emplace_back(weights, layout.resnet_names[r], r == 0 ? layout.in_dim : layout.out_dim, layout.out_dim, slots, device);
    if (layout.downsample)
      stage.downsampler = std::make_unique<DeviceDownsampler>(weights, layout.downsampler_name, layout.temporal, slots, device);
    stage.average_shortcut = layout.average_shortcut;
    stage.out_dim = layout.out_dim;
    stage.time_factor = layout.temporal ? 2 : 1;
    stage.space_factor = layout.downsample ? 2 : 1;
    stages_.push_back(std::move(stage));
    dim = layout.out_dim;
  }
  mid_ = std::make_unique<DeviceMidBlock>(weights, "encoder.mid_block", dim, slots, device);
  norm_out_ = upload(weights, "encoder.norm_out.gamma", device);
  conv_out_ = DeviceConv(weights, "encoder.conv_out", 3, 3, 3, slots, device);
  quant_mu_ = DeviceConv(quant_mu_weights(weights, z_dim_), "quant_mu", 1, 1, 1, slots, device);
  slots_ = slots.next;
}

CudaEncoder::~CudaEncoder() {
  const tessel::cuda::DeviceGuard guard(device_.index);
  buffers_.free_kept();
}

DeviceFrames CudaEncoder::chunk(const DecodeContext& dc, DeviceFrames x, DeviceCache& cache) const {
  x = conv_in_.forward(dc, x, cache);
  for (const Stage& stage : stages_) {
    // Only a residual down block reads its input after its blocks: elsewhere the input's buffer goes
    // back to the pool as soon as the first block has read it.
    DeviceFrames input;
    if (stage.average_shortcut) input = std::move(x);
    const DeviceFrames* block_input = stage.average_shortcut ? &input : &x;
    for (const DeviceResidualBlock& block : stage.resnets) {
      x = block.forward(dc, *block_input, cache);
      block_input = &x;
    }
    if (stage.downsampler) x = stage.downsampler->forward(dc, x, cache);
    if (stage.average_shortcut) {
      // The kernel reads the input at positions derived from the output's shape: shapes that
      // disagree would read past the input.
      const int64_t frames = (input.frames + stage.time_factor - 1) / stage.time_factor;
      if (x.channels != stage.out_dim || x.frames != frames || x.height * stage.space_factor != input.height ||
          x.width * stage.space_factor != input.width)
        throw Error(detail::concat("Wan VAE CUDA encode: a down block made (", x.channels, ", ", x.frames, ", ", x.height, ", ", x.width,
                                   ") from (", input.channels, ", ", input.frames, ", ", input.height, ", ", input.width,
                                   "), which its averaged input does not match"));
      launch_add_average_downsample(input.data(), input.channels, input.frames, input.height, input.width, x.data(), stage.out_dim,
                                    stage.time_factor, stage.space_factor, dc.stream);
      check_launch("average downsampling");
    }
  }
  x = mid_->forward(dc, x, cache);
  launch_rms_norm(x.data(), x.data(), norm_out_.data_as<const float>(), x.channels, x.frames * x.plane(), true, dc.stream);
  const DeviceFrames moments = conv_out_.forward(dc, x, cache);
  return quant_mu_.forward(dc, moments, cache);
}

bool CudaEncoder::encode(cudaStream_t stream, const float* video, int64_t batch, int64_t frames, int64_t height, int64_t width,
                         float* mu, int64_t latent_frames, bool tf32, const WanDecodeControl* control) const {
  const std::lock_guard lock(mutex_);
  const tessel::cuda::DeviceGuard guard(device_.index);
  const int64_t colours = in_channels_ / (patch_ * patch_), chunks = 1 + (frames - 1) / kEncodeChunkFrames;
  const int64_t video_size = colours * frames * height * width;
  const int64_t latent_height = height / spatial_, latent_width = width / spatial_;
  const int64_t mu_size = z_dim_ * latent_frames * latent_height * latent_width;
  bool finished = true;
  {
    const DecodeContext dc{*convolutions_, buffers_, stream, tf32};
    for (int64_t b = 0; b < batch && finished; ++b) {
      DeviceCache cache(static_cast<size_t>(slots_));
      int64_t written = 0;
      for (int64_t i = 0; i < chunks; ++i) {
        if (control != nullptr && control->cancelled()) {
          finished = false;
          break;
        }
        const int64_t first = i == 0 ? 0 : 1 + (i - 1) * kEncodeChunkFrames, count = i == 0 ? 1 : kEncodeChunkFrames;
        DeviceFrames x = dc.frames(in_channels_, count, height / patch_, width / patch_);
        launch_patchify_frames(video + b * video_size, colours, frames, first, count, height, width, patch_, x.data(), stream);
        check_launch("patchify");
        const DeviceFrames latent = chunk(dc, std::move(x), cache);
        if (written + latent.frames > latent_frames || latent.height != latent_height || latent.width != latent_width)
          throw Error(detail::concat("Wan VAE CUDA encode: chunk ", i, " encoded ", latent.frames, " latent frames of ", latent.height,
                                     " x ", latent.width, " after ", written, ", expected ", latent_frames, " of ", latent_height, " x ",
                                     latent_width));
        launch_copy_frames(latent.data(), latent.frames, 0, mu + b * mu_size, latent_frames, written, latent.frames, z_dim_,
                           latent.plane(), stream);
        check_launch("output");
        written += latent.frames;
        if (control != nullptr && control->on_chunk) {
          check_cuda(cudaStreamSynchronize(stream), "a chunk of the encode");
          control->on_chunk(b * chunks + i + 1, batch * chunks);
        }
      }
      if (finished && written != latent_frames)
        throw Error(detail::concat("Wan VAE CUDA encode: encoded ", written, " latent frames, expected ", latent_frames));
    }
  }
  check_cuda(cudaStreamSynchronize(stream), "the encode on the device");
  // An encode comes once per request, before the denoising loop: the activations it kept (some GB
  // for 81 frames at 480p) go back to the device now rather than sit beside the transformer's.
  buffers_.free_kept();
  return finished;
}

}  // namespace tessel::vae::cuda
