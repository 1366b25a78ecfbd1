// The CPU Wan VAE decode split by height over a group of ranks (internal): each rank decodes a band
// of the latent rows (RowBands), and what a band cannot compute alone comes from the other ranks
// through the group's communicator. Every 3x3 convolution reads one row above and below the band
// (its halo): the neighbours' edge rows, zeros at the frame's true top and bottom, so each output
// pixel is the same sum as in the whole-frame decode. The mid block's attention, over every pixel
// of a frame, runs on the whole frame gathered from the bands. Everything else (the RMS norm over
// each pixel's channels, SiLU, the 1x1 convolutions, nearest upsampling, Wan 2.2's duplicated
// shortcut) reads only the pixel's own band. The causal feature cache stays per rank: the split is
// spatial only, and the frames a convolution remembers carry their halo rows with them.
#pragma once

#include <cstdint>

#include "tessel/core/exec_context.h"
#include "tessel/parallel/communicator.h"
#include "wan_vae_ops.h"
#include "wan_vae_row_bands.h"

namespace tessel::vae {

class RowSplit {
 public:
  // `group`: a CPU communicator of more than one rank, not owned; every rank of it decodes the same
  // latents of `height` rows (>= group.size()).
  RowSplit(Communicator& group, int64_t height) : group_(group), bands_(height, group.size(), group.rank()) {}
  const RowBands& bands() const { return bands_; }

  // Writes the neighbours' edge rows into the zero border rows above and below every frame of the
  // band `x` (the border at the frame's true top or bottom stays zero): one neighbour exchange.
  // Collective.
  void fill_halo(const ExecContext& ctx, FeatureFrames& x) const;
  // The whole frames of which `band` is this rank's rows (every rank's band, gathered). Collective.
  FeatureFrames whole(const ExecContext& ctx, const FeatureFrames& band) const;
  // This rank's rows of whole frames.
  FeatureFrames band_of(const FeatureFrames& whole) const;
  // True on every rank when any rank's `mine` is true (a decode stops on all ranks or none). Collective.
  bool any(bool mine) const;

 private:
  Communicator& group_;
  RowBands bands_;
};

}  // namespace tessel::vae
