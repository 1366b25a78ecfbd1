// The element-wise CUDA kernels of the Wan VAE's decoder and encoder (internal). A feature map is fp32
// (channels, frames, height, width), contiguous: one video of diffusers' (1, C, T, H, W) layout,
// which is what cuDNN's convolutions read and write. `plane` is height * width. Every launcher
// enqueues on `stream` and never synchronizes; callers check shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessel::vae::cuda {

// out[c, ...] = in[c, ...] / inverse_std[c] + mean[c] (WanPipeline's de-normalization, in its order
// of operations), over `per_channel` values of each of `channels` channels.
void launch_denormalize(const float* in, const float* mean, const float* inverse_std, float* out, int64_t channels,
                        int64_t per_channel, cudaStream_t stream);

// Over the channels of each of `pixels` positions (pixels = frames * plane): y = x / max(|x|, 1e-12)
// * sqrt(channels) * gamma, then SiLU when `silu` (diffusers' RMS_norm; y may alias x).
void launch_rms_norm(const float* x, float* y, const float* gamma, int64_t channels, int64_t pixels, bool silu,
                     cudaStream_t stream);

// y[c, p] += bias[c] (+ residual[c, p] when residual is non-null), p < pixels.
void launch_add_bias(float* y, const float* bias, const float* residual, int64_t channels, int64_t pixels, cudaStream_t stream);

// dst[c, dst_first + i] = src[c, src_first + i] for i < count (frames of `plane` values); a null
// src writes zeros.
void launch_copy_frames(const float* src, int64_t src_frames, int64_t src_first, float* dst, int64_t dst_frames,
                        int64_t dst_first, int64_t count, int64_t channels, int64_t plane, cudaStream_t stream);

// The temporal upsampler's reshape: y (2 * channels, frames, plane) -> out (channels, 2 * frames,
// plane), out[c, 2 t + s] = y[s * channels + c, t].
void launch_interleave_frames(const float* y, float* out, int64_t channels, int64_t frames, int64_t plane, cudaStream_t stream);

// Nearest upsampling by 2 of every frame: x (channels * frames, height, width) -> (.., 2 height, 2 width).
void launch_upsample_nearest_2x(const float* x, float* out, int64_t images, int64_t height, int64_t width, cudaStream_t stream);

// out (cols, rows) = in (rows, cols)^T.
void launch_transpose(const float* in, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

// Softmax over the keys of every query of scores (keys, queries) (each query a column), of
// scale * score, in place.
void launch_softmax_columns(float* scores, int64_t keys, int64_t queries, float scale, cudaStream_t stream);

// The residual up block's shortcut (diffusers' DupUp3D) added into x, as vae::duplicate_upsample
// and add_in_place compute it on the CPU: x (out_channels, out_frames, 2 height, 2 width) +=
// in (in_channels, in_frames, height, width) with each input channel spread over a block of
// out_channels * time_factor * 4 / in_channels consecutive values of the (out_channels,
// time_factor, 2, 2) grid of each input pixel. On the first chunk the first time_factor - 1 of
// those frames are dropped (the upsampler made one frame there, not time_factor), so out_frames is
// in_frames * time_factor - (first_chunk ? time_factor - 1 : 0).
void launch_add_duplicate_upsample(const float* in, int64_t in_channels, int64_t in_frames, int64_t height, int64_t width, float* x,
                                   int64_t out_channels, int64_t time_factor, bool first_chunk, cudaStream_t stream);

// video[c, first + f, Y, X] = clamp(decoded[(c patch + X % patch) patch + Y % patch, f, Y / patch,
// X / patch], -1, 1) for f < frames: diffusers' unpatchify, then the clamp. decoded is
// (channels patch^2, frames, height, width), video (channels, video_frames, patch height,
// patch width); patch 1 is a clamped copy of decoded's frames.
void launch_unpatchify_clamp_into(const float* decoded, float* video, int64_t channels, int64_t frames, int64_t video_frames,
                                  int64_t first, int64_t height, int64_t width, int64_t patch, cudaStream_t stream);

// The encoder's input: frames [first, first + count) of one video (channels, frames, height, width)
// patchified as diffusers' patchify into out (channels patch^2, count, height / patch, width /
// patch): video pixel (y, x) of colour c is channel (c patch + x % patch) patch + y % patch of pixel
// (y / patch, x / patch). Patch 1 copies the frames.
void launch_patchify_frames(const float* video, int64_t channels, int64_t frames, int64_t first, int64_t count, int64_t height,
                            int64_t width, int64_t patch, float* out, cudaStream_t stream);

// diffusers' ZeroPad2d((0, 1, 0, 1)) of the downsamplers: x (images, height, width) -> out (images,
// height + 1, width + 1), a zero row below and a zero column to the right.
void launch_pad_bottom_right(const float* x, float* out, int64_t images, int64_t height, int64_t width, cudaStream_t stream);

// The residual down block's shortcut (diffusers' AvgDown3D) added into x, as vae::average_downsample
// and add_in_place compute it on the CPU: each pixel of x (out_channels, out_frames, height /
// space_factor, width / space_factor) gets the mean of its group of in_channels * time_factor *
// space_factor^2 / out_channels consecutive values of the (channel, frame, row, column) block of
// `in` (in_channels, in_frames, height, width) under it, with zero frames before the first when
// in_frames is not a multiple of time_factor (out_frames = ceil(in_frames / time_factor)).
void launch_add_average_downsample(const float* in, int64_t in_channels, int64_t in_frames, int64_t height, int64_t width, float* x,
                                   int64_t out_channels, int64_t time_factor, int64_t space_factor, cudaStream_t stream);

// Throws Error naming `what` when the last launch failed.
void check_launch(const char* what);
// Throws Error naming `what` unless `status` is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

}  // namespace tessel::vae::cuda
