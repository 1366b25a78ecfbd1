// What image-to-video adds to a Wan generation, as diffusers' WanImageToVideoPipeline prepares it
// (prepare_latents and encode_image): the image in pixels at the video's size, the conditioning
// video (the image as the first frame, FLF2V's last image as the last, zeros between) through the
// VAE's encoder, the 4-channel frame mask that says which latent frames hold a given frame, and the
// two concatenated on channels as the channels every forward takes after the noisy latents.
#pragma once

#include <cstdint>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"
#include "tessel/diffusion/video_frames.h"
#include "tessel/diffusion/wan_vae.h"

namespace tessel {

// One 8-bit RGB image (frames.count == 1) as (1, 3, height, width) fp32 in [-1, 1]: resized with
// Pillow's Lanczos filter when its size is another (diffusers' VaeImageProcessor.resize, which
// does not keep the aspect ratio: give an image of the video's aspect to keep it), then x / 255 * 2 - 1.
// Throws Error naming `name` when it is not one well-formed frame.
Tensor wan_image_pixels(const VideoFrames& image, int64_t height, int64_t width, const char* name);

// (1, 4, 1 + (frames - 1) / 4, latent_height, latent_width): ones where the latent frame holds a
// given pixel frame, zeros elsewhere. Pixel frame 0 (and frames - 1 with a last image) is given;
// the first pixel frame counts four times so that 4 x latent frames mask entries exist, and entry
// 4 t + c is channel c of latent frame t (diffusers' repeat_interleave, view and transpose).
Tensor wan_frame_mask(int64_t frames, int64_t latent_height, int64_t latent_width, bool last_frame_given);

// The conditioning video (1, 3, frames, H, W) of `first` and `last` (each (1, 3, H, W); `last`
// undefined without FLF2V's last image) through `vae`'s encoder, normalized with the VAE's latent
// statistics, after the frame mask on channels: (1, 4 + z_dim, latent frames, H / s, W / s), a
// host tensor. The encoder runs on ctx's device: on a CUDA context the video is encoded there (the
// CPU encodes, with a warning, when the device encoder is unavailable), else on the CPU. Returns an
// undefined tensor when `control` cancelled the encode.
Tensor wan_image_condition(const ExecContext& ctx, const WanVae& vae, const Tensor& first, const Tensor& last, int64_t frames,
                           const WanDecodeControl* control = nullptr);

// TI2V's first frame (diffusers' expand_timesteps): `image` (1, 3, H, W) as a one-frame video
// through `vae`'s encoder on ctx's device (as wan_image_condition), normalized: (1, z_dim, 1,
// H / s, W / s), a host tensor. Returns an undefined tensor when `control` cancelled the encode.
Tensor wan_first_frame_latents(const ExecContext& ctx, const WanVae& vae, const Tensor& image,
                               const WanDecodeControl* control = nullptr);

}  // namespace tessel
