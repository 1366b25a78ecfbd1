#include "wan_vae_blocks.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/kernels/attention.h"
#include "wan_vae_split.h"

namespace tessel::vae {
namespace {

std::vector<float> gamma_of(const WeightMap& weights, const std::string& name, int64_t dim) {
  const float* gamma = weight_data(weights, name);
  return std::vector<float>(gamma, gamma + dim);
}

PackedConv pack(const WeightMap& weights, const std::string& name, int64_t kt, int64_t kh, int64_t kw) {
  const Tensor& weight = weights.at(name + ".weight");
  return PackedConv(weight.data_as<const float>(), weight_data(weights, name + ".bias"), weight.size(0), weight.size(1), kt,
                    kh, kw);
}

// The input frames a causal convolution reads for chunk x: kt - 1 frames before it (zeros, then
// the history), then x's frames. Output frame j reads entries j .. j + kt - 1.
std::vector<const float*> causal_inputs(const ConvHistory* history, const FeatureFrames& x, int64_t kt) {
  const int64_t remembered = history ? static_cast<int64_t>(history->frames.size()) : 0;
  std::vector<const float*> frames(static_cast<size_t>(kt - 1 - remembered), nullptr);
  if (history)
    for (const std::vector<float>& frame : history->frames) frames.push_back(frame.data());
  for (int64_t t = 0; t < x.count; ++t) frames.push_back(x.frame(t));
  return frames;
}

// Keeps the last kt - 1 frames of history followed by x.
void remember(ConvHistory& history, const FeatureFrames& x, int64_t kt) {
  std::vector<std::vector<float>> kept;
  const int64_t total = static_cast<int64_t>(history.frames.size()) + x.count;
  for (int64_t i = std::max<int64_t>(0, total - (kt - 1)); i < total; ++i) {
    const int64_t from_x = i - static_cast<int64_t>(history.frames.size());
    if (from_x < 0)
      kept.push_back(std::move(history.frames[static_cast<size_t>(i)]));
    else
      kept.emplace_back(x.frame(from_x), x.frame(from_x) + x.frame_size());
  }
  history.frames = std::move(kept);
}

// out = conv over the causal inputs of x, frame by frame.
void causal_frames(const ExecContext& ctx, const PackedConv& conv, const std::vector<const float*>& inputs,
                   const FeatureFrames& x, FeatureFrames& out, int64_t out_first, int64_t out_step) {
  for (int64_t j = 0; j < x.count; ++j) {
    const std::vector<const float*> window(inputs.begin() + j, inputs.begin() + j + conv.kt);
    conv_frame(ctx, conv, window, x.height, x.width, out.frame(out_first + j * out_step));
  }
}

}  // namespace

const float* weight_data(const WeightMap& weights, const std::string& name) {
  const auto found = weights.find(name);
  if (found == weights.end()) throw Error("Wan VAE: no weight named " + name);
  return found->second.data_as<const float>();
}

CausalConv::CausalConv(const WeightMap& weights, const std::string& name, int64_t kt, int64_t kh, int64_t kw, SlotCounter& slots)
    : conv_(pack(weights, name, kt, kh, kw)), slot_(kt > 1 ? slots.take() : -1) {}

FeatureFrames CausalConv::forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const {
  ConvHistory* history = slot_ >= 0 ? &cache.slot(slot_) : nullptr;
  // A band's 3x3 convolution reads the neighbours' rows in its border: a copy of x with them (x's
  // own border stays zero for the element-wise work that reads it whole).
  FeatureFrames haloed;
  const FeatureFrames* input = &x;
  if (cache.split() != nullptr && conv_.kh > 1) {
    haloed = x;
    cache.split()->fill_halo(ctx, haloed);
    input = &haloed;
  }
  FeatureFrames out(x.count, conv_.out_channels, x.height, x.width);
  causal_frames(ctx, conv_, causal_inputs(history, *input, conv_.kt), *input, out, 0, 1);
  if (history) remember(*history, *input, conv_.kt);
  return out;
}

ResidualBlock::ResidualBlock(const WeightMap& weights, const std::string& prefix, int64_t in_dim, int64_t out_dim,
                             SlotCounter& slots)
    : gamma1_(gamma_of(weights, prefix + ".norm1.gamma", in_dim)),
      gamma2_(gamma_of(weights, prefix + ".norm2.gamma", out_dim)),
      conv1_(weights, prefix + ".conv1", 3, 3, 3, slots),
      conv2_(weights, prefix + ".conv2", 3, 3, 3, slots),
      has_shortcut_(in_dim != out_dim) {
  if (has_shortcut_) shortcut_ = CausalConv(weights, prefix + ".conv_shortcut", 1, 1, 1, slots);
}

FeatureFrames ResidualBlock::forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const {
  FeatureFrames h = x;
  rms_norm(ctx, h, gamma1_.data(), true);
  h = conv1_.forward(ctx, h, cache);
  rms_norm(ctx, h, gamma2_.data(), true);
  h = conv2_.forward(ctx, h, cache);
  add_in_place(ctx, h, has_shortcut_ ? shortcut_.forward(ctx, x, cache) : x);
  return h;
}

AttentionBlock::AttentionBlock(const WeightMap& weights, const std::string& prefix, int64_t dim)
    : gamma_(gamma_of(weights, prefix + ".norm.gamma", dim)),
      qkv_(pack(weights, prefix + ".to_qkv", 1, 1, 1)),
      proj_(pack(weights, prefix + ".proj", 1, 1, 1)) {}

void AttentionBlock::forward(const ExecContext& ctx, FeatureFrames& x) const {
  const int64_t c = x.channels, n = x.height * x.width, tokens = x.count * n;
  // The normalized pixels, packed without the border (the border is no token).
  std::vector<float> packed(static_cast<size_t>(tokens * c));
  for (int64_t t = 0; t < x.count; ++t)
    for (int64_t y = 0; y < x.height; ++y)
      std::copy_n(x.pixel(t, y, 0), x.width * c, packed.data() + (t * n + y * x.width) * c);
  rms_norm(ctx, packed.data(), tokens, c, gamma_.data(), false);
  std::vector<float> qkv(static_cast<size_t>(tokens * 3 * c)), attended(static_cast<size_t>(tokens * c));
  conv_pixels(ctx, qkv_, {ConvTap{packed.data(), 0, 0}}, 0, tokens, qkv.data());
  // One head of c channels; the frames are the batch. q, k and v are slices of the packed qkv rows.
  const Shape shape = {x.count, n, 1, c}, qkv_strides = {n * 3 * c, 3 * c, c, 1};
  const TensorView q(qkv.data(), DType::kF32, Device::cpu(), shape, qkv_strides);
  const TensorView k(qkv.data() + c, DType::kF32, Device::cpu(), shape, qkv_strides);
  const TensorView v(qkv.data() + 2 * c, DType::kF32, Device::cpu(), shape, qkv_strides);
  attention_forward(ctx, q, k, v, TensorView(attended.data(), DType::kF32, Device::cpu(), shape), TensorView{});
  conv_pixels(ctx, proj_, {ConvTap{attended.data(), 0, 0}}, 0, tokens, packed.data());
  for (int64_t t = 0; t < x.count; ++t)
    for (int64_t y = 0; y < x.height; ++y) {
      float* row = x.pixel(t, y, 0);
      const float* projected = packed.data() + (t * n + y * x.width) * c;
      for (int64_t i = 0; i < x.width * c; ++i) row[i] += projected[i];
    }
}

MidBlock::MidBlock(const WeightMap& weights, const std::string& prefix, int64_t dim, SlotCounter& slots)
    : first_(weights, prefix + ".resnets.0", dim, dim, slots),
      second_(weights, prefix + ".resnets.1", dim, dim, slots),
      attention_(weights, prefix + ".attentions.0", dim) {}

FeatureFrames MidBlock::forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const {
  FeatureFrames h = first_.forward(ctx, x, cache);
  if (cache.split() == nullptr) {
    attention_.forward(ctx, h);
  } else {
    FeatureFrames whole = cache.split()->whole(ctx, h);
    attention_.forward(ctx, whole);
    h = cache.split()->band_of(whole);
  }
  return second_.forward(ctx, h, cache);
}

Upsampler::Upsampler(const WeightMap& weights, const std::string& prefix, int64_t dim, bool temporal, SlotCounter& slots)
    : spatial_(pack(weights, prefix + ".resample.1", 1, 3, 3)), temporal_(temporal) {
  if (!temporal_) return;
  const float* w = weight_data(weights, prefix + ".time_conv.weight");
  const float* b = weight_data(weights, prefix + ".time_conv.bias");
  time_even_ = PackedConv(w, b, dim, dim, 3, 1, 1);
  time_odd_ = PackedConv(w + dim * dim * 3, b + dim, dim, dim, 3, 1, 1);
  slot_ = slots.take();
}

FeatureFrames Upsampler::double_frames(const ExecContext& ctx, const FeatureFrames& x, ConvHistory& history) const {
  FeatureFrames out(2 * x.count, x.channels, x.height, x.width);
  const std::vector<const float*> inputs = causal_inputs(&history, x, 3);
  causal_frames(ctx, time_even_, inputs, x, out, 0, 2);
  causal_frames(ctx, time_odd_, inputs, x, out, 1, 2);
  remember(history, x, 3);
  return out;
}

FeatureFrames Upsampler::forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const {
  FeatureFrames doubled;
  const FeatureFrames* frames = &x;
  if (temporal_) {
    ConvHistory& history = cache.slot(slot_);
    if (history.started) {
      doubled = double_frames(ctx, x, history);
      frames = &doubled;
    }
    history.started = true;
  }
  FeatureFrames upsampled(1, frames->channels, 2 * frames->height, 2 * frames->width);
  FeatureFrames out(frames->count, spatial_.out_channels, upsampled.height, upsampled.width);
  for (int64_t t = 0; t < frames->count; ++t) {
    upsample_nearest_2x(ctx, *frames, t, upsampled, 0);
    if (cache.split() != nullptr) cache.split()->fill_halo(ctx, upsampled);
    conv_frame(ctx, spatial_, {upsampled.frame(0)}, upsampled.height, upsampled.width, out.frame(t));
  }
  return out;
}

Downsampler::Downsampler(const WeightMap& weights, const std::string& prefix, bool temporal, SlotCounter& slots)
    : spatial_(pack(weights, prefix + ".resample.1", 1, 3, 3)) {
  if (!temporal) return;
  time_ = pack(weights, prefix + ".time_conv", 3, 1, 1);
  slot_ = slots.take();
}

FeatureFrames Downsampler::forward(const ExecContext& ctx, const FeatureFrames& x, FeatureCache& cache) const {
  FeatureFrames halved(x.count, spatial_.out_channels, x.height / 2, x.width / 2);
  for (int64_t t = 0; t < x.count; ++t) conv_frame_stride2(ctx, spatial_, x, t, halved.frame(t));
  if (slot_ < 0) return halved;
  ConvHistory& history = cache.slot(slot_);
  const float* last = halved.frame(halved.count - 1);
  if (!history.started) {
    history.started = true;
    history.frames = {std::vector<float>(last, last + halved.frame_size())};
    return halved;
  }
  // Output frame j reads frames 2j .. 2j + 2 of [remembered frame, this chunk's frames]. Chunks of
  // four frames reach a temporal downsampler as four or two frames (encode refuses other configs).
  if (halved.count < 2) throw Error(detail::concat("Wan VAE: a temporal downsampler given ", halved.count, " frame"));
  std::vector<const float*> inputs = {history.frames.back().data()};
  for (int64_t t = 0; t < halved.count; ++t) inputs.push_back(halved.frame(t));
  FeatureFrames out((halved.count - 2) / 2 + 1, time_.out_channels, halved.height, halved.width);
  for (int64_t j = 0; j < out.count; ++j)
    conv_frame(ctx, time_, {inputs.begin() + 2 * j, inputs.begin() + 2 * j + 3}, halved.height, halved.width, out.frame(j));
  history.frames = {std::vector<float>(last, last + halved.frame_size())};
  return out;
}

}  // namespace tessel::vae
