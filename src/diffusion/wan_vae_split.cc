#include "wan_vae_split.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::vae {

RowBands::RowBands(int64_t height, int ranks, int rank) : rank_(rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks) fail_argument("rank", detail::concat("0..", ranks - 1), rank);
  if (height < ranks)
    fail_argument("latent height", detail::concat("at least one row per rank of the group (", ranks, ")"), height);
  starts_.push_back(0);
  for (int r = 0; r < ranks; ++r) starts_.push_back(starts_.back() + height / ranks + (r < height % ranks ? 1 : 0));
}

int64_t RowBands::scale_of(int64_t band_height) const {
  const int64_t own = rows(rank_);
  if (band_height % own != 0)
    throw Error(detail::concat("Wan VAE split decode: a band of ", band_height, " rows at a stage, not a multiple of the rank's ", own,
                               " latent rows"));
  return band_height / own;
}

namespace {

TensorView floats(float* data, int64_t count) { return TensorView(data, DType::kF32, Device::cpu(), {count}); }

}  // namespace

void RowSplit::fill_halo(const ExecContext& ctx, FeatureFrames& x) const {
  // One row of every frame in each: this band's top and bottom rows, the rows above and below it.
  const int64_t row = x.width * x.channels, edge = x.count * row;
  const size_t row_bytes = static_cast<size_t>(row) * sizeof(float);
  std::vector<float> rows(static_cast<size_t>(4 * edge));
  float *top = rows.data(), *bottom = top + edge, *above = bottom + edge, *below = above + edge;
  for (int64_t t = 0; t < x.count; ++t) {
    std::memcpy(top + t * row, x.pixel(t, 0, 0), row_bytes);
    std::memcpy(bottom + t * row, x.pixel(t, x.height - 1, 0), row_bytes);
  }
  group_.neighbour_exchange(ctx, floats(top, edge), floats(bottom, edge), floats(above, edge), floats(below, edge));
  // Border row -1 is the previous rank's bottom row, border row `height` the next rank's top row.
  for (int64_t t = 0; t < x.count; ++t) {
    if (bands_.rank() > 0) std::memcpy(x.pixel(t, -1, 0), above + t * row, row_bytes);
    if (bands_.rank() + 1 < bands_.ranks()) std::memcpy(x.pixel(t, x.height, 0), below + t * row, row_bytes);
  }
}

FeatureFrames RowSplit::whole(const ExecContext& ctx, const FeatureFrames& band) const {
  const int64_t scale = bands_.scale_of(band.height), row = band.width * band.channels;
  // Every rank sends as many rows as the tallest band (the shorter ones' last row is padding).
  const int64_t per_frame = scale * bands_.max_rows() * row, per_rank = band.count * per_frame;
  std::vector<float> send(static_cast<size_t>(per_rank), 0.0f), all(static_cast<size_t>(per_rank * bands_.ranks()));
  for (int64_t t = 0; t < band.count; ++t)
    for (int64_t y = 0; y < band.height; ++y)
      std::memcpy(send.data() + t * per_frame + y * row, band.pixel(t, y, 0), static_cast<size_t>(row) * sizeof(float));
  group_.all_gather(ctx, floats(send.data(), per_rank), floats(all.data(), static_cast<int64_t>(all.size())));
  FeatureFrames out(band.count, band.channels, scale * bands_.height(), band.width);
  for (int r = 0; r < bands_.ranks(); ++r)
    for (int64_t t = 0; t < band.count; ++t)
      for (int64_t y = 0; y < scale * bands_.rows(r); ++y)
        std::memcpy(out.pixel(t, scale * bands_.begin(r) + y, 0), all.data() + r * per_rank + t * per_frame + y * row,
                    static_cast<size_t>(row) * sizeof(float));
  return out;
}

FeatureFrames RowSplit::band_of(const FeatureFrames& whole) const {
  const int64_t scale = whole.height / bands_.height(), rank = bands_.rank();
  FeatureFrames out(whole.count, whole.channels, scale * bands_.rows(static_cast<int>(rank)), whole.width);
  for (int64_t t = 0; t < whole.count; ++t)
    for (int64_t y = 0; y < out.height; ++y)
      std::memcpy(out.pixel(t, y, 0), whole.pixel(t, scale * bands_.begin(static_cast<int>(rank)) + y, 0),
                  static_cast<size_t>(whole.width * whole.channels) * sizeof(float));
  return out;
}

bool RowSplit::any(bool mine) const {
  float votes = mine ? 1.0f : 0.0f;
  group_.all_reduce_sum(ExecContext{}, floats(&votes, 1));
  return votes > 0.0f;
}

}  // namespace tessel::vae
