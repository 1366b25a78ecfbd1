#include "cuda/wan_vae_cuda.h"

#include "cuda/vae_kernels.h"
#include "cuda/vae_row_split.h"
#include "tessel/core/error.h"
#include "tessel/kernels/cuda/device_guard.h"
#include "wan_vae_layout.h"

namespace tessel::vae::cuda {

CudaDecoder::CudaDecoder(const WanVaeConfig& config, const WeightMap& weights, Device device)
    : device_(device), z_dim_(config.z_dim), patch_(config.patch_size) {
  const tessel::cuda::DeviceGuard guard(device.index);
  convolutions_ = std::make_unique<CudnnConvolutions>();  // opens cuDNN first: no upload when it is missing
  std::vector<float> inverse_std(config.latents_std.size());
  for (size_t c = 0; c < inverse_std.size(); ++c) inverse_std[c] = 1.0f / config.latents_std[c];
  const auto to_device = [&](const std::vector<float>& values) {
    Tensor host = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kF32);
    std::copy(values.begin(), values.end(), host.data_as<float>());
    return host.to(device);
  };
  mean_ = to_device(config.latents_mean);
  inverse_std_ = to_device(inverse_std);

  SlotCounter slots;
  const std::vector<DecoderStage> layout = decoder_stages(config);
  post_quant_ = DeviceConv(weights, "post_quant_conv", 1, 1, 1, slots, device);
  conv_in_ = DeviceConv(weights, "decoder.conv_in", 3, 3, 3, slots, device);
  mid_ = std::make_unique<DeviceMidBlock>(weights, "decoder.mid_block", layout[0].in_dim, slots, device);
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::string prefix = "decoder.up_blocks." + std::to_string(i);
    UpStage stage;
    for (int64_t r = 0; r <= config.num_res_blocks; ++r)
      stage.resnets.emplace_back(weights, prefix + ".resnets." + std::to_string(r), r == 0 ? layout[i].in_dim : layout[i].out_dim,
                                 layout[i].out_dim, slots, device);
    if (layout[i].upsample)
      stage.upsampler = std::make_unique<DeviceUpsampler>(weights, prefix + "." + layout[i].upsampler_name, layout[i].temporal,
                                                          slots, device);
    stage.duplicate_shortcut = layout[i].duplicate_shortcut;
    stage.out_dim = layout[i].upsample_dim;
    stage.time_factor = layout[i].temporal ? 2 : 1;
    stages_.push_back(std::move(stage));
  }
  norm_out_ = upload(weights, "decoder.norm_out.gamma", device);
  conv_out_ = DeviceConv(weights, "decoder.conv_out", 3, 3, 3, slots, device);
  slots_ = slots.next;
}

CudaDecoder::~CudaDecoder() {
  const tessel::cuda::DeviceGuard guard(device_.index);
  buffers_.free_kept();
}

bool CudaDecoder::decode(cudaStream_t stream, const float* latents, int64_t frames, int64_t height, int64_t width, float* video,
                         int64_t video_frames, bool tf32, const WanDecodeControl* control, Communicator* group) const {
  const std::lock_guard lock(mutex_);
  const tessel::cuda::DeviceGuard guard(device_.index);
  // Buffers kept for another latent size would not be asked for again: give them back first.
  if (last_latent_size_ != std::pair{height, width}) buffers_.free_kept();
  last_latent_size_ = std::pair{height, width};
  {
    std::optional<DeviceRowSplit> split;
    if (group != nullptr) split.emplace(*group, device_, height);
    const DecodeContext dc{*convolutions_, buffers_, stream, tf32, split ? &*split : nullptr};
    DeviceCache cache(static_cast<size_t>(slots_));
    DeviceFrames denormalized = dc.frames(z_dim_, frames, height, width);
    launch_denormalize(latents, mean_.data_as<const float>(), inverse_std_.data_as<const float>(), denormalized.data(), z_dim_,
                       frames * height * width, stream);
    // post_quant_conv over every latent frame at once, then the decoder one latent frame at a time.
    const DeviceFrames quantized = post_quant_.forward(dc, denormalized, cache);
    denormalized = DeviceFrames();
    int64_t written = 0;
    for (int64_t t = 0; t < frames; ++t) {
      const bool cancelled = control != nullptr && control->cancelled();
      if (split ? split->any(dc, cancelled) : cancelled) {
        check_cuda(cudaStreamSynchronize(stream), "the decode on the device");
        return false;
      }
      DeviceFrames x = dc.frames(z_dim_, 1, height, width);
      launch_copy_frames(quantized.data(), frames, t, x.data(), 1, 0, 1, z_dim_, height * width, stream);
      if (split) x = split->band_of(dc, x);  // this rank's latent rows
      x = mid_->forward(dc, conv_in_.forward(dc, x, cache), cache);
      for (const UpStage& stage : stages_) {
        // Only a residual up block reads its input after its blocks: elsewhere the input's buffer
        // goes back to the pool as soon as the first block has read it.
        DeviceFrames input;
        if (stage.duplicate_shortcut) input = std::move(x);
        const DeviceFrames* block_input = stage.duplicate_shortcut ? &input : &x;
        for (const DeviceResidualBlock& block : stage.resnets) {
          x = block.forward(dc, *block_input, cache);
          block_input = &x;
        }
        if (stage.upsampler) x = stage.upsampler->forward(dc, x, cache);
        if (stage.duplicate_shortcut) {
          // The kernel reads the input at positions derived from the output's shape: shapes that
          // disagree would read past the input.
          const int64_t dropped = t == 0 ? stage.time_factor - 1 : 0;
          if (x.channels != stage.out_dim || x.frames != input.frames * stage.time_factor - dropped || x.height != 2 * input.height ||
              x.width != 2 * input.width)
            throw Error(detail::concat("Wan VAE CUDA decode: an up block made (", x.channels, ", ", x.frames, ", ", x.height, ", ",
                                       x.width, ") from (", input.channels, ", ", input.frames, ", ", input.height, ", ",
                                       input.width, "), which its duplicated input does not match"));
          launch_add_duplicate_upsample(input.data(), input.channels, input.frames, input.height, input.width, x.data(),
                                        stage.out_dim, stage.time_factor, t == 0, stream);
          check_launch("duplicate upsampling");
        }
      }
      launch_rms_norm(x.data(), x.data(), norm_out_.data_as<const float>(), x.channels, x.frames * x.plane(), true, stream);
      DeviceFrames decoded = conv_out_.forward(dc, x, cache);
      if (split) decoded = split->whole(dc, decoded);  // every rank's band of the chunk
      if (written + decoded.frames > video_frames)
        throw Error(detail::concat("Wan VAE CUDA decode: chunk ", t, " decoded ", decoded.frames, " frames past the video's ", video_frames));
      launch_unpatchify_clamp_into(decoded.data(), video, decoded.channels / (patch_ * patch_), decoded.frames, video_frames, written,
                                   decoded.height, decoded.width, patch_, stream);
      check_launch("output");
      written += decoded.frames;
      if (control != nullptr && control->on_chunk) {
        check_cuda(cudaStreamSynchronize(stream), "a chunk of the decode");
        control->on_chunk(t + 1, frames);
      }
    }
    if (written != video_frames)
      throw Error(detail::concat("Wan VAE CUDA decode: decoded ", written, " frames, expected ", video_frames));
  }
  check_cuda(cudaStreamSynchronize(stream), "the decode on the device");
  return true;
}

}  // namespace tessel::vae::cuda
