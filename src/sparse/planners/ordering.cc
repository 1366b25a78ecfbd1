#include "tessel/sparse/planners/ordering.h"

#include <algorithm>
#include <numeric>

#include "token_permutation.h"  // gather_along_axis
#include "tessel/core/error.h"

namespace tessel {
namespace {

// Cell (x, y) visited at distance d along a Hilbert curve on an n × n square (n a power of two).
void hilbert_cell(int64_t n, int64_t d, int64_t& x, int64_t& y) {
  x = 0;
  y = 0;
  for (int64_t s = 1; s < n; s *= 2) {
    const int64_t rx = 1 & (d / 2);
    const int64_t ry = 1 & (d ^ rx);
    if (ry == 0) {  // rotate the quadrant so the sub-curves join end to end
      if (rx == 1) {
        x = s - 1 - x;
        y = s - 1 - y;
      }
      std::swap(x, y);
    }
    x += s * rx;
    y += s * ry;
    d /= 4;
  }
}

uint64_t morton_code(uint64_t row, uint64_t col) {
  uint64_t code = 0;
  for (int bit = 0; bit < 32; ++bit) {
    code |= ((col >> bit) & 1u) << (2 * bit);
    code |= ((row >> bit) & 1u) << (2 * bit + 1);
  }
  return code;
}

// In-frame visiting order: cells[i] = row * width + col of the i-th visited patch.
std::vector<int32_t> frame_order(int64_t height, int64_t width, SpatialOrdering ordering) {
  std::vector<int32_t> cells;
  cells.reserve(static_cast<size_t>(height * width));
  if (ordering == SpatialOrdering::kRaster) {
    for (int64_t i = 0; i < height * width; ++i) cells.push_back(static_cast<int32_t>(i));
  } else if (ordering == SpatialOrdering::kHilbert) {
    int64_t n = 1;
    while (n < std::max(height, width)) n *= 2;
    for (int64_t d = 0; d < n * n; ++d) {
      int64_t x, y;
      hilbert_cell(n, d, x, y);
      if (x < width && y < height) cells.push_back(static_cast<int32_t>(y * width + x));
    }
  } else {
    for (int64_t i = 0; i < height * width; ++i) cells.push_back(static_cast<int32_t>(i));
    std::stable_sort(cells.begin(), cells.end(), [width](int32_t a, int32_t b) {
      return morton_code(a / width, a % width) < morton_code(b / width, b % width);
    });
  }
  return cells;
}

void check_permutable(const TensorView& src, const TensorView& dst, const TokenPermutation& permutation) {
  check_device(src, Device::cpu(), "src");
  check_device(dst, Device::cpu(), "dst");
  if (src.dim() < 2) fail_argument("src", "rank >= 2 (B, S, ...)", src.describe());
  check_shape(dst, src.shape(), "dst");
  check_dtype(dst, src.dtype(), "dst");
  validate_token_permutation(permutation, src.size(1), "permutation");
  TESSEL_CHECK(src.data() != dst.data(), "token permutation: src and dst must not alias");
}

}  // namespace

bool TokenPermutation::is_identity() const {
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] != static_cast<int32_t>(i)) return false;
  return true;
}

TokenPermutation make_token_permutation(const TokenLayout& layout, SpatialOrdering ordering) {
  validate_token_layout(layout);
  const TokenGrid& g = layout.grid;
  const std::vector<int32_t> cells = frame_order(g.height, g.width, ordering);
  TokenPermutation p;
  p.order.resize(static_cast<size_t>(layout.seq_len()));
  std::iota(p.order.begin(), p.order.end(), 0);
  const int64_t base = layout.image_offset();
  const int64_t tpf = g.tokens_per_frame();
  for (int64_t f = 0; f < g.frames; ++f)
    for (int64_t i = 0; i < tpf; ++i) p.order[base + f * tpf + i] = static_cast<int32_t>(base + f * tpf + cells[i]);
  p.inverse.resize(p.order.size());
  for (size_t i = 0; i < p.order.size(); ++i) p.inverse[p.order[i]] = static_cast<int32_t>(i);
  return p;
}

void validate_token_permutation(const TokenPermutation& permutation, int64_t n, const std::string& argument) {
  if (permutation.size() != n || static_cast<int64_t>(permutation.inverse.size()) != n)
    fail_argument(argument, detail::concat("order and inverse of size ", n),
                  detail::concat(permutation.order.size(), " and ", permutation.inverse.size()));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t o = permutation.order[i];
    if (o < 0 || o >= n || permutation.inverse[o] != i)
      fail_argument(argument, detail::concat("inverse[order[", i, "]] == ", i), detail::concat("order[", i, "] = ", o));
  }
}

void permute_tokens(const TensorView& src, const TensorView& dst, const TokenPermutation& permutation) {
  check_permutable(src, dst, permutation);
  gather_along_axis(src, dst, 1, std::vector<int64_t>(permutation.order.begin(), permutation.order.end()));
}

void unpermute_tokens(const TensorView& src, const TensorView& dst, const TokenPermutation& permutation) {
  check_permutable(src, dst, permutation);
  gather_along_axis(src, dst, 1, std::vector<int64_t>(permutation.inverse.begin(), permutation.inverse.end()));
}

}  // namespace tessel
