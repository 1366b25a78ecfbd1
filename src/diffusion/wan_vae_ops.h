// The CPU fp32 building blocks of the Wan VAE: feature-map frames in a padded channels-last layout,
// convolutions over them as sums of shifted matrix products, the VAE's RMS norm, SiLU and nearest
// upsampling. Internal: callers check shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/core/exec_context.h"
#include "tessel/core/tensor.h"

namespace tessel::vae {

// Frames of one feature map. Each frame is (height + 2, width + 2, channels), channels last, with a
// border one pixel wide that is always zero: a 3x3 convolution reads its zero padding from memory,
// so every tap of the convolution is one contiguous run of pixels.
struct FeatureFrames {
  int64_t count = 0, channels = 0, height = 0, width = 0;
  std::vector<float> data;

  FeatureFrames() = default;
  FeatureFrames(int64_t count, int64_t channels, int64_t height, int64_t width);  // all zero
  int64_t row_pixels() const { return width + 2; }
  int64_t frame_pixels() const { return (height + 2) * (width + 2); }
  int64_t frame_size() const { return frame_pixels() * channels; }
  float* frame(int64_t t) { return data.data() + t * frame_size(); }
  const float* frame(int64_t t) const { return data.data() + t * frame_size(); }
  // The channels of pixel (y, x) of frame t, 0 <= y < height, 0 <= x < width.
  float* pixel(int64_t t, int64_t y, int64_t x) { return frame(t) + ((y + 1) * row_pixels() + x + 1) * channels; }
  const float* pixel(int64_t t, int64_t y, int64_t x) const {
    return frame(t) + ((y + 1) * row_pixels() + x + 1) * channels;
  }
};

// A PyTorch convolution weight (out, in, kt, kh, kw) repacked for conv_pixels: strips of
// kStripChannels output channels (the last zero-padded), each [tap][in channel][strip channel].
struct PackedConv {
  static constexpr int64_t kStripChannels = 32;
  int64_t in_channels = 0, out_channels = 0, kt = 1, kh = 1, kw = 1;
  std::vector<float> weights;
  std::vector<float> bias;  // padded to whole strips

  PackedConv() = default;
  // `weight`: out_channels x in_channels x kt x kh x kw values, `bias`: out_channels values.
  PackedConv(const float* weight, const float* bias, int64_t out_channels, int64_t in_channels, int64_t kt, int64_t kh,
             int64_t kw);
  int64_t strips() const { return (out_channels + kStripChannels - 1) / kStripChannels; }
  int64_t taps() const { return kt * kh * kw; }
  const float* tap_weights(int64_t strip, int64_t tap) const {
    return weights.data() + (strip * taps() + tap) * in_channels * kStripChannels;
  }
};

// One input of a convolution: pixel p of the output reads pixel p + offset of `pixels` (rows of
// in_channels), multiplied by the packed weights of tap `tap`.
struct ConvTap {
  const float* pixels;
  int64_t offset;
  int64_t tap;
};

// out[p] = bias + sum over taps of in[p + offset] * W_tap, for pixels p in [first, first + count);
// out has rows of out_channels. Runs on ctx.threads() threads.
void conv_pixels(const ExecContext& ctx, const PackedConv& conv, const std::vector<ConvTap>& taps, int64_t first,
                 int64_t count, float* out);

// One output frame of a convolution with kernel (kt, kh, kw), padding (kh / 2, kw / 2) in space:
// inputs holds the kt input frames it reads, oldest first (a null frame is all zeros and skipped).
// `out` is a frame of out_channels of the same size; its border stays zero.
void conv_frame(const ExecContext& ctx, const PackedConv& conv, const std::vector<const float*>& inputs, int64_t height,
                int64_t width, float* out);

// In place over `count` pixels of `channels` values: x / max(|x|, 1e-12) * sqrt(channels) * gamma
// (the VAE's RMS norm, torch's F.normalize over channels), followed by SiLU when `silu`. Zero pixels
// (the frames' borders) stay zero.
void rms_norm(const ExecContext& ctx, float* pixels, int64_t count, int64_t channels, const float* gamma, bool silu);
inline void rms_norm(const ExecContext& ctx, FeatureFrames& frames, const float* gamma, bool silu) {
  rms_norm(ctx, frames.data.data(), frames.count * frames.frame_pixels(), frames.channels, gamma, silu);
}

// Nearest upsampling by 2 in height and width of frame t (diffusers' "nearest-exact" at scale 2).
void upsample_nearest_2x(const ExecContext& ctx, const FeatureFrames& in, int64_t t, FeatureFrames& out, int64_t out_t);

// diffusers' DupUp3D, the shortcut of Wan 2.2's residual up blocks: `in`'s channels repeated to
// out_channels x time_factor x 2 x 2 values per pixel, which become out_channels channels of
// time_factor frames of 2 x 2 pixels each (value index ((o * time_factor + a) * 2 + b) * 2 + c for
// frame a, row b, column c). On the first chunk the first time_factor - 1 frames are dropped, as the
// temporal upsampler does not double the first frame. in.channels must divide out_channels *
// time_factor * 4 (the config's validate() checks it).
FeatureFrames duplicate_upsample(const ExecContext& ctx, const FeatureFrames& in, int64_t out_channels, int64_t time_factor,
                                 bool first_chunk);

// diffusers' ZeroPad2d((0, 1, 0, 1)) then a 3x3 convolution of stride 2 (WanResample's downsampling)
// on frame t of `in`: output pixel (i, j) reads input pixels (2i + dy, 2j + dx), dy, dx in 0..2, zero
// past the bottom and right edges. in.height and in.width must be even; `out` is a frame of
// conv.out_channels and half the height and width, its border left zero.
void conv_frame_stride2(const ExecContext& ctx, const PackedConv& conv, const FeatureFrames& in, int64_t t, float* out);

// diffusers' AvgDown3D, the shortcut of Wan 2.2's residual down blocks: each output pixel's
// in.channels x time_factor x space_factor^2 input values (zero frames first when in.count is not a
// multiple of time_factor, as diffusers pads the front), ordered (channel, frame, row, column), are
// split into out_channels consecutive groups and each group averaged into one channel.
// in.channels * time_factor * space_factor^2 must be a multiple of out_channels (validate() checks it).
FeatureFrames average_downsample(const ExecContext& ctx, const FeatureFrames& in, int64_t out_channels, int64_t time_factor,
                                 int64_t space_factor);

// x += y over whole frames of the same shape.
void add_in_place(const ExecContext& ctx, FeatureFrames& x, const FeatureFrames& y);

}  // namespace tessel::vae
