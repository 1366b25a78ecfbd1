#include "cuda/vae_cuda_blocks.h"

#include <algorithm>
#include <cmath>

#include "cuda/vae_kernels.h"
#include "cuda/vae_row_split.h"
#include "tessel/core/error.h"

namespace tessel::vae::cuda {

DeviceFrames DecodeContext::frames(int64_t channels, int64_t count, int64_t height, int64_t width) const {
  DeviceFrames f;
  f.buffer = buffers.take(channels * count * height * width);
  f.channels = channels, f.frames = count, f.height = height, f.width = width;
  return f;
}

Tensor upload(const WeightMap& weights, const std::string& name, Device device) {
  const auto found = weights.find(name);
  if (found == weights.end()) throw Error("Wan VAE: no weight named " + name);
  return found->second.to(device);
}

DeviceConv::DeviceConv(const WeightMap& weights, const std::string& name, int64_t kt, int64_t kh, int64_t kw, SlotCounter& slots,
                       Device device)
    : weight_(upload(weights, name + ".weight", device)),
      bias_(upload(weights, name + ".bias", device)),
      in_channels_(weight_.size(1)),
      out_channels_(weight_.size(0)),
      kt_(kt),
      kh_(kh),
      kw_(kw),
      slot_(kt > 1 ? slots.take() : -1) {}

DeviceFrames DeviceConv::forward(const DecodeContext& dc, const DeviceFrames& band, DeviceCache& cache, const float* residual) const {
  // A band's 3x3 convolution reads the neighbours' rows: its input has them above and below, and
  // cuDNN pads only the width.
  DeviceFrames haloed;
  const bool halo = dc.split != nullptr && kh_ > 1;
  if (halo) haloed = dc.split->with_halo(dc, band);
  const DeviceFrames& x = halo ? haloed : band;
  const int64_t plane = x.plane(), causal = kt_ - 1;
  DeviceFrames y = dc.frames(out_channels_, band.frames, band.height, band.width);
  ConvGeometry geometry{in_channels_, out_channels_, kt_, kh_, kw_, x.frames + causal, x.height, x.width, dc.tf32};
  geometry.pad_rows = !halo;
  if (causal == 0) {
    dc.convolutions.forward(geometry, x.data(), weight_.data_as<const float>(), y.data(), dc.buffers, dc.stream);
  } else {
    // The input with its causal frames before it: zeros, then the history, then x.
    DeviceHistory& history = cache.at(static_cast<size_t>(slot_));
    const int64_t remembered = history.frames.frames;
    DeviceFrames padded = dc.frames(in_channels_, causal + x.frames, x.height, x.width);
    launch_copy_frames(nullptr, 0, 0, padded.data(), padded.frames, 0, causal - remembered, in_channels_, plane, dc.stream);
    launch_copy_frames(history.frames.data(), remembered, 0, padded.data(), padded.frames, causal - remembered, remembered,
                       in_channels_, plane, dc.stream);
    launch_copy_frames(x.data(), x.frames, 0, padded.data(), padded.frames, causal, x.frames, in_channels_, plane, dc.stream);
    dc.convolutions.forward(geometry, padded.data(), weight_.data_as<const float>(), y.data(), dc.buffers, dc.stream);
    // The next chunk's history: the last kt - 1 real frames (history and x) of the padded input.
    const int64_t kept = std::min(causal, remembered + x.frames);
    DeviceFrames next = dc.frames(in_channels_, kept, x.height, x.width);
    launch_copy_frames(padded.data(), padded.frames, padded.frames - kept, next.data(), kept, 0, kept, in_channels_, plane,
                       dc.stream);
    history.frames = std::move(next);
  }
  launch_add_bias(y.data(), bias_.data_as<const float>(), residual, out_channels_, y.frames * y.plane(), dc.stream);
  check_launch("convolution");
  return y;
}

DeviceFrames DeviceConv::forward_valid(const DecodeContext& dc, const DeviceFrames& x, int64_t time_stride, int64_t space_stride) const {
  ConvGeometry geometry{in_channels_, out_channels_, kt_, kh_, kw_, x.frames, x.height, x.width, dc.tf32, time_stride, space_stride, false};
  DeviceFrames y = dc.frames(out_channels_, geometry.out_frames(), geometry.out_height(), geometry.out_width());
  dc.convolutions.forward(geometry, x.data(), weight_.data_as<const float>(), y.data(), dc.buffers, dc.stream);
  launch_add_bias(y.data(), bias_.data_as<const float>(), nullptr, out_channels_, y.frames * y.plane(), dc.stream);
  check_launch("strided convolution");
  return y;
}

DeviceResidualBlock::DeviceResidualBlock(const WeightMap& weights, const std::string& prefix, int64_t in_dim, int64_t out_dim,
                                         SlotCounter& slots, Device device)
    : gamma1_(upload(weights, prefix + ".norm1.gamma", device)),
      gamma2_(upload(weights, prefix + ".norm2.gamma", device)),
      conv1_(weights, prefix + ".conv1", 3, 3, 3, slots, device),
      conv2_(weights, prefix + ".conv2", 3, 3, 3, slots, device),
      has_shortcut_(in_dim != out_dim) {
  if (has_shortcut_) shortcut_ = DeviceConv(weights, prefix + ".conv_shortcut", 1, 1, 1, slots, device);
}

DeviceFrames DeviceResidualBlock::forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const {
  const int64_t pixels = x.frames * x.plane();
  DeviceFrames h = dc.frames(x.channels, x.frames, x.height, x.width);
  launch_rms_norm(x.data(), h.data(), gamma1_.data_as<const float>(), x.channels, pixels, true, dc.stream);
  h = conv1_.forward(dc, h, cache);
  launch_rms_norm(h.data(), h.data(), gamma2_.data_as<const float>(), h.channels, pixels, true, dc.stream);
  if (!has_shortcut_) return conv2_.forward(dc, h, cache, x.data());
  const DeviceFrames shortcut = shortcut_.forward(dc, x, cache);
  return conv2_.forward(dc, h, cache, shortcut.data());
}

DeviceAttentionBlock::DeviceAttentionBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, Device device)
    : gamma_(upload(weights, prefix + ".norm.gamma", device)), dim_(dim) {
  SlotCounter none;  // 1x1x1 convolutions keep no history
  qkv_ = DeviceConv(weights, prefix + ".to_qkv", 1, 1, 1, none, device);
  proj_ = DeviceConv(weights, prefix + ".proj", 1, 1, 1, none, device);
}

DeviceFrames DeviceAttentionBlock::frame_forward(const DecodeContext& dc, const float* frame, int64_t height, int64_t width) const {
  const int64_t c = dim_, n = height * width;
  DeviceCache no_cache;
  DeviceFrames normed = dc.frames(c, 1, height, width);
  launch_rms_norm(frame, normed.data(), gamma_.data_as<const float>(), c, n, false, dc.stream);
  const DeviceFrames qkv = qkv_.forward(dc, normed, no_cache);  // (3c, n): q, k, v, each (c, n)
  const float* q = qkv.data();
  const float* k = qkv.data() + c * n;
  // v is a filter below: its own buffer, so it starts on cudaMalloc's alignment whatever c * n is.
  DeviceFrames v = dc.frames(c, 1, n, 1);
  check_cuda(cudaMemcpyAsync(v.data(), qkv.data() + 2 * c * n, static_cast<size_t>(c * n) * sizeof(float), cudaMemcpyDeviceToDevice,
                             dc.stream),
             "copy of v");
  // scores (keys, queries) = k^T q: a 1x1 convolution of q (c channels) whose n filters are the
  // rows of k (n, c).
  DeviceFrames keys = dc.frames(n, c, 1, 1);
  launch_transpose(k, keys.data(), c, n, dc.stream);
  DeviceFrames scores = dc.frames(n, 1, height, width);
  dc.convolutions.forward(ConvGeometry{c, n, 1, 1, 1, 1, height, width, false}, q, keys.data(), scores.data(), dc.buffers, dc.stream);
  launch_softmax_columns(scores.data(), n, n, 1.0f / std::sqrt(static_cast<float>(c)), dc.stream);
  // out (c, queries) = v p: a 1x1 convolution of the probabilities (n channels) whose c filters are
  // the rows of v (c, n), as stored.
  DeviceFrames attended = dc.frames(c, 1, height, width);
  dc.convolutions.forward(ConvGeometry{n, c, 1, 1, 1, 1, height, width, false}, scores.data(), v.data(), attended.data(), dc.buffers,
                          dc.stream);
  check_launch("attention");
  return proj_.forward(dc, attended, no_cache, frame);
}

DeviceFrames DeviceAttentionBlock::forward(const DecodeContext& dc, const DeviceFrames& x) const {
  const int64_t plane = x.plane();
  if (x.frames == 1) return frame_forward(dc, x.data(), x.height, x.width);
  // Frames are not contiguous in (channels, frames, ...): each goes through a copy of its own.
  DeviceFrames out = dc.frames(x.channels, x.frames, x.height, x.width);
  DeviceFrames frame = dc.frames(x.channels, 1, x.height, x.width);
  for (int64_t t = 0; t < x.frames; ++t) {
    launch_copy_frames(x.data(), x.frames, t, frame.data(), 1, 0, 1, x.channels, plane, dc.stream);
    const DeviceFrames attended = frame_forward(dc, frame.data(), x.height, x.width);
    launch_copy_frames(attended.data(), 1, 0, out.data(), x.frames, t, 1, x.channels, plane, dc.stream);
  }
  check_launch("attention frames");
  return out;
}

DeviceMidBlock::DeviceMidBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, SlotCounter& slots, Device device)
    : first_(weights, prefix + ".resnets.0", dim, dim, slots, device),
      second_(weights, prefix + ".resnets.1", dim, dim, slots, device),
      attention_(weights, prefix + ".attentions.0", dim, device) {}

DeviceFrames DeviceMidBlock::forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const {
  const DeviceFrames h = first_.forward(dc, x, cache);
  if (dc.split == nullptr) return second_.forward(dc, attention_.forward(dc, h), cache);
  const DeviceFrames attended = attention_.forward(dc, dc.split->whole(dc, h));
  return second_.forward(dc, dc.split->band_of(dc, attended), cache);
}

DeviceUpsampler::DeviceUpsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots,
                                 Device device)
    : spatial_(weights, prefix + ".resample.1", 1, 3, 3, slots, device), temporal_(temporal) {
  if (temporal_) time_ = DeviceConv(weights, prefix + ".time_conv", 3, 1, 1, slots, device);
}

DeviceFrames DeviceUpsampler::forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const {
  const DeviceFrames* frames = &x;
  DeviceFrames doubled;
  if (temporal_) {
    DeviceHistory& history = cache.at(static_cast<size_t>(time_.slot()));
    // diffusers' "Rep" marker: the first chunk keeps its single frame and leaves no history, so the
    // second chunk's time convolution reads zeros before it.
    if (history.started) {
      const DeviceFrames both = time_.forward(dc, x, cache);  // (2 channels, frames): the two halves
      doubled = dc.frames(x.channels, 2 * x.frames, x.height, x.width);
      launch_interleave_frames(both.data(), doubled.data(), x.channels, x.frames, x.plane(), dc.stream);
      frames = &doubled;
    }
    history.started = true;
  }
  DeviceFrames upsampled = dc.frames(frames->channels, frames->frames, 2 * frames->height, 2 * frames->width);
  launch_upsample_nearest_2x(frames->data(), upsampled.data(), frames->channels * frames->frames, frames->height, frames->width,
                             dc.stream);
  check_launch("upsampling");
  return spatial_.forward(dc, upsampled, cache);
}

DeviceDownsampler::DeviceDownsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots,
                                     Device device)
    : spatial_(weights, prefix + ".resample.1", 1, 3, 3, slots, device), temporal_(temporal) {
  if (temporal_) time_ = DeviceConv(weights, prefix + ".time_conv", 3, 1, 1, slots, device);
}

DeviceFrames DeviceDownsampler::forward(const DecodeContext& dc, const DeviceFrames& x, DeviceCache& cache) const {
  if (x.height % 2 != 0 || x.width % 2 != 0)
    throw Error(detail::concat("Wan VAE CUDA encode: a downsampler given frames of ", x.height, " x ", x.width, " (even sizes expected)"));
  DeviceFrames padded = dc.frames(x.channels, x.frames, x.height + 1, x.width + 1);
  launch_pad_bottom_right(x.data(), padded.data(), x.channels * x.frames, x.height, x.width, dc.stream);
  DeviceFrames halved = spatial_.forward_valid(dc, padded, 1, 2);
  padded = DeviceFrames();
  if (!temporal_) return halved;
  DeviceHistory& history = cache.at(static_cast<size_t>(time_.slot()));
  const int64_t plane = halved.plane(), channels = halved.channels;
  // The next chunk's time convolution starts from this chunk's last frame.
  DeviceFrames last = dc.frames(channels, 1, halved.height, halved.width);
  launch_copy_frames(halved.data(), halved.frames, halved.frames - 1, last.data(), 1, 0, 1, channels, plane, dc.stream);
  if (!history.started) {
    history.started = true;
    history.frames = std::move(last);
    return halved;
  }
  // Output frame j reads frames 2j .. 2j + 2 of [the remembered frame, this chunk's frames]. Chunks
  // of four frames reach a temporal downsampler as four or two (encode refuses other configs).
  if (halved.frames < 2) throw Error(detail::concat("Wan VAE CUDA encode: a temporal downsampler given ", halved.frames, " frame"));
  DeviceFrames joined = dc.frames(channels, 1 + halved.frames, halved.height, halved.width);
  launch_copy_frames(history.frames.data(), 1, 0, joined.data(), joined.frames, 0, 1, channels, plane, dc.stream);
  launch_copy_frames(halved.data(), halved.frames, 0, joined.data(), joined.frames, 1, halved.frames, channels, plane, dc.stream);
  history.frames = std::move(last);
  check_launch("time downsampling");
  return time_.forward_valid(dc, joined, 2, 1);
}

}  // namespace tessel::vae::cuda
