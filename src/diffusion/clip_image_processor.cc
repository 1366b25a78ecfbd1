#include "tessel/diffusion/clip_image_processor.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/core/parallel.h"

namespace tessel {
namespace {

constexpr int64_t kMaxSide = int64_t{1} << 16;
// Pillow's fixed point for 8-bit images: 32 bits less 8 for the pixel and 2 for the sign and the
// filter's overshoot.
constexpr int kPrecisionBits = 32 - 8 - 2;

// Pillow's bicubic_filter (Keys' cubic with a = -0.5), support 2.
double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// The taps of one output pixel along an axis: input pixels [first, first + weights.size()).
struct Taps {
  int64_t first = 0;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs and normalize_coeffs_8bpc for an axis resized from in_size to out_size.
std::vector<Taps> taps_for(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  const double inverse_scale = 1.0 / filter_scale;  // Pillow multiplies by it (not a division: other rounding)
  std::vector<Taps> all(static_cast<size_t>(out_size));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    // (int) in C truncates toward zero; a negative start is clamped to 0 either way.
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t last = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    std::vector<double> w;
    double total = 0.0;
    for (int64_t x = first; x < last; ++x) {
      w.push_back(bicubic((static_cast<double>(x) - center + 0.5) * inverse_scale));
      total += w.back();
    }
    Taps& taps = all[static_cast<size_t>(xx)];
    taps.first = first;
    for (double value : w) {
      if (total != 0.0) value /= total;
      const double fixed = value * (1 << kPrecisionBits);
      taps.weights.push_back(static_cast<int32_t>(value < 0 ? fixed - 0.5 : fixed + 0.5));
    }
  }
  return all;
}

// Pillow's clip8: the fixed-point sum (with its rounding half already added) as a byte.
uint8_t clip8(int64_t sum) { return static_cast<uint8_t>(std::clamp<int64_t>(sum >> kPrecisionBits, 0, 255)); }

// One pass along an axis: `lines` lines of `in_size` pixels, pixel i of line l at
// in[l * line_stride + i * pixel_stride] (3 bytes), into lines of `taps.size()` pixels laid out
// the same way in `out`.
void resample_axis(const uint8_t* in, int64_t lines, int64_t in_line_stride, int64_t in_pixel_stride,
                   const std::vector<Taps>& taps, uint8_t* out, int64_t out_line_stride, int64_t out_pixel_stride) {
  parallel_for(lines, [&](int64_t line) {
    for (size_t o = 0; o < taps.size(); ++o) {
      const Taps& t = taps[o];
      for (int64_t channel = 0; channel < 3; ++channel) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (size_t i = 0; i < t.weights.size(); ++i)
          sum += int64_t{in[line * in_line_stride + (t.first + static_cast<int64_t>(i)) * in_pixel_stride + channel]} *
                 t.weights[i];
        out[line * out_line_stride + static_cast<int64_t>(o) * out_pixel_stride + channel] = clip8(sum);
      }
    }
  });
}

}  // namespace

void ClipImageProcessing::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {
      {"shortest_edge", shortest_edge}, {"crop_height", crop_height}, {"crop_width", crop_width}};
  for (const auto& [name, value] : sizes)
    if (value < 1 || value > kMaxSide) fail_argument(name, detail::concat("an integer in [1, ", kMaxSide, "]"), value);
  if (crop_height > shortest_edge) fail_argument("crop_height", detail::concat("at most shortest_edge ", shortest_edge), crop_height);
  if (crop_width > shortest_edge) fail_argument("crop_width", detail::concat("at most shortest_edge ", shortest_edge), crop_width);
  if (!(rescale_factor > 0.0)) fail_argument("rescale_factor", "a positive number", rescale_factor);
  for (float value : image_std)
    if (!(value > 0.0f)) fail_argument("image_std", "positive numbers", value);
}

std::pair<int64_t, int64_t> clip_resized_size(int64_t height, int64_t width, int64_t shortest_edge) {
  const int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto longer_out =
      static_cast<int64_t>(static_cast<double>(shortest_edge * longer) / static_cast<double>(shorter));
  return height <= width ? std::pair{shortest_edge, longer_out} : std::pair{longer_out, shortest_edge};
}

std::vector<uint8_t> resize_bicubic_pil(const uint8_t* rgb, int64_t height, int64_t width, int64_t out_height,
                                        int64_t out_width) {
  // Pillow skips the pass of an axis whose size does not change (it would be the identity).
  std::vector<uint8_t> rows(rgb, rgb + height * width * 3);
  if (out_width != width) {
    std::vector<uint8_t> resized(static_cast<size_t>(height * out_width * 3));
    resample_axis(rows.data(), height, width * 3, 3, taps_for(width, out_width), resized.data(), out_width * 3, 3);
    rows = std::move(resized);
  }
  if (out_height == height) return rows;
  std::vector<uint8_t> out(static_cast<size_t>(out_height * out_width * 3));
  resample_axis(rows.data(), out_width, 3, out_width * 3, taps_for(height, out_height), out.data(), 3, out_width * 3);
  return out;
}

Tensor clip_preprocess(const VideoFrames& images, const ClipImageProcessing& processing) {
  try {
    images.validate();
  } catch (const std::exception& e) {
    throw Error(std::string("images: ") + e.what());
  }
  if (images.count < 1) fail_argument("images", "at least one image", images.count);
  if (images.height > kMaxSide || images.width > kMaxSide)
    fail_argument("images", detail::concat("sides of at most ", kMaxSide, " pixels"),
                  detail::concat(images.height, " x ", images.width));
  processing.validate();
  const auto [height, width] = clip_resized_size(images.height, images.width, processing.shortest_edge);
  const int64_t crop_h = processing.crop_height, crop_w = processing.crop_width;
  const int64_t top = (height - crop_h) / 2, left = (width - crop_w) / 2;
  Tensor out = Tensor::empty({images.count, 3, crop_h, crop_w}, DType::kF32);
  for (int64_t index = 0; index < images.count; ++index) {
    const std::vector<uint8_t> resized = resize_bicubic_pil(images.frame(index), images.height, images.width, height, width);
    float* planes = out.data_as<float>() + index * 3 * crop_h * crop_w;
    for (int64_t channel = 0; channel < 3; ++channel)
      for (int64_t y = 0; y < crop_h; ++y)
        for (int64_t x = 0; x < crop_w; ++x) {
          // numpy's order and precision: the byte times the factor in double, stored as float;
          // then (x - mean) / std in float.
          const float value = static_cast<float>(resized[static_cast<size_t>(((top + y) * width + left + x) * 3 + channel)] *
                                                 processing.rescale_factor);
          planes[(channel * crop_h + y) * crop_w + x] =
              (value - processing.image_mean[static_cast<size_t>(channel)]) / processing.image_std[static_cast<size_t>(channel)];
        }
  }
  return out;
}

}  // namespace tessel
