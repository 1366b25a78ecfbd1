// The rows of a frame each rank of a group decodes when the Wan VAE's decode is split by height
// (internal; shared by the CPU and CUDA decoders).
#pragma once

#include <cstdint>
#include <vector>

namespace tessel::vae {

// Balanced bands of a latent frame's `height` rows in rank order, the first height % ranks one row
// taller. Each of the decoder's upsamplers doubles every band (nearest upsampling maps rows
// [a, b) to [2a, 2b)), so at a stage of scale s a rank holds rows [s begin, s end) of the frame:
// the scale is a band's height at that stage over its latent rows. Needs height >= ranks (a band
// of at least one row; the caller decodes whole frames otherwise).
class RowBands {
 public:
  RowBands(int64_t height, int ranks, int rank);
  int ranks() const { return static_cast<int>(starts_.size()) - 1; }
  int rank() const { return rank_; }
  int64_t height() const { return starts_.back(); }
  // Latent rows of rank r: [begin(r), begin(r) + rows(r)).
  int64_t begin(int r) const { return starts_[static_cast<size_t>(r)]; }
  int64_t rows(int r) const { return starts_[static_cast<size_t>(r) + 1] - starts_[static_cast<size_t>(r)]; }
  int64_t max_rows() const { return rows(0); }
  // The stage's scale, from this rank's band height at that stage (a multiple of its latent rows).
  int64_t scale_of(int64_t band_height) const;

 private:
  std::vector<int64_t> starts_;  // ranks + 1 boundaries
  int rank_ = 0;
};

}  // namespace tessel::vae
