// The image-to-video condition (see wan_image_condition.h).
#include "tessel/diffusion/wan_image_condition.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tessel/core/allocator.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/diffusion/pil_resize.h"

namespace tessel {
namespace {

// The host video (B, 3, F, H, W) through the VAE's encoder where the generation runs: on a CUDA
// context the video goes up once and mu comes back once; should the device encoder be unavailable
// (no cuDNN), the CPU encodes, with a warning, as WanPipeline's decode falls back. Returns mu on
// the host, or an undefined tensor when `control` cancelled the encode.
Tensor encoded_mu(const ExecContext& ctx, const WanVae& vae, const TensorView& video, const WanDecodeControl* control) {
  if (ctx.device.is_cuda()) {
    try {
      Tensor on_device = Tensor::empty(video.shape(), DType::kF32, ctx.device);
      copy_bytes(on_device.data(), ctx.device, video.data(), Device::cpu(), video.nbytes());
      const Tensor mu = vae.encode(ctx, on_device, control);
      return mu.defined() ? mu.to(Device::cpu()) : Tensor{};
    } catch (const Error& e) {
      ctx.log(LogLevel::kWarning, std::string("the VAE encodes on the CPU: the CUDA encoder failed: ") + e.what());
    }
  }
  return vae.encode(ctx.on_cpu(), video, control);
}

}  // namespace

Tensor wan_image_pixels(const VideoFrames& image, int64_t height, int64_t width, const char* name) {
  try {
    image.validate();
  } catch (const std::exception& e) {
    throw Error(std::string(name) + ": " + e.what());
  }
  if (image.count != 1) fail_argument(name, "one image", detail::concat(image.count, " frames"));
  std::vector<uint8_t> resized;
  const uint8_t* rgb = image.frame(0);
  if (image.height != height || image.width != width) {
    resized = resize_pil(rgb, image.height, image.width, height, width, PilFilter::kLanczos);
    rgb = resized.data();
  }
  Tensor pixels = Tensor::empty({1, 3, height, width}, DType::kF32);
  float* planes = pixels.data_as<float>();
  for (int64_t channel = 0; channel < 3; ++channel)
    for (int64_t i = 0; i < height * width; ++i) {
      // numpy's order: the byte / 255 in fp32, then 2 x - 1.
      const float unit = static_cast<float>(rgb[i * 3 + channel]) / 255.0f;
      planes[channel * height * width + i] = 2.0f * unit - 1.0f;
    }
  return pixels;
}

Tensor wan_frame_mask(int64_t frames, int64_t latent_height, int64_t latent_width, bool last_frame_given) {
  if (frames < 1 || (frames - 1) % 4 != 0) fail_argument("frames", "4k + 1", frames);
  const int64_t latent_frames = (frames - 1) / 4 + 1;
  // The pixel frames' flags with the first repeated four times: 4 x latent_frames entries.
  std::vector<float> entries(static_cast<size_t>(frames + 3), 0.0f);
  std::fill_n(entries.begin(), 4, 1.0f);
  if (last_frame_given && frames > 1) entries.back() = 1.0f;
  const int64_t plane = latent_height * latent_width;
  Tensor mask = Tensor::empty({1, 4, latent_frames, latent_height, latent_width}, DType::kF32);
  float* out = mask.data_as<float>();
  for (int64_t channel = 0; channel < 4; ++channel)
    for (int64_t t = 0; t < latent_frames; ++t)
      std::fill_n(out + (channel * latent_frames + t) * plane, plane, entries[static_cast<size_t>(4 * t + channel)]);
  return mask;
}

Tensor wan_image_condition(const ExecContext& ctx, const WanVae& vae, const Tensor& first, const Tensor& last, int64_t frames,
                           const WanDecodeControl* control) {
  const int64_t height = first.size(2), width = first.size(3), plane = height * width;
  if (last.defined() && last.shape() != first.shape())
    fail_argument("last image", "the first image's shape " + shape_str(first.shape()), last.view().describe());
  if (last.defined() && frames < 2) fail_argument("frames", "at least 5 with a last image", frames);
  Tensor video = Tensor::zeros({1, 3, frames, height, width}, DType::kF32);
  for (int64_t channel = 0; channel < 3; ++channel) {
    float* frames_of_channel = video.data_as<float>() + channel * frames * plane;
    std::memcpy(frames_of_channel, first.data_as<float>() + channel * plane, static_cast<size_t>(plane) * sizeof(float));
    if (last.defined())
      std::memcpy(frames_of_channel + (frames - 1) * plane, last.data_as<float>() + channel * plane,
                  static_cast<size_t>(plane) * sizeof(float));
  }
  const Tensor mu = encoded_mu(ctx, vae, video, control);
  if (!mu.defined()) return {};
  const Tensor latents = vae.normalize_latents(mu);
  const Tensor mask = wan_frame_mask(frames, latents.size(3), latents.size(4), last.defined());
  Shape shape = latents.shape();
  shape[1] += 4;
  Tensor condition = Tensor::empty(shape, DType::kF32);
  std::memcpy(condition.data(), mask.data(), mask.nbytes());
  std::memcpy(static_cast<char*>(condition.data()) + mask.nbytes(), latents.data(), latents.nbytes());
  return condition;
}

Tensor wan_first_frame_latents(const ExecContext& ctx, const WanVae& vae, const Tensor& image, const WanDecodeControl* control) {
  const TensorView one_frame(image.data(), DType::kF32, Device::cpu(), {1, 3, 1, image.size(2), image.size(3)});
  const Tensor mu = encoded_mu(ctx, vae, one_frame, control);
  return mu.defined() ? vae.normalize_latents(mu) : Tensor{};
}

}  // namespace tessel
