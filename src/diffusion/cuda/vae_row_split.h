// The CUDA Wan VAE decode split by height over a group of ranks (internal), the device counterpart
// of wan_vae_split.h (which says what each module reads): each rank decodes a band of the latent
// rows; before a 3x3 convolution the band is laid out with one halo row above and below (the
// neighbours' edge rows, exchanged with them; zeros at the frame's true top and bottom) and
// convolved without padding in height; the mid block's attention and the decoded chunk gather the
// whole frames. Every transfer is one collective on the decode's stream (NCCL on the decoder's
// device) and every layout change a few 2-D copies of whole planes; nothing waits for the host but
// the cancel vote between chunks.
#pragma once

#include <cuda_runtime.h>

#include "cuda/vae_cuda_blocks.h"
#include "tessel/parallel/communicator.h"
#include "wan_vae_row_bands.h"

namespace tessel::vae::cuda {

class DeviceRowSplit {
 public:
  // `group`: a communicator of more than one rank on `device` (not owned); every rank decodes the
  // same latents of `height` rows (>= group.size()).
  DeviceRowSplit(Communicator& group, Device device, int64_t height)
      : group_(group), device_(device), bands_(height, group.size(), group.rank()) {}
  const RowBands& bands() const { return bands_; }

  // x (channels, frames, h, width), this rank's band, as (channels, frames, h + 2, width) with the
  // halo rows. Collective.
  DeviceFrames with_halo(const DecodeContext& dc, const DeviceFrames& x) const;
  // The whole frames of which `band` is this rank's rows. Collective.
  DeviceFrames whole(const DecodeContext& dc, const DeviceFrames& band) const;
  // This rank's rows of whole frames.
  DeviceFrames band_of(const DecodeContext& dc, const DeviceFrames& whole) const;
  // True on every rank when any rank's `mine` is true; waits for the stream. Collective.
  bool any(const DecodeContext& dc, bool mine) const;

 private:
  ExecContext context(const DecodeContext& dc) const;
  Communicator& group_;
  Device device_;
  RowBands bands_;
};

}  // namespace tessel::vae::cuda
