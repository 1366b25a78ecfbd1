// Pillow's Image.resize on 8-bit RGB images (see pil_resize.h).
#include "tessel/diffusion/pil_resize.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/parallel.h"

namespace tessel {
namespace {

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

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}

// Pillow's lanczos_filter: sinc windowed by sinc(x / 3), support 3.
double lanczos(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

struct Filter {
  double (*weight)(double);
  double support;
};

Filter filter_of(PilFilter filter) { return filter == PilFilter::kLanczos ? Filter{lanczos, 3.0} : Filter{bicubic, 2.0}; }

// The taps of one output pixel along an axis: input pixels [first, first + weights.size()).
struct Taps {
  int64_t first = 0;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs and normalize_coeffs_8bpc for an axis resized from in_size to out_size.
std::vector<Taps> taps_for(int64_t in_size, int64_t out_size, const Filter& filter) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter.support * filter_scale;
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
      w.push_back(filter.weight((static_cast<double>(x) - center + 0.5) * inverse_scale));
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

std::vector<uint8_t> resize_pil(const uint8_t* rgb, int64_t height, int64_t width, int64_t out_height, int64_t out_width,
                                PilFilter filter) {
  const Filter kernel = filter_of(filter);
  // Pillow skips the pass of an axis whose size does not change (it would be the identity).
  std::vector<uint8_t> rows(rgb, rgb + height * width * 3);
  if (out_width != width) {
    std::vector<uint8_t> resized(static_cast<size_t>(height * out_width * 3));
    resample_axis(rows.data(), height, width * 3, 3, taps_for(width, out_width, kernel), resized.data(), out_width * 3, 3);
    rows = std::move(resized);
  }
  if (out_height == height) return rows;
  std::vector<uint8_t> out(static_cast<size_t>(out_height * out_width * 3));
  resample_axis(rows.data(), out_width, 3, out_width * 3, taps_for(height, out_height, kernel), out.data(), 3, out_width * 3);
  return out;
}

}  // namespace tessel
