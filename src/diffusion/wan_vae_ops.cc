#include "wan_vae_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessel/core/cpu_features.h"

namespace tessel::vae {
namespace {

constexpr int64_t kStrip = PackedConv::kStripChannels;
// Pixels a thread takes at once: all strips of output channels are computed for a block before the
// next, so its input pixels stay in cache across strips.
constexpr int64_t kBlockPixels = 128;
// Below this many multiply-adds a convolution runs on the calling thread, and below this many
// values an element-wise loop: waking a team costs more than small work, far more when the cores are
// shared with other processes.
constexpr int64_t kParallelMinConvWork = 1 << 22;
constexpr int64_t kParallelMinWork = 1 << 18;

// Sixteen floats: one AVX-512 register, two AVX ones.
using Vec16 = float __attribute__((vector_size(64)));

// out[p : p + Rows, c0 : c0 + columns] = bias + sum over taps of in[p + offset, :] · W_tap[:, strip];
// the Rows x 32 accumulators stay in registers over every tap and input channel.
template <int Rows>
[[gnu::always_inline]] inline void conv_tile(const PackedConv& conv, const ConvTap* taps, int64_t tap_count, int64_t strip,
                                             int64_t p, float* out, int64_t columns) {
  const int64_t cin = conv.in_channels;
  Vec16 acc[Rows][2];
  Vec16 bias[2];
  std::memcpy(bias, conv.bias.data() + strip * kStrip, sizeof bias);
  for (int r = 0; r < Rows; ++r) acc[r][0] = bias[0], acc[r][1] = bias[1];
  for (int64_t t = 0; t < tap_count; ++t) {
    const float* in = taps[t].pixels + (p + taps[t].offset) * cin;
    const float* w = conv.tap_weights(strip, taps[t].tap);
    for (int64_t k = 0; k < cin; ++k) {
      Vec16 w_k[2];
      std::memcpy(w_k, w + k * kStrip, sizeof w_k);
      for (int r = 0; r < Rows; ++r) {
        const float a = in[r * cin + k];
        acc[r][0] += a * w_k[0];
        acc[r][1] += a * w_k[1];
      }
    }
  }
  const int64_t cout = conv.out_channels;
  float* y = out + p * cout + strip * kStrip;
  if (columns == kStrip) {
    for (int r = 0; r < Rows; ++r) std::memcpy(y + r * cout, acc[r], sizeof acc[r]);
  } else {
    for (int r = 0; r < Rows; ++r) {
      float row[kStrip];
      std::memcpy(row, acc[r], sizeof row);
      std::memcpy(y + r * cout, row, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

// Pixels [p0, p1) of every strip: whole tiles of Rows pixels, then single pixels.
template <int Rows>
[[gnu::always_inline]] inline void conv_block_body(const PackedConv& conv, const ConvTap* taps, int64_t tap_count, int64_t p0,
                                                   int64_t p1, float* out) {
  for (int64_t strip = 0; strip < conv.strips(); ++strip) {
    const int64_t columns = std::min(kStrip, conv.out_channels - strip * kStrip);
    int64_t p = p0;
    for (; p + Rows <= p1; p += Rows) conv_tile<Rows>(conv, taps, tap_count, strip, p, out, columns);
    for (; p < p1; ++p) conv_tile<1>(conv, taps, tap_count, strip, p, out, columns);
  }
}

using ConvBlockFunction = void (*)(const PackedConv&, const ConvTap*, int64_t, int64_t, int64_t, float*);

// Eight rows need 16 vector accumulators: AVX-512 has 32 registers; AVX and SSE take fewer rows.
void conv_block_baseline(const PackedConv& conv, const ConvTap* taps, int64_t tap_count, int64_t p0, int64_t p1, float* out) {
  conv_block_body<2>(conv, taps, tap_count, p0, p1, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void conv_block_avx512(const PackedConv& conv, const ConvTap* taps,
                                                                            int64_t tap_count, int64_t p0, int64_t p1,
                                                                            float* out) {
  conv_block_body<8>(conv, taps, tap_count, p0, p1, out);
}
__attribute__((target("avx2,fma"))) void conv_block_avx2(const PackedConv& conv, const ConvTap* taps, int64_t tap_count,
                                                         int64_t p0, int64_t p1, float* out) {
  conv_block_body<3>(conv, taps, tap_count, p0, p1, out);
}
// Chosen once by CPU feature (core/cpu_features.h).
ConvBlockFunction widest_conv_block() {
  return widest_variant<ConvBlockFunction>(conv_block_baseline, conv_block_avx2, conv_block_avx512);
}
#else
ConvBlockFunction widest_conv_block() { return conv_block_baseline; }
#endif

const ConvBlockFunction conv_block = widest_conv_block();

}  // namespace

FeatureFrames::FeatureFrames(int64_t count_, int64_t channels_, int64_t height_, int64_t width_)
    : count(count_), channels(channels_), height(height_), width(width_),
      data(static_cast<size_t>(count_ * (height_ + 2) * (width_ + 2) * channels_), 0.0f) {}

PackedConv::PackedConv(const float* w, const float* b, int64_t out_channels_, int64_t in_channels_, int64_t kt_, int64_t kh_,
                       int64_t kw_)
    : in_channels(in_channels_), out_channels(out_channels_), kt(kt_), kh(kh_), kw(kw_) {
  weights.assign(static_cast<size_t>(strips() * taps() * in_channels * kStrip), 0.0f);
  for (int64_t o = 0; o < out_channels; ++o)
    for (int64_t i = 0; i < in_channels; ++i)
      for (int64_t tap = 0; tap < taps(); ++tap)
        weights[static_cast<size_t>(((o / kStrip * taps() + tap) * in_channels + i) * kStrip + o % kStrip)] =
            w[(o * in_channels + i) * taps() + tap];
  bias.assign(static_cast<size_t>(strips() * kStrip), 0.0f);
  std::copy_n(b, out_channels, bias.begin());
}

void conv_pixels(const ExecContext& ctx, const PackedConv& conv, const std::vector<ConvTap>& taps, int64_t first,
                 int64_t count, float* out) {
  const int64_t blocks = (count + kBlockPixels - 1) / kBlockPixels;
  const int64_t work = count * conv.in_channels * conv.out_channels * static_cast<int64_t>(taps.size());
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (work >= kParallelMinConvWork)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t p0 = first + block * kBlockPixels;
    conv_block(conv, taps.data(), static_cast<int64_t>(taps.size()), p0, std::min(first + count, p0 + kBlockPixels), out);
  }
}

void conv_frame(const ExecContext& ctx, const PackedConv& conv, const std::vector<const float*>& inputs, int64_t height,
                int64_t width, float* out) {
  const int64_t row = width + 2;
  std::vector<ConvTap> taps;
  for (int64_t dt = 0; dt < conv.kt; ++dt) {
    if (inputs[static_cast<size_t>(dt)] == nullptr) continue;
    for (int64_t dh = 0; dh < conv.kh; ++dh)
      for (int64_t dw = 0; dw < conv.kw; ++dw)
        taps.push_back({inputs[static_cast<size_t>(dt)], (dh - conv.kh / 2) * row + (dw - conv.kw / 2),
                        (dt * conv.kh + dh) * conv.kw + dw});
  }
  const int64_t cout = conv.out_channels;
  // The interior runs from pixel (0, 0) to (height - 1, width - 1); the border pixels between rows
  // are computed too (one contiguous range) and cleared after.
  const int64_t first = row + 1, count = (height - 1) * row + width;
  if (taps.empty()) {
    for (int64_t p = first; p < first + count; ++p) std::copy_n(conv.bias.data(), cout, out + p * cout);
  } else {
    conv_pixels(ctx, conv, taps, first, count, out);
  }
  for (int64_t y = 1; y < height; ++y) std::fill_n(out + (y * row + width + 1) * cout, 2 * cout, 0.0f);
}

void rms_norm(const ExecContext& ctx, float* data, int64_t pixels, int64_t c, const float* gamma, bool silu) {
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(c)));
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (pixels * c >= kParallelMinWork)
  for (int64_t p = 0; p < pixels; ++p) {
    float* x = data + p * c;
    double sum = 0.0;
    for (int64_t i = 0; i < c; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float norm = std::max(static_cast<float>(std::sqrt(sum)), 1e-12f);
    for (int64_t i = 0; i < c; ++i) {
      const float v = x[i] / norm * scale * gamma[i];
      x[i] = silu ? v / (1.0f + std::exp(-v)) : v;
    }
  }
}

void upsample_nearest_2x(const ExecContext& ctx, const FeatureFrames& in, int64_t t, FeatureFrames& out, int64_t out_t) {
  const int64_t c = in.channels;
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (out.height * out.width * c >= kParallelMinWork)
  for (int64_t y = 0; y < out.height; ++y)
    for (int64_t x = 0; x < out.width; ++x) std::copy_n(in.pixel(t, y / 2, x / 2), c, out.pixel(out_t, y, x));
}

FeatureFrames duplicate_upsample(const ExecContext& ctx, const FeatureFrames& in, int64_t out_channels, int64_t time_factor,
                                 bool first_chunk) {
  const int64_t repeats = out_channels * time_factor * 4 / in.channels, dropped = first_chunk ? time_factor - 1 : 0;
  FeatureFrames out(in.count * time_factor - dropped, out_channels, 2 * in.height, 2 * in.width);
  for (int64_t f = 0; f < out.count; ++f) {
    const int64_t t = (f + dropped) / time_factor, a = (f + dropped) % time_factor;
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (out.height * out.width * out_channels >= kParallelMinWork)
    for (int64_t y = 0; y < out.height; ++y)
      for (int64_t x = 0; x < out.width; ++x) {
        const float* source = in.pixel(t, y / 2, x / 2);
        float* target = out.pixel(f, y, x);
        const int64_t first_value = (a * 2 + y % 2) * 2 + x % 2;  // of output channel 0
        for (int64_t o = 0; o < out_channels; ++o) target[o] = source[(o * time_factor * 4 + first_value) / repeats];
      }
  }
  return out;
}

void conv_frame_stride2(const ExecContext& ctx, const PackedConv& conv, const FeatureFrames& in, int64_t t, float* out) {
  const int64_t cin = in.channels, out_height = in.height / 2, out_width = in.width / 2, row = out_width + 2;
  const int64_t frame_pixels = (out_height + 2) * row;
  // The four phases of the input (rows 2i + a, columns 2j + b) as frames of the output's size, whose
  // zero borders are the padding: every tap is then one contiguous run of pixels of one phase.
  std::vector<float> phases(static_cast<size_t>(4 * frame_pixels * cin), 0.0f);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b) {
      float* phase = phases.data() + (a * 2 + b) * frame_pixels * cin;
      for (int64_t i = 0; i < out_height; ++i)
        for (int64_t j = 0; j < out_width; ++j)
          std::copy_n(in.pixel(t, 2 * i + a, 2 * j + b), cin, phase + ((i + 1) * row + j + 1) * cin);
    }
  // Kernel offset d in 0..2 is phase d % 2 shifted by d / 2 output pixels.
  std::vector<ConvTap> taps;
  for (int64_t dy = 0; dy < 3; ++dy)
    for (int64_t dx = 0; dx < 3; ++dx)
      taps.push_back({phases.data() + ((dy % 2) * 2 + dx % 2) * frame_pixels * cin, (dy / 2) * row + dx / 2, dy * 3 + dx});
  const int64_t cout = conv.out_channels, first = row + 1, count = (out_height - 1) * row + out_width;
  conv_pixels(ctx, conv, taps, first, count, out);
  for (int64_t y = 1; y < out_height; ++y) std::fill_n(out + (y * row + out_width + 1) * cout, 2 * cout, 0.0f);
}

FeatureFrames average_downsample(const ExecContext& ctx, const FeatureFrames& in, int64_t out_channels, int64_t time_factor,
                                 int64_t space_factor) {
  const int64_t factor = time_factor * space_factor * space_factor, group = in.channels * factor / out_channels;
  const int64_t padded = (time_factor - in.count % time_factor) % time_factor;
  FeatureFrames out((in.count + padded) / time_factor, out_channels, in.height / space_factor, in.width / space_factor);
  for (int64_t t = 0; t < out.count; ++t) {
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (out.height * out.width * out_channels * group >= kParallelMinWork)
    for (int64_t y = 0; y < out.height; ++y)
      for (int64_t x = 0; x < out.width; ++x) {
        float* target = out.pixel(t, y, x);
        for (int64_t o = 0; o < out_channels; ++o) {
          float sum = 0.0f;
          for (int64_t v = o * group; v < (o + 1) * group; ++v) {
            const int64_t rest = v % factor, a = rest / (space_factor * space_factor);
            const int64_t frame = t * time_factor + a - padded;
            if (frame < 0) continue;  // the zero frames diffusers pads the front with
            sum += in.pixel(frame, y * space_factor + rest / space_factor % space_factor,
                            x * space_factor + rest % space_factor)[v / factor];
          }
          target[o] = sum / static_cast<float>(group);
        }
      }
  }
  return out;
}

void add_in_place(const ExecContext& ctx, FeatureFrames& x, const FeatureFrames& y) {
  const int64_t n = static_cast<int64_t>(x.data.size());
  float* a = x.data.data();
  const float* b = y.data.data();
#pragma omp parallel for schedule(static) num_threads(ctx.threads()) if (n >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace tessel::vae
