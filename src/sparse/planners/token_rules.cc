#include "token_rules.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "tessel/core/error.h"

namespace tessel::planners {
namespace {

// Rules over the image grid share the decoding of positions; text queries see only text keys.
class GridRule : public TokenRule {
 public:
  explicit GridRule(const TokenLayout& layout) : layout_(layout), g_(layout.grid) {}
  void mark(int64_t query, KeyMarker& keys) const final {
    const int64_t n = query - layout_.image_offset();
    if (n < 0 || n >= g_.numel()) {
      keys.range(layout_.text_offset(), layout_.text_offset() + layout_.text_tokens - 1);
      return;
    }
    const int64_t tpf = g_.tokens_per_frame();
    mark_image(n / tpf, (n / g_.width) % g_.height, n % g_.width, keys);
  }

 protected:
  virtual void mark_image(int64_t f, int64_t y, int64_t x, KeyMarker& keys) const = 0;
  // Key frame kf, rows [y0, y1], columns [x0, x1] clipped to the grid.
  void box(int64_t kf, int64_t y0, int64_t y1, int64_t x0, int64_t x1, KeyMarker& keys) const {
    y0 = std::max<int64_t>(y0, 0);
    y1 = std::min(y1, g_.height - 1);
    x0 = std::max<int64_t>(x0, 0);
    x1 = std::min(x1, g_.width - 1);
    const int64_t base = layout_.image_offset() + kf * g_.tokens_per_frame();
    if (x0 == 0 && x1 == g_.width - 1) {
      keys.range(base + y0 * g_.width, base + y1 * g_.width + x1);
      return;
    }
    for (int64_t y = y0; y <= y1; ++y) keys.range(base + y * g_.width + x0, base + y * g_.width + x1);
  }
  void in_frame(int64_t kf, int64_t p0, int64_t p1, KeyMarker& keys) const {
    const int64_t base = layout_.image_offset() + kf * g_.tokens_per_frame();
    keys.range(base + std::max<int64_t>(p0, 0), base + std::min(p1, g_.tokens_per_frame() - 1));
  }

  TokenLayout layout_;
  TokenGrid g_;
};

class DenseRule final : public TokenRule {
 public:
  explicit DenseRule(int64_t seq) : seq_(seq) {}
  void mark(int64_t, KeyMarker& keys) const override { keys.range(0, seq_ - 1); }

 private:
  int64_t seq_;
};

class SlidingWindowRule final : public TokenRule {
 public:
  SlidingWindowRule(int64_t seq, int64_t window) : seq_(seq), window_(window) {}
  void mark(int64_t i, KeyMarker& keys) const override {
    keys.range(std::max<int64_t>(0, i - window_), std::min(seq_ - 1, i + window_));
  }

 private:
  int64_t seq_, window_;
};

class BoxRule final : public GridRule {
 public:
  BoxRule(const TokenLayout& layout, int64_t rf, int64_t ry, int64_t rx) : GridRule(layout), rf_(rf), ry_(ry), rx_(rx) {}

 private:
  void mark_image(int64_t f, int64_t y, int64_t x, KeyMarker& keys) const override {
    for (int64_t kf = std::max<int64_t>(0, f - rf_); kf <= std::min(g_.frames - 1, f + rf_); ++kf)
      box(kf, y - ry_, y + ry_, x - rx_, x + rx_, keys);
  }
  int64_t rf_, ry_, rx_;
};

class RadialRule final : public GridRule {
 public:
  RadialRule(const TokenLayout& layout, const RadialPattern& p, int64_t block) : GridRule(layout), p_(p), block_(block) {}

 private:
  void mark_image(int64_t f, int64_t y, int64_t x, KeyMarker& keys) const override {
    const int64_t tpf = g_.tokens_per_frame();
    const int64_t pos = y * g_.width + x;
    const double base = std::ldexp(1.0, static_cast<int>(std::bit_width(static_cast<uint64_t>(tpf))));
    for (int64_t kf = 0; kf < g_.frames; ++kf) {
      const int64_t d = std::abs(f - kf);
      if (d <= 1 || (p_.frame0_sink && kf == 0)) {
        in_frame(kf, 0, tpf - 1, keys);
        continue;
      }
      const double l0 = base / std::ldexp(1.0, static_cast<int>(std::bit_width(static_cast<uint64_t>(d))));
      const double w = l0 * p_.decay_factor;
      const double width = w >= static_cast<double>(block_) ? w : static_cast<double>(block_);
      if (l0 < static_cast<double>(block_)) {
        const int64_t split = static_cast<int64_t>(std::floor(static_cast<double>(block_) / l0));
        if (d % split != 0) continue;
      }
      const int64_t reach = static_cast<int64_t>(std::floor(width));
      in_frame(kf, pos - reach, pos + reach, keys);
    }
  }
  RadialPattern p_;
  int64_t block_;
};

class LocalRule final : public GridRule {
 public:
  LocalRule(const TokenLayout& layout, int64_t window) : GridRule(layout), window_(std::min(window, layout.grid.frames)) {}

 private:
  void mark_image(int64_t f, int64_t, int64_t, KeyMarker& keys) const override {
    const int64_t start = std::clamp<int64_t>(f - (window_ - 1) / 2, 0, g_.frames - window_);
    const int64_t tpf = g_.tokens_per_frame();
    const int64_t base = layout_.image_offset();
    keys.range(base + start * tpf, base + (start + window_) * tpf - 1);
  }
  int64_t window_;
};

}  // namespace

std::unique_ptr<TokenRule> make_token_rule(const StaticPattern& pattern, const TokenLayout& layout, int64_t block_q) {
  const int64_t seq = layout.seq_len();
  if (const auto* p = std::get_if<DensePattern>(&pattern.rule)) {
    (void)p;
    return std::make_unique<DenseRule>(seq);
  }
  if (const auto* p = std::get_if<SlidingWindowPattern>(&pattern.rule)) {
    if (p->window < 0) fail_argument("sliding_window.window", ">= 0", p->window);
    return std::make_unique<SlidingWindowRule>(seq, p->window);
  }
  if (const auto* p = std::get_if<SlidingWindow3dPattern>(&pattern.rule)) {
    if (p->frame_radius < 0 || p->height_radius < 0 || p->width_radius < 0)
      fail_argument("sliding_window_3d radii", ">= 0", detail::concat(p->frame_radius, ",", p->height_radius, ",", p->width_radius));
    return std::make_unique<BoxRule>(layout, p->frame_radius, p->height_radius, p->width_radius);
  }
  if (const auto* p = std::get_if<SpatialAwarePattern>(&pattern.rule)) {
    if (p->radius < 0) fail_argument("spatial_aware.radius", ">= 0", p->radius);
    if (p->dims != 2 && p->dims != 3) fail_argument("spatial_aware.dims", "2 or 3", p->dims);
    return std::make_unique<BoxRule>(layout, p->dims == 3 ? p->radius : 0, p->radius, p->radius);
  }
  if (const auto* p = std::get_if<RadialPattern>(&pattern.rule)) {
    if (!(p->decay_factor > 0.0) || !std::isfinite(p->decay_factor)) fail_argument("radial.decay_factor", "> 0", p->decay_factor);
    return std::make_unique<RadialRule>(layout, *p, block_q);
  }
  if (const auto* p = std::get_if<LocalPattern>(&pattern.rule)) {
    if (p->local_window_size < 1) fail_argument("local.local_window_size", ">= 1", p->local_window_size);
    return std::make_unique<LocalRule>(layout, p->local_window_size);
  }
  throw Error("make_token_rule: arrow and composite patterns are planned by plan_static_pattern");
}

}  // namespace tessel::planners
